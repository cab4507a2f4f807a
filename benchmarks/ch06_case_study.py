"""Chapter 6 benchmark: the case-study table, each fix's measured time and speed-up.

    .venv/bin/python benchmarks/ch06_case_study.py                  # the device pick_device() chooses
    .venv/bin/python benchmarks/ch06_case_study.py --device cpu --samples 16384 --epochs 2

The slow loop (per-step ``.item()`` + print, per-sample Python preprocessing in the Dataset,
a DataLoader, batch 64) trains the sources' 20-64-32-1 MLP; each row adds one fix to the
previous ones (helpers.case_study.VARIANTS). Every row is timed with
helpers.timing.benchmark (one call = one training run; the table shows ms per epoch) and is
checked against the slow loop: the first three fixes must end with the same parameters and
losses, the bigger batch changes the math on purpose.

Target (chapter 6 issue): every math-keeping fix is "yes" in the last column, and the fixes
together make the loop faster. Timings are printed, never asserted: they are noisy.

Version 1. When changing how this script measures, bump the version.
"""

from __future__ import annotations

import argparse

from helpers.case_study import case_study_table, make_case_study
from helpers.devices import describe_device, pick_device
from helpers.tables import print_table

VERSION = 1


def main(argv: list[str] | None = None) -> int:
    """Parse the options, print the device and the case-study table (chapter 6)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps ... (default: best)")
    parser.add_argument("--samples", type=int, default=8192, help="training samples (default 8192)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per timed run (default 1)")
    parser.add_argument(
        "--min-run-time", type=float, default=1.0, help="seconds of timing per variant"
    )
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    print(f"chapter 6 case study, benchmark version {VERSION}")
    print(describe_device(device), end="\n\n")
    cs = make_case_study(n_samples=args.samples, epochs=args.epochs)
    print(
        f"{args.samples} samples, {args.epochs} epoch(s) per run, batch {cs.batch_size} "
        f"(big batch {cs.big_batch_size}), {args.min_run_time:g} s of timing per variant\n"
    )
    rows = case_study_table(cs, device, min_run_time=args.min_run_time)
    print_table(rows)
    kept = [r["same result as slow"] == "yes" for r in rows[1:-1]]
    print(f"\nmath-keeping fixes with the slow loop's result: {sum(kept)} of {len(kept)}")
    print(f"all fixes that keep the math: {rows[-2]['speed-up vs slow']:.2f}x faster per epoch")
    return 0 if all(kept) else 1


if __name__ == "__main__":
    raise SystemExit(main())
