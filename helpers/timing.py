"""The one benchmark function every chapter uses: warm-up, sync, repeats, median (chapter 1)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from torch.utils import benchmark as tbench

from helpers.devices import resolve_device, synchronize
from helpers.i18n import tr, tr_mark
from helpers.machine_state import MachineState, MachineWatch
from helpers.units import Printed, format_seconds
from helpers.validate import positive_int, positive_seconds


@dataclass
class BenchResult(Printed):
    """Median and spread of repeated timings of one function, in seconds per call (chapter 1)."""

    label: str
    median: float
    iqr: float
    times: list[float]
    number_per_run: int
    num_threads: int
    device: str
    method: str
    #: What else the machine was doing while the blocks ran (co-tenants, CPU load).
    machine: MachineState | None = None

    @property
    def repeats(self) -> int:
        """How many timed blocks the statistics come from (chapter 1)."""
        return len(self.times)

    @property
    def spread(self) -> float:
        """Relative spread: IQR divided by the median (chapter 1)."""
        return self.iqr / self.median if self.median > 0 else float("nan")

    def rate(self, work: float) -> float:
        """`work` units per second at the median time, e.g. FLOP/s or samples/s (chapter 1)."""
        return work / self.median

    def __str__(self) -> str:
        return tr(
            "{label}: median {median} per call, IQR {iqr} ({repeats} blocks of {number}, "
            "{threads} thread(s), {device}, {method})"
        ).format(
            label=self.label or tr("benchmark"),
            median=format_seconds(self.median),
            iqr=format_seconds(self.iqr),
            repeats=self.repeats,
            number=self.number_per_run,
            threads=self.num_threads,
            device=self.device,
            method=tr(self.method) if self.method else "",
        )


def _cuda_measurement(
    call: Callable[[], object], min_run_time: float, min_repeats: int, label: str
) -> tbench.Measurement:
    """Time blocks of calls between CUDA events until enough time and blocks are collected (chapter 1)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def block(number: int) -> float:
        start.record()
        for _ in range(number):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    number = max(1, int(min(0.02, min_run_time / 10) / max(block(1), 1e-7)))
    raw: list[float] = []
    while sum(raw) < min_run_time or len(raw) < min_repeats:
        raw.append(block(number))
    spec = tbench.TaskSpec(stmt=label or "fn()", setup="", num_threads=torch.get_num_threads())
    return tbench.Measurement(number_per_run=number, raw_times=raw, task_spec=spec)


def benchmark(
    fn: Callable[..., object],
    *args: object,
    device: str | torch.device | None = "cpu",
    label: str = "",
    warmup: int = 2,
    min_run_time: float = 0.2,
    min_repeats: int = 5,
    num_threads: int | None = None,
    **kwargs: object,
) -> BenchResult:
    """Time fn(*args, **kwargs) on `device`: warm-up, sync, repeats; median and IQR per call (chapter 1)."""
    if not callable(fn):
        raise TypeError(
            tr("benchmark() needs a function to call, got {type}.").format(type=type(fn).__name__)
        )
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(
            tr("warmup must be a whole number >= 0, got {value!r}.").format(value=warmup)
        )
    positive_seconds(min_run_time, "min_run_time")
    min_repeats = positive_int(min_repeats, "min_repeats")
    device = resolve_device(device)
    threads = num_threads or torch.get_num_threads()

    call = partial(fn, *args, **kwargs)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)  # warm up at the thread count that will be timed
    try:
        for _ in range(warmup):
            call()
    finally:
        torch.set_num_threads(before)
    synchronize(device)
    with MachineWatch(device, threads) as watch:
        m, method = _measure(call, device, threads, label, min_run_time, min_repeats)
    return BenchResult(
        label,
        m.median,
        m.iqr,
        list(m.times),
        m.number_per_run,
        threads,
        str(device),
        method,
        watch.state,
    )


def _measure(
    call: Callable[[], object],
    device: torch.device,
    threads: int,
    label: str,
    min_run_time: float,
    min_repeats: int,
) -> tuple[tbench.Measurement, str]:
    """Timed blocks of call() on `device`, and the method used (chapter 1)."""
    if device.type == "cuda":
        with torch.cuda.device(device):  # events on the timed GPU's stream, not the current GPU's
            m = _cuda_measurement(call, min_run_time, min_repeats, label)
        method = tr_mark("CUDA events")
    else:

        def clock() -> float:  # waits for the device's queued work first
            synchronize(device)
            return time.perf_counter()

        timer = tbench.Timer(
            stmt="call()",
            globals={"call": call},
            num_threads=threads,
            timer=clock,
            label=label or None,
        )
        m = timer.blocked_autorange(min_run_time=min_run_time)
        raw = list(m.raw_times)
        while len(raw) < min_repeats:
            raw.append(timer.timeit(m.number_per_run).raw_times[0])
        m = tbench.Measurement(m.number_per_run, raw, m.task_spec)
        method = "torch.utils.benchmark"
    return m, method
