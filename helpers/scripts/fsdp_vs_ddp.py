"""FSDP2 (fully_shard) against DDP on the same model and data (chapter 4).

DDP keeps a full copy of the parameters, gradients and optimizer state on every rank.
FSDP2 cuts each parameter along its first dimension and keeps one piece per rank; it
all-gathers a layer's full weights just before that layer runs and reduce-scatters the
gradients after backward. Both runs start from the same weights and see the same batches;
each rank records its parameter shapes (full and local), the bytes it holds, and the losses.

Then the erratum "8-bit Adam compresses gradient communication": short DDP runs with Adam,
SGD and (where bitsandbytes or torchao is installed and runs here) an 8-bit Adam, and Adam
with DDP's fp16 and bf16 compression hooks. A communication hook adds up the bytes DDP hands
to all-reduce in each step; each run also reports the bytes of its optimizer state.

    torchrun --standalone --nproc-per-node=2 fsdp_vs_ddp.py --out /tmp/fsdp
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

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
    model = make_mlp((args.width,) * args.depth + (1,), seed=0).to(ctx.device)
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


#: DDP's hooks by name, with the dtype each hands to all-reduce (None: the gradients' own).
HOOKS = {
    "none": (default_hooks.allreduce_hook, None),
    "fp16": (default_hooks.fp16_compress_hook, torch.float16),
    "bf16": (default_hooks.bf16_compress_hook, torch.bfloat16),
}
#: bitsandbytes' 8-bit layout: uint8 codes, one fp32 absmax per block, fp32 below min size.
BLOCK, MIN_8BIT_SIZE, QMAP_VALUES = 256, 4096, 256


def counting_hook(state, bucket):  # noqa: ANN001, ANN201 - DDP checks these annotations
    """Run state["hook"] on a bucket and add the bytes it hands to all-reduce (chapter 4)."""
    hook, wire = HOOKS[state["hook"]]
    buffer = bucket.buffer()
    state["bytes"] += buffer.numel() * (wire or buffer.dtype).itemsize
    return hook(None, bucket)


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor holds on this rank, adding up the inner tensors of a subclass (chapter 4)."""
    if type(t) is not torch.Tensor and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()  # torchao's 8-bit state: codes, scales, code table
        return sum(tensor_bytes(getattr(t, n)) for n in names)
    return t.numel() * t.element_size()


def state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in an optimizer's state, counted from the tensors (chapter 4)."""
    return sum(
        tensor_bytes(v) for s in opt.state.values() for v in s.values() if torch.is_tensor(v)
    )


def computed_8bit_bytes(params: list[torch.Tensor]) -> int:
    """8-bit Adam's state bytes computed from bitsandbytes' layout, for when none runs here (chapter 4)."""
    total = 0
    for p in params:
        n = p.numel()
        if n < MIN_8BIT_SIZE:
            total += 2 * 4 * n  # two fp32 states
        else:  # two states: codes, absmax per block, code table
            total += 2 * (n + 4 * -(-n // BLOCK) + 4 * QMAP_VALUES)
    return total


def eight_bit_adam(params, lr: float) -> tuple[torch.optim.Optimizer | None, str]:  # noqa: ANN001
    """bitsandbytes' Adam8bit, else torchao's AdamW8bit, with its name; else (None, why) (chapter 4)."""
    why = []
    try:
        import bitsandbytes as bnb

        return bnb.optim.Adam8bit(params, lr=lr), f"bitsandbytes {bnb.__version__}"
    except Exception as exc:  # not installed, or no backend for this device
        why.append(f"bitsandbytes: {type(exc).__name__}")
    try:
        import torchao
        from torchao.optim import AdamW8bit

        return AdamW8bit(params, lr=lr, weight_decay=0.0), f"torchao {torchao.__version__}"
    except Exception as exc:
        why.append(f"torchao: {type(exc).__name__}")
    return None, "; ".join(why)


def make_optimizer(name: str, params, lr: float) -> tuple[torch.optim.Optimizer | None, str]:  # noqa: ANN001
    """'Adam', 'SGD' or '8-bit Adam', with the library that provides it (chapter 4)."""
    if name == "8-bit Adam":
        return eight_bit_adam(params, lr)
    if name == "SGD":
        return torch.optim.SGD(params, lr=lr), f"torch {torch.__version__}"
    return torch.optim.Adam(params, lr=lr), f"torch {torch.__version__}"


def communication(ctx: Context, args, start: dict, optimizer: str, hook: str) -> dict:  # noqa: ANN001
    """A short DDP run: bytes handed to all-reduce per step, and the optimizer's state bytes (chapter 4)."""
    model = make_mlp((args.width,) * args.depth + (1,), seed=0).to(ctx.device)
    model.load_state_dict(start)
    net = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    counter = {"hook": hook, "bytes": 0}
    net.register_comm_hook(state=counter, hook=counting_hook)
    params = list(net.parameters())
    opt, library = make_optimizer(optimizer, params, args.lr)
    wire = HOOKS[hook][1] or params[0].dtype
    row = {"optimizer": optimizer, "library": library, "hook": hook, "wire dtype": str(wire)}
    row |= {"parameters": sum(p.numel() for p in params), "sent per step": [], "error": None}
    row["computed 8-bit state bytes"] = computed_8bit_bytes(params)
    if opt is None:
        row["error"] = tr("no 8-bit optimizer runs here ({why})").format(why=library)
        return row
    loss_fn = nn.BCEWithLogitsLoss()
    try:
        for step in range(args.comm_steps):
            x, y = batch(step, ctx, args.per_rank_batch, args.width)
            opt.zero_grad(set_to_none=True)
            counter["bytes"] = 0
            loss_fn(net(x), y).backward()  # DDP all-reduces here, before the optimizer runs
            row["sent per step"].append(counter["bytes"])
            # what crossed the wire in `wire` comes back exactly representable in it
            row["grads exact in wire dtype"] = all(
                torch.equal(p.grad, p.grad.to(wire).to(p.grad.dtype)) for p in params
            )
            opt.step()
    except Exception as exc:  # e.g. a backend without bf16 all-reduce: the same on every rank
        row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    row["state bytes"] = state_bytes(opt)
    return row


COMM_RUNS = [("Adam", "none"), ("SGD", "none"), ("8-bit Adam", "none"), ("Adam", "fp16")]
COMM_RUNS += [("Adam", "bf16")]


#: FSDP2 on CPU processes (gloo) needs torch 2.7: 2.5 raises "FSDP requires CUDA for streams",
#: 2.6 fails in its stream handling ('Stream' object has no attribute 'record_event').
FSDP_CPU_SINCE = (2, 7)


def fsdp_skip_reason(device: torch.device) -> str | None:
    """Why FSDP2 cannot run on `device` with this torch, or None when it can (chapter 4)."""
    version = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    if device.type == "cpu" and version < FSDP_CPU_SINCE:
        return tr(
            "FSDP2 on CPU processes needs torch {since} or newer; "
            "this is torch {version} (2.5 raises 'FSDP requires CUDA for streams')"
        ).format(since=".".join(map(str, FSDP_CPU_SINCE)), version=torch.__version__)
    return None


def build_parser() -> argparse.ArgumentParser:
    """This script's options (chapter 4)."""
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--per-rank-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--comm-steps", type=int, default=2, help="steps of each bytes-sent run")
    return p


def run(ctx: Context, args: argparse.Namespace) -> None:
    """DDP vs FSDP2, then the bytes-sent runs; results to args.out (chapter 4)."""
    start = make_mlp((args.width,) * args.depth + (1,), seed=args.seed).state_dict()
    skip = fsdp_skip_reason(ctx.device)
    result = {"ddp": train("ddp", ctx, args, start)}
    result["fsdp"] = {"skipped": skip} if skip else train("fsdp", ctx, args, start)
    result["communication"] = [communication(ctx, args, start, o, h) for o, h in COMM_RUNS]
    write_result(args.out, ctx, result)
    ddp_b = sum(result["ddp"]["held_bytes"].values()) / 2**20
    fsdp_b = None if skip else sum(result["fsdp"]["held_bytes"].values()) / 2**20
    log(ctx, held_line(ddp_b, fsdp_b, skip))


def held_line(ddp_mib: float, fsdp_mib: float | None, skip: str | None) -> str:
    """The log line of the bytes each rank held under DDP and FSDP2 (chapter 4)."""
    if skip:
        return tr("bytes held per rank: DDP {ddp:.2f} MiB; FSDP2 skipped: {why}").format(
            ddp=ddp_mib, why=skip
        )
    return tr("bytes held per rank: DDP {ddp:.2f} MiB, FSDP2 {fsdp:.2f} MiB").format(
        ddp=ddp_mib, fsdp=fsdp_mib
    )


def main(argv: list[str] | None = None) -> None:
    run_alone(build_parser(), run, argv)


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
