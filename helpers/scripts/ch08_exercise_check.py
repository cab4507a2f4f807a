"""Runs a learner's function on every rank for the chapter 8 data-parallel exercise checks (chapter 8).

The checker (``helpers.checks.ch08_parallel``) sends the function as chapter 4's checker does
(its compiled code and the names it uses, ``--payload``); this script rebuilds it on each rank,
calls it in the exercise's situation and saves what happened (``--out``/rank<r>.pt): the values
the checker compares with one process's answer, and every collective the function called, in
order, with what it was given and whether its async work was waited for.

Tasks: ``overlap_hooks`` (all-reduce started from post-accumulate-grad hooks), ``zero1_step``
(a sharded Adam step).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from helpers.checks import is_stub_error
from helpers.comm_overlap import shard_bounds
from helpers.data import make_classification_data
from helpers.models import make_mlp
from helpers.scripts.common import Context, exit_now, flat_params, grads, parser, setup, teardown
from helpers.scripts.exercise_check import rebuild

#: The MLP every task uses: 353 parameters, a multiple of neither 2 nor 3 (the shards are padded).
SIZES = (20, 16, 1)
PER_RANK_BATCH = 8
STEPS = 2
LR = 0.01
#: The collectives the recorder watches, by their name in torch.distributed: every name of
#: every torch from 2.5 on (torch 2.13 renamed all_gather_into_tensor to all_gather_single and
#: reduce_scatter_tensor to reduce_scatter_single); those the installed torch lacks are skipped.
WATCHED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
)


class RecordedWork:
    """An async collective's work, remembering whether anyone waited for it, and when (chapter 8)."""

    def __init__(self, work: Any, call: dict, state: dict) -> None:
        self.work, self.call, self.state = work, call, state

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        self.call["waited"] = True
        # a wait inside backward (in a hook) stops backward until the sum has arrived
        self.call["waited in backward"] |= self.state.get("in backward", False)
        return self.work.wait(*args, **kwargs)

    def get_future(self) -> Any:
        self.call["waited"] = True  # a future is waited for through its own API
        return self.work.get_future()

    def is_completed(self) -> bool:
        return self.work.is_completed()


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a is all of b's elements, in place: b itself, b.data, b.detach(), or a view of
    all of it (b.view(-1), b.flatten() of a contiguous b) (chapter 8)."""
    return a is b or (
        a.numel() == b.numel()
        and a.data_ptr() == b.data_ptr()
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and (a.is_contiguous() and b.is_contiguous() or a.stride() == b.stride())
    )


@contextlib.contextmanager
def recording(params: list[torch.Tensor], state: dict) -> Iterator[list[dict]]:
    """Record every watched collective called inside: name, async, in backward, grad or not (chapter 8)."""
    calls: list[dict] = []
    real = {name: getattr(dist, name) for name in WATCHED if hasattr(dist, name)}

    def watch(name: str) -> Any:
        def call(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            first = tensor if torch.is_tensor(tensor) else (args[0] if args else None)
            done = [p.grad for p in params if p.grad is not None]  # gradients accumulated so far
            grad_of = next(
                (
                    i
                    for i, p in enumerate(params)
                    if p.grad is not None and torch.is_tensor(first) and same_memory(first, p.grad)
                ),
                None,
            )
            record = {
                "op": name,
                "async": bool(kwargs.get("async_op", False)),
                "in backward": state.get("in backward", False),
                "is a grad": grad_of is not None,
                # started in the hook of the gradient it reduces: the one accumulated last
                "own hook": grad_of is not None and grad_of == state.get("latest"),
                "grad of": grad_of,
                "a copy of a grad": torch.is_tensor(first)
                and grad_of is None
                and any(first.shape == g.shape and torch.equal(first, g) for g in done),
                "param shape": any(
                    torch.is_tensor(first) and first.shape == p.shape for p in params
                ),
                "waited": False,
                "waited in backward": False,
            }
            calls.append(record)
            work = real[name](tensor, *args, **kwargs)
            return RecordedWork(work, record, state) if work is not None else None

        return call

    try:
        for name in real:
            setattr(dist, name, watch(name))
        yield calls
    finally:
        for name, fn in real.items():
            setattr(dist, name, fn)


def rank_batch(ctx: Context, step: int, dtype: torch.dtype = torch.float32) -> tuple:
    """This rank's slice of step `step`'s global batch (chapter 8)."""
    x, y = make_classification_data(PER_RANK_BATCH * ctx.world_size, seed=20 + step)
    rows = slice(ctx.rank * PER_RANK_BATCH, (ctx.rank + 1) * PER_RANK_BATCH)
    return x[rows].to(dtype), y[rows].to(dtype)


def local_grads(ctx: Context, step: int) -> list[torch.Tensor]:
    """This rank's own gradients of step `step`, before any all-reduce: a plain backward of a twin (chapter 8)."""
    twin, (x, y) = make_mlp(SIZES, seed=3), rank_batch(ctx, step)
    nn.functional.binary_cross_entropy_with_logits(twin(x), y).backward()
    return grads(twin)


def task_overlap_hooks(ctx: Context, fn: Any) -> dict[str, Any]:
    """The learner's hooks on a fresh model, then two steps of backward + finish() (chapter 8).

    Each step also records this rank's own gradients, from a twin model without hooks (the same
    weights, batch and operations on the same rank: bit for bit what the learner's model had in
    .grad before any all-reduce), from which the checker computes the exact mean over the ranks.
    """
    model = make_mlp(SIZES, seed=3)
    params, state, weights = list(model.parameters()), {}, flat_params(model)
    steps = []
    for i, p in enumerate(params):  # registered first, so it runs before the learner's hook
        p.register_post_accumulate_grad_hook(lambda p, i=i: state.update(latest=i))
    with recording(params, state) as calls:
        finish = fn(model)
        setup = [dict(c) for c in calls]
        for step in range(STEPS):
            model.zero_grad(set_to_none=True)
            x, y = rank_batch(ctx, step)
            loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
            start, state["in backward"], state["latest"] = len(calls), True, None
            loss.backward()
            state["in backward"], state["latest"] = False, None
            if callable(finish):
                finish()
            missing = [p for p in params if p.grad is None]
            got = None if missing else grads(model)
            steps.append(
                {
                    "grads": got,
                    "local grads": local_grads(ctx, step),
                    "calls": [dict(c) for c in calls[start:]],
                }
            )
        for record, call in zip(setup, calls):
            record["waited"] = call["waited"]  # a setup work waited for later, in a step
    return {
        "finish callable": callable(finish),
        "setup calls": setup,
        "steps": steps,
        "moved": not flat_params(model).equal(weights),
        "params": len(params),
    }


def zero1_probe(ctx: Context, fn: Any, dtype: torch.dtype) -> list[dict[str, Any]]:
    """Two ZeRO-1 steps of the learner's against full Adam on the same averaged gradients (chapter 8)."""
    model, replica = make_mlp(SIZES, seed=3).to(dtype), make_mlp(SIZES, seed=3).to(dtype)
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    start, stop, size = shard_bounds(numel, ctx.world_size, ctx.rank)
    flat = nn.functional.pad(flat_params(model), (0, ctx.world_size * size - numel))
    shard = flat[start:stop].clone()
    opt = torch.optim.Adam([shard], lr=LR, foreach=False)
    full = torch.optim.Adam(replica.parameters(), lr=LR, foreach=False)
    out, state = [], {}
    real_step = opt.step
    for step in range(STEPS):
        model.zero_grad(set_to_none=True)
        x, y = rank_batch(ctx, step, dtype)
        nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
        for p, q in zip(params, replica.parameters()):
            dist.all_reduce(p.grad)
            p.grad /= ctx.world_size  # averaged before the learner's step, as DDP would
            q.grad = p.grad.clone()
        full.step()
        before, shard_before = flat_params(model), shard.detach().clone()
        storage = [p.data_ptr() for p in params]
        stepped: dict[int, torch.optim.Optimizer] = {}
        counted = register_optimizer_step_post_hook(
            lambda o, args, kwargs, _seen=stepped: _seen.setdefault(id(o), o)
        )  # every optimizer the learner steps, the one given or another
        try:
            with recording(params, state) as calls:
                opt.step = lambda *a, _calls=calls, **k: (
                    _calls.append({"op": "step"}),
                    real_step(*a, **k),
                )[1]
                fn(params, shard, opt)
        finally:
            opt.step = real_step
            counted.remove()
        out.append(
            {
                "before": before,
                "after": flat_params(model),
                "want": flat_params(replica),
                "shard moved": not torch.equal(shard.detach(), shard_before),
                # the optimizer state this rank holds: every optimizer stepped, its tensors
                "state numel": sum(
                    t.numel()
                    for o in (stepped or {0: opt}).values()
                    for s in o.state.values()
                    for t in s.values()
                    if torch.is_tensor(t) and t.dim()
                ),
                "shard numel": shard.numel(),
                "replaced": [
                    i for i, (p, ptr) in enumerate(zip(params, storage)) if p.data_ptr() != ptr
                ],  # fmt: skip
                "calls": [dict(c) for c in calls],
                "dtype": str(params[0].dtype),
                "shard": (start, stop),
            }
        )
    return out


def task_zero1_step(ctx: Context, fn: Any) -> dict[str, Any]:
    """The learner's ZeRO-1 step in float32, then in float64 (chapter 8)."""
    return {
        "float32": zero1_probe(ctx, fn, torch.float32),
        "float64": zero1_probe(ctx, fn, torch.float64),
    }


def run_task(task: str, ctx: Context, fn: Any) -> dict[str, Any]:
    """Run one task on this rank (or in the checker's own one-rank group) (chapter 8)."""
    if task == "overlap_hooks":
        return task_overlap_hooks(ctx, fn)
    return task_zero1_step(ctx, fn)


def error(exc: BaseException) -> dict[str, str]:
    """The learner's error as the checker reports it (chapter 8)."""
    return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--payload", required=True, type=Path)
    p.add_argument("--task", required=True, choices=["overlap_hooks", "zero1_step"])
    args = p.parse_args()
    ctx = setup(args.pg_timeout)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.payload, "rb") as f:
        payload = pickle.load(f)
    result: dict[str, Any] = {"status": "ok"}
    try:
        result.update(run_task(args.task, ctx, rebuild(payload)))
    except NotImplementedError as exc:  # the learner's own raise is the stub; torch's is an error
        result = {"status": "todo"} if is_stub_error(exc) else error(exc)
    except Exception as exc:  # report the learner's error instead of crashing the job
        result = error(exc)
    torch.save(result, args.out / f"rank{ctx.rank}.pt")
    if result["status"] != "ok":
        # leave at once: the other ranks may be waiting in a collective this rank never joins
        # (teardown's barrier would wait for them until the group's timeout, and their
        # timeouts would bury this rank's own error); torchrun then stops them
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    teardown()


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
