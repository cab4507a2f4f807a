"""Profiler plumbing, a bottleneck diagnosis and a toy asynchronous device (chapter 6)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from helpers.devices import resolve_device, synchronize
from helpers.i18n import tr, tr_mark
from helpers.loops import time_once
from helpers.machine_state import MachineState
from helpers.profiler_markers import without_profiler_markers

#: The verdicts diagnose() gives: Diagnosis.verdict keeps them as they are, str() translates them.
INPUT, LAUNCH, SYNC, COMPUTE = (
    tr_mark("input-bound"),
    tr_mark("launch/overhead-bound"),
    tr_mark("sync-bound"),
    tr_mark("compute-bound"),
)

#: One-word column names chapter 6 prints its diagnoses and compile timings under: format_table
#: looks every column name up in the catalogs, and a one-word literal in a notebook is no message
#: of its own, so they are marked here.
TABLE_WORDS = (
    tr_mark("run"), tr_mark("verdict"), tr_mark("input"), tr_mark("sync"), tr_mark("compute"),
    tr_mark("function"),
)  # fmt: skip

#: Blocking host syncs in a profile: the op behind .item()/bool()/float(), device-wide waits.
SYNC_EVENTS = ("aten::_local_scalar_dense", "cudaDeviceSynchronize", "hipDeviceSynchronize")
#: Stream waits, counted when they are not already inside one of the SYNC_EVENTS (a .cpu() copy).
STREAM_WAITS = ("cudaStreamSynchronize", "hipStreamSynchronize")
#: What profile_steps calls its final sync, so that the summaries leave it out.
FLUSH_LABEL = "profile_steps: final sync"
#: CPU matmul ops, and GPU matmul kernel name patterns: cuBLAS/CUTLASS "gemm", recent cuBLAS's
#: Hopper kernels "nvjet_..." (no "gemm" in their names), rocBLAS/hipBLASLt "Cijk_".
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm")
MATMUL_KERNELS = ("gemm", "nvjet", "cijk_")


def profiler_activities(device: str | torch.device) -> list[ProfilerActivity]:
    """CPU always; CUDA (also ROCm) or XPU when `device` is one (chapter 6)."""
    device = resolve_device(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    elif device.type == "xpu" and hasattr(ProfilerActivity, "XPU"):
        activities.append(ProfilerActivity.XPU)
    return activities


def self_time_key(device: str | torch.device) -> str:
    """The key_averages().table sort key for the time that matters on `device` (chapter 6)."""
    kind = resolve_device(device).type
    return "self_device_time_total" if kind in ("cuda", "xpu") else "self_cpu_time_total"


def profile_steps(
    step: Callable[[], object],
    device: str | torch.device,
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
) -> profile:
    """Run step() wait+warmup+active times under torch.profiler with a schedule; return the profiler (chapter 6)."""
    for name, value, minimum in (("wait", wait, 0), ("warmup", warmup, 1), ("active", active, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(
                tr("{name} must be a whole number >= {minimum}, got {value!r}.").format(
                    name=name, minimum=minimum, value=value
                )
            )
    device = resolve_device(device)
    total = wait + warmup + active
    with (
        without_profiler_markers(),
        profile(
            activities=profiler_activities(device),
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=1),
            acc_events=True,  # one cycle, the same events; no warning that a cycle clears them
        ) as prof,
    ):
        for i in range(total):
            step()
            if i == total - 1:  # let queued device work finish inside the recorded window
                with record_function(FLUSH_LABEL):
                    synchronize(device)
            prof.step()
    return prof


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of a set of possibly overlapping [start, end] intervals (chapter 6)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e > end:  # what sticks out past the intervals so far
            total, end = total + e - max(s, end), e
    return total


def _is_sync(event: object) -> bool:
    """True for a host sync: .item()'s op, an explicit device sync, or a stream wait of a copy (chapter 6)."""
    name, parents, parent = event.name, [], event.cpu_parent
    while parent is not None:
        parents.append(parent.name)
        parent = parent.cpu_parent
    if FLUSH_LABEL in parents or any(p.startswith("Optimizer.step#") for p in parents):
        return False  # our own flush, and optimizers reading their CPU-side step counters
    if name in SYNC_EVENTS:
        return True
    return name in STREAM_WAITS and "aten::_local_scalar_dense" not in parents


def _top_level_op(event: object) -> bool:
    """An aten op that no other aten op called: one op dispatched from Python (chapter 6)."""
    above = "" if event.cpu_parent is None else event.cpu_parent.name
    return event.name.startswith("aten::") and not above.startswith("aten::")


@dataclass
class ProfileSummary:
    """Per-step figures read off a profile: wall time, labelled regions, syncs, ops, device busy (chapter 6)."""

    steps: int
    step_s: float
    labels_s: dict[str, float] = field(default_factory=dict)
    sync_s: float = 0.0
    syncs: float = 0.0
    ops: float = 0.0
    device_busy_s: float | None = None


def summarize_profile(
    prof: profile, labels: tuple[str, ...] = ("data", "forward", "backward", "optimizer")
) -> ProfileSummary:
    """Read a scheduled profile (prof.step() each iteration) into a ProfileSummary (chapter 6)."""
    events = prof.events()
    cpu = DeviceType.CPU
    steps = [e for e in events if e.name.startswith("ProfilerStep") and e.device_type == cpu]
    if not steps:
        raise ValueError(
            tr(
                "This profile has no ProfilerStep events: profile with a schedule and call "
                "prof.step() once per iteration (or use profile_steps)."
            )
        )
    n = len(steps)
    step_us = sum(e.time_range.elapsed_us() for e in steps) / n
    labels_us = {lab: 0.0 for lab in labels}
    sync_us, syncs, ops = 0.0, 0, 0
    device_ranges: list[tuple[float, float]] = []
    for e in events:
        if e.device_type != cpu:
            mirrored = e.name in labels_us or e.name.startswith("ProfilerStep")
            if not (mirrored or getattr(e, "is_user_annotation", False)):  # kernels, copies
                device_ranges.append((e.time_range.start, e.time_range.end))
            continue
        if e.name in labels_us:
            labels_us[e.name] += e.time_range.elapsed_us()
        if _is_sync(e):
            sync_us += e.time_range.elapsed_us()
            syncs += 1
        ops += _top_level_op(e)
    on_device = bool(set(prof.activities) - {ProfilerActivity.CPU})
    busy = _union_us(device_ranges) / n / 1e6 if on_device else None
    return ProfileSummary(
        steps=n,
        step_s=step_us / 1e6,
        labels_s={k: v / n / 1e6 for k, v in labels_us.items() if v > 0},
        sync_s=sync_us / n / 1e6,
        syncs=syncs / n,
        ops=ops / n,
        device_busy_s=busy,
    )


@dataclass
class Diagnosis:
    """A verdict (input-, sync-, compute- or launch/overhead-bound), why, and the ratios behind it (chapter 6)."""

    verdict: str
    reason: str
    ratios: dict[str, float | None]
    #: What else the machine was doing while the profile ran; a busy one makes it inconclusive.
    machine: MachineState | None = None

    def __str__(self) -> str:
        text = tr("{verdict}: {reason}").format(verdict=tr(self.verdict), reason=self.reason)
        if self.machine is not None and not self.machine.quiet:
            return tr("inconclusive, {caveat}; measured: {text}").format(
                caveat=self.machine.caveat(), text=text
            )
        return text


def diagnose(
    summary: ProfileSummary,
    flops_per_step: float | None = None,
    flop_rate: float | None = None,
    *,
    threshold: float = 0.3,
    busy_threshold: float = 0.7,
    machine: MachineState | None = None,
) -> Diagnosis:
    """Classify a profiled run from simple ratios of its ProfileSummary; `machine`: the state it ran in (chapter 6)."""
    if summary.step_s <= 0:
        raise ValueError(tr("The profile's steps took no time; profile more (or bigger) steps."))
    step = summary.step_s
    input_frac = summary.labels_s.get("data", 0.0) / step
    sync_frac = summary.sync_s / step
    busy = None if summary.device_busy_s is None else summary.device_busy_s / step
    compute = None
    if flops_per_step is not None and flop_rate:
        compute = flops_per_step / flop_rate / step
    us_per_op = step / summary.ops * 1e6 if summary.ops else None
    ratios = {
        "input (data / step)": input_frac,
        "sync (waiting / step)": sync_frac,
        "device busy (kernels / step)": busy,
        "compute (FLOP time at best rate / step)": compute,
        "µs per op": us_per_op,
    }
    per_op = "" if us_per_op is None else tr(", {us:.1f} µs per op").format(us=us_per_op)
    idle = (
        ""
        if busy is None
        else tr("; the device idles {share:.0%} of the time").format(share=1 - busy)
    )
    if input_frac >= threshold:
        why = (
            INPUT,
            tr("{share:.0%} of each step is spent getting the batch").format(share=input_frac),
        )
    elif sync_frac >= threshold and (busy is None or busy < busy_threshold):
        why = (
            SYNC,
            tr("{share:.0%} of each step waits in host syncs while the device idles").format(
                share=sync_frac
            ),
        )
    elif busy is not None and busy >= busy_threshold:
        why = COMPUTE, tr("the device runs kernels {share:.0%} of the time").format(share=busy)
    elif busy is None and compute is not None and compute >= threshold:
        why = (
            COMPUTE,
            tr("the FLOPs alone need {share:.0%} of the step at the best matmul rate").format(
                share=compute
            ),
        )
    else:
        why = (
            LAUNCH,
            tr(
                "no input, sync or compute share dominates{per_op}{idle}: the per-op cost does"
            ).format(per_op=per_op, idle=idle),
        )
    return Diagnosis(*why, ratios, machine)


def _annotation(row: object, cpu_keys: set[str]) -> bool:
    """A range mirrored onto the device's timeline (a label, ProfilerStep, an optimizer step), not a kernel (chapter 6)."""
    return (
        bool(getattr(row, "is_user_annotation", False))
        or row.key.startswith(("ProfilerStep", "Optimizer."))
        or row.key == FLUSH_LABEL
        or row.key in cpu_keys  # a label has a CPU row of its name too; a kernel never does
    )


def matmul_share(prof: profile, device: str | torch.device, also: tuple[str, ...] = ()) -> float:
    """Fraction of the profile's self time in matrix products (and names containing an `also` word): GPU kernels on CUDA, aten ops elsewhere (chapter 6).

    On CUDA only kernel rows count: annotation rows (record_function labels, ``ProfilerStep*``,
    ``Optimizer.step#AdamW.step``) are spans of the timeline whose kernels already have their
    own rows, so counting them as well would count those kernels twice (chapter 6, section 2).
    On a CPU every self-time microsecond is counted once; only ``ProfilerStep*`` and
    profile_steps' final sync are left out there.
    """
    on_gpu = resolve_device(device).type == "cuda"
    averages = list(prof.key_averages())
    cpu_keys = {r.key for r in averages if r.device_type == DeviceType.CPU}
    if on_gpu:
        rows = [r for r in averages if r.device_type != DeviceType.CPU]
        times = {r.key: r.self_device_time_total for r in rows if not _annotation(r, cpu_keys)}
        is_matmul = {k: any(p in k.lower() for p in MATMUL_KERNELS + also) for k in times}
    else:
        times = {
            r.key: r.self_cpu_time_total
            for r in averages
            if r.device_type == DeviceType.CPU
            and not r.key.startswith("ProfilerStep")
            and r.key != FLUSH_LABEL
        }
        is_matmul = {k: k in MATMUL_OPS or any(p in k.lower() for p in also) for k in times}
    total = sum(times.values())
    if total <= 0:
        raise ValueError(
            tr("The profile recorded no time on this device: profile some steps first.")
        )
    return sum(t for k, t in times.items() if is_matmul[k]) / total


def labels_launched_elsewhere(prof: profile, labels: tuple[str, ...]) -> set[str]:
    """The labels whose kernels were mostly launched from another thread than the label's, e.g. autograd's (chapter 6).

    On CUDA, ``loss.backward()`` runs on autograd's own thread for the device: the main
    thread's ``backward`` label only waits, so its span on the GPU's timeline holds almost none
    of the backward's kernels. Each CPU op knows the kernels it launched (``event.kernels``);
    this compares those launched inside each label's time on its own thread and on others.
    """
    events = prof.events()
    launchers = [e for e in events if e.device_type == DeviceType.CPU and e.kernels]
    found: set[str] = set()
    for label in (e for e in events if e.device_type == DeviceType.CPU and e.name in labels):
        start, end = label.time_range.start, label.time_range.end
        launched = {True: 0.0, False: 0.0}  # kernel time launched on the label's thread, elsewhere
        for e in launchers:
            if start <= e.time_range.start and e.time_range.end <= end:
                launched[e.thread == label.thread] += sum(k.duration for k in e.kernels)
        if launched[False] > launched[True]:
            found.add(label.name)
    return found


class ToyAsyncDevice:
    """A worker thread running queued jobs in order: a CPU-side model of a GPU stream (chapter 6)."""

    def __init__(self) -> None:
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toy-device")
        self._last: Future | None = None
        self._closed = False

    def kernel(self, seconds: float) -> None:
        """Queue a job that keeps the toy device busy for `seconds`; returns at once, like a launch (chapter 6)."""
        if self._closed:
            raise RuntimeError(tr("This toy device is closed; make a new ToyAsyncDevice()."))
        self._last = self._worker.submit(time.sleep, seconds)

    def synchronize(self) -> None:
        """Block until every queued job has finished, as torch.cuda.synchronize() does (chapter 6)."""
        if self._last is not None:
            self._last.result()  # jobs run in order: the last one done means all are

    def close(self) -> None:
        """Finish queued jobs and end the worker thread; safe to call twice (chapter 6)."""
        self._closed = True
        self._worker.shutdown(wait=True)

    def __enter__(self) -> ToyAsyncDevice:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def time_first_call(
    fn: Callable[..., object], *args: object, device: str | torch.device = "cpu"
) -> float:
    """Seconds of one call, synchronised: for one-off events such as a compile, not for kernels (chapter 6)."""
    return time_once(lambda: fn(*args), device)


def count_top_level_ops(fn: Callable[..., object], *args: object) -> int:
    """How many aten ops one call of fn dispatches from Python, read off a CPU profile (chapter 6)."""
    with without_profiler_markers(), profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
    return sum(map(_top_level_op, prof.events()))


def plot_timing_methods(readings: dict[str, list[float]], title: str = "") -> Figure:
    """Each timing method on its own row: every reading as a dot, its median as a bar (chapter 6)."""
    if not readings or not all(readings.values()):
        raise ValueError(tr("Give each timing method at least one reading in seconds."))
    fig, ax = plt.subplots(figsize=(7.0, 0.5 * len(readings) + 1.4))
    for row, values in enumerate(readings.values()):
        ms = [v * 1e3 for v in values]
        ax.scatter(ms, [row] * len(ms), s=14, alpha=0.6)
        median = statistics.median(ms)
        ax.plot([median, median], [row - 0.3, row + 0.3], color="black", lw=2)
    ax.set_yticks(range(len(readings)), list(readings))
    ax.set_xscale("log")
    ax.set_xlabel(tr("ms per call (dots: readings, bar: median)"))
    ax.set_title(title or tr("The same work, timed different ways"))
    ax.invert_yaxis()
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    return fig
