"""A sharded optimizer (ZeRO-1) by hand, against every rank keeping all of Adam's state (chapter 8).

DDP gives every rank the same averaged gradients, and then every rank runs the same Adam over
every parameter: each holds both of Adam's moment tensors for the whole model. ZeRO-1 (Rajbhandari
et al., 2020) cuts that state among the ranks. Here the parameters are seen as one flat
vector, padded with zeros to a multiple of the world size, and cut into equal contiguous
pieces: rank r owns elements ``r*s .. (r+1)*s``. Each rank keeps Adam's state for its piece
only, steps it with its piece of the averaged gradient, and the updated pieces are
all-gathered so that every rank has the whole model again.

Each step, one DDP model computes the averaged gradients; a replica receives the same
gradients and takes an ordinary Adam step (what a DDP rank does), the DDP model takes the
ZeRO-1 step. Recorded: the largest difference between the two after every step, the bytes of
every optimizer's state tensors, and the bytes each step hands to its collectives.

    torchrun --standalone --nproc-per-node=2 zero1_by_hand.py --out /tmp/zero1
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.comm_overlap import shard_bounds
from helpers.models import make_mlp
from helpers.scripts.common import (
    Context,
    exit_now,
    log,
    parser,
    run_alone,
    write_result,
)


class Zero1Adam:
    """Adam over this rank's piece of the flat parameters; the pieces are all-gathered after each step (chapter 8)."""

    def __init__(self, params: list[nn.Parameter], lr: float) -> None:
        self.params = list(params)
        world, rank = dist.get_world_size(), dist.get_rank()
        numel = sum(p.numel() for p in self.params)
        self.start, self.stop, self.size = shard_bounds(numel, world, rank)
        self.padded = world * self.size
        with torch.no_grad():
            self.shard = self.flat([p.detach() for p in self.params])[
                self.start : self.stop
            ].clone()
        # foreach=False: the same per-tensor Adam code as the unsharded optimizer it is compared with
        self.opt = torch.optim.Adam([self.shard], lr=lr, foreach=False)
        self.gathered = 0  # bytes received by all-gather, this step

    def flat(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The tensors as one vector, zero-padded to world x shard size (chapter 8)."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return nn.functional.pad(flat, (0, self.padded - flat.numel()))

    @torch.no_grad()
    def step(self) -> None:
        self.shard.grad = self.flat([p.grad for p in self.params])[self.start : self.stop]
        self.opt.step()  # Adam's moments exist for this piece only
        pieces = [torch.empty_like(self.shard) for _ in range(dist.get_world_size())]
        dist.all_gather(pieces, self.shard)  # every rank gets every updated piece
        flat = torch.cat(pieces)
        self.gathered = flat.numel() * flat.element_size()
        offset = 0
        for p in self.params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def state_bytes(opt: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of an optimizer's state tensors: Adam's two moments, and its step counters (chapter 8)."""
    moments = counters = 0
    for state in opt.state.values():
        for key, t in state.items():
            if torch.is_tensor(t):
                n = t.numel() * t.element_size()
                if key in ("exp_avg", "exp_avg_sq"):
                    moments += n
                else:
                    counters += n
    return {"moments": moments, "step counters": counters}


def build_parser() -> argparse.ArgumentParser:
    """This script's options (chapter 8)."""
    p = parser(__doc__.splitlines()[0])
    # 4,200 parameters = 5 x 840, and 840 = lcm(1..8): every world size up to 8 needs no padding
    p.add_argument("--sizes", default="32,44,56,4", help="layer sizes of the MLP")
    p.add_argument("--per-rank-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-2)
    return p


def run(ctx: Context, args: argparse.Namespace) -> None:
    """ZeRO-1 against every rank's full Adam, on the same gradients; results to args.out (chapter 8)."""
    sizes = tuple(int(s) for s in args.sizes.split(","))
    model = make_mlp(sizes, seed=args.seed).to(ctx.device)
    replica = make_mlp(sizes, seed=args.seed).to(ctx.device)
    ddp = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    full = torch.optim.Adam(replica.parameters(), lr=args.lr, foreach=False)
    zero1 = Zero1Adam(list(model.parameters()), lr=args.lr)
    diffs, losses = [], []
    for step in range(args.steps):
        g = torch.Generator().manual_seed(args.seed + 100 + step)
        x = torch.randn(args.per_rank_batch * ctx.world_size, sizes[0], generator=g)
        y = (x.sum(dim=1, keepdim=True) > 0).float().expand(-1, sizes[-1])
        rows = slice(ctx.rank * args.per_rank_batch, (ctx.rank + 1) * args.per_rank_batch)
        ddp.zero_grad(set_to_none=True)
        xs, ys = x[rows].to(ctx.device), y[rows].to(ctx.device)
        loss = nn.functional.binary_cross_entropy_with_logits(ddp(xs), ys)
        loss.backward()  # DDP averages the gradients over the ranks
        for p, q in zip(model.parameters(), replica.parameters()):
            q.grad = p.grad.clone()  # the very same gradients for both optimizers
        full.step()
        zero1.step()
        diffs.append(
            max(
                (p - q).abs().max().item() for p, q in zip(model.parameters(), replica.parameters())
            )
        )
        losses.append(loss.item())
    numel = sum(p.numel() for p in model.parameters())
    write_result(
        args.out,
        ctx,
        {
            "world_size": ctx.world_size,
            "parameters": numel,
            "shard": (zero1.start, zero1.stop),
            "padding": zero1.padded - numel,
            "max param diff per step": diffs,
            "losses": losses,
            "full Adam bytes": state_bytes(full),
            "ZeRO-1 bytes": state_bytes(zero1.opt),
            "all-reduced bytes per step": numel * 4,
            "all-gathered bytes per step": zero1.gathered,
        },
    )
    log(
        ctx,
        f"Adam moments per rank: {state_bytes(full)['moments']:,} B unsharded, "
        f"{state_bytes(zero1.opt)['moments']:,} B with ZeRO-1; largest difference {max(diffs):.1e}",
    )


def main(argv: list[str] | None = None) -> None:
    run_alone(build_parser(), run, argv)


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
