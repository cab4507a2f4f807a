"""Timing attention forwards side by side: SDPA (each kernel it has), the PyTorch tiles, the
written-out attention and the Triton kernel, with the memory each needs (chapter 8)."""

from __future__ import annotations

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

from helpers.attention_tiles import loglog_slope, rounding_bound
from helpers.attention_triton import triton_flash_forward, triton_status
from helpers.devices import native_bf16, resolve_device
from helpers.flash_attention import flash_forward
from helpers.gpt import manual_attention
from helpers.i18n import tr
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
#: The timing table's columns, in order; a row has one of the two rates (rate_unit).
TIMING_COLUMNS = ("row", "ms", "IQR ms", "TFLOP/s", "GFLOP/s", "peak MiB", "note")


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
    return plan


def _sdpa_with(
    kernel: str | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """Causal SDPA, restricted to one of its kernels (SDPA_KERNELS) or free to pick (None) (chapter 8)."""
    if kernel is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with sdpa_kernel(getattr(SDPBackend, SDPA_KERNELS[kernel])):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


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
        raise ValueError(f"Unknown method {name!r}; known: {', '.join(functions)}.")
    return functions[name]


def causal_forward_flops(batch: int, heads: int, t: int, head_dim: int) -> int:
    """FLOPs of a causal attention forward: two T x T x d matmuls, half of them masked (chapter 8)."""
    return 2 * batch * heads * t * t * head_dim


def rate_unit(device: torch.device) -> tuple[str, float]:
    """The rate column's name and FLOP/s per unit: TFLOP/s on a CUDA GPU, GFLOP/s on a CPU or MPS (chapter 8).

    A CPU's attention runs at a few GFLOP/s; in TFLOP/s its rows read 0.00-something.
    """
    return ("TFLOP/s", 1e12) if device.type == "cuda" else ("GFLOP/s", 1e9)


def check_against_sdpa(plan: SweepPlan, fn: Callable[..., torch.Tensor], t: int = 256) -> float:
    """Largest |fn - SDPA| / (2 x rounding bound) at a small T on the plan's device and dtype (chapter 8)."""
    g = torch.Generator().manual_seed(t)
    q, k, v = (torch.randn(1, 2, t, plan.head_dim, generator=g).to(plan.device, plan.dtype) for _ in "qkv")  # fmt: skip
    with torch.no_grad():
        got, want = fn(q, k, v), _sdpa_with(None, q, k, v)
    low = plan.dtype if plan.dtype.itemsize < 4 else None
    bound = rounding_bound(q, k, v, torch.zeros_like(q), True, rounded_to=low)["out"]
    return ((got.cpu().double() - want.cpu().double()).abs() / (2 * bound)).max().item()


def check_methods(plan: SweepPlan, t: int = 256) -> list[dict[str, Any]]:
    """check_against_sdpa for every method; one that cannot run here is skipped in the plan (chapter 8).

    Each row says what it was checked against: the reference's own row is SDPA against a
    second run of itself, the noise of the reference (0 where its kernel is deterministic).
    """
    rows = []
    for name in plan.methods:
        against = tr("itself, run again: the reference's own noise") if name == REFERENCE else REFERENCE  # fmt: skip
        row = {"method": name, "against": against}
        try:
            ratio = check_against_sdpa(plan, method_function(name, plan.device), t)
        except RuntimeError as exc:  # e.g. an SDPA kernel this GPU, dtype or build lacks
            why = tr("did not run in the check")
            plan.skips.update({(name, length): why for length in plan.lengths})
            rows.append({**row, "worst / bound": math.nan, "note": first_line(exc)})
            continue
        rows.append({**row, "worst / bound": ratio, "note": ""})
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
    fn = method_function(name, plan.device)
    q, k, v = sweep_inputs(plan, t)
    try:
        with torch.no_grad(), track_peak(plan.device) as peak:
            fn(q, k, v)
        with torch.no_grad():
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
        return scores, None, ">= one T x T tensor of scores"
    if method == "triton":
        return out + lse, out + lse + 2 * ALLOCATOR_ROUNDING, "= output + lse (allocator rounding)"
    if method in FUSED_SDPA:
        return out, scores, ">= output, < one T x T tensor"
    return out, None, ">= output"


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
                "rule": rule,
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
    ax_t.set(xlabel="sequence length T", ylabel="ms per forward", title="time (median)")
    if ax_m is not None:
        ax_m.set(xlabel="sequence length T", ylabel="peak MiB over the inputs", title="memory")
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
