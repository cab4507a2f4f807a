"""benchmarks/ch01_matmul.py: the burst-vs-sustained comparison's Python, run on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

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
    assert torch.backends.cuda.matmul.allow_tf32 is False  # restored


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
