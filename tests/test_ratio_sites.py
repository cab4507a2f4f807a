"""Every ratio the course prints is either a verdict built by compare_rows from the rows it
names, or listed here with the reason it is not a verdict between two rows of a table.

AUDIT finding 2 of the H100 run (2026-11-26) was a verdict that stated a ratio between two
rows of a table and compared one row with itself. ``helpers.verdicts.compare_rows`` reads
both rows from the printed table by name (tests/test_verdicts.py: the ratio it prints is the
table's; each chapter's tests check their verdicts against their tables). This test finds
every other place that formats a ratio (``{...:.2f}x``) in the notebooks, benchmarks and
helpers, so a new hand-made verdict cannot slip in unseen: it fails until the site is listed
below with its reason, or turned into a compare_rows verdict.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: An f-string field formatted as a number and followed by "x": a ratio in printed text.
RATIO = re.compile(r"\{[^{}]*:[^{}]*\.\d+[fg]\}x")

#: (file, a piece of the line, why it is not a hand-made verdict between two table rows)
ALLOWED: list[tuple[str, str, str]] = [
    # --- columns: each row's ratio from that row's own printed values, or to the base row ---
    (
        "helpers/activations.py",
        '"FLOPs vs plain"',
        "a column: each row against the plain row, both printed",
    ),
    (
        "helpers/activations.py",
        '"time vs plain"',
        "a column: each row against the plain row, both printed",
    ),
    (
        "helpers/amp_sweep.py",
        "speedup = f",
        "a column: each row's samples/s against fp32's, both printed",
    ),
    (
        "helpers/amp_sweep.py",
        'row["vs fp32"]',
        "a column: each row against the fp32 row, both printed",
    ),
    (
        "helpers/capstone.py",
        'tr_mark("speed-up"): f"{self.speedup',
        "a column: each row against the baseline row",
    ),
    ("notebooks/06_profiling.ipynb", '"slow-down": f"', "a column: two timings of the same row"),
    ("notebooks/06_profiling.ipynb", '"speed-up": f"', "a column: two timings of the same row"),
    (
        "helpers/case_study.py",
        "ax.bar_label(",
        "bar labels of the table's own 'speed-up vs slow' column",
    ),
    (
        "helpers/capstone.py",
        "ax.text(r.tokens_per_s",
        "bar labels of the table's own speed-up column",
    ),
    # --- verdict text wrapped around a compare_rows result (its ratio, its noise) -------------
    (
        "helpers/capstone.py",
        '"dropped: not shown to help',
        "keep_verdict: the ratio of a compare_rows verdict",
    ),
    (
        "helpers/capstone.py",
        '"kept: {gain:.2f}x',
        "keep_verdict: the ratio of a compare_rows verdict",
    ),
    (
        "helpers/capstone.py",
        '"dropped: {slower:.2f}x',
        "keep_verdict: the ratio of a compare_rows verdict",
    ),
    (
        "helpers/capstone.py",
        "now ({ratio:.2f}x",
        "removal_verdict: a compare_rows ratio",
    ),
    ("helpers/capstone.py", "removed: {gain:.2f}x", "removal_verdict: a compare_rows ratio"),
    ("helpers/capstone.py", "stays: {ratio:.2f}x", "removal_verdict: a compare_rows ratio"),
    ("helpers/capstone.py", '"no cost of {what} shown', "cost_verdict: a compare_rows ratio"),
    ("helpers/capstone.py", "the step took {gain:.2f}x", "cost_verdict: a compare_rows ratio"),
    (
        "helpers/capstone.py",
        "now {speedup:.2f}x the baseline",
        "the best row so far against the baseline row",
    ),
    (
        "helpers/capstone.py",
        "beats the final, {best_gain",
        "the ablation's pick: a compare_rows ratio",
    ),
    (
        "benchmarks/ch01_matmul.py",
        "burst/sweep per clock",
        "per-clock ratio of a compare_rows verdict, burst over sweep like pair_verdict's",
    ),
    # --- targets: the ratio of two named rows of the table printed above, next to a verdict ---
    (
        "benchmarks/ch02_training_loop.py",
        "speed-up vs the sources' loop",
        "target line; verdict beside it",
    ),
    (
        "benchmarks/ch02_training_loop.py",
        "the eager ",
        "the final step against the measured floor row",
    ),
    ("benchmarks/ch02_training_loop.py", "2-core CI CPU", "the CPU-only reference line, dated"),
    (
        "benchmarks/ch02_training_loop.py",
        "from it",
        "the final step against the measured floor row",
    ),
    ("benchmarks/ch07_capstone.py", "per-round ratios", "each round's own pair of the two rows"),
    (
        "benchmarks/ch07_capstone.py",
        "CPU target:",
        "target line; the rounds verdict is compare_rows",
    ),
    (
        "benchmarks/ch07_capstone.py",
        "said(ratio >= TARGET_H100)",
        "target line (inconclusive on a busy machine); the rounds verdict is compare_rows",
    ),
    (
        "benchmarks/ch07_capstone.py",
        "final vs baseline (tokens/s, median)",
        "the issue's closing line",
    ),
    (
        "benchmarks/ch08_build_it.py",
        "GPU target at T",
        "target line (inconclusive on a busy machine); triton_verdicts are compare_rows",
    ),
    (
        "benchmarks/ch08_build_it.py",
        "x the time of the PyTorch tiles",
        "than_the_tiles: the GPU target line's words for two rows printed above",
    ),
    (
        "benchmarks/ch08_build_it.py",
        "bucketed overlapped / DDP step time",
        "target line; compare_rows below",
    ),
    (
        "helpers/capstone.py",
        "final vs the public recipe",
        "this run against a cited figure, not a row",
    ),
    # --- not a ratio between two timing rows --------------------------------------------------
    (
        "notebooks/02_training_loop.ipynb",
        "x the launch time",
        "work time over launch time of one cell",
    ),
    (
        "notebooks/02_training_loop.ipynb",
        "{final_step_us / floor_us",
        "the final step against the measured floor",
    ),
    ("notebooks/04_multi_gpu.ipynb", "x less, {how}", "optimizer state bytes, counted"),
    ("notebooks/05_memory.ipynb", "x the parameters (", "bytes over the parameters' bytes"),
    (
        "notebooks/05_memory.ipynb",
        "step temporaries MiB'] / params",
        "bytes over the parameters' bytes",
    ),
    (
        "helpers/amp_sweep.py",
        "within what a new seed changes",
        "a loss gap over the seed-to-seed spread",
    ),
    (
        "helpers/amp_sweep.py",
        "beyond what a new seed changes",
        "a loss gap over the seed-to-seed spread",
    ),
    ("helpers/matmul.py", "while the FLOPs grew", "the FLOPs' growth between two sizes"),
    ("helpers/same_math.py", "of the tolerance", "a loss gap over its tolerance"),
    ("helpers/same_math.py", "x the tolerance", "a loss gap over its tolerance"),
]

#: Not scanned: verdicts' own module, and the exercise checkers (hints about a learner's answer).
SKIPPED = ("helpers/verdicts.py", "helpers/checks/")


def ratio_sites() -> list[tuple[str, str]]:
    """(file, stripped line) for every line that formats a ratio, in notebooks and code."""
    found = []
    for path in sorted(ROOT.glob("notebooks/*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "code":
                lines = "".join(cell["source"]).splitlines()
                found += [(path.relative_to(ROOT).as_posix(), ln.strip()) for ln in lines]
    for path in sorted([*ROOT.glob("benchmarks/*.py"), *ROOT.glob("helpers/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(SKIPPED):
            found += [(rel, ln.strip()) for ln in path.read_text(encoding="utf-8").splitlines()]
    return [(f, ln) for f, ln in found if RATIO.search(ln)]


def test_every_printed_ratio_is_a_compare_rows_verdict_or_listed_with_its_reason() -> None:
    unlisted = [
        f"{f}: {ln}"
        for f, ln in ratio_sites()
        if not any(f == af and piece in ln for af, piece, _ in ALLOWED)
    ]
    assert not unlisted, (
        "These lines print a ratio. A verdict between two rows of a table must come from "
        "helpers.verdicts.compare_rows on the rows it prints; anything else, list in ALLOWED "
        "with its reason:\n" + "\n".join(unlisted)
    )


def test_every_listed_site_still_exists() -> None:
    sites = ratio_sites()
    stale = [
        (af, piece)
        for af, piece, _ in ALLOWED
        if not any(f == af and piece in ln for f, ln in sites)
    ]
    assert not stale, f"listed but gone (remove them from ALLOWED): {stale}"


def test_the_scan_finds_the_finding_2_verdict_in_the_old_notebook() -> None:
    old = 'print(f"{a} vs {b}: too close to call ({ratio:.2f}x, spreads add up to {noise:.0%})")'
    assert RATIO.search(old)
