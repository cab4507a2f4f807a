"""Memory readouts per device, peak tracking and byte formatting (chapter 1)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from helpers.devices import resolve_device, synchronize
from helpers.units import format_bytes


def process_rss() -> int:
    """Resident set size of this whole Python process in bytes (chapter 1)."""
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss


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
    return {"process RSS (whole process, not just tensors)": process_rss()}


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
        return f"peak +{format_bytes(self.increase)} over the start ({self.meter})"


def _sampled_peak(
    read: Callable[[], int], interval: float, stop: threading.Event, out: PeakMemory
) -> None:
    """Poll `read` until `stop` is set, keeping the maximum in `out.peak` (chapter 1)."""
    while not stop.is_set():
        out.peak = max(out.peak, read())
        stop.wait(interval)


@contextmanager
def track_peak(
    device: str | torch.device | None = None, interval: float = 0.001
) -> Iterator[PeakMemory]:
    """Measure the peak memory of a block: exact on CUDA, sampled on MPS and CPU (chapter 1)."""
    device = resolve_device(device)
    result = PeakMemory()
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        result.start = result.peak = torch.cuda.memory_allocated(device)
        result.meter = "torch.cuda.max_memory_allocated, exact"
        try:
            yield result
        finally:
            synchronize(device)
            result.peak = torch.cuda.max_memory_allocated(device)
            result.end = torch.cuda.memory_allocated(device)
        return
    if device.type == "mps":
        read, result.meter = torch.mps.current_allocated_memory, "MPS allocated, sampled every ms"
    else:
        read, result.meter = process_rss, "process RSS, sampled every ms: approximate"
    result.start = result.peak = read()
    stop = threading.Event()
    sampler = threading.Thread(
        target=_sampled_peak, args=(read, interval, stop, result), daemon=True
    )
    sampler.start()
    try:
        yield result
    finally:
        synchronize(device)
        stop.set()
        sampler.join()
        result.end = read()
        result.peak = max(result.peak, result.end)
