"""Reading chapter 8's data-parallel runs: gradient bounds, tables, the overlap plot, traces (chapter 8).

The scripts (``helpers/scripts/dp_by_hand.py``, ``zero1_by_hand.py``, ``fsdp_by_hand.py``)
write what each rank measured; these functions turn rank 0's results into the rows the
notebook prints and the figure it draws. The technique itself is in the scripts, shown in the
notebook with ``helpers.launch.script_source``.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from helpers.comm_overlap import (
    bucket_wait,
    fit_alpha_beta,
    hidden_communication,
    model_bucket_size,
    plan_buckets,
    ring_wire_bytes,
    trace_spans,
)
from helpers.i18n import tr, tr_mark
from helpers.machine_state import MachineState
from helpers.sharding import RESIZED
from helpers.units import MiB, format_bytes
from helpers.verdicts import compare_rows

#: How each way appears in the tables, in the order the chapter introduces them (the rows' "way",
#: which the notebook's verdicts name: kept as they are; the plot translates them).
WAY_NAMES = {
    "ddp": "DDP",
    "per_param": tr_mark("(a) per parameter"),
    "flat": tr_mark("(b) one flat all-reduce"),
    "overlap": tr_mark("(c) overlapped hooks"),
    "bucketed": tr_mark("(d) buckets, overlapped"),
}
#: The tables' column names (keys the notebook reads; a printed table translates them).
_COLUMNS = (
    tr_mark("way"), tr_mark("max |grad - DDP|"), tr_mark("within the bound"),
    tr_mark("same on every rank"), tr_mark("step ms"),
    tr_mark("saving vs (b) ms"), tr_mark("backward ms"), tr_mark("backward IQR ms"),
    tr_mark("stretch ms"),
    tr_mark("all-reduce calls"), tr_mark("to all-reduce MiB"), tr_mark("on the wire MiB/rank"),
    tr_mark("buffer"), tr_mark("median ms"),
    tr_mark("on the wire/rank"), tr_mark("cap MiB"), tr_mark("buckets"),
    tr_mark("measured wait ms"), tr_mark("model wait ms"), tr_mark("note"),
)  # fmt: skip
#: The sweep's last row: the gradients' total as the cap, so one bucket sent as backward ends.
ONE_BUCKET = tr_mark("one bucket for all")
#: A swept cap's name in the sweep's verdicts (compare_rows formats the row's "cap MiB" with it).
CAP_LABEL = tr_mark("cap {:.2f} MiB")
#: What the profiler calls an all-reduce on its timeline: gloo's threads on CPU, NCCL's kernels on GPU.
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


def backward_ms(result: dict[str, Any], way: str) -> float:
    """Median milliseconds from backward's start to its last gradient, over the instrumented steps (chapter 8)."""
    return 1e3 * _median(result["ways"][way]["instrumented"], "backward s")


def backward_iqr_ms(result: dict[str, Any], way: str) -> float:
    """The IQR of those milliseconds over the instrumented steps; 0 with one step (chapter 8)."""
    times = [s["backward s"] for s in result["ways"][way]["instrumented"]]
    if len(times) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4)  # as the script's step-time IQR
    return 1e3 * (q3 - q1)


def timing_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per way: step time, its saving against (b), backward's stretch, calls, bytes handed and on the wire (chapter 8).

    (b), one flat all-reduce after backward, is the base: the same bytes in one call, nothing
    in flight while backward runs. "saving" is (b)'s step time minus the way's; "stretch" is
    how much longer the way's backward took than (b)'s, the price of sharing the cores (CPU)
    or the SMs and memory bandwidth (GPU) with communication; "backward IQR" is the spread of
    the way's backward over the instrumented steps, what a stretch must exceed to say anything.
    """
    world, flat = result["world_size"], result["ways"]["flat"]
    rows = []
    for way, data in result["ways"].items():
        rows.append(
            {
                "way": WAY_NAMES[way],
                "step ms": data["step median s"] * 1e3,
                "IQR ms": data["step IQR s"] * 1e3,
                "saving vs (b) ms": (flat["step median s"] - data["step median s"]) * 1e3,
                "backward ms": backward_ms(result, way),
                "backward IQR ms": backward_iqr_ms(result, way),
                "stretch ms": backward_ms(result, way) - backward_ms(result, "flat"),
                "all-reduce calls": data["calls per step"],
                "to all-reduce MiB": data["bytes per step"] / MiB,
                "on the wire MiB/rank": ring_wire_bytes(data["bytes per step"], world) / MiB,
            }
        )
    return rows


def allreduce_fit(result: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """The all-reduce times measured at several sizes, the alpha-beta line through them, and the fit (chapter 8)."""
    points = result["allreduce"]
    fit = fit_alpha_beta([p["bytes"] for p in points], [p["step median s"] for p in points])
    # the line describes the machine if it passes within every size's own spread (IQR of its
    # repeats) of the measured median, with a fixed cost and a cost per byte both >= 0
    misses = [
        (
            p["bytes"],
            abs(fit["alpha s"] + p["bytes"] * fit["beta s/B"] - p["step median s"]),
            p["step IQR s"],
        )  # fmt: skip
        for p in points
        if abs(fit["alpha s"] + p["bytes"] * fit["beta s/B"] - p["step median s"])
        > p["step IQR s"]  # fmt: skip
    ]
    fit["outside the spread"] = misses
    # repeats that spread as wide as their median test no line: scheduling noise, not the links
    fit["too spread"] = [p["bytes"] for p in points if p["step IQR s"] >= p["step median s"]]
    fit["sizes"] = len(points)
    # a fixed cost and a cost per byte: what the bucket model needs to predict anything
    fit["usable"] = usable(fit)
    # the strict test: the line describes the times, within every size's spread
    fit["fits"] = fit["usable"] and not misses and not fit["too spread"]
    rows = [
        {
            "buffer": format_bytes(p["bytes"]),
            "median ms": p["step median s"] * 1e3,
            "IQR ms": p["step IQR s"] * 1e3,
            "alpha + n beta ms": (fit["alpha s"] + p["bytes"] * fit["beta s/B"]) * 1e3,
            "on the wire/rank": format_bytes(ring_wire_bytes(p["bytes"], result["world_size"])),
        }
        for p in points
    ]
    return rows, fit


def fit_line(fit: dict[str, Any], world: int) -> str:
    """The fit in words: alpha in µs, 1/beta as bandwidth, and whether the line describes the times (chapter 8)."""
    alpha, beta = fit["alpha s"], fit["beta s/B"]
    said = tr("alpha = {alpha:.1f} µs per call, beta = {beta:.3f} ns per byte").format(
        alpha=alpha * 1e6, beta=beta * 1e9
    )
    if beta > 0:
        wire = ring_wire_bytes(1, world) / beta / 1e9
        said += tr(
            " (1/beta = {buffer:.2f} GB/s of buffer, {wire:.2f} GB/s on the wire per rank)"
        ).format(buffer=1e-9 / beta, wire=wire)
    said += tr("; largest gap between a measured time and the line: {gap:.0%}").format(
        gap=fit["worst gap"]
    )
    if fit.get("fits"):
        return said + tr(
            "; the line passes within every size's spread (IQR): the model describes this machine"
        )
    if not usable(fit):
        if fit["beta s/B"] <= 0:
            why = tr("a negative cost is no cost: the times do not grow with the size here")
        else:
            why = tr(
                "a negative fixed cost per call is no cost: the line passes below zero at n = 0"
            )
        return said + tr(
            "; {why}: t = alpha + n beta does not describe this machine today, no prediction"
        ).format(why=why)
    reasons = []
    misses, spread = fit.get("outside the spread", []), fit.get("too spread", [])
    if misses:
        which = ", ".join(
            tr("{size} by {gap:.3g} ms (IQR {iqr:.3g} ms)").format(
                size=format_bytes(n), gap=gap * 1e3, iqr=iqr * 1e3
            )
            for n, gap, iqr in misses
        )
        reasons.append(
            tr(
                "the line misses {misses} of the {sizes} sizes by more than their repeats' "
                "spread: {which}"
            ).format(misses=len(misses), sizes=fit.get("sizes", len(misses)), which=which)
        )
    if spread:
        sizes = ", ".join(format_bytes(n) for n in spread)
        reasons.append(
            tr(
                "the repeats at {sizes} spread (IQR) as wide as their median: too noisy to test "
                "a line"
            ).format(sizes=sizes)
        )
    return said + tr(
        "; {why}: the model's bucket below is a rough guide only, the measured sweep is the judge"
    ).format(why="; ".join(reasons))


def usable(fit: dict[str, Any]) -> bool:
    """Whether a fit can predict a bucket at all: a fixed cost alpha >= 0, a cost per byte beta > 0 (chapter 8)."""
    return fit["alpha s"] >= 0 and fit["beta s/B"] > 0


def model_bucket(result: dict[str, Any], fit: dict[str, Any]) -> dict[str, Any] | None:
    """The bucket size the alpha-beta model derives for G gradient bytes produced over backward time B; None if the fit is not usable (chapter 8).

    Buckets of s bytes, G / s of them, all-reduced in order one at a time (alpha + s beta
    each), leave a wait after backward of max(alpha + s beta, s B / G + G alpha / s + G beta - B)
    (helpers.comm_overlap.pipeline_wait). Where communication is the bottleneck, the first
    bucket's fill time s B / G and the calls' G alpha / s trade off: s* = G sqrt(alpha / B).
    Where it can keep up (beta G < B), s = G alpha / (B - beta G), the smallest bucket that
    does, leaves only its own alpha + s beta exposed. The candidate with the smaller wait wins
    (model_bucket_size). That closed form assumes equal buckets; the real gradients close a
    bucket only once it holds the cap, in whole gradients, so the model then plays the caps at
    which a bucket closes (the running sums of the sizes), and the closed form's, out one by
    one (bucket_wait) and keeps the one that waits least (the nearest to the closed form on a
    tie). Predicted wherever the fit is usable (alpha >= 0, beta > 0); where the line misses the
    measured times or their repeats are too noisy to test it, "line fits" is False, "missed"
    says which, and the prediction is a rough guide.
    """
    if not usable(fit):
        return None
    sizes, alpha, beta = result["backward order bytes"], fit["alpha s"], fit["beta s/B"]
    g, b = sum(sizes), backward_ms(result, "flat") / 1e3
    size, rule = model_bucket_size(g, alpha, beta, b)
    closed = min(max(1, math.ceil(size)), g)
    caps = {closed, *itertools.accumulate(sizes)}
    cap = min(sorted(caps), key=lambda c: (bucket_wait(sizes, c, alpha, beta, b), abs(c - size)))
    return {
        "bytes": size,
        "cap bytes": cap,
        "buckets": len(plan_buckets(sizes, cap)),
        "rule": rule,
        "G bytes": g,
        "B s": b,
        "wait s": bucket_wait(sizes, cap, alpha, beta, b),
        "line fits": bool(fit.get("fits")),
        "missed": bool(fit.get("outside the spread")),
    }


def bucket_rows(result: dict[str, Any], fit: dict[str, Any]) -> list[dict[str, Any]]:
    """The bucket-size sweep: each cap's buckets, step time, measured wait after backward, and the model's (chapter 8).

    The model's backward is (b)'s, which has nothing in flight while backward runs; a model
    column wherever the fit is usable (alpha >= 0, beta > 0), even where the line misses the
    times (fit_line says so). The last cap is the gradients' total: one bucket, its note says.
    """
    sizes, backward = result["backward order bytes"], backward_ms(result, "flat") / 1e3
    rows = []
    last = len(result["bucket sweep"]) - 1
    for i, r in enumerate(result["bucket sweep"]):
        row = {
            "cap MiB": r["cap bytes"] / MiB,
            "buckets": r["buckets"],
            "step ms": r["step median s"] * 1e3,
            "IQR ms": r["step IQR s"] * 1e3,
            "measured wait ms": r["wait median s"] * 1e3,
        }
        if usable(fit):
            wait = bucket_wait(sizes, r["cap bytes"], fit["alpha s"], fit["beta s/B"], backward)
            row["model wait ms"] = wait * 1e3
        row["note"] = ONE_BUCKET if i == last and r["cap bytes"] >= sum(sizes) else ""
        rows.append(row)
    return rows


def predicted_vs_best(
    rows: list[dict[str, Any]],
    model: dict[str, Any] | None,
    machine: MachineState | list[MachineState] | None = None,
) -> str:
    """The cap measured fastest against the runner-up, and the bucket the model derives against it, each a compare_rows verdict (chapter 8).

    `machine`: the state of the machine over the sweep (a busy one makes every verdict
    inconclusive), as compare_rows takes it.
    """
    ranked = sorted(rows, key=lambda r: r["step ms"])
    best = ranked[0]

    def verdict(other: dict[str, Any]) -> str:
        return compare_rows(
            rows, "cap MiB", best["cap MiB"], other["cap MiB"], "step ms", iqr="IQR ms",
            label=CAP_LABEL, machine=machine,
        )  # fmt: skip

    measured = tr(
        "best measured: cap {cap:.2f} MiB ({buckets} bucket(s), {ms:.2f} ms/step)"
    ).format(cap=best["cap MiB"], buckets=best["buckets"], ms=best["step ms"])
    if len(ranked) > 1:
        measured += tr("; against the runner-up, cap {cap:.2f} MiB: {verdict}").format(
            cap=ranked[1]["cap MiB"], verdict=verdict(ranked[1])
        )
    if model is None:
        return measured + tr("; no model to compare")
    mib = model["cap bytes"] / MiB
    said = tr(
        "model: {rule} = {size:.3g} MiB (G = {g:.3g} MiB, B = {b:.3g} ms); played out over the "
        "gradients' sizes, cap {cap:.3g} MiB: {buckets} bucket(s), a predicted wait of "
        "{wait:.3g} ms; {measured}"
    ).format(
        rule=model["rule"], size=model["bytes"] / MiB, g=model["G bytes"] / MiB,
        b=model["B s"] * 1e3, cap=mib, buckets=model["buckets"], wait=model["wait s"] * 1e3,
        measured=measured,
    )  # fmt: skip
    near = min(rows, key=lambda r: abs(math.log(r["cap MiB"] / mib)))
    if near is best:
        said += tr("; the swept cap nearest the model's is the best")
    elif near is ranked[1]:
        said += tr("; the swept cap nearest the model's is the runner-up")
    else:
        said += tr(
            "; the swept cap nearest the model's, {cap:.2f} MiB, against the best: {verdict}"
        ).format(cap=near["cap MiB"], verdict=verdict(near))
    if not model.get("line fits", True) and model.get("missed", True):
        said += tr(
            "; the line missed the measured all-reduce times: the model is a rough guide, the "
            "sweep is the judge"
        )
    elif not model.get("line fits", True):
        said += tr(
            "; the all-reduce times were too noisy to test the line: the model is a rough "
            "guide, the sweep is the judge"
        )
    return said


def ddp_bucket_line(result: dict[str, Any]) -> str:
    """DDP's buckets (MiB) in its first step and in a later one, after it rebuilt them (chapter 8)."""
    ddp = result["ways"]["ddp"]

    def mib(sizes: list[int]) -> str:
        return "[" + ", ".join(f"{n / MiB:.2f}" for n in sizes) + "] MiB"

    line = tr("DDP's all-reduces, first step: {first}; after the rebuild: {rebuilt}").format(
        first=mib(ddp["first step sizes"]), rebuilt=mib(ddp["instrumented"][-1]["sizes"])
    )
    if "ddp default cap sizes" in result:
        line += tr("; at the default cap (bucket_cap_mb=None), after the rebuild: {sizes}").format(
            sizes=mib(result["ddp default cap sizes"])
        )
    return line


def peak_parts(at_peak: dict[str, Any] | None, peak: int) -> str:
    """What the meter saw alive at a step's peak: bytes from before the step, then each newer storage with the op that made it (chapter 8)."""
    if at_peak is None:
        return tr("{peak:,} B (the CUDA allocator's peak: no breakdown by tensor)").format(
            peak=peak
        )
    made = ", ".join(
        f"{n:,} ({tr(op) if op == RESIZED else op.removeprefix('aten.')})"
        for op, n in at_peak["made in the step"]
    )
    where = at_peak["op"].removeprefix("aten.") or tr("an in-place resize")
    return tr("{peak:,} B, reached in {where} = {before:,} from before the step + {made}").format(
        peak=peak, where=where, before=at_peak["from before"], made=made or tr("nothing")
    )


def plot_overlap(result: dict[str, Any], ways: tuple[str, ...] = tuple(WAY_NAMES)) -> Figure:
    """One instrumented step of each way on rank 0: compute spans and all-reduces in flight (chapter 8)."""
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(ways) + 1.2))
    for row, way in enumerate(reversed(ways)):
        step = result["ways"][way]["instrumented"][-1]
        compute = [(s * 1e3, (e - s) * 1e3) for s, e in step["compute"]]
        comm = [(s * 1e3, (e - s) * 1e3) for s, e in step["comm"]]
        ax.broken_barh(compute, (row + 0.05, 0.4), color="tab:blue")
        ax.broken_barh(comm, (row + 0.5, 0.4), color="tab:orange", alpha=0.6)
    ax.set_yticks([r + 0.5 for r in range(len(ways))], [tr(WAY_NAMES[w]) for w in reversed(ways)])
    ax.set_xlabel(tr("ms since the step started (rank 0)"))
    ax.legend(
        handles=[
            plt.Rectangle((0, 0), 1, 1, color="tab:blue"),
            plt.Rectangle((0, 0), 1, 1, color="tab:orange", alpha=0.6),
        ],
        labels=[tr("backward computing gradients"), tr("all-reduce in flight")],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.12 * 5 / (len(ways) + 1)),  # below the axes, clear of the bars
        ncol=2,
    )
    ax.set_title(
        tr("One step, {world} rank(s) on {device}").format(
            world=result["world_size"], device=result["device"]
        )
    )
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

    On a CPU the all-reduces are gloo's spans on its worker threads (two by default), and
    compute is the backward range; on a GPU both come from the GPU's timeline: NCCL kernels
    against the other kernels (a CPU range ends long before the kernels it launched).
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
        # backward as the timeline shows it: its range on a CPU, its kernels' extent on a GPU
        "backward s": max((e for _, e in compute), default=0.0)
        - min((s for s, _ in compute), default=0.0),
        **hidden_communication(comm, compute),
    }
