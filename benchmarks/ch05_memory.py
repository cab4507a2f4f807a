"""Chapter 5 benchmark: what cutting the peak costs in time, and what it saves in bytes.

    .venv/bin/python benchmarks/ch05_memory.py                  # the device pick_device() chooses
    .venv/bin/python benchmarks/ch05_memory.py --device cpu --width 1024 --batch 128

1. Activation checkpointing of an MLP (depth blocks of Linear + ReLU, then a head): for no
   checkpointing, every block, pairs of blocks and checkpoint_sequential(2) (which leaves its
   last segment alone), the bytes saved for backward (the activation meter), the FLOPs of a
   forward + backward step with the recomputation (FlopCounterMode), and its time. A step is
   roughly three forward passes, so recomputing every block adds about a third of the FLOPs
   and checkpoint_sequential(2) about a sixth. A compute-bound step (big matrices) pays about
   its FLOPs in time: Hugging Face's "about 20% slower" fits partial or selective
   checkpointing, not full recomputation. A small, launch-bound step pays for the extra ops
   and checkpoint()'s own bookkeeping instead, and can take 2x or more. Checkpointing every
   block of this MLP saves nothing (each block keeps only its input, as without
   checkpointing) and still pays.
2. Mixed precision: bytes saved for backward in fp32 and under autocast, and the step time.
3. On CUDA: the time of a 64 MiB allocation from the cache, and right after empty_cache.

Every table is followed by the machine's state while it was timed (other compute processes on
the GPU, CPU time other processes used, torch threads) and by verdicts built by compare_rows
from the two rows they name: "inconclusive" on a shared GPU or a loaded CPU.

Version 3 (v2's checkpoint_sequential(2) row checkpointed the first half of the blocks in pairs,
torch's function only at depth 4; v1 timed no checkpoint_sequential row, counted no FLOPs and
printed no machine state or verdicts). When changing how this script measures, bump the version.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint_sequential

from helpers.activations import ActivationMeter, CheckpointCost, checkpointed_forward
from helpers.devices import describe_device, native_bf16, pick_device
from helpers.dtypes import dtype_name
from helpers.machine_state import merge_states
from helpers.mfu import count_flops
from helpers.models import make_mlp, wide_mlp_sizes
from helpers.tables import print_table
from helpers.timing import BenchResult, benchmark
from helpers.verdicts import compare_rows

VERSION = 3

#: Checkpointing variants: (every, segments): segments of `every` blocks, each checkpointed
#: (helpers.activations.checkpointed_forward; 0: none), or torch's own
#: checkpoint_sequential(blocks, segments), which leaves its last segment alone, at any depth.
CHECKPOINTING = {
    "no checkpointing": (0, 0),
    "each block": (1, 0),
    "pairs of blocks": (2, 0),
    "checkpoint_sequential(2)": (0, 2),
}


def forward(model: nn.Sequential, x: torch.Tensor, every: int, segments: int) -> torch.Tensor:
    """The blocks checkpointed in segments of `every`, or by torch's checkpoint_sequential, then the head."""
    blocks, head = model[:-1], model[-1]
    if segments:  # as the chapter calls it
        return head(checkpoint_sequential(blocks, segments, x, use_reentrant=False))
    if every == 0:
        return head(blocks(x))
    return head(checkpointed_forward(blocks, x, every))


def step(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, variant: str, amp) -> None:  # noqa: ANN001
    """One forward + backward under a checkpointing variant, optionally under autocast."""
    model.zero_grad(set_to_none=True)
    ctx = torch.autocast(x.device.type, dtype=amp) if amp is not None else torch.enable_grad()
    with ctx:
        loss = nn.functional.cross_entropy(forward(model, x, *CHECKPOINTING[variant]).float(), y)
    loss.backward()


def saved_bytes(model: nn.Sequential, x: torch.Tensor, variant: str, amp=None) -> int:  # noqa: ANN001
    """Bytes one forward under a checkpointing variant saves for backward (the activation meter)."""
    ctx = torch.autocast(x.device.type, dtype=amp) if amp is not None else torch.enable_grad()
    with ActivationMeter(model) as meter, ctx:
        out = forward(model, x, *CHECKPOINTING[variant])
    del out
    return meter.total_bytes


def amp_dtype(device: torch.device) -> torch.dtype:
    """The autocast dtype the chapter uses on this device."""
    if device.type == "cuda":
        return torch.bfloat16 if native_bf16(device) else torch.float16
    return torch.float16 if device.type == "mps" else torch.bfloat16


def checkpointing(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, run_time: float) -> None:
    """Bytes, FLOPs and time per checkpointing variant, the machine's state, and the verdicts."""
    timings, flops, saved = {}, {}, {}
    for name in CHECKPOINTING:
        args = (model, x, y, name, None)
        timings[name] = benchmark(step, *args, device=x.device, label=name, min_run_time=run_time)
        flops[name] = count_flops(step, *args)
        saved[name] = saved_bytes(model, x, name)
    title = f"MLP {len(model) - 1} x {x.shape[1]}, batch {x.shape[0]}, forward + backward:"
    cost = CheckpointCost(title, timings, flops, saved)
    print(cost)
    for name in list(CHECKPOINTING)[1:]:
        print(f"  {cost.line(name)}")


def precision(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, run_time: float) -> None:
    """fp32 against the chapter's autocast dtype: bytes saved for backward and step time."""
    low = amp_dtype(x.device)
    runs: dict[str, tuple[BenchResult, int]] = {}
    for name, amp in (("fp32", None), (f"{dtype_name(low)} autocast", low)):
        args = (model, x, y, "no checkpointing", amp)
        r = benchmark(step, *args, device=x.device, label=name, min_run_time=run_time)
        runs[name] = (r, saved_bytes(model, x, "no checkpointing", amp))
    rows = [
        {
            "precision": name,
            "saved MiB": nbytes / 2**20,
            "median ms": r.median * 1e3,
            "IQR ms": r.iqr * 1e3,
        }
        for name, (r, nbytes) in runs.items()
    ]
    states = [r.machine for r, _ in runs.values()]
    print("\nMixed precision, the same step without checkpointing:")
    print_table(rows)
    print(merge_states(states))
    a, b = rows[1]["precision"], rows[0]["precision"]
    print(f"  {compare_rows(rows, 'precision', a, b, 'median ms', iqr='IQR ms', machine=states)}")


def allocation(device: torch.device) -> None:
    """On CUDA: a 64 MiB allocation from the cache against one right after empty_cache."""
    n = 64 * 2**20 // 4

    def from_cache() -> None:
        torch.empty(n, device=device)

    def after_empty_cache() -> None:
        torch.cuda.empty_cache()
        torch.empty(n, device=device)

    timings = [
        benchmark(f, device=device, label=f.__name__) for f in (from_cache, after_empty_cache)
    ]
    rows = [{"how": r.label, "median µs": r.median * 1e6, "IQR µs": r.iqr * 1e6} for r in timings]
    states = [r.machine for r in timings]
    print("\n64 MiB allocation:")
    print_table(rows)
    print(merge_states(states))
    verdict = compare_rows(
        rows, "how", "from_cache", "after_empty_cache", "median µs", iqr="IQR µs", machine=states
    )
    print(f"  {verdict}")


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
    print(f"ch05_memory benchmark v{VERSION}, torch {torch.__version__}")
    print(f"{describe_device(device)}\n")
    model = make_mlp(wide_mlp_sizes(width, args.depth, 10), blocks=True, device=device)
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    checkpointing(model, x, y, args.min_run_time)
    precision(model, x, y, args.min_run_time)
    if device.type == "cuda":
        allocation(device)


if __name__ == "__main__":
    main()
