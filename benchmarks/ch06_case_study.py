"""Chapter 6 benchmark: the case-study table, each fix's measured time, spread and verdict.

    .venv/bin/python benchmarks/ch06_case_study.py                  # the device pick_device() chooses
    .venv/bin/python benchmarks/ch06_case_study.py --device cpu --samples 16384 --epochs 2

The slow loop (per-sample Python preprocessing in the Dataset, a DataLoader whose batches are
copied to the device every step, per-step ``.item()`` + print, batch 64) trains the sources'
20-64-32-1 MLP; each row adds one fix to the previous ones (helpers.case_study.VARIANTS). The
per-step ``.item()`` is removed after the resident fix: before it, every step also copies its
batch from pageable memory with a blocking ``.to(device)`` (two syncs a step on a GPU), so
removing the ``.item()`` could not let the CPU run ahead (AUDIT finding 8 of the H100 run of
2026-11-26, where it came first).

The rows are timed in interleaved rounds (every variant once per round, the order rotating),
each reading helpers.timing.benchmark of one whole run; a row shows the median and IQR over
the rounds. Each row's verdict against the row before it comes from
helpers.verdicts.compare_rows, so its ratio is the table's "speed-up vs previous"; on a
shared GPU or a loaded CPU it says "inconclusive". The machine's state is printed under the
table. Every row is checked against the slow loop: the math-keeping fixes must end with the
same parameters and losses, the bigger batch changes the math on purpose.

Target (chapter 6 issue): every math-keeping fix is "yes" in the last column (the exit code),
and the fixes together make the loop faster. Timings are printed, never asserted.

Version 2 (interleaved rounds, spreads, verdicts, machine state; the .item() fix moved after
the resident one). When changing how this script measures, bump the version.
"""

from __future__ import annotations

import argparse

from helpers.case_study import CaseStudyTable, case_study_table, make_case_study
from helpers.devices import describe_device, pick_device

VERSION = 2


def report(table: CaseStudyTable) -> tuple[str, bool]:
    """The table, a verdict per row, the overall verdict; and whether every math-keeping fix kept it (chapter 6)."""
    rows = table.rows
    kept = [r["same result as slow"] == "yes" for r in rows[1:-1]]
    lines = [str(table), "", "each row against the row before it:"]
    lines += [f"  {v}" for v in table.verdicts()]
    lines += [
        "",
        f"math-keeping fixes with the slow loop's result: {sum(kept)} of {len(kept)}",
        f"all fixes that keep the math: {table.compare(len(rows) - 2, 0)}",
    ]
    return "\n".join(lines), all(kept)


def main(argv: list[str] | None = None) -> int:
    """Parse the options, print the device and the case-study table with its verdicts (chapter 6)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps ... (default: best)")
    parser.add_argument("--samples", type=int, default=8192, help="training samples (default 8192)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per timed run (default 1)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument(
        "--min-run-time",
        type=float,
        default=0.2,
        help="seconds of timing per variant in each round (default 0.2; at least one run)",
    )
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    print(f"chapter 6 case study, benchmark version {VERSION}")
    print(describe_device(device), end="\n\n")
    cs = make_case_study(n_samples=args.samples, epochs=args.epochs)
    print(
        f"{args.samples} samples, {args.epochs} epoch(s) per run, batch {cs.batch_size} "
        f"(big batch {cs.big_batch_size}), {args.rounds} interleaved rounds, "
        f"{args.min_run_time:g} s of timing per variant per round\n"
    )
    table = case_study_table(cs, device, rounds=args.rounds, min_run_time=args.min_run_time)
    text, ok = report(table)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
