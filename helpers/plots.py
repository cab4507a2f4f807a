"""Small matplotlib helpers that work with `%matplotlib inline` and in widgets (chapter 1)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import matplotlib.pyplot as plt
from IPython.display import display
from matplotlib.figure import Figure

from helpers.i18n import tr
from helpers.sweeps import SweepResult
from helpers.tables import screen_width

#: Punctuation a line never starts with (it closes what came before) ...
_NO_LINE_START = "，。、：；！？）」』》〉】〕”’…%)]},.:;!?"
#: ... and punctuation a line never ends with (it opens what comes after).
_NO_LINE_END = "（「『《〈【〔“‘([{"


def _pieces(line: str) -> list[str]:
    """`line` cut where it may break: runs of spaces, words whole, each CJK character alone,
    punctuation glued to the piece it closes or opens."""
    pieces: list[str] = []
    for c in line:
        prev = pieces[-1] if pieces else " "
        if c.isspace():
            glue = prev.isspace()
        elif prev.isspace():
            glue = False
        else:
            word = screen_width(c) == 1 and screen_width(prev[-1]) == 1
            glue = word or c in _NO_LINE_START or prev[-1] in _NO_LINE_END
        if glue and pieces:
            pieces[-1] += c
        else:
            pieces.append(c)
    return pieces


def wrap_title(text: str, width: int = 70) -> str:
    """`text` in lines of at most `width` columns, for a plot title; Chinese wraps too (chapter 1).

    Text without wide characters is exactly `textwrap.fill(text, width)`. Text with Chinese
    breaks between two CJK characters and at spaces, counts a CJK character as 2 columns, keeps
    English words, numbers and identifiers whole, never starts a line with closing punctuation
    (，。）) nor ends one with opening punctuation (（), and keeps the line breaks already there.
    """
    if screen_width(text) == len(text):
        return textwrap.fill(text, width)
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line, space = "", ""
        for piece in _pieces(paragraph):
            if piece.isspace():
                space = piece
            elif not line or screen_width(line + space + piece) <= width:
                line, space = line + (space if line else "") + piece, ""
            else:
                lines.append(line)
                line, space = piece, ""
        lines.append(line)
    return "\n".join(lines)


def _column_label(name: str) -> str:
    """A column's name on an axis or in a legend: in the learner's language where a catalog has it."""
    return tr(name) if name else name  # tr("") would be the catalog's header


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
        title = tr("{title} (stopped early: out of memory)").format(title=title).strip()
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for name in ys:
        ax.plot(x, result.column(name), marker="o", label=_column_label(name))
    ax.set(xlabel=_column_label(result.param), ylabel=ylabel or _column_label(ys[0]), title=title)
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
