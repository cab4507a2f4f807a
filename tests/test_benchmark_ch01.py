"""benchmarks/ch01_matmul.py: the burst-vs-sustained comparison's Python, run on the CPU."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from helpers.matmul import tf32_enabled
from helpers.nvml_snapshot import nvml_handle

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ch01_matmul.py"
spec = importlib.util.spec_from_file_location("ch01_matmul_benchmark", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _row(diff: float, clock: str = "n/a") -> dict:
    return {
        "dtype": "bf16",
        "n": 4096,
        "burst clock / power": clock,
        "sweep clock / power": clock,
        "sweep vs burst (%)": diff,
    }


def test_burst_seconds_is_positive_and_counts_every_call() -> None:
    calls = []
    seconds = bench.burst_seconds(lambda: calls.append(1), torch.device("cpu"), warmup=2, calls=5)
    assert seconds >= 0 and len(calls) == 7


def test_burst_rows_on_the_cpu_have_no_clock_readings() -> None:
    rows = bench.burst_vs_sustained(torch.device("cpu"), [32])
    assert {r["dtype"] for r in rows} >= {"fp32"} and all(r["n"] == 32 for r in rows)
    assert all(r["sweep clock / power"] == "n/a" for r in rows)
    assert tf32_enabled() is False  # restored


def test_burst_verdict_names_agreement_the_worst_row_and_the_clock() -> None:
    assert "agrees" in bench.burst_verdict([_row(1.0), _row(-2.5)])
    busy = bench.burst_verdict([_row(1.0), _row(-12.0)])
    assert "1 of 2" in busy and "-12.0%" in busy and "re-run" in busy
    capped = bench.burst_verdict([_row(-12.0, "1755 MHz / 699 W")])
    assert "1755 MHz" in capped and "capped its clock" in capped


def test_tf32_row_only_on_gpus_that_have_it(fake_gpu) -> None:  # noqa: ANN001
    assert [label for label, _, _ in bench.burst_dtypes(torch.device("cpu"))][0] == "fp32"
    fake_gpu("h100_sxm")
    assert [label for label, _, _ in bench.burst_dtypes(torch.device("cuda", 0))] == [
        "fp32",
        "tf32",
        "bf16",
    ]


def test_a_t4_gets_no_tf32_and_no_bf16_row(fake_gpu) -> None:  # noqa: ANN001
    fake_gpu("t4")
    assert [label for label, _, _ in bench.burst_dtypes(torch.device("cuda", 0))] == ["fp32"]


def test_the_tf32_row_times_tf32_in_both_halves(monkeypatch) -> None:  # noqa: ANN001
    """Version 2 swept the TF32 row as "fp32", which the sweep runs as true fp32."""
    sweeps, bursts, real_burst = [], [], bench.burst_seconds

    def sweep(sizes, dtype, device, **kwargs):  # noqa: ANN001, ANN003, ANN202
        sweeps.append((dtype, tf32_enabled()))
        return SimpleNamespace(rows=[{"GFLOP/s": 1.0}])

    def burst(fn, device, **kwargs):  # noqa: ANN001, ANN003, ANN202
        bursts.append(tf32_enabled())
        return real_burst(fn, device, **kwargs)

    rows = [("fp32", "fp32", False), ("tf32", "fp32", True)]
    monkeypatch.setattr(bench, "burst_dtypes", lambda device: rows)
    monkeypatch.setattr(bench, "run_matmul_sweep", sweep)
    monkeypatch.setattr(bench, "burst_seconds", burst)
    out = bench.burst_vs_sustained(torch.device("cpu"), [16])
    assert [r["dtype"] for r in out] == ["fp32", "tf32"]
    assert sweeps == [("fp32", False), ("tf32", True)] and bursts == [False, True]
    assert tf32_enabled() is False


def test_clock_watch_reads_the_gpu_torch_uses(fake_gpu) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm", count=2)
    gpu.nvml.nvmlInit()
    assert nvml_handle(gpu.nvml, torch.device("cuda", 1)) == 1  # by UUID, not by index
    gpu.nvml.power_mw = 612_000
    result, clock = bench.ClockWatch(torch.device("cuda", 1)).measure(lambda: time.sleep(0.03) or 5)
    assert result == 5 and clock == "1755 MHz / 612 W"


def test_clock_watch_says_n_a_when_nvml_does_not_know_the_gpu(fake_gpu, monkeypatch) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm")

    def unknown(uuid: str) -> int:
        raise gpu.nvml.NVMLError_InvalidArgument()

    monkeypatch.setattr(gpu.nvml, "nvmlDeviceGetHandleByUUID", unknown)
    assert bench.ClockWatch(gpu.device).measure(lambda: 7) == (7, "n/a")
