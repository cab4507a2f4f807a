"""NVML readouts on fake GPUs: chapter 1's snapshot (nvml_snapshot) and chapter 6's sampler."""

from __future__ import annotations

import threading
import time

import pytest

from helpers.nvml_snapshot import GpuSample, NvmlUnavailable, format_snapshot, nvml_snapshot
from helpers.sampler import Monitor, MonitorUnavailable, NvmlSampler, nvml_sampler


@pytest.mark.parametrize("kind", ["h100_sxm", "a100", "t4", "rtx4090"])
def test_snapshot_reads_every_nvidia_gpu(fake_gpu, kind: str) -> None:
    gpu = fake_gpu(kind, count=2)
    gpu.nvml.utilization, gpu.nvml.temperature_c = 87, 61
    snap = nvml_snapshot()
    assert isinstance(snap, list) and [s.index for s in snap] == [0, 1]
    s = snap[0]
    assert isinstance(s, GpuSample) and s.name == gpu.spec.name
    assert s.utilization_pct == 87 and s.temperature_c == 61
    assert s.memory_total == gpu.spec.nvml_total and s.memory_used == 512 * 2**20
    assert s.power_w == gpu.spec.idle_power_mw / 1000
    assert gpu.nvml.init_count == 0  # every nvmlInit was matched by an nvmlShutdown
    text = format_snapshot(snap)
    assert gpu.spec.name[:29] in text and "87%" in text and "61 C" in text
    assert len(text.splitlines()) == 3


def test_h100_snapshot_reads_like_the_real_run(fake_gpu) -> None:
    """The H100 run printed '79.65 GiB' total and '117 W' idle (gpu-runs/h100-2026-11-23)."""
    gpu = fake_gpu("h100_sxm")
    gpu.nvml.memory_used = int(2.16 * 2**30)
    text = format_snapshot(nvml_snapshot())
    assert "2.16 GiB / 79.65 GiB" in text and "117 W" in text and "34 C" in text


def test_readings_a_gpu_does_not_support_are_none(fake_gpu) -> None:
    gpu = fake_gpu("t4")
    gpu.nvml.unsupported = {"power", "temperature", "utilization", "memory"}
    (s,) = nvml_snapshot()
    assert s.name == "Tesla T4"
    assert (s.power_w, s.temperature_c, s.utilization_pct, s.memory_used) == (None,) * 4
    assert format_snapshot([s]).count("n/a") >= 4
    assert gpu.nvml.init_count == 0


@pytest.mark.parametrize("kind", ["mi300x", "mps"])
def test_no_nvidia_driver_is_a_reason_not_an_error(fake_gpu, kind: str) -> None:
    gpu = fake_gpu(kind)
    snap = nvml_snapshot()
    assert isinstance(snap, NvmlUnavailable) and not snap
    assert "no NVIDIA driver could be loaded" in snap.reason
    assert "LibraryNotFound" in snap.reason
    assert format_snapshot(snap).startswith("NVML unavailable: no NVIDIA driver")
    assert gpu.nvml.init_calls == 1 and gpu.nvml.init_count == 0


def test_nvml_failing_while_reading_is_reported(fake_gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = fake_gpu("a100")

    def gone(handle: int) -> str:
        raise gpu.nvml.NVMLError_InvalidArgument()

    monkeypatch.setattr(gpu.nvml, "nvmlDeviceGetName", gone)
    snap = nvml_snapshot()
    assert isinstance(snap, NvmlUnavailable) and "NVML failed while reading" in snap.reason
    assert gpu.nvml.init_count == 0  # shut down even after the failure


def test_nvml_without_gpus(fake_gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = fake_gpu("a100")
    monkeypatch.setattr(gpu.nvml, "nvmlDeviceGetCount", lambda: 0)
    assert nvml_snapshot() == []
    assert format_snapshot([]) == "NVML works but reports no GPUs."
    with pytest.raises(MonitorUnavailable, match="reports no GPUs"):
        nvml_sampler()


def test_nvml_sampler_on_two_fake_gpus(fake_gpu) -> None:
    gpu = fake_gpu("h100_sxm", count=2)
    gpu.nvml.utilization = 95
    sampler = nvml_sampler()
    assert isinstance(sampler, NvmlSampler)
    assert gpu.nvml.init_count == 1  # held open for the run
    with Monitor(sampler, interval=0.01) as mon:
        time.sleep(0.05)
    assert gpu.nvml.init_count == 0  # released by stop()
    first = mon.samples[0].values
    assert first["GPU 1 utilisation (%)"] == 95.0
    assert first["GPU 0 memory used (GiB)"] == pytest.approx(0.5)
    summary = mon.summary()
    assert summary["GPU 0 utilisation (%)"]["max"] == 95.0
    assert not [t for t in threading.enumerate() if t.name == "course-monitor"]


def test_nvml_sampler_skips_readings_the_gpu_lacks(fake_gpu) -> None:
    gpu = fake_gpu("t4")
    gpu.nvml.unsupported = {"utilization", "memory"}
    sampler = nvml_sampler()
    try:
        assert sampler() == {}
    finally:
        sampler.close()
    sampler.close()  # twice is safe
    assert gpu.nvml.init_count == 0


@pytest.mark.parametrize("kind", ["mi300x", "mps"])
def test_nvml_sampler_without_driver_points_to_process_sampler(fake_gpu, kind: str) -> None:
    fake_gpu(kind)
    with pytest.raises(MonitorUnavailable, match="no NVIDIA driver.*process_sampler"):
        nvml_sampler()


def test_nvml_going_away_mid_run_is_reported(fake_gpu) -> None:
    gpu = fake_gpu("a100")
    mon = Monitor(nvml_sampler(), interval=0.01).start()
    gpu.nvml.driver_present = False  # the next nvmlInit fails, as after a driver crash
    time.sleep(0.05)
    with pytest.raises(MonitorUnavailable, match="NVML stopped answering"):
        mon.stop()
    assert not mon.running and gpu.nvml.init_count == 0
