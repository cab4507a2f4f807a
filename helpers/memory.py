"""Memory readouts per device and peak tracking (chapter 1)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import psutil
import torch

from helpers.devices import resolve_device, synchronize
from helpers.i18n import tr, tr_mark
from helpers.units import format_bytes


def process_rss() -> int:
    """Resident set size of this whole Python process in bytes (chapter 1)."""
    return psutil.Process().memory_info().rss


def memory_readout(device: str | torch.device | None = None) -> dict[str, int]:
    """What the device's allocator reports right now, in bytes; keys say what each number is (chapter 1)."""
    device = resolve_device(device)
    if device.type == "cuda":
        return {
            "allocated": torch.cuda.memory_allocated(device),
            "reserved": torch.cuda.memory_reserved(device),
            "peak allocated": torch.cuda.max_memory_allocated(device),
            "peak reserved": torch.cuda.max_memory_reserved(device),
        }
    if device.type == "mps":
        return {
            "allocated (MPS tensors)": torch.mps.current_allocated_memory(),
            "driver allocated (MPS total)": torch.mps.driver_allocated_memory(),
        }
    if device.type == "xpu":
        return {
            "allocated": torch.xpu.memory_allocated(device),
            "reserved": torch.xpu.memory_reserved(device),
            "peak allocated": torch.xpu.max_memory_allocated(device),
        }
    return {tr_mark("process RSS (whole process, not just tensors)"): process_rss()}


#: The column names chapter 5 prints memory_readout() and process_rss() readings under: one word
#: each, so no notebook catalog holds them; format_table translates them (and the CPU's key)
#: through these marks.
READOUT_COLUMNS = (tr_mark("counter"), tr_mark("value"), tr_mark("tensor"))


@dataclass
class PeakMemory:
    """Result of track_peak: bytes at the start, the peak, and what measured them (chapter 1)."""

    start: int = 0
    peak: int = 0
    end: int = 0
    meter: str = ""

    @property
    def increase(self) -> int:
        """Peak minus the starting value: what the block needed on top (chapter 1)."""
        return self.peak - self.start

    def __str__(self) -> str:
        meter = tr(self.meter) if self.meter else self.meter  # marked where track_peak sets it
        return tr("peak +{increase} over the start ({meter})").format(
            increase=format_bytes(self.increase), meter=meter
        )


@contextmanager
def track_peak(
    device: str | torch.device | None = None, interval: float = 0.001
) -> Iterator[PeakMemory]:
    """Measure the peak memory of a block: exact on CUDA, sampled on MPS and CPU (chapter 1)."""
    device = resolve_device(device)
    synchronize(device)
    exact = device.type == "cuda"
    if exact:
        torch.cuda.reset_peak_memory_stats(device)
        read = partial(torch.cuda.memory_allocated, device)
        meter = tr_mark("torch.cuda.max_memory_allocated, exact")
    elif device.type == "mps":
        read, meter = torch.mps.current_allocated_memory, tr_mark("MPS allocated, sampled every ms")
    else:
        read, meter = process_rss, tr_mark("process RSS, sampled every ms: approximate")
    start = read()
    result = PeakMemory(start=start, peak=start, meter=meter)
    stop = threading.Event()

    def sample() -> None:  # keeps the largest reading until stopped
        while not stop.is_set():
            result.peak = max(result.peak, read())
            stop.wait(interval)

    sampler = threading.Thread(target=sample, daemon=True)
    if not exact:
        sampler.start()
    try:
        yield result
    finally:
        synchronize(device)
        stop.set()
        if not exact:
            sampler.join()
        result.end = read()
        peak = torch.cuda.max_memory_allocated(device) if exact else result.peak
        result.peak = max(peak, result.end)
