"""benchmarks/ch02_training_loop.py runs and prints its table (timings are printed, never asserted)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

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
    assert "CUDA graphs: CUDA graphs need a CUDA or ROCm GPU and this is cpu" in out


def _load_script():  # noqa: ANN202 - the benchmark script as a module
    spec = importlib.util.spec_from_file_location("ch02_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_capture_failure_falls_back_with_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture that raises on a GPU gives (None, the error): the script then times the eager loop."""
    bench = _load_script()

    def fail(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(bench, "capture_steps", fail)
    x, y = bench.make_classification_data(100, 20, seed=0)
    init = bench.make_mlp().state_dict()
    graphed, why = bench.build_graphed(torch.device("cpu"), x, y, init)
    assert graphed is None
    assert why.startswith("CUDA graph capture failed (RuntimeError: operation not permitted")


def test_capture_success_gives_steps_and_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _load_script()
    seen = {}

    def fake_capture(model, opt, loss_fn, x, y, sizes):  # noqa: ANN001, ANN202
        seen["sizes"], seen["capturable"] = list(sizes), opt.param_groups[0]["capturable"]
        return {"steps": True}

    monkeypatch.setattr(bench, "capture_steps", fake_capture)
    x, y = bench.make_classification_data(10_000, 20, seed=0)
    graphed, why = bench.build_graphed(
        torch.device("cpu"), x, y, bench.make_mlp(sigmoid=True).state_dict()
    )
    assert why == "" and graphed[0] == {"steps": True}
    assert seen == {"sizes": [64, 16], "capturable": True}
    assert graphed[1].batch_size == 64 and len(graphed[1]) == 157
