"""Sharded parameters (FSDP) by hand on a stack of layers, against DDP and FSDP2 (chapter 8).

Each rank keeps only its piece of every layer's weights: the layer's weight and bias as one
flat vector, zero-padded to a multiple of the world size and cut into equal pieces. A layer's
forward all-gathers the pieces into the full weights, computes, and lets the full weights go;
its backward all-gathers them again, computes the gradients, and reduce-scatters the weight
gradients, so that each rank receives the averaged gradient of its own piece only. The
optimizer steps the pieces.

The same MLP trains from the same weights on the same batches three ways: DDP, this by-hand
FSDP and FSDP2 (``fully_shard``, chapter 4). Recorded: each step's loss, and the peak
parameter bytes each rank held, counted from the tensors it held at every moment that
matters (by hand: the pieces plus the full weights gathered and not yet let go; FSDP2: its
shards plus the layers it has unsharded, read at every layer's forward and backward hooks;
DDP: the full model all the time). On CUDA also the allocator's peak over each run.

    torchrun --standalone --nproc-per-node=2 fsdp_by_hand.py --out /tmp/fsdp
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.comm_overlap import collective, shard_bounds
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

try:  # torch >= 2.6
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch 2.5 has FSDP2 under its early name
    from torch.distributed._composable.fsdp import fully_shard


class ParamMeter:
    """Parameter bytes this rank holds now, and the most it held at once (chapter 8)."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def add(self, n: int) -> None:
        self.now += n
        self.peak = max(self.peak, self.now)


def nbytes(t: torch.Tensor) -> int:
    """Bytes of one tensor's elements (chapter 8)."""
    return t.numel() * t.element_size()


class ShardedLinear(nn.Module):
    """A Linear layer of which this rank keeps one piece; full weights only while it computes (chapter 8)."""

    def __init__(self, linear: nn.Linear, meter: ParamMeter) -> None:
        super().__init__()
        self.shape = tuple(linear.weight.shape)
        self.numel = linear.weight.numel() + linear.bias.numel()
        world, rank = dist.get_world_size(), dist.get_rank()
        start, stop, self.size = shard_bounds(self.numel, world, rank)
        flat = torch.cat([linear.weight.detach().reshape(-1), linear.bias.detach()])
        flat = nn.functional.pad(flat, (0, world * self.size - self.numel))
        self.shard = nn.Parameter(flat[start:stop].clone())
        self.meter, self.reduce = meter, "reduce_scatter"
        meter.add(nbytes(self.shard))

    def gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All-gather the pieces: the full weight and bias, counted as held (chapter 8)."""
        pieces = [torch.empty_like(self.shard) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, self.shard.detach())
        flat = torch.cat(pieces)[: self.numel]
        self.meter.add(nbytes(flat))
        return flat[: self.shape[0] * self.shape[1]].view(self.shape), flat[-self.shape[0] :]

    def release(self, weight: torch.Tensor) -> None:
        """Count the full weights as let go; the caller drops its last reference (chapter 8)."""
        self.meter.add(-self.numel * weight.element_size())

    def reduce_scatter(self, grad_w: torch.Tensor, grad_b: torch.Tensor) -> torch.Tensor:
        """Sum the full gradients over the ranks, keep this rank's piece, divide by the world size (chapter 8)."""
        world = dist.get_world_size()
        flat = torch.cat([grad_w.reshape(-1), grad_b])
        flat = nn.functional.pad(flat, (0, world * self.size - self.numel))
        mine = torch.empty_like(self.shard)
        try:
            collective("reduce_scatter_single")(mine, flat)  # reduce_scatter_tensor before 2.13
        except (RuntimeError, NotImplementedError, ValueError):  # a gloo without reduce_scatter
            self.reduce = "all_reduce, then this rank's piece (this backend has no reduce_scatter)"
            dist.all_reduce(flat)
            mine = flat[dist.get_rank() * self.size :][: self.size].clone()
        return mine / world

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return GatheredLinear.apply(x, self.shard, self)


class GatheredLinear(torch.autograd.Function):
    """y = x W^T + b with W, b all-gathered in forward and again in backward, never kept (chapter 8)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, shard: torch.Tensor, layer: ShardedLinear
    ) -> torch.Tensor:
        weight, bias = layer.gather()
        y = nn.functional.linear(x, weight, bias)
        layer.release(weight)
        ctx.layer = layer
        ctx.save_for_backward(x)  # the input only: the full weights are gathered again later
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (x,) = ctx.saved_tensors
        layer = ctx.layer
        weight, _ = layer.gather()
        grad_x = grad_y @ weight
        layer.release(weight)
        grad_shard = layer.reduce_scatter(grad_y.t() @ x, grad_y.sum(0))
        return grad_x, grad_shard, None


def by_hand(model: nn.Sequential) -> tuple[nn.Sequential, ParamMeter]:
    """The same stack with every Linear replaced by a ShardedLinear (chapter 8)."""
    meter = ParamMeter()
    layers = [ShardedLinear(m, meter) if isinstance(m, nn.Linear) else m for m in model]
    return nn.Sequential(*layers), meter


def local_bytes(t: torch.Tensor) -> int:
    """Bytes of the part of a tensor this rank holds: a DTensor's local shard, else all (chapter 8)."""
    return nbytes(t.to_local() if hasattr(t, "to_local") else t)


def watch_fsdp2(model: nn.Sequential, sharded_bytes: int) -> ParamMeter:
    """Read FSDP2's held parameter bytes at every layer's forward and backward hooks (chapter 8)."""
    meter = ParamMeter()
    meter.add(sharded_bytes)
    linears = [m for m in model if isinstance(m, nn.Linear)]

    def look(*_: Any) -> None:
        # an unsharded layer's weight is a plain tensor; FSDP2 keeps its shards meanwhile
        full = sum(
            nbytes(m.weight) + nbytes(m.bias) for m in linears if not hasattr(m.weight, "to_local")
        )
        meter.peak = max(meter.peak, sharded_bytes + full)

    for i, m in enumerate(
        linears
    ):  # after fully_shard: FSDP2 unshards before these, reshards after
        m.register_forward_pre_hook(look)
        m.register_forward_hook(look, prepend=True)
        if i:  # the first layer's input needs no gradient: torch warns about a hook there
            m.register_full_backward_pre_hook(look)
    return meter


def batch(ctx: Context, args: argparse.Namespace, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of step `step`'s global batch, the same for every run (chapter 8)."""
    g = torch.Generator().manual_seed(args.seed + 1000 + step)
    x = torch.randn(args.per_rank_batch * ctx.world_size, args.width, generator=g)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    rows = slice(ctx.rank * args.per_rank_batch, (ctx.rank + 1) * args.per_rank_batch)
    return x[rows].to(ctx.device), y[rows].to(ctx.device)


def train(kind: str, ctx: Context, args: argparse.Namespace, start: dict) -> dict:
    """Train one way from `start`; the losses (averaged over ranks) and the peak parameter bytes (chapter 8)."""
    model = make_mlp((args.width,) * args.depth + (1,)).to(ctx.device)
    model.load_state_dict(start)
    full_bytes = sum(nbytes(p) for p in model.parameters())
    extra: dict[str, Any] = {}
    if kind == "ddp":
        net: nn.Module = DDP(
            model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None
        )
        meter = ParamMeter()
        meter.add(full_bytes)  # every rank holds the whole model, all the time
    elif kind == "by hand":
        net, meter = by_hand(model)
    else:
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        for m in model:
            if isinstance(m, nn.Linear):
                fully_shard(m, mesh=mesh)
        net = fully_shard(model, mesh=mesh)
        meter = watch_fsdp2(model, sum(local_bytes(p) for p in net.parameters()))
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr)
    losses = []
    for step in range(args.steps):
        x, y = batch(ctx, args, step)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.binary_cross_entropy_with_logits(net(x), y)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / ctx.world_size)
    if kind == "by hand":
        extra["reduce"] = next(m.reduce for m in net if isinstance(m, ShardedLinear))
        extra["held after the step"] = meter.now  # the pieces only: every gathered weight let go
    return {
        "losses": losses,
        "peak parameter bytes": meter.peak,
        "full model bytes": full_bytes,
        "cuda peak bytes": torch.cuda.max_memory_allocated(ctx.device)
        if ctx.device.type == "cuda"
        else None,
        **extra,
    }


def build_parser() -> argparse.ArgumentParser:
    """This script's options (chapter 8)."""
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--per-rank-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    return p


def run(ctx: Context, args: argparse.Namespace) -> None:
    """DDP, FSDP by hand and FSDP2 from the same weights; results to args.out (chapter 8)."""
    start = make_mlp((args.width,) * args.depth + (1,), seed=args.seed).state_dict()
    result: dict[str, Any] = {"world_size": ctx.world_size, "device": ctx.device.type}
    result["ddp"] = train("ddp", ctx, args, start)
    result["by hand"] = train("by hand", ctx, args, start)
    skip = fsdp_skip_reason(ctx.device)
    result["fsdp2"] = {"skipped": skip} if skip else train("fsdp2", ctx, args, start)
    write_result(args.out, ctx, result)
    log(
        ctx,
        f"peak parameter bytes per rank: DDP {result['ddp']['peak parameter bytes']:,}, by hand "
        f"{result['by hand']['peak parameter bytes']:,}"
        + ("" if skip else f", FSDP2 {result['fsdp2']['peak parameter bytes']:,}"),
    )


def main(argv: list[str] | None = None) -> None:
    run_alone(build_parser(), run, argv)


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
