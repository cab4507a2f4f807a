"""A background thread that samples the GPUs (or this process) while your code runs (chapter 6)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from helpers.i18n import tr, tr_mark
from helpers.nvml_snapshot import NvmlUnavailable, nvml_snapshot
from helpers.units import GiB


class MonitorUnavailable(RuntimeError):
    """The requested readings cannot be taken on this machine; the message says why (chapter 6)."""


@dataclass
class Sample:
    """One reading, `t` seconds after the monitor started (chapter 6)."""

    t: float
    values: dict[str, float]


class NvmlSampler:
    """Utilisation and memory of every NVIDIA GPU via nvml_snapshot, NVML kept open until close() (chapter 6)."""

    @property
    def label(self) -> str:
        """What samples, in the learner's language (chapter 6)."""
        return tr("NVML (GPU)")

    def __init__(self) -> None:
        first = nvml_snapshot()
        if isinstance(first, NvmlUnavailable):
            raise MonitorUnavailable(
                tr(
                    "NVML {why}. GPU utilisation can only be sampled on a machine with an "
                    "NVIDIA driver; use process_sampler() to watch the CPU side instead."
                ).format(why=first)
            )
        if not first:
            raise MonitorUnavailable(
                tr("NVML works but reports no GPUs, so there is nothing to sample.")
            )
        import pynvml

        # NVML counts nvmlInit calls: one held open makes each snapshot's init/shutdown cheap.
        pynvml.nvmlInit()
        self._pynvml: object | None = pynvml

    def __call__(self) -> dict[str, float]:
        snapshot = nvml_snapshot()
        if isinstance(snapshot, NvmlUnavailable):
            raise MonitorUnavailable(tr("NVML stopped answering: {why}").format(why=snapshot))
        values: dict[str, float] = {}  # each quantity named in the learner's language
        for s in snapshot:
            if s.utilization_pct is not None:
                name = tr("GPU {index} utilisation (%)").format(index=s.index)
                values[name] = float(s.utilization_pct)
            if s.memory_used is not None:
                name = tr("GPU {index} memory used (GiB)").format(index=s.index)
                values[name] = s.memory_used / GiB
        return values

    def close(self) -> None:
        """Release the NVML reference taken in __init__; safe to call twice (chapter 6)."""
        if self._pynvml is not None:
            pynvml, self._pynvml = self._pynvml, None
            pynvml.nvmlShutdown()  # type: ignore[attr-defined]


class ProcessSampler:
    """CPU use (%, 100 = one core) and resident memory of this Python process, via psutil (chapter 6)."""

    @property
    def label(self) -> str:
        """What samples, in the learner's language (chapter 6)."""
        return tr("psutil (this process, CPU side)")

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()  # this process
        self._process.cpu_percent(interval=None)  # the first call only starts the clock

    def __call__(self) -> dict[str, float]:
        return {  # each quantity named in the learner's language
            tr("process CPU (%)"): float(self._process.cpu_percent(interval=None)),
            tr("process RSS (GiB)"): self._process.memory_info().rss / GiB,
        }


#: The names the notebook calls; nvml_sampler() raises MonitorUnavailable saying why it cannot.
nvml_sampler = NvmlSampler
process_sampler = ProcessSampler


@dataclass
class Monitor:
    """Call `sampler` every `interval` seconds in a background thread between start() and stop() (chapter 6)."""

    sampler: Callable[[], dict[str, float]]  # one reading: {"quantity (unit)": value}
    interval: float = 0.1
    samples: list[Sample] = field(default_factory=list, init=False)
    error: BaseException | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if not callable(self.sampler):
            raise TypeError(
                tr("Monitor needs a sampler function returning a dict, got {type}.").format(
                    type=type(self.sampler).__name__
                )
            )
        number = isinstance(self.interval, (int, float)) and not isinstance(self.interval, bool)
        if not number or not 0 < self.interval < math.inf:
            raise ValueError(
                tr(
                    "interval must be a number of seconds > 0, got {interval!r}; 0.1 s suits "
                    "most runs."
                ).format(interval=self.interval)
            )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._t_end: float | None = None
        self.label = getattr(self.sampler, "label", getattr(self.sampler, "__name__", "sampler"))

    @property
    def running(self) -> bool:
        """True while the sampling thread is alive (chapter 6)."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def duration(self) -> float:
        """Seconds from start() to stop() (or to now while running); 0.0 before start (chapter 6)."""
        if self._thread is None and self._t_end is None:
            return 0.0
        end = self._t_end if self._t_end is not None else time.perf_counter()
        return end - self._t0

    def _take(self) -> None:
        """Append one sample; remember the first error instead of dying silently (chapter 6)."""
        try:
            self.samples.append(Sample(time.perf_counter() - self._t0, dict(self.sampler())))
        except Exception as exc:  # reported by stop(), never lost in the thread
            if self.error is None:
                self.error = exc
            self._stop.set()

    def _loop(self) -> None:
        """The thread body: sample, then wait `interval` or until stop() (chapter 6)."""
        while not self._stop.wait(self.interval):
            self._take()

    def start(self) -> Monitor:
        """Take a first sample and start the sampling thread; returns self (chapter 6)."""
        if self.running:
            raise RuntimeError(
                tr("This monitor is already running; call stop() before starting it again.")
            )
        self.samples, self.error, self._t_end = [], None, None
        self._stop.clear()
        self._t0 = time.perf_counter()
        self._take()
        if self.error is not None:
            self._release()
            raise MonitorUnavailable(
                tr(
                    "The sampler failed on its first reading ({type}: {error}); nothing was "
                    "started."
                ).format(type=type(self.error).__name__, error=self.error)
            ) from self.error
        self._thread = threading.Thread(target=self._loop, name="course-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Monitor:
        """Stop and join the thread, take a last sample, release the sampler; safe to call twice (chapter 6)."""
        if self._thread is None:
            return self
        self._stop.set()
        self._thread.join(timeout=max(5.0, 10 * self.interval))
        if self._thread.is_alive():
            raise RuntimeError(
                tr(
                    "The sampling thread did not stop: the sampler function is blocking. "
                    "Make it return quickly (it runs every interval)."
                )
            )
        self._thread = None
        if self.error is None:
            self._take()
        self._t_end = time.perf_counter()
        self._release()
        if self.error is not None:
            raise MonitorUnavailable(
                tr(
                    "The sampler failed during the run ({type}: {error}); "
                    "kept the {n} sample(s) taken before."
                ).format(type=type(self.error).__name__, error=self.error, n=len(self.samples))
            ) from self.error
        return self

    def _release(self) -> None:
        """Let the sampler free what it holds (NVML), if it has a close() (chapter 6)."""
        close = getattr(self.sampler, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        try:
            self.stop()
        except MonitorUnavailable:
            if exc_info[0] is None:
                raise  # otherwise the block's own exception matters more

    def series(self) -> dict[str, list[float]]:
        """Every quantity sampled, as a list in time order (missing readings left out) (chapter 6)."""
        names = list(dict.fromkeys(k for s in self.samples for k in s.values))
        return {n: [s.values[n] for s in self.samples if n in s.values] for n in names}

    def summary(self) -> dict[str, dict[str, float]]:
        """Per quantity: mean, max and number of samples; safe for a zero-length run (chapter 6).

        The keys "mean", "max" and "samples" stay as they are (a printed table translates them).
        """
        return {
            name: {"mean": sum(v) / len(v), "max": max(v), "samples": float(len(v))}
            for name, v in self.series().items()
            if v
        }


#: Monitor.summary()'s keys, for the catalog (format_table prints them translated).
_SUMMARY_COLUMNS = (tr_mark("mean"), tr_mark("max"), tr_mark("samples"))


def plot_samples(monitor: Monitor, title: str = "") -> Figure:
    """One panel per quantity the monitor sampled, against time (chapter 6)."""
    series = monitor.series()
    if not series:
        raise ValueError(
            tr("The monitor has no samples to plot: run it (start/stop or `with`) first.")
        )
    fig, axes = plt.subplots(len(series), 1, figsize=(6.4, 1.9 * len(series) + 0.6), sharex=True)
    axes = [axes] if len(series) == 1 else list(axes)
    for ax, (name, values) in zip(axes, series.items()):
        ax.plot([s.t for s in monitor.samples if name in s.values], values, marker=".", lw=1)
        ax.set_ylabel(name, fontsize=8)
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel(tr("seconds since start"))
    axes[0].set_title(
        title or tr("{label}: {n} samples").format(label=monitor.label, n=len(monitor.samples))
    )
    fig.tight_layout()
    return fig
