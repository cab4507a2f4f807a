"""Model FLOPs utilisation: counted FLOPs per step over its measured time, against a peak (chapter 6)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers.devices import native_bf16, resolve_device
from helpers.dtypes import dtype_name, parse_dtype
from helpers.i18n import tr, tr_mark
from helpers.machine_state import MachineState
from helpers.matmul import achievable_rate, matmul_peak_flops, tf32_available, tf32_enabled
from helpers.timing import benchmark
from helpers.units import Printed, format_seconds


def _positive(value: object, name: str, unit: str) -> float:
    """`value` as a float if it is a finite number > 0, else a clear ValueError (chapter 6)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            tr("{name} must be a number of {unit} > 0, got {value!r}.").format(
                name=name, unit=tr(unit), value=value
            )
        )
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            tr(
                "{name} must be a finite number of {unit} > 0, got {value!r}. "
                "A zero or negative {name} means the measurement went wrong: measure again."
            ).format(name=name, unit=tr(unit), value=value)
        )
    return float(value)


def count_flops(fn: Callable[..., object], *args: object, **kwargs: object) -> int:
    """FLOPs of one call fn(*args, **kwargs), counted by FlopCounterMode (chapter 6)."""
    if not callable(fn):
        raise TypeError(
            tr("count_flops needs a function to call, got {type}.").format(type=type(fn).__name__)
        )
    return sum(flops_by_op(fn, *args, **kwargs).values())


def flops_by_op(fn: Callable[..., object], *args: object, **kwargs: object) -> dict[str, int]:
    """FLOPs of one call of fn per counted op, e.g. {'aten.mm': ..., 'aten.addmm': ...} (chapter 6)."""
    with FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    totals = counter.get_flop_counts().get("Global", {})
    return {str(op).removesuffix(".default"): int(n) for op, n in totals.items()}


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation, a fraction: flops / seconds / peak FLOP/s (chapter 6)."""
    flops = _positive(flops, "flops", tr_mark("floating-point operations"))
    seconds = _positive(seconds, "seconds", tr_mark("seconds"))
    peak = _positive(peak, "peak", "FLOP/s")
    return flops / seconds / peak


def mfu_precision(device: str | torch.device) -> torch.dtype:
    """bf16 on a CUDA or ROCm GPU with native bf16 (which has a datasheet bf16 peak), else fp32 (chapter 6)."""
    device = resolve_device(device)
    if device.type == "cuda" and native_bf16(device):
        return torch.bfloat16
    return torch.float32


@dataclass
class Peak:
    """A reference FLOP/s for MFU and where it came from (chapter 6)."""

    flops: float
    source: str
    measured: bool

    def __str__(self) -> str:
        return tr("{tflops:.3g} TFLOP/s ({source})").format(
            tflops=self.flops / 1e12, source=self.source
        )


def reference_peak(
    device: str | torch.device,
    dtype: str | torch.dtype = torch.float32,
    shapes: Sequence[tuple[int, int, int]] | None = None,
) -> Peak:
    """Datasheet peak where helpers.peaks knows the GPU, else achievable_peak, measured here (chapter 6)."""
    device, dtype = resolve_device(device), parse_dtype(dtype)
    known = matmul_peak_flops(device, dtype)  # None unless the table knows this GPU
    if known is None:
        return achievable_peak(device, dtype, shapes)
    tf32 = dtype == torch.float32 and tf32_enabled()
    name = torch.cuda.get_device_name(device)
    kind = "tf32" if tf32 else dtype_name(dtype)
    source = tr("datasheet dense {kind} peak of {name}").format(kind=kind, name=name)
    return Peak(known, source, measured=False)


@dataclass
class MfuResult(Printed):
    """FLOPs per step, measured seconds per step and the peak they are compared with (chapter 6)."""

    flops: int
    seconds: float
    peak: Peak
    achievable: Peak | None = None
    #: What else the machine was doing while the step was timed (helpers.machine_state).
    machine: MachineState | None = None

    @property
    def achieved(self) -> float:
        """Achieved FLOP/s (chapter 6)."""
        return self.flops / self.seconds

    @property
    def mfu(self) -> float:
        """The fraction of the peak reached (chapter 6)."""
        return mfu(self.flops, self.seconds, self.peak.flops)

    def __str__(self) -> str:
        text = tr(
            "{gflop:.3g} GFLOP per step in {time} = {rate:.4g} GFLOP/s, MFU {mfu:.1%} of the "
            "peak, {peak}"
        ).format(
            gflop=self.flops / 1e9,
            time=format_seconds(self.seconds),
            rate=self.achieved / 1e9,
            mfu=self.mfu,
            peak=self.peak,
        )
        if self.achievable is not None:
            share = mfu(self.flops, self.seconds, self.achievable.flops)
            text += "\n" + tr("{share:.1%} of the achievable rate, {peak}").format(
                share=share, peak=self.achievable
            )
        if self.mfu > 1:
            fix = (
                tr("It was measured under load or with too few sizes: measure it again.")
                if self.peak.measured
                else tr("Check the peak for this GPU and dtype (is TF32 or another dtype in use?).")
            )
            text += "\n" + tr("MFU above 100%: the reference is wrong, not the step. ") + fix
        if self.machine is not None:
            text += f"\n{self.machine}"
        return text


def measure_mfu(
    step: Callable[[], object],
    device: str | torch.device,
    peak: Peak | None = None,
    min_run_time: float = 0.5,
    flops: int | None = None,
    achievable: Peak | None = None,
) -> MfuResult:
    """Count one step's FLOPs (unless given), time it with helpers.timing.benchmark, compare with `peak` (chapter 6)."""
    device = resolve_device(device)
    flops = count_flops(step) if flops is None else flops
    if flops <= 0:
        raise ValueError(
            tr(
                "FlopCounterMode counted no FLOPs in this step: it counts matmuls, convolutions "
                "and attention only, so a step without them has no MFU."
            )
        )
    timing = benchmark(step, device=device, warmup=1, min_run_time=min_run_time, min_repeats=3)
    peak = peak or reference_peak(device)
    return MfuResult(flops, timing.median, peak, achievable, timing.machine)


def achievable_peak(
    device: str | torch.device,
    dtype: str | torch.dtype = torch.float32,
    shapes: Sequence[tuple[int, int, int]] | None = None,
) -> Peak:
    """The best matmul rate of a short MAMF search here (chapter 1's), TF32 where fp32 runs as TF32 now, as a reference for MFU (chapter 6)."""
    device, dtype = resolve_device(device), parse_dtype(dtype)
    if shapes is not None and not shapes:
        raise ValueError(
            tr("shapes must name at least one (m, k, n) to measure, e.g. [(1024, 1024, 1024)].")
        )
    # an fp32 step with TF32 on is compared with TF32 matmuls, as reference_peak does
    tf32 = dtype == torch.float32 and tf32_enabled() and tf32_available(device)
    search = achievable_rate("tf32" if tf32 else dtype, device, shapes)
    best = search.best()
    if best is None:
        raise RuntimeError(
            tr(
                "No matmul shape could be measured on {device} ({why}): "
                "MFU has no achievable reference here."
            ).format(device=device, why=search.stopped)
        )
    m, k, n = best["m, k, n"]  # written out, so that a Peak in brackets has no brackets inside
    source = tr("best {dtype} matmul measured here, m={m}, k={k}, n={n}").format(
        dtype=search.dtype, m=m, k=k, n=n
    )
    return Peak(best["GFLOP/s"] * 1e9, source, measured=True)
