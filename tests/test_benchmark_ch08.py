"""benchmarks/ch08_build_it.py runs and prints its tables and target lines (timings printed, never asserted)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from helpers.machine_state import GpuTenants, MachineState

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
    assert f"torch {torch.__version__}" in out and "chapter 8 benchmark v3" in out
    assert re.search(r"^4096\s+80\s+1\.016\s+0\.0127", out, re.M), out  # bytes are exact
    assert "CPU target: tiles at T = 4096 at most 1/8 of the written-out attention's bytes; 1.27% meets it" in out  # fmt: skip
    assert "correctness first" in out and "CHECK FAILED" not in out
    for row in ("sdpa default @ 64", "pytorch tiles @ 128", "written out @ 128"):
        assert re.search(rf"^\s*{row}\s+\d", out, re.M), row
    assert "machine:" in out
    assert "GPU target: n/a here, no compiled Triton kernel was timed at T >= 2048" in out


def test_the_parallel_part_warns_no_deprecation() -> None:
    """Issue 31: the benchmark and its ranks with FutureWarning and DeprecationWarning as errors.

    torch 2.13 deprecated the collectives' old names with a FutureWarning at every call; the
    smallest sizes on 2 gloo ranks keep the launch to about 15 s on a 2-core CPU.
    """
    errors = "error::FutureWarning,error::DeprecationWarning"
    small = ["--width", "64", "--depth", "3", "--per-rank-batch", "8", "--bucket-mb", "0.01"]
    args = ["--device", "cpu", "--part", "parallel", "--nproc", "2", *small, "--blocks", "2"]
    warn = ["-W", "error::FutureWarning", "-W", "error::DeprecationWarning"]
    env = {**os.environ, "PYTHONWARNINGS": errors}  # the launched ranks inherit it
    run = subprocess.run(
        [sys.executable, *warn, str(SCRIPT), *args, "--steps", "2"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "5. ZeRO-1" in run.stdout and "on every rank: True" in run.stdout, run.stdout[-3000:]
    assert not re.search(r"(Future|Deprecation)Warning", run.stderr), run.stderr[-3000:]


QUIET = MachineState("cuda:0", 6, 6, 16, 1.0, GpuTenants(0), 0.0, 1.0)
SHARED = MachineState("cuda:0", 6, 6, 16, 1.0, GpuTenants(2, 2**30), 0.0, 1.0)


def target_rows(machine: MachineState) -> list[dict]:
    """Timing rows at T = 2048 and 4096, each taken in the machine state given."""
    rows = [
        {"row": f"{m} @ 2048", "T": 2048, "method": m, "ms": ms, "machine": machine}
        for m, ms in (
            ("sdpa flash", 1.0),
            ("sdpa default", 1.2),
            ("pytorch tiles", 1470.0),
            ("triton", 1.5),
        )
    ]
    rows += [{"row": "triton @ 4096", "T": 4096, "method": "triton", "ms": 9.0, "machine": machine}]
    rows += [{"row": "sdpa default @ 4096", "T": 4096, "method": "sdpa default", "ms": 3.0, "machine": machine}]  # fmt: skip
    rows += [{"row": "pytorch tiles @ 4096", "T": 4096, "method": "pytorch tiles", "ms": 6.0, "machine": machine}]  # fmt: skip
    return rows


def test_gpu_target_lines(capsys) -> None:
    bench = load_script()
    bench.triton_targets(target_rows(QUIET), (1024, 2048, 4096))
    out = capsys.readouterr().out
    # issue 31: the tiles' time over Triton's, readable ("980x faster", not "0.00102x the time")
    assert "GPU target at T = 2048: triton 1.50x the time of sdpa flash @ 2048 (meets: <= 2x), 980x faster than the PyTorch tiles (meets: faster)\n" in out  # fmt: skip
    assert "GPU target at T = 4096: triton 3.00x the time of sdpa default @ 4096 (MISSES: <= 2x), 1.50x slower than the PyTorch tiles (MISSES: faster)\n" in out  # fmt: skip
    rows = [r for r in target_rows(QUIET) if r["row"] != "pytorch tiles @ 4096"]
    bench.triton_targets(rows, (4096,))
    assert "the PyTorch tiles were not timed (MISSES: faster)" in capsys.readouterr().out
    assert bench.than_the_tiles(0.05) == "20x faster than the PyTorch tiles"
    assert bench.than_the_tiles(1 / 1234.4) == "1,234x faster than the PyTorch tiles"


def test_gpu_target_lines_are_inconclusive_on_a_busy_machine(capsys) -> None:
    """As the verdicts: a target met or missed on a shared GPU says nothing of the kernel."""
    bench = load_script()
    bench.triton_targets(target_rows(SHARED), (2048, 4096))
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("GPU target at T")]
    assert len(lines) == 2 and not re.search("meets|MISSES", out), out
    assert all(ln.count("(inconclusive:") == 2 for ln in lines), lines
    assert all(ln.endswith(f"; the machine was busy ({SHARED.caveat()})") for ln in lines), lines


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
