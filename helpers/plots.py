"""Small matplotlib helpers that work with `%matplotlib inline` and in widgets (chapter 1)."""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
from IPython.display import display
from matplotlib.figure import Figure

from helpers.sweeps import SweepResult


def plot_sweep(
    result: SweepResult,
    y: str | Sequence[str],
    *,
    ylabel: str = "",
    title: str = "",
    logx: bool = False,
    logy: bool = False,
) -> Figure:
    """Plot one or more columns of a SweepResult against its swept parameter (chapter 1)."""
    ys = [y] if isinstance(y, str) else list(y)
    x = result.column(result.param)
    if result.stopped:
        title = f"{title} (stopped early: out of memory)".strip()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for name in ys:
        ax.plot(x, result.column(name), marker="o", label=name)
    ax.set(xlabel=result.param, ylabel=ylabel or ys[0], title=title)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    if len(ys) > 1:
        ax.legend()
    fig.tight_layout()
    return fig


def show(fig: Figure) -> None:
    """Display a figure once (also inside an ipywidgets Output) and close it (chapter 1)."""
    display(fig)
    plt.close(fig)
