"""Sharded parameters (FSDP) by hand on a stack of layers, against DDP and FSDP2 (chapter 8).

Each rank keeps only its piece of every layer's weights: the layer's weight and bias as one
flat vector, zero-padded to a multiple of the world size and cut into equal pieces. A layer's
forward all-gathers the pieces into one flat buffer (the full weight and bias are views of it),
computes, and lets it go; its backward all-gathers them again, computes the gradients into one
flat padded buffer, and reduce-scatters it, so that each rank receives the averaged gradient of its own piece only. The
optimizer steps the pieces.

The same MLP trains from the same weights on the same batches three ways: DDP, this by-hand
FSDP and FSDP2 (``fully_shard``, chapter 4). Recorded: each step's loss, and the bytes each
rank held before the step, at its peak and after it, measured (``helpers.sharding.LiveBytes``:
the allocator on CUDA, live tensor storages elsewhere) and, on a CPU, what was alive at the
peak, next to the formulas: between steps a rank holds its pieces of the parameters and
gradients; during a step one layer's unit at a time on top of that (its gathered weights while
it computes, then the buffer of its full gradient and the piece reduce-scattered out of it;
gloo adds a copy of the buffer: it runs a reduce-scatter as an all-reduce of a copy). Also the
bytes handed to each collective per step and, on gloo, the bytes each rank wrote to its sockets.

    torchrun --standalone --nproc-per-node=2 fsdp_by_hand.py --out /tmp/fsdp
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.comm_overlap import collective, shard_bounds
from helpers.i18n import tr
from helpers.models import make_mlp
from helpers.scripts.common import (
    Context,
    exit_now,
    log,
    parser,
    run_alone,
    write_result,
)
from helpers.scripts.fsdp_vs_ddp import fsdp_skip_reason
from helpers.sharding import (
    LiveBytes,
    free_now,
    metered_step,
    sent_since,
    wire_bytes,
    zero_formulas,
)

try:  # torch >= 2.6
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch 2.5 has FSDP2 under its early name
    from torch.distributed._composable.fsdp import fully_shard


def nbytes(t: torch.Tensor) -> int:
    """Bytes of one tensor's elements (chapter 8)."""
    return t.numel() * t.element_size()


class ShardedLinear(nn.Module):
    """A Linear layer of which this rank keeps one piece; full weights only while it computes (chapter 8)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.shape = tuple(linear.weight.shape)
        self.numel = linear.weight.numel() + linear.bias.numel()
        self.world, rank = dist.get_world_size(), dist.get_rank()
        start, stop, self.size = shard_bounds(self.numel, self.world, rank)
        flat = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        flat = nn.functional.pad(flat, (0, self.world * self.size - self.numel))
        self.shard = nn.Parameter(flat[start:stop].clone())  # a copy: the full vector goes
        self.handed = {"all_gather": 0, "reduce_scatter": 0}  # bytes of the full buffers, per op

    def flat(self) -> torch.Tensor:
        """A new flat vector of the layer's padded size: world pieces (chapter 8)."""
        return self.shard.new_empty(self.world * self.size)

    def gather(self) -> torch.Tensor:
        """All-gather the pieces into one new flat buffer: the whole layer, padded (chapter 8)."""
        full = self.flat()
        collective("all_gather_single")(full, self.shard.detach())  # _into_tensor before 2.13
        self.handed["all_gather"] += nbytes(full)
        return full

    def unflatten(self, full: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The full weight and bias as views of the gathered buffer: no copy (chapter 8)."""
        n = self.shape[0] * self.shape[1]
        return full[:n].view(self.shape), full[n : self.numel]

    def reduce_scatter(self, grad_y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The full gradients written into one padded buffer, summed over the ranks: this rank's piece, averaged (chapter 8)."""
        flat, n = self.flat(), self.shape[0] * self.shape[1]
        torch.mm(grad_y.t(), x, out=flat[:n].view(self.shape))  # no copy: written in place
        torch.sum(grad_y, 0, out=flat[n : self.numel])
        flat[self.numel :].zero_()
        mine = torch.empty_like(self.shard)
        # reduce_scatter_tensor before 2.13; gloo runs it as an all-reduce of a copy of `flat`
        collective("reduce_scatter_single")(mine, flat)
        self.handed["reduce_scatter"] += nbytes(flat)
        free_now(flat)  # the full gradient's buffer goes now
        average = mine / self.world
        free_now(mine)
        return average

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return GatheredLinear.apply(x, self.shard, self)


class GatheredLinear(torch.autograd.Function):
    """y = x W^T + b with W, b all-gathered in forward and again in backward, never kept (chapter 8)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, shard: torch.Tensor, layer: ShardedLinear
    ) -> torch.Tensor:
        full = layer.gather()
        y = nn.functional.linear(x, *layer.unflatten(full))
        free_now(full)  # the full weights go at once: backward gathers them again
        ctx.layer = layer
        ctx.save_for_backward(x)  # the input only
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        full = ctx.layer.gather()
        grad_x = grad_y @ ctx.layer.unflatten(full)[0]
        free_now(full)  # the gathered layer goes before its gradient's buffer is made
        return grad_x, ctx.layer.reduce_scatter(grad_y, x), None


def by_hand(model: nn.Sequential) -> nn.Sequential:
    """The same stack with every Linear replaced by a ShardedLinear (chapter 8)."""
    return nn.Sequential(*[ShardedLinear(m) if isinstance(m, nn.Linear) else m for m in model])


def batch(ctx: Context, args: argparse.Namespace, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of step `step`'s global batch, the same for every run (chapter 8)."""
    g = torch.Generator().manual_seed(args.seed + 1000 + step)
    x = torch.randn(args.per_rank_batch * ctx.world_size, args.width, generator=g)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    rows = slice(ctx.rank * args.per_rank_batch, (ctx.rank + 1) * args.per_rank_batch)
    return x[rows].to(ctx.device), y[rows].to(ctx.device)


def loss_of(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The training loss of one batch (chapter 8)."""
    return nn.functional.binary_cross_entropy_with_logits(net(x), y)


def build(kind: str, ctx: Context, args: argparse.Namespace, start: dict) -> nn.Module:
    """The model of one run from `start`: DDP, by hand, or FSDP2; the full model is gone where sharded (chapter 8)."""
    model = make_mlp((args.width,) * args.depth + (1,)).to(ctx.device)
    model.load_state_dict(start)
    if kind == "ddp":  # the gradients are views of DDP's buckets: one copy of them, not two
        ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
        return DDP(model, device_ids=ids, gradient_as_bucket_view=True)
    if kind == "by hand":
        return by_hand(model)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train(kind: str, ctx: Context, args: argparse.Namespace, start: dict) -> dict:
    """Train one way from `start`: the losses (averaged over ranks), the bytes alive around each step (chapter 8)."""
    meter = LiveBytes(ctx.device)
    with meter:
        net = build(kind, ctx, args, start)
        opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    losses, steps = [], []
    for step in range(args.steps):
        x, y = batch(ctx, args, step)
        loss_fn = partial(loss_of, net, x, y)
        sent = sent_since(ctx.backend)
        # set_to_none=False: the gradients stay, as the formulas count them
        steps.append(
            metered_step(meter, loss_fn, partial(opt.zero_grad, set_to_none=False), opt.step)
        )
        steps[-1]["sent"] = sent_since(ctx.backend, sent)
        total = torch.tensor(steps[-1]["loss"], device=ctx.device)
        dist.all_reduce(total)
        losses.append(total.item() / ctx.world_size)
    result = {"losses": losses, "steps": steps, "meter": meter.how}
    if kind == "by hand":
        layers = [m for m in net if isinstance(m, ShardedLinear)]
        result["units"] = [m.numel for m in layers]  # elements of each layer, gathered whole
        result["handed per step"] = {
            op: sum(m.handed[op] for m in layers) // args.steps for op in layers[0].handed
        }
    return result


def build_parser() -> argparse.ArgumentParser:
    """This script's options (chapter 8)."""
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--per-rank-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    return p


def wire_per_step(result: dict, backend: str) -> dict:
    """DDP's and the by-hand FSDP's bytes per rank per step: a ring's (NCCL), as `backend` runs them, written (chapter 8)."""
    w, handed = result["world_size"], result["by hand"]["handed per step"]
    ddp = {"all_reduce": result["formulas"]["full model"]}  # DDP all-reduces every gradient once
    rows = {}
    for name, key, ops in (("DDP", "ddp", ddp), ("FSDP by hand", "by hand", handed)):
        rows[name] = {
            "collectives": ops,
            "ring": sum(wire_bytes(op, n, w) for op, n in ops.items()),
            "as run": sum(wire_bytes(op, n, w, backend) for op, n in ops.items()),
            "written": result[key]["steps"][-1]["sent"],
        }
    return rows


def run(ctx: Context, args: argparse.Namespace) -> None:
    """DDP, FSDP by hand and FSDP2 from the same weights; results to args.out (chapter 8)."""
    start = make_mlp((args.width,) * args.depth + (1,), seed=args.seed).state_dict()
    result: dict[str, Any] = {"world_size": ctx.world_size, "device": ctx.device.type}
    result["ddp"] = train("ddp", ctx, args, start)
    result["by hand"] = train("by hand", ctx, args, start)
    skip = fsdp_skip_reason(ctx.device)
    result["fsdp2"] = {"skipped": skip} if skip else train("fsdp2", ctx, args, start)
    units, w = result["by hand"]["units"], ctx.world_size
    # SGD without momentum keeps no state: K = 0, fp32 parameters and gradients, 4 bytes each
    result["formulas"] = {
        "DDP": zero_formulas(sum(units), w, state=0)["DDP"],
        "by hand": sum(zero_formulas(n, w, state=0)["ZeRO-3 / FSDP"] for n in units),
        "largest gathered layer": max(4 * w * -(-n // w) for n in units),
        "full model": 4 * sum(units),
    }
    result["wire per step"] = wire_per_step(result, ctx.backend)
    write_result(args.out, ctx, result)
    after = {
        k: result[k]["steps"][-1]["after"]
        for k in ("ddp", "by hand", "fsdp2")
        if k in result and not result[k].get("skipped")
    }
    log(ctx, alive_line(after))


def alive_line(after: dict[str, int]) -> str:
    """The last log line: bytes alive per rank after a step, per run (chapter 8)."""
    return tr("bytes alive per rank after a step: {runs}").format(
        runs=", ".join(f"{k} {v:,}" for k, v in after.items())
    )


def main(argv: list[str] | None = None) -> None:
    run_alone(build_parser(), run, argv)


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
