"""What IPython's pretty printer shows for an object: the text its _repr_pretty_ writes."""

from __future__ import annotations


class Printer:
    """IPython's pretty printer, reduced to what _repr_pretty_ uses."""

    def __init__(self) -> None:
        self.out = ""

    def text(self, s: str) -> None:
        self.out += s


def pretty(obj: object) -> str:
    """The text obj._repr_pretty_ writes, as a notebook would show it."""
    p = Printer()
    obj._repr_pretty_(p, False)  # type: ignore[attr-defined]
    return p.out
