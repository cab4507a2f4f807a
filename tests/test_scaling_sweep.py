"""Chapter 4's scaling experiment (helpers/scaling_sweep.py): one launch measures every size.

Launches use gloo processes on the CPU; each costs a few seconds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure

from helpers import scaling_sweep
from helpers.launch import LaunchError, LaunchResult, max_processes
from helpers.scaling_sweep import (
    measure_scaling,
    plot_scaling,
    run_scaling,
    scaling_controls,
    scaling_point,
)
from helpers.scripts.common import READY_MARKER
from helpers.scripts.scaling import parse_sizes
from helpers.widgets import interactive_plot


def test_scaling_widget_runs_and_plots() -> None:
    controls = scaling_controls(max_nproc=2)
    controls["steps"].value = 5
    controls["width"].value = 64
    box = interactive_plot(run_scaling, plot_scaling, controls)
    box.run_button.click()
    result = box.last_result
    assert result is not None, "the Run button failed; see the widget output"
    assert result.column("processes") == [1, 2]
    assert result.rows[0]["efficiency"] == pytest.approx(1.0)
    assert all(r["samples/s"] > 0 for r in result.rows)
    assert 0 < result.startup_s < result.launch_s  # one launch measured both sizes
    assert "one launch of 2 rank(s)" in str(result)
    assert isinstance(plot_scaling(result), Figure)
    with pytest.raises(ValueError, match="max_processes"):
        run_scaling(max_processes=0)


def test_scaling_point_is_one_launch_of_one_size() -> None:
    row = scaling_point(1, backend="gloo", per_rank_batch=8, width=16, steps=2)
    assert row["processes"] == 1 and row["global batch"] == 8 and row["mode"] == "ddp"
    assert row["threads/rank"] == 1 and row["samples/s"] > 0 and row["start-up s"] > 0


@pytest.mark.parametrize("nprocs", [(), (1, "2"), (1, True)])
def test_measure_scaling_needs_whole_numbers(nprocs: tuple) -> None:
    with pytest.raises(ValueError, match="nprocs must be whole numbers"):
        measure_scaling(nprocs)


def test_measure_scaling_refuses_more_ranks_than_allowed() -> None:
    too_many = max_processes("gloo") + 1
    with pytest.raises(LaunchError, match=f"nproc={too_many} is more than"):
        measure_scaling((1, too_many), backend="gloo")


def test_scaling_script_sizes() -> None:
    assert parse_sizes(None, 4) == [4] and parse_sizes("1,2,4", 4) == [1, 2, 4]
    for bad in ("0,2", "1,5"):
        with pytest.raises(SystemExit, match="between 1 and 4 ranks"):
            parse_sizes(bad, 4)


def test_scaling_point_passes_mode_threads_and_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """No torchrun: the launch is faked, to read the command line it was given."""
    calls = []

    def fake_launch(script: str, nproc: int, args: list, **kw: object) -> LaunchResult:
        calls.append((script, nproc, [str(a) for a in args], kw))
        out = Path(args[args.index("--out") + 1])
        run = {"world_size": 1, "mode": "dataparallel", "threads": 2, "global_batch": 8}
        run |= {"step_median_s": 0.01, "step_iqr_s": 0.001, "samples_per_s": 800.0}
        torch.save({"runs": [run]}, out / "rank0.pt")
        return LaunchResult(["torchrun"], nproc, "gloo", 0, [READY_MARKER], [0.5], seconds=2.0)

    monkeypatch.setattr(scaling_sweep, "launch", fake_launch)
    row = scaling_point(1, backend="gloo", threads=2, mode="dataparallel", timeout=30, steps=3)
    ((script, nproc, args, kw),) = calls
    assert (script, nproc, kw["threads"], kw["timeout"]) == ("scaling", 1, 2, 30)
    flags = dict(zip(args[::2], args[1::2]))
    assert flags["--mode"] == "dataparallel" and flags["--sizes"] == "1"
    assert flags["--steps"] == "3" and flags["--pg-timeout"] == "30"
    assert row["mode"] == "dataparallel" and row["step ms"] == pytest.approx(10.0)
    assert row["start-up s"] == 0.5 and row["samples/s"] == 800.0
