"""Data parallelism by hand, and the sources' two gradient mistakes (chapter 4).

Every rank holds the same model (rank 0's weights are broadcast), takes its own slice of one
global batch, runs backward, then all-reduces the gradients and divides by the world size.
The result must equal one process's gradient on the whole batch; the notebook checks that.

Also recorded, as errata:

- ``no_division``: the sum without the division, N times too large;
- ``no_grad_backward``: ``with torch.no_grad(): loss.backward()`` on ranks > 0 "so that only
  the main device computes gradients". It fills ``.grad`` all the same.

and ``avg_op``: the same average in one call, ``ReduceOp.AVG``, where the backend has it.

    torchrun --standalone --nproc-per-node=2 manual_allreduce.py --out /tmp/manual
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn

from helpers.data import make_classification_data
from helpers.i18n import tr
from helpers.models import make_mlp
from helpers.scripts.common import (
    Context,
    exit_now,
    grads,
    log,
    parser,
    run_alone,
    write_result,
)


def broadcast_parameters(model: nn.Module) -> None:
    """Copy rank 0's parameters to every rank, so all replicas start equal (chapter 4)."""
    for p in model.parameters():
        dist.broadcast(p.data, src=0)


def average_gradients(model: nn.Module) -> None:
    """Sum every gradient over the ranks, then divide by the world size (chapter 4)."""
    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world_size


def sum_gradients_only(model: nn.Module) -> None:
    """The mistake: all_reduce (a sum) without the division (chapter 4)."""
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


def local_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, no_grad: bool) -> float:
    """Forward and backward on this rank's slice, optionally inside no_grad (chapter 4)."""
    model.zero_grad(set_to_none=True)
    loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
    if no_grad:
        with torch.no_grad():  # the sources' line: it does not stop backward
            loss.backward()
    else:
        loss.backward()
    return loss.item()


def build_parser() -> argparse.ArgumentParser:
    """This script's options (chapter 4)."""
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--per-rank-batch", type=int, default=16)
    return p


def run(ctx: Context, args: argparse.Namespace) -> None:
    """The gradients by hand, their errata and ReduceOp.AVG; results to args.out (chapter 4)."""
    b = args.per_rank_batch
    x, y = make_classification_data(b * ctx.world_size, seed=args.seed)  # the global batch
    mine = slice(ctx.rank * b, (ctx.rank + 1) * b)  # this rank's shard
    xs, ys = x[mine].to(ctx.device), y[mine].to(ctx.device)
    model = make_mlp(seed=args.seed + ctx.rank).to(ctx.device)  # deliberately different...
    broadcast_parameters(model)  # ...until rank 0's weights are copied everywhere
    result: dict = {"shard": (mine.start, mine.stop), "world_size": ctx.world_size}

    result["loss"] = local_backward(model, xs, ys, no_grad=False)
    result["local"] = grads(model)
    average_gradients(model)
    result["averaged"] = grads(model)

    local_backward(model, xs, ys, no_grad=False)
    sum_gradients_only(model)
    result["no_division"] = grads(model)

    # The sources' recipe: ranks > 0 wrap backward in no_grad, then a plain all_reduce.
    local_backward(model, xs, ys, no_grad=ctx.rank > 0)
    result["no_grad_local"] = grads(model)
    sum_gradients_only(model)
    result["sources_recipe"] = grads(model)

    local_backward(model, xs, ys, no_grad=False)
    try:  # one call that averages; not every backend and torch version has it
        for p in model.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        result["avg_op"] = grads(model)
    except (RuntimeError, ValueError):
        result["avg_op"] = None

    write_result(args.out, ctx, result)
    log(
        ctx,
        tr("gradients averaged over {world} ranks; results in {out}").format(
            world=ctx.world_size, out=args.out
        ),
    )


def main(argv: list[str] | None = None) -> None:
    run_alone(build_parser(), run, argv)


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
