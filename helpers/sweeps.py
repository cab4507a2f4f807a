"""Sweeps: run a measurement over a list of values and collect a table, safely (chapter 1).

Running out of memory part-way is normal in a sweep (the point is often to find where it
happens). :func:`run_sweep` catches it, stops, keeps the rows measured so far, frees what
the failed step held, and says what happened. Any other error is a bug and is raised.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from helpers.tables import format_table

_OOM_MESSAGES = (
    "out of memory",  # CUDA, ROCm, MPS ("MPS backend out of memory")
    "can't allocate memory",  # the CPU allocator: "DefaultCPUAllocator: can't allocate memory"
    "not enough memory",  # the CPU allocator on Windows
)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for torch.OutOfMemoryError, MemoryError and the CPU allocator's failure (chapter 1)."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(
        torch.cuda, "OutOfMemoryError", ()
    )
    if isinstance(exc, (MemoryError, oom_type)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MESSAGES)


def free_cached_memory() -> None:
    """Collect garbage and hand cached accelerator blocks back after an OOM (chapter 1)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if torch.backends.mps.is_available():
        torch.mps.empty_cache()


@dataclass
class SweepResult:
    """Rows measured by a sweep, and why it stopped early if it did (chapter 1)."""

    param: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None

    def column(self, name: str) -> list[Any]:
        """All values of one column, in sweep order (chapter 1)."""
        missing = [i for i, r in enumerate(self.rows) if name not in r]
        if missing:
            have = ", ".join(self.rows[0]) if self.rows else "none (the sweep has no rows)"
            raise KeyError(f"column {name!r} is missing; columns: {have}.")
        return [r[name] for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __str__(self) -> str:
        text = format_table(self.rows)
        return text if self.stopped is None else f"{text}\n(stopped early: {self.stopped})"

    def _repr_pretty_(self, p, cycle) -> None:  # noqa: ANN001 - IPython's printer protocol
        p.text(str(self))


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message (chapter 1)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def run_sweep(
    measure: Callable[[Any], dict[str, Any]],
    values: Iterable[Any],
    *,
    param: str = "value",
    progress: bool = True,
) -> SweepResult:
    """measure(v) for each v, collecting its dict rows; stop cleanly on out-of-memory (chapter 1)."""
    values = list(values)
    if not values:
        raise ValueError(f"The sweep over {param!r} got no values: pass at least one.")
    result = SweepResult(param=param)
    if progress:
        from tqdm.auto import tqdm

        values_iter: Sequence[Any] = tqdm(values, desc=f"sweep over {param}", leave=False)
    else:
        values_iter = values
    for value in values_iter:
        try:
            row = measure(value)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            result.stopped = f"out of memory at {param}={value}: {_first_line(exc)}"
            exc.__traceback__ = None  # the traceback holds the failed step's tensors
            break
        if not isinstance(row, dict):
            raise TypeError(
                f"The measure function must return a dict (one table row), got {type(row).__name__}."
            )
        result.rows.append({param: value, **row})
    if hasattr(values_iter, "close"):
        values_iter.close()
    if result.stopped is not None:
        free_cached_memory()
        print(
            f"Stopped the sweep: {result.stopped}\n"
            f"Kept the {len(result.rows)} row(s) measured before it. Try smaller values, "
            f"or free memory (del big tensors) and run again."
        )
    return result
