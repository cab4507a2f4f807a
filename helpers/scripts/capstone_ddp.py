"""The capstone GPT with DDP: one rank alone, then every rank on its share of each batch (chapter 7).

It trains as the chapter does (helpers.capstone.regime_for: AdamW as GPT-2 is trained, warm-up
then cosine decay, gradient norm clipped). Rank 0 first trains the model alone on the whole
global batch (the reference; the other ranks wait), then every rank trains a fresh copy of the
same model under DDP on its slice of the same batches. DDP averages the gradients, so every
rank clips the same norm, and the losses and the final weights must equal the reference's: the
same math on more processes. Both runs are timed after `--warmup` steps.

    torchrun --standalone --nproc-per-node=2 capstone_ddp.py --out /tmp/capstone
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.capstone import batch_starts, make_optimizer, regime_for, set_lr
from helpers.gpt import GPTConfig, make_gpt, text_bytes
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


def train(ctx: Context, args, rows: slice, ddp: bool) -> dict:  # noqa: ANN001 - argparse namespace
    """Train `args.steps` steps on the `rows` of each global batch; losses, tokens/s, weights (chapter 7)."""
    cfg = GPTConfig(args.n_layer, args.n_head, args.d_model, args.seq_len, attention=args.attention)
    tokens = text_bytes().to(ctx.device)
    starts = batch_starts(len(tokens), cfg.seq_len, args.global_batch, args.steps, args.seed)
    starts = starts[:, rows].to(ctx.device)
    offsets = torch.arange(cfg.seq_len + 1, device=ctx.device)
    model = make_gpt(cfg, seed=args.seed, device=ctx.device)
    if ddp:
        model = DDP(model, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
    regime = regime_for(cfg)  # the chapter's: AdamW as GPT-2, warm-up and decay, clipping
    opt = make_optimizer(model, regime)
    losses = []
    for step in range(args.steps):
        if step == args.warmup:  # start the clock once every rank is warm
            torch.stack(losses).sum().item()
            if ddp:
                dist.barrier()
            start = time.perf_counter()
        windows = tokens[starts[step, :, None] + offsets]
        loss = model(windows[:, :-1], windows[:, 1:])
        set_lr(opt, regime, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # under DDP: gradients averaged over the ranks here
        torch.nn.utils.clip_grad_norm_(
            model.parameters(), regime.clip
        )  # the same norm on every rank
        opt.step()
        losses.append(loss.detach())
    curve = torch.stack(losses)  # one sync per run, not per step
    if ddp:
        dist.all_reduce(curve)
        curve /= ctx.world_size  # the mean over the ranks' equal slices: the global batch's loss
    seconds = time.perf_counter() - start
    timed = args.steps - args.warmup
    tokens_per_s = args.global_batch * cfg.seq_len * timed / seconds
    return {"losses": curve.tolist(), "tokens_per_s": tokens_per_s, "params": flat_params(model)}


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
    args = p.parse_args()
    ctx = setup(args.pg_timeout)
    if args.global_batch % ctx.world_size:
        raise SystemExit(
            f"--global-batch {args.global_batch} does not split evenly over {ctx.world_size} ranks."
        )
    if not 0 < args.warmup < args.steps:
        raise SystemExit(f"--warmup must be between 1 and --steps - 1, got {args.warmup}.")
    result = {}
    if ctx.is_main:
        result["alone"] = train(ctx, args, slice(None), ddp=False)
        log(ctx, f"one rank alone: {result['alone']['tokens_per_s']:,.0f} tokens/s")
    dist.barrier()  # the other ranks wait while rank 0 measures the reference
    share = args.global_batch // ctx.world_size
    rows = slice(ctx.rank * share, (ctx.rank + 1) * share)
    result["ddp"] = train(ctx, args, rows, ddp=True)
    log(ctx, f"DDP on {ctx.world_size} ranks: {result['ddp']['tokens_per_s']:,.0f} tokens/s")
    write_result(args.out, ctx, result)
    teardown()


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
