"""benchmarks/ch02_training_loop.py runs and prints its table (timings are printed, never asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ch02_training_loop.py"


def test_ch02_benchmark_prints_the_table() -> None:
    args = ["--device", "cpu", "--rounds", "1", "--min-run-time", "0.05"]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "same math checked" in out and "flat parameters + FlatAdam" in out
    for row in ("sources' loop (", "resident loop, torch.optim.Adam", "final loop"):
        assert row in out
    assert "speed-up vs the sources' loop as written (median):" in out
    assert "final loop step:" in out
