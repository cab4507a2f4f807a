"""Throughput vs batch size for the sources' MLP: the sweep, its plot and its widget controls (chapter 2)."""

from __future__ import annotations

from functools import partial

import ipywidgets as widgets
import matplotlib.pyplot as plt
import torch
from matplotlib.figure import Figure
from torch import nn
from torch.utils.data import DataLoader, TensorDataset, default_collate

from helpers.batching import ResidentBatches, check_batch_size
from helpers.data import make_classification_data
from helpers.devices import resolve_device
from helpers.i18n import tr, tr_mark
from helpers.loops import (
    FlatAdam,
    best_adam_impl,
    fast_epoch,
    flatten_parameters,
    make_adam,
    torch_threads,
)
from helpers.machine_state import MachineWatch
from helpers.models import make_mlp
from helpers.sweeps import SweepResult, run_sweep
from helpers.timing import benchmark
from helpers.validate import positive_int

#: How batches reach the model: "resident" (printed through tr()) or "DataLoader" (an API name).
FEEDING = (tr_mark("resident"), "DataLoader")


def measure_batch_size(
    batch_size: int,
    *,
    x: torch.Tensor,
    y: torch.Tensor,
    feeding: str = "resident",
    min_run_time: float = 0.1,
    seed: int = 0,
    flat_adam: bool = False,
) -> dict[str, float]:
    """Train one epoch from a fixed init (its loss is the 'after 1 epoch' column), then time epochs (chapter 2)."""
    batch_size = check_batch_size(batch_size, len(x))
    if feeding not in FEEDING:
        raise ValueError(
            tr("feeding must be one of {choices}, got {feeding!r}.").format(
                choices=FEEDING, feeding=feeding
            )
        )
    torch.manual_seed(seed)
    model = make_mlp(device=x.device)
    optimizer: torch.optim.Optimizer | FlatAdam
    if flat_adam:
        optimizer = FlatAdam(flatten_parameters(model))
    else:
        optimizer = make_adam(model.parameters(), impl=best_adam_impl(x.device))
    loss_fn = nn.BCEWithLogitsLoss()
    g = torch.Generator().manual_seed(seed)
    if feeding == "resident":
        batches = ResidentBatches(x, y, batch_size=batch_size, generator=g)
    else:  # a DataLoader over CPU tensors, each batch moved to x's device as it is collated
        batches = DataLoader(
            TensorDataset(x.cpu(), y.cpu()),
            batch_size=batch_size,
            shuffle=True,
            generator=g,
            collate_fn=lambda b: [t.to(x.device) for t in default_collate(b)],
        )
    fast_epoch(model, batches, optimizer, loss_fn)  # first epoch: also the warm-up
    with torch.no_grad():
        loss_after_one = loss_fn(model(x), y).item()
    timed = benchmark(
        fast_epoch,
        model,
        batches,
        optimizer,
        loss_fn,
        device=x.device,
        warmup=0,
        min_run_time=min_run_time,
        min_repeats=2,
    )
    steps = len(batches)
    return {  # the keys are marked for the catalog: format_table prints them translated
        tr_mark("steps/epoch"): steps,
        tr_mark("ms/epoch"): timed.median * 1e3,
        tr_mark("µs/step"): timed.median / steps * 1e6,
        tr_mark("samples/s"): len(x) / timed.median,
        tr_mark("loss after 1 epoch"): loss_after_one,
    }


def run_throughput(
    log2_batch: tuple[int, int] = (3, 11),
    feeding: str = "resident",
    *,
    device: str | torch.device | None = "cpu",
    n_samples: int = 10_000,
    threads: int | None = None,
    min_run_time: float = 0.1,
    progress: bool = False,
) -> SweepResult:
    """Sweep batch sizes 2**low .. 2**high on the sources' task: time per epoch and step, samples/s (chapter 2).

    The result's ``machine`` says what else the machine was doing during the sweep.
    """
    device = resolve_device(device)
    n_samples = positive_int(n_samples, "n_samples")
    try:
        lo, hi = (int(v) for v in log2_batch)
    except (TypeError, ValueError):
        raise ValueError(
            tr("log2_batch must be a pair (low, high), got {got!r}.").format(got=log2_batch)
        ) from None
    if not 0 <= lo <= hi <= 20:
        raise ValueError(
            tr("log2_batch must satisfy 0 <= low <= high <= 20, got {got!r}.").format(
                got=log2_batch
            )
        )
    sizes = [2**k for k in range(lo, hi + 1) if 2**k <= n_samples]
    if not sizes:
        raise ValueError(
            tr(
                "Every batch size in 2**{low} .. 2**{high} is larger than the "
                "{n} samples; lower the range."
            ).format(low=log2_batch[0], high=log2_batch[1], n=n_samples)
        )
    x, y = make_classification_data(n_samples)
    x, y = x.to(device), y.to(device)
    measure = partial(measure_batch_size, x=x, y=y, feeding=feeding, min_run_time=min_run_time)
    with torch_threads(threads), MachineWatch(device, threads) as watch:
        result = run_sweep(measure, sizes, param=tr_mark("batch size"), progress=progress)
    result.device, result.feeding = str(device), feeding
    result.machine = watch.state  # what else the machine did during the sweep (chapter 1)
    return result


def plot_throughput(result: SweepResult) -> Figure:
    """Samples/s, time per step (the overhead floor) and loss after one epoch vs batch size (chapter 2)."""
    if not len(result):
        raise ValueError(tr("The sweep has no rows to plot; run it with at least one batch size."))
    sizes = result.column("batch size")
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    panels = (
        ("samples/s", tr("samples / s"), tr("throughput")),
        ("µs/step", tr("µs per step"), tr("time per step (flat = overhead floor)")),
        ("loss after 1 epoch", tr("loss"), tr("after one epoch: a different experiment")),
    )
    for ax, (column, ylabel, title) in zip(axes, panels):
        ax.plot(sizes, result.column(column), marker="o")
        ax.set_xscale("log", base=2)
        ax.set(xlabel=tr("batch size"), ylabel=ylabel, title=title)
        ax.grid(True, alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    where = getattr(result, "device", "")
    feeding = getattr(result, "feeding", "")
    fig.suptitle(
        tr("The sources' MLP on {device}, {feeding} batches").format(
            device=where, feeding=tr(feeding) if feeding else feeding
        )
    )
    fig.tight_layout()
    return fig


def throughput_controls(log2_batch: tuple[int, int] = (3, 11), max_log2: int = 13) -> dict:
    """The widget's controls: a log2 batch-size range and how batches are fed (chapter 2)."""
    return {
        "log2_batch": widgets.IntRangeSlider(
            value=log2_batch, min=0, max=max_log2, step=1, description=tr("log2 batch")
        ),
        "feeding": widgets.Dropdown(
            options=[(tr(f), f) for f in FEEDING], value="resident", description=tr("feeding")
        ),
    }
