"""Checkers for the chapter 4 exercises (chapter 4).

Three of them run the learner's function at two world sizes: first in this process, in a
one-rank gloo group (world size 1, no launch), then on 3 gloo ranks launched with torchrun
(an odd world size; a tiny job, so the launcher allows 3 even on 2 cores). For the launch the function
travels as its compiled code plus the modules and imported names it uses (so it must be
self-contained: imports inside the exercise cell, no helper functions from other cells),
``helpers/scripts/exercise_check.py`` calls it on each rank, and the checker compares what
the ranks did with one process's answer. An untouched stub is recognised without launching.
"""

from __future__ import annotations

import datetime
import importlib
import marshal
import os
import pickle
import shutil
import tempfile
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
    one_backward_per_forward_hint,
    probe,
    run_check,
    torchrun_environment,
)
from helpers.data import make_classification_data
from helpers.i18n import tr
from helpers.launch import TINY_JOB_RANKS, launch, new_run_dir, read_results
from helpers.scripts import exercise_check as task
from helpers.scripts.common import Context, teardown

#: The world sizes the distributed checkers try: 1 in this process, then the launched ranks.
MAX_RANKS = 3
#: Seconds before a collective or send/recv in the one-rank group gives up (no rank 1 exists).
IN_PROCESS_TIMEOUT_S = 5
_SIMPLE = (bool, int, float, str, bytes, type(None))


def _names(code: types.CodeType) -> set[str]:
    """Every global name a code object (and the code nested in it) may look up (chapter 4)."""
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _names(const)
    return found


def _importable(obj: Any) -> tuple[str, str] | None:
    """(module, qualname) if `obj` can be imported back by that name, else None (chapter 4)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return (module, qualname) if found is obj else None


def is_stub(fn: Callable) -> bool:
    """True while the function still raises the exercise's NotImplementedError (chapter 4)."""
    return "NotImplementedError" in _names(fn.__code__)


def payload(fn: Callable, _seen: frozenset[str] = frozenset()) -> dict[str, Any]:
    """What the ranks need to rebuild `fn`: its code and the globals it names (chapter 4).

    A name for `fn` itself (a recursive call, state kept as its attribute) is rebound to the
    rebuilt function; another plain function of the notebook it calls is sent the same way.
    """
    if not isinstance(fn, types.FunctionType):
        raise CheckFailed(
            tr("pass your function itself, not {type}.").format(type=type(fn).__name__)
        )
    if fn.__closure__:
        raise CheckFailed(
            tr("define the function at the top level of the cell, not inside another.")
        )
    modules, objects, values, functions, itself = {}, {}, {}, {}, []
    seen = _seen | {fn.__name__}
    for name in sorted(_names(fn.__code__)):
        if name not in fn.__globals__:
            continue  # a builtin, an attribute name, or a name that is simply not used
        value = fn.__globals__[name]
        if value is fn:
            itself.append(name)
        elif (
            isinstance(value, types.FunctionType)
            and value.__module__ == fn.__module__
            and not value.__closure__
            and name not in seen
        ):  # a helper defined in the notebook, next to the function
            functions[name] = payload(value, seen | {name})
        elif isinstance(value, types.ModuleType):
            modules[name] = value.__name__
        elif isinstance(value, _SIMPLE):
            values[name] = value
        elif (where := _importable(value)) is not None:
            objects[name] = where
        else:
            raise CheckFailed(
                tr(
                    "your function uses {name!r} from the notebook, and the ranks cannot see the "
                    "notebook. Import or define what it needs inside the exercise cell (imports "
                    "are fine), or inside the function."
                ).format(name=name)
            )
    return {
        "code": marshal.dumps(fn.__code__),
        "name": fn.__name__,
        "defaults": fn.__defaults__,
        "modules": modules,
        "objects": objects,
        "values": values,
        "functions": functions,
        "itself": itself,
    }


def launched_ranks() -> int:
    """How many ranks the launch uses: 3 on every machine, as a tiny gloo job (chapter 4)."""
    return min(MAX_RANKS, TINY_JOB_RANKS)


#: Point-to-point calls that would wait for (or, in gloo, crash on) a rank a world of 1 lacks.
_P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")


def _no_peer(name: str) -> Callable[..., Any]:
    """A stand-in for dist.<name> that raises: with one rank there is no peer (chapter 4)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(
            tr(
                "dist.{name} at world size 1: there is no other rank to send to or receive from"
            ).format(name=name)
        )

    return refuse


@contextmanager
def _one_rank_world(out: Path) -> Iterator[None]:
    """A one-rank gloo group in this process, as torchrun's rank 0 sees it, then torn down (chapter 4).

    The environment is torchrun's (RANK, WORLD_SIZE, ...), so an answer that reads it works;
    point-to-point calls are refused, since a world of one has no peer.
    """
    with mock.patch.dict(os.environ, torchrun_environment(rank=0, world_size=1)):
        dist.init_process_group(
            "gloo",
            init_method=(out / "pg").resolve().as_uri(),
            rank=0,
            world_size=1,
            timeout=datetime.timedelta(seconds=IN_PROCESS_TIMEOUT_S),  # a wait for rank 1 ends
        )
        real = {name: getattr(dist, name) for name in _P2P if hasattr(dist, name)}
        try:
            for name in real:
                setattr(dist, name, _no_peer(name))
            yield
        finally:
            for name, fn in real.items():
                setattr(dist, name, fn)
            if dist.is_initialized():
                try:
                    teardown()  # a barrier first: see its comment
                except RuntimeError:  # the learner's code left the group broken: just leave it
                    if dist.is_initialized():
                        dist.destroy_process_group()


def run_in_process(fn: Callable, name: str, steps: int = task.ACCUM_STEPS) -> dict[str, Any]:
    """Run task `name` on `fn` in this process, in a one-rank gloo group (chapter 4)."""
    if is_stub(fn):
        raise NotDoneYet
    payload(fn)  # self-contained, as the launched ranks will need it: say so before running
    if not dist.is_available() or dist.is_initialized():
        return {}  # no torch.distributed, or the notebook has its own group: launched ranks only
    out = Path(tempfile.mkdtemp(prefix=f"course_ch04_exercise_{name}_"))
    try:
        with _one_rank_world(out), probe(tr("1 rank, in this process")):
            return task.run_task(
                name, Context(0, 1, 0, "gloo", torch.device("cpu")), fn, out, steps
            )
    except CheckFailed as exc:
        # torch's timeout, or _no_peer's refusal (whose translation says "world size 1" too)
        words = ("timeout", "world size 1", tr("world size 1").lower())
        if not any(w in str(exc).lower() for w in words):
            raise
        raise CheckFailed(
            tr(
                "{error} With one rank there is no other rank to wait for: use collectives such "
                "as dist.all_reduce, which work for any number of ranks, not sends to a fixed rank."
            ).format(error=exc)
        ) from None
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run_on_ranks(
    fn: Callable, name: str, world: int, steps: int = task.ACCUM_STEPS
) -> list[dict[str, Any]]:
    """Run `fn` as task `name` on `world` launched gloo ranks; each rank's result (chapter 4)."""
    if is_stub(fn):
        raise NotDoneYet
    data = payload(fn)
    out = new_run_dir(f"exercise_{name}")
    with open(out / "payload.pkl", "wb") as f:
        pickle.dump(data, f)
    args = ["--payload", out / "payload.pkl", "--task", name, "--out", out, "--pg-timeout", 20]
    args += ["--accum-steps", steps]
    try:
        res = launch(
            "exercise_check",
            world,
            args,
            backend="gloo",
            timeout=120,
            echo=False,
            check=False,
            tiny_job=True,
        )
        if not res.ok:
            tail = "\n".join(res.lines[-15:])
            raise CheckFailed(
                tr("the {world}-rank run failed. {message}\nLast lines:\n{tail}").format(
                    world=world, message=res.message, tail=tail
                )
            )
        results = read_results(out, world)
    finally:
        shutil.rmtree(out, ignore_errors=True)  # payload, checkpoint, rank files: read already
    if any(r["status"] == "todo" for r in results):
        raise NotDoneYet
    errors = [r["error"] for r in results if r["status"] == "error"]
    if errors:
        raise CheckFailed(
            tr("[probe: {world} ranks] your function raised on the ranks: {error}").format(
                world=world, error=errors[0]
            )
        )
    return results


def _close(a: list[torch.Tensor], b: list[torch.Tensor], scale: float = 1.0) -> bool:
    """Whether two lists of gradients match, b scaled by `scale` (chapter 4)."""
    return all(torch.allclose(x, y * scale, rtol=1e-4, atol=1e-6) for x, y in zip(a, b))


def _grads(model: nn.Module) -> list[torch.Tensor]:
    """A copy of every gradient of `model` (chapter 4)."""
    return [p.grad.detach().clone() for p in model.parameters()]


def reference_average_gradients(world: int) -> list[torch.Tensor]:
    """One process's gradients on the whole global batch of `world` ranks (chapter 4)."""
    x, y = make_classification_data(task.PER_RANK_BATCH * world, seed=7)
    model = task.make_mlp(task.SIZES, seed=3)
    nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
    return _grads(model)


def _where(world: int, rank: int) -> str:
    """'[probe: 3 ranks, rank 1] ' or '[probe: 1 rank] ' (chapter 4)."""
    if world > 1:
        return tr("[probe: {world} ranks, rank {rank}] ").format(world=world, rank=rank)
    return tr("[probe: 1 rank] ")


def _expect_averaged(res: dict[str, Any], ref: list[torch.Tensor], world: int, rank: int) -> None:
    """One rank's gradients after average_gradients, against the whole batch's (chapter 4)."""
    after, before, at = res["after"], res["before"], _where(world, rank)
    expect(not res["moved"], at + tr("the weights changed: average the gradients only, no step."))
    if world > 1:
        expect(
            not _close(after, before),
            at + tr("the gradients did not change: call dist.all_reduce on every p.grad."),
        )
        expect(
            not _close(after, ref, world),
            at
            + tr(
                "the gradients are {world}x too large: all_reduce sums, so divide by "
                "dist.get_world_size() afterwards."
            ).format(world=world),
        )
    for k in sorted({2, 3, world * world} - {1}):
        expect(
            not _close(after, ref, 1 / k),
            at
            + tr(
                "the gradients are {k}x too small: divide once, by dist.get_world_size() "
                "(here {world}), not by a fixed number or twice."
            ).format(k=k, world=world),
        )
    expect(
        _close(after, ref),
        at
        + tr(
            "the gradients differ from one process's gradient on the whole batch. Sum them "
            "with dist.all_reduce(p.grad) and divide by dist.get_world_size()."
        ),
    )


def check_average_gradients(average_gradients: Callable[[nn.Module], None]) -> CheckResult:
    """Exercise 2: all-reduce the gradients and divide by the world size, at 1 and 2-3 ranks (chapter 4)."""

    def probes() -> None:
        one = run_in_process(average_gradients, "average_gradients")
        if one:
            _expect_averaged(one, reference_average_gradients(1), 1, 0)
        world = launched_ranks()
        ranks = run_on_ranks(average_gradients, "average_gradients", world)
        ref = reference_average_gradients(world)
        for r, res in enumerate(ranks):
            _expect_averaged(res, ref, world, r)

    return run_check(tr("Exercise 2, average the gradients"), probes)


def reference_accumulate(world: int, steps: int) -> list[torch.Tensor]:
    """One process's gradients on the accumulate task's whole global batch (chapter 4)."""
    x, y = make_classification_data(steps * task.PER_RANK_BATCH * world, seed=11)
    model = task.make_mlp(task.SIZES, seed=3)
    nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
    return _grads(model)


def _expect_accumulated(res: dict[str, Any], world: int, rank: int, steps: int) -> None:
    """One rank's accumulation: order, gradients and all-reduce count (chapter 4)."""
    at = _where(world, rank) + tr("{steps} micro-batches: ").format(steps=steps)
    g, calls, per_sync, together = (
        res["grads"],
        res["calls"],
        res["calls_per_sync"],
        res["together"],
    )
    expect(together <= 1, at + one_backward_per_forward_hint(together))
    expect(not res["moved"], at + tr("the weights changed: accumulate gradients only, no step."))
    expect(
        calls > 0,
        at
        + tr(
            "DDP never all-reduced: the last micro-batch's backward must run outside "
            "no_sync(), so that the accumulated gradients are averaged once."
        ),
    )
    ref = reference_accumulate(world, steps)
    expect(
        not _close(g, ref, steps),
        at
        + tr(
            "the gradients are {steps}x too large: divide each micro-batch's loss by "
            "len(micro_batches) before backward."
        ).format(steps=steps),
    )
    for k in sorted({2, 3, 4, world, steps * world} - {1, steps}):
        ratio = steps / k
        hint = (
            tr(
                "the gradients are {times:.3g}x too large: divide each loss by "
                "len(micro_batches) (here {steps}), not by a fixed number or by the world size "
                "(DDP already averages over ranks)."
            )
            if ratio > 1
            else tr(
                "the gradients are {times:.3g}x too small: divide each loss by "
                "len(micro_batches) (here {steps}), not by a fixed number or by the world size "
                "(DDP already averages over ranks)."
            )
        )
        expect(
            not _close(g, ref, ratio),
            at + hint.format(times=max(ratio, 1 / ratio), steps=steps),
        )
    expect(
        _close(g, ref),
        at
        + tr(
            "the gradients differ from the big batch's. Backward on every micro-batch with "
            "loss / len(micro_batches), inside model.no_sync() for all but the last."
        ),
    )
    expect(
        calls == per_sync,
        at
        + tr(
            "DDP all-reduced {times} times instead of once: wrap every "
            "backward except the last in `with model.no_sync():`."
        ).format(times=calls // max(per_sync, 1)),
    )


def check_accumulate(accumulate: Callable[..., None]) -> CheckResult:
    """Exercise 3: accumulation with no_sync, one backward per micro-batch, at 1 and 2-3 ranks (chapter 4)."""

    def probes() -> None:
        one = run_in_process(accumulate, "accumulate", steps=4)
        if one:
            _expect_accumulated(one, 1, 0, 4)
        world = launched_ranks()
        for r, res in enumerate(run_on_ranks(accumulate, "accumulate", world, task.ACCUM_STEPS)):
            _expect_accumulated(res, world, r, task.ACCUM_STEPS)

    return run_check(tr("Exercise 3, accumulate with no_sync"), probes)


def _epochs(read: list[int], per_epoch: int) -> list[list[int]]:
    """One rank's reads cut into epochs (chapter 4)."""
    return [read[e * per_epoch : (e + 1) * per_epoch] for e in range(task.EPOCHS)]


def reference_train(reads: list[list[int]]) -> torch.Tensor:
    """One process training on the global batches the ranks read, as a flat vector (chapter 4)."""
    x, y = make_classification_data(task.DATASET_SIZE, seed=5)
    model = task.make_mlp(task.SIZES, seed=3)
    opt = torch.optim.SGD(model.parameters(), lr=task.LR)
    b, per_epoch = task.PER_RANK_BATCH, len(reads[0]) // task.EPOCHS
    for e in range(task.EPOCHS):
        epochs = [_epochs(read, per_epoch)[e] for read in reads]
        for s in range(0, per_epoch, b):
            idx = torch.tensor([i for epoch in epochs for i in epoch[s : s + b]])
            opt.zero_grad()
            nn.functional.binary_cross_entropy_with_logits(model(x[idx]), y[idx]).backward()
            opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _expect_sharded(ranks: list[dict[str, Any]]) -> None:
    """Each rank read its own share (DistributedSampler), reshuffled each epoch (chapter 4)."""
    n, w, epochs = task.DATASET_SIZE, len(ranks), task.EPOCHS
    per_epoch = -(-n // w)  # DistributedSampler pads to a multiple of the world size
    for r, res in enumerate(ranks):
        expect(
            len(res["read"]) == per_epoch * epochs,
            _where(w, r)
            + tr(
                "this rank read {read} samples in {epochs} epochs instead of {want} ({n} samples "
                "/ {w} ranks, rounded up, per epoch): give the DataLoader a "
                "DistributedSampler(dataset) (no num_replicas/rank of your own, no shuffle=True "
                "on the loader), so that each rank reads only its share."
            ).format(read=len(res["read"]), epochs=epochs, want=per_epoch * epochs, n=n, w=w),
        )
    firsts = [set(_epochs(res["read"], per_epoch)[0]) for res in ranks]
    expect(
        len(set().union(*firsts)) == n,
        _where(w, 0)
        + tr("the ranks' shares overlap: build DistributedSampler(dataset) inside the ranks."),
    )
    first, second = _epochs(ranks[0]["read"], per_epoch)[:2]
    expect(
        first != second,
        _where(w, 0)
        + tr(
            "every epoch read the data in the same order: call sampler.set_epoch(epoch) at the "
            "start of each epoch."
        ),
    )


def _expect_saved_once(ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank 0 alone saved, once, the plain state_dict, and every rank waited for it (chapter 4)."""
    w = len(ranks)
    others = [r for r, res in enumerate(ranks) if r and res["saves"]]
    expect(
        not others,
        _where(w, others[0] if others else 0)
        + tr("this rank saved a checkpoint too: save only where dist.get_rank() == 0."),
    )
    saves = ranks[0]["saves"]
    expect(
        len(saves) == 1,
        _where(w, 0)
        + tr("rank 0 saved {n} times; save once, after training.").format(n=len(saves)),
    )
    early = [r for r, res in enumerate(ranks) if not res.get("written_on_return", True)]
    expect(
        not early,
        _where(w, early[0] if early else 0)
        + tr(
            "this rank returned before rank 0 had written the checkpoint (its torch.save was "
            "slow on purpose): call dist.barrier() on every rank after rank 0 saves, so that no "
            "rank goes on (or exits) before the file exists."
        ),
    )
    keys = saves[0]["keys"] or []
    expect(
        keys and not any(k.startswith("module.") for k in keys),
        _where(w, 0)
        + tr(
            "save the plain model's weights, model.module.state_dict() (a state_dict, without "
            "the 'module.' prefix that DDP adds), not the DDP wrapper's."
        ),
    )
    return saves


def _expect_trained(ranks: list[dict[str, Any]]) -> None:
    """What train_ddp did on every rank of one world size (chapter 4)."""
    w = len(ranks)
    _expect_sharded(ranks)
    differ = [
        r for r, res in enumerate(ranks) if not torch.equal(res["params"], ranks[0]["params"])
    ]
    expect(
        not differ,
        tr(
            "[probe: {w} ranks] the ranks ended with different weights: wrap the model in "
            "DistributedDataParallel so that every backward averages the gradients."
        ).format(w=w),
    )
    _expect_saved_once(ranks)
    chatty = [r for r, res in enumerate(ranks) if r and res["printed"].strip()]
    expect(
        not chatty,
        _where(w, chatty[0] if chatty else 0)
        + tr("this rank printed too: log only on rank 0, or every line appears once per rank."),
    )
    state = ranks[0]["checkpoint"]
    expect(
        isinstance(state, dict),
        _where(w, 0)
        + tr(
            "torch.load(checkpoint_path, weights_only=True) failed: {state}. Save "
            "model.module.state_dict() with torch.save to checkpoint_path."
        ).format(state=state),
    )
    plain = task.make_mlp(task.SIZES, seed=0)
    plain.load_state_dict(state)
    saved = torch.cat([p.detach().reshape(-1) for p in plain.parameters()])
    expect(
        torch.equal(saved, ranks[0]["params"]),
        _where(w, 0) + tr("the checkpoint is not the trained model."),
    )
    ref = reference_train([res["read"] for res in ranks])
    expect(
        torch.allclose(saved, ref, rtol=1e-4, atol=1e-5),
        tr(
            "[probe: {w} ranks] the weights differ from one process training on the same global "
            "batches: keep SGD(lr=lr), BCEWithLogitsLoss and one step per batch."
        ).format(w=w),
    )


def check_train_ddp(train_ddp: Callable[..., None]) -> CheckResult:
    """Exercise 4: a DDP-ready loop, with sampler, set_epoch, DDP and rank-0 saving, at 1 and 2-3 ranks (chapter 4)."""

    def probes() -> None:
        one = run_in_process(train_ddp, "train_ddp")
        if one:
            _expect_trained([one])
        _expect_trained(run_on_ranks(train_ddp, "train_ddp", launched_ranks()))

    return run_check(tr("Exercise 4, a DDP-ready training loop"), probes)


def check_scaled_lr(scaled_lr: Callable[..., tuple[int, float]]) -> CheckResult:
    """Exercise 1: effective batch size and the linear learning-rate scaling rule (chapter 4)."""

    cases = [  # base_lr, base_batch, per_rank_batch, world_size, accum_steps
        (0.1, 256, 32, 8, 1),
        (0.1, 256, 32, 8, 4),
        (3e-4, 64, 16, 2, 2),
        (0.05, 128, 128, 1, 1),
        (0.1, 256, 48, 3, 1),  # effective 144: a ratio of 0.5625, not a whole number
        (0.02, 100, 7, 3, 2),  # effective 42 of 100
        (1e-3, 64, 16, 1, 3),  # one rank, accumulation only
    ]

    def probes() -> None:
        for base_lr, base_batch, per_rank, world, accum in cases:
            with probe(
                f"base_lr={base_lr}, base_batch={base_batch}, per_rank_batch={per_rank}, "
                f"world_size={world}, accum_steps={accum}"
            ):
                one(base_lr, base_batch, per_rank, world, accum)

    def one(base_lr: float, base_batch: int, per_rank: int, world: int, accum: int) -> None:
        got = scaled_lr(base_lr, base_batch, per_rank, world, accum)
        expect(
            isinstance(got, tuple) and len(got) == 2,
            tr("return a pair: (effective_batch, learning_rate)."),
        )
        batch, lr = got
        want = per_rank * world * accum
        if accum > 1:
            expect(
                batch != per_rank * world,
                tr(
                    "the effective batch ignores accumulation: each optimizer step sees "
                    "per_rank_batch x world_size x accum_steps samples."
                ),
            )
        expect(
            batch == want,
            tr(
                "with {per_rank} per rank, {world} ranks and {accum} accumulation steps the "
                "effective batch is {want}, not {batch}."
            ).format(per_rank=per_rank, world=world, accum=accum, want=want, batch=batch),
        )
        right = base_lr * want / base_batch
        expect(
            isinstance(lr, (int, float)) and abs(lr - right) <= 1e-12 + 1e-9 * abs(right),
            tr(
                "expected the learning rate {right:.6g}, got {lr!r}: scale the learning rate "
                "linearly, base_lr x effective_batch / base_batch (a true division, not //)."
            ).format(right=right, lr=lr),
        )

    return run_check(tr("Exercise 1, effective batch and learning rate"), probes)
