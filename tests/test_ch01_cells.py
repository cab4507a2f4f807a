"""Chapter 1's cells say only what they measure (review of 2026-11-27, items 4 and 8).

- The myth cell (section 8) said "8192: a size not used above, so the first call is cold", but
  on CUDA the size sweep and the achievable-rate search had both timed 8192 already. Its size
  must be one that no earlier cell times, on any device.
- On a CPU the "create on the device" cell's first two rows time the same work (`.to(cpu)`
  returns the same tensor), so its verdict between them can only show run-to-run drift; the
  cell says so instead of calling the gap noise while printing a verdict that may be conclusive.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from notebook_code import cell_containing, code_cells

from helpers.machine_state import GpuTenants, MachineState
from helpers.matmul import MAMF_SHAPES, _sizes, default_size_range
from helpers.tables import print_table
from helpers.timing import BenchResult

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "01_devices.ipynb"
MYTH = "import time\n\nfrom helpers.devices import synchronize"
ASSIGNED_N = re.compile(r"^n = (.+?)(?:\s+#.*)?$", re.MULTILINE)
#: device type -> the fake GPU that provides it (None: the CPU itself)
FAKES = {"cpu": None, "cuda": "h100_sxm", "mps": "mps"}


def n_for(source: str, kind: str) -> list[int]:
    """The values of every `n = ...` line of a cell, evaluated for a device of type `kind`."""
    device = torch.device(kind)
    return [eval(expr, {"device": device}) for expr in ASSIGNED_N.findall(source)]  # noqa: S307


def sizes_timed_before_the_myth(kind: str) -> set[int]:
    """Every matrix dimension an earlier cell of chapter 1 times on a device of type `kind`."""
    cells = code_cells(NOTEBOOK)
    earlier = cells[: cells.index(cell_containing(NOTEBOOK, MYTH))]
    sizes = set(_sizes(None, default_size_range(kind)))  # section 2's sweep
    sizes |= {d for shape in MAMF_SHAPES.get(kind, MAMF_SHAPES["cpu"]) for d in shape}
    for source in earlier:
        sizes |= set(n_for(source, kind))  # the dtype table's n, the creation cell's n
        for lo, hi in re.findall(r"size_range=\((\d+), (\d+)\)", source):  # the speed-up
            sizes |= set(_sizes(None, (int(lo), int(hi))))
        for listed in re.findall(r"run_sweep\(\w+, \[([\d, ]+)\]", source):  # threads sweep
            sizes |= {int(v) for v in listed.split(",")}
    return sizes


@pytest.mark.parametrize("kind", FAKES)
def test_the_myth_cell_times_a_size_no_earlier_cell_times(fake_gpu, kind: str) -> None:  # noqa: ANN001
    if FAKES[kind]:
        fake_gpu(FAKES[kind])
    (n,) = n_for(cell_containing(NOTEBOOK, MYTH), kind)
    before = sizes_timed_before_the_myth(kind)
    assert n not in before, f"{kind}: n = {n} was timed above ({sorted(before)})"
    if kind == "cuda":
        assert 8192 in before, "the old size, which the sweep and the MAMF search time on CUDA"


def test_on_a_cpu_the_creation_verdict_is_called_drift(capsys: pytest.CaptureFixture) -> None:
    """Two timings of the same work that differ beyond their spreads: the line says what that is."""
    quiet = MachineState("cpu", 1, 2, 2, 0.5, GpuTenants(None, note="not read on cpu"), 0.0, 1.0)
    medians = [2e-3, 3e-3, 2e-3, 1e-6]  # the first two rows: one way 1.5x the other, tight IQRs
    timings = {
        how: BenchResult("", m, m * 0.01, [m] * 5, 1, 1, "cpu", "stub", quiet)
        for how, m in zip(
            [
                "torch.randn(..., device=device)",
                "torch.randn(...).to(device)",
                "half 1: torch.randn(...) on the CPU",
                "half 2: ready.to(device)",
            ],
            medians,
        )
    }
    cell = cell_containing(NOTEBOOK, "direct, via_cpu = list(timings)[:2]")
    ns = {"timings": timings, "print_table": print_table, "merge_states": _merge}
    exec(cell, {**ns, "device": torch.device("cpu")})
    out = capsys.readouterr().out
    assert "the same work on a CPU, so this is run-to-run drift, not a difference of ways:" in out
    assert "1.50x faster" in out
    exec(cell, {**ns, "device": torch.device("cuda")})  # on a GPU the two ways differ
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("here, torch.randn(..., device=device) was 1.50x faster")


def _merge(states: list[MachineState]) -> MachineState:
    return states[0]
