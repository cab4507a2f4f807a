"""helpers.memory on fake GPUs: readouts and peak tracking read the right allocator (chapter 1)."""

from __future__ import annotations

import time

import pytest
import torch

from helpers.memory import memory_readout, track_peak
from helpers.units import format_bytes

GiB = 2**30


@pytest.mark.parametrize("kind", ["h100_sxm", "t4", "mi300x"])
def test_cuda_readout_names_the_allocator_counters(fake_gpu, kind: str) -> None:
    gpu = fake_gpu(kind)
    gpu.allocate(3 * GiB)
    gpu.free(1 * GiB)
    readout = memory_readout(gpu.device)
    assert readout == {
        "allocated": 2 * GiB,
        "reserved": 3 * GiB,
        "peak allocated": 3 * GiB,
        "peak reserved": 3 * GiB,
    }
    assert memory_readout() == readout  # None = the best device = the fake GPU


def test_readout_of_the_second_gpu(fake_gpu) -> None:
    fake_gpu("a100", count=2)
    assert set(memory_readout("cuda:1")) == {
        "allocated",
        "reserved",
        "peak allocated",
        "peak reserved",
    }


def test_readout_on_a_fake_gpu_formats_in_binary_units(fake_gpu) -> None:
    gpu = fake_gpu("rtx4090")
    gpu.allocate(1536 * 2**20)
    readout = memory_readout("cuda")
    assert format_bytes(readout["allocated"]) == "1.50 GiB"
    assert list(readout)[3] == "peak reserved"


def test_mps_readout(fake_gpu) -> None:
    gpu = fake_gpu("mps")
    gpu.allocate(GiB)
    assert memory_readout("mps") == {
        "allocated (MPS tensors)": GiB,
        "driver allocated (MPS total)": GiB,
    }


def test_xpu_readout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 1)
    for name, value in (
        ("memory_allocated", 1),
        ("memory_reserved", 2),
        ("max_memory_allocated", 3),
    ):
        monkeypatch.setattr(torch.xpu, name, lambda device=None, v=value: v)
    assert memory_readout("xpu:0") == {"allocated": 1, "reserved": 2, "peak allocated": 3}


def test_track_peak_on_a_fake_gpu_is_exact(fake_gpu) -> None:
    gpu = fake_gpu("h100_sxm")
    gpu.allocate(GiB)  # held before the block: not part of its peak
    gpu.peak_allocated = 5 * GiB  # an old peak: track_peak must reset it
    with track_peak(gpu.device) as peak:
        gpu.allocate(2 * GiB)
        gpu.free(2 * GiB)
    assert peak.start == GiB and peak.peak == 3 * GiB and peak.end == GiB
    assert peak.increase == 2 * GiB
    assert "max_memory_allocated, exact" in peak.meter and "2.00 GiB" in str(peak)
    assert gpu.synchronize_calls == 2  # before reading the start and before reading the peak


def test_track_peak_on_fake_gpu_still_reads_when_the_block_raises(fake_gpu) -> None:
    gpu = fake_gpu("a100")
    with pytest.raises(torch.OutOfMemoryError):
        with track_peak("cuda") as peak:
            gpu.allocate(GiB)
            raise torch.OutOfMemoryError("CUDA out of memory")
    assert peak.increase == GiB


def test_track_peak_on_fake_mps_samples_the_allocator(fake_gpu) -> None:
    gpu = fake_gpu("mps")
    with track_peak("mps", interval=0.001) as peak:
        gpu.allocate(GiB)
        time.sleep(0.02)
    assert "MPS allocated, sampled" in peak.meter
    assert peak.increase == GiB and gpu.synchronize_calls == 2
