"""Where a profiled training step's time goes, in buckets, and what would cut the largest left (chapter 7).

A GPU profile's kernel rows add up to the time the GPU was busy; its annotation rows
(``ProfilerStep*``, ``Optimizer.step#...``, ``record_function`` labels) are spans over those
kernels and are left out, or they would be counted twice (chapter 6). What the kernels do not
cover of the step's wall time is the GPU idling, waiting for the CPU to launch work. On a
CPU, every op's self time is counted once, annotations included (their self time is the
Python they ran), and what no op covers is the interpreter, the data loading and dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd import DeviceType
from torch.profiler import profile

from helpers.devices import resolve_device
from helpers.i18n import tr, tr_mark
from helpers.profiling import FLUSH_LABEL, MATMUL_KERNELS, MATMUL_OPS, summarize_profile
from helpers.tables import format_table
from helpers.units import Printed

#: The buckets, by name: keys of StepProfile.buckets, printed translated (tr_mark: the catalog).
MATMUL = tr_mark("matmuls and attention")
OPTIMIZER = tr_mark("optimizer and clipping")
FUSED = tr_mark("fused elementwise (torch.compile's kernels)")
COPIES = tr_mark("copies")
OTHER = tr_mark("other kernels and ops")
IDLE_GPU = tr_mark("GPU idle (waiting for launches)")
IDLE_CPU = tr_mark("outside ops (Python, data loading, dispatch)")
#: The table's column headers, for the catalog (format_table prints them translated).
_COLUMNS = (
    tr_mark("where the step goes"), tr_mark("ms per step"), tr_mark("share of the step"),
    tr_mark("largest"),
)  # fmt: skip
#: Name fragments that mark attention kernels and ops (flash, cuDNN, memory-efficient, CPU).
ATTENTION = ("attention", "flash", "fmha", "sdpa")
#: Optimizer and gradient-clipping work: torch's multi-tensor kernels, fused Adam, foreach ops.
OPTIMIZER_WORDS = ("multi_tensor_apply", "adam", "foreach", "optimizer.step")
#: Kernels torch.compile generated: Triton on GPUs, C++ on CPUs.
FUSED_PREFIXES = ("triton_", "cpp_fused", "fused_")
COPY_WORDS = ("memcpy", "memset", "aten::copy_", "aten::_to_copy", "aten::to")


def _is_annotation(row: object) -> bool:
    """A span (ProfilerStep, an optimizer step, a label), not a kernel: on a GPU it double-counts (chapter 7)."""
    key = row.key  # type: ignore[attr-defined]
    return (
        bool(getattr(row, "is_user_annotation", False))
        or key.startswith(("ProfilerStep", "Optimizer."))
        or key == FLUSH_LABEL
    )


def bucket_of(name: str, on_gpu: bool) -> str:
    """The bucket a kernel (GPU) or op (CPU) name falls in (chapter 7)."""
    low = name.lower()
    if (on_gpu and any(p in low for p in MATMUL_KERNELS)) or (not on_gpu and name in MATMUL_OPS):
        return MATMUL
    if any(p in low for p in ATTENTION):
        return MATMUL
    if any(w in low for w in OPTIMIZER_WORDS):
        return OPTIMIZER
    if low.startswith(FUSED_PREFIXES):
        return FUSED
    if any(w in low for w in COPY_WORDS):
        return COPIES
    return OTHER


@dataclass(repr=False)
class StepProfile(Printed):
    """Seconds per step in each bucket, the step's wall time, and the largest row of each bucket (chapter 7)."""

    device: str
    step_s: float
    buckets: dict[str, float]
    examples: dict[str, str]

    @property
    def on_gpu(self) -> bool:
        """Whether the buckets are GPU kernel time (chapter 7)."""
        return self.device.startswith("cuda")

    def share(self, bucket: str) -> float:
        """`bucket`'s fraction of the step's wall time (chapter 7)."""
        return self.buckets.get(bucket, 0.0) / self.step_s

    def largest_left(self, n: int = 3) -> list[str]:
        """The `n` largest buckets that are not matrix products, largest first (chapter 7)."""
        rest = [b for b in self.buckets if b != MATMUL and self.buckets[b] > 0]
        return sorted(rest, key=self.buckets.__getitem__, reverse=True)[:n]

    def rows(self) -> list[dict[str, str]]:
        """The buckets as table rows, largest first, named in the learner's language (chapter 7)."""
        order = sorted(self.buckets, key=self.buckets.__getitem__, reverse=True)
        return [
            {
                "where the step goes": tr(b),
                "ms per step": f"{1e3 * self.buckets[b]:.3g}",
                "share of the step": f"{self.share(b):.0%}",
                "largest": self.examples.get(b, "")[:60],
            }
            for b in order
        ]

    def __str__(self) -> str:
        if self.on_gpu:
            head = tr("one step: {ms:.3g} ms of wall time, split by GPU kernels")
        else:
            head = tr("one step: {ms:.3g} ms of wall time, split by CPU ops")
        head = head.format(ms=1e3 * self.step_s)
        return head + "\n" + format_table(self.rows())


def step_profile(prof: profile, device: str | torch.device, steps_per_call: int = 1) -> StepProfile:
    """Bucket a profile_steps() profile (each profiled call `steps_per_call` optimizer steps): matmuls, optimizer, fused and other kernels, copies, idle (chapter 7)."""
    device = resolve_device(device)
    on_gpu = device.type == "cuda"
    summary = summarize_profile(prof)
    steps = summary.steps * steps_per_call
    totals: dict[str, float] = {}
    examples: dict[str, tuple[float, str]] = {}
    for row in prof.key_averages():
        if (row.device_type != DeviceType.CPU) != on_gpu or row.key.startswith("ProfilerStep"):
            continue
        if row.key == FLUSH_LABEL or (on_gpu and _is_annotation(row)):
            continue
        us = row.self_device_time_total if on_gpu else row.self_cpu_time_total
        if us <= 0:
            continue
        bucket = bucket_of(row.key, on_gpu)
        totals[bucket] = totals.get(bucket, 0.0) + us / 1e6 / steps
        if us > examples.get(bucket, (0.0, ""))[0]:
            examples[bucket] = (us, row.key)
    busy = sum(totals.values())
    idle = IDLE_GPU if on_gpu else IDLE_CPU
    step_s = summary.step_s / steps_per_call
    totals[idle] = max(0.0, step_s - busy)
    return StepProfile(str(device), step_s, totals, {b: k for b, (_, k) in examples.items()})


def cut_advice(bucket: str, on: set[str], available: set[str], on_gpu: bool) -> str:
    """What would cut `bucket`, given the levers on and those this device has (chapter 7)."""
    if bucket == OPTIMIZER:
        if "fused_adamw" not in on and "fused_adamw" in available:
            return tr(
                "fused AdamW: one kernel per parameter group instead of chains of foreach ops"
            )
        if on_gpu and "graphs" not in on and "graphs" in available:
            return tr("CUDA graphs take its launches off the CPU; its kernels stay")
        return tr(
            "it reads and writes every weight, its gradient and both Adam moments once a step: "
            "memory-bound, cut only by fewer bytes (a lighter optimizer state)"
        )
    if bucket == IDLE_GPU:
        if "graphs" not in on and "graphs" in available:
            return tr("CUDA graphs (the GPU replays the step without waiting for launches)")
        if "graphs" in on:  # the capstone graphs forward and backward, not the optimizer
            return tr(
                "the CUDA graphs hold forward and backward; the optimizer step and gradient "
                "clipping still launch kernel by kernel outside them: capture those too "
                "(torch.compile the optimizer step), or give each launch more work (a bigger batch)"
            )
        return tr("more work per launch: a bigger batch, or fewer, larger kernels")
    if bucket == IDLE_CPU:
        if "resident" in on:
            return tr(
                "the rest is Python and dispatch per op, which a bigger batch spreads thinner"
            )
        return tr(
            "resident data takes the DataLoader's share of it; the rest is Python and dispatch "
            "per op, which a bigger batch spreads thinner"
        )
    if bucket == FUSED:
        return tr(
            "already fused by torch.compile (norms, GELU, residual adds and their backward); "
            "memory-bound: fewer bytes per element would cut them, not fewer launches"
        )
    if bucket == COPIES:
        if "resident" not in on:
            return tr("resident data: the batch gathered on the device, no copy per step")
        return tr("casts and layout copies: torch.compile folds many of them into its kernels")
    if "compile" not in on and "compile" in available:
        return tr(
            "torch.compile fuses these elementwise kernels and their backward (where compiling "
            "pays off: section 5.5)"
        )
    return tr("ops no lever here fuses: the table above names them")


def advice(profile_: StepProfile, on: list[str], available: list[str], n: int = 3) -> list[str]:
    """One line per large non-matmul bucket left: its share and what would cut it (chapter 7)."""
    return [
        tr("{bucket}: {share:.0%} of the step; {advice}").format(
            bucket=tr(b),
            share=profile_.share(b),
            advice=cut_advice(b, set(on), set(available), profile_.on_gpu),
        )
        for b in profile_.largest_left(n)
    ]
