"""Surviving out-of-memory, and the largest batch that fits a byte budget or a GPU (chapter 5)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from helpers.activations import analytic_activation_bytes, measure_activation_bytes
from helpers.devices import resolve_device
from helpers.i18n import tr, tr_mark
from helpers.memory_bill import autocast_dtype, estimate_training_memory
from helpers.sweeps import free_cached_memory, is_out_of_memory
from helpers.tables import format_table
from helpers.units import Printed, format_bytes
from helpers.validate import positive_int


@dataclass
class StepOutcome:
    """What try_step saw: ok, the value on success, or a clear message on out-of-memory (chapter 5)."""

    ok: bool
    message: str
    value: Any = None
    summary: str = ""  # the message's first sentence (what ran out), for a probe's table cell


def _oom_message(text: str) -> str:
    """A one-line, readable summary of an out-of-memory error's text (chapter 5)."""
    first = text.strip().splitlines()[0] if text.strip() else tr("out of memory")
    found = re.search(r"allocate (\d+) bytes", first)
    if found:  # the CPU allocator states raw bytes
        return tr("tried to allocate {size} and the CPU allocator refused").format(
            size=format_bytes(int(found.group(1)))
        )
    found = re.search(r"[Tt]ried to allocate ([\d.]+ \w+)", first)
    if found:  # CUDA states a formatted size and what is free
        return tr("tried to allocate {size} ({error})").format(
            size=found.group(1), error=first[:160]
        )
    return first[:200]


def try_step(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> StepOutcome:
    """Run fn(*args, **kwargs); on out-of-memory free what it held and return a clear message (chapter 5)."""
    if not callable(fn):
        raise TypeError(
            tr("try_step needs a function to call, got {type}.").format(type=type(fn).__name__)
        )
    try:
        value = fn(*args, **kwargs)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        summary = _oom_message(str(exc))
        exc.__traceback__ = None  # the traceback holds the failed call's frames and tensors
        del exc
        free_cached_memory()
        name = getattr(fn, "__name__", tr("the step"))
        if getattr(fn, "__module__", None) == "torch":  # torch.empty, not a bare "empty"
            name = f"torch.{name}"
        head = tr("Out of memory in {name}: {summary}").format(name=name, summary=summary)
        return StepOutcome(
            False,
            tr(
                "{head}. What the failed call held has been freed; try a smaller batch, "
                "activation checkpointing or mixed precision."
            ).format(head=head),
            summary=head,
        )
    return StepOutcome(True, tr("ok"), value)


@dataclass
class MaxBatchResult(Printed):
    """The largest batch that fit, and every probe made to find it (chapter 5)."""

    largest: int
    probes: list[dict[str, Any]] = field(default_factory=list)
    limit: int = 0
    method: str = ""

    def __str__(self) -> str:
        if self.largest >= self.limit:  # even the limit fitted: the real maximum may be larger
            head = tr("largest batch that fits: {largest} (the search limit; larger may fit too)")
        else:
            head = tr("largest batch that fits: {largest}")
        head = head.format(largest=self.largest)
        if self.method:
            head += "  " + tr("[{method}, {n} probes]").format(
                method=self.method, n=len(self.probes)
            )
        # the probes keep English words (batch, fits, detail, yes / no); the printed table
        # translates the column names, and here a probe's yes / no
        shown = [{**p, "fits": tr(p["fits"])} if "fits" in p else p for p in self.probes]
        return f"{head}\n{format_table(shown)}"


#: The words of a probe's "fits" column, for the catalog (translated where the table is printed).
_FITS_WORDS = (tr_mark("yes"), tr_mark("no"))
#: The probe table's one-word columns that no other catalog names (format_table translates them).
_DETAIL, _FITS = tr_mark("detail"), tr_mark("fits")
#: How max_batch_under_budget's result names its method (the argument stays 'meter' / 'estimate').
_METHODS = {"meter": tr_mark("by the meter"), "estimate": tr_mark("by the estimate")}


def _ask(fits: Callable[[int], bool | tuple[bool, str]], batch: int, probes: list[dict]) -> bool:
    """Call fits(batch), record the probe, return the verdict (chapter 5)."""
    answer = fits(batch)
    ok, detail = answer if isinstance(answer, tuple) else (answer, "")
    if not isinstance(ok, bool):
        raise TypeError(
            tr("fits({batch}) must return a bool or (bool, str), got {answer!r}.").format(
                batch=batch, answer=answer
            )
        )
    probes.append({"batch": batch, "fits": "yes" if ok else "no", "detail": detail})
    return ok


def find_max_batch(
    fits: Callable[[int], bool | tuple[bool, str]],
    *,
    start: int = 1,
    limit: int = 1 << 16,
    method: str = "",
) -> MaxBatchResult:
    """Largest batch in [start, limit] that fits (smaller ones assumed to): double, then bisect (chapter 5)."""
    if not callable(fits):
        raise TypeError(
            tr("fits must be a function of the batch size, got {type}.").format(
                type=type(fits).__name__
            )
        )
    start = positive_int(start, tr("start (the first batch size to try)"))
    limit = positive_int(limit, tr("limit (the largest batch size to try)"))
    if limit < start:
        raise ValueError(
            tr("limit ({limit}) must be >= start ({start}).").format(limit=limit, start=start)
        )
    probes: list[dict[str, Any]] = []
    if not _ask(fits, start, probes):
        raise ValueError(
            tr(
                "Even batch size {start} does not fit: {why}. Free memory, shrink the model or "
                "its optimizer state, or raise the budget."
            ).format(start=start, why=probes[-1]["detail"] or tr("fits() said no"))
        )
    good, bad = start, limit + 1  # bad: the smallest batch known not to fit
    while bad - good > 1:  # doubling while nothing has failed, then bisection
        trial = min(2 * good, limit) if bad > limit else (good + bad) // 2
        if _ask(fits, trial, probes):
            good = trial
        else:
            bad = trial
    return MaxBatchResult(good, probes, limit, method)


def max_batch_under_budget(
    model: nn.Module,
    sample_shape: Sequence[int],
    budget_bytes: int,
    *,
    method: str = "meter",
    limit: int = 1 << 16,
    optimizer: str | torch.optim.Optimizer = "adam",
    precision: str | torch.dtype | None = None,
    checkpoint_every: int = 0,
) -> MaxBatchResult:
    """Largest batch whose training bill fits in `budget_bytes`; safe on every device (chapter 5)."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)):
        raise ValueError(
            tr("budget_bytes must be a number of bytes, got {budget!r}.").format(
                budget=budget_bytes
            )
        )
    if not budget_bytes > 0:
        raise ValueError(
            tr(
                "budget_bytes must be > 0, got {budget!r}: nothing fits in no memory. "
                "Give the budget in bytes, e.g. 2 * 2**30 for 2 GiB."
            ).format(budget=budget_bytes)
        )
    budget = int(budget_bytes)
    if method not in ("meter", "estimate"):
        raise ValueError(
            tr("method must be 'meter' or 'estimate', got {method!r}.").format(method=method)
        )
    amp = autocast_dtype(precision)
    fixed = estimate_training_memory(
        model, 1, sample_shape, optimizer=optimizer, activation_bytes=0
    ).total
    if fixed > budget:
        raise ValueError(
            tr(
                "The model alone needs {fixed} for parameters, gradients and optimizer state, "
                "more than the budget of {budget}: no batch size fits. Use an optimizer with "
                "less state (SGD), a smaller model, or a bigger budget."
            ).format(fixed=format_bytes(fixed), budget=format_bytes(budget))
        )
    param = next(model.parameters())

    def fits(batch: int) -> tuple[bool, str]:
        if method == "meter":
            x = torch.randn(batch, *sample_shape, device=param.device, dtype=param.dtype)
            saved = measure_activation_bytes(
                model, x, autocast_dtype=amp, checkpoint_every=checkpoint_every
            )
        else:
            saved = analytic_activation_bytes(
                model, sample_shape, batch, autocast_dtype=amp, checkpoint_every=checkpoint_every
            )
        need = fixed + saved
        verdict = "<=" if need <= budget else ">"
        return need <= budget, tr("needs {need} {op} budget {budget}").format(
            need=format_bytes(need), op=verdict, budget=format_bytes(budget)
        )

    return find_max_batch(
        fits,
        limit=limit,
        method=tr("budget {budget}, {method}").format(
            budget=format_bytes(budget), method=tr(_METHODS[method])
        ),
    )


def max_batch_before_oom(
    step: Callable[[int], Any], device: str | torch.device, *, limit: int = 1 << 16
) -> MaxBatchResult:
    """Largest batch for which step(batch) runs without a real out-of-memory error; not on CPU (chapter 5)."""
    if not callable(step):
        raise TypeError(
            tr("step must be a function of the batch size, got {type}.").format(
                type=type(step).__name__
            )
        )
    device = resolve_device(device)
    if device.type == "cpu":
        raise ValueError(
            tr(
                "On a CPU, running out of memory can get the whole process killed by the "
                "operating system (the Linux OOM killer) instead of raising an error you can "
                "catch. Search against a byte budget instead: max_batch_under_budget(model, "
                "sample_shape, budget_bytes)."
            )
        )

    def fits(batch: int) -> tuple[bool, str]:
        outcome = try_step(step, batch)
        return outcome.ok, tr("ran") if outcome.ok else outcome.summary

    return find_max_batch(
        fits, limit=limit, method=tr("real out-of-memory on {device}").format(device=device)
    )
