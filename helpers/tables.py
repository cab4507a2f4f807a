"""Plain-text tables of measurement rows (chapter 1)."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from typing import Any

from helpers.i18n import tr


def _cell(value: Any) -> str:
    """One value as table text: floats to 4 significant digits, words in the learner's language (chapter 1).

    A string value (a row's name, such as "FSDP by hand") is looked up in the catalogs like a
    header: code compares rows by their English names, only the printed cell is translated.
    """
    if isinstance(value, float):
        return f"{value:.4g}"
    return tr(value) if isinstance(value, str) and value else str(value)


def screen_width(text: str) -> int:
    """Columns `text` takes in a monospace font: 2 for a wide (CJK) character, 1 for others (chapter 1)."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def padded(text: str, width: int, *, left: bool = False) -> str:
    """`text` filled with spaces to `width` screen columns, right-aligned unless `left` (chapter 1)."""
    fill = " " * max(0, width - screen_width(text))
    return text + fill if left else fill + text


def _header(column: Any) -> str:
    """A column's name as the table shows it: in the learner's language where the catalog has it (chapter 1).

    The rows keep their English keys (code looks columns up by them); only the printed header
    is translated.
    """
    return tr(column) if isinstance(column, str) and column else str(column)


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Rows of dicts -> an aligned text table; columns default to the first row's keys (chapter 1)."""
    if not rows:
        return tr("(no rows)")
    columns = list(columns or rows[0].keys())
    heads = [_header(c) for c in columns]
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [
        max(screen_width(h), *(screen_width(row[i]) for row in cells)) for i, h in enumerate(heads)
    ]
    head = "  ".join(padded(h, w) for h, w in zip(heads, widths))
    rule = "  ".join("-" * w for w in widths)
    body = ["  ".join(padded(v, w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join([head, rule, *body])


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> None:
    """Print format_table(rows, columns) (chapter 1)."""
    print(format_table(rows, columns))
