"""benchmarks/ch08_build_it.py runs and prints its tables and target lines (timings printed, never asserted)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ch08_build_it.py"


def load_script() -> ModuleType:
    """The benchmark script as a module."""
    spec = importlib.util.spec_from_file_location("ch08_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_ch08_benchmark_prints_the_attention_part() -> None:
    args = [
        "--device",
        "cpu",
        "--min-run-time",
        "0.02",
        "--lengths",
        "64",
        "128",
        "--threads",
        "1",
        "--part",
        "attention",
    ]
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert f"torch {torch.__version__}" in out and "chapter 8 benchmark v2" in out
    assert re.search(r"^4096\s+80\s+1\.016\s+0\.0127", out, re.M), out  # bytes are exact
    assert "CPU target: tiles at T = 4096 at most 1/8 of the written-out attention's bytes; 1.27% meets it" in out  # fmt: skip
    assert "correctness first" in out and "CHECK FAILED" not in out
    for row in ("sdpa default @ 64", "pytorch tiles @ 128", "written out @ 128"):
        assert re.search(rf"^\s*{row}\s+\d", out, re.M), row
    assert "machine:" in out
    assert "GPU target: n/a here, no compiled Triton kernel was timed at T >= 2048" in out


def test_gpu_target_lines(capsys) -> None:
    bench = load_script()
    rows = [
        {"row": f"{m} @ 2048", "T": 2048, "method": m, "ms": ms}
        for m, ms in (
            ("sdpa flash", 1.0),
            ("sdpa default", 1.2),
            ("pytorch tiles", 40.0),
            ("triton", 1.5),
        )
    ]
    rows += [{"row": "triton @ 4096", "T": 4096, "method": "triton", "ms": 9.0}]
    rows += [{"row": "sdpa default @ 4096", "T": 4096, "method": "sdpa default", "ms": 3.0}]
    bench.triton_targets(rows, (1024, 2048, 4096))
    out = capsys.readouterr().out
    assert "GPU target at T = 2048: triton 1.50x the time of sdpa flash @ 2048, 0.0375x the PyTorch tiles' (meets" in out  # fmt: skip
    assert "GPU target at T = 4096: triton 3.00x the time of sdpa default @ 4096, infx the PyTorch tiles' (MISSES" in out  # fmt: skip


def test_a_failed_check_sets_the_exit_status(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    bench = load_script()
    monkeypatch.setattr(bench, "attention_part", lambda args: ["triton differs from SDPA beyond the rounding bound"])  # fmt: skip
    assert bench.main(["--device", "cpu"]) == 1
    assert "CHECK FAILED: triton differs" in capsys.readouterr().out


def test_bad_options_are_refused() -> None:
    bench = load_script()
    for bad in (["--min-run-time", "0"], ["--threads", "0"], ["--lengths", "0"]):
        with pytest.raises(SystemExit) as exc:
            bench.parse_args(bad)
        assert exc.value.code == 2
