"""The scaling experiment: throughput against the number of processes, in one launch (chapter 4)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from helpers.i18n import tr, tr_mark
from helpers.launch import as_flags, check_backend, check_nproc, launch, new_run_dir, read_results
from helpers.machine_state import MachineState, MachineWatch
from helpers.sweeps import SweepResult
from helpers.validate import positive_int


@dataclass
class ScalingResult(SweepResult):
    """A scaling sweep's rows, and the one launch that measured them all (chapter 4)."""

    startup_s: float = float("nan")
    launch_s: float = float("nan")
    #: What else the machine was doing during the launch (the ranks' own work excluded).
    machine: MachineState | None = None

    def __str__(self) -> str:
        text = f"{super().__str__()}\n" + tr(
            "one launch of {n} rank(s): {startup:.1f} s of start-up in {launch:.1f} s"
        ).format(
            n=max(self.column("processes"), default=0),
            startup=self.startup_s,
            launch=self.launch_s,
        )
        return text if self.machine is None else f"{text}\n{self.machine}"


def scaling_point(
    nproc: int,
    *,
    backend: str | None = None,
    per_rank_batch: int = 256,
    width: int = 256,
    steps: int = 20,
    threads: int = 1,
    mode: str = "ddp",
    timeout: float = 120.0,
) -> dict[str, Any]:
    """One launch of scaling.py: step time and throughput at `nproc` ranks, `threads` each (chapter 4)."""
    size = {"per_rank_batch": per_rank_batch, "width": width, "steps": steps, "threads": threads}
    result = measure_scaling([nproc], backend=backend, timeout=timeout, mode=mode, **size)
    return {**result.rows[0], "start-up s": result.startup_s, "machine": result.machine}


def measure_scaling(
    nprocs: Sequence[int] = (1, 2),
    *,
    backend: str | None = None,
    timeout: float = 120.0,
    **size: Any,
) -> ScalingResult:
    """Every process count in `nprocs` in one launch, plus speed-up and scaling efficiency (chapter 4)."""
    nprocs = list(nprocs)
    if not nprocs or not all(isinstance(n, int) and not isinstance(n, bool) for n in nprocs):
        raise ValueError(
            tr("nprocs must be whole numbers of processes, e.g. (1, 2), got {nprocs!r}.").format(
                nprocs=nprocs
            )
        )
    backend = check_backend(backend, max(nprocs))  # one backend for the whole sweep
    nprocs = [check_nproc(n, backend) for n in nprocs]
    threads, timeout = size.pop("threads", 1), timeout * len(nprocs)
    out = new_run_dir("scaling")
    args = ["--out", out, "--sizes", ",".join(str(k) for k in nprocs)]
    args += [*as_flags({"mode": "ddp", **size}), "--pg-timeout", timeout]  # left-out ranks' wait
    with MachineWatch("cuda" if backend == "nccl" else "cpu") as watch:
        res = launch(
            "scaling", max(nprocs), args, backend=backend, threads=threads, timeout=timeout
        )
    rows = [
        {
            "processes": run["world_size"],
            "mode": run["mode"],
            "backend": backend,
            "threads/rank": run["threads"],
            "global batch": run["global_batch"],
            "step ms": run["step_median_s"] * 1e3,
            "step IQR ms": run["step_iqr_s"] * 1e3,
            "step spread": run["step_iqr_s"] / run["step_median_s"],
            "samples/s": run["samples_per_s"],
        }
        for run in read_results(out)[0]["runs"]
    ]
    shutil.rmtree(out, ignore_errors=True)
    base_n, base = rows[0]["processes"], rows[0]["samples/s"]
    for row in rows:
        row["speed-up"] = row["samples/s"] / base
        row["efficiency"] = row["speed-up"] * base_n / row["processes"]
    startup = res.seconds_until() or float("nan")
    return ScalingResult(
        "processes", rows, startup_s=startup, launch_s=res.seconds, machine=watch.state
    )


#: The scaling table's column names (keys the notebook reads; a printed table translates them).
_COLUMNS = (
    tr_mark("processes"), tr_mark("mode"), tr_mark("backend"), tr_mark("threads/rank"),
    tr_mark("global batch"), tr_mark("step ms"), tr_mark("step IQR ms"), tr_mark("step spread"),
    tr_mark("samples/s"), tr_mark("speed-up"), tr_mark("efficiency"), tr_mark("start-up s"),
)  # fmt: skip


def plot_scaling(result: SweepResult) -> Figure:
    """Throughput (with the ideal line) and scaling efficiency against processes (chapter 4)."""
    n = result.column("processes")
    thr = result.column("samples/s")
    fig, (a, b) = plt.subplots(1, 2, figsize=(9.6, 3.6))
    a.plot(n, thr, marker="o", label=tr("measured"))
    a.plot(n, [thr[0] * k / n[0] for k in n], ls="--", color="gray", label=tr("ideal (linear)"))
    a.set(xlabel=tr("processes (ranks)"), ylabel=tr("samples/s"), title=tr("Throughput"))
    a.legend()
    b.plot(n, [100 * e for e in result.column("efficiency")], marker="o", color="C1")
    b.axhline(100, ls="--", color="gray")
    b.set(xlabel=tr("processes (ranks)"), ylabel=tr("% of ideal"), title=tr("Scaling efficiency"))
    b.set_ylim(bottom=0)
    for ax in (a, b):
        ax.set_xticks(n)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def scaling_controls(max_nproc: int) -> dict[str, Any]:
    """ipywidgets controls for the scaling sweep: up to `max_nproc` processes, batch per rank, width, steps (chapter 4)."""
    top = positive_int(max_nproc, "max_nproc")
    return {
        "max_processes": widgets.IntSlider(
            value=top, min=1, max=top, description=tr("processes ≤")
        ),
        "per_rank_batch": widgets.Dropdown(
            options=[32, 128, 256, 1024], value=256, description=tr("batch/rank")
        ),
        "width": widgets.Dropdown(options=[64, 256, 1024], value=256, description=tr("width")),
        "steps": widgets.IntSlider(value=20, min=5, max=100, step=5, description=tr("steps")),
    }


def run_scaling(
    max_processes: int = 2,
    per_rank_batch: int = 256,
    width: int = 256,
    steps: int = 20,
    backend: str | None = None,
) -> SweepResult:
    """The widget's run function: measure_scaling over 1..max_processes ranks (chapter 4)."""
    top = positive_int(max_processes, "max_processes")
    size = {"per_rank_batch": per_rank_batch, "width": width, "steps": steps}
    return measure_scaling(range(1, top + 1), backend=backend, **size)
