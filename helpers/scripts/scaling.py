"""Training throughput with DDP at one or more numbers of ranks, or nn.DataParallel in one process (chapter 4).

Weak scaling: every rank trains on its own batch of ``--per-rank-batch`` samples, so the
global batch grows with the number of ranks. Step time is measured in ``--blocks`` blocks of
``--steps`` steps; every block starts after a barrier and ends after a device sync, and the
slowest rank's time counts (all_reduce with MAX), because a step is only done when every
rank is done. (``helpers.timing.benchmark`` cannot be used here: it picks its own number of
repeats per process, and ranks that run different numbers of collectives deadlock.)

``--sizes 1,2,4`` measures several numbers of ranks in one job (one start-up, not three):
for each size ``k`` the first ``k`` ranks train in their own process group
(``dist.new_group``) while the others wait at a barrier.

    torchrun --standalone --nproc-per-node=4 scaling.py --out /tmp/scaling --sizes 1,2,4
    python -m torch.distributed.run --nproc-per-node=1 ... scaling.py --mode dataparallel
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.i18n import tr
from helpers.models import make_mlp
from helpers.scripts.common import (
    Context,
    exit_now,
    log,
    parser,
    setup,
    teardown,
    write_result,
)


def sync(device: torch.device) -> None:
    """Wait for queued GPU work; nothing to wait for on CPU (chapter 4)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(ctx: Context, mode: str, width: int, depth: int, group: Any) -> tuple[nn.Module, int]:
    """The model to train and how many GPUs/ranks share one step's batch (chapter 4)."""
    model = make_mlp((width,) * depth + (1,), seed=0).to(ctx.device)
    if mode == "ddp":
        ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
        return DDP(model, device_ids=ids, process_group=group), 1
    if ctx.world_size != 1 or ctx.device.type != "cuda" or torch.cuda.device_count() < 2:
        raise SystemExit(tr("--mode dataparallel needs one process (nproc 1) and at least 2 GPUs."))
    return nn.DataParallel(model), torch.cuda.device_count()  # scatters the batch over GPUs


def measure(ctx: Context, args: Any, ranks: int, group: Any) -> dict[str, Any]:
    """Warm up, then time blocks of steps on the first `ranks` ranks (this one among them) (chapter 4)."""
    net, gpus_per_rank = build(ctx, args.mode, args.width, args.depth, group)
    batch = args.per_rank_batch * gpus_per_rank
    g = torch.Generator().manual_seed(args.seed + ctx.rank)
    x = torch.randn(batch, args.width, generator=g).to(ctx.device)
    y = (x.sum(dim=1, keepdim=True) > 0).float()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    loss_fn = nn.BCEWithLogitsLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(net(x), y).backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    per_step: list[float] = []
    for _ in range(args.blocks):
        dist.barrier(group=group)
        sync(ctx.device)
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync(ctx.device)
        elapsed = torch.tensor([time.perf_counter() - start], device=ctx.device)
        # the slowest rank sets the pace
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
        per_step.append(elapsed.item() / args.steps)
    q1, _, q3 = statistics.quantiles(per_step, n=4) if len(per_step) > 1 else (0, 0, 0)
    median = statistics.median(per_step)
    global_batch = batch * ranks
    return {
        "mode": args.mode,
        "world_size": ranks,
        "threads": torch.get_num_threads(),
        "global_batch": global_batch,
        "step_times_s": per_step,
        "step_median_s": median,
        "step_iqr_s": q3 - q1,
        "samples_per_s": global_batch / median,
    }


def parse_sizes(text: str | None, world_size: int) -> list[int]:
    """'1,2,4' as [1, 2, 4], each between 1 and the world size; default [world size] (chapter 4)."""
    if not text:
        return [world_size]
    sizes = [int(s) for s in text.split(",")]
    if not sizes or any(not 1 <= k <= world_size for k in sizes):
        raise SystemExit(
            tr("--sizes {text}: each size must be between 1 and {world_size} ranks.").format(
                text=text, world_size=world_size
            )
        )
    return sizes


def run_line(mode: str, ranks: int, r: dict[str, Any]) -> str:
    """The log line of one measured rank count (chapter 4)."""
    return tr(
        "{mode}: {ranks} rank(s), global batch {batch}, {ms:.2f} ms/step, {rate:,.0f} samples/s"
    ).format(
        mode=mode,
        ranks=ranks,
        batch=r["global_batch"],
        ms=r["step_median_s"] * 1e3,
        rate=r["samples_per_s"],
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["ddp", "dataparallel"], default="ddp")
    p.add_argument("--sizes", default=None, help="rank counts to measure, e.g. 1,2,4")
    p.add_argument("--per-rank-batch", type=int, default=256)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--blocks", type=int, default=5)
    args = p.parse_args()
    ctx = setup(args.pg_timeout)
    runs = []
    for k in parse_sizes(args.sizes, ctx.world_size):
        # every rank creates every group, members or not; the whole world needs no new group
        group = dist.new_group(list(range(k))) if k < ctx.world_size else None
        if ctx.rank < k:
            runs.append(measure(ctx, args, k, group))
            r = runs[-1]
            log(ctx, run_line(args.mode, k, r))
        dist.barrier()  # the ranks left out wait here until the measured ones are done
    if ctx.is_main:
        write_result(args.out, ctx, {"runs": runs})
    teardown()


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
