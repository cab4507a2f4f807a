"""fp32 against TF32 and AMP, measured (chapter 3): the training-step sweep, its plot and widget,
the TF32 matmul speed-up, the verdicts that compare exactly the rows a table prints (with the
machine's state), and whether AMP moved the final loss more than a new seed does."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import nn
from torch.profiler import ProfilerActivity, profile

from helpers.activations import ActivationMeter
from helpers.amp_choice import amp_for_device, check_autocast
from helpers.devices import resolve_device
from helpers.dtypes import dtype_name
from helpers.formats import PrecisionError, is_tf32, parse_precision
from helpers.i18n import tr, tr_mark
from helpers.machine_state import MachineState, merge_states
from helpers.matmul import check_tf32, matmul_flops, tf32_available, tf32_matmuls
from helpers.memory import track_peak
from helpers.models import make_mlp, wide_mlp_sizes
from helpers.profiler_markers import without_profiler_markers
from helpers.sweeps import SweepResult, run_sweep
from helpers.tables import format_table
from helpers.timing import benchmark
from helpers.units import Printed
from helpers.validate import positive_int
from helpers.verdicts import Verdict, compare_rows


def default_width(device: str | torch.device) -> int:
    """A matmul-bound but quick MLP width: 512 on CPU, 4096 on a GPU (chapter 3)."""
    return 512 if torch.device(device).type == "cpu" else 4096


def default_batch_sizes(device: str | torch.device) -> tuple[int, ...]:
    """Batch sizes for the default sweep: small on CPU, larger on a GPU (chapter 3)."""
    return (16, 128, 1024) if torch.device(device).type == "cpu" else (256, 1024, 4096)


def memory_meter(device: str | torch.device) -> str:
    """What measure_amp_step's 'peak MiB' column means on this kind of device (chapter 3)."""
    kind = torch.device(device).type
    what = tr(
        "peak during one step over the memory held before it (parameters, optimizer state, batch)"
    )
    if kind == "cuda":
        return tr("{what}: torch.cuda.max_memory_allocated, exact").format(what=what)
    if kind == "mps":
        return tr("{what}: MPS allocated memory sampled every ms, approximate").format(what=what)
    if kind == "cpu":
        return tr("{what}: every CPU allocation and free recorded by torch.profiler, exact").format(
            what=what
        )
    return tr("not measured on {kind}: no peak meter for this device kind here").format(kind=kind)


def step_peak_bytes(fn: Callable[[], object], device: str | torch.device) -> float:
    """Peak bytes allocated on `device` while fn() runs, over what was allocated before; memory_meter says how (chapter 3)."""
    device = resolve_device(device)
    if device.type in ("cuda", "mps"):
        with track_peak(device) as peak:
            fn()
        return float(peak.increase)
    if device.type != "cpu":
        fn()
        return math.nan
    with (
        without_profiler_markers(),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        fn()
    # The memory events themselves: the public events() list folds them into the ops.
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak_bytes = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        if e.device_type() == torch.autograd.DeviceType.CPU:
            current += e.nbytes()  # > 0 for an allocation, < 0 for a free
            peak_bytes = max(peak_bytes, current)
    return float(peak_bytes)


class _Step:
    """A model, a batch, Adam and a GradScaler (on for fp16): one training step at one precision (chapter 3)."""

    def __init__(
        self, sizes: Sequence[int], batch_size: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.model = make_mlp(sizes).to(device)
        self.x = torch.randn(batch_size, sizes[0], device=device)
        self.y = torch.randn(batch_size, sizes[-1], device=device)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        self.dtype, self.device = dtype, device

    def forward(self) -> torch.Tensor:
        """The loss under autocast (AMP off for fp32) (chapter 3)."""
        amp = self.dtype != torch.float32
        with torch.autocast(self.device.type, dtype=self.dtype if amp else None, enabled=amp):
            return nn.functional.mse_loss(self.model(self.x).float(), self.y)

    def __call__(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(self.forward()).backward()
        self.scaler.step(self.opt)
        self.scaler.update()

    def memory(self) -> tuple[float, int]:
        """(peak bytes of one step over what is held between steps, bytes saved for backward) (chapter 3)."""
        with ActivationMeter(self.model) as meter:
            loss = self.forward()
        saved = meter.total_bytes
        del loss
        # Drop the last step's gradients: "held before" is what a loop holds between steps.
        self.opt.zero_grad(set_to_none=True)
        return step_peak_bytes(self, self.device), saved


#: The column headers of the sweep's and time_tf32's tables, for the catalog: the rows keep the
#: English keys (verdicts and notebooks look them up); format_table prints them translated.
_COLUMNS = (
    tr_mark("precision"), tr_mark("batch size"), tr_mark("ms/step"), tr_mark("IQR ms"),
    tr_mark("samples/s"), tr_mark("peak MiB"), tr_mark("saved MiB"), tr_mark("vs fp32"),
    tr_mark("matmul"), tr_mark("shape"), tr_mark("ms"), tr_mark("TFLOP/s"),
)  # fmt: skip


def _measure_amp_step(
    sizes: Sequence[int],
    batch_size: int,
    precision: str | torch.dtype,
    device: str | torch.device | None,
    min_run_time: float,
) -> tuple[dict[str, Any], MachineState | None]:
    """measure_amp_step's row, and the machine's state over its timing (chapter 3)."""
    device = resolve_device(device)
    tf32 = is_tf32(precision)
    dtype = check_tf32(device) if tf32 else check_autocast(device, precision)
    batch_size = positive_int(batch_size, "batch_size")
    torch.manual_seed(0)
    step = _Step(sizes, batch_size, dtype, device)
    with tf32_matmuls(tf32):  # "fp32" is true fp32 here, whatever the global setting
        timing = benchmark(step, device=device, warmup=2, min_run_time=min_run_time)
        peak, saved = step.memory()
    row = {
        "ms/step": timing.median * 1e3,
        "IQR ms": timing.iqr * 1e3,
        "samples/s": timing.rate(batch_size),
        "peak MiB": peak / 2**20,
        "saved MiB": saved / 2**20,
    }
    return row, timing.machine


def measure_amp_step(
    sizes: Sequence[int],
    batch_size: int,
    precision: str | torch.dtype = "fp32",
    device: str | torch.device | None = None,
    min_run_time: float = 0.2,
) -> dict[str, Any]:
    """Time one Adam training step of make_mlp(sizes) at a precision; throughput and memory (chapter 3)."""
    return _measure_amp_step(sizes, batch_size, precision, device, min_run_time)[0]


@dataclass
class AmpSweep(Printed):
    """fp32-vs-AMP sweep results: one SweepResult per precision, plus what was skipped (chapter 3)."""

    device: str
    sizes: tuple[int, ...]
    meter: str
    results: dict[str, SweepResult] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    #: The machine's state over each row's timing, by (precision, batch size).
    states: dict[tuple[str, int], MachineState | None] = field(default_factory=dict)

    @property
    def machine(self) -> MachineState | None:
        """The busiest state over all the sweep's timings (chapter 3)."""
        return merge_states(list(self.states.values()))

    def rows(self) -> list[dict[str, Any]]:
        """All rows, with the speed-up over fp32 at the same batch size where fp32 ran (chapter 3)."""
        fp32 = self.results["fp32"].rows if "fp32" in self.results else []
        base = {r["batch size"]: r["samples/s"] for r in fp32}
        rows = []
        for precision, result in self.results.items():
            for r in result.rows:
                ref = base.get(r["batch size"])
                speedup = f"{r['samples/s'] / ref:.2f}x" if ref else tr("n/a")
                rows.append({"precision": precision, **r, "vs fp32": speedup})
        return rows

    def speedup(self, precision: str, batch_size: int) -> float:
        """samples/s of `precision` divided by fp32's at one batch size (chapter 3)."""

        def rate(p: str) -> float:
            if p not in self.results:
                raise KeyError(
                    tr("{precision} was not measured; measured: {measured}.").format(
                        precision=p, measured=", ".join(self.results)
                    )
                )
            for r in self.results[p].rows:
                if r["batch size"] == batch_size:
                    return r["samples/s"]
            raise KeyError(
                tr("batch size {batch_size} was not measured for {precision}.").format(
                    batch_size=batch_size, precision=p
                )
            )

        return rate(precision) / rate("fp32")

    def verdict(self, a: str, b: str, batch_size: int) -> Verdict:
        """Row `a` against row `b` of the printed table at one batch size: compare_rows on ms/step, with both rows' machine state (chapter 3)."""
        rows = [r for r in self.rows() if r["batch size"] == batch_size]
        states = [self.states.get((p, batch_size)) for p in (a, b)]
        return compare_rows(
            rows,
            "precision",
            a,
            b,
            "ms/step",
            iqr="IQR ms",
            machine=[s for s in states if s is not None] or None,
        )

    def __str__(self) -> str:
        lines = [f"{self.device}, MLP {'-'.join(map(str, self.sizes))}", format_table(self.rows())]
        lines += [
            tr("(stopped early for {precision}: {why})").format(precision=p, why=r.stopped)
            for p, r in self.results.items()
            if r.stopped
        ]
        lines += [
            tr("skipped {precision}: {why}").format(precision=p, why=why)
            for p, why in self.skipped.items()
        ]
        if self.machine is not None:
            lines.append(str(self.machine))
        lines.append(tr("peak MiB = {meter}").format(meter=self.meter))
        lines.append(
            tr(
                "saved MiB = bytes autograd saved for backward in one forward (activations and "
                "16-bit weight copies); exact, the same meter on every device"
            )
        )
        return "\n".join(lines)


def run_amp_sweep(
    device: str | torch.device | None = None,
    precisions: Sequence[str] = ("fp32", "bf16"),
    batch_sizes: Sequence[int] | None = None,
    width: int | None = None,
    sizes: Sequence[int] | None = None,
    min_run_time: float = 0.2,
    allow_slow: bool = False,
) -> AmpSweep:
    """Measure a training step per precision x batch size; skip (and say why) what cannot run usefully (chapter 3)."""
    device = resolve_device(device)
    precisions = ["tf32" if is_tf32(p) else dtype_name(parse_precision(p)) for p in precisions]
    if not precisions:
        raise ValueError(tr("Pick at least one precision: 'fp32', 'tf32', 'bf16' or 'fp16'."))
    batch_sizes = [
        positive_int(b, tr("batch size"))
        for b in (default_batch_sizes(device) if batch_sizes is None else batch_sizes)
    ]
    if not batch_sizes:
        raise ValueError(tr("Pick at least one batch size."))
    sizes = tuple(sizes) if sizes else wide_mlp_sizes(width or default_width(device))
    sweep = AmpSweep(device=str(device), sizes=sizes, meter=memory_meter(device))
    for precision in dict.fromkeys(precisions):
        try:
            if precision == "tf32":
                check_tf32(device)
            else:
                amp_for_device(device, prefer=precision, allow_slow=allow_slow)
        except PrecisionError as exc:
            sweep.skipped[precision] = str(exc)
            continue

        def measure(batch: int, p: str = precision) -> dict[str, Any]:
            row, sweep.states[(p, batch)] = _measure_amp_step(sizes, batch, p, device, min_run_time)
            return row

        sweep.results[precision] = run_sweep(
            measure, batch_sizes, param="batch size", progress=False
        )
    return sweep


@dataclass(repr=False)
class Tf32Speed(Printed):
    """One matmul timed as true fp32 and as TF32: the table, the machine's state, the verdict (chapter 3)."""

    rows: list[dict[str, Any]]
    states: list[MachineState | None] = field(default_factory=list)

    @property
    def machine(self) -> MachineState | None:
        """The busiest state over both timings (chapter 3)."""
        return merge_states([s for s in self.states if s is not None])

    @property
    def verdict(self) -> Verdict:
        """TF32's row against fp32's, beyond their IQRs, on a quiet machine (chapter 3)."""
        states = [s for s in self.states if s is not None]
        return compare_rows(
            self.rows, "matmul", "TF32", "fp32", "ms", iqr="IQR ms", machine=states or None
        )

    def __str__(self) -> str:
        lines = [format_table(self.rows)]
        if self.machine is not None:
            lines.append(str(self.machine))
        return "\n".join([*lines, str(self.verdict)])


def time_tf32(
    a: torch.Tensor,
    b: torch.Tensor,
    device: str | torch.device | None = None,
    min_run_time: float = 0.2,
) -> Tf32Speed:
    """Time a @ b with TF32 off (true fp32) and on, on an NVIDIA GPU of compute capability 8.0+ (chapter 3)."""
    device = resolve_device(a.device if device is None else device)
    check_tf32(device)  # a PrecisionError that says why on any other device
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(
            tr("time_tf32 needs an (m x k) and a (k x n) matrix, got {a} and {b}.").format(
                a=tuple(a.shape), b=tuple(b.shape)
            )
        )
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        raise ValueError(
            tr("TF32 is a mode of fp32 matmuls: pass float32 matrices, got {a} and {b}.").format(
                a=a.dtype, b=b.dtype
            )
        )
    flops = matmul_flops(a.shape[0], a.shape[1], b.shape[1])
    rows, states = [], []
    for name, tf32 in (("fp32", False), ("TF32", True)):
        with tf32_matmuls(tf32):
            r = benchmark(torch.matmul, a, b, device=device, warmup=3, min_run_time=min_run_time)
        rows.append(
            {
                "matmul": name,
                "shape": f"{a.shape[0]}x{a.shape[1]} @ {b.shape[0]}x{b.shape[1]}",
                "ms": r.median * 1e3,
                "IQR ms": r.iqr * 1e3,
                "TFLOP/s": r.rate(flops) / 1e12,
            }
        )
        states.append(r.machine)
    for row in rows:
        row["vs fp32"] = f"{rows[0]['ms'] / row['ms']:.2f}x"
    return Tf32Speed(rows, states)


#: The words LossGap prints for where the AMP run's loss lies against fp32's, for the catalog.
SIDE_WORDS = (tr_mark("lower"), tr_mark("higher"))
#: LossGap's default `what`, for the catalog (a caller's own `what` prints as given).
FINAL_LOSS = tr_mark("final loss")


@dataclass(repr=False)
class LossGap(Printed):
    """Did AMP move the final loss more than a new seed moves fp32's? Measured, never assumed (chapter 3)."""

    name: str  # the low-precision run, e.g. "bf16"
    low: float  # its loss
    fp32: dict[int, float]  # fp32's loss per seed; the first seed is the one `low` shares
    what: str = FINAL_LOSS  # which loss: the final full-data loss, an epoch's mean, ...

    def __post_init__(self) -> None:
        if len(self.fp32) < 2:
            raise ValueError(
                tr(
                    "LossGap needs fp32's loss for at least two seeds: the seed-to-seed "
                    "spread is what 'the same result' is measured against."
                )
            )
        values = [self.low, *self.fp32.values()]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            raise ValueError(
                tr("Final losses must be finite numbers, got {values}.").format(values=values)
            )

    @property
    def reference(self) -> float:
        """fp32's final loss with the same seed, init and batch order as the AMP run (chapter 3)."""
        return next(iter(self.fp32.values()))

    @property
    def gap(self) -> float:
        """|AMP - fp32| at the same seed (chapter 3)."""
        return abs(self.low - self.reference)

    @property
    def seed_spread(self) -> float:
        """Largest minus smallest fp32 final loss over the seeds (chapter 3)."""
        return max(self.fp32.values()) - min(self.fp32.values())

    @property
    def within(self) -> bool:
        """The AMP gap is no larger than the seed-to-seed spread (chapter 3)."""
        return self.gap <= self.seed_spread

    def __str__(self) -> str:
        side = SIDE_WORDS[0] if self.low < self.reference else SIDE_WORDS[1]
        head = tr(
            "{name} {what} {low:.4g} against fp32's {reference:.4g} (same seed): "
            "{side} by {gap:.2g}, {share:.2g}% of fp32's; "
            "fp32 over seeds {seeds}: {lowest:.4g} to {highest:.4g}, a spread of {spread:.2g}"
        ).format(
            name=self.name,
            what=tr(self.what) if self.what == FINAL_LOSS else self.what,
            low=self.low,
            reference=self.reference,
            side=tr(side),
            gap=self.gap,
            share=100 * self.gap / abs(self.reference),  # 2 digits: 0.015%, not 0.0%
            seeds=", ".join(str(k) for k in self.fp32),
            lowest=min(self.fp32.values()),
            highest=max(self.fp32.values()),
            spread=self.seed_spread,
        )
        if self.seed_spread == 0:
            tail = (
                tr("identical")
                if self.gap == 0
                else tr("{name} changed it and no seed did").format(name=self.name)
            )
        elif self.within:
            tail = tr(
                "within what a new seed changes ({ratio:.2g}x the spread): "
                "the same result, as far as training can tell"
            ).format(ratio=self.gap / self.seed_spread)
        else:
            tail = tr(
                "beyond what a new seed changes ({ratio:.1f}x the spread): "
                "{name} moved the result here"
            ).format(ratio=self.gap / self.seed_spread, name=self.name)
        return f"{head}\n-> {tail}"


def plot_amp_sweep(sweep: AmpSweep) -> Figure:
    """Throughput and memory against batch size, one line per precision (chapter 3)."""
    fig, (ax_rate, ax_mem) = plt.subplots(1, 2, figsize=(10, 3.8))
    for precision, result in sweep.results.items():
        if not result.rows:
            continue
        x = result.column("batch size")
        ax_rate.plot(x, result.column("samples/s"), marker="o", label=precision)
        peak = tr("{precision} peak").format(precision=precision)
        (line,) = ax_mem.plot(x, result.column("peak MiB"), marker="o", label=peak)
        saved = tr("{precision} saved for backward").format(precision=precision)
        ax_mem.plot(x, result.column("saved MiB"), "x--", color=line.get_color(), label=saved)
    for ax, ylabel in ((ax_rate, tr("samples / s (higher is better)")), (ax_mem, "MiB")):
        ax.set_xscale("log", base=2)
        ax.set(xlabel=tr("batch size"), ylabel=ylabel)
        ax.grid(True, alpha=0.3)
        if sweep.results:
            ax.legend()
    sizes = "-".join(map(str, sweep.sizes))
    ax_rate.set_title(tr("training step, MLP {sizes}").format(sizes=sizes), fontsize=10)
    how = re.split(": |\uff1a", sweep.meter)[-1]  # memory_meter's "what: how", in either language
    ax_mem.set_title(
        tr("memory per step: peak ({how}) and saved for backward").format(how=how), fontsize=9
    )
    if sweep.skipped:
        fig.suptitle(
            tr("skipped: {precisions} (see the printed reason)").format(
                precisions=", ".join(sweep.skipped)
            ),
            fontsize=9,
        )
    fig.tight_layout()
    return fig


def amp_controls(
    device: str | torch.device,
    precisions: Sequence[str] = ("fp32", "bf16"),
    allow_slow: bool = False,
) -> dict[str, Any]:
    """ipywidgets controls for run_amp_sweep: precisions, batch sizes, width, slow ones (chapter 3)."""
    import ipywidgets as widgets

    device = torch.device(device)
    chosen = tuple("tf32" if is_tf32(p) else dtype_name(parse_precision(p)) for p in precisions)
    options = [p for p in ("fp32", "tf32", "bf16", "fp16") if p != "tf32" or tf32_available(device)]
    return {
        "precisions": widgets.SelectMultiple(
            options=options, value=chosen, description=tr("precisions"), rows=len(options)
        ),
        "batch_sizes": widgets.SelectMultiple(
            options=[2**k for k in range(3, 14)],
            value=default_batch_sizes(device),
            description=tr("batch sizes"),
            rows=6,
        ),
        "width": widgets.Dropdown(
            options=[2**k for k in range(8, 14)],
            value=default_width(device),
            description=tr("MLP width"),
        ),
        "allow_slow": widgets.Checkbox(
            value=allow_slow,
            description=tr("run slow/emulated ones too"),
            style={"description_width": "initial"},
        ),
    }
