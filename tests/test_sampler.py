"""helpers.sampler: the background sampler starts, stops cleanly, and says why NVML is missing."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import matplotlib.pyplot as plt
import pytest

import helpers.sampler as sampler_module
from helpers.nvml_snapshot import GpuSample, NvmlUnavailable
from helpers.sampler import Monitor, MonitorUnavailable, nvml_sampler, plot_samples, process_sampler


def counting_sampler():
    calls = {"n": 0}

    def sample() -> dict[str, float]:
        calls["n"] += 1
        return {"calls": float(calls["n"])}

    return sample, calls


def monitor_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "course-monitor"]


def test_samples_in_the_background_and_stops_cleanly() -> None:
    sample, calls = counting_sampler()
    before = threading.active_count()
    mon = Monitor(sample, interval=0.01).start()
    assert mon.running
    time.sleep(0.1)
    mon.stop()
    assert not mon.running and not monitor_threads()
    assert threading.active_count() == before
    assert len(mon.samples) >= 3 and calls["n"] == len(mon.samples)
    times = [s.t for s in mon.samples]
    assert times == sorted(times) and mon.duration >= 0.1


def test_stop_twice_and_stop_before_start_are_safe() -> None:
    sample, _ = counting_sampler()
    mon = Monitor(sample, interval=0.01)
    mon.stop()  # never started: nothing to do
    assert mon.samples == [] and mon.duration == 0.0
    mon.start()
    mon.stop()
    n = len(mon.samples)
    mon.stop()
    assert len(mon.samples) == n and not mon.running


def test_zero_duration_still_has_samples_and_a_summary() -> None:
    sample, _ = counting_sampler()
    mon = Monitor(sample, interval=10.0)
    with mon:
        pass
    assert len(mon.samples) == 2  # the first and the last reading
    assert mon.duration >= 0.0
    summary = mon.summary()
    assert summary["calls"]["samples"] == 2.0 and summary["calls"]["max"] == 2.0


def test_empty_monitor_summary_and_plot() -> None:
    mon = Monitor(lambda: {}, interval=0.01)
    with mon:
        pass
    assert mon.summary() == {}
    with pytest.raises(ValueError, match="no samples to plot"):
        plot_samples(Monitor(lambda: {"x": 1.0}))


def test_context_manager_stops_when_the_block_raises() -> None:
    sample, _ = counting_sampler()
    mon = Monitor(sample, interval=0.01)
    with pytest.raises(KeyError):
        with mon:
            raise KeyError("training failed")
    assert not mon.running and not monitor_threads()


def test_a_failing_sampler_is_reported_not_lost() -> None:
    calls = {"n": 0}

    def flaky() -> dict[str, float]:
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError("driver went away")
        return {"x": 1.0}

    mon = Monitor(flaky, interval=0.005).start()
    time.sleep(0.1)
    with pytest.raises(MonitorUnavailable, match="driver went away.*kept the 2 sample"):
        mon.stop()
    assert not mon.running and not monitor_threads()
    mon.stop()  # still safe


def test_a_sampler_failing_at_once_starts_nothing() -> None:
    closed = []

    class Broken:
        def __call__(self) -> dict[str, float]:
            raise OSError("no such device")

        def close(self) -> None:
            closed.append(True)

    with pytest.raises(MonitorUnavailable, match="first reading.*no such device"):
        Monitor(Broken()).start()
    assert closed == [True] and not monitor_threads()


def test_start_while_running_is_refused() -> None:
    sample, _ = counting_sampler()
    with Monitor(sample, interval=0.01) as mon:
        with pytest.raises(RuntimeError, match="already running"):
            mon.start()


@pytest.mark.parametrize("interval", [0, -1, float("nan"), float("inf"), "fast", True])
def test_bad_interval_is_rejected(interval) -> None:
    with pytest.raises(ValueError, match="interval must be a number of seconds > 0"):
        Monitor(lambda: {}, interval=interval)


def test_sampler_must_be_callable() -> None:
    with pytest.raises(TypeError, match="needs a sampler function"):
        Monitor({"gpu": 1})


def test_no_nvml_gives_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    reason = NvmlUnavailable("no NVIDIA driver could be loaded (NVMLError_LibraryNotFound)")
    monkeypatch.setattr(sampler_module, "nvml_snapshot", lambda: reason)
    with pytest.raises(MonitorUnavailable, match="no NVIDIA driver.*process_sampler"):
        nvml_sampler()


def test_nvml_without_gpus_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampler_module, "nvml_snapshot", lambda: [])
    with pytest.raises(MonitorUnavailable, match="no GPUs"):
        nvml_sampler()


def test_nvml_sampler_reads_every_gpu_and_releases_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = [
        GpuSample(0, "Fake H100", 87, 40 * 2**30, 80 * 2**30, 60, 500.0),
        GpuSample(1, "Fake H100", None, None, 80 * 2**30, None, None),
    ]
    monkeypatch.setattr(sampler_module, "nvml_snapshot", lambda: gpus)
    state = {"init": 0, "shutdown": 0}

    class FakePynvml:
        @staticmethod
        def nvmlInit() -> None:
            state["init"] += 1

        @staticmethod
        def nvmlShutdown() -> None:
            state["shutdown"] += 1

    monkeypatch.setitem(__import__("sys").modules, "pynvml", FakePynvml)
    sampler = nvml_sampler()
    with Monitor(sampler, interval=0.01) as mon:
        time.sleep(0.03)
    assert mon.samples[0].values == {
        "GPU 0 utilisation (%)": 87.0,
        "GPU 0 memory used (GiB)": 40.0,
    }
    assert state == {"init": 1, "shutdown": 1}  # held once for the run, released at stop
    sampler.close()  # twice is safe
    assert state["shutdown"] == 1


def test_process_sampler_and_plot() -> None:
    with Monitor(process_sampler(), interval=0.01) as mon:
        sum(i * i for i in range(200_000))
    series = mon.series()
    assert set(series) == {"process CPU (%)", "process RSS (GiB)"}
    assert all(v > 0 for v in series["process RSS (GiB)"])
    fig = plot_samples(mon, title="test")
    assert len(fig.axes) == 2 and fig.axes[0].get_title() == "test"
    plt.close(fig)


def test_a_blocking_sampler_is_reported_at_stop() -> None:
    release = threading.Event()
    calls = {"n": 0}

    def blocking() -> dict[str, float]:
        calls["n"] += 1
        if calls["n"] > 1:  # the first reading (in start) returns at once
            release.wait(30)
        return {"x": 1.0}

    mon = Monitor(blocking, interval=0.01).start()
    time.sleep(0.05)
    try:
        with pytest.raises(RuntimeError, match="did not stop: the sampler function is blocking"):
            mon.stop()
    finally:
        release.set()
        if mon._thread is not None:
            mon._thread.join(5)  # let the released thread end before other tests count threads


def _failing_after_one_reading() -> Callable[[], dict[str, float]]:
    """A sampler whose first reading works and every later one raises (the driver went away)."""
    calls = {"n": 0}

    def sample() -> dict[str, float]:
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError("driver went away")
        return {"x": 1.0}

    return sample


def test_a_failed_sampler_does_not_hide_the_blocks_own_error() -> None:
    failing_later = _failing_after_one_reading()
    with pytest.raises(KeyError, match="training failed"):
        with Monitor(failing_later, interval=0.005):
            time.sleep(0.05)
            raise KeyError("training failed")
    assert not monitor_threads()


def test_a_failed_sampler_is_reported_when_the_block_succeeds() -> None:
    failing_later = _failing_after_one_reading()
    with pytest.raises(MonitorUnavailable, match="driver went away"):
        with Monitor(failing_later, interval=0.005):
            time.sleep(0.05)
    assert not monitor_threads()
