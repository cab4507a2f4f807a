"""Verdicts read from the rows a table prints, never from numbers kept beside it (chapter 1).

A verdict that states a ratio between two rows of a table must compare exactly those rows:
``compare_rows`` looks both up by name in the rows themselves, refuses to compare a row with
itself, and calls the result only beyond the rows' own spreads, on a machine that was quiet
(``helpers.machine_state``). tests/test_verdicts.py checks that the ratio it prints is the
table's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from helpers.i18n import tight_cjk, tr, tr_mark
from helpers.machine_state import MachineState, merge_states

#: The words compare_rows is given for "better" (its `better=`), so the catalog has them.
BETTER_WORDS = (tr_mark("faster"), tr_mark("slower"), tr_mark("shorter"), tr_mark("more tokens/s"))
#: A conclusive verdict for each of BETTER_WORDS, whole: Chinese says each comparison its own
#: way (「A 的速度是 B 的 1.33 倍」, 「A 的耗时只有 B 的 1/1.33」) where English swaps one word.
_BETTER_SENTENCES = {
    "faster": tr_mark("here, {a} was {ratio:.2f}x faster than {b}"),
    "slower": tr_mark("here, {a} was {ratio:.2f}x slower than {b}"),
    "shorter": tr_mark("here, {a} was {ratio:.2f}x shorter than {b}"),
    "more tokens/s": tr_mark("here, {a} was {ratio:.2f}x more tokens/s than {b}"),
}


class Verdict(str):
    """A printed verdict that remembers what it compared (chapter 1)."""

    a: str
    b: str
    ratio: float  # how many times better row `a` was than row `b` (> 1: a was better)
    noise: float  # the two rows' relative spreads added
    beyond: bool  # the gap (the row ahead over the row behind, minus 1) is larger than the noise
    conclusive: bool  # beyond the noise, on a quiet machine
    quiet: bool  # the machine was quiet (else the verdict says "inconclusive")


def row_named(rows: Sequence[Mapping[str, Any]], key: str, name: object) -> Mapping[str, Any]:
    """The one row whose `key` column is `name`; a clear error otherwise (chapter 1)."""
    found = [r for r in rows if r.get(key) == name]
    if len(found) != 1:
        names = ", ".join(repr(r.get(key)) for r in rows)
        raise ValueError(
            tr(
                "The table has {count} rows with {key!r} = {name!r} (its rows: {names}); "
                "a verdict must name exactly one row of the table it speaks about."
            ).format(count=len(found), key=key, name=name, names=names)
        )
    return found[0]


def _number(row: Mapping[str, Any], column: str) -> float:
    """A numeric cell of a row; a clear error for text (chapter 1)."""
    value = row.get(column)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(
            tr(
                "Column {column!r} must hold numbers to compare rows, got {value!r}: keep the "
                "number in the row and format it when printing."
            ).format(column=column, value=value)
        )
    return float(value)


def _machine(machine: MachineState | Sequence[MachineState] | None) -> MachineState | None:
    """One state from one, several or none (chapter 1)."""
    if machine is None or isinstance(machine, MachineState):
        return machine
    return merge_states(list(machine))


def compare_rows(
    rows: Sequence[Mapping[str, Any]],
    key: str,
    a: object,
    b: object,
    value: str,
    *,
    iqr: str | None = None,
    spread: str | None = None,
    higher_is_better: bool = False,
    better: str = "faster",
    label: str = "{}",
    machine: MachineState | Sequence[MachineState] | None = None,
) -> Verdict:
    """Which of rows `a` and `b` (named in column `key`) is better by `value`, beyond their spreads (chapter 1).

    The spread of a row is its `iqr` column (absolute, in `value`'s units) or its `spread`
    column (relative, a fraction); `label` formats a row's name in the text ("{} ranks").
    """
    if a == b:
        raise ValueError(
            tr(
                "compare_rows compares two different rows; both are {key!r} = {a!r}. Name the two "
                "rows the verdict speaks about."
            ).format(key=key, a=a)
        )
    ra, rb = row_named(rows, key, a), row_named(rows, key, b)
    va, vb = _number(ra, value), _number(rb, value)
    if va <= 0 or vb <= 0 or not (math.isfinite(va) and math.isfinite(vb)):
        raise ValueError(
            tr("Column {column!r} must be positive and finite to compare, got {a}, {b}.").format(
                column=value, a=va, b=vb
            )
        )
    ratio = va / vb if higher_is_better else vb / va
    if iqr and spread:
        raise ValueError(
            tr("Give a row's spread as iqr= (absolute) or spread= (relative), not both.")
        )
    noise = 0.0
    if iqr:
        noise = _number(ra, iqr) / va + _number(rb, iqr) / vb
    elif spread:
        noise = _number(ra, spread) + _number(rb, spread)
    # the gap as the text prints it (the row ahead over the row behind), so the rule does not
    # depend on which row is named first: 0.61x one way is 1.64x the other
    beyond = max(ratio, 1 / ratio) - 1 > noise
    # a row's name as a table shows it: the catalogs' words where they have it (chapter 1)
    na, nb = (tr(label).format(tr(x) if isinstance(x, str) and x else x) for x in (a, b))
    if not beyond:  # the row ahead first, so the ratio reads as in a conclusive verdict
        ahead, behind, lead = (na, nb, ratio) if ratio >= 1 else (nb, na, 1 / ratio)
        text = tr(
            "{ahead} vs {behind}: too close to call (the first ahead by {lead:.2f}x; spreads add up to {noise:.0%})"
        ).format(ahead=ahead, behind=behind, lead=lead, noise=noise)
    else:
        winner, loser, times = (na, nb, ratio) if ratio > 1 else (nb, na, 1 / ratio)
        sentence = _BETTER_SENTENCES.get(better)
        if sentence is not None:
            text = tr(sentence).format(a=winner, ratio=times, b=loser)
        else:  # a caller's own word
            text = tr("here, {a} was {ratio:.2f}x {better} than {b}").format(
                a=winner, ratio=times, better=tr(better) if better else better, b=loser
            )
    state = _machine(machine)
    quiet = state is None or state.quiet
    if not quiet:
        text = tr("inconclusive, {caveat}; measured: {text}").format(
            caveat=state.caveat(),  # type: ignore[union-attr]
            text=text,
        )
    verdict = Verdict(tight_cjk(text))
    verdict.a, verdict.b, verdict.ratio, verdict.noise = str(a), str(b), ratio, noise
    verdict.conclusive, verdict.quiet, verdict.beyond = beyond and quiet, quiet, beyond
    return verdict
