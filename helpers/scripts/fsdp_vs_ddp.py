"""FSDP2 (fully_shard) against DDP on the same model and data (chapter 4).

DDP keeps a full copy of the parameters, gradients and optimizer state on every rank.
FSDP2 cuts each parameter along its first dimension and keeps one piece per rank; it
all-gathers a layer's full weights just before that layer runs and reduce-scatters the
gradients after backward. Both runs start from the same weights and see the same batches;
each rank records its parameter shapes (full and local), the bytes it holds, and the losses.

    torchrun --standalone --nproc-per-node=2 fsdp_vs_ddp.py --out /tmp/fsdp
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.scripts.common import Context, log, make_mlp, parser, setup, teardown, write_result

try:  # torch >= 2.6
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch 2.5 has FSDP2 under its early name
    from torch.distributed._composable.fsdp import fully_shard


def local(t: torch.Tensor) -> torch.Tensor:
    """The part of a tensor this rank holds: a DTensor's local shard, else the tensor (chapter 4)."""
    return t.to_local() if hasattr(t, "to_local") else t


def nbytes(tensors) -> int:  # noqa: ANN001 - any iterable of tensors
    """Bytes this rank holds for these tensors (chapter 4)."""
    return sum(local(t).numel() * local(t).element_size() for t in tensors)


def held_bytes(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    """Parameter, gradient and optimizer-state bytes held by this rank (chapter 4)."""
    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return {
        "parameters": nbytes(params),
        "gradients": nbytes(p.grad for p in params if p.grad is not None),
        "optimizer state": nbytes(state),
    }


def batch(step: int, ctx: Context, per_rank: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of step `step`'s global batch, the same for both runs (chapter 4)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(per_rank * ctx.world_size, width, generator=g)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    rows = slice(ctx.rank * per_rank, (ctx.rank + 1) * per_rank)
    return x[rows].to(ctx.device), y[rows].to(ctx.device)


def train(kind: str, ctx: Context, args, start: dict) -> dict:  # noqa: ANN001 - argparse namespace
    """Train a copy of the model with DDP or FSDP2 and report what each rank holds (chapter 4)."""
    model = make_mlp((args.width,) * args.depth + (1,)).to(ctx.device)
    model.load_state_dict(start)
    if kind == "ddp":
        net: nn.Module = DDP(
            model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None
        )
    else:
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)  # each layer gathers its weights only when it runs
        net = fully_shard(model, mesh=mesh)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    losses = []
    for step in range(args.steps):
        x, y = batch(step, ctx, args.per_rank_batch, args.width)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / ctx.world_size)
    named = list(net.named_parameters())
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for _, p in named]
    return {
        "losses": losses,
        "held_bytes": held_bytes(net, opt),
        "shapes": [
            (n.removeprefix("module."), tuple(p.shape), tuple(local(p).shape)) for n, p in named
        ],
        # the full weights, the same on every rank: rank 0 reports them
        "final": torch.cat([t.detach().reshape(-1).cpu() for t in full]) if ctx.is_main else None,
        "cuda_peak_bytes": torch.cuda.max_memory_allocated(ctx.device)
        if ctx.device.type == "cuda"
        else None,
    }


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--per-rank-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-3)
    args = p.parse_args()
    ctx = setup(args.pg_timeout)
    start = make_mlp((args.width,) * args.depth + (1,), seed=args.seed).state_dict()
    result = {kind: train(kind, ctx, args, start) for kind in ("ddp", "fsdp")}
    write_result(args.out, ctx, result)
    ddp_b = sum(result["ddp"]["held_bytes"].values())
    fsdp_b = sum(result["fsdp"]["held_bytes"].values())
    log(ctx, f"bytes held per rank: DDP {ddp_b / 2**20:.2f} MiB, FSDP2 {fsdp_b / 2**20:.2f} MiB")
    teardown()


if __name__ == "__main__":
    main()
