"""The matmul size sweep: median time, achieved GFLOP/s and share of peak per size (chapter 1).

``run_matmul_sweep`` times ``a @ b`` for square n x n matrices made directly on the device,
through :func:`helpers.timing.benchmark` (warm-up, sync, repeats, median) and
:func:`helpers.sweeps.run_sweep` (out-of-memory safe). ``run_speedup`` does it on the CPU and
on an accelerator and divides. Sizes whose single call would take longer than
``max_call_seconds`` (fp16 on a CPU, say) are skipped and listed, never guessed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

from helpers.devices import (
    DeviceError,
    available_devices,
    check_dtype,
    dtype_name,
    is_rocm,
    parse_dtype,
    peak_flops,
    resolve_device,
    synchronize,
)
from helpers.sweeps import SweepResult, run_sweep
from helpers.timing import benchmark
from helpers.validate import positive_int, positive_seconds

#: The sizes the widget offers: powers of two from 16 to 16384.
SIZE_CHOICES: list[int] = [2**k for k in range(4, 15)]

#: The size a sweep first calibrates on when it starts big, to predict how long a call takes.
_PROBE_N = 256

#: What a sweep says where the datasheet table has no figure for the device and dtype.
SWEEP_UNKNOWN_PEAK = (
    "unknown (no datasheet figure for this device and dtype: the best GFLOP/s of a sweep up "
    "to large n is its achievable rate)"
)

#: The dtypes the widget offers, by their short names ("tf32" joins them where it exists).
DTYPE_CHOICES: list[str] = ["fp32", "bf16", "fp16", "fp64"]


def tf32_available(device: str | torch.device | None = None) -> bool:
    """Whether `device` has TF32 tensor cores: an NVIDIA GPU of compute capability 8.0+ (chapter 1)."""
    device = resolve_device(device)
    if device.type != "cuda" or is_rocm():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def dtype_choices(device: str | torch.device | None = None) -> list[str]:
    """The sweep's precisions on `device`: DTYPE_CHOICES, with "tf32" after fp32 where it exists (chapter 1)."""
    return DTYPE_CHOICES[:1] + ["tf32"] * tf32_available(device) + DTYPE_CHOICES[1:]


@contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """Inside the block fp32 matmuls run as TF32 (enabled) or as true fp32; restored after (chapter 1)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def _precision(device: torch.device, dtype: str | torch.dtype) -> tuple[torch.dtype, bool]:
    """(tensor dtype, TF32 on?) for a sweep's `dtype`, which may be "tf32" where it exists (chapter 1)."""
    if isinstance(dtype, str) and dtype.strip().lower() in ("tf32", "tensorfloat32"):
        if not tf32_available(device):
            raise DeviceError(
                f"TF32 needs an NVIDIA GPU of compute capability 8.0 or newer (Ampere+); "
                f"{device} has none. Use 'fp32' here. Devices here: {', '.join(available_devices())}."
            )
        return torch.float32, True
    return check_dtype(device, dtype), False


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an (m x k) @ (k x n) matmul: m*n dot products of k multiply-adds, 2*m*k*n (chapter 1)."""
    m, k, n = positive_int(m, "m"), positive_int(k, "k"), positive_int(n, "n")
    return 2 * m * k * n


def doubling_sizes(smallest: int, largest: int) -> list[int]:
    """smallest, 2*smallest, 4*smallest ... up to largest: 64, 1024 -> [64, 128, 256, 512, 1024] (chapter 1)."""
    smallest, largest = positive_int(smallest, "smallest"), positive_int(largest, "largest")
    if smallest > largest:
        raise ValueError(
            f"The size range ({smallest}, {largest}) is empty: give the smaller size first."
        )
    return [smallest * 2**i for i in range(int(math.log2(largest / smallest)) + 1)]


def default_size_range(device: str | torch.device | None = None) -> tuple[int, int]:
    """A size range that takes seconds, not minutes, on `device`: small on CPU, big on GPUs (chapter 1)."""
    kind = resolve_device(device).type
    return {"cuda": (256, 8192), "xpu": (256, 8192), "mps": (128, 4096)}.get(kind, (64, 1024))


def matmul_peak_flops(
    device: str | torch.device | None, dtype: str | torch.dtype = "fp32"
) -> float | None:
    """Datasheet peak FLOP/s of `device` for a `dtype` (or "tf32") matmul, TF32 if enabled; None if unknown (chapter 1)."""
    device = resolve_device(device)
    if device.type != "cuda":
        return None  # the datasheet table covers NVIDIA and AMD GPUs only
    name = torch.cuda.get_device_name(device)
    if isinstance(dtype, str) and dtype.strip().lower() in ("tf32", "tensorfloat32"):
        return peak_flops(name, "tf32")
    dtype = parse_dtype(dtype)
    tf32 = dtype == torch.float32 and bool(torch.backends.cuda.matmul.allow_tf32)
    return peak_flops(name, dtype, tf32=tf32)


@dataclass
class MatmulSweep(SweepResult):
    """A matmul sweep's rows, plus its dtype, device, datasheet peak and skipped sizes (chapter 1)."""

    dtype: str = "fp32"
    device: str = "cpu"
    peak: float | None = None
    skipped: list[str] = field(default_factory=list)
    compares_devices: bool = False

    def best(self) -> dict[str, Any] | None:
        """The row with the most GFLOP/s, None if nothing was measured (chapter 1)."""
        return max(self.rows, key=lambda row: row.get("GFLOP/s", 0.0), default=None)

    def __str__(self) -> str:
        peak = f"{self.peak / 1e9:,.0f} GFLOP/s (datasheet)" if self.peak else SWEEP_UNKNOWN_PEAK
        title = f"{self.dtype} matmul on {self.device}"
        lines = [title if self.compares_devices else f"{title}; peak {peak}", super().__str__()]
        lines += [f"skipped {note}" for note in self.skipped]
        return "\n".join(lines)


def _sizes(sizes: Sequence[int] | None, size_range: tuple[int, int] | None) -> list[int]:
    """The sizes to sweep, from an explicit list or a (smallest, largest) range (chapter 1)."""
    if sizes is not None and size_range is not None:
        raise ValueError("Pass either sizes=[...] or size_range=(smallest, largest), not both.")
    if size_range is not None:
        if not isinstance(size_range, (tuple, list)) or len(size_range) != 2:
            raise ValueError(f"size_range must be (smallest, largest), got {size_range!r}.")
        return doubling_sizes(*size_range)
    if sizes is None:
        return doubling_sizes(64, 1024)
    if isinstance(sizes, (int, float)):
        sizes = [sizes]
    sizes = [positive_int(n, "every matrix size n") for n in sizes]
    if not sizes:
        raise ValueError("The sweep got no sizes: pass at least one, e.g. sizes=[256, 512].")
    return sizes


def _one_call_seconds(a: torch.Tensor, b: torch.Tensor, device: torch.device) -> float:
    """One synced call: a guard against minute-long calls, not a measurement (chapter 1)."""
    synchronize(device)
    start = time.perf_counter()
    torch.matmul(a, b)
    synchronize(device)
    return time.perf_counter() - start


def run_matmul_sweep(
    sizes: Sequence[int] | None = None,
    dtype: str | torch.dtype = "fp32",
    device: str | torch.device | None = None,
    *,
    size_range: tuple[int, int] | None = None,
    min_run_time: float = 0.1,
    max_call_seconds: float = 1.0,
    progress: bool = True,
) -> MatmulSweep:
    """Median time, GFLOP/s and % of datasheet peak of an n x n matmul for each size n (chapter 1)."""
    size_list = _sizes(sizes, size_range)
    min_run_time = positive_seconds(min_run_time, "min_run_time")
    max_call_seconds = positive_seconds(max_call_seconds, "max_call_seconds")
    device = resolve_device(device)
    dtype, tf32 = _precision(device, dtype)
    label = "tf32" if tf32 else dtype_name(dtype)
    with tf32_matmuls(tf32):  # "fp32" means true fp32 here, whatever the global setting
        peak = matmul_peak_flops(device, dtype)
    last: dict[str, float] = {}  # the last measured size and its time, to predict the next

    def inputs(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, n, device=device, dtype=dtype), torch.randn(
            n, n, device=device, dtype=dtype
        )

    def measure(n: int) -> dict[str, Any]:
        if not last and n > _PROBE_N:  # calibrate the prediction on a small size first
            small = inputs(_PROBE_N)
            _one_call_seconds(*small, device)  # warm-up
            last.update(n=_PROBE_N, seconds=_one_call_seconds(*small, device))
        if last and last["seconds"] * (n / last["n"]) ** 3 > max_call_seconds:
            guess = last["seconds"] * (n / last["n"]) ** 3
            return {"skipped": f"(one call would take about {guess:.2g} s, scaling n^3)"}
        a, b = inputs(n)
        first_call = _one_call_seconds(a, b, device)
        if first_call > max_call_seconds:  # a first call may include one-time library set-up
            first_call = min(first_call, _one_call_seconds(a, b, device))
        if first_call > max_call_seconds:
            last.update(n=n, seconds=first_call)
            return {"skipped": f"(its first two calls took {first_call:.2g} s or more)"}
        bench = benchmark(
            torch.matmul,
            a,
            b,
            device=device,
            label=f"{label} matmul n={n}",
            warmup=1,
            min_run_time=min_run_time,
        )
        last.update(n=n, seconds=bench.median)
        flops = bench.rate(matmul_flops(n, n, n))
        row = {
            "time (ms)": bench.median * 1e3,
            "IQR (%)": 100 * bench.spread,
            "GFLOP/s": flops / 1e9,
        }
        if peak is not None:
            row["% of peak"] = 100 * flops / peak
        return row

    with tf32_matmuls(tf32):
        swept = run_sweep(measure, size_list, param="n", progress=progress)
    result = MatmulSweep(
        param="n", stopped=swept.stopped, dtype=label, device=str(device), peak=peak
    )
    budget = f"over the {max_call_seconds:g} s per call budget"
    result.rows = [row for row in swept.rows if "skipped" not in row]
    result.skipped = [f"n={r['n']}: {budget} {r['skipped']}" for r in swept.rows if "skipped" in r]
    return result


#: Shapes (m, k, n) of the short achievable-rate search, by device type: square sizes near
#: the top of the sweep and a wide and a deep one (MAMF finders search m, k, n the same way).
MAMF_SHAPES: dict[str, list[tuple[int, int, int]]] = {
    "cuda": [(4096, 4096, 4096), (6144, 6144, 6144), (8192, 8192, 8192), (8192, 4096, 8192)],
    "xpu": [(4096, 4096, 4096), (8192, 8192, 8192)],
    "mps": [(2048, 2048, 2048), (4096, 4096, 4096)],
    "cpu": [(512, 512, 512), (1024, 1024, 1024), (1024, 2048, 1024)],
}


def achievable_rate(
    dtype: str | torch.dtype = "fp32",
    device: str | torch.device | None = None,
    shapes: Sequence[tuple[int, int, int]] | None = None,
    *,
    min_run_time: float = 0.1,
) -> MatmulSweep:
    """A short MAMF search: GFLOP/s of (m x k) @ (k x n) per shape; .best() is the achievable rate (chapter 1)."""
    device = resolve_device(device)
    dtype, tf32 = _precision(device, dtype)
    shape_list = list(shapes or MAMF_SHAPES.get(device.type, MAMF_SHAPES["cpu"]))
    for shape in shape_list:
        if not isinstance(shape, (tuple, list)) or len(shape) != 3:
            raise ValueError(f"Each shape must be (m, k, n), got {shape!r}.")
    min_run_time = positive_seconds(min_run_time, "min_run_time")

    def measure(shape: tuple[int, int, int]) -> dict[str, Any]:
        m, k, n = shape
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        bench = benchmark(torch.matmul, a, b, device=device, warmup=3, min_run_time=min_run_time)
        return {"GFLOP/s": bench.rate(matmul_flops(m, k, n)) / 1e9, "IQR (%)": 100 * bench.spread}

    with tf32_matmuls(tf32):
        peak = matmul_peak_flops(device, dtype)
        swept = run_sweep(measure, [tuple(s) for s in shape_list], param="m, k, n", progress=False)
    result = MatmulSweep(
        param="m, k, n",
        rows=swept.rows,
        stopped=swept.stopped,
        dtype="tf32" if tf32 else dtype_name(dtype),
        device=str(device),
        peak=peak,
    )
    if peak is not None:
        for row in result.rows:
            row["% of peak"] = 100 * row["GFLOP/s"] * 1e9 / peak
    return result


def run_speedup(
    sizes: Sequence[int] | None = None,
    dtype: str | torch.dtype = "fp32",
    device: str | torch.device | None = None,
    *,
    size_range: tuple[int, int] | None = None,
    min_run_time: float = 0.1,
    max_call_seconds: float = 1.0,
    progress: bool = True,
) -> MatmulSweep:
    """The same matmul sweep on the CPU and on an accelerator; rows give both times and the speed-up (chapter 1)."""
    device = resolve_device(device)
    if device.type == "cpu":
        raise DeviceError(
            "The speed-up compares the CPU with an accelerator, so it needs a GPU device; "
            f"this one is the CPU. Devices here: {', '.join(available_devices())}."
        )
    size_list = _sizes(sizes, size_range)
    kw = dict(min_run_time=min_run_time, max_call_seconds=max_call_seconds, progress=progress)
    accel = run_matmul_sweep(size_list, dtype, device, **kw)
    cpu = run_matmul_sweep(size_list, dtype, "cpu", **kw)
    return combine_speedup(cpu, accel)


def combine_speedup(cpu: MatmulSweep, accel: MatmulSweep) -> MatmulSweep:
    """Join a CPU sweep and an accelerator sweep on n: both times and CPU time / accelerator time (chapter 1)."""
    cpu_ms = {r["n"]: r["time (ms)"] for r in cpu.rows}
    rows = [
        {
            "n": r["n"],
            "CPU (ms)": cpu_ms[r["n"]],
            f"{accel.device} (ms)": r["time (ms)"],
            "speed-up": cpu_ms[r["n"]] / r["time (ms)"],
        }
        for r in accel.rows
        if r["n"] in cpu_ms
    ]
    return MatmulSweep(
        param="n",
        rows=rows,
        stopped=accel.stopped or cpu.stopped,
        dtype=accel.dtype,
        device=f"{cpu.device} vs {accel.device}",
        peak=None,
        compares_devices=True,
        skipped=[f"on {cpu.device}: {s}" for s in cpu.skipped]
        + [f"on {accel.device}: {s}" for s in accel.skipped],
    )


def _no_rows(ax: plt.Axes, result: MatmulSweep) -> None:
    """Say on the axes that nothing was measured, and why (chapter 1)."""
    why = result.stopped or "; ".join(result.skipped) or "no sizes"
    ax.text(0.5, 0.5, f"nothing measured:\n{why}", ha="center", va="center", wrap=True)
    ax.set_axis_off()


def plot_matmul_sweep(result: MatmulSweep) -> Figure:
    """Two panels: median time per matmul, and achieved GFLOP/s against the datasheet peak (chapter 1)."""
    fig, (ax_t, ax_f) = plt.subplots(1, 2, figsize=(10, 3.8))
    stopped = " (stopped early: out of memory)" if result.stopped else ""
    fig.suptitle(f"{result.dtype} matmul on {result.device}{stopped}")
    if not result.rows:
        _no_rows(ax_t, result)
        _no_rows(ax_f, result)
        return fig
    n = result.column("n")
    ax_t.plot(n, result.column("time (ms)"), marker="o")
    ax_t.set(xlabel="n (n x n @ n x n)", ylabel="median time per call (ms)", title="time")
    ax_t.set_xscale("log", base=2)
    ax_t.set_yscale("log")
    ax_f.plot(n, result.column("GFLOP/s"), marker="o", label="achieved")
    if result.peak is not None:
        ax_f.axhline(result.peak / 1e9, color="grey", linestyle="--", label="datasheet peak")
        ax_f.legend()
    ax_f.set(xlabel="n", ylabel="GFLOP/s", title="throughput (2 n^3 FLOPs / median time)")
    ax_f.set_xscale("log", base=2)
    ax_f.set_ylim(bottom=0)
    for ax in (ax_t, ax_f):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def plot_speedup(result: MatmulSweep) -> Figure:
    """Speed-up of the accelerator over the CPU against n, with the break-even line at 1 (chapter 1)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.set_title(f"{result.dtype} matmul, {result.device}")
    if not result.rows:
        _no_rows(ax, result)
        return fig
    ax.plot(result.column("n"), result.column("speed-up"), marker="o")
    ax.axhline(1.0, color="grey", linestyle="--", label="break-even")
    ax.set(xlabel="n", ylabel="speed-up over the CPU (x)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def matmul_controls(device: str | torch.device | None = None) -> dict[str, Any]:
    """ipywidgets controls named like run_matmul_sweep's arguments: size_range, dtype, device (chapter 1)."""
    import ipywidgets as widgets

    device = resolve_device(device)
    choices = available_devices()
    here = str(device) if str(device) in choices else choices[0]
    return {
        "size_range": widgets.SelectionRangeSlider(
            options=SIZE_CHOICES, value=default_size_range(device), description="n from, to"
        ),
        "dtype": widgets.Dropdown(options=dtype_choices(device), value="fp32", description="dtype"),
        "device": widgets.Dropdown(options=choices, value=here, description="device"),
    }
