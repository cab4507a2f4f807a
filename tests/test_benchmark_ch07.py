"""benchmarks/ch07_capstone.py runs and prints its tables (timings are printed, never asserted)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from helpers.capstone import Levers
from helpers.gpt import GPTConfig, text_bytes

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ch07_capstone.py"


def load_script() -> ModuleType:
    """The benchmark script as a module."""
    spec = importlib.util.spec_from_file_location("ch07_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_ch07_benchmark_prints_the_tables_and_one_final_line() -> None:
    args = ["--device", "cpu", "--rounds", "1", "--min-run-time", "0.05", "--no-compile"]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert f"torch {torch.__version__}" in out and "GPT: 2 layers x 64 channels" in out
    assert "same math (tolerance 0.0001)" in out
    for lever in ("resident", "sdpa", "fused_adamw", "checkpoint"):
        assert re.search(rf"^\s*{lever}\s+\S+\s+same math \(tolerance", out, re.M), lever
    assert "tf32: skipped here: TF32 needs an NVIDIA GPU" in out
    assert "compile: left out (--no-compile)" in out
    assert "compile time: n/a" in out
    for column in ("levers", "tokens/s", "MFU datasheet", "MFU achievable", "kept?", "loss gap"):
        assert column in out
    assert re.search(r"^\s*baseline\s+\d+\.\d+ ±\d+%", out, re.M)
    assert "interleaved round(s)" in out and "per-round ratios" in out
    assert "CPU target: 1.3x with the same math" in out
    finals = re.findall(r"^final vs baseline \(tokens/s, median\): \d+\.\d\dx$", out, re.M)
    assert len(finals) == 1 and out.rstrip().endswith(finals[0])


def test_bad_options_are_refused() -> None:
    bench = load_script()
    for bad in (["--rounds", "0"], ["--min-run-time", "0"], ["--threads", "0"]):
        with pytest.raises(SystemExit) as exc:
            bench.parse_args(bad)
        assert exc.value.code == 2


def tiny_setup(bench: ModuleType) -> object:
    """The benchmark's Setup with a 1-layer GPT on 3,000 bytes: trainers that run in ms."""
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=8)
    return bench.Setup(cfg, 4, text_bytes()[:3000], torch.device("cpu"))


def test_loss_check_tolerances() -> None:
    bench = load_script()
    base = [5.0, 4.0]
    assert bench.loss_check([5.0, 4.00001], base, Levers(sdpa=True))[1:] == (
        "same math (tolerance 0.0001)",
        True,
    )
    gap, verdict, same = bench.loss_check([5.0, 4.01], base, Levers(sdpa=True))
    assert not same and verdict.startswith("DIFFERENT") and gap == pytest.approx(0.01)
    assert bench.loss_check([5.0, 4.0005], base, Levers(compile=True))[2]  # compiled: 1e-3
    gap, verdict, same = bench.loss_check([5.0, 4.5], base, Levers(amp=True, tf32=True))
    assert same and verdict == "rounding changed by amp + tf32 (not checked)"


def test_same_math_table_of_each_lever() -> None:
    bench = load_script()
    rows = bench.check_same_math(tiny_setup(bench), ("resident", "sdpa", "tf32"))
    assert [r["lever"] for r in rows] == ["resident", "sdpa", "tf32"]
    assert rows[0]["largest loss gap"] == "0.0e+00" and rows[0]["losses"].startswith("same")
    assert rows[1]["losses"].startswith("same math")
    assert rows[2]["losses"].startswith("skipped: TF32 needs")


def test_a_lever_that_raises_is_dropped_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch.compile without a working C++ compiler: dropped, the rest of the run goes on."""
    bench = load_script()

    def no_compiler(model: torch.nn.Module) -> object:
        def call(*args: object) -> None:
            raise RuntimeError("CppCompileError: C++ compile error")

        return call

    monkeypatch.setattr(torch, "compile", no_compiler)
    setup = tiny_setup(bench)
    rows = bench.check_same_math(setup, ("compile",))
    assert rows[0]["losses"] == "failed: RuntimeError: CppCompileError: C++ compile error"
    monkeypatch.setattr(bench, "GREEDY", ("sdpa", "compile", "tf32"))
    choice = bench.choose_levers(setup, fpt=1e5, peak=None, achievable=1e11, min_run_time=0.01)
    out = capsys.readouterr().out
    assert "compile: dropped, it failed here: RuntimeError: CppCompileError" in out
    assert "tf32: skipped here" in out
    assert [r.label for r in choice.search.rows][0] == "baseline"
    assert choice.baseline.levers == Levers() and choice.final.levers == choice.search.current
    assert set(choice.gaps) == {r.label for r in choice.search.rows}
    assert choice.math_broken == []
    base_s, final_s = bench.interleaved(choice.baseline, choice.final, 2, 0.01)
    assert len(base_s) == len(final_s) == 2 and min(base_s + final_s) > 0
