"""Chapter 6, section 1: the timing table's verdicts carry the state of the cells that timed its rows.

The rows compared by the two verdicts are timed in two cells (20 readings with and without a
sync; the Timer with and without num_threads), not in the cell that runs
helpers.timing.benchmark. Each of those cells watches the machine (MachineWatch), and the
verdicts use the merged state: a burst of load during the readings makes the verdict
inconclusive even when the benchmark's own window was quiet.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from notebook_code import cell_containing

from helpers import machine_state
from helpers.devices import synchronize
from helpers.machine_state import GpuTenants, MachineState
from helpers.tables import print_table

CHAPTER = Path(__file__).resolve().parents[1] / "notebooks" / "06_profiling.ipynb"
QUIET = MachineState("cpu", 1, 2, 2, 0.1, GpuTenants(None), others_cores=0.0, window_s=1.0)
BUSY = MachineState("cpu", 1, 2, 2, 3.0, GpuTenants(None), others_cores=1.9, window_s=1.0)
#: The cells of section 1 that time the rows, build the table and the verdicts, in order.
MARKERS = (
    "def reading(sync: bool)",
    "unsynced = [reading(sync=False)",
    "timer_threads.timeit(calls)",
    "def spread_row(",
    "readings = {",
    "timing_rows = [spread_row(",
    "sync_verdict = compare_rows(",
)


@pytest.mark.parametrize("busy_cell", ["readings", "timer", "neither"])
def test_the_verdicts_carry_the_state_of_the_cells_that_timed_their_rows(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], busy_cell: str
) -> None:
    watched: list[str] = []

    class Watch:
        """MachineWatch, scripted: the readings' window first, then the Timer's."""

        def __init__(self, device: object, threads: object = None) -> None:
            self.name = ("readings", "timer")[len(watched)]
            watched.append(self.name)
            self.state = None

        def __enter__(self) -> Watch:
            return self

        def __exit__(self, *exc: object) -> None:
            self.state = BUSY if self.name == busy_cell else QUIET

    monkeypatch.setattr(machine_state, "MachineWatch", Watch)
    n = 32
    namespace = {
        "torch": torch, "time": time, "statistics": statistics, "print_table": print_table,
        "synchronize": synchronize, "device": torch.device("cpu"), "ON_GPU": False,
        "a": torch.randn(n, n), "b": torch.randn(n, n), "matmul_flops": 2 * n**3,
        "first_call": 1e-3, "cuda_event_times": [],
        "helper": SimpleNamespace(median=1e-3, times=[1e-3] * 5, machine=QUIET),
    }  # fmt: skip
    for marker in MARKERS:
        exec(cell_containing(CHAPTER, marker), namespace)
    assert watched == ["readings", "timer"]
    out = capsys.readouterr().out
    state = namespace["timing_state"]
    assert str(state) in out  # printed under the table
    for verdict in (namespace["sync_verdict"], namespace["timer_verdict"]):
        assert verdict.startswith("inconclusive, CPU loaded") is (busy_cell != "neither")
    assert state.quiet is (busy_cell == "neither")
