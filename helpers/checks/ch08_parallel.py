"""Checkers for chapter 8's data-parallel exercises: the overlapped all-reduce hooks, the ZeRO-1 step (chapter 8).

Each runs the learner's function at three world sizes, as chapter 4's checkers do at two:
first in this process, in a one-rank gloo group whose environment says what torchrun would
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), then on 2 and on 3
gloo ranks launched with torchrun (``helpers/scripts/ch08_exercise_check.py``; a launch takes a
few seconds). Every collective the function calls is recorded, however it is called
(torch.distributed or distributed_c10d, by position or keyword, or the process group's own
method): its name, its bytes, whether it was async and waited for before its result was used,
whether it ran inside backward, in which thread and on which tensor (p.grad itself, a copy,
the parameter), so that a right value reached the wrong way, or a wrong value, each gets its
own hint. An untouched stub is recognised without launching anything. Values are compared
with bounds from their cause: the gradients (exercise 3's, and the averaged piece ZeRO-1's
reduce-scatter gives each rank) with an all-reduce's rounding, in the run's dtype, of the
ranks' own gradients; ZeRO-1's Adam state for the shard with an Adam stepping the same piece
alone, and its parameters with full Adam's on those same averaged gradients, exactly (Adam is
elementwise); ZeRO-1's traffic with one reduce-scatter and one all-gather of the flat vector.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
from torch import nn

from helpers.checks import (
    CheckFailed,
    CheckResult,
    NotDoneYet,
    expect,
    probe,
    run_check,
    torchrun_environment,
)
from helpers.checks.ch04 import is_stub, launched_ranks, payload
from helpers.comm_overlap import RENAMED_COLLECTIVES, allreduce_rounding_bound, shard_bounds
from helpers.i18n import tr, tr_mark
from helpers.launch import (
    _LOST_PEER,
    _STOPPED,
    _report_failures,
    launch,
    new_run_dir,
    read_results,
)
from helpers.models import make_mlp
from helpers.scripts import ch08_exercise_check as task
from helpers.scripts.common import Context, teardown
from helpers.sharding import wire_bytes

#: Seconds before a collective in the one-rank group gives up.
ONE_RANK_TIMEOUT_S = 5


@contextlib.contextmanager
def one_rank_world(folder: Path) -> Iterator[None]:
    """A one-rank gloo group in this process, with torchrun's environment, torn down after (chapter 8)."""
    with mock.patch.dict(os.environ, torchrun_environment(rank=0, world_size=1)):
        dist.init_process_group(
            "gloo",
            init_method=(folder / "pg").resolve().as_uri(),
            rank=0,
            world_size=1,
            timeout=datetime.timedelta(seconds=ONE_RANK_TIMEOUT_S),
        )
        try:
            yield
        finally:
            with contextlib.suppress(RuntimeError):
                teardown()
            if dist.is_initialized():
                dist.destroy_process_group()


def run_at_world_one(fn: Callable, name: str) -> dict[str, Any]:
    """Run task `name` on `fn` here, at world size 1; {} when the notebook has its own group (chapter 8)."""
    if is_stub(fn):
        raise NotDoneYet
    payload(fn)  # self-contained, as the launched ranks will need it: say so before running
    if dist.is_initialized():
        return {}
    folder = Path(tempfile.mkdtemp(prefix=f"course_ch08_exercise_{name}_"))
    try:
        with one_rank_world(folder), probe(tr("1 rank, in this process")):
            return task.run_task(name, Context(0, 1, 0, "gloo", torch.device("cpu")), fn)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_on_launched_ranks(fn: Callable, name: str, world: int) -> list[dict[str, Any]]:
    """Run `fn` as task `name` on `world` launched gloo ranks; each rank's result (chapter 8)."""
    if is_stub(fn):
        raise NotDoneYet
    data = payload(fn)
    out = new_run_dir(f"exercise_{name}")
    try:
        with open(out / "payload.pkl", "wb") as f:
            pickle.dump(data, f)
        args = ["--payload", out / "payload.pkl", "--task", name, "--out", out, "--pg-timeout", 20]
        res = launch(
            "ch08_exercise_check", world, args, backend="gloo", timeout=120, echo=False,
            check=False, tiny_job=True,
        )  # fmt: skip
        # a rank whose function raised saved its error and left at once (the others were
        # stopped, maybe mid-collective): its own error is the answer, not the launch's
        saved = _saved_results(out, world) if not res.ok else {}
        died = [r for r, c in _report_failures(res.lines) if int(r) not in saved and c not in _STOPPED]  # fmt: skip
        if not res.ok and (died or all(r.get("status") == "ok" for r in saved.values())):
            tail = "\n".join(res.lines[-15:])
            raise CheckFailed(
                tr("the {world}-rank run failed. {message}\nLast lines:\n{tail}").format(
                    world=world, message=res.message, tail=tail
                )
            )
        results = saved or dict(enumerate(read_results(out, world)))
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if any(r["status"] == "todo" for r in results.values()):
        raise NotDoneYet
    errors = [(rank, r["error"]) for rank, r in results.items() if r["status"] == "error"]
    own = [e for e in errors if not _LOST_PEER.search(e[1])] or errors  # the rank that broke first
    expect(
        not errors,
        tr("[probe: {world} ranks, rank {rank}] your function raised: {error}").format(
            world=world, rank=own[0][0] if own else 0, error=own[0][1] if own else ""
        ),
    )
    return [results[rank] for rank in range(world)]


def _saved_results(out: Path, world: int) -> dict[int, dict[str, Any]]:
    """The results the ranks saved before a failed launch ended, by rank (chapter 8)."""
    saved = {}
    for rank in range(world):
        path = out / f"rank{rank}.pt"
        if path.exists():
            with contextlib.suppress(Exception):  # a file cut short by the stop: no result
                saved[rank] = torch.load(path, weights_only=True)
    return saved


def _where(world: int, rank: int) -> str:
    """'[probe: 3 ranks, rank 1] ' or '[probe: 1 rank] ' (chapter 8)."""
    if world > 1:
        return tr("[probe: {world} ranks, rank {rank}] ").format(world=world, rank=rank)
    return tr("[probe: 1 rank] ")


def launched_worlds() -> list[int]:
    """The world sizes the checks launch after the one in this process: 2, then 3 (chapter 8)."""
    return sorted({2, launched_ranks()})


Mean = tuple[list[torch.Tensor], list[torch.Tensor]]


def exact_mean(results: list[dict], step: int) -> Mean:
    """The ranks' own gradients of `step` averaged in float64, and the fp32 all-reduce's rounding bound (chapter 8).

    Every rank recorded the gradients its model had before any all-reduce (a twin without
    hooks); their float64 mean is exact but for 2^-53 relative. An fp32 all-reduce in any order,
    divided, is within half of allreduce_rounding_bound of it (that bound is for two such
    results); comparing with the whole bound leaves the other half for the float64 rounding.
    """
    world = len(results)
    local = [[g.double() for g in r["steps"][step]["local grads"]] for r in results]
    mean = [sum(gs) / world for gs in zip(*local)]
    abs_sum = [sum(g.abs() for g in gs) for gs in zip(*local)]
    return mean, allreduce_rounding_bound(abs_sum, world)


def allreduce_bound_in(
    abs_sum: list[torch.Tensor], world: int, dtype: torch.dtype
) -> list[torch.Tensor]:
    """allreduce_rounding_bound for a reduction in `dtype`: the same bound in its unit roundoff (chapter 8)."""
    scale = torch.finfo(dtype).eps / torch.finfo(torch.float32).eps
    return [b * scale for b in allreduce_rounding_bound(abs_sum, world)]


def _close(got: list[torch.Tensor], want: Mean, scale: float = 1.0) -> bool:
    """Gradients equal to the exact mean times `scale`, within the rounding bound times `scale` (chapter 8)."""
    mean, bound = want
    return all(
        bool(((g.double() - m * scale).abs() <= b * scale).all())
        for g, m, b in zip(got, mean, bound)
    )


#: The hints of the order-of-work mistakes, in English (tr() them where they are shown).
_NOT_OVERLAPPED = tr_mark(
    "no all-reduce started during backward: the point is to send each gradient while backward "
    "is still computing the earlier layers. Register p.register_post_accumulate_grad_hook(hook) "
    "on every parameter and start dist.all_reduce(p.grad, async_op=True) inside the hook; "
    "finish() only waits."
)
_BLOCKING = tr_mark(
    "an all-reduce inside backward was blocking (async_op=False): backward stops until it is "
    "done, so nothing overlaps. Pass async_op=True in the hook, keep the work it returns, and "
    "call work.wait() in finish()."
)
_TOO_EARLY = tr_mark(
    "an all-reduce started before the gradient was accumulated into p.grad: a hook from "
    "p.register_hook(...) gets the incoming gradient, which autograd has not yet added to "
    "p.grad (so what you reduce is not what lands in .grad). Use "
    "p.register_post_accumulate_grad_hook(hook), which runs once p.grad is complete, and "
    "all-reduce p.grad."
)
_COPY = tr_mark(
    "an all-reduce was given a copy of p.grad (p.grad.clone(), p.grad.to(...), a new tensor "
    "filled from it, torch.cat of several gradients): all-reduce p.grad itself, in place, so "
    "the sum lands where the optimizer reads it, with no extra copy of every gradient: "
    "dist.all_reduce(p.grad, async_op=True)."
)
_WAITED_IN_BACKWARD = tr_mark(
    "work.wait() ran during backward, in a hook: backward stopped there until the sum had "
    "arrived, so nothing overlapped (it is a blocking all-reduce with extra steps). Keep each "
    "work the hook starts, and wait for them all in finish(), after backward."
)
_LATE = tr_mark(
    "{n} gradient(s) were all-reduced from a later gradient's hook (all at once when the last "
    "one arrived?): by then backward had nothing left to compute, so nothing overlapped. Start "
    "each gradient's all-reduce in its own post-accumulate hook, as soon as it is complete."
)
_AFTER_BACKWARD = tr_mark(
    "{n} of {params} gradients were not all-reduced during backward (only later, in finish()?): "
    "register the hook on every parameter, and start every all-reduce in its hook."
)
_OTHER_THREAD = tr_mark(
    "an all-reduce ran in a thread of your own, not in the hook's: each rank's threads start "
    "their collectives in whatever order they get to run, so the ranks can pair one gradient's "
    "all-reduce with another's. Start the all-reduce in the hook itself, with async_op=True "
    "(dist.all_reduce(p.grad, async_op=True) returns at once: backward goes on while it "
    "travels), and wait for the works in finish()."
)
_PARAMETER = tr_mark(
    "an all-reduce was given the parameter itself (p, p.detach() or p.data), not its gradient: "
    "the weights were summed and the gradients never averaged. In the hook, all-reduce p.grad: "
    "dist.all_reduce(p.grad, async_op=True)."
)
_VALUE = tr_mark(
    "fut.value() ran before the future was waited for: value() does not wait, it reads a "
    "future already complete (after fut.wait(), or inside a .then() callback) and fails on one "
    "still in flight. Call fut.wait() on each future (or torch.futures.wait_all(futures)) in "
    "finish()."
)
_IN_FLIGHT = tr_mark(
    "you changed p.grad while its all-reduce was in flight (after dist.all_reduce(p.grad, "
    "async_op=True), before its wait): the sum lands in p.grad piece by piece while the "
    "all-reduce travels, so a change made before its wait is mixed into it or lost, depending "
    "on timing. Divide after wait(), in finish()."
)
_READ_IN_FLIGHT = tr_mark(
    "p.grad was read while its all-reduce was in flight (after dist.all_reduce(p.grad, "
    "async_op=True), before its wait): the sum lands in p.grad piece by piece while the "
    "all-reduce travels (on a GPU, in a kernel your read is not ordered with), so what you read "
    "is this rank's own gradient, a partial sum or the full sum, depending on timing. Any read "
    "of p.grad (a print, .norm(), .clone(), p.grad / world) belongs after work.wait(), in "
    "finish()."
)
_NO_WAIT = tr_mark(
    "{n} async all-reduce(s) were never waited for: finish() must call work.wait() on every "
    "work the hooks started (or wait on its future: fut.wait(), torch.futures.wait_all), before "
    "dividing; a division chained with .then() alone waits for nothing. Without a wait the "
    "gradient may still be in flight when the optimizer reads it."
)


_THEN_NOT_WAITED = tr_mark(
    "{n} callback(s) chained with .then() were never waited for: finish() waited on the work, "
    "or on the future they were chained from, not on the future .then() returned. That wait "
    "does not wait for the callback: on gloo the future's wait() can return before the callback "
    "(your division) has run, and on NCCL the callback runs on a side stream the optimizer's "
    "stream is not made to wait for. Keep the futures .then() returns and wait on them in "
    "finish() (torch.futures.wait_all(chained)), or divide after work.wait()."
)


def _expect_overlap_calls(step: dict, params: int, at: str) -> None:
    """The order of work of one step: in backward, async, on p.grad, waited, once each (chapter 8)."""
    calls = [c for c in step["calls"] if c["op"] == "all_reduce"]
    expect(all(c["own thread"] for c in calls), at + tr(_OTHER_THREAD))
    during = [c for c in calls if c["in backward"]]
    expect(during, at + tr(_NOT_OVERLAPPED))
    expect(all(c["async"] for c in during), at + tr(_BLOCKING))
    expect(not [c for c in during if c["waited in backward"]], at + tr(_WAITED_IN_BACKWARD))
    # not p.grad's memory: a copy (same values, or another shape: a concatenation), else the
    # incoming gradient of a register_hook, not yet accumulated
    other = [c for c in during if not c["is a grad"]]
    expect(not [c for c in other if c["a parameter"]], at + tr(_PARAMETER))
    expect(not [c for c in other if c["a copy of a grad"] or not c["param shape"]], at + tr(_COPY))
    expect(not other, at + tr(_TOO_EARLY))
    late = [c for c in during if not c["own hook"]]
    expect(not late, at + tr(_LATE).format(n=len(late)))
    missing = params - len({c["grad of"] for c in during})
    expect(missing <= 0, at + tr(_AFTER_BACKWARD).format(n=missing, params=params))
    expect(not [c for c in calls if c["value before wait"]], at + tr(_VALUE))
    unwaited = [c for c in calls if c["async"] and not c["waited"]]
    expect(not unwaited, at + tr(_NO_WAIT).format(n=len(unwaited)))
    chained = [c for c in calls if c.get("then not waited")]
    expect(not chained, at + tr(_THEN_NOT_WAITED).format(n=len(chained)))
    # a list finish() never clears divides the new gradients while their all-reduces travel,
    # after waiting for the old works: the stale entries, said by the values on the ranks
    in_flight = [c for c in calls if c["written in flight"]]
    expect(not in_flight or step["stale waits"], at + tr(_IN_FLIGHT))
    read = [c for c in calls if c["read in flight"]]  # p.grad / world before the wait
    expect(not read or step["stale waits"], at + tr(_READ_IN_FLIGHT))
    per_grad = sum(c["param shape"] for c in calls)
    expect(
        per_grad <= params,
        at
        + tr(
            "{per_grad} all-reduces of parameter-shaped tensors for {params} parameters: "
            "each gradient was reduced more than once (in the hook and again in finish()?). "
            "Reduce each once, in its hook."
        ).format(per_grad=per_grad, params=params),
    )


def _expect_overlap_values(results: list[dict], rank: int) -> None:
    """Both steps' gradients of one rank against the exact mean of every rank's own (chapter 8)."""
    world = len(results)
    at = _where(world, rank)
    for step, got in enumerate(results[rank]["steps"]):
        ref, where = exact_mean(results, step), at + tr("step {step}: ").format(step=step + 1)
        expect(got["grads"] is not None, where + tr("a parameter has no gradient after finish()."))
        g = got["grads"]
        expect(
            world == 2 or _close(g, ref) or not _close(g, ref, world / 2),
            where
            + tr(
                "the gradients are {scale:g}x the mean: you divided by 2, not by the world size "
                "({world} rank(s) here). Divide by dist.get_world_size()."
            ).format(scale=world / 2, world=world),
        )
        if world > 1 and not _close(g, ref):
            expect(
                not _close(g, ref, world),
                where
                + tr(
                    "the gradients are {world}x too large: all_reduce sums, so divide by "
                    "dist.get_world_size() once, in finish() after the wait."
                ).format(world=world),
            )
            again = (
                tr_mark("averaged twice")
                if step == 0
                else tr_mark("averaged again in the second step")
            )
            expect(
                not _close(g, ref, 1 / world),
                where
                + tr(
                    "the gradients are {world}x too small: {again}. Divide once, and let "
                    "finish() forget the works it waited for (clear its list), so that the next "
                    "step does not divide them again."
                ).format(world=world, again=tr(again)),
            )
        expect(
            _close(g, ref) or step == 0,
            where
            + tr(
                "the first step was right and this one is not: finish() must forget the "
                "works it waited for (clear its list), or the next step waits for and divides "
                "stale entries again, racing with the new all-reduces."
            ),
        )
        expect(
            _close(g, ref),
            where
            + tr(
                "the gradients differ from the mean of the ranks' gradients by more than "
                "an fp32 all-reduce's rounding: all-reduce every p.grad once (async, in its hook), "
                "wait for each work in finish(), then divide by dist.get_world_size()."
            ),
        )


def _expect_setup(setup: list[dict], at: str) -> None:
    """What overlap_hooks itself sent: nothing, or broadcasts of the parameters waited for (chapter 8)."""
    others = sorted({c["op"] for c in setup if c["op"] != "broadcast"})
    expect(
        not others,
        at
        + tr(
            "your function called {ops} before any backward: overlap_hooks only "
            "registers the hooks and returns finish (a dist.broadcast of the parameters from rank 0, "
            "as DDP does when it wraps a model, is the one collective allowed there)."
        ).format(ops=", ".join(others)),
    )
    expect(
        all(c["waited"] for c in setup if c["async"]),
        at
        + tr(
            "an async broadcast in overlap_hooks was never waited for: call work.wait() on it "
            "(or broadcast with async_op=False) before returning."
        ),
    )


def _expect_overlapped(results: list[dict], rank: int) -> None:
    """Everything one rank did with the learner's hooks, its values against every rank's (chapter 8)."""
    res, at = results[rank], _where(len(results), rank)
    expect(
        res["finish callable"],
        at
        + tr(
            "return a function finish() that waits for the all-reduces and divides; "
            "the check calls it after every backward."
        ),
    )
    expect(not res["moved"], at + tr("the weights changed: average the gradients only, no step."))
    _expect_setup(res["setup calls"], at)
    for step, got in enumerate(res["steps"]):
        _expect_overlap_calls(got, res["params"], at + tr("step {step}: ").format(step=step + 1))
    _expect_overlap_values(results, rank)


def check_overlap_hooks(overlap_hooks: Callable[[nn.Module], Callable[[], None]]) -> CheckResult:
    """Exercise 3: all-reduce each gradient from its post-accumulate hook, overlapping backward (chapter 8)."""

    def probes() -> None:
        one = run_at_world_one(overlap_hooks, "overlap_hooks")
        if one:
            _expect_overlapped([one], 0)
        for world in launched_worlds():
            results = run_on_launched_ranks(overlap_hooks, "overlap_hooks", world)
            for r in range(world):
                _expect_overlapped(results, r)

    return run_check(tr("Exercise 3, all-reduce overlapped with backward"), probes)


def _naive_wire(step: dict, world: int) -> tuple[int, float, float]:
    """(ranks, bytes on the wire per rank per step) of all-reduce + all-gather and of ZeRO-1's two (chapter 8).

    In a ring each rank sends (W - 1) / W of the flat buffer for a reduce-scatter or an
    all-gather, twice that for an all-reduce: 3 and 2 of those shares. At one rank nothing
    travels, so the figures are those of 2 ranks.
    """
    w = max(world, 2)
    padded = w * shard_bounds(step["before"].numel(), w, 0)[2]
    nbytes = padded * step["after"].element_size()
    gather = wire_bytes("all_gather", nbytes, w)
    return w, wire_bytes("all_reduce", nbytes, w) + gather, wire_bytes("reduce_scatter", nbytes, w) + gather  # fmt: skip


#: Why an async collective's result was used too early, in English (tr() them where they are shown).
_UNWAITED = {
    "never": tr_mark("never waited for"),
    "pending at step": tr_mark("optimizer.step() ran before its wait"),
    "written in flight": tr_mark("its tensors were written before its wait"),
    "params written in flight": tr_mark("the parameters were written before its wait"),
    "read in flight": tr_mark("its result was read before its wait"),
}
_WIRE_WHY = {
    "more": tr_mark(
        "A rank needs only its own piece of the averaged gradient: gathering the averaged "
        "pieces as well (the whole mean on every rank) is the all-reduce again, by other names."
    ),
    "less": tr_mark(
        "A collective moved less than the flat vector in the parameters' dtype: every piece "
        "of the gradient and of the parameters must travel, in that dtype."
    ),
}


def _expect_zero1_waits(step: dict, at: str) -> None:
    """Every async collective of one ZeRO-1 step waited for before its result was used (chapter 8)."""
    for call in step["calls"]:
        if not call.get("async"):
            continue
        why = next(
            (
                why
                for key, why in _UNWAITED.items()
                if (not call["waited"] if key == "never" else call[key])
            ),
            None,
        )
        expect(
            why is None,
            at
            + tr(
                "dist.{op} was started with async_op=True and {why}: wait() for each async "
                "collective before using its result. Keep the work it returns and call "
                "work.wait() (or leave async_op out): until then its output may still be "
                "arriving."
            ).format(op=call["op"], why=tr(why or "")),
        )


def _wire_shares(step: dict, world: int) -> tuple[float, str]:
    """Ring shares of the flat padded vector the step's collectives moved, and each call's (chapter 8).

    A share is (W - 1)/W of the flat vector sent per rank: one for a reduce-scatter, an
    all-gather (or any other collective) of the whole flat vector, two for an all-reduce.
    """
    start, stop = step["shard"]
    flat = world * (stop - start) * step["after"].element_size()
    each = [
        (c["op"], (2 if c["op"] == "all_reduce" else 1) * c["bytes"] / flat)
        for c in step["calls"]
        if "bytes" in c
    ]
    said = (tr("dist.{op}: {shares:.3g} share(s)").format(op=op, shares=x) for op, x in each)
    return sum(x for _, x in each), tr("; ").join(said)


def _expect_zero1_wire(step: dict, world: int, at: str, more: bool) -> None:
    """The step's collectives moved no more (`more`) or no less than ZeRO-1's two shares (chapter 8)."""
    got, each = _wire_shares(step, world)
    wrong = got > 2 + 1e-9 if more else got < 2 - 1e-9
    w, _, zero1 = _naive_wire(step, world)
    expect(
        not wrong,
        at
        + tr(
            "your step's collectives put {got:.3g} shares of the flat vector on the wire "
            "({each}), ZeRO-1 exactly 2: one reduce-scatter of the flat padded gradient and one "
            "all-gather of the updated pieces. In a ring each rank sends (W - 1)/W of the flat "
            "vector per share: on {w} ranks {got_bytes:,.0f} bytes per rank per step against "
            "{zero1:,.0f}. {why}"
        ).format(
            got=got,
            each=each,
            w=w,
            got_bytes=zero1 * got / 2,
            zero1=zero1,
            why=tr(_WIRE_WHY["more" if more else "less"]),
        ),  # fmt: skip
    )


def _expect_zero1_calls(step: dict, world: int, at: str) -> None:
    """The collectives of one ZeRO-1 step: a reduce-scatter, the step, an all-gather; no all-reduce (chapter 8)."""
    ops = [c["op"] for c in step["calls"]]
    w, naive, zero1 = _naive_wire(step, world)
    expect(
        "all_reduce" not in ops,
        at
        + tr(
            "you all-reduced the gradients and kept this rank's piece: every rank received the "
            "whole sum and threw most of it away. A rank needs only its own piece of the sum, "
            "which one reduce-scatter of the flat padded gradient delivers. Each rank sends "
            "(W - 1)/W of the flat vector for a reduce-scatter or an all-gather and twice that "
            "for an all-reduce: with the all-gather your step puts 3 such shares on the wire "
            "(on {w} ranks, {naive:,.0f} bytes per rank per step), ZeRO-1 puts 2 ({zero1:,.0f} "
            "bytes), exactly what DDP's all-reduce alone does."
        ).format(w=w, naive=naive, zero1=zero1),
    )
    _expect_zero1_waits(step, at)
    expect(
        "step" in ops or not step["other optimizers"],
        at
        + tr(
            "the optimizer you were given was never stepped, but another one was (a new "
            "torch.optim.Adam in each call?): its moments start from zero at every step. Call "
            "optimizer.step() on the optimizer you were given: it keeps the shard's state from "
            "one step to the next."
        ),
    )
    expect("step" in ops, at + tr("optimizer.step() was never called: it updates your shard."))
    expect(
        ops.count("step") == 1,
        at
        + tr(
            "optimizer.step() ran {n} times in one call: Adam's step count and moments moved "
            "{n} times for one gradient. Call it once, between the reduce-scatter and the "
            "all-gather."
        ).format(n=ops.count("step")),
    )
    scatters = [i for i, op in enumerate(ops) if op.startswith("reduce_scatter")]
    expect(
        scatters and scatters[0] < ops.index("step"),
        at
        + tr(
            "no reduce-scatter before optimizer.step(): the gradients in p.grad are this "
            "rank's own, not yet averaged over the ranks. Flatten them, pad with zeros to "
            "world x shard.numel(), reduce-scatter into a tensor like the shard "
            "(dist.{rs}(piece, flat_grad)): rank r receives the sum of every rank's piece r. "
            "Divide it by the world size and make it shard.grad."
        ).format(rs=_recommended("reduce_scatter_single")),
    )
    gathers = [i for i, op in enumerate(ops) if op.startswith("all_gather")]
    if world > 1:
        expect(
            gathers,
            at
            + tr(
                "no all-gather: the other ranks' updated pieces never reached this rank. "
                "After optimizer.step(), dist.{ag}(flat, shard) collects every rank's piece in "
                "rank order; write it back into the parameters."
            ).format(ag=_recommended("all_gather_single")),
        )
    # gathering the averaged pieces besides the parameters (3 shares) is the all-reduce by other
    # names: the wire check below says that; here the gradient went out instead of the parameters
    expect(
        not step["sent gradient"] or _wire_shares(step, world)[0] > 2 + 1e-9,
        at
        + tr(
            "the all-gather sent this rank's averaged gradient piece (what the reduce-scatter "
            "received, or shard.grad), not its parameters: ZeRO-1 gathers the updated "
            "parameters. After optimizer.step(), all-gather the shard (dist.{ag}(flat, shard)) "
            "and write the flat vector back into the parameters."
        ).format(ag=_recommended("all_gather_single")),
    )
    expect(
        not gathers or gathers[-1] > ops.index("step"),
        at
        + tr(
            "you all-gathered before optimizer.step(): the pieces you sent were the old ones. "
            "Step first, then gather."
        ),
    )
    _expect_zero1_wire(step, world, at, more=True)


def _recommended(name: str) -> str:
    """The name the installed torch gives a flat collective: the new one, else the old (chapter 8)."""
    return name if hasattr(dist, name) else RENAMED_COLLECTIVES[name]


def _expect_zero1_grad(results: list[dict], dtype: str, i: int, rank: int, at: str) -> None:
    """The shard's gradient at optimizer.step(): this rank's piece of the mean of every rank's own (chapter 8)."""
    world, step = len(results), results[rank][dtype][i]
    got, (start, stop) = step["shard grad"], step["shard"]
    expect(
        got is not None,
        at
        + tr(
            "shard.grad was None when optimizer.step() ran, so the shard did not change: set "
            "shard.grad to this rank's averaged piece of the gradient before the step."
        ),
    )
    expect(
        got.shape == (stop - start,),
        at
        + tr(
            "shard.grad has shape {got}, the shard {want}: it must be this rank's piece of the "
            "flat padded gradient, the tensor the reduce-scatter filled."
        ).format(got=tuple(got.shape), want=(stop - start,)),
    )
    local = [r[dtype][i]["local grad"].double()[start:stop] for r in results]
    mean, abs_sum = [sum(local) / world], [sum(g.abs() for g in local)]
    ref = (mean, allreduce_bound_in(abs_sum, world, getattr(torch, dtype)))
    if not _close([got], ref):
        expect(
            world == 1 or not _close([got], ref, world),
            at
            + tr(
                "shard.grad is {world}x the mean: a reduce-scatter sums every rank's piece. "
                "Divide it by dist.get_world_size() before optimizer.step()."
            ).format(world=world),
        )
        expect(
            world == 2 or not _close([got], ref, world / 2),
            at
            + tr(
                "shard.grad is {scale:g}x the mean: you divided by 2, not by the world size "
                "({world} rank(s) here). Divide by dist.get_world_size()."
            ).format(scale=world / 2, world=world),
        )
        expect(
            dtype != "float64"
            or not _close(
                [got], (mean, allreduce_bound_in(abs_sum, world, torch.float32))
            ),  # fmt: skip
            at
            + tr(
                "shard.grad is off by float32 rounding in the float64 run: the gradient passed "
                "through float32 (torch.zeros(n) or torch.empty(n) without a dtype makes a "
                "float32 buffer). Make the flat gradient and the piece in the gradients' dtype: "
                "torch.empty_like(shard), or dtype=shard.dtype."
            ),
        )
    expect(
        _close([got], ref),
        at
        + tr(
            "shard.grad differs from the mean over the ranks of elements {first}..{last} of "
            "their flat gradients by more than fp32 rounding: flatten every p.grad in the order "
            "of params, pad with zeros to world x shard.numel(), reduce-scatter it and divide by "
            "the world size."
        ).format(first=start, last=stop - 1),
    )
    expect(
        step["shard grad storage"] <= step["shard bytes"],
        at
        + tr(
            "shard.grad is a view of a buffer of {got:,} bytes, the shard's piece needs "
            "{want:,}: as long as shard.grad lives (until the next step replaces it) it keeps "
            "that whole buffer alive, the memory ZeRO-1 saves. Make shard.grad a tensor of its "
            "own: reduce-scatter into torch.empty_like(shard), or .clone() the piece."
        ).format(got=step["shard grad storage"], want=step["shard bytes"]),
    )


def adam_reference(results: list[dict], dtype: str, rank: int) -> list[dict[str, Any]]:
    """The state of an Adam that steps this rank's piece alone, once per call, on its shard.grad (chapter 8).

    Each step's gradient is the shard's gradient the learner's optimizer.step() saw, already
    compared with the mean of every rank's own: the moments and step count must equal these
    to the bit (Adam is elementwise, foreach=False on both sides).
    """
    steps, world = results[rank][dtype], len(results)
    (start, stop), first = steps[0]["shard"], steps[0]["before"]
    piece = nn.functional.pad(first, (0, world * (stop - start) - first.numel()))[start:stop]
    piece = piece.clone()
    adam, states = torch.optim.Adam([piece], lr=task.LR, foreach=False), []
    for step in steps:
        piece.grad = step["shard grad"].to(piece.dtype)
        adam.step()
        st = adam.state[piece]
        states.append({"exp_avg": st["exp_avg"].clone(), "exp_avg_sq": st["exp_avg_sq"].clone(), "step": float(st["step"])})  # fmt: skip
    return states


def _expect_zero1_moments(step: dict, want: dict[str, Any], at: str) -> None:
    """Adam's state for the shard after one call: the reference's moments and step count, to the bit (chapter 8)."""
    got = step["adam state"]
    if not got:
        detail = tr("optimizer.state holds nothing for the shard")
    elif got.get("step") != want["step"]:
        count = got.get("step")
        reset = isinstance(count, float) and count < want["step"]
        detail = (
            tr("its step count is {got}, not {want}: its state was reset")
            if reset
            else tr("its step count is {got}, not {want}")
        ).format(got=f"{count:g}" if isinstance(count, float) else count, want=f"{want['step']:g}")
    elif not all(
        torch.is_tensor(got.get(k)) and torch.equal(got[k], want[k]) for k in ("exp_avg", "exp_avg_sq")
    ):  # fmt: skip
        worst = max(
            (got[k] - want[k]).abs().max().item()
            if torch.is_tensor(got.get(k)) and got[k].shape == want[k].shape
            else float("inf")
            for k in ("exp_avg", "exp_avg_sq")
        )
        detail = tr("its moments exp_avg and exp_avg_sq differ by up to {worst:.2g}").format(worst=worst)  # fmt: skip
    else:
        return
    raise CheckFailed(
        at
        + tr(
            "Adam's state for the shard differs from that of an Adam that steps the same piece "
            "alone, once per call: {detail}. Keep the optimizer you were given, with its state, "
            "from one call to the next (no optimizer.state.clear(), no new optimizer), and call "
            "optimizer.step() once per call: the moments average the gradients over the steps."
        ).format(detail=detail)
    )


def zero1_reference(results: list[dict], dtype: str) -> list[torch.Tensor]:
    """Full Adam's parameters after each step, given the averaged gradients the ranks stepped (chapter 8).

    The gradient of each step is every rank's shard gradient in rank order, the padding
    dropped: what the ranks' all-gather must put together. Adam is elementwise and both run
    its same per-tensor code (foreach=False), so the learner's parameters must equal these
    to the bit.
    """
    replica = make_mlp(task.SIZES, seed=3).to(getattr(torch, dtype))
    full = torch.optim.Adam(replica.parameters(), lr=task.LR, foreach=False)
    sizes = [p.numel() for p in replica.parameters()]
    wants = []
    for i in range(len(results[0][dtype])):
        flat = torch.cat([r[dtype][i]["shard grad"] for r in results])[: sum(sizes)]
        for p, g in zip(replica.parameters(), flat.split(sizes)):
            p.grad = g.view_as(p).to(p.dtype)
        full.step()
        wants.append(torch.cat([p.detach().reshape(-1) for p in replica.parameters()]))
    return wants


def _expect_zero1_values(step: dict, want: torch.Tensor, state: dict, world: int, at: str) -> None:
    """One ZeRO-1 step's parameters against full Adam's on the same gradients: equal to the bit (chapter 8).

    Adam is elementwise and both optimizers run its same per-tensor code (foreach=False) on the
    same values: the shard's gradient, moments and step count are copies of the full ones, so
    each element's update is the same sequence of roundings, wherever it sits in its tensor
    (the chapter asserts the same equality for its own Zero1Adam).
    """
    before, after = step["before"], step["after"]
    expect(
        not step["replaced"],
        at
        + tr(
            "you replaced the storage of {n} parameter(s) (p.data = ..., p.set_(...)) instead "
            "of writing into them: copy the gathered values in place, p.copy_(...) under "
            "torch.no_grad(), so that everything holding the parameters (the model's views, "
            "DDP's buckets, the optimizer) sees them."
        ).format(n=len(step["replaced"])),
    )
    most = 2 * step["shard bytes"]  # Adam's two moments of this rank's piece
    expect(
        step["state bytes"] <= most,
        at
        + tr(
            "the optimizers you stepped hold {got:,} bytes of state, but ZeRO-1 keeps only "
            "this rank's piece: Adam's two moments of the shard, {most:,} bytes. Step only the "
            "optimizer you were given, over the shard: adding the parameters to it, or stepping "
            "a full Adam of your own, keeps the whole state on every rank."
        ).format(got=step["state bytes"], most=most),
    )
    expect(
        step["held bytes"] <= most,
        at
        + tr(
            "the optimizer holds {got:,} bytes of tensors between steps (its state and what "
            "you keep on it, the collectives' buffers left out), but ZeRO-1 keeps only this "
            "rank's piece: Adam's two moments of the shard, {most:,} bytes. Full-size moments "
            "kept anywhere, stepped with torch.optim.adam.adam or by hand, put the whole state "
            "back on every rank: step only the optimizer you were given, over the shard."
        ).format(got=step["held bytes"], most=most),
    )
    _expect_zero1_moments(step, state, at)
    expect(
        step["shard moved"],
        at
        + tr(
            "the shard did not change: set shard.grad to this rank's averaged piece of the "
            "gradient before optimizer.step()."
        ),
    )
    expect(
        not step["sent old piece"],
        at
        + tr(
            "the all-gather sent this rank's piece as it was before optimizer.step() (copied "
            "into the gather buffer, or cloned, before the step): the parameters got their old "
            "values back. Take the shard after optimizer.step(): copy it into its slot then, or "
            "all-gather the shard itself."
        ),
    )
    expect(
        not torch.equal(after, before),
        at
        + tr(
            "the parameters did not change: write the gathered pieces back into every "
            "parameter (in place, under torch.no_grad())."
        ),
    )
    _expect_zero1_equal(step, want, at)
    if world > 1:  # at one rank nothing travels (and no all-gather is needed)
        _expect_zero1_wire(step, world, at, more=False)


def _expect_zero1_equal(step: dict, want: torch.Tensor, at: str) -> None:
    """The parameters equal to full Adam's to the bit: this rank's piece, then the others' (chapter 8)."""
    after = step["after"]
    worst = (after - want).abs().max().item()
    # rounding a value to float32 moves it by at most eps32 / 2 of itself: within eps32, the
    # difference is a float32 passage (one more float32 operation on the way included)
    through_float32 = bool(((after - want).abs() <= torch.finfo(torch.float32).eps * want.abs()).all())  # fmt: skip
    expect(
        worst == 0 or step["dtype"] != "torch.float64" or not through_float32,
        at
        + tr(
            "the parameters differ from full Adam's by {worst:.2g}, a float32 rounding error "
            "in a float64 model: keep the parameters' dtype (create buffers with torch.empty_like "
            "or the shard's dtype), so nothing passes through float32."
        ).format(worst=worst),
    )
    start, stop = step["shard"]
    mine = slice(start, min(stop, want.numel()))
    expect(
        torch.equal(after[mine], want[mine]),
        at
        + tr(
            "this rank's own piece (elements {first}..{last} of the flat vector) differs "
            "from full Adam's: its gradient is elements rank*s .. (rank+1)*s of the flat gradient, "
            "s = shard.numel()."
        ).format(first=start, last=stop - 1),
    )
    expect(
        worst == 0,
        at
        + tr(
            "this rank's own piece is right, but another rank's differs from full Adam's by "
            "up to {worst:.2g}: each rank steps its own piece of the gradient (elements rank*s .. "
            "(rank+1)*s, with its own dist.get_rank()), and the gathered pieces, in rank order, "
            "are the flat vector: drop the padding and copy it back parameter by parameter."
        ).format(worst=worst),
    )


def _expect_zero1(results: list[dict]) -> None:
    """Every rank's two steps in both dtypes: collectives, averaged piece, then parameters (chapter 8)."""
    world = len(results)
    for dtype in ("float32", "float64"):

        def at(rank: int, i: int, dtype: str = dtype) -> str:
            return _where(world, rank) + tr("{dtype}, step {step}: ").format(dtype=dtype, step=i + 1)  # fmt: skip

        steps = range(len(results[0][dtype]))
        for i in steps:
            for rank, res in enumerate(results):
                _expect_zero1_calls(res[dtype][i], world, at(rank, i))
                _expect_zero1_grad(results, dtype, i, rank, at(rank, i))
        wants = zero1_reference(results, dtype)
        states = [adam_reference(results, dtype, rank) for rank in range(world)]
        for i in steps:
            for rank, res in enumerate(results):
                _expect_zero1_values(res[dtype][i], wants[i], states[rank][i], world, at(rank, i))


def check_zero1_step(zero1_step: Callable[..., None]) -> CheckResult:
    """Exercise 4: reduce-scatter the gradient, step this rank's piece with Adam, all-gather the parameters (chapter 8)."""

    def probes() -> None:
        one = run_at_world_one(zero1_step, "zero1_step")
        if one:
            _expect_zero1([one])
        for world in launched_worlds():
            _expect_zero1(run_on_launched_ranks(zero1_step, "zero1_step", world))

    return run_check(tr("Exercise 4, a ZeRO-1 step"), probes)
