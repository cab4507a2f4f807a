"""What a notebook shows for an object: IPython's own pretty printer, as Jupyter calls it."""

from __future__ import annotations

from IPython.lib.pretty import pretty as ipython_pretty


def pretty(obj: object) -> str:
    """The text/plain a notebook shows for obj as a cell's last value (IPython.lib.pretty)."""
    return ipython_pretty(obj)
