"""helpers.timing.benchmark on fake GPUs: the CUDA-events path and the synchronised MPS timer."""

from __future__ import annotations

import time

import pytest
from fake_gpu import KINDS

from helpers.timing import benchmark


@pytest.mark.parametrize("kind", KINDS)
def test_benchmark_takes_the_device_path(fake_gpu, kind: str) -> None:
    gpu = fake_gpu(kind)
    calls = {"n": 0}

    def work() -> None:
        calls["n"] += 1
        time.sleep(0.001)

    result = benchmark(work, device=gpu.device, warmup=1, min_run_time=0.02, min_repeats=3)
    assert result.device == str(gpu.device)
    assert result.method == ("torch.utils.benchmark" if kind == "mps" else "CUDA events")
    assert len(result.times) >= 3 and result.median >= 0.0009  # work() sleeps 1 ms
    assert calls["n"] >= 1 + result.repeats * result.number_per_run
    assert gpu.synchronize_calls >= 1  # after the warm-up, before timing
    assert str(gpu.device) in str(result)


def test_cuda_events_path_sizes_its_blocks(fake_gpu) -> None:
    """Fast calls are grouped so one block lasts about min_run_time / 10 (at most 20 ms)."""
    fake_gpu("t4")
    result = benchmark(lambda: None, device="cuda", warmup=0, min_run_time=0.05, min_repeats=5)
    assert result.number_per_run > 1 and result.repeats >= 5


def test_cuda_events_are_recorded_on_the_timed_gpu(fake_gpu) -> None:
    """benchmark(device='cuda:1') while cuda:0 is current: events must go on cuda:1's stream."""
    gpu = fake_gpu("h100_sxm", count=2)
    assert gpu.current == 0
    benchmark(lambda: None, device="cuda:1", warmup=0, min_run_time=0.01, min_repeats=3)
    assert gpu.event_devices and set(gpu.event_devices) == {1}
    assert gpu.current == 0  # the caller's current device is restored
