"""The matmul size sweep: median time, achieved GFLOP/s and share of peak per size (chapter 1)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure

from helpers.devices import TF32_CAPABILITY, available_devices, check_dtype, is_rocm, resolve_device
from helpers.dtypes import dtype_name
from helpers.formats import PrecisionError, is_tf32
from helpers.i18n import tr, tr_mark
from helpers.loops import time_once, torch_threads
from helpers.machine_state import MachineState, merge_states
from helpers.peaks import peak_flops
from helpers.plots import plot_sweep
from helpers.sweeps import SweepResult, run_sweep
from helpers.timing import benchmark
from helpers.validate import DeviceError, positive_int, positive_seconds
from helpers.verdicts import Verdict, compare_rows

#: The sweeps' column names (row keys), for the catalog: format_table prints them translated.
_COLUMNS = (
    tr_mark("time (ms)"), tr_mark("% of peak"), tr_mark("CPU threads"), tr_mark("speed-up"),
    tr_mark("note"),
)  # fmt: skip

#: The size a sweep first calibrates on when it starts big, to predict how long a call takes.
_PROBE_N = 256


def tf32_available(device: str | torch.device | None = None) -> bool:
    """Whether `device` has TF32 tensor cores: an NVIDIA GPU of compute capability 8.0+ (chapter 1)."""
    device = resolve_device(device)
    if device.type != "cuda" or is_rocm():
        return False
    return torch.cuda.get_device_capability(device) >= TF32_CAPABILITY


def dtype_choices(device: str | torch.device | None = None) -> list[str]:
    """The sweep's precisions on `device`: fp32, bf16, fp16, fp64, and "tf32" where it exists (chapter 1)."""
    return ["fp32", *["tf32"] * tf32_available(device), "bf16", "fp16", "fp64"]


def tf32_enabled() -> bool:
    """Whether fp32 matmuls on CUDA run as TF32 now, read without tripping torch's TF32 API check (chapter 1)."""
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "fp32_precision"):  # torch < 2.9: one API
        return bool(matmul.allow_tf32)
    # torch >= 2.9 raises on reading allow_tf32 after the newer fp32_precision was set
    precision = matmul.fp32_precision
    if precision == "none":  # inherits the backend-wide setting
        precision = getattr(torch.backends, "fp32_precision", "none")
    return precision == "tf32"


def _tf32_settings() -> dict[str, Any]:
    """Every switch that says whether fp32 matmuls may round to TF32, read without raising (chapter 1)."""
    matmul, cpu = torch.backends.cuda.matmul, getattr(torch.backends.mkldnn, "matmul", None)
    newer = {obj: obj.fp32_precision for obj in (matmul, cpu) if hasattr(obj, "fp32_precision")}
    readings: dict[str, Any] = {"newer": newer}
    for key, read in (
        ("precision", torch.get_float32_matmul_precision),
        ("allow", lambda: matmul.allow_tf32),
    ):
        try:  # torch >= 2.9 raises here when the older and the newer API were mixed
            readings[key] = read()
        except RuntimeError:
            readings[key] = None
    return readings


def _restore_tf32_settings(saved: dict[str, Any]) -> None:
    """Put back what _tf32_settings read, mixed states included (chapter 1)."""
    matmul = torch.backends.cuda.matmul
    if saved["precision"] is not None:  # the older API's three levels, "medium" included
        torch.set_float32_matmul_precision(saved["precision"])
    elif saved["allow"] is not None:
        matmul.allow_tf32 = saved["allow"]
    else:  # allow_tf32 raised: the older switch said the opposite of the newer one
        matmul.allow_tf32 = saved["newer"][matmul] != "tf32"
    for obj, value in saved["newer"].items():
        obj.fp32_precision = value


@contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """Inside the block fp32 matmuls run as TF32 (enabled) or as true fp32; every setting restored after (chapter 1)."""
    saved = _tf32_settings()
    # allow_tf32 sets torch's older and newer TF32 switch alike: cuBLAS and torch.compile,
    # which check that the two agree, never see a mix inside the block
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        _restore_tf32_settings(saved)


def check_tf32(device: torch.device) -> torch.dtype:
    """torch.float32, the dtype TF32 matmuls read, where `device` has TF32; else a PrecisionError (chapters 1 and 3)."""
    if not tf32_available(device):
        raise PrecisionError(
            tr(
                "TF32 needs an NVIDIA GPU of compute capability 8.0 or newer (Ampere+); "
                "{device} has none. Use 'fp32' here. Devices here: {here}."
            ).format(device=device, here=", ".join(available_devices()))
        )
    return torch.float32


def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an (m x k) @ (k x n) matmul: m*n dot products of k multiply-adds, 2*m*k*n (chapter 1)."""
    m, k, n = positive_int(m, "m"), positive_int(k, "k"), positive_int(n, "n")
    return 2 * m * k * n


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
    return peak_flops(torch.cuda.get_device_name(device), dtype, tf32=tf32_enabled())


@dataclass
class MatmulSweep(SweepResult):
    """A matmul sweep's rows, plus its dtype, device, datasheet peak and skipped sizes (chapter 1)."""

    dtype: str = "fp32"
    device: str = "cpu"
    peak: float | None = None
    skipped: list[str] = field(default_factory=list)
    compares_devices: bool = False
    #: What else the machine was doing while the sizes were timed (the busiest reading).
    machine: MachineState | None = None

    def best(self) -> dict[str, Any] | None:
        """The row with the most GFLOP/s, None if nothing was measured (chapter 1)."""
        return max(self.rows, key=lambda row: row.get("GFLOP/s", 0.0), default=None)

    def __str__(self) -> str:
        peak = (
            tr("{gflops:,.0f} GFLOP/s (datasheet)").format(gflops=self.peak / 1e9)
            if self.peak
            else tr(
                "unknown (no datasheet figure for this device and dtype: the best GFLOP/s of "
                "a sweep up to large n is its achievable rate)"
            )
        )
        title = tr("{dtype} matmul on {device}").format(dtype=self.dtype, device=self.device)
        if not self.compares_devices:
            title = tr("{title}; peak {peak}").format(title=title, peak=peak)
        lines = [title, super().__str__()]
        lines += [tr("skipped {note}").format(note=note) for note in self.skipped]
        if self.machine is not None:
            lines.append(str(self.machine))
        return "\n".join(lines)


def _sizes(sizes: Sequence[int] | None, size_range: tuple[int, int] | None) -> list[int]:
    """The sizes to sweep: a list, or the doublings of a (smallest, largest) range (chapter 1)."""
    if sizes is not None and size_range is not None:
        raise ValueError(tr("Pass either sizes=[...] or size_range=(smallest, largest), not both."))
    if sizes is None:
        size_range = (64, 1024) if size_range is None else size_range
        if not isinstance(size_range, (tuple, list)) or len(size_range) != 2:
            raise ValueError(
                tr("size_range must be (smallest, largest), got {got!r}.").format(got=size_range)
            )
        small, large = (positive_int(n, w) for n, w in zip(size_range, ("smallest", "largest")))
        if small > large:
            raise ValueError(
                tr(
                    "The size range ({small}, {large}) is empty: give the smaller size first."
                ).format(small=small, large=large)
            )
        return [small * 2**i for i in range(int(math.log2(large / small)) + 1)]
    if isinstance(sizes, (int, float)):
        sizes = [sizes]
    sizes = [positive_int(n, "every matrix size n") for n in sizes]
    if not sizes:
        raise ValueError(tr("The sweep got no sizes: pass at least one, e.g. sizes=[256, 512]."))
    return sizes


def _run(
    measure: Callable[[Any, torch.dtype], dict[str, Any]],
    points: list[Any],
    param: str,
    dtype: str | torch.dtype,
    device: torch.device,
    progress: bool,
    states: list[MachineState],
) -> MatmulSweep:
    """measure(point, tensor dtype) per point, TF32 on only for "tf32"; "% of peak" where known (chapter 1)."""
    tf32 = is_tf32(dtype)
    dtype = check_tf32(device) if tf32 else check_dtype(device, dtype)
    with tf32_matmuls(tf32):  # "fp32" means true fp32 here, whatever the global setting
        peak = matmul_peak_flops(device, dtype)
        swept = run_sweep(lambda p: measure(p, dtype), points, param=param, progress=progress)
    for row in swept.rows:
        if peak is not None and "GFLOP/s" in row:
            row["% of peak"] = 100 * row["GFLOP/s"] * 1e9 / peak
    label = "tf32" if tf32 else dtype_name(dtype)
    return MatmulSweep(
        param,
        swept.rows,
        swept.stopped,
        dtype=label,
        device=str(device),
        peak=peak,
        machine=merge_states(states),
    )


def calibrates(device: torch.device) -> bool:
    """Whether a 256 x 256 call predicts a big one's time by n^3 (chapter 1): on a CPU only.

    On a GPU such a call times its launch and sync, not its work: an H200 shared with two
    other notebooks read 269 us for it and skipped fp32 at n = 4096 as "about 1.1 s" (2.7 ms
    in fact). There the first call of the real size guards the budget instead.
    """
    return device.type == "cpu"


def run_matmul_sweep(
    sizes: Sequence[int] | None = None,
    dtype: str | torch.dtype = "fp32",
    device: str | torch.device | None = None,
    *,
    size_range: tuple[int, int] | None = None,
    min_run_time: float = 0.1,
    max_call_seconds: float = 1.0,
    progress: bool = True,
    num_threads: int | None = None,
) -> MatmulSweep:
    """Median time, GFLOP/s and % of datasheet peak of an n x n matmul for each size n (chapter 1)."""
    size_list = _sizes(sizes, size_range)
    min_run_time = positive_seconds(min_run_time, "min_run_time")
    max_call_seconds = positive_seconds(max_call_seconds, "max_call_seconds")
    threads = num_threads if num_threads is not None else torch.get_num_threads()
    threads = positive_int(threads, "num_threads")
    device = resolve_device(device)
    last: dict[str, float] = {}  # the last measured size and its time, to predict the next
    states: list[MachineState] = []

    def measure(n: int, dtype: torch.dtype) -> dict[str, Any]:
        if not last and n > _PROBE_N and calibrates(device):  # predict from a small size first
            small = [torch.randn(_PROBE_N, _PROBE_N, device=device, dtype=dtype) for _ in range(2)]
            time_once(lambda: torch.matmul(*small), device)  # warm-up
            last.update(n=_PROBE_N, seconds=time_once(lambda: torch.matmul(*small), device))
        if last and last["seconds"] * (n / last["n"]) ** 3 > max_call_seconds:
            guess = last["seconds"] * (n / last["n"]) ** 3
            return {
                "skipped": tr("(one call would take about {guess:.2g} s, scaling n^3)").format(
                    guess=guess
                )
            }
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        first_call = time_once(lambda: torch.matmul(a, b), device)
        if first_call > max_call_seconds:  # a first call may include one-time library set-up
            first_call = min(first_call, time_once(lambda: torch.matmul(a, b), device))
        if first_call > max_call_seconds:
            last.update(n=n, seconds=first_call)
            return {
                "skipped": tr("(its first two calls took {seconds:.2g} s or more)").format(
                    seconds=first_call
                )
            }
        bench = benchmark(
            torch.matmul,
            a,
            b,
            device=device,
            warmup=1,
            min_run_time=min_run_time,
            num_threads=threads,
        )
        last.update(n=n, seconds=bench.median)
        states.append(bench.machine)
        return {
            "time (ms)": bench.median * 1e3,
            "IQR (%)": 100 * bench.spread,
            "GFLOP/s": bench.rate(matmul_flops(n, n, n)) / 1e9,
        }

    with torch_threads(threads):  # the budget's first calls run at the timed thread count too
        result = _run(measure, size_list, "n", dtype, device, progress, states)
    budget = tr("n={n}: over the {budget:g} s per call budget {why}")
    result.skipped = [
        budget.format(n=r["n"], budget=max_call_seconds, why=r["skipped"])
        for r in result.rows
        if "skipped" in r
    ]
    result.rows = [row for row in result.rows if "skipped" not in row]
    return result


#: Shapes (m, k, n) of the short achievable-rate search, by device type (MAMF finders vary all three).
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
    shape_list = list(shapes or MAMF_SHAPES.get(device.type, MAMF_SHAPES["cpu"]))
    for shape in shape_list:
        if not isinstance(shape, (tuple, list)) or len(shape) != 3:
            raise ValueError(tr("Each shape must be (m, k, n), got {shape!r}.").format(shape=shape))
    min_run_time = positive_seconds(min_run_time, "min_run_time")
    states: list[MachineState] = []

    def measure(shape: tuple[int, int, int], dtype: torch.dtype) -> dict[str, Any]:
        m, k, n = shape
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        bench = benchmark(torch.matmul, a, b, device=device, warmup=3, min_run_time=min_run_time)
        states.append(bench.machine)
        return {"GFLOP/s": bench.rate(matmul_flops(m, k, n)) / 1e9, "IQR (%)": 100 * bench.spread}

    return _run(measure, [tuple(s) for s in shape_list], "m, k, n", dtype, device, False, states)


def run_speedup(
    sizes: Sequence[int] | None = None,
    dtype: str | torch.dtype = "fp32",
    device: str | torch.device | None = None,
    **sweep_options: Any,
) -> MatmulSweep:
    """run_matmul_sweep (same arguments) on an accelerator and on the CPU; rows give both times and the speed-up (chapter 1).

    The CPU time of each n is the faster of all torch threads and one thread: a small matmul
    is not worth splitting, and on a busy machine waking the other threads can cost a
    scheduler time slice (8 ms on the course's H100 run of 2026-11-26) that has nothing to do
    with the matmul. Rows whose CPU time stays flat while n grows are marked (cpu_floor_notes).
    """
    device = resolve_device(device)
    if device.type == "cpu":
        raise DeviceError(
            tr(
                "The speed-up compares the CPU with an accelerator, so it needs a GPU device; "
                "this one is the CPU. Devices here: {here}."
            ).format(here=", ".join(available_devices()))
        )
    accel = run_matmul_sweep(sizes, dtype, device, **sweep_options)
    threads = torch.get_num_threads()
    cpus = {threads: run_matmul_sweep(sizes, dtype, "cpu", **sweep_options)}
    if threads > 1:
        cpus[1] = run_matmul_sweep(sizes, dtype, "cpu", num_threads=1, **sweep_options)
    cpu_rows = {}  # n -> (thread count, row) of the faster CPU configuration
    for count, sweep in cpus.items():
        for r in sweep.rows:
            if r["n"] not in cpu_rows or r["time (ms)"] < cpu_rows[r["n"]][1]["time (ms)"]:
                cpu_rows[r["n"]] = (count, r)
    side = accel.device
    rows = [
        {
            "n": r["n"],
            "CPU (ms)": cpu_rows[r["n"]][1]["time (ms)"],
            "CPU IQR (%)": cpu_rows[r["n"]][1]["IQR (%)"],
            "CPU threads": cpu_rows[r["n"]][0],
            f"{side} (ms)": r["time (ms)"],
            f"{side} IQR (%)": r["IQR (%)"],
            "speed-up": cpu_rows[r["n"]][1]["time (ms)"] / r["time (ms)"],
        }
        for r in accel.rows
        if r["n"] in cpu_rows
    ]
    floors = cpu_floor_notes(rows)
    for row in rows:
        row["note"] = tr("CPU floor") if row["n"] in floors else ""
    on = tr("on {device}: {note}")
    skipped = [on.format(device=accel.device, note=s) for s in accel.skipped]
    for count, sweep in cpus.items():
        where = tr("cpu ({count} thread(s))").format(count=count)
        skipped += [on.format(device=where, note=s) for s in sweep.skipped]
    return MatmulSweep(
        param="n",
        rows=rows,
        stopped=accel.stopped or cpus[threads].stopped,
        dtype=accel.dtype,
        device=tr("cpu vs {device}").format(device=accel.device),
        compares_devices=True,
        skipped=skipped,
        machine=merge_states([accel.machine] + [s.machine for s in cpus.values()]),
    )


def cpu_floor_notes(rows: Sequence[dict[str, Any]]) -> dict[int, str]:
    """n -> why, for speed-up rows whose CPU time did not grow with n³: a floor, not the matmul (chapter 1)."""
    runs: list[list[dict[str, Any]]] = []  # consecutive rows whose CPU time stayed flat
    for prev, row in zip(rows, rows[1:]):
        spread = (prev["CPU IQR (%)"] + row["CPU IQR (%)"]) / 100
        if row["CPU (ms)"] > prev["CPU (ms)"] * (1 + spread):  # it grew beyond the spreads
            continue
        if runs and runs[-1][-1] is prev:
            runs[-1].append(row)
        else:
            runs.append([prev, row])
    notes = {}
    for run in runs:
        times = [r["CPU (ms)"] for r in run]
        why = tr(
            "the CPU time stayed flat ({low:.4g}-{high:.4g} ms) from n={first} to n={last} "
            "while the FLOPs grew {growth:.0f}x: a floor of this machine (call overhead or "
            "thread scheduling), not a measurement of the matmul"
        ).format(
            low=min(times),
            high=max(times),
            first=run[0]["n"],
            last=run[-1]["n"],
            growth=(run[-1]["n"] / run[0]["n"]) ** 3,
        )
        notes.update({r["n"]: why for r in run})
    return notes


def timing_pair_verdict(
    row: dict[str, Any], a: str, b: str, machine: MachineState | None = None
) -> Verdict:
    """compare_rows over two timings kept as columns of one row: f"{side} (ms)", f"{side} IQR (%)" (chapter 1)."""
    pair = [
        {
            "side": side,
            "ms": row[f"{side} (ms)"],
            "IQR (ms)": row[f"{side} (ms)"] * row[f"{side} IQR (%)"] / 100,
        }
        for side in (a, b)
    ]
    return compare_rows(pair, "side", a, b, "ms", iqr="IQR (ms)", machine=machine)


def speedup_verdict(result: MatmulSweep) -> str:
    """The speed-up's verdict from run_speedup's own rows: largest speed-up, break-even, floors, conditions (chapter 1)."""
    if not result.rows:
        return tr("no size was measured on both devices: no speed-up to call")
    accel = next(
        k[: -len(" (ms)")] for k in result.rows[0] if k.endswith(" (ms)") and k != "CPU (ms)"
    )
    floors = cpu_floor_notes(result.rows)
    counted = [r for r in result.rows if r["n"] not in floors]
    lines = []
    if counted:
        top = max(counted, key=lambda r: r["speed-up"])
        lines.append(
            tr("largest speed-up, at n={n}: {verdict}").format(
                n=top["n"], verdict=timing_pair_verdict(top, accel, "CPU", result.machine)
            )
        )
        verdicts = {r["n"]: timing_pair_verdict(r, accel, "CPU", result.machine) for r in counted}
        wins = [n for n, v in verdicts.items() if v.conclusive and v.ratio > 1]
        from_n = next((n for n in verdicts if all(m in wins for m in verdicts if m >= n)), None)
        if from_n is not None:
            lines.append(
                tr("{device} faster beyond the spreads from n={n} on").format(
                    device=accel, n=from_n
                )
            )
        elif result.machine is not None and not result.machine.quiet:
            lines.append(
                tr("no break-even called: {caveat}").format(caveat=result.machine.caveat())
            )
        else:
            lines.append(
                tr(
                    "{device} was not faster beyond the spreads at every size from some n on"
                ).format(device=accel)
            )
    for why in dict.fromkeys(floors.values()):  # one line per flat run, in order
        sizes = ", ".join(str(n) for n, w in floors.items() if w == why)
        lines.append(tr("not counted, n = {sizes}: {why}").format(sizes=sizes, why=why))
    threads = sorted({r["CPU threads"] for r in result.rows})
    conditions = (
        str(result.machine) if result.machine is not None else tr("machine state not recorded")
    )
    counts = functools.reduce(
        lambda a, b: tr("{a} and {b}").format(a=a, b=b), map(str, threads)
    )  # "1 and 8"
    lines.append(
        tr(
            "relative to this CPU configuration (the faster of {threads} thread(s) per n; "
            "{conditions}): another CPU, thread count or load gives another ratio"
        ).format(threads=counts, conditions=conditions)
    )
    return "\n".join(lines)


def _no_rows(ax: plt.Axes, result: MatmulSweep) -> None:
    """Say on the axes that nothing was measured, and why (chapter 1)."""
    why = result.stopped or "; ".join(result.skipped) or tr("no sizes")
    text = tr("nothing measured:\n{why}").format(why=why)
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    ax.set_axis_off()


def plot_matmul_sweep(result: MatmulSweep) -> Figure:
    """Two panels: median time per matmul, and achieved GFLOP/s against the datasheet peak (chapter 1)."""
    fig, (ax_t, ax_f) = plt.subplots(1, 2, figsize=(10, 3.8))
    title = tr("{dtype} matmul on {device}").format(dtype=result.dtype, device=result.device)
    if result.stopped:
        title = tr("{title} (stopped early: out of memory)").format(title=title)
    fig.suptitle(title)
    if not result.rows:
        _no_rows(ax_t, result)
        _no_rows(ax_f, result)
        return fig
    n = result.column("n")
    ax_t.plot(n, result.column("time (ms)"), marker="o")
    ax_t.set(xlabel="n (n x n @ n x n)", ylabel=tr("median time per call (ms)"), title=tr("time"))
    ax_t.set_yscale("log")
    ax_f.plot(n, result.column("GFLOP/s"), marker="o", label=tr("achieved"))
    if result.peak is not None:
        ax_f.axhline(result.peak / 1e9, color="grey", linestyle="--", label=tr("datasheet peak"))
        ax_f.legend()
    ax_f.set(xlabel="n", ylabel="GFLOP/s", title=tr("throughput (2 n^3 FLOPs / median time)"))
    ax_f.set_ylim(bottom=0)
    for ax in (ax_t, ax_f):
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def plot_speedup(result: MatmulSweep) -> Figure:
    """Speed-up of the accelerator over the CPU against n, with the break-even line at 1 (chapter 1)."""
    title = tr("{dtype} matmul, {device}").format(dtype=result.dtype, device=result.device)
    if not result.rows:
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        ax.set_title(title)
        _no_rows(ax, result)
        return fig
    ylabel = tr("speed-up over the CPU (x)")
    fig = plot_sweep(result, "speed-up", ylabel=ylabel, title=title, logx=True, logy=True)
    fig.axes[0].axhline(1.0, color="grey", linestyle="--", label=tr("break-even"))
    fig.axes[0].legend()
    return fig


def matmul_controls(device: str | torch.device | None = None) -> dict[str, Any]:
    """ipywidgets controls named like run_matmul_sweep's arguments: size_range, dtype, device (chapter 1)."""
    import ipywidgets as widgets

    device = resolve_device(device)
    choices = available_devices()
    here = str(device) if str(device) in choices else choices[0]
    return {
        "size_range": widgets.SelectionRangeSlider(
            options=[2**k for k in range(4, 15)],
            value=default_size_range(device),
            description=tr("n from, to"),
        ),
        "dtype": widgets.Dropdown(options=dtype_choices(device), value="fp32", description="dtype"),
        "device": widgets.Dropdown(options=choices, value=here, description=tr("device")),
    }
