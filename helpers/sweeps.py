"""Sweeps that collect a table and stop cleanly, keeping their rows, on out-of-memory (chapter 1)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from helpers.i18n import tr
from helpers.tables import format_table
from helpers.units import Printed
from helpers.validate import first_line

_OOM_MESSAGES = (
    "out of memory",  # CUDA, ROCm, MPS ("MPS backend out of memory")
    "can't allocate memory",  # the CPU allocator: "DefaultCPUAllocator: can't allocate memory"
    "not enough memory",  # the CPU allocator on Windows
)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for torch.OutOfMemoryError, MemoryError and the CPU allocator's failure (chapter 1)."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
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
class SweepResult(Printed):
    """Rows measured by a sweep, and why it stopped early if it did (chapter 1)."""

    param: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    stopped: str | None = None

    def column(self, name: str) -> list[Any]:
        """All values of one column, in sweep order (chapter 1)."""
        if any(name not in r for r in self.rows):
            have = ", ".join(self.rows[0]) if self.rows else tr("none (the sweep has no rows)")
            raise KeyError(
                tr("column {name!r} is missing; columns: {have}.").format(name=name, have=have)
            )
        return [r[name] for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __str__(self) -> str:
        text = format_table(self.rows)
        if self.stopped is None:
            return text
        return text + "\n" + tr("(stopped early: {why})").format(why=self.stopped)


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
        raise ValueError(
            tr("The sweep over {param!r} got no values: pass at least one.").format(param=param)
        )
    result = SweepResult(param=param)
    shown = tr(param) if param else param  # a column name: in the learner's language if known
    desc = tr("sweep over {param}").format(param=shown)
    bar = tqdm(values, desc=desc, leave=False, disable=not progress)
    for value in bar:
        try:
            row = measure(value)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            result.stopped = tr("out of memory at {param}={value}: {error}").format(
                param=param, value=value, error=first_line(exc)
            )
            exc.__traceback__ = None  # the traceback holds the failed step's tensors
            break
        if not isinstance(row, dict):
            raise TypeError(
                tr("The measure function must return a dict (one table row), got {type}.").format(
                    type=type(row).__name__
                )
            )
        result.rows.append({param: value, **row})
    bar.close()
    if result.stopped is not None:
        free_cached_memory()
        print(
            tr(
                "Stopped the sweep: {why}\n"
                "Kept the {count} row(s) measured before it. Try smaller values, "
                "or free memory (del big tensors) and run again."
            ).format(why=result.stopped, count=len(result.rows))
        )
    return result
