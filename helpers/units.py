"""Units and their formatting: bytes and seconds (chapter 1). A ground-floor module: it imports
nothing from the course, so every other module can use it."""

from __future__ import annotations

import math

from helpers.i18n import tr

#: Binary units: 2**20 and 2**30 bytes.
MiB = 2**20
GiB = 2**30


def format_bytes(n: float) -> str:
    """20971520 -> '20.00 MiB' (binary units up to EiB, sign kept; 2**60 -> '1.00 EiB') (chapter 1)."""
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n):
        raise ValueError(tr("format_bytes needs a finite number of bytes, got {n!r}.").format(n=n))
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024:
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    return f"{sign}{n:.2f} EiB"


def format_seconds(seconds: float) -> str:
    """1.5e-05 -> '15.0 µs', picking ns/µs/ms/s (chapter 1)."""
    if not math.isfinite(seconds):
        return str(seconds)
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}" if unit != "s" else f"{seconds:.3g} s"
    return f"{seconds / 1e-9:.3g} ns"


class Printed:
    """A result that Jupyter shows as its text, the same as print() (chapter 1).

    IPython's printer walks the class's MRO and takes the first class that defines
    ``_repr_pretty_`` or ``__repr__``; ``@dataclass`` writes a ``__repr__`` into each subclass,
    which would win over this one. So every subclass gets its own copy of ``_repr_pretty_``.
    """

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._repr_pretty_ = Printed._repr_pretty_  # type: ignore[method-assign]

    def _repr_pretty_(self, p, cycle) -> None:  # noqa: ANN001 - IPython's printer protocol
        p.text(str(self))
