"""Chapter 5 benchmark: what cutting the peak costs in time, and what it saves in bytes.

    .venv/bin/python benchmarks/ch05_memory.py                  # the device pick_device() chooses
    .venv/bin/python benchmarks/ch05_memory.py --device cpu --width 1024 --batch 128

1. Activation checkpointing of an MLP (depth blocks of Linear + ReLU, then a head): bytes saved
   for backward (the activation meter) and the time of a forward + backward step, for no
   checkpointing, every block, and pairs of blocks. Hugging Face quotes about 20% extra time
   for full checkpointing on a GPU. Expect pairs of blocks to cost about one extra forward
   pass of the checkpointed blocks when the step is compute-bound (big matrices): a step is
   roughly three forward passes, so up to ~1.33x (the H100 run: 1.39x at 4 x 4096, batch
   2048). A small, launch-bound step pays for the extra ops and checkpoint()'s own
   bookkeeping instead, and can take 2x or more (chapter 5 measures both). Read the IQR
   column before the ratio: a ratio inside the spread is noise.
2. Mixed precision: bytes saved for backward in fp32 and under autocast, and the step time.
3. On CUDA: the time of a 64 MiB allocation from the cache, and right after empty_cache.

Version 1. When changing how this script measures, bump the version.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

from helpers.activations import checkpointed_forward, measure_activation_bytes
from helpers.devices import describe_device, native_bf16, pick_device
from helpers.dtypes import dtype_name
from helpers.models import make_mlp, wide_mlp_sizes
from helpers.tables import print_table
from helpers.timing import benchmark
from helpers.units import format_bytes

VERSION = 1


def step(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, every: int, amp) -> None:  # noqa: ANN001
    """One forward + backward, checkpointed in segments of `every` children (0: none)."""
    model.zero_grad(set_to_none=True)
    ctx = torch.autocast(x.device.type, dtype=amp) if amp is not None else torch.enable_grad()
    with ctx:
        out = checkpointed_forward(model, x, every) if every else model(x)
        loss = nn.functional.cross_entropy(out.float(), y)
    loss.backward()


def amp_dtype(device: torch.device) -> torch.dtype:
    """The autocast dtype the chapter uses on this device."""
    if device.type == "cuda":
        return torch.bfloat16 if native_bf16(device) else torch.float16
    return torch.float16 if device.type == "mps" else torch.bfloat16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--min-run-time", type=float, default=0.5)
    args = parser.parse_args()
    device = pick_device(args.device)
    gpu = device.type != "cpu"
    width = args.width or (4096 if gpu else 1024)
    batch = args.batch or (2048 if gpu else 128)
    print(f"ch05_memory benchmark v{VERSION}\n{describe_device(device)}\n")
    model = make_mlp(wide_mlp_sizes(width, args.depth, 10), blocks=True, device=device)
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    rows, base = [], None
    configs = [
        ("no checkpointing", 0, None),
        ("every block", 1, None),
        ("pairs of blocks", 2, None),
    ]
    configs.append((f"{dtype_name(amp_dtype(device))} autocast", 0, amp_dtype(device)))
    for name, every, amp in configs:
        saved = measure_activation_bytes(model, x, autocast_dtype=amp, checkpoint_every=every)
        r = benchmark(
            step, model, x, y, every, amp, device=device, label=name, min_run_time=args.min_run_time
        )
        base = base or r.median
        rows.append(
            {
                "variant": name,
                "saved for backward": format_bytes(saved),
                "step": f"{r.median * 1e3:.2f} ms",
                "IQR": f"{r.iqr * 1e3:.2f} ms",
                "vs plain": f"{r.median / base:.2f}x",
            }
        )
    print(f"MLP {args.depth} x {width}, batch {batch}, forward + backward:")
    print_table(rows)

    if device.type == "cuda":
        n = 64 * 2**20 // 4

        def from_cache() -> None:
            torch.empty(n, device=device)

        def after_empty_cache() -> None:
            torch.cuda.empty_cache()
            torch.empty(n, device=device)

        timings = [
            benchmark(f, device=device, label=f.__name__) for f in (from_cache, after_empty_cache)
        ]
        print("\n64 MiB allocation:")
        print_table(
            [
                {
                    "how": r.label,
                    "median": f"{r.median * 1e6:.1f} µs",
                    "IQR": f"{r.iqr * 1e6:.1f} µs",
                }
                for r in timings
            ]
        )


if __name__ == "__main__":
    main()
