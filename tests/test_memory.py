"""helpers.memory: readouts, peak tracking, byte formatting."""

from __future__ import annotations

import pytest
import torch

from helpers.memory import PeakMemory, memory_readout, track_peak
from helpers.units import format_bytes


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (20 * 2**20, "20.00 MiB"),
        (3 * 2**30, "3.00 GiB"),
        (-2048, "-2.00 KiB"),
        (2**41, "2.00 TiB"),
        (2**50, "1.00 PiB"),
        (2**60, "1.00 EiB"),  # chapter 5's impossible allocation, as its markdown says it
        (2**70, "1024.00 EiB"),
    ],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_cpu_readout_is_labelled_as_process_rss() -> None:
    readout = memory_readout("cpu")
    (key,) = readout
    assert "process RSS" in key and readout[key] > 0


def test_track_peak_sees_a_big_allocation_on_cpu() -> None:
    with track_peak("cpu") as peak:
        x = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
        x += 1
        del x
    assert isinstance(peak, PeakMemory)
    assert "RSS" in peak.meter and "approximate" in peak.meter
    assert peak.increase > 16 * 2**20, str(peak)


def test_track_peak_stops_its_sampler_thread() -> None:
    import threading

    before = threading.active_count()
    with track_peak("cpu"):
        pass
    assert threading.active_count() == before
