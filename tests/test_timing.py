"""helpers.timing.benchmark: warm-up, repeats, real thread count, median and spread."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils import benchmark as tbench

from helpers.timing import BenchResult, benchmark
from helpers.units import format_seconds


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


def test_benchmark_and_torch_utils_benchmark_time_the_same_call() -> None:
    """Invariants only: how close the two medians are is a benchmark (benchmarks/ch01_matmul.py)."""
    a = torch.randn(64, 64)
    calls = []

    def mm() -> torch.Tensor:
        calls.append(torch.get_num_threads())
        return torch.mm(a, a)

    ours = benchmark(mm, num_threads=1, warmup=2, min_run_time=0.02)
    assert ours.num_threads == 1 and set(calls[2:]) == {1}  # timed calls honour num_threads
    assert torch.get_num_threads() >= 1
    n_ours = len(calls)
    theirs = tbench.Timer("mm()", globals={"mm": mm}, num_threads=1)
    ref = theirs.blocked_autorange(min_run_time=0.02)
    assert len(calls) > n_ours and set(calls[n_ours:]) == {1}  # both timed the same function
    for median in (ours.median, ref.median):
        assert math.isfinite(median) and median > 0
    print(f"ours / torch.utils.benchmark = {ours.median / ref.median:.2f} (printed, not asserted)")


@pytest.mark.parametrize(
    "seconds,text", [(1.5, "1.5 s"), (2e-3, "2 ms"), (1.5e-5, "15 µs"), (3e-9, "3 ns")]
)
def test_format_seconds(seconds: float, text: str) -> None:
    assert format_seconds(seconds) == text


def test_warm_up_runs_at_the_timed_thread_count() -> None:
    seen: list[int] = []
    before = torch.get_num_threads()
    benchmark(
        lambda: seen.append(torch.get_num_threads()), num_threads=1, warmup=3, min_run_time=0.01
    )
    assert seen[:3] == [1, 1, 1] and torch.get_num_threads() == before
