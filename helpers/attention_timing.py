"""Timing attention forwards side by side: SDPA (each kernel it has), the PyTorch tiles, the
written-out attention and the Triton kernel, with the memory each needs (chapter 8)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch.nn.attention import SDPBackend, sdpa_kernel

from helpers.attention_errors import (
    allowed_factor,
    error_ratios,
    judge_inputs,
    kernel_results,
    output_ratio,
)
from helpers.attention_tiles import loglog_slope
from helpers.attention_triton import triton_attention, triton_flash_forward, triton_status
from helpers.devices import native_bf16, resolve_device
from helpers.flash_attention import flash_forward
from helpers.gpt import manual_attention
from helpers.i18n import tr, tr_mark
from helpers.machine_state import MachineState, merge_states
from helpers.memory import track_peak
from helpers.sweeps import free_cached_memory, is_out_of_memory
from helpers.timing import benchmark
from helpers.units import GiB, MiB, Printed
from helpers.validate import first_line
from helpers.verdicts import Verdict, compare_rows

#: The sequence lengths the GPU sweep times, and the CPU's shorter version of it.
GPU_LENGTHS = (512, 1024, 2048, 4096, 8192)
CPU_LENGTHS = (128, 256, 512)
#: SDPA's kernels, timed one by one so the fastest can be named (the default pick is one of them).
SDPA_KERNELS = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION"}  # fmt: skip
#: The method every other is checked against: SDPA free to pick its kernel.
REFERENCE = "sdpa default"
#: Query and key tiles of the PyTorch tiles in the sweep: bigger tiles, fewer launches.
GPU_TILE = 128
#: The longest T the PyTorch tiles are timed at on a GPU: the verdicts read them at T >= 2048.
TILES_MAX_T = 4096
#: The timing table's columns, in order; a row has one of the two rates (rate_unit).
TIMING_COLUMNS = (tr_mark("row"), "ms", "IQR ms", "TFLOP/s", "GFLOP/s", tr_mark("peak MiB"), tr_mark("note"))  # fmt: skip
#: The other tables' column names (keys the notebook reads; a printed table translates them).
_COLUMNS = (
    tr_mark("method"), tr_mark("worst / allowed"), tr_mark("rule"), tr_mark("at least MiB"),
    tr_mark("below MiB"), tr_mark("holds"), tr_mark("pass"), tr_mark("causal"), tr_mark("run"),
    tr_mark("worst"), tr_mark("x PyTorch's error"), tr_mark("allowed"), tr_mark("passes"),
)  # fmt: skip


@dataclass
class SweepPlan(Printed):
    """What the attention timing sweep runs on a device: shape, dtype, lengths, methods, skips (chapter 8)."""

    device: torch.device
    dtype: torch.dtype
    batch: int
    heads: int
    head_dim: int
    lengths: tuple[int, ...]
    methods: tuple[str, ...]
    why_dtype: str = ""
    skips: dict[tuple[str, int], str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        text = tr(
            "{device}: batch {batch} x {heads} heads x head_dim {head_dim}, {dtype} ({why}), "
            "causal; T = {lengths}; methods: {methods}"
        ).format(
            device=self.device,
            batch=self.batch,
            heads=self.heads,
            head_dim=self.head_dim,
            dtype=str(self.dtype).removeprefix("torch."),
            why=self.why_dtype,
            lengths=", ".join(map(str, self.lengths)),
            methods=", ".join(self.methods),
        )
        skipped = tr("skipped {method} at T = {t}: {why}")
        return text + "".join(
            "\n  " + skipped.format(method=m, t=t, why=why) for (m, t), why in self.skips.items()
        )


def written_out_bytes(batch: int, heads: int, t: int, itemsize: int) -> int:
    """Bytes the written-out attention's forward holds at once: scores, masked scores, probabilities, mask (chapter 8)."""
    return 3 * batch * heads * t * t * itemsize + t * t


def sweep_dtype(device: torch.device) -> tuple[torch.dtype, str]:
    """bf16 where the GPU has it natively, fp16 on older GPUs (a T4), fp32 on a CPU; and why (chapter 8)."""
    if device.type == "cpu":
        return torch.float32, tr("a CPU: fp32, its fast format")
    if native_bf16(device):
        return torch.bfloat16, tr("bf16: the format attention trains in")
    if device.type == "cuda":
        return torch.float16, tr("this GPU has no native bf16 (before Ampere): fp16 instead")
    return torch.float16, tr("no bf16 on this {device} device: fp16 instead").format(
        device=device.type
    )


def sweep_plan(device: str | torch.device, lengths: Sequence[int] | None = None) -> SweepPlan:
    """The sweep for `device`: T = 512..8192 on a GPU, shorter on a CPU; what is skipped and why (chapter 8)."""
    device = resolve_device(device)
    gpu = device.type == "cuda"
    dtype, why = sweep_dtype(device)
    lengths = tuple(lengths or (GPU_LENGTHS if gpu else CPU_LENGTHS))
    batch, heads = (4, 16) if gpu else (1, 4)
    kernels = [k for k, name in SDPA_KERNELS.items() if hasattr(SDPBackend, name)]
    methods = [*(f"sdpa {k}" for k in kernels), "sdpa default"] if gpu else ["sdpa default"]
    methods += ["pytorch tiles", "written out"]
    status = triton_status(device)
    if status.mode == "compiled":
        methods.append("triton")
    plan = SweepPlan(device, dtype, batch, heads, 64, lengths, tuple(methods), why)
    if status.mode != "compiled":
        plan.notes.append(
            tr(
                "triton not timed (it needs a kernel compiled for an NVIDIA or AMD GPU): {status}"
            ).format(status=status)
        )
    if device.type == "mps":
        plan.notes.append(
            tr(
                "an Apple GPU (MPS): the CPU's shorter lengths and batch, and SDPA's default only "
                "(its per-kernel rows are CUDA kernels); no peak memory column: MPS reports the "
                "memory allocated now, not a peak, and sampling it every ms is too coarse for one "
                "forward; section 1's saved bytes are the measure of memory here"
            )
        )
    elif not gpu:
        plan.notes.append(
            tr(
                "no peak memory column: on a CPU it would be process RSS sampled every ms (chapter "
                "1), too coarse for one forward; section 1's saved bytes are the CPU's measure"
            )
        )
    budget = 0.6 * (torch.cuda.get_device_properties(device).total_memory if gpu else 8 * GiB)
    for t in lengths:
        need = written_out_bytes(batch, heads, t, dtype.itemsize)
        if need > budget:
            plan.skips[("written out", t)] = tr(
                "needs about {gib:.1f} GiB, over 60% of the memory"
            ).format(gib=need / GiB)
    if gpu:
        plan.skips.update(long_tile_skips(lengths))
    return plan


def long_tile_skips(lengths: Sequence[int], longest: int = TILES_MAX_T, tile: int = GPU_TILE) -> dict[tuple[str, int], str]:  # fmt: skip
    """The PyTorch tiles' rows a GPU sweep leaves out, above T = longest, and why (chapter 8)."""
    skips = {}
    steps = lambda t: -(-t // tile) * (-(-t // tile) + 1) // 2  # noqa: E731 - causal: up to the diagonal
    for t in lengths:
        if t > longest:
            skips[("pytorch tiles", t)] = tr(
                "left out above T = {longest} on a GPU: one call launches the kernels of "
                "{steps:,} tile steps from Python (tiles of {tile}, up to the diagonal), {times:.1f} "
                "times as many as at T = {longest}, for a row no verdict reads (they compare T = 2048 to {longest})"
            ).format(longest=longest, steps=steps(t), tile=tile, times=steps(t) / steps(longest))
    return skips


def _sdpa_with(
    kernel: str | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """Causal SDPA, restricted to one of its kernels (SDPA_KERNELS) or free to pick (None) (chapter 8)."""
    if kernel is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with sdpa_kernel(getattr(SDPBackend, SDPA_KERNELS[kernel])):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def timed_method(name: str, device: torch.device) -> tuple[contextlib.AbstractContextManager[Any], Callable[..., torch.Tensor]]:  # fmt: skip
    """The context _time_one enters once around a method's whole benchmark, and the function it times inside (chapter 8).

    An SDPA kernel's row enters sdpa_kernel once, so each timed call is the SDPA call alone.
    Entered on every call (method_function's form, kept for single calls), the context
    manager's Python cost was timed too: on the H200 audit run (torch 2.11) SDPA's default
    came out 2-2.4x faster at T = 512-1024 than every kernel it picks from.
    """
    kernel = name.removeprefix("sdpa ")
    if name != REFERENCE and kernel in SDPA_KERNELS:
        return sdpa_kernel(getattr(SDPBackend, SDPA_KERNELS[kernel])), partial(_sdpa_with, None)
    return contextlib.nullcontext(), method_function(name, device)


def method_function(name: str, device: torch.device) -> Callable[..., torch.Tensor]:
    """The causal forward a method name stands for, as f(q, k, v) -> output (chapter 8)."""
    tile = GPU_TILE
    functions: dict[str, Callable[..., Any]] = {
        REFERENCE: partial(_sdpa_with, None),
        "pytorch tiles": lambda q, k, v: flash_forward(q, k, v, True, tile, tile)[0],
        "written out": manual_attention,
        "triton": lambda q, k, v: triton_flash_forward(q, k, v, True)[0],
        **{f"sdpa {k}": partial(_sdpa_with, k) for k in SDPA_KERNELS},
    }
    if name not in functions:
        raise ValueError(
            tr("Unknown method {name!r}; known: {known}.").format(
                name=name, known=", ".join(functions)
            )
        )
    return functions[name]


def causal_forward_flops(batch: int, heads: int, t: int, head_dim: int) -> int:
    """FLOPs of a causal attention forward: two T x T x d matmuls, half of them masked (chapter 8)."""
    return 2 * batch * heads * t * t * head_dim


def rate_unit(device: torch.device) -> tuple[str, float]:
    """The rate column's name and FLOP/s per unit: TFLOP/s on a CUDA GPU, GFLOP/s on a CPU or MPS (chapter 8).

    A CPU's attention runs at a few GFLOP/s; in TFLOP/s its rows read 0.00-something.
    """
    return ("TFLOP/s", 1e12) if device.type == "cuda" else ("GFLOP/s", 1e9)


def check_against_float64(plan: SweepPlan, fn: Callable[..., torch.Tensor], t: int = 200) -> float:
    """fn's largest output error against float64 over allowed_factor x plain PyTorch's in the plan's dtype (chapter 8).

    At most 1 passes (helpers.attention_errors: the rule adapted from FlashAttention's tests). The
    default T = 200 is not a multiple of any tile the methods use.
    """
    g = torch.Generator().manual_seed(t)
    q, k, v = (torch.randn(1, 2, t, plan.head_dim, generator=g).to(plan.device, plan.dtype) for _ in "qkv")  # fmt: skip
    with torch.no_grad():
        got = fn(q, k, v)
    return output_ratio(got, q, k, v, causal=True)["ratio"] / allowed_factor(plan.dtype)


def check_methods(plan: SweepPlan, t: int = 200) -> list[dict[str, Any]]:
    """check_against_float64 for every method; one that cannot run here is skipped in the plan (chapter 8).

    Every method, SDPA's default included, is judged against float64, with the yardstick of
    the attention written out in the plan's dtype (whose own row is 1 / the factor).
    """
    rows = []
    for name in plan.methods:
        row = {"method": name}
        try:
            ratio = check_against_float64(plan, method_function(name, plan.device), t)
        except RuntimeError as exc:  # e.g. an SDPA kernel this GPU, dtype or build lacks
            why = tr("did not run in the check")
            plan.skips.update({(name, length): why for length in plan.lengths})
            rows.append({**row, "worst / allowed": math.nan, "note": first_line(exc)})
            continue
        rows.append({**row, "worst / allowed": ratio, "note": ""})
    return rows


def sweep_inputs(plan: SweepPlan, t: int) -> list[torch.Tensor]:
    """q, k, v of the plan's shape at length t, on its device in its dtype, seeded by t (chapter 8)."""
    g = torch.Generator().manual_seed(t)
    shape = (plan.batch, plan.heads, t, plan.head_dim)
    return [torch.randn(shape, generator=g).to(plan.device, plan.dtype) for _ in "qkv"]


def _time_one(plan: SweepPlan, name: str, t: int, min_run_time: float) -> dict[str, Any]:
    """One row: median ms, IQR, the rate (rate_unit) and peak memory of one method at one T (chapter 8)."""
    row: dict[str, Any] = {"row": f"{name} @ {t}", "T": t, "method": name}
    if (name, t) in plan.skips:
        return {**row, "note": plan.skips[(name, t)]}
    context, fn = timed_method(name, plan.device)
    q, k, v = sweep_inputs(plan, t)
    try:
        with context, torch.no_grad():
            with track_peak(plan.device) as peak:
                fn(q, k, v)
            result = benchmark(fn, q, k, v, device=plan.device, label=row["row"], min_run_time=min_run_time)  # fmt: skip
    except RuntimeError as exc:  # a kernel this GPU or dtype lacks, or out of memory
        if is_out_of_memory(exc):
            free_cached_memory()
        return {**row, "note": tr("did not run: {error}").format(error=first_line(exc))}
    flops = causal_forward_flops(plan.batch, plan.heads, t, plan.head_dim)
    row.update({"ms": result.median * 1e3, "IQR ms": result.iqr * 1e3})
    unit, per = rate_unit(plan.device)
    row[unit] = flops / result.median / per
    if plan.device.type == "cuda":  # exact there: max_memory_allocated
        row["peak MiB"] = peak.increase / MiB
    return {**row, "machine": result.machine, "note": ""}


def attention_timing_sweep(plan: SweepPlan, min_run_time: float = 0.3) -> list[dict[str, Any]]:
    """Every method of the plan at every T: one row each, a note where it was skipped or failed (chapter 8)."""
    return [_time_one(plan, name, t, min_run_time) for t in plan.lengths for name in plan.methods]


def sweep_machine(rows: Sequence[dict[str, Any]]) -> MachineState | None:
    """The machine state over all the sweep's timed windows, merged (chapter 8)."""
    return merge_states([r["machine"] for r in rows if r.get("machine") is not None])


def fastest_sdpa(rows: Sequence[dict[str, Any]], t: int) -> str | None:
    """The row name of SDPA's fastest kernel at T = t, or None if none ran (chapter 8)."""
    timed = [r for r in rows if r["T"] == t and r["method"].startswith("sdpa") and "ms" in r]
    return min(timed, key=lambda r: r["ms"])["row"] if timed else None


def triton_verdicts(rows: Sequence[dict[str, Any]], min_t: int = 2048) -> list[Verdict]:
    """At each T >= min_t where Triton ran: Triton vs SDPA's fastest kernel, and vs the PyTorch tiles (chapter 8)."""
    machine = sweep_machine(rows)
    verdicts = []
    names = {r["row"] for r in rows if "ms" in r}
    for t in sorted({r["T"] for r in rows if r["T"] >= min_t}):
        mine = f"triton @ {t}"
        if mine not in names:
            continue
        for other in (fastest_sdpa(rows, t), f"pytorch tiles @ {t}"):
            if other in names:
                verdicts.append(compare_rows(rows, "row", mine, other, "ms", iqr="IQR ms", machine=machine))  # fmt: skip
    return verdicts


def memory_slopes(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per method with a peak at two or more T: how its peak memory grows, as a power of T (chapter 8)."""
    slopes = {}
    for method in dict.fromkeys(r["method"] for r in rows):
        measured = [r for r in rows if r["method"] == method and r.get("peak MiB", 0) > 0]
        if len(measured) >= 2:
            slopes[method] = loglog_slope([r["T"] for r in measured], [r["peak MiB"] for r in measured])  # fmt: skip
    return slopes


#: The caching allocator hands out whole multiples of 512 bytes (without roundup_power2_divisions).
ALLOCATOR_ROUNDING = 512
#: SDPA's fused kernels: by construction they never hold a T x T matrix of scores.
FUSED_SDPA = tuple(f"sdpa {k}" for k in SDPA_KERNELS)


def peak_rule(plan: SweepPlan, method: str, t: int) -> tuple[int, int | None, str]:
    """Bytes a method's peak must reach, must stay below (None: no limit), and the rule, at T = t (chapter 8).

    Every method holds its output, B x H x T x d in the input dtype. The written-out attention
    holds at least one T x T tensor of scores, B x H x T^2 of them. SDPA's fused kernels and the
    Triton kernel never do; the Triton kernel allocates exactly the output and a float32
    log-sum-exp per row, each rounded up to the caching allocator's 512 bytes. SDPA's default
    may fall back to its math kernel and the PyTorch tiles hold several fp32 tiles: only the
    output is certain for them.
    """
    rows, size = plan.batch * plan.heads * t, plan.dtype.itemsize
    out, lse, scores = rows * plan.head_dim * size, rows * 4, rows * t * size
    if method == "written out":
        return scores, None, tr_mark(">= one T x T tensor of scores")
    if method == "triton":
        return out + lse, out + lse + 2 * ALLOCATOR_ROUNDING, tr_mark("= output + lse (allocator rounding)")  # fmt: skip
    if method in FUSED_SDPA:
        return out, scores, tr_mark(">= output, < one T x T tensor")
    return out, None, tr_mark(">= output")


def peak_checks(plan: SweepPlan, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with an exact peak (CUDA) against peak_rule: a table row, "holds" True where it does (chapter 8)."""
    checks = []
    for r in rows:
        if "peak MiB" not in r:
            continue
        low, high, rule = peak_rule(plan, r["method"], r["T"])
        peak = round(r["peak MiB"] * MiB)  # the increase in bytes, an integer
        checks.append(
            {
                "row": r["row"],
                "peak MiB": r["peak MiB"],
                "rule": tr(rule),
                "at least MiB": low / MiB,
                "below MiB": "" if high is None else high / MiB,
                "holds": peak >= low and (high is None or peak < high),
            }
        )
    return checks


def plot_attention_timing(rows: Sequence[dict[str, Any]]) -> Figure:
    """Milliseconds and peak memory against T, one line per method (chapter 8)."""
    memory = any("peak MiB" in r for r in rows)
    fig, axes = plt.subplots(1, 2 if memory else 1, figsize=(11 if memory else 6.4, 3.8))
    ax_t, ax_m = (axes[0], axes[1]) if memory else (axes, None)
    for method in dict.fromkeys(r["method"] for r in rows):
        timed = [r for r in rows if r["method"] == method and "ms" in r]
        if timed:
            ts = [r["T"] for r in timed]
            ax_t.loglog(ts, [r["ms"] for r in timed], marker="o", label=method)
            if ax_m is not None:
                ax_m.loglog(ts, [max(r.get("peak MiB", 0), 1e-3) for r in timed], marker="o")
    ax_t.set(xlabel=tr("sequence length T"), ylabel=tr("ms per forward"), title=tr("time (median)"))
    if ax_m is not None:
        ax_m.set(xlabel=tr("sequence length T"), ylabel=tr("peak MiB over the inputs"), title=tr("memory"))  # fmt: skip
    for ax in [a for a in (ax_t, ax_m) if a is not None]:
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=8)
    fig.tight_layout()
    return fig


def within(rows: Sequence[dict[str, Any]], a: str, b: str) -> float:
    """How many times row a's median time is row b's: the ratio a target reads (chapter 8)."""
    ra = next(r for r in rows if r["row"] == a)
    rb = next(r for r in rows if r["row"] == b)
    return ra["ms"] / rb["ms"] if math.isfinite(rb["ms"]) and rb["ms"] > 0 else math.inf


# --- timed for training: forward, backward and both, Triton against SDPA (issue 31) -------------

#: CS336's table's head sizes, and the dtypes the full table times (16-bit first; fp16 where
#: the GPU has no native bf16). The course times them at batch 4 x 16 heads, T = 512-8192,
#: against SDPA's kernels; CS336's own table is batch 1, T up to 65536, against PyTorch.
TRAINING_HEAD_DIMS = (16, 32, 64, 128)
#: The passes timed, and their FLOPs in causal forwards: the backward's five T x T x d
#: products against the forward's two (the convention FlashAttention reports by; the chapter's
#: dQ second pass does two more, not counted).
PASS_FLOPS = {"forward": 1.0, "backward": 2.5, "forward+backward": 3.5}
#: The default training rows: forward+backward at head_dim 64 in 16-bit, at these lengths.
DEFAULT_TRAINING_LENGTHS = (2048, 8192)


@dataclass
class TrainingPlan(Printed):
    """What the training timing runs: (dtype, head_dim, T) shapes, passes and methods, or why nothing (chapter 8)."""

    device: torch.device
    batch: int
    heads: int
    shapes: list[tuple[torch.dtype, int, int]]
    passes: tuple[str, ...]
    methods: tuple[str, ...]
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.shapes:
            return tr("{device}: no training timing: {why}").format(device=self.device, why="; ".join(self.notes))  # fmt: skip
        dtypes = ", ".join(dict.fromkeys(str(d).removeprefix("torch.") for d, _, _ in self.shapes))
        return tr(
            "{device}: batch {batch} x {heads} heads, causal, {n} shapes (head_dim {dims}; T = "
            "{lengths}; {dtypes}); passes: {passes}; methods: {methods}"
        ).format(
            device=self.device, batch=self.batch, heads=self.heads, n=len(self.shapes),
            dims=", ".join(map(str, dict.fromkeys(d for _, d, _ in self.shapes))),
            lengths=", ".join(map(str, dict.fromkeys(t for _, _, t in self.shapes))),
            dtypes=dtypes, passes=", ".join(self.passes), methods=", ".join(self.methods),
        )  # fmt: skip


def training_plan(device: str | torch.device, lengths: Sequence[int] | None = None, full: bool = False) -> TrainingPlan:  # fmt: skip
    """Triton vs each SDPA kernel on a CUDA GPU: by default forward+backward at d = 64, 16-bit; full: CS336's head sizes, dtypes and passes (chapter 8).

    Full: head_dim 16-128, T = 512-8192 (or `lengths`), 16-bit and float32, forward, backward
    and both. Anywhere else no shape: the notes say why (the interpreter's speed means nothing).
    """
    device = resolve_device(device)
    status = triton_status(device)
    kernels = tuple(f"sdpa {k}" for k, name in SDPA_KERNELS.items() if hasattr(SDPBackend, name))
    plan = TrainingPlan(device, 4, 16, [], (), ("triton", *kernels))
    if device.type != "cuda" or status.mode != "compiled":
        plan.notes.append(tr("timing Triton for training needs its kernels compiled for a CUDA or ROCm GPU ({status}); Triton's interpreter runs them in NumPy, one program at a time, so its times say nothing of the kernels").format(status=status))  # fmt: skip
        return plan
    sixteen = sweep_dtype(device)[0]
    if full:
        dtypes, dims, passes = (sixteen, torch.float32), TRAINING_HEAD_DIMS, tuple(PASS_FLOPS)
        lengths = tuple(lengths or GPU_LENGTHS)
    else:
        dtypes, dims, passes, lengths = (sixteen,), (64,), ("forward+backward",), DEFAULT_TRAINING_LENGTHS  # fmt: skip
    plan.shapes = [(dt, d, t) for dt in dtypes for d in dims for t in lengths]
    plan.passes = passes
    return plan


def training_row_name(method: str, pass_: str, dtype: torch.dtype, head_dim: int, t: int) -> str:
    """The name of one training timing row, as compare_rows reads it (chapter 8)."""
    return f"{method} {pass_} d={head_dim} {str(dtype).removeprefix('torch.')} @ {t}"


def training_call(method: str, pass_: str, qkv: list[torch.Tensor], dout: torch.Tensor) -> tuple[contextlib.AbstractContextManager[Any], Callable[[], object]]:  # fmt: skip
    """The context entered once around a row's benchmark and the call it times: one pass of causal attention (chapter 8).

    q, k and v require grad, so the forward saves what backward needs, as in training. The
    backward alone runs torch.autograd.grad on one forward's graph, kept (retain_graph).
    """
    if method == "triton":
        context, attend = contextlib.nullcontext, partial(triton_attention, causal=True)
    else:
        kernel = getattr(SDPBackend, SDPA_KERNELS[method.removeprefix("sdpa ")])
        context, attend = partial(sdpa_kernel, kernel), partial(F.scaled_dot_product_attention, is_causal=True)  # fmt: skip
    if pass_ == "forward":
        return context(), lambda: attend(*qkv)
    if pass_ == "forward+backward":
        return context(), lambda: torch.autograd.grad(attend(*qkv), qkv, dout)
    with context():
        out = attend(*qkv)  # one forward; its graph is kept for the timed backwards
    return context(), lambda: torch.autograd.grad(out, qkv, dout, retain_graph=True)


def training_inputs(plan: TrainingPlan, shape: tuple[torch.dtype, int, int]) -> list[torch.Tensor]:
    """q, k, v and an upstream gradient of the plan's batch and heads at one (dtype, head_dim, T), seeded (chapter 8)."""
    dtype, d, t = shape
    g = torch.Generator().manual_seed(t + d)
    return [torch.randn(plan.batch, plan.heads, t, d, generator=g).to(plan.device, dtype) for _ in range(4)]  # fmt: skip


def _time_training(plan: TrainingPlan, method: str, pass_: str, shape: tuple[torch.dtype, int, int], min_run_time: float) -> dict[str, Any]:  # fmt: skip
    """One training row: median ms, IQR and TFLOP/s of one method's pass at one shape (chapter 8)."""
    dtype, d, t = shape
    name = training_row_name(method, pass_, dtype, d, t)
    row: dict[str, Any] = {"row": name, "method": method, "pass": pass_, "dtype": str(dtype).removeprefix("torch."), "head_dim": d, "T": t}  # fmt: skip
    q, k, v, dout = training_inputs(plan, shape)
    qkv = [x.requires_grad_() for x in (q, k, v)]
    try:
        context, call = training_call(method, pass_, qkv, dout)
        with context:
            result = benchmark(call, device=plan.device, label=name, min_run_time=min_run_time)
    except RuntimeError as exc:  # a kernel this GPU, dtype or head size lacks, or out of memory
        if is_out_of_memory(exc):
            free_cached_memory()
        return {**row, "note": tr("did not run: {error}").format(error=first_line(exc))}
    flops = PASS_FLOPS[pass_] * causal_forward_flops(plan.batch, plan.heads, t, d)
    return {**row, "ms": result.median * 1e3, "IQR ms": result.iqr * 1e3, "TFLOP/s": flops / result.median / 1e12, "machine": result.machine, "note": ""}  # fmt: skip


def training_timing(plan: TrainingPlan, min_run_time: float = 0.3) -> list[dict[str, Any]]:
    """Every method, pass and shape of the plan: one row each, a note where it did not run (chapter 8)."""
    return [
        _time_training(plan, method, pass_, shape, min_run_time)
        for shape in plan.shapes for pass_ in plan.passes for method in plan.methods
    ]  # fmt: skip


def fastest_sdpa_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Triton's rows and, per shape and pass, SDPA's fastest kernel's, noting the other kernels' times (chapter 8)."""
    kept = []
    for key in dict.fromkeys((r["dtype"], r["head_dim"], r["T"], r["pass"]) for r in rows):
        same = [r for r in rows if (r["dtype"], r["head_dim"], r["T"], r["pass"]) == key]
        sdpa = [r for r in same if r["method"].startswith("sdpa")]
        timed = [r for r in sdpa if "ms" in r]
        kept += [r for r in same if not r["method"].startswith("sdpa")]
        if timed:
            best = min(timed, key=lambda r: r["ms"])
            others = [f"{r['method']} {r['ms']:.3g} ms" if "ms" in r else tr("{method} did not run").format(method=r["method"]) for r in sdpa if r is not best]  # fmt: skip
            kept.append({**best, "note": tr("fastest SDPA kernel; {others}").format(others=", ".join(others))})  # fmt: skip
    return kept


def training_verdicts(rows: Sequence[dict[str, Any]], min_t: int = 2048) -> list[Verdict]:
    """At T >= min_t: Triton against SDPA's fastest kernel, per shape and pass, by compare_rows (chapter 8)."""
    machine = sweep_machine(rows)
    verdicts = []
    for r in rows:
        if r["method"] == "triton" and "ms" in r and r["T"] >= min_t:
            best = [s for s in rows if s["method"].startswith("sdpa") and "ms" in s and (s["dtype"], s["head_dim"], s["T"], s["pass"]) == (r["dtype"], r["head_dim"], r["T"], r["pass"])]  # fmt: skip
            if best:
                other = min(best, key=lambda s: s["ms"])["row"]
                verdicts.append(compare_rows(rows, "row", r["row"], other, "ms", iqr="IQR ms", machine=machine))  # fmt: skip
    return verdicts


#: The backward's correctness check: T = 72 is a multiple of neither the interpreter's tiles
#: (16, 32) nor a GPU's (32 to 128), so the last tiles are partial.
BACKWARD_CHECK_SHAPE = (1, 2, 72, 32)


def backward_check(device: str | torch.device) -> list[dict[str, Any]]:
    """The Triton backward's dq, dk, dv against float64 by helpers.attention_errors' rule, causal and not (chapter 8).

    Compiled on a CUDA GPU (float32 and the sweep's 16-bit dtype); on a CPU in Triton's
    interpreter, in float32 and float16 (Triton 3.9's interpreter mishandles bf16). No rows
    where Triton cannot run.
    """
    device = resolve_device(device)
    status = triton_status(device)
    if not status.runs:
        return []
    where = torch.device("cpu") if status.mode == "interpreter" else device
    sixteen = torch.float16 if where.type == "cpu" else sweep_dtype(device)[0]
    rows = []
    for dtype in (torch.float32, sixteen):
        for causal in (False, True):
            q, k, v, dout = judge_inputs(BACKWARD_CHECK_SHAPE, dtype, seed=72, device=where)
            got = kernel_results(_triton_with_lse, q, k, v, dout, causal)
            ratios = error_ratios(got, q, k, v, dout, causal)
            name = max(("dq", "dk", "dv"), key=lambda n: ratios[n]["ratio"])
            ratio, allowed = ratios[name]["ratio"], allowed_factor(dtype)
            rows.append({"dtype": str(dtype).removeprefix("torch."), "causal": causal, "T": BACKWARD_CHECK_SHAPE[2], "run": status.mode, "worst": name, "x PyTorch's error": ratio, "allowed": allowed, "passes": ratio <= allowed})  # fmt: skip
    return rows


def _triton_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """triton_attention's output (differentiable) and the forward's lse, as kernel_results takes them (chapter 8)."""
    lse = triton_flash_forward(q.detach(), k.detach(), v.detach(), causal)[1]
    return triton_attention(q, k, v, causal), lse
