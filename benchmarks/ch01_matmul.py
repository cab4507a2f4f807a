"""Chapter 1 benchmark: the matmul size sweep, and the helper checked against an independent timer.

    .venv/bin/python benchmarks/ch01_matmul.py            # the device pick_device() chooses
    .venv/bin/python benchmarks/ch01_matmul.py --device cpu --rounds 7

1. Prints the chapter's sweep table (fp32 and bf16) on the device, and the CPU-vs-GPU speed-up
   when the device is an accelerator.
2. Compares the GFLOP/s that ``helpers.matmul`` reports for a 1024 x 1024 fp32 matmul with a
   plain ``torch.utils.benchmark.Timer`` measurement that uses all threads
   (``num_threads=torch.get_num_threads()``; the Timer's own default is one thread). The two
   are taken in alternating rounds, so a busy machine slows both alike; the target is that
   their medians agree within 10%.

Version 1. When changing how this script measures, bump the version.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.utils import benchmark as tbench

from helpers.devices import describe_device, pick_device
from helpers.matmul import default_size_range, matmul_flops, run_matmul_sweep, run_speedup

VERSION = 1
N = 1024
TARGET_PCT = 10.0


def helper_gflops(n: int, device: torch.device) -> float:
    """GFLOP/s of one n x n fp32 matmul as helpers.matmul measures it."""
    sweep = run_matmul_sweep(
        [n], "fp32", device, min_run_time=1.0, max_call_seconds=60.0, progress=False
    )
    if not sweep.rows:
        raise SystemExit(f"the helper measured nothing: {sweep}")
    return sweep.rows[0]["GFLOP/s"]


def timer_gflops(n: int, device: torch.device) -> float:
    """GFLOP/s of the same matmul from torch.utils.benchmark.Timer alone, on all threads."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    timer = tbench.Timer(
        stmt="torch.matmul(a, b)",
        globals={"torch": torch, "a": a, "b": b},
        num_threads=torch.get_num_threads(),
    )
    m = timer.blocked_autorange(min_run_time=1.0)  # the Timer syncs an accelerator itself
    return matmul_flops(n, n, n) / m.median / 1e9


def compare(device: torch.device, rounds: int) -> float:
    """Alternate helper and Timer measurements; print both and return the % difference."""
    ours, theirs = [], []
    for i in range(rounds):
        ours.append(helper_gflops(N, device))
        theirs.append(timer_gflops(N, device))
        print(f"  round {i + 1}: helper {ours[-1]:8.1f}  Timer {theirs[-1]:8.1f} GFLOP/s")
    h, t = statistics.median(ours), statistics.median(theirs)
    diff = 100 * (h - t) / t
    verdict = "within" if abs(diff) <= TARGET_PCT else "OUTSIDE"
    print(
        f"median over {rounds} rounds: helper {h:.1f} GFLOP/s, independent Timer {t:.1f} GFLOP/s, "
        f"difference {diff:+.1f}% ({verdict} the {TARGET_PCT:g}% target)"
    )
    return diff


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda:0, mps ... (default: best)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating comparison rounds")
    args = parser.parse_args()
    device = pick_device(args.device)
    print(
        f"ch01_matmul benchmark v{VERSION}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(describe_device(device), end="\n\n")

    for dtype in ("fp32", "bf16"):
        print(
            run_matmul_sweep(
                size_range=default_size_range(device), dtype=dtype, device=device, progress=False
            )
        )
        print()
    if device.type != "cpu":
        print(run_speedup(size_range=(64, 4096), device=device, progress=False), end="\n\n")
    else:
        print("speed-up: skipped, the device is the CPU (run on a GPU machine to see it).\n")

    print(f"{N} x {N} fp32 matmul on {device}: helpers.matmul vs torch.utils.benchmark.Timer")
    compare(device, args.rounds)


if __name__ == "__main__":
    main()
