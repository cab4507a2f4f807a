"""DDP training done right, then gradient accumulation with no_sync (chapter 4).

Part 1, training: a ``DistributedSampler`` gives each rank its own share of the data, and
``set_epoch`` reshuffles it every epoch; only rank 0 logs and saves (the unwrapped
module's ``state_dict``); afterwards every rank's parameters are gathered and compared.

Part 2, accumulation: ``--accum`` micro-batches per rank, backward inside ``no_sync()``
for all but the last, so DDP all-reduces once; a communication hook counts the all-reduce
calls, with and without ``no_sync``. The gradients must equal one big batch's.

    torchrun --standalone --nproc-per-node=2 ddp_train.py --out /tmp/ddp
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from helpers.data import make_classification_data
from helpers.i18n import tr
from helpers.models import make_mlp
from helpers.scripts.common import (
    Context,
    exit_now,
    flat_params,
    grads,
    log,
    parser,
    run_alone,
    write_result,
)


class IndexedDataset(Dataset):
    """(x[i], y[i], i): the index tells which samples each rank saw (chapter 4)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.x[i], self.y[i], i


def wrap(model: nn.Module, ctx: Context) -> DDP:
    """DDP around a model already on this rank's device (chapter 4)."""
    return DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)


def train(ctx: Context, args) -> dict:  # noqa: ANN001 - argparse namespace
    """Train with DistributedSampler + set_epoch; rank 0 logs and saves (chapter 4)."""
    x, y = make_classification_data(args.samples, seed=args.seed)
    data = IndexedDataset(x, y)
    sampler = DistributedSampler(
        data, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=True, seed=args.seed
    )
    loader = DataLoader(data, batch_size=args.per_rank_batch, sampler=sampler)
    model = wrap(make_mlp(seed=args.seed).to(ctx.device), ctx)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    loss_fn = nn.BCEWithLogitsLoss()
    seen, epoch_losses = [], []
    for epoch in range(args.epochs):
        if not args.forget_set_epoch:
            sampler.set_epoch(epoch)  # without it, every epoch repeats epoch 0's order
        totals = torch.zeros(2, device=ctx.device)  # sum of losses, number of samples
        order = []
        for xb, yb, idx in loader:
            xb, yb = xb.to(ctx.device), yb.to(ctx.device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()  # DDP all-reduces (averages) the gradients during backward
            opt.step()
            totals += torch.stack([loss.detach() * len(xb), totals.new_tensor(len(xb))])
            order.append(idx)
        dist.all_reduce(totals)  # the whole job's loss, for one log line
        epoch_losses.append((totals[0] / totals[1]).item())
        log(ctx, epoch_line(epoch, epoch_losses[-1], int(totals[1])))
        seen.append(torch.cat(order))
    checkpoint = Path(args.out) / "checkpoint.pt"
    if ctx.is_main:  # one writer; .module is the plain model, so no "module." key prefixes
        torch.save(model.module.state_dict(), checkpoint)
        log(ctx, tr("saved {name}").format(name=checkpoint.name))
    dist.barrier()  # no rank goes on (or reads it) before it is written
    mine = flat_params(model).to(ctx.device)
    everyone = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, mine)
    identical = all(torch.equal(t, everyone[0]) for t in everyone)
    log(ctx, identical_line(ctx.world_size, identical))
    return {
        "indices": seen,
        "epoch_losses": epoch_losses,
        "params": mine.cpu(),
        "identical": identical,
        "checkpoint": str(checkpoint),
    }


def counting_allreduce(calls, bucket):  # noqa: ANN001, ANN201 - DDP checks these annotations
    """DDP's own all-reduce hook, counting how often it runs (chapter 4)."""
    calls[0] += 1
    return default_hooks.allreduce_hook(None, bucket)


def accumulate(ctx: Context, args) -> dict:  # noqa: ANN001 - argparse namespace
    """--accum micro-batches per rank, with and without no_sync; gradients and all-reduce counts (chapter 4)."""
    k, b, w = args.accum, args.per_rank_batch, ctx.world_size
    x, y = make_classification_data(k * b * w, seed=args.seed + 1)  # one big global batch
    loss_fn = nn.BCEWithLogitsLoss()
    out: dict = {}
    for use_no_sync in (True, False):
        model = wrap(make_mlp(seed=args.seed).to(ctx.device), ctx)
        calls = [0]
        model.register_comm_hook(state=calls, hook=counting_allreduce)
        for i in range(k):
            rows = slice((i * w + ctx.rank) * b, (i * w + ctx.rank + 1) * b)
            last = i == k - 1
            skip = model.no_sync() if use_no_sync and not last else contextlib.nullcontext()
            with skip:  # inside no_sync, backward only accumulates into .grad locally
                loss = loss_fn(model(x[rows].to(ctx.device)), y[rows].to(ctx.device))
                (loss / k).backward()  # / k: the mean over micro-batches
        key = "no_sync" if use_no_sync else "every_step"
        out[key] = {"grads": grads(model.module), "allreduce_calls": calls[0]}
    log(ctx, accumulation_line(k, out))
    return out


def epoch_line(epoch: int, loss: float, samples: int) -> str:
    """The log line of one epoch: its mean loss over the whole job (chapter 4)."""
    return tr("epoch {epoch}: mean loss {loss:.4f} over {samples} samples").format(
        epoch=epoch, loss=loss, samples=samples
    )


def identical_line(world: int, identical: bool) -> str:
    """The log line saying whether every rank ended with the same parameters (chapter 4)."""
    text = (
        tr("parameters identical on all {world} ranks: True")
        if identical
        else tr("parameters identical on all {world} ranks: False")
    )
    return text.format(world=world)


def accumulation_line(k: int, out: dict) -> str:
    """The log line comparing all-reduce calls with and without no_sync (chapter 4)."""
    return tr("{k} micro-batches: all-reduce calls {no_sync} with no_sync, {every} without").format(
        k=k, no_sync=out["no_sync"]["allreduce_calls"], every=out["every_step"]["allreduce_calls"]
    )


def build_parser() -> argparse.ArgumentParser:
    """This script's options (chapter 4)."""
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--per-rank-batch", type=int, default=32)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--forget-set-epoch", action="store_true", help="the classic bug")
    return p


def run(ctx: Context, args: argparse.Namespace) -> None:
    """Train, then accumulate with and without no_sync; results to args.out (chapter 4)."""
    args.out.mkdir(parents=True, exist_ok=True)
    result = train(ctx, args)
    result["accumulation"] = accumulate(ctx, args)
    write_result(args.out, ctx, result)


def main(argv: list[str] | None = None) -> None:
    run_alone(build_parser(), run, argv)


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
