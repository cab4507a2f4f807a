"""helpers.timing.benchmark: warm-up, repeats, real thread count, median and spread."""

from __future__ import annotations

import pytest
import torch
from torch.utils import benchmark as tbench

from helpers.timing import BenchResult, benchmark, format_seconds


def test_benchmark_reports_median_and_spread() -> None:
    a = torch.randn(128, 128)
    r = benchmark(torch.mm, a, a, device="cpu", label="mm", min_run_time=0.05)
    assert isinstance(r, BenchResult)
    assert r.median > 0 and r.iqr >= 0 and r.repeats >= 5
    assert r.num_threads == torch.get_num_threads()
    assert "mm" in str(r) and "median" in str(r)
    assert r.rate(2 * 128**3) > 0


def test_benchmark_warms_up_before_timing() -> None:
    calls = []
    benchmark(lambda: calls.append(1), warmup=3, min_run_time=0.01, min_repeats=1)
    assert len(calls) > 3


def test_benchmark_uses_all_threads_unlike_the_timer_default() -> None:
    seen = []
    benchmark(lambda: seen.append(torch.get_num_threads()), warmup=0, min_run_time=0.01)
    assert set(seen) == {torch.get_num_threads()}
    timer = tbench.Timer("pass")
    assert timer._task_spec.num_threads == 1  # the trap the helper avoids


def test_benchmark_agrees_with_torch_utils_benchmark() -> None:
    a = torch.randn(256, 256)
    ours = benchmark(torch.mm, a, a, min_run_time=0.2).median
    theirs = tbench.Timer(
        "torch.mm(a, a)", globals={"a": a, "torch": torch}, num_threads=torch.get_num_threads()
    )
    ref = theirs.blocked_autorange(min_run_time=0.2).median
    assert (
        0.2 < ours / ref < 5
    )  # same order of magnitude; exact agreement is a benchmark-script matter


@pytest.mark.parametrize(
    "seconds,text", [(1.5, "1.5 s"), (2e-3, "2 ms"), (1.5e-5, "15 µs"), (3e-9, "3 ns")]
)
def test_format_seconds(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text
