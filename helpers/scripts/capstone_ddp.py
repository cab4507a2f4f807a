"""The capstone GPT with DDP: one rank alone, then every rank on its share of each batch (chapter 7).

It trains as the chapter does (helpers.capstone.regime_for: AdamW as GPT-2 is trained, warm-up
then cosine decay, gradient norm clipped). Rank 0 first trains the model alone on the whole
global batch (the reference; the other ranks wait), then twice more: a rerun, and a run with
every initial weight one ulp up (the reference's own noise floor, as chapter 7 measures it).
Then every rank trains a fresh copy of the same model under DDP on its slice of the same
batches. DDP averages the gradients, so every rank clips the same norm, and the losses and the
final weights equal the reference's up to the order of the sums: each rank's mean over its half
of the batch, then the mean of the ranks, instead of one mean over the whole batch, a
difference of fp32 rounding that the noise floor bounds. The reference and the DDP run are
timed after `--warmup` steps, in `--rounds` rounds; each round ends by reading the losses (a
sync: the device has run everything queued) before the clock is read.

    torchrun --standalone --nproc-per-node=2 capstone_ddp.py --out /tmp/capstone
"""

from __future__ import annotations

import math
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.capstone import batch_starts, make_optimizer, regime_for, set_lr
from helpers.gpt import GPTConfig, make_gpt, text_bytes
from helpers.i18n import tr
from helpers.scripts.common import (
    Context,
    exit_now,
    flat_params,
    log,
    parser,
    setup,
    teardown,
    write_result,
)


def round_sizes(timed: int, rounds: int) -> list[int]:
    """`timed` steps split into `rounds` rounds as evenly as they go (chapter 7)."""
    return [timed // rounds + (1 if r < timed % rounds else 0) for r in range(rounds)]


def rate_spread(rates: list[float]) -> tuple[float, float]:
    """(median, interquartile range) of per-round tokens/s; an IQR of 0 for one round (chapter 7)."""
    if len(rates) < 2:
        return rates[0], 0.0
    q1, _, q3 = statistics.quantiles(rates, n=4, method="inclusive")
    return statistics.median(rates), q3 - q1


def train(ctx: Context, args, rows: slice, ddp: bool, nudge: bool = False) -> dict:  # noqa: ANN001 - argparse namespace
    """Train `args.steps` steps on the `rows` of each global batch; losses, tokens/s per round, weights (chapter 7)."""
    cfg = GPTConfig(args.n_layer, args.n_head, args.d_model, args.seq_len, attention=args.attention)
    tokens = text_bytes().to(ctx.device)
    starts = batch_starts(len(tokens), cfg.seq_len, args.global_batch, args.steps, args.seed)
    starts = starts[:, rows].to(ctx.device)
    offsets = torch.arange(cfg.seq_len + 1, device=ctx.device)
    model = make_gpt(cfg, seed=args.seed, device=ctx.device)
    if nudge:  # every initial weight one ulp up: fp32 rounding, carried through training
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.nextafter(p, torch.full_like(p, math.inf)))
    if ddp:
        model = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    regime = regime_for(cfg)  # the chapter's: AdamW as GPT-2, warm-up and decay, clipping
    opt = make_optimizer(model, regime)
    losses: list[torch.Tensor] = []

    def step(i: int) -> None:
        windows = tokens[starts[i, :, None] + offsets]
        loss = model(windows[:, :-1], windows[:, 1:])
        set_lr(opt, regime, i)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # under DDP: gradients averaged over the ranks here
        torch.nn.utils.clip_grad_norm_(model.parameters(), regime.clip)  # the same on every rank
        opt.step()
        losses.append(loss.detach())

    for i in range(args.warmup):
        step(i)
    torch.stack(losses).tolist()  # a sync: the warm-up has run
    if ddp:
        dist.barrier()  # start the clock once every rank is warm
    i, seconds = args.warmup, []
    sizes = round_sizes(args.steps - args.warmup, args.rounds)
    for size in sizes:
        start = time.perf_counter()
        for _ in range(size):
            step(i)
            i += 1
        torch.stack(losses).tolist()  # read the losses before the clock: the round has run
        seconds.append(time.perf_counter() - start)
    curve = torch.stack(losses)
    if ddp:
        dist.all_reduce(curve)
        curve /= ctx.world_size  # the mean over the ranks' equal slices: the global batch's loss
    rates = [args.global_batch * cfg.seq_len * n / s for n, s in zip(sizes, seconds)]
    median, iqr = rate_spread(rates)
    return {
        "losses": curve.tolist(),
        "round_tokens_per_s": rates,
        "tokens_per_s": median,
        "tokens_per_s_iqr": iqr,
        "params": flat_params(model),
    }


def alone_line(rate: float) -> str:
    """The log line of the one-rank reference (chapter 7)."""
    return tr("one rank alone: {rate:,.0f} tokens/s (median)").format(rate=rate)


def ddp_line(world: int, rate: float) -> str:
    """The log line of the DDP run (chapter 7)."""
    return tr("DDP on {world} ranks: {rate:,.0f} tokens/s (median)").format(world=world, rate=rate)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--attention", default="sdpa", choices=("manual", "sdpa"))
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds after the warm-up")
    # The other ranks wait in a barrier, watched by this timeout, while rank 0 trains the
    # reference three times (3 x --steps): about a minute for GPT-2-small at batch 32 in fp32 on
    # an A100 without TF32, so 60 s is too short; a dead rank still ends the launch at its own
    # timeout (the notebook's: 300 s).
    p.set_defaults(pg_timeout=240.0)
    args = p.parse_args()
    ctx = setup(args.pg_timeout)
    if args.global_batch % ctx.world_size:
        raise SystemExit(
            tr("--global-batch {batch} does not split evenly over {world} ranks.").format(
                batch=args.global_batch, world=ctx.world_size
            )
        )
    if not 0 < args.warmup < args.steps:
        raise SystemExit(
            tr("--warmup must be between 1 and --steps - 1, got {warmup}.").format(
                warmup=args.warmup
            )
        )
    if not 0 < args.rounds <= args.steps - args.warmup:
        raise SystemExit(
            tr("--rounds must be between 1 and --steps - --warmup = {most}, got {rounds}.").format(
                most=args.steps - args.warmup, rounds=args.rounds
            )
        )
    result = {}
    if ctx.is_main:
        result["alone"] = train(ctx, args, slice(None), ddp=False)
        log(ctx, alone_line(result["alone"]["tokens_per_s"]))
        for name, nudge in (("alone_rerun", False), ("alone_nudged", True)):  # the noise floor
            run = train(ctx, args, slice(None), ddp=False, nudge=nudge)
            gap = (run.pop("params") - result["alone"]["params"]).abs().max().item()
            result[name] = {**run, "param_gap": gap}  # the largest weight gap, not the weights
    dist.barrier()  # the other ranks wait while rank 0 measures the reference
    share = args.global_batch // ctx.world_size
    rows = slice(ctx.rank * share, (ctx.rank + 1) * share)
    result["ddp"] = train(ctx, args, rows, ddp=True)
    log(ctx, ddp_line(ctx.world_size, result["ddp"]["tokens_per_s"]))
    write_result(args.out, ctx, result)
    teardown()


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
