"""benchmarks/ch06_case_study.py: the table, a verdict per row from the rows, the exit code."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from helpers.case_study import VARIANTS, CaseStudyTable
from helpers.machine_state import GpuTenants, MachineState

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ch06_case_study.py"
spec = importlib.util.spec_from_file_location("ch06_case_study_benchmark", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def h100_table(same: str = "yes", states=None) -> CaseStudyTable:
    """Rows shaped like bench-ch06.log of the H100 run of 2026-11-26, in the new order; the
    no-.item() row (483.4 ms there, in the old order) and the 1% spreads are made up."""
    ms = [377.4, 272.5, 212.3, 209.9, 16.59]
    rows = [
        {
            "variant": name,
            "ms per epoch": m,
            "IQR (ms)": 0.01 * m,
            "speed-up vs previous": ms[max(i - 1, 0)] / m,
            "speed-up vs slow": ms[0] / m,
            "same result as slow": same if 0 < i < len(ms) - 1 else "yes",
        }
        for i, ((name, _), m) in enumerate(zip(VARIANTS, ms))
    ]
    rows[-1]["same result as slow"] = "different math (batch 1024, 8 steps)"
    return CaseStudyTable(rows, states or [None] * len(rows), rounds=7)


def test_report_prints_a_verdict_per_row_with_the_tables_ratio() -> None:
    table = h100_table()
    text, ok = bench.report(table)
    assert ok and "math-keeping fixes with the slow loop's result: 3 of 3" in text
    after = text.split("each row against the row before it:\n")[1].split("\n\n")[0]
    verdicts = [line.strip() for line in after.splitlines()]
    assert len(verdicts) == len(VARIANTS) - 1
    for line, row in zip(verdicts, table.rows[1:]):
        ratio = float(re.findall(r"(\d+\.\d+)x", line)[0])
        expected = row["speed-up vs previous"]
        assert ratio == pytest.approx(max(expected, 1 / expected), abs=0.006)
    assert "no per-step .item() + print vs + resident tensors, no DataLoader: too close" in text
    overall = text.splitlines()[-1]
    assert overall.startswith("all fixes that keep the math: here, + no per-step .item()")
    assert "1.80x faster than slow loop, as written" in overall  # 377.4 / 209.9


def test_report_fails_on_a_fix_that_changed_the_math_and_says_when_busy() -> None:
    _, ok = bench.report(h100_table(same="NO"))
    assert not ok
    shared = MachineState("cuda:0", 6, 6, 16, 2.0, GpuTenants(2, 2**30))
    text, _ = bench.report(h100_table(states=[shared] * 5))
    assert "machine: BUSY" in text and text.count("inconclusive, GPU shared") == 5


def test_main_runs_on_the_cpu(capsys) -> None:
    code = bench.main(
        ["--device", "cpu", "--samples", "128", "--rounds", "2", "--min-run-time", "0.001"]
    )
    out = capsys.readouterr().out
    assert code == 0 and "benchmark version 2" in out and "2 interleaved rounds" in out
    assert "each row against the row before it:" in out and "machine: " in out
