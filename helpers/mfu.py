"""Model FLOPs utilisation: counted FLOPs per step over measured time, against a peak (chapter 6).

FLOPs come from ``torch.utils.flop_counter.FlopCounterMode``, which counts the matrix
multiplications, convolutions and attention that dominate a model's arithmetic (elementwise
ops are not counted, by the usual MFU convention). The peak is the datasheet figure where
:func:`helpers.devices.peak_flops` knows the GPU, otherwise the best matmul rate measured
here, which says how close a step gets to what this device's matmul actually achieves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers.devices import dtype_name, parse_dtype, peak_flops, resolve_device
from helpers.sweeps import positive_int
from helpers.timing import benchmark, format_seconds


def _positive(value: object, name: str, unit: str) -> float:
    """`value` as a float if it is a finite number > 0, else a clear ValueError (chapter 6)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of {unit} > 0, got {value!r}.")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{name} must be a finite number of {unit} > 0, got {value!r}. "
            f"A zero or negative {name} means the measurement went wrong: measure again."
        )
    return float(value)


def count_flops(fn: Callable[..., object], *args: object, **kwargs: object) -> int:
    """FLOPs of one call fn(*args, **kwargs), counted by FlopCounterMode (chapter 6)."""
    if not callable(fn):
        raise TypeError(f"count_flops needs a function to call, got {type(fn).__name__}.")
    with FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    return int(counter.get_total_flops())


def flops_by_op(fn: Callable[..., object], *args: object, **kwargs: object) -> dict[str, int]:
    """FLOPs of one call of fn per counted op, e.g. {'aten.mm': ..., 'aten.addmm': ...} (chapter 6)."""
    with FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    totals = counter.get_flop_counts().get("Global", {})
    return {str(op).removesuffix(".default"): int(n) for op, n in totals.items()}


def mfu(flops: float, seconds: float, peak: float) -> float:
    """Model FLOPs utilisation, a fraction: flops / seconds / peak FLOP/s (chapter 6)."""
    flops = _positive(flops, "flops", "floating-point operations")
    seconds = _positive(seconds, "seconds", "seconds")
    peak = _positive(peak, "peak", "FLOP/s")
    return flops / seconds / peak


def matmul_rate(
    device: str | torch.device, n: int, dtype: str | torch.dtype = torch.float32
) -> float:
    """Measured FLOP/s of an n x n @ n x n matmul on `device` (2 n^3 FLOPs per call) (chapter 6)."""
    n = positive_int(n, "n")
    device, dtype = resolve_device(device), parse_dtype(dtype)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    result = benchmark(torch.matmul, a, b, device=device, warmup=2, min_run_time=0.1, min_repeats=3)
    return result.rate(2 * n**3)


@dataclass
class Peak:
    """A reference FLOP/s for MFU and where it came from (chapter 6)."""

    flops: float
    source: str
    measured: bool

    def __str__(self) -> str:
        return f"{self.flops / 1e12:.3g} TFLOP/s ({self.source})"


def reference_peak(
    device: str | torch.device,
    dtype: str | torch.dtype = torch.float32,
    sizes: Sequence[int] = (512, 1024, 2048),
) -> Peak:
    """Datasheet peak where helpers.devices knows the GPU, else the best matmul rate measured here (chapter 6)."""
    device, dtype = resolve_device(device), parse_dtype(dtype)
    if not sizes:
        raise ValueError("sizes must name at least one matrix size to measure, e.g. (1024, 2048).")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        tf32 = dtype == torch.float32 and torch.get_float32_matmul_precision() != "highest"
        known = peak_flops(name, dtype, tf32=tf32)
        if known is not None:
            kind = "tf32" if tf32 else dtype_name(dtype)
            return Peak(known, f"datasheet dense {kind} peak of {name}", measured=False)
    rates = {n: matmul_rate(device, n, dtype) for n in sizes}
    best = max(rates, key=rates.get)
    return Peak(
        rates[best],
        f"best {dtype_name(dtype)} matmul measured here (n={best}); no datasheet peak known",
        measured=True,
    )


@dataclass
class MfuResult:
    """FLOPs per step, measured seconds per step and the peak they are compared with (chapter 6)."""

    flops: int
    seconds: float
    peak: Peak

    @property
    def achieved(self) -> float:
        """Achieved FLOP/s (chapter 6)."""
        return self.flops / self.seconds

    @property
    def mfu(self) -> float:
        """The fraction of the peak reached (chapter 6)."""
        return mfu(self.flops, self.seconds, self.peak.flops)

    def __str__(self) -> str:
        return (
            f"{self.flops / 1e9:.3g} GFLOP per step in {format_seconds(self.seconds)} = "
            f"{self.achieved / 1e9:.4g} GFLOP/s, MFU {self.mfu:.1%} of {self.peak}"
        )

    def _repr_pretty_(self, p, cycle) -> None:  # noqa: ANN001 - IPython's printer protocol
        p.text(str(self))


def measure_mfu(
    step: Callable[[], object],
    device: str | torch.device,
    peak: Peak | None = None,
    min_run_time: float = 0.5,
    flops: int | None = None,
) -> MfuResult:
    """Count one step's FLOPs (unless given), time it with helpers.timing.benchmark, compare with `peak` (chapter 6)."""
    device = resolve_device(device)
    flops = count_flops(step) if flops is None else flops
    if flops <= 0:
        raise ValueError(
            "FlopCounterMode counted no FLOPs in this step: it counts matmuls, convolutions and "
            "attention only, so a step without them has no MFU."
        )
    seconds = benchmark(step, device=device, warmup=1, min_run_time=min_run_time, min_repeats=3)
    return MfuResult(flops, seconds.median, peak or reference_peak(device))
