"""Reading chapter 8's data-parallel runs: gradient bounds, tables, the overlap plot, traces (chapter 8).

The scripts (``helpers/scripts/dp_by_hand.py``, ``zero1_by_hand.py``, ``fsdp_by_hand.py``)
write what each rank measured; these functions turn rank 0's results into the rows the
notebook prints and the figure it draws. The technique itself is in the scripts, shown in the
notebook with ``helpers.launch.script_source``.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from helpers.comm_overlap import hidden_communication, trace_spans

#: How each way appears in the tables, in the order the chapter introduces them.
WAY_NAMES = {
    "ddp": "DDP",
    "per_param": "(a) per parameter",
    "flat": "(b) one flat all-reduce",
    "overlap": "(c) overlapped hooks",
    "bucketed": "(d) buckets, overlapped",
}
#: What the profiler calls an all-reduce on its timeline: gloo's thread on CPU, NCCL's kernels on GPU.
TRACE_COMM = ("gloo:all_reduce", "nccl")


def gradient_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per way: largest |gradient - DDP's|, within the rounding bound, same on every rank (chapter 8)."""
    keys = ("max |grad - DDP|", "within the bound", "same on every rank")
    return [
        {"way": WAY_NAMES[way], **{k: data[k] for k in keys}}
        for way, data in result["ways"].items()
    ]


def _median(steps: list[dict[str, Any]], key: str) -> float:
    """The median of one number over the instrumented steps (chapter 8)."""
    return statistics.median(s[key] for s in steps)


def timing_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per way: step time, what it sends, and how much of its communication backward hid (chapter 8)."""
    rows = []
    for way, data in result["ways"].items():
        steps = data["instrumented"]
        rows.append(
            {
                "way": WAY_NAMES[way],
                "step ms": data["step median s"] * 1e3,
                "IQR ms": data["step IQR s"] * 1e3,
                "all-reduce calls": data["calls per step"],
                "MB sent": data["bytes per step"] / 2**20,
                "in flight ms": _median(steps, "in flight s") * 1e3,
                "exposed ms": _median(steps, "exposed s") * 1e3,
                "hidden %": 100 * _median(steps, "hidden share"),
            }
        )
    return rows


def plot_overlap(result: dict[str, Any], ways: tuple[str, ...] = tuple(WAY_NAMES)) -> Figure:
    """One instrumented step of each way on rank 0: compute spans and all-reduces in flight (chapter 8)."""
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(ways) + 1.2))
    for row, way in enumerate(reversed(ways)):
        step = result["ways"][way]["instrumented"][-1]
        compute = [(s * 1e3, (e - s) * 1e3) for s, e in step["compute"]]
        comm = [(s * 1e3, (e - s) * 1e3) for s, e in step["comm"]]
        ax.broken_barh(compute, (row + 0.05, 0.4), color="tab:blue")
        ax.broken_barh(comm, (row + 0.5, 0.4), color="tab:orange", alpha=0.6)
    ax.set_yticks([r + 0.5 for r in range(len(ways))], [WAY_NAMES[w] for w in reversed(ways)])
    ax.set_xlabel("ms since the step started (rank 0)")
    ax.legend(
        handles=[
            plt.Rectangle((0, 0), 1, 1, color="tab:blue"),
            plt.Rectangle((0, 0), 1, 1, color="tab:orange", alpha=0.6),
        ],
        labels=["backward computing gradients", "all-reduce in flight"],
        loc="lower right",
    )
    ax.set_title(f"One step, {result['world_size']} rank(s) on {result['device']}")
    fig.tight_layout()
    return fig


def gpu_kernel_spans(trace: dict[str, Any]) -> tuple[list, list]:
    """(NCCL kernels, other kernels) of a Chrome trace, in seconds; empty on a CPU trace (chapter 8)."""
    comm, compute = [], []
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") == "kernel" and "dur" in e:
            span = (float(e["ts"]) / 1e6, (float(e["ts"]) + float(e["dur"])) / 1e6)
            (comm if "nccl" in str(e.get("name", "")).lower() else compute).append(span)
    return comm, compute


def trace_overlap(path: str | Path) -> dict[str, Any]:
    """The labelled ranges of a profiler trace and how much all-reduce time compute hid (chapter 8).

    On a CPU the all-reduces are gloo's spans on its own thread, and compute is the backward
    range; on a GPU both come from the GPU's timeline: NCCL kernels against the other kernels
    (a CPU range ends long before the kernels it launched).
    """
    trace = json.loads(Path(path).read_text(encoding="utf-8"))
    labels = ("step", "forward", "backward", "communication wait", "optimizer step")
    spans = trace_spans(trace, (*labels, *TRACE_COMM))
    comm, compute = gpu_kernel_spans(trace)
    if not compute:  # a CPU trace
        comm, compute = [s for n in TRACE_COMM for s in spans[n]], spans["backward"]
    return {
        "ranges": {name: len(spans[name]) for name in labels},
        "all-reduce spans": len(comm),
        **hidden_communication(comm, compute),
    }
