"""Training that survives a lost rank: checkpoint, crash, restart, resume (chapter 4).

Rank 0 saves the model, the optimizer state and the step every ``--ckpt-every`` steps
(written to a temporary file, then renamed, so a crash never leaves half a checkpoint).
At start-up every rank resumes from the checkpoint if there is one.

``--die-rank R --die-at-step S`` makes rank R crash (``os._exit(3)``) at step S, on the
first attempt only unless ``--die-every-attempt``. With ``torchrun --max-restarts=0`` the
job fails; with ``--max-restarts=1`` torchrun restarts every rank, they resume from the
last checkpoint and finish. ``--hang`` makes the rank stop answering instead of exiting:
the other ranks then wait in their all-reduce until the process-group timeout, say so and
fail, torchrun stops the hung rank, and a restart goes on as after a crash.

    torchrun --standalone --nproc-per-node=2 --max-restarts=1 elastic_train.py \
        --out /tmp/elastic --die-rank 1 --die-at-step 6
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.i18n import tr
from helpers.models import make_mlp
from helpers.scripts.common import (
    Context,
    exit_now,
    flat_params,
    log,
    parser,
    say,
    setup,
    teardown,
    write_result,
)

SIZES = (20, 64, 32, 1)


def global_batch(step: int, world_size: int, per_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step `step`'s whole batch, the same on every rank and in every attempt (chapter 4)."""
    g = torch.Generator().manual_seed(10_000 + step)
    x = torch.randn(world_size * per_rank, SIZES[0], generator=g)
    return x, (x.sum(dim=1, keepdim=True) > 0).float()


def make_optimizer(params, lr: float) -> torch.optim.Optimizer:  # noqa: ANN001 - parameters
    """SGD with momentum: its state (the momentum buffers) must be checkpointed too (chapter 4)."""
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def save_checkpoint(path: Path, model: DDP, opt: torch.optim.Optimizer, step: int) -> None:
    """Write model, optimizer and step atomically: temp file, then rename (chapter 4)."""
    tmp = path.with_suffix(".tmp")
    torch.save(
        {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "step": step}, tmp
    )
    os.replace(tmp, path)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--per-rank-batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--ckpt-every", type=int, default=4)
    p.add_argument("--die-rank", type=int, default=-1)
    p.add_argument("--die-at-step", type=int, default=-1)
    p.add_argument("--die-every-attempt", action="store_true")
    p.add_argument("--hang", action="store_true", help="stop answering instead of exiting")
    args = p.parse_args()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    ctx: Context = setup(args.pg_timeout)
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt = args.out / "checkpoint.pt"
    model = DDP(
        make_mlp(SIZES, seed=args.seed).to(ctx.device),
        device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None,
    )
    opt = make_optimizer(model.parameters(), args.lr)
    first = 0
    if ckpt.exists():  # every rank reads the same file; weights_only: tensors, not code
        state = torch.load(ckpt, map_location=ctx.device, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        first = state["step"]
    log(
        ctx,
        tr("attempt {attempt}: starting at step {first} of {steps}").format(
            attempt=attempt, first=first, steps=args.steps
        ),
    )
    loss_fn = nn.BCEWithLogitsLoss()
    b = args.per_rank_batch
    for step in range(first, args.steps):
        dies = ctx.rank == args.die_rank and step == args.die_at_step
        if dies and (attempt == 0 or args.die_every_attempt):
            if args.hang:
                # the chapter finds this line by its "[rank R] " prefix: its words are translated
                say(ctx, tr("step {step}: stops answering (simulated hang)").format(step=step))
                time.sleep(3600)
            say(ctx, tr("step {step}: crashes now (simulated with os._exit(3))").format(step=step))
            os._exit(3)
        x, y = global_batch(step, ctx.world_size, b)
        rows = slice(ctx.rank * b, (ctx.rank + 1) * b)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[rows].to(ctx.device)), y[rows].to(ctx.device))
        try:
            loss.backward()  # DDP all-reduces here: this is where a lost peer is felt
        except RuntimeError as exc:  # gloo raises; NCCL's watchdog aborts the process instead
            why = str(exc).splitlines()[0][:160]
            say(ctx, tr("step {step}: all-reduce failed: {error}").format(step=step, error=why))
            raise
        opt.step()
        if (step + 1) % args.ckpt_every == 0:
            if ctx.is_main:
                save_checkpoint(ckpt, model, opt, step + 1)
                log(ctx, tr("step {step}: checkpoint saved").format(step=step + 1))
            dist.barrier()
    if ctx.is_main:
        write_result(
            args.out,
            ctx,
            {"attempt": attempt, "resumed_from": first, "params": flat_params(model)},
        )
    log(
        ctx,
        tr("finished {steps} steps (attempt {attempt}, resumed from step {first})").format(
            steps=args.steps, attempt=attempt, first=first
        ),
    )
    teardown()


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
