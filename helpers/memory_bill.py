"""The training memory bill: predicted from the model, measured from one real step (chapter 5)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import nn

from helpers.activations import (
    ActivationMeter,
    activation_table,
    autocast_context,
    checkpointed_forward,
    measure_activation_bytes,
    unique_storage_bytes,
)
from helpers.devices import resolve_device
from helpers.dtypes import dtype_name
from helpers.formats import parse_precision
from helpers.i18n import tr, tr_mark
from helpers.machine_state import GpuTenants, gpu_tenants
from helpers.memory import track_peak
from helpers.models import make_mlp, wide_mlp_sizes
from helpers.sweeps import SweepResult, run_sweep
from helpers.tables import format_table
from helpers.units import GiB, MiB, Printed, format_bytes
from helpers.validate import DeviceError, positive_int

#: CUDA context: "0.5-1.8 GiB on A100, depending on version and lazy loading" (stas00/ml-engineering).
CUDA_CONTEXT_RANGE = (GiB // 2, int(1.8 * GiB))

#: The column headers of the bill and of bill_sweep's rows, and the phases a CUDA peak can fall
#: in, for the catalog: the rows keep the English keys; format_table prints them translated.
_COLUMNS = (
    tr_mark("item"), tr_mark("MiB"), tr_mark("bytes"), tr_mark("predicted MiB"),
    tr_mark("measured MiB"), tr_mark("predicted activations MiB"),
    tr_mark("measured activations MiB"), tr_mark("CUDA peak MiB"), tr_mark("peak during"),
    tr_mark("step temporaries MiB"), tr_mark("forward"), tr_mark("backward"),
)  # fmt: skip
#: MemoryBill's default label, for the catalog (a label a caller gives prints as given).
_ESTIMATE = tr_mark("estimate")

#: Optimizer-state copies of each parameter, by optimizer name.
OPTIMIZER_COPIES = {"adam": 2, "adamw": 2, "adam-amsgrad": 3, "sgd-momentum": 1, "sgd": 0}


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    """The model's parameters, with a clear error if there are none (chapter 5)."""
    if not isinstance(model, nn.Module):
        raise TypeError(
            tr("Expected an nn.Module (the model), got {type}.").format(type=type(model).__name__)
        )
    params = list(model.parameters())
    if not params:
        raise ValueError(
            tr(
                "{type} has no parameters, so there is nothing to train and no "
                "training bill. Pass the model whose weights you train (did you pass a layer "
                "without weights, such as nn.ReLU?)."
            ).format(type=type(model).__name__)
        )
    return params


def optimizer_kind(optimizer: str | torch.optim.Optimizer) -> str:
    """'adam', 'adamw', 'adam-amsgrad', 'sgd-momentum' or 'sgd' for a name or an optimizer (chapter 5)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        group = optimizer.param_groups[0]
        if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
            if group.get("amsgrad"):
                return "adam-amsgrad"
            return "adamw" if isinstance(optimizer, torch.optim.AdamW) else "adam"
        if isinstance(optimizer, torch.optim.SGD):
            return "sgd-momentum" if group.get("momentum", 0) else "sgd"
        raise ValueError(
            tr(
                "The estimator knows Adam, AdamW and SGD, not {type}. "
                "Measure that one with measure_training_memory instead."
            ).format(type=type(optimizer).__name__)
        )
    key = str(optimizer).strip().lower().replace("_", "-")
    if key not in OPTIMIZER_COPIES:
        raise ValueError(
            tr(
                "Unknown optimizer {optimizer!r}. Use one of {known}, "
                "or pass the torch.optim optimizer itself."
            ).format(optimizer=optimizer, known=", ".join(OPTIMIZER_COPIES))
        )
    return key


def autocast_dtype(precision: str | torch.dtype | None) -> torch.dtype | None:
    """None/'fp32' -> None (no autocast); 'bf16'/'fp16' or a dtype -> that dtype (chapter 5)."""
    dtype = None if precision is None else parse_precision(precision)
    return None if dtype == torch.float32 else dtype


@dataclass
class MemoryBill(Printed):
    """Bytes of each line of the training bill; `context` is a cited range on CUDA (chapter 5)."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    autocast_copies: int = 0
    context: tuple[int, int] | None = None
    label: str = _ESTIMATE

    @property
    def saved_for_backward(self) -> int:
        """Everything autograd keeps for backward: activations plus autocast weight copies (chapter 5)."""
        return self.activations + self.autocast_copies

    @property
    def total(self) -> int:
        """Sum of the tensor lines (the CUDA context is not a tensor and is left out) (chapter 5)."""
        return self.parameters + self.gradients + self.optimizer_state + self.saved_for_backward

    def __str__(self) -> str:
        items = [
            (tr("parameters"), self.parameters),
            (tr("gradients"), self.gradients),
            (tr("optimizer state"), self.optimizer_state),
            (tr("activations"), self.activations),
        ]
        if self.autocast_copies:
            items.append((tr("autocast weight copies"), self.autocast_copies))
        items.append((tr("total (tensors)"), self.total))
        rows = [{"item": k, "MiB": v / MiB, "bytes": v} for k, v in items]
        if self.context is not None:
            mib = "-".join(f"{b / MiB:.0f}" for b in self.context)
            rows.append({"item": tr("CUDA context (cited range)"), "MiB": mib, "bytes": tr("n/a")})
        label = tr(self.label) if self.label == _ESTIMATE else self.label
        return f"{label}\n{format_table(rows)}"


def estimate_training_memory(
    model: nn.Module,
    batch_size: int,
    sample_shape: Sequence[int],
    *,
    optimizer: str | torch.optim.Optimizer = "adam",
    precision: str | torch.dtype | None = None,
    checkpoint_every: int = 0,
    activation_bytes: int | None = None,
    device: str | torch.device | None = None,
) -> MemoryBill:
    """Predict the training bill of `model` at `batch_size`, line by line, without running it (chapter 5)."""
    params = _trainable(model)
    batch_size = positive_int(batch_size, "batch_size")
    kind = optimizer_kind(optimizer)
    amp = autocast_dtype(precision)
    trainable = [p for p in params if p.requires_grad]
    grad_bytes = unique_storage_bytes(trainable)
    steps = len(trainable) if kind.startswith("adam") else 0  # Adam's 4-byte step counters
    state = OPTIMIZER_COPIES[kind] * grad_bytes + 4 * steps
    if activation_bytes is None:
        rows = activation_table(
            model, sample_shape, batch_size, autocast_dtype=amp, checkpoint_every=checkpoint_every
        )
        copies = sum(r["weight-copy bytes"] for r in rows)
        acts = sum(r["bytes"] for r in rows) - copies
    else:
        acts, copies = activation_bytes, 0
    where = resolve_device(device) if device is not None else params[0].device
    return MemoryBill(
        parameters=unique_storage_bytes(params),
        gradients=grad_bytes,
        optimizer_state=state,
        activations=acts,
        autocast_copies=copies,
        context=CUDA_CONTEXT_RANGE if where.type == "cuda" else None,
        label=tr("estimate: batch {batch}, {optimizer}, {precision}").format(
            batch=batch_size,
            optimizer=kind,
            precision="fp32" if amp is None else dtype_name(amp) + " autocast",
        ),
    )


def measure_training_memory(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    precision: str | torch.dtype | None = None,
    checkpoint_every: int = 0,
) -> MemoryBill:
    """Run one real training step (it updates the weights) and add up the bytes of the real tensors (chapter 5)."""
    params = _trainable(model)
    amp = autocast_dtype(precision)
    optimizer.zero_grad(set_to_none=True)
    with ActivationMeter(model) as meter, autocast_context(x.device.type, amp):
        out = checkpointed_forward(model, x, checkpoint_every) if checkpoint_every else model(x)
    with autocast_context(x.device.type, amp):
        loss = loss_fn(out, y)
    loss.backward()
    grads = unique_storage_bytes(p.grad for p in params if p.grad is not None)
    optimizer.step()
    state = unique_storage_bytes(
        v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
    )
    return MemoryBill(
        parameters=unique_storage_bytes(params),
        gradients=grads,
        optimizer_state=state,
        activations=meter.total_bytes,  # the model's forward only: the loss is not metered
        label=tr("measured: real tensors after one step, activations from the meter"),
    )


@dataclass(repr=False)
class OutsideAllocator(Printed):
    """GPU memory PyTorch's allocator does not hold: this process's CUDA context and other processes (chapter 5)."""

    used: int  # total - free on the whole GPU (torch.cuda.mem_get_info)
    reserved: int  # what this process's caching allocator holds
    others: GpuTenants  # the other compute processes NVML lists on this GPU

    @property
    def outside(self) -> int:
        """Bytes in use on the GPU that this process's allocator does not hold (chapter 5)."""
        return self.used - self.reserved

    @property
    def unsplit(self) -> str:
        """Why the outside bytes cannot be split into context and other processes; '' if they can (chapter 5)."""
        g = self.others
        if g.count is None:
            return g.note
        if g.count and g.note:
            return tr(
                "NVML lists pids from another namespace, so which listed process is this one is "
                "unknown"
            )
        if g.count and g.memory is None:
            return tr("NVML does not report the other processes' memory here")
        if self.outside < (g.memory or 0):
            return tr(
                "NVML says the other processes hold {held}, more than "
                "the whole outside part: the two readings disagree"
            ).format(held=format_bytes(g.memory or 0))
        return ""

    @property
    def context(self) -> int | None:
        """This process's CUDA context (with what the driver keeps for itself), or None if unknown (chapter 5)."""
        return None if self.unsplit else self.outside - (self.others.memory or 0)

    def __str__(self) -> str:
        lo, hi = (b / GiB for b in CUDA_CONTEXT_RANGE)
        head = tr("device memory not held by PyTorch's allocator: {outside}").format(
            outside=format_bytes(self.outside)
        )
        cited = tr("cited context range {lo:.1f}-{hi:.1f} GiB on an A100").format(lo=lo, hi=hi)
        if self.context is None:
            return tr(
                "{head} (this process's CUDA context + other processes; cannot be split "
                "here: {why}); {cited}"
            ).format(head=head, why=self.unsplit, cited=cited)
        context = tr("{size} this process's CUDA context (and the driver's own)").format(
            size=format_bytes(self.context)
        )
        if not self.others.count:
            return tr("{head}, no other process on this GPU: {context}; {cited}").format(
                head=head, context=context, cited=cited
            )
        return tr(
            "{head} = {held} held by {count} other process(es) (NVML) + {context}; {cited}"
        ).format(
            head=head,
            held=format_bytes(self.others.memory or 0),
            count=self.others.count,
            context=context,
            cited=cited,
        )


def outside_allocator(device: str | torch.device | None = None) -> OutsideAllocator:
    """Read mem_get_info, the allocator and NVML's process list once, for a CUDA `device` (chapter 5)."""
    device = resolve_device(device)
    if device.type != "cuda":
        raise DeviceError(
            tr(
                "outside_allocator reads a CUDA GPU's memory (torch.cuda.mem_get_info), and "
                "{device} is not one: there is no CUDA context to measure here."
            ).format(device=device)
        )
    free, total = torch.cuda.mem_get_info(device)
    return OutsideAllocator(total - free, torch.cuda.memory_reserved(device), gpu_tenants(device))


@dataclass
class BillSweep(Printed):
    """Measured and predicted bills over batch sizes, with the settings that made them (chapter 5)."""

    sweep: SweepResult
    settings: dict[str, Any]

    def __str__(self) -> str:
        s = self.settings
        keys = ("device", "depth", "width", "parameters MiB", "precision", "checkpointing")
        if all(k in s for k in keys):
            head = tr(
                "{device}: MLP {depth} x {width} ({mib} MiB of parameters), {precision}, {ckpt}"
            ).format(
                device=s["device"],
                depth=s["depth"],
                width=s["width"],
                mib=s["parameters MiB"],
                precision=s["precision"],
                ckpt=tr("checkpointing") if s["checkpointing"] else tr("no checkpointing"),
            )
        else:  # settings a caller made: each as "name value"
            head = ", ".join(f"{k} {v}" for k, v in s.items())
        # the phase a CUDA peak fell in, translated where it is printed (the rows keep it)
        rows = [
            {**r, "peak during": tr(r["peak during"])} if "peak during" in r else r
            for r in self.sweep.rows
        ]
        return f"{head}\n{dataclasses.replace(self.sweep, rows=rows)}"


def bill_sweep(
    max_batch: int = 2048,
    checkpointing: bool = False,
    precision: str = "fp32",
    *,
    device: str | torch.device | None = None,
    width: int | None = None,
    depth: int = 4,
    points: int = 4,
    progress: bool = False,
) -> BillSweep:
    """Training bill of an MLP over batch sizes up to `max_batch`: predicted vs measured (chapter 5)."""
    device = resolve_device(device)
    max_batch, points = positive_int(max_batch, "max_batch"), positive_int(points, "points")
    width = width if width is not None else (1024 if device.type == "cpu" else 4096)
    amp, every = autocast_dtype(precision), (2 if checkpointing else 0)
    cuda = device.type == "cuda"
    baseline = torch.cuda.memory_allocated(device) if cuda else 0
    model = make_mlp(wide_mlp_sizes(width, depth, 10), blocks=True, device=device)
    opt = torch.optim.Adam(model.parameters())
    loss_fn = nn.functional.cross_entropy

    def batch(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, width, device=device), torch.randint(0, 10, (b,), device=device)

    fixed = measure_training_memory(model, opt, loss_fn, *batch(2), precision=amp)
    fixed_bytes = fixed.parameters + fixed.gradients + fixed.optimizer_state
    batches = sorted({max(1, max_batch >> i) for i in range(points)})

    def measure(b: int) -> dict[str, Any]:
        x, y = batch(b)
        pred = estimate_training_memory(
            model, b, (width,), optimizer=opt, precision=amp, checkpoint_every=every
        )
        saved = measure_activation_bytes(model, x, autocast_dtype=amp, checkpoint_every=every)
        row = {
            "predicted MiB": pred.total / MiB,
            "measured MiB": (fixed_bytes + saved) / MiB,
            "predicted activations MiB": pred.saved_for_backward / MiB,
            "measured activations MiB": saved / MiB,
        }
        if cuda:
            phases = cuda_step_phases(model, opt, loss_fn, x, y, amp, every)
            top = max(phases, key=lambda k: phases[k][1])
            row["CUDA peak MiB"] = (phases[top][1] - baseline) / MiB
            row["peak during"] = top
            start, peak = phases["optimizer.step()"]
            row["step temporaries MiB"] = (peak - start) / MiB
        return row

    result = run_sweep(measure, batches, param="batch", progress=progress)
    settings = {
        "device": str(device),
        "width": width,
        "depth": depth,
        "precision": precision,
        "checkpointing": checkpointing,
        "parameters MiB": round(fixed.parameters / MiB, 2),
    }
    return BillSweep(result, settings)


def cuda_step_phases(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    amp: torch.dtype | None = None,
    every: int = 0,
    device: str | torch.device | None = None,
) -> dict[str, tuple[int, int]]:
    """(memory_allocated at the start, max_memory_allocated) of forward, backward and optimizer.step() on CUDA (chapter 5)."""
    where = resolve_device(device) if device is not None else x.device
    phases: dict[str, tuple[int, int]] = {}
    opt.zero_grad(set_to_none=True)
    with track_peak(where) as peak, autocast_context(x.device.type, amp):
        out = checkpointed_forward(model, x, every) if every else model(x)
        loss = loss_fn(out, y)
    phases["forward"] = (peak.start, peak.peak)
    del out
    with track_peak(where) as peak:
        loss.backward()
    phases["backward"] = (peak.start, peak.peak)
    del loss
    with track_peak(where) as peak:
        opt.step()
    phases["optimizer.step()"] = (peak.start, peak.peak)
    return phases


def plot_bill_sweep(result: BillSweep) -> Figure:
    """Left: the whole bill, predicted (line) vs measured (markers); right: activations alone (chapter 5)."""
    sweep, s = result.sweep, result.settings
    x = sweep.column("batch")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    left.plot(x, sweep.column("predicted MiB"), "-", lw=2, label=tr("predicted (estimator)"))
    left.plot(x, sweep.column("measured MiB"), "o", ms=8, label=tr("measured (tensors + meter)"))
    if sweep.rows and "CUDA peak MiB" in sweep.rows[0]:
        left.plot(x, sweep.column("CUDA peak MiB"), "s--", label="CUDA max_memory_allocated")
    right.plot(x, sweep.column("predicted activations MiB"), "-", lw=2, label=tr("predicted"))
    right.plot(x, sweep.column("measured activations MiB"), "o", ms=8, label=tr("measured (meter)"))
    left.set(xlabel=tr("batch size"), ylabel="MiB", title=tr("training bill"))
    right.set(xlabel=tr("batch size"), ylabel="MiB", title=tr("saved for backward"))
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend()
    ckpt = tr("checkpointing on") if s["checkpointing"] else tr("no checkpointing")
    title = tr("MLP {depth}x{width} + Adam, {precision}, {ckpt} ({device})").format(
        depth=s["depth"], width=s["width"], precision=s["precision"], ckpt=ckpt, device=s["device"]
    )
    if sweep.stopped:
        title += tr(" - stopped early: out of memory")
    fig.suptitle(title)
    fig.tight_layout()
    return fig
