"""Checkers for the chapter 8 exercises (build it yourself) (chapter 8).

Each ``check_*`` takes the learner's function, runs probes that a plausible wrong answer
fails (shapes, dtypes, large scores, empty tiles, side effects and the order of the work, not
only the value returned) and prints ✅, ❌ with a hint, or ⏳ for an untouched stub. None of
them raises. Exercise 1's tolerances come from the rounding of each operation it names;
exercises 2 and 5 judge outputs and gradients as FlashAttention's tests do
(``helpers.attention_errors``): the error against float64 at most ALLOWED_FACTOR times the error
of plain PyTorch in the same dtype. Float64 inputs, which no more precise reference can judge,
keep ``helpers.attention_tiles.rounding_bound`` (n x eps x the sum of absolute terms).
"""

from __future__ import annotations

import contextlib
import dis
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import CodeType
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import helpers.attention_triton as attention_triton
from helpers.attention_errors import (
    allowed_factor,
    error_ratios,
    kernel_results,
    lse_ratio,
    output_ratio,
    plain_attention,
)
from helpers.attention_tiles import lse_rounding_bound, rounding_bound
from helpers.attention_triton import (
    TritonFlashAttention,
    triton_attention,
    triton_flash_forward,
    triton_status,
)
from helpers.checks import CheckFailed, CheckResult, expect, names_used, probe, run_check
from helpers.flash_attention import FlashAttention, flash_attention, flash_forward
from helpers.i18n import tr, tr_mark

try:  # Triton's interpreter, instrumented by exercise 5's check on a CPU
    from triton.runtime import interpreter as triton_interpreter
except ImportError:  # no Triton here: exercise 5's check says so and skips
    triton_interpreter = None

#: The status of a check that could not run here (Triton missing), printed with ⏭.
SKIP = "skip"

State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


# --- exercise 1: merging two softmax states ------------------------------------------------------


def _state(scores: torch.Tensor, values: torch.Tensor) -> State:
    """(max, sum of exp(x - max), sum of exp(x - max) * value) of each row of scores (chapter 8)."""
    m = scores.amax(-1)
    e = torch.exp(scores - m[..., None])
    return m, e.sum(-1), e @ values


def _empty_state(like: State) -> State:
    """The state of a tile whose keys are all hidden: max -inf, sums 0 (chapter 8)."""
    m, ell, acc = like
    return torch.full_like(m, -math.inf), torch.zeros_like(ell), torch.zeros_like(acc)


def _merge(a: State, b: State, mistake: str = "") -> State:
    """The right merge of two states, or one typical mistake (chapter 8)."""
    (ma, la, acca), (mb, lb, accb) = a, b
    m = torch.minimum(ma, mb) if mistake == "min" else torch.maximum(ma, mb)
    safe = m if mistake == "nan on empty" else torch.where(torch.isinf(m), 0.0, m)
    if mistake == "flipped":
        sa, sb = torch.exp(safe - ma), torch.exp(safe - mb)
    else:
        sa, sb = torch.exp(ma - safe), torch.exp(mb - safe)
    ell = la + lb if mistake in ("sum not rescaled", "nothing rescaled") else la * sa + lb * sb
    if mistake in ("acc not rescaled", "nothing rescaled"):
        acc = acca + accb
    elif mistake == "acc flipped":  # l right, acc's factors upside down
        acc = acca * torch.exp(safe - ma)[..., None] + accb * torch.exp(safe - mb)[..., None]
    else:
        acc = acca * sa[..., None] + accb * sb[..., None]
    one_side = {"l_a": (la + lb * sb, acc), "l_b": (la * sa + lb, acc), "acc_a": (ell, acca + accb * sb[..., None]), "acc_b": (ell, acca * sa[..., None] + accb)}  # fmt: skip
    ell, acc = one_side.get(mistake.removesuffix(" not rescaled"), (ell, acc))
    if mistake == "normalised":
        acc = acc / ell[..., None]
    return m, ell, acc


#: Each typical mistake's hint, in English (tr() it where it is shown).
_MERGE_HINTS = {
    "sum not rescaled": tr_mark(
        "you added l_a + l_b as they are, but each sum was taken against its own "
        "max: rescale both to the common max m first, l = l_a * exp(m_a - m) + l_b * exp(m_b - m)."
    ),
    "acc not rescaled": tr_mark(
        "the sums are right but acc is not: acc was accumulated against the same "
        "max as l, so it needs the same factors, acc_a * exp(m_a - m) + acc_b * exp(m_b - m) "
        "(one factor per row: unsqueeze it over the last dimension)."
    ),
    "nothing rescaled": tr_mark(
        "you added the sums and the accumulators as they are; each was taken "
        "against its own max: multiply state a's by exp(m_a - m) and b's by exp(m_b - m)."
    ),
    "min": tr_mark(
        "the common max is the larger of the two (torch.maximum), not the smaller: against a "
        "smaller one the exps of the other tile can overflow."
    ),
    "flipped": tr_mark(
        "the factors are upside down: exp(m_a - m) (at most 1, the sum shrinks to the "
        "larger max), not exp(m - m_a)."
    ),
    "normalised": tr_mark(
        "you divided acc by l: keep acc unnormalised (sum of exp(s - m) * v), so that "
        "more tiles can still be merged in; divide once, at the very end."
    ),
    "acc flipped": tr_mark(
        "l is right but acc's factors are upside down: acc takes the same factors as l, "
        "exp(m_a - m) and exp(m_b - m) (at most 1), not exp(m - m_a) and exp(m - m_b)."
    ),
}

#: One state's sum or accumulator added without its factor: (part, that state, the other, the formula).
_ONE_SIDED = {
    f"{part}_{x} not rescaled": (part, x, y, formula)
    for part, formula in (
        ("l", "l = l_a * exp(m_a - m) + l_b * exp(m_b - m)"),
        ("acc", "acc = acc_a * exp(m_a - m)[..., None] + acc_b * exp(m_b - m)[..., None]"),
    )
    for x, y in (("a", "b"), ("b", "a"))
}
#: Said when only one state's l or acc went in without its factor (_ONE_SIDED).
_ONE_SIDED_HINT = tr_mark(
    "you rescaled {part}_{other} but added {part}_{side} as it is: {part}_{side} was summed "
    "against its own max m_{side}, so it needs its factor exp(m_{side} - m) too: {formula}."
)


def _then(head: str, tail: str) -> str:
    """Two sentences of a hint: a space between them, none after full-width punctuation (chapter 8)."""
    return head + ("" if head[-1:] in "：。；，" else " ") + tail


def _at(name: str, text: str) -> str:
    """'[probe: name] text', in the current language (chapter 8)."""
    return tr("[probe: {name}] {text}").format(name=name, text=text)


def _merge_hint(got: State, a: State, b: State) -> str:
    """Name the mistake whose result matches `got`, or say which part is off (chapter 8).

    Only picks the hint of a merge already failed against its rounding bound: a loose match
    here costs a less precise hint, never a wrong verdict.
    """
    for mistake in (*_MERGE_HINTS, *_ONE_SIDED):
        wrong = _merge(a, b, mistake)
        if all(torch.allclose(g.double(), w.double(), rtol=1e-6, atol=1e-9, equal_nan=True) for g, w in zip(got, wrong)):  # fmt: skip
            if mistake in _ONE_SIDED:
                part, side, other, formula = _ONE_SIDED[mistake]
                return tr(_ONE_SIDED_HINT).format(part=part, side=side, other=other, formula=formula)  # fmt: skip
            return tr(_MERGE_HINTS[mistake])
    want = _merge(a, b)
    empty = torch.isneginf(want[0])
    if empty.any() and torch.isfinite(got[0][empty]).all():
        return tr(
            "rows empty in both states must keep m = -inf, and yours is {value:g} there: use the "
            "safe max (0 for an infinite m) only inside the factors exp(m_a - m), and return "
            "m = max(m_a, m_b) itself (a later merge with a row whose max is below -88 would "
            "otherwise underflow that row's whole sum to 0)."
        ).format(value=got[0][empty].flatten()[0].item())
    parts = [n for n, g, w in zip(("m", "l", "acc"), got, want) if not torch.allclose(g.double(), w.double(), rtol=1e-6, atol=1e-9)]  # fmt: skip
    sixteen = _sixteen_bit_factors(got, a, b) or _far_apart_hint(got, a, b) or _shifted_safe_max_hint(got, a, b)  # fmt: skip
    if sixteen:
        return sixteen
    if parts == ["acc"] and got[0].dim() > 1:  # right for 1-D rows, wrong for (2, 3): the broadcast
        rows = tuple(got[0].shape)
        return tr(
            "with rows shaped {rows}, m and l are right but acc is not: each factor exp(m_x - m) "
            "is shaped {rows}, like m, and acc {acc}, one more (head) dimension. Broadcast the "
            "factors over acc's last dimension, factor[..., None] (shaped {col}), so that one "
            "factor scales a whole row; factor.unsqueeze(1) is the same only for 1-D rows and "
            "here pairs the factors with the wrong rows."
        ).format(rows=rows, acc=tuple(got[2].shape), col=(*rows, 1))
    if not parts:  # every part within 1e-6 of the merge, yet outside the inputs' own rounding
        gaps = [((g.double() - w).abs().max() / w.abs().max().clamp(min=1e-300)).item() for g, w in zip(got[1:], want[1:])]  # fmt: skip
        return tr(
            "l and acc are off by up to {rel:.2g} of their size: more than {dtype} rounding "
            "explains, so the merge ran in a lower precision than its inputs (a .float(), .half() "
            "or .bfloat16() on the way, or a new tensor made in another dtype): {dtype} inputs "
            "must be merged in {dtype}."
        ).format(rel=max(gaps), dtype=str(a[1].dtype).removeprefix("torch."))
    return tr("{parts} differ from the merged state: m = max(m_a, m_b); l and acc are the sum of each state's, each times exp(its m - m).").format(parts=", ".join(parts))  # fmt: skip


def _wrong_rows(got: State, a: State, b: State) -> torch.Tensor:
    """The rows (m's shape) where l or acc is outside its rounding bound (chapter 8)."""
    want = _merge(*(tuple(t.double() for t in s) for s in (a, b)))
    _, tol_l, tol_acc = _merge_tolerance(a, b, a[1].dtype)
    off_l = ~((got[1].double() - want[1]).abs() <= tol_l)
    return off_l | ~((got[2].double() - want[2]).abs() <= tol_acc).all(-1)


def _far_apart_hint(got: State, a: State, b: State) -> str:
    """The hint for a factor clamped or cut off: only rows whose two maxes are far apart are wrong, or "" (chapter 8).

    exp((m_x - m).clamp(min=-20)), or a factor set to 0 under a threshold, changes nothing
    while the two maxes are close, and keeps a weight of exp(-20) (or drops exp(-30)) where
    they are 30 or 200 apart: in float64 such a factor is far above the rounding.
    """
    gap = (a[0].double() - b[0].double()).abs()
    far = torch.isfinite(gap) & (gap > 20)
    if not far.any() or not torch.equal(got[0], torch.maximum(a[0], b[0])) or not all(torch.isfinite(t).all() for t in got[1:]):  # fmt: skip
        return ""
    wrong = _wrong_rows(got, a, b)
    if not wrong.any() or (wrong & ~far).any():
        return ""
    return tr(
        "only the rows whose two maxes are far apart ({gap:.0f} apart and more) are off: the "
        "smaller state's factor must be exp(m_x - m) however small it is (exp(-200) is about "
        "1e-87 in float64: neither 0 nor exp(-20)). Put no clamp or threshold on the exponent "
        "or on the factor."
    ).format(gap=gap[wrong].min().item())


def _shifted_safe_max_hint(got: State, a: State, b: State) -> str:
    """The hint for factors taken against a finite safe max other than m, or "" (chapter 8).

    m right, l and acc both off by one factor per row: the factors were taken against
    something else than m where m is finite (m.clamp(min=0), relu(m): every row whose scores
    are all negative gets a state exp(m) times too small).
    """
    want = _merge(*(tuple(t.double() for t in s) for s in (a, b)))
    if not torch.equal(got[0].double(), want[0]) or not all(torch.isfinite(t).all() for t in got[1:]):  # fmt: skip
        return ""
    rows = torch.isfinite(want[0]) & (want[1] > 0) & _wrong_rows(got, a, b)
    if not rows.any():
        return ""
    ratio = got[1].double()[rows] / want[1][rows]
    acc_ratio = got[2].double()[rows] / want[2][rows]
    if not torch.allclose(acc_ratio, ratio[:, None].expand_as(acc_ratio), rtol=1e-4):
        return ""
    return tr(
        "in the rows whose max is {high:.3g} or less, m is right but l and acc are both {low:.3g} "
        "to {ratio:.3g} times the merged state's, one factor per row: the factors were taken "
        "against another max than m. The safe max may differ from m only where m is infinite: "
        "m_safe = torch.where(torch.isinf(m), 0, m), not a clamp (clamp(min=0), relu) of every "
        "negative max."
    ).format(high=want[0][rows].max().item(), low=ratio.min().item(), ratio=ratio.max().item())


def _sixteen_bit_factors(got: State, a: State, b: State) -> str:
    """The hint for l and acc off by what a 16-bit rounding of the factors costs, or "" (chapter 8).

    m exact, l and acc finite and off by more than 2^-16 of their size (float32 rounding of
    float64 inputs costs far less) but at most 2^-8 (float16 keeps 11 bits, bfloat16 8): the
    factors exp(m_x - m) computed in 16 bits, "they are at most 1 anyway".
    """
    want = _merge(*(tuple(t.double() for t in s) for s in (a, b)))
    if not torch.equal(got[0].double(), want[0]) or not all(torch.isfinite(t).all() for t in got[1:]):  # fmt: skip
        return ""
    gaps = [((g.double() - w).abs().max().item(), w.abs().max().item()) for g, w in zip(got[1:], want[1:])]  # fmt: skip
    if not all(gap <= 2**-8 * size for gap, size in gaps) or not any(gap > 2**-16 * size for gap, size in gaps):  # fmt: skip
        return ""
    return tr(
        "l and acc are off by up to {rel:.2g} of their size: more than {dtype} rounding "
        "explains, yet about what a rounding to 16 bits costs (float16 keeps 11 bits, bfloat16 "
        "8). Compute the factors exp(m_a - m) and exp(m_b - m) in the inputs' dtype, with no "
        ".half() or .bfloat16(): that they are at most 1 does not make their rounding smaller, "
        "and every tile merged later carries it."
    ).format(rel=max(gap / size for gap, size in gaps if size), dtype=str(a[1].dtype).removeprefix("torch."))  # fmt: skip


def _merge_tolerance(a: State, b: State, dtype: torch.dtype) -> list[torch.Tensor]:
    """Per part of the merged state, its rounding bound in `dtype`, from the inputs as given (chapter 8).

    m is exact. Each factor exp(m_x - m) carries |m_x - m| x eps from the subtraction and
    eps from the exp; each product and the sum add one eps more (counted as 3). A form that
    adds m_x to a logarithm, exp(log(l_x) + m_x - m), rounds at m's size: |m| x eps more.
    """
    eps = torch.finfo(dtype).eps
    (ma, la, acca), (mb, lb, accb) = ((t.double() for t in s) for s in (a, b))
    m = torch.maximum(ma, mb)
    safe = torch.where(torch.isinf(m), 0.0, m)
    terms = [
        ((safe - mx).nan_to_num(posinf=0.0) + safe.abs() + 3, torch.exp(mx - safe))
        for mx in (ma, mb)
    ]  # (relative error in eps, factor) of each state
    ell = sum(rel * f * lx.abs() for (rel, f), lx in zip(terms, (la, lb)))
    acc = sum((rel * f)[..., None] * ax.abs() for (rel, f), ax in zip(terms, (acca, accb)))
    return [torch.zeros_like(m), eps * ell, eps * acc]


def _within(got: torch.Tensor, want: torch.Tensor, tol: torch.Tensor) -> bool:
    """Every element of got equal to want (infinities included) or within tol of it; NaN never (chapter 8)."""
    g, w = got.double(), want.double()
    return bool(((g == w) | ((g - w).abs() <= tol)).all())


def _call_merge(fn: Callable[..., Any], name: str, a: State, b: State) -> State:
    """Call fn(a, b) checking type, shapes, dtypes and that the inputs come back unchanged (chapter 8)."""
    copies = [(t.clone(), t._version) for t in (*a, *b)]
    with probe(name):
        got = fn(a, b)
    expect(
        isinstance(got, tuple) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got),
        _at(
            name,
            tr("return a tuple of three tensors (m, l, acc), not {kind}.").format(
                kind=type(got).__name__
            ),
        ),  # fmt: skip
    )
    expect(
        all(torch.equal(t, c) and t._version == n for t, (c, n) in zip((*a, *b), copies)),
        _at(
            name,
            tr(
                "you changed the caller's state in place (mul_, +=, copy_ on an input): build new tensors."
            ),
        ),  # fmt: skip
    )
    for part, g, w in zip(("m", "l", "acc"), got, a):
        expect(g.shape == w.shape, _at(name, tr("{part} has shape {shape}, expected {want}.").format(part=part, shape=tuple(g.shape), want=tuple(w.shape))))  # fmt: skip
        expect(g.dtype == w.dtype, _at(name, tr("{part} is {dtype}, the inputs are {want}: keep it.").format(part=part, dtype=g.dtype, want=w.dtype)))  # fmt: skip
    return got


def _merge_probe(fn: Callable[..., Any], name: str, rows: tuple[int, ...], dtype: torch.dtype, size: float, seed: int, shift: tuple[Any, Any] = (0.0, 0.0)) -> None:  # fmt: skip
    """Two tiles of real scores: the merge must equal the state of both tiles at once (chapter 8).

    `shift` moves each tile's scores, per row if a tensor: all negative rows, or two maxes
    far apart.
    """
    g = torch.Generator().manual_seed(seed)
    xa, xb = (size * torch.randn(*rows, n, generator=g, dtype=torch.float64) + torch.as_tensor(s, dtype=torch.float64)[..., None] for n, s in zip((5, 7), shift))  # fmt: skip
    va, vb = (torch.randn(n, 3, generator=g, dtype=torch.float64) for n in (5, 7))
    a, b = (tuple(t.to(dtype) for t in _state(x, v)) for x, v in ((xa, va), (xb, vb)))
    got = _call_merge(fn, name, a, b)
    want = _merge(*(tuple(t.double() for t in s) for s in (a, b)))  # exact, from the inputs given
    tol = _merge_tolerance(a, b, dtype)
    if any(torch.isnan(t).any() for t in got) or not all(
        ((gp.double() - w).abs() <= t).all() for gp, w, t in zip(got, want, tol)
    ):
        hint = _merge_hint(got, a, b)
        if size > 10 and any(not torch.isfinite(t).all() for t in got):
            hint = tr("with scores of about 100, exp overflows: never take exp of a max or a score alone, only exp(m_a - m) and exp(m_b - m), which are at most 1.")  # fmt: skip
        raise CheckFailed(_at(name, hint))


def _empty_probe(fn: Callable[..., Any]) -> None:
    """A tile whose keys are all hidden, (-inf, 0, 0), merged with a real one or with itself (chapter 8)."""
    g = torch.Generator().manual_seed(5)
    real = _state(torch.randn(4, 6, generator=g), torch.randn(6, 3, generator=g))
    empty = _empty_state(real)
    for name, a, b, want in (
        (tr("an empty tile merged into a real one"), real, empty, real),
        (tr("a real tile merged into an empty one"), empty, real, real),
        (tr("two empty tiles"), empty, empty, empty),
    ):
        got = _call_merge(fn, name, a, b)
        # exact in the chapter's form (factors exp(-inf) = 0 and exp(0) = 1); another form rounds
        ok = all(_within(gp, w, t) for gp, w, t in zip(got, want, _merge_tolerance(a, b, torch.float32)))  # fmt: skip
        if not ok:
            nan = any(torch.isnan(t).any() for t in got)
            raise CheckFailed(
                _at(
                    name,
                    tr(
                        "you got NaN: with both maxes -inf, exp(m_a - m) is exp(-inf - (-inf)) = "
                        "exp(nan). Use a safe max for the factors, e.g. m_safe = torch.where("
                        "torch.isinf(m), 0, m), then exp(m_a - m_safe) is exp(-inf) = 0."
                    )
                    if nan
                    else tr(
                        "merging a tile that saw no key (m = -inf, l = 0, acc = 0) must change "
                        "nothing: {advice}"
                    ).format(advice=_merge_hint(got, a, b)),
                )
            )


def _mixed_empty_probe(fn: Callable[..., Any]) -> None:
    """Rows empty beside rows that are not, as in a causal tile: the safe max is per row (chapter 8).

    Row 0 is empty in a only, row 1 in both, row 2 in b only, row 3 in neither: a merge that
    tests the whole tensor (``if torch.isinf(m).all()``, ``.any()``) instead of each row
    either gets NaN in row 1 or rescales the real rows against the wrong max.
    """
    g = torch.Generator().manual_seed(6)
    name = tr("rows empty in a, in b, in both and in neither, side by side")
    a, b = (_state(torch.randn(4, 6, generator=g), torch.randn(6, 3, generator=g)) for _ in range(2))  # fmt: skip
    for state, rows in ((a, [0, 1]), (b, [1, 2])):
        empty = _empty_state(state)
        for part, hidden in zip(state, empty):
            part[rows] = hidden[rows]
    got = _call_merge(fn, name, a, b)
    want = _merge(*(tuple(t.double() for t in s) for s in (a, b)))
    if all(_within(gp, w, t) for gp, w, t in zip(got, want, _merge_tolerance(a, b, torch.float32))):  # fmt: skip
        return
    if any(torch.isnan(t).any() for t in got):
        hint = tr(
            "you got NaN in a row that is empty in both states, beside rows that are not (a "
            "causal tile has such rows): choose the safe max row by row, m_safe = torch.where("
            "torch.isinf(m), 0, m), not once for the whole tensor (if torch.isinf(m).all() / "
            ".any() ...)."
        )
    else:
        hint = tr(
            "rows empty in one state beside real rows came out wrong: every row needs its own "
            "safe max (torch.where(torch.isinf(m), 0, m), row by row), never one decision for "
            "the whole tensor. {advice}"
        ).format(advice=_merge_hint(got, a, b))
    raise CheckFailed(_at(name, hint))


def check_merge_states(fn: Callable[[State, State], State]) -> CheckResult:
    """Exercise 1: merge two (max, sum, accumulator) softmax states, as a tile loop does (chapter 8)."""

    def probes() -> None:
        _merge_probe(fn, tr("two tiles of 5 and 7 scores, 4 rows, float64"), (4,), torch.float64, 1.0, 0)  # fmt: skip
        _merge_probe(fn, tr("rows shaped (2, 3), float32"), (2, 3), torch.float32, 1.0, 1)
        _merge_probe(fn, tr("scores of about 100, float32"), (4,), torch.float32, 100.0, 2)
        _empty_probe(fn)
        _mixed_empty_probe(fn)
        g = torch.Generator().manual_seed(3)
        a = _state(torch.randn(3, 4, generator=g), torch.randn(4, 2, generator=g))
        b = _state(5 + torch.randn(3, 4, generator=g), torch.randn(4, 2, generator=g))
        ab, ba = _call_merge(fn, "merge(a, b)", a, b), _call_merge(fn, "merge(b, a)", b, a)
        tol = _merge_tolerance(a, b, torch.float32)  # each order within it of the exact merge
        expect(
            all(_within(x, y, 2 * t) for x, y, t in zip(ab, ba, tol)),
            _at(
                tr("merge(a, b) against merge(b, a)"),
                tr(
                    "the order of the tiles changed the result: the merge must treat both states alike."
                ),  # fmt: skip
            ),
        )
        # rows whose every score is negative (a causal tile's, or keys far from the query): the
        # safe max must be m itself there (no clamp(min=0)); then two maxes 0 to 200 apart in
        # float64, where exp(-30) and exp(-200) are far above the rounding (no clamped exponent)
        _merge_probe(fn, tr("rows whose scores are all negative, about -4, float32"), (4,), torch.float32, 1.0, 7, (-4.0, -4.5))  # fmt: skip
        _merge_probe(fn, tr("rows whose scores are all negative, about -100, float64"), (4,), torch.float64, 1.0, 8, (-100.0, -99.0))  # fmt: skip
        # each row's larger max near 0 (its rounding, |m| x eps, stays small), a's or b's
        apart = torch.tensor([0.0, 30.0, 0.0, 200.0, 0.0, 3.0], dtype=torch.float64)
        _merge_probe(fn, tr("float64, two maxes 0 to 200 apart"), (6,), torch.float64, 1.0, 9, (-apart, -apart.roll(1)))  # fmt: skip

    return run_check(tr("Exercise 1, merging two softmax states"), probes)


# --- exercise 2: the tiled attention forward -----------------------------------------------------


@dataclass
class _Product:
    """One matrix product made inside the tiled forward (chapter 8)."""

    #: the size of the summed dimension: head_dim for a tile of scores
    summed: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    #: a fingerprint of each operand (tiles of scores only): the same tile made twice has the same
    operands: tuple[float, float] = (0.0, 0.0)


def _tile_fingerprint(t: torch.Tensor) -> float:
    """The sum of a tensor's elements, in float64: tells one tile of q or k from another (chapter 8)."""
    return float(t.detach().double().sum())


class _Watch(TorchDispatchMode):
    """Record the shape of every tensor an op makes, which ops ran, and what crossed the tiles in 16 bits (chapter 8).

    Given head_dim, a product summed over it is a tile of scores; a 16-bit (..., head_dim)
    tensor made from a float32 one, or summed in 16 bits, used after a later tile of scores
    to make a tensor of its shape that goes back to 16 bits, is a running output kept in 16
    bits (acc16).
    """

    def __init__(self, head_dim: int = 0) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.shapes: list[tuple[int, ...]] = []
        #: every matrix product, in the order they ran
        self.products: list[_Product] = []
        #: the shape of a running output carried in 16 bits from one tile of scores to a later one
        self.acc16: tuple[int, ...] | None = None
        self._scores = 0  # tiles of scores made so far
        #: id: (a 16-bit tensor, the tiles of scores made before it)
        self._narrowed: dict[int, tuple[torch.Tensor, int]] = {}
        #: id: a tensor made from one of them after a later tile of scores (kept: ids stay unique)
        self._carried: dict[int, torch.Tensor] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = func.overloadpacket.__name__
        if "attention" in name or "softmax" in name:  # aten's own, however reached (torch.ops)
            raise CheckFailed(tr(_ATEN_BANNED).format(name=name))
        out = func(*args, **(kwargs or {}))
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]  # fmt: skip
        self.shapes += [tuple(t.shape) for t in outs]
        if name in _PRODUCTS:
            left, right = (args[1], args[2]) if name in ("addmm", "baddbmm", "addbmm") else args[:2]
            scores = bool(self.head_dim) and left.shape[-1] == self.head_dim
            operands = (_tile_fingerprint(left), _tile_fingerprint(right)) if scores else (0.0, 0.0)
            self.products += [_Product(left.shape[-1], tuple(t.shape), t.dtype, operands) for t in outs]  # fmt: skip
            self._scores += scores
        if self.head_dim and any(t.shape[-1:] == (self.head_dim,) for t in outs):
            given = (*args, *(kwargs or {}).values())  # tensors, or lists of them (torch.cat)
            inputs = [a for x in given for a in (x if isinstance(x, (list, tuple)) else (x,)) if isinstance(a, torch.Tensor)]  # fmt: skip
            self._watch_16_bits(func, name, inputs, outs)
        return out

    def _watch_16_bits(self, func: Any, name: str, inputs: list[torch.Tensor], outs: list[torch.Tensor]) -> None:  # fmt: skip
        """Follow 16-bit (..., head_dim) results made from float32 or summed in 16 bits across the tiles of scores.

        Such a result used after a later tile of scores carries on into what it makes (of its
        shape: acc.to(float32) * r + p @ v, not q's tile @ k^T); made 16-bit again from there,
        the running output went through 16 bits from one key tile to the next.
        """
        for t in outs:
            if t.dim() < 2 or t.shape[-1] != self.head_dim or not t.is_floating_point():
                continue
            carried = False
            for a in inputs:
                made = self._narrowed.get(id(a))
                earlier = made is not None and made[0] is a and made[1] < self._scores
                carried |= a.shape == t.shape and (earlier or self._carried.get(id(a)) is a)
            view = getattr(func, "is_view", False)
            wide = any(a.is_floating_point() and a.dtype.itemsize >= 4 for a in inputs)
            summed = name.rstrip("_") in _ACCUMULATES and any(a.dtype == t.dtype and a.shape == t.shape for a in inputs)  # fmt: skip
            if t.dtype.itemsize < 4 and not view and (wide or summed):
                if carried:  # 16 bits again, from a running value already 16-bit a tile before
                    self.acc16 = tuple(t.shape)
                self._narrowed[id(t)] = (t, self._scores)
            elif carried:
                self._carried[id(t)] = t


#: Ops that sum into their result: a 16-bit running output updated in 16 bits goes through one.
_ACCUMULATES = ("add", "sub", "addcmul", "addcdiv", "lerp", "addmm", "baddbmm", "addbmm")


#: Said when aten ran an attention or softmax kernel inside the tiled forward (torch.ops.aten...).
_ATEN_BANNED = tr_mark(
    "torch ran aten's {name} inside your function (an attention or softmax kernel, maybe called "
    "through torch.ops.aten): the exercise allows no softmax, log_softmax or SDPA, in any form, "
    "not even on one tile. Build the softmax from the running max, sum and accumulator "
    "(exercise 1's merge, one key tile at a time)."
)
#: aten's matrix products, as a dispatch mode sees them (torch.matmul, @ and einsum end in these).
_PRODUCTS = ("mm", "bmm", "matmul", "baddbmm", "addmm", "addbmm")


@contextlib.contextmanager
def _calls_to(banned: dict[CodeType, str]) -> Iterator[list[tuple[str, bool]]]:
    """The names of the `banned` functions that ran inside, however they were reached, and whether as a copy (chapter 8).

    A profile function sees every Python call by its code object: an alias (``from ... import
    flash_forward as ff``), a module attribute or a function kept in a dict all end in the same
    code, which a scan of the names in the learner's code cannot follow. A copy recompiled from
    the source (``exec(inspect.getsource(flash_forward))``, or pasted into a cell) is another
    code object with the same opcodes and names: it is matched by those (_code_key).
    """
    seen: list[tuple[str, bool]] = []
    previous = sys.getprofile()
    keys = {_code_key(code): name for code, name in banned.items()}
    names = {code.co_names for code in banned}  # cheap to test first
    #: by id: each code object looked at once (kept, so that its id stays its own)
    known: dict[int, tuple[CodeType, tuple[str, bool] | None]] = {}

    def profile(frame, event, arg):  # noqa: ANN001, ANN202
        if event == "call":
            code = frame.f_code
            hit = known.get(id(code))
            if hit is None or hit[0] is not code:
                if code in banned:
                    found = (banned[code], False)
                elif code.co_names in names and _code_key(code) in keys:
                    found = (keys[_code_key(code)], True)
                else:
                    found = None
                hit = known[id(code)] = (code, found)
            if hit[1]:
                seen.append(hit[1])

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def _code(fn: Any) -> CodeType:
    """The code object of a function, a static method or a Triton kernel (chapter 8)."""
    return getattr(fn, "fn", fn).__code__


def _code_key(code: CodeType) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What every copy of a function keeps, wherever it is compiled: the names it uses and its instructions (chapter 8).

    Not the code object's identity, its file or line numbers, nor the numbering of its
    constants and variables (each instruction's argument): renamed locals or a docstring
    removed leave it as it is. A method call is LOAD_METHOD where the compiler does not see
    that a name comes from an import (a function compiled alone) and LOAD_ATTR where it does
    (in its module): both count as LOAD_ATTR.
    """
    ops = tuple("LOAD_ATTR" if i.opname == "LOAD_METHOD" else i.opname for i in dis.get_instructions(code))  # fmt: skip
    return code.co_names, ops


@contextlib.contextmanager
def _triton_launches() -> Iterator[list[str]]:
    """The Triton kernels launched inside, compiled or interpreted: each refused as it starts (chapter 8).

    Exercise 2 is the tile loop in PyTorch: a kernel, the chapter's forward or any other,
    is refused before it runs; the list keeps it if the learner's code catches the refusal.
    """
    launched: list[str] = []
    owners = [triton_interpreter.InterpretedFunction] if triton_interpreter is not None else []
    with contextlib.suppress(ImportError):
        from triton.runtime.jit import JITFunction

        owners.append(JITFunction)
    entries = [(owner, name) for owner in owners for name in _launch_entries(owner)]
    originals = [getattr(owner, name) for owner, name in entries]

    def refuse(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        fn = getattr(self, "fn", self)
        launched.append(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__name__', type(self).__name__)}")  # fmt: skip
        raise CheckFailed(_launch_hint(launched[-1]))

    try:
        for owner, name in entries:
            setattr(owner, name, refuse)
        yield launched
    finally:
        for (owner, name), original in zip(entries, originals):
            setattr(owner, name, original)


def _launch_entries(owner: type) -> list[str]:
    """The methods of a Triton kernel class that a launch `kernel[grid](...)` goes through (chapter 8).

    Triton 3.2 and later: `kernel[grid]` calls the class's `run`. Triton 3.1 (torch 2.5's):
    the interpreter's `kernel[grid]` is its own `__getitem__`, and its `run` is set on each
    kernel, not on the class.
    """
    return [name for name in ("run", "__getitem__") if name in owner.__dict__]


def _launch_hint(kernel: str) -> str:
    """Said when the tiled forward launched a Triton kernel: the chapter's own, or another (chapter 8)."""
    if kernel.startswith(attention_triton.__name__ + "."):
        return tr(
            "your code launched {kernel}, the chapter's own Triton forward kernel: it does the "
            "exercise for you. Write the loop over query and key tiles with torch operations; "
            "exercise 2 launches no Triton kernel."
        ).format(kernel=kernel)
    return tr(
        "your code launched the Triton kernel {kernel}: exercise 2 is the tile loop in PyTorch, "
        "with no Triton kernel. Write the loop over query and key tiles with torch operations."
    ).format(kernel=kernel)


class _NoSoftmaxOrSdpa(TorchFunctionMode):
    """Fail when the code inside calls SDPA or any softmax, even on one tile: the exercise builds it (chapter 8)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = getattr(func, "__name__", "")
        if name in ("scaled_dot_product_attention", "softmax", "log_softmax", "_softmax"):
            raise CheckFailed(
                tr(
                    "you called {name}: the exercise allows no softmax, log_softmax or SDPA call, "
                    "not even on one tile. Build the softmax from the running max, sum and "
                    "accumulator (exercise 1's merge, one key tile at a time)."
                ).format(name=name)
            )
        return func(*args, **(kwargs or {}))


#: The chapter's functions that compute the tiled forward: the exercise text names them all.
_HELPERS = ("flash_forward", "flash_attention", "FlashAttention", "triton_flash_forward")
#: The same, by their code, caught however the learner reached them (an alias, a dict).
_FORWARD_CODES = {
    _code(flash_forward): "flash_forward",
    _code(flash_attention): "flash_attention",
    _code(FlashAttention.forward): "FlashAttention",
    _code(triton_flash_forward): "triton_flash_forward",
    _code(TritonFlashAttention.forward): "TritonFlashAttention",
    _code(triton_attention): "triton_attention",
}


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, hide: str = "", block: int = 0) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Attention and log-sum-exp in float64, optionally with a typical masking or scaling mistake (chapter 8).

    "one late" also hides the keys after each query tile's end (given `block`), which a loop
    that stops at the tile's last query never visits; "block" scales by 1 / sqrt(block).
    """
    q, k, v = (x.detach().double() for x in (q, k, v))
    t = q.size(-2)
    s = q @ k.transpose(-2, -1) * {"unscaled": 1.0, "twice": q.size(-1) ** -1.0, "block": max(block, 1) ** -0.5}.get(hide, q.size(-1) ** -0.5)  # fmt: skip
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    hidden = {
        "diagonal": j >= i,
        "one late": (j > i + 1) | (j >= (i // max(block, 1) + 1) * block if block else j < 0),
        "none": j < 0,
    }.get(hide, j > i)
    if causal:
        s = s.masked_fill(hidden, -math.inf)
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ v, lse


def _tiled_hint(got: torch.Tensor, got_lse: torch.Tensor, qkv: list[torch.Tensor], causal: bool, block: int, verdict: _Verdict, watch: _Watch | None = None) -> str:  # fmt: skip
    """Name the mistake behind a wrong output or log-sum-exp (chapter 8).

    With 16-bit inputs, a plain difference also reminds to compute the tiles in float32,
    unless the watch saw every tile of scores made in float32 or better.
    Called only once the output or lse failed (verdict): the loose `_matches` below only picks
    the hint, so a near miss costs a less precise hint, never a wrong verdict.
    """
    sixteen_bit = qkv[0].dtype.itemsize < 4
    tiles = [p for p in (watch.products if watch else ()) if p.summed == qkv[0].size(-1)]
    tiles16 = sixteen_bit and (not tiles or any(p.dtype.itemsize < 4 for p in tiles))
    out = got.detach().double()
    want, want_lse = _reference(*qkv, causal)
    if causal:
        for hide, hint in (
            (
                "none",
                tr_mark(
                    "it is not causal: query i also sees keys after it. Hide keys j > i (global positions)."
                ),
            ),  # fmt: skip
            (
                "diagonal",
                tr_mark(
                    "you hid the diagonal too: query i must see key i (the first query sees nothing else). Hide j > i, not j >= i."
                ),
            ),  # fmt: skip
            (
                "one late",
                tr_mark("the mask is one position late: query i saw key i + 1. Hide j > i."),
            ),
        ):
            if _matches(out, _reference(*qkv, causal, hide, block)[0]):
                return tr(hint)
    if _matches(out, _reference(*qkv, causal, "unscaled")[0]):
        return tr("the scores are not scaled: multiply q @ k^T by 1 / sqrt(head_dim).")
    if _matches(out, _reference(*qkv, causal, "twice")[0]):
        return tr("the scores are scaled twice (by 1 / head_dim): multiply q @ k^T by 1 / sqrt(head_dim) once, either q's tile or the scores, not both.")  # fmt: skip
    head_dim = qkv[0].size(-1)
    if block != head_dim and _matches(out, _reference(*qkv, causal, "block", block)[0]):
        return tr(
            "the scores are scaled by 1 / sqrt(block), the tile size: multiply q @ k^T by "
            "1 / sqrt(head_dim), q.size(-1) (here {head_dim}, with tiles of {block})."
        ).format(head_dim=head_dim, block=block)
    if any(_matches(out, mixed) for mixed in _heads_mixed(*qkv, causal)):
        return tr(
            "your output mixes heads and positions: rows were computed from other heads' or "
            "positions' q, k or v, or written to other rows. q is already (B, H, T, D): "
            "q.transpose(1, 2).reshape(B * H, T, D) reads its (B, T, H, D) transpose as "
            "(B * H, T, D). Fold (batch, heads) with q.reshape(B * H, T, D) and unfold with "
            "out.reshape(B, H, T, D) (and lse.reshape(B, H, T)), or keep the 4-D tensors and "
            "tile along T (dim -2)."
        )
    if torch.isnan(out).any():
        return tr("your output has NaN: a row whose first key tile is fully hidden gives exp(-inf - (-inf)); with causal tiles of equal size this cannot happen if you mask with global positions (qs + i, ks + j).")  # fmt: skip
    if verdict.out_ok:
        return _lse_hint(got_lse, want_lse, tiles16)
    late = _late_in_some_tiles(out, qkv, causal, block, verdict.wrong_rows)
    if late:
        return late
    if not causal and qkv[0].size(-2) % block and _matches(out, _zero_padded_keys(*qkv, block)):
        return tr(
            "your output is attention over the keys padded with zeros to a multiple of {block}: "
            "the padded keys were not hidden, and each added exp(0 - m) to l and its zero value "
            "to the average. Hide the keys at positions T = {t} and after (score -inf), or let "
            "the last key tile be shorter (k[..., ks : ks + block, :] stops at T by itself)."
        ).format(block=block, t=qkv[0].size(-2))
    for rescaled, hint in _RESCALE_MISTAKES.items():
        if _matches(out, _tiles_float64(*qkv, causal, block, rescaled)):
            return tr(hint)
    gap = (out - want).abs().max().item()
    if qkv[0].dtype == torch.float64 and gap <= 2**-16 * want.abs().max().item():
        return tr(
            "your output is off by up to {gap:.3g}: about what float32 rounding costs, for float64 "
            "inputs. Compute in the inputs' dtype: float64 inputs need float64 tiles, "
            "work = torch.promote_types(q.dtype, torch.float32) (float32 only for 16- and 32-bit inputs)."
        ).format(gap=gap)
    if not sixteen_bit and gap <= 2**-8 * want.abs().max().item():
        return tr(
            "your output is off by up to {gap:.3g}: more than {dtype} rounding explains, yet "
            "about what a rounding to 16 bits costs. Keep every tile in float32 or better (no "
            ".half() or .bfloat16() of s, p or acc) and round only the output, at the end."
        ).format(dtype=str(qkv[0].dtype).removeprefix("torch."), gap=gap)
    hint = tr(
        "your output differs from softmax(q k^T / sqrt(d)) v by up to {gap:.3g}. Per key tile: "
        "m_new = max(m, rowmax(s)); scale the old l and acc by exp(m - m_new) before adding "
        "this tile's sums; mask with global positions; tiles of {block} queries and keys."
    ).format(gap=gap, block=block)
    if tiles16:
        hint = tr("for 16-bit inputs compute each tile in float32 (q.float(), ...), as flash_forward does, and cast the output back at the end: {advice}").format(advice=hint)  # fmt: skip
    return hint


#: A tile loop that forgot to rescale part of its state, by what it did rescale (_tiles_float64).
_RESCALE_MISTAKES = {
    "l": tr_mark(
        "you rescaled l but not acc: acc was summed against the old max too, so it needs the "
        "same factor before this tile's p @ v is added, acc = acc * exp(m - m_new)[..., None] + p @ v."
    ),
    "acc": tr_mark(
        "you rescaled acc but not l: the running sum was taken against the old max too, "
        "l = l * exp(m - m_new) + rowsum(p)."
    ),
    "": tr_mark(
        "neither l nor acc was rescaled when the max grew: multiply both by exp(m - m_new) "
        "before adding this tile's sums."
    ),
}


def _tiles_float64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, block: int, rescaled: str) -> torch.Tensor:  # fmt: skip
    """The tile loop in float64 with only `rescaled` ("l", "acc" or neither) rescaled when the max grows (chapter 8)."""
    q, k, v = (x.detach().double() for x in (q, k, v))
    t, outs = q.size(-2), []
    for qs in range(0, t, block):
        qi = q[..., qs : qs + block, :] * q.size(-1) ** -0.5
        rows = torch.arange(qs, qs + qi.size(-2))[:, None]
        m = torch.full(qi.shape[:-1], -math.inf, dtype=torch.float64)
        ell, acc = torch.zeros_like(m), torch.zeros_like(qi)
        for ks in range(0, min(t, qs + block) if causal else t, block):
            s = qi @ k[..., ks : ks + block, :].transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(ks, ks + s.size(-1))[None, :] > rows, -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            p, r = torch.exp(s - m_new[..., None]), torch.exp(m - m_new)
            ell = (ell * r if rescaled == "l" else ell) + p.sum(-1)
            acc = (acc * r[..., None] if rescaled == "acc" else acc) + p @ v[
                ..., ks : ks + block, :
            ]
            m = m_new
        outs.append(acc / ell[..., None])
    return torch.cat(outs, -2)


def _matches(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a float64 result is a candidate's, to float32-level rounding: the hints' test (chapter 8)."""
    return torch.allclose(a, b, rtol=1e-5, atol=1e-7, equal_nan=True)


def _heads_mixed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> list[torch.Tensor]:  # fmt: skip
    """Outputs of (batch, heads) folded or unfolded through a transpose before a reshape, which mixes heads (chapter 8).

    fold reads x.transpose(1, 2) (B, T, H, D) as (B, H, T, D), as x.transpose(1, 2).reshape(B * H,
    T, D) does; unfold is its inverse. Attention over folded inputs, as it is or unfolded, and the
    right attention folded or unfolded. None with one head or one position, where fold changes nothing.
    """
    if q.dim() != 4 or q.size(1) == 1 or q.size(2) == 1:
        return []
    shape = q.shape
    b, h, t, d = shape
    fold = lambda x: x.transpose(1, 2).reshape(shape)  # noqa: E731
    unfold = lambda x: x.reshape(b, t, h, d).transpose(1, 2)  # noqa: E731
    mixed, right = _reference(*map(fold, (q, k, v)), causal)[0], _reference(q, k, v, causal)[0]
    return [mixed, unfold(mixed), fold(right), unfold(right)]


def _zero_padded_keys(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int) -> torch.Tensor:  # fmt: skip
    """Attention (not causal) over k and v padded with zero rows to a multiple of block, none hidden (chapter 8)."""
    pad = (-k.size(-2)) % block
    k, v = (torch.nn.functional.pad(x.detach().double(), (0, 0, 0, pad)) for x in (k, v))
    return _reference(q, k, v, False)[0]


def _lse_hint(got_lse: torch.Tensor, want_lse: torch.Tensor, sixteen_bit: bool) -> str:
    """The output is right, the log-sum-exp is not: rounded to 16 bits, off by a constant on every row, or otherwise (chapter 8).

    With 16-bit tiles the output's own rounding hides them; the float32 lse does not, so the
    hint says to compute the tiles in float32 (`sixteen_bit`: some tile of scores was 16-bit).
    """
    off = got_lse.detach().double() - want_lse
    finite = got_lse[torch.isfinite(got_lse)].detach()
    for dtype in (torch.bfloat16, torch.float16):  # a float32 lse, every value a 16-bit number
        if not sixteen_bit and finite.numel() > 1 and finite.dtype.itemsize > 2 and torch.equal(finite.to(dtype).to(finite.dtype), finite):  # fmt: skip
            return tr(
                "the output is right but the log-sum-exp was rounded to {dtype} (every value of "
                "it is a {dtype} number, up to {gap:.3g} from m + log(l)): keep it in the dtype "
                "you accumulate in, {work}, with no .to(q.dtype) or other cast on the way: backward "
                "rebuilds each probability as exp(s - lse), and the rounding would go into every one."
            ).format(dtype=str(dtype).removeprefix("torch."), work=str(got_lse.dtype).removeprefix("torch."), gap=off[torch.isfinite(want_lse)].abs().max().item())  # fmt: skip
    mine = got_lse.detach().double()
    if _matches(mine, want_lse * math.log2(math.e)) and not _matches(mine, want_lse):
        return tr(
            "the output is right but the log-sum-exp is in base 2: yours is m + log(l) times "
            "log2(e), about 1.443 times the natural one. Return the natural log, m + log(l): "
            "if you work in base 2 (exp2 of scores times log2(e)), multiply m2 + log2(l) by ln(2) "
            "at the end, since backward rebuilds each probability as exp(s - lse)."
        )
    off = off[torch.isfinite(want_lse)]
    if off.numel() and (off.max() - off.min()).item() <= 0.1 * off.mean().abs().item():
        return tr(
            "the output is right but the log-sum-exp is not: it is {off:+.3g} from m + log(l) "
            "on every row. Return exactly m + log(l), with no term added: backward rebuilds "
            "each probability as exp(s - lse), so every one would be off by exp({neg:+.3g})."
        ).format(off=off.mean().item(), neg=-off.mean().item())
    hint = tr(
        "the output is right but the log-sum-exp is not: return m + log(l) per query row, "
        "the running max plus the log of the running sum (yours is up to {gap:.3g} away)."
    ).format(gap=off.abs().max().item() if off.numel() else math.nan)
    if sixteen_bit:
        hint = tr("for 16-bit inputs compute each tile in float32 (q.float(), ...), as flash_forward does, and cast the output back at the end: {advice}").format(advice=hint)  # fmt: skip
    return hint


def _late_in_some_tiles(out: torch.Tensor, qkv: list[torch.Tensor], causal: bool, block: int, wrong_rows: torch.Tensor) -> str:  # fmt: skip
    """The hint for a mask one position late in some query tiles only, or "" (chapter 8)."""
    rows = wrong_rows.nonzero().flatten()
    if not causal or not rows.numel():
        return ""
    late = _reference(*qkv, causal, "one late", block)[0]
    if not torch.allclose(out[..., rows, :], late[..., rows, :], rtol=1e-4, atol=1e-6):
        return ""
    tiles = sorted({int(r) // block + 1 for r in rows})
    return tr(
        "in query tile(s) {tiles} (rows {first} to {last}, tiles of {block}) the mask is one "
        "position late: query i saw key i + 1 there, while the other tiles are right. Hide "
        "j > i in every tile, with global positions (qs + i, ks + j)."
    ).format(tiles=", ".join(map(str, tiles)), first=int(rows[0]), last=int(rows[-1]), block=block)


@dataclass
class _Verdict:
    """What the value probes found: output and lse within the rule, and the query rows that are not (chapter 8)."""

    out_ok: bool
    lse_ok: bool
    wrong_rows: torch.Tensor


def _forward_verdict(out: torch.Tensor, lse: torch.Tensor, qkv: list[torch.Tensor], causal: bool) -> _Verdict:  # fmt: skip
    """Output and lse against float64 by helpers.attention_errors' rule; float64 inputs by twice the rounding bound (chapter 8)."""
    q, k, v = qkv
    want, want_lse = _reference(*qkv, causal)
    err = (out.detach().double() - want).abs()
    if q.dtype == torch.float64:  # no more precise reference: float64's own rounding bound
        tol = 2 * rounding_bound(*qkv, torch.zeros_like(q), causal)["out"]
        lse_ok = bool(((lse.double() - want_lse).abs() <= 2 * lse_rounding_bound(q, k)).all())
        return _Verdict(bool((err <= tol).all()), lse_ok, (err > tol).flatten(0, -3).any(0).any(-1))  # fmt: skip
    judged = output_ratio(out, q, k, v, causal)
    factor = allowed_factor(q.dtype)
    lse_ok = lse_ratio(lse, q, k, causal)["ratio"] <= allowed_factor(
        lse.dtype
    )  # _run_tiled: float32 here
    wrong = (err > factor * judged["pytorch error"]) | err.isnan()
    return _Verdict(judged["ratio"] <= factor, lse_ok, wrong.flatten(0, -3).any(0).any(-1))


def _run_tiled(fn: Callable[..., Any], name: str, qkv: list[torch.Tensor], causal: bool, block: int) -> tuple[torch.Tensor, torch.Tensor, _Watch]:  # fmt: skip
    """Call the learner's forward under watch; check types, shapes, dtypes, inputs unchanged (chapter 8)."""
    copies = [(t.clone(), t._version) for t in qkv]
    with probe(name), _calls_to(_FORWARD_CODES) as helpers, _triton_launches() as launched, _NoSoftmaxOrSdpa(), _Watch(qkv[0].size(-1)) as watch:  # fmt: skip
        got = fn(*qkv, causal=causal, block=block)
    if helpers and helpers[0][1]:
        raise CheckFailed(
            _at(
                name,
                tr(
                    "your code ran a copy of the chapter's {helper} (its code compiled again, from "
                    "its source or pasted), which does the exercise for you: write the tile loop."
                ).format(helper=helpers[0][0]),
            )
        )
    expect(
        not helpers,
        _at(
            name,
            tr(
                "your code ran the chapter's {helper} (under another name), which does the "
                "exercise for you: write the tile loop."
            ).format(helper=helpers[0][0] if helpers else ""),
        ),
    )
    expect(not launched, _at(name, _launch_hint(launched[0]) if launched else ""))
    expect(
        isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got),
        _at(
            name, tr("return (out, lse), two tensors, not {kind}.").format(kind=type(got).__name__)
        ),  # fmt: skip
    )
    out, lse = got
    q = qkv[0]
    expect(
        all(torch.equal(t, c) and t._version == n for t, (c, n) in zip(qkv, copies)),
        _at(
            name,
            tr(
                "you changed q, k or v in place (mul_, div_, masked_fill_ on an input): the "
                "caller's tensors must come back as they were."
            ),
        ),
    )
    expect(out.shape == q.shape, _at(name, tr("out has shape {shape}; it must be q's, {want}.").format(shape=tuple(out.shape), want=tuple(q.shape))))  # fmt: skip
    expect(lse.shape == q.shape[:-1], _at(name, tr("lse has shape {shape}; one number per query row: {want}.").format(shape=tuple(lse.shape), want=tuple(q.shape[:-1]))))  # fmt: skip
    expect(out.dtype == q.dtype, _at(name, tr("out is {dtype} for {qdtype} inputs: compute in float32 if you like, then cast back (.to(q.dtype)).").format(dtype=out.dtype, qdtype=q.dtype)))  # fmt: skip
    work = torch.promote_types(q.dtype, torch.float32)  # the accumulation dtype, flash_forward's
    expect(
        lse.dtype == work,
        _at(
            name,
            tr(
                "lse is {dtype} for {qdtype} inputs: return it in the dtype you accumulate "
                "in, torch.promote_types(q.dtype, torch.float32), here {work} (float32 for 16- and "
                "32-bit inputs, float64 for float64 ones): backward rebuilds every probability from it, "
                "and the check bounds it by that dtype's rounding."
            ).format(dtype=lse.dtype, qdtype=q.dtype, work=work),
        ),
    )
    return out, lse, watch


def _large_scores_hint(out: torch.Tensor, qkv: list[torch.Tensor], causal: bool) -> str:
    """Overflow or underflow, from the real max score of each row whose output is not finite (chapter 8).

    A row whose largest score is positive overflows exp(s) without the max subtracted; a row
    whose scores are all far below 0 underflows exp(s - m) to 0 for every key when the running
    max starts at 0 instead of -inf, and l = 0 gives 0 / 0.
    """
    q, k = (x.double() for x in qkv[:2])
    s = q @ k.transpose(-2, -1) * q.size(-1) ** -0.5
    if causal:
        t = q.size(-2)
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -math.inf)
    row_max = s.amax(-1)[~torch.isfinite(out).all(-1)]
    if (row_max > 0).any():
        return tr("scores of about 100 overflow exp: subtract the running max (exp(s - m_new)), never exp(s) alone.")  # fmt: skip
    return tr(
        "rows whose largest score is far below 0 (down to {low:.0f}) came out NaN or inf: "
        "exp(s - 0) underflowed to 0 for every key, so l = 0 and out = 0 / 0. Start the running "
        "max at -inf, not 0: then m is the row's own max and its largest exp(s - m) is 1."
    ).format(low=row_max.min().item())


#: Said when one tile of large scores is right but two tiles overflow: m_new = this tile's max alone.
_RUNNING_MAX_IGNORED = tr_mark(
    "your new max ignores the running max: m_new is this tile's own max, so when a tile's max is "
    "far below an earlier tile's, exp(m - m_new) overflows (scores 100, then 0 in the next tile: "
    "exp(100) is inf in float32). Take m_new = max(m, rowmax(s)), the max over every key so far."
)


def _ignores_running_max(fn: Callable[..., Any]) -> bool:
    """Whether fn gets scores (100, 0) right in one key tile but not in two: m_new = rowmax(s) alone (chapter 8)."""
    q, v = torch.ones(1, 1, 2, 1), torch.tensor([1.0, 2.0]).view(1, 1, 2, 1)
    k = torch.tensor([100.0, 0.0]).view(1, 1, 2, 1)
    with contextlib.suppress(Exception), _NoSoftmaxOrSdpa(), _Watch():
        one, two = fn(q, k, v, causal=False, block=2)[0], fn(q, k, v, causal=False, block=1)[0]
        return bool(torch.isfinite(one).all()) and not bool(torch.isfinite(two).all())
    return False


def _tiled_value_probe(fn: Callable[..., Any], name: str, shape: tuple[int, ...], dtype: torch.dtype, causal: bool, block: int, size: float = 1.0) -> _Watch:  # fmt: skip
    """Output and log-sum-exp against float64, by helpers.attention_errors' rule (_forward_verdict) (chapter 8)."""
    g = torch.Generator().manual_seed(sum(shape) + block)
    qkv = [(size if n == 0 else 1.0) * torch.randn(shape, generator=g, dtype=torch.float64) for n in range(3)]  # fmt: skip
    qkv = [t.to(dtype) for t in qkv]
    out, lse, watch = _run_tiled(fn, name, qkv, causal, block)
    verdict = _forward_verdict(out, lse, qkv, causal)
    if not (verdict.out_ok and verdict.lse_ok):
        if size > 10 and not torch.isfinite(out).all():
            ignored = _ignores_running_max(fn)
            raise CheckFailed(_at(name, tr(_RUNNING_MAX_IGNORED) if ignored else _large_scores_hint(out, qkv, causal)))  # fmt: skip
        raise CheckFailed(_at(name, _tiled_hint(out, lse, qkv, causal, block, verdict, watch)))
    return watch


def _score_tiles(watch: _Watch, head_dim: int) -> list[tuple[int, int]]:
    """(queries, keys) of every product of a q tile and a k tile: the ones that sum over head_dim (chapter 8).

    The probes pick a head_dim that no tile has as a length, so that P @ V (summed over keys)
    never counts as scores; the first (float64, T = 40, head_dim 8) has a last key tile of 8,
    whose P @ V counts: within the whole tiles that _work_hint allows.
    """
    return [(p.shape[-2], p.shape[-1]) for p in watch.products if p.summed == head_dim and len(p.shape) >= 2]  # fmt: skip


def _tile_size_hint(tiles: list[tuple[int, int]], block: int, t: int, d: int) -> str:
    """The hint for score tiles of another size than block x block (but the last), or "" (chapter 8)."""
    if not tiles:
        return tr(
            "no product of a query tile and a key tile was computed (q tile @ k tile^T, summed "
            "over head_dim = {d}): compute each tile's scores with a matrix product, one "
            "(block x block) tile at a time, and build the softmax from them yourself."
        ).format(d=d)
    sizes = {block, t % block or block}  # the last query or key tile holds what is left
    wrong = [(r, c) for r, c in tiles if r not in sizes or c not in sizes]
    if not wrong:
        return ""
    # a tile wrong both ways first (tiles of 16 for block=32, the last one 6 x 16 aside)
    rows, keys = max(wrong, key=lambda s: (s[0] not in sizes and s[1] not in sizes, abs(s[0] * s[1] - block * block)))  # fmt: skip
    if rows >= t and keys >= t:
        hint = tr(
            "you computed {rows} x {keys} scores at once: with tiles, no T x T scores ever exist. "
            "Compute one (block x block) tile of scores at a time, block={block}."
        )
    elif rows not in sizes and keys not in sizes:
        hint = tr(
            "you computed tiles of {rows} x {keys} scores, but block={block}: use the `block` "
            "argument you were given, for the query tiles and for the key tiles, not a size of your own."
        )
    elif keys >= t:
        hint = tr(
            "you computed {rows} x {keys} scores at once: one query tile against all the keys. "
            "Tile the keys too: one (block x block) tile of scores, block={block}, at a time."
        )
    elif rows >= t:
        hint = tr(
            "you computed {rows} x {keys} scores at once: all the queries against one key tile. "
            "Tile the queries too: one (block x block) tile of scores, block={block}, at a time."
        )
    elif keys not in sizes:
        hint = tr(
            "tile the keys by block, as the exercise asks: you used key tiles of {keys} with "
            "block={block} (query tiles of {rows}). One (block x block) tile of scores at a time."
        )
    else:
        hint = tr(
            "tile the queries by block, as the exercise asks: you used query tiles of {rows} "
            "with block={block} (key tiles of {keys}). One (block x block) tile of scores at a time."
        )
    return hint.format(rows=rows, keys=keys, block=block)


def _work_probe(fn: Callable[..., Any]) -> None:
    """Every tile of scores is at most block x block, at the block given, and a causal run skips the tiles after the diagonal (chapter 8).

    Two sizes: T = 64 in tiles of 16 (head_dim 8), and T = 36 in tiles of 8 (the last one of
    4, head_dim 12): an answer that ignores `block`, or tiles only the queries or only the keys,
    or in other sizes, makes a tile of scores of another size at one of them.
    """
    for t, block, d in ((64, 16, 8), (36, 8, 12)):
        for causal in (False, True):
            name = tr("T = {t}, blocks of {block}, head_dim {d}, causal={causal}, what was computed").format(t=t, block=block, d=d, causal=causal)  # fmt: skip
            watch = _tiled_value_probe(fn, name, (1, 2, t, d), torch.float32, causal, block)
            _expect_tiled(name, watch, (1, 2, t, d), causal, block)


def _expect_tiled(name: str, watch: _Watch, shape: tuple[int, ...], causal: bool, block: int) -> None:  # fmt: skip
    """Fail a probe whose values passed but whose work was not the tile loop's, or whose running output was 16-bit (chapter 8)."""
    hint = _work_hint(watch, shape, causal, block)
    if hint:
        raise CheckFailed(_at(name, hint))
    if watch.acc16:
        raise CheckFailed(
            _at(
                name,
                tr(
                    "the running output acc (shaped {shape}) stayed in 16 bits from one key tile "
                    "to the next: it was rounded after every tile, and that rounding adds up over "
                    "the tiles (small at T = {t}, not at the lengths a model runs). Keep m, l and "
                    "acc in float32 from the first key tile to the last, and cast only the final "
                    "output back to the inputs' dtype."
                ).format(shape=watch.acc16, t=shape[-2]),
            )
        )


def _work_hint(watch: _Watch, shape: tuple[int, ...], causal: bool, block: int) -> str:
    """What the tiles of scores say against the tile loop: their size, a T x T tensor, their number, or "" (chapter 8).

    The number is counted in scores (rows x keys of every product, over batch and heads),
    not in products: all the query tiles at once in one product count as all their tiles.
    Whole tiles are allowed (padded at the end); a causal run computes at most the query tiles
    x the key tiles up to the diagonal, a plain one every pair once.
    """
    b, h, t, d = shape
    tiles = _score_tiles(watch, d)
    hint = _tile_size_hint(tiles, block, t, d)
    if hint:
        return hint
    # a T x T tensor made any other way (never one shaped like q or k^T: head_dim is a side;
    # nor one of a row per batch or head, such as lse with the heads in the batch)
    batch = {b, h, b * h}
    big = [s for s in watch.shapes if len(s) >= 2 and min(s[-2:]) > block and d not in s[-2:] and not (s[-2] in batch and s[-2] < t)]  # fmt: skip
    if big:
        return tr(
            "you made a tensor of shape {shape}: "
            "with tiles, no T x T scores ever exist. Compute one (block x block) tile of "
            "scores at a time."
        ).format(shape=max(big, key=lambda s: s[-1] * s[-2]))
    n = -(-t // block)
    most = (n * (n + 1) // 2 if causal else n * n) * block * block * b * h
    products = [p for p in watch.products if p.summed == d and len(p.shape) >= 2]
    got = sum(math.prod(p.shape) for p in products)
    if got <= most:
        return ""
    made = [(p.shape, p.operands) for p in products]
    repeats = len(made) - len(set(made))
    if repeats:
        return tr(
            "the same tile of scores was computed twice: {repeats} of your {tiles} products of a "
            "query tile and a key tile repeat one made before ({got} scores where the tiles hold "
            "{most}, {ratio:.2g} times as many). Make one pass over the key tiles with a running "
            "max and sum, rescaling l and acc by exp(m - m_new) when the max grows, not one pass "
            "for the max and sum and another for p @ v."
        ).format(repeats=repeats, tiles=len(made), got=got, most=most, ratio=got / most)
    if causal:
        return tr(
            "you computed {got} scores (q tile @ k tile^T, over every batch and head) where a "
            "causal run computes at most {most}, {ratio:.2g} times as many: the {n} query tiles x "
            "the key tiles up to the diagonal, in whole tiles of {block} x {block}. Stop each query "
            "tile's loop at its last query: the key tiles after it are all hidden, skip them (with "
            "all the query tiles at once, multiply key tile j only with query tiles j and later)."
        ).format(got=got, most=most, ratio=got / most, n=n, block=block)
    return tr(
        "you computed {got} scores (q tile @ k tile^T, over every batch and head) where the "
        "{n} x {n} tiles of {block} x {block} hold {most}, {ratio:.2g} times as many: compute "
        "each query tile against each key tile once."
    ).format(got=got, most=most, ratio=got / most, n=n, block=block)


def check_tiled_attention(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]]) -> CheckResult:
    """Exercise 2: the FlashAttention-2 forward over tiles, (out, lse), causal or not (chapter 8)."""

    def probes() -> None:
        for helper in _HELPERS:
            expect(helper not in names_used(fn), tr("you called {helper}, which does the exercise for you: write the tile loop.").format(helper=helper))  # fmt: skip
        cases = (
            (tr("float64, T = 40 (2 tiles of 16 + 8)"), (2, 3, 40, 8), torch.float64, 16),
            (tr("float32, T = 64, head_dim 32"), (1, 2, 64, 32), torch.float32, 16),
            (tr("T = 5, shorter than one tile"), (1, 1, 5, 4), torch.float32, 16),
            (tr("tiles of one position"), (1, 2, 7, 4), torch.float64, 1),
            (tr("bfloat16 inputs"), (2, 2, 24, 16), torch.bfloat16, 8),
        )
        runs = []  # (name, watch, shape, causal, block): their work is judged after the work probe
        for causal in (True, False):
            for name, shape, dtype, block in cases:
                at = tr("{name}, causal={causal}").format(name=name, causal=causal)
                runs.append((at, _tiled_value_probe(fn, at, shape, dtype, causal, block), shape, causal, block))  # fmt: skip
        at = tr("scores of about 100, float32, causal")
        runs.append((at, _tiled_value_probe(fn, at, (1, 2, 32, 16), torch.float32, True, 8, size=100.0), (1, 2, 32, 16), True, 8))  # fmt: skip
        _work_probe(fn)
        # tiles of 32 and 48, T no multiple of them: an answer that caps or rounds `block` (to 16
        # at most, to 4 at least) makes tiles of another size here or at block = 1
        wide = (
            (
                tr("float32, T = 70 in tiles of 32 (2 tiles of 32 + 6)"),
                (1, 2, 70, 8),
                torch.float32,
            ),
            (
                tr("float64, T = 100 in tiles of 48 (2 tiles of 48 + 4)"),
                (1, 1, 100, 12),
                torch.float64,
            ),
        )
        for causal in (True, False):
            for (name, shape, dtype), block in zip(wide, (32, 48)):
                at = tr("{name}, causal={causal}").format(name=name, causal=causal)
                _expect_tiled(at, _tiled_value_probe(fn, at, shape, dtype, causal, block), shape, causal, block)  # fmt: skip
        # every dtype is tiled, not only the float32 of the work probe
        for run in runs:
            _expect_tiled(*run)

    return run_check(tr("Exercise 2, the tiled attention forward"), probes)


# --- exercise 5 (stretch): the backward as Triton kernels ----------------------------------------


def _rowwise(out: object, args: tuple) -> bool:
    """Whether a product only reduced rows: at most one multiply-add per element of its largest
    input, as D = rowsum(dO * O) takes through einsum or a batched dot (chapter 8)."""
    tensors = [a for a in args if torch.is_tensor(a)]
    if not (torch.is_tensor(out) and tensors and tensors[0].dim()):
        return False
    inner = tensors[0].shape[-1]  # the dimension a matrix product sums over
    return out.numel() * inner <= max(t.numel() for t in tensors)


class _NoTorchMatmul(TorchFunctionMode):
    """Fail when the code inside multiplies matrices in PyTorch: the exercise is Triton (chapter 8).

    A product that only reduces rows (D = rowsum(dO * O) as a batched dot) is allowed; einsum
    is judged by the products it runs (_TorchProducts), since it may be either.
    """

    NAMES = ("matmul", "mm", "bmm", "__matmul__", "baddbmm", "addmm")

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if getattr(func, "__name__", "") in self.NAMES:
            out = func(*args, **(kwargs or {}))
            if _rowwise(out, args):
                return out
            raise CheckFailed(
                tr(
                    "you called torch's {name}: the products of the backward belong in the "
                    "Triton kernel (tl.dot). PyTorch may only allocate the outputs and compute "
                    "D = rowsum(dO * O)."
                ).format(name=func.__name__)
            )
        return func(*args, **(kwargs or {}))


#: The chapter's functions that run flash_backward (the PyTorch recomputation), caught by name
#: so that calling one gets its own hint, not "you called torch's __matmul__" from inside it.
_BACKWARD_HELPERS = ("flash_backward", "FlashAttention", "flash_attention", "TritonFlashAttention", "triton_attention")  # fmt: skip
#: The chapter's own Triton backward (helpers.attention_triton): its wrapper, kernels and the
#: functions they call, caught by name, by the object a name holds (an alias) and when run.
_TRITON_BACKWARD = ("triton_attention_backward", "delta_kernel", "dkdv_kernel", "dq_kernel", "_dkdv_tiles", "_dq_tiles", "DELTA_KERNEL", "DKDV_KERNEL", "DQ_KERNEL")  # fmt: skip


def _uses_chapter_backward(fn: Callable[..., Any]) -> str:
    """The name of the chapter's Triton backward piece fn's code names or holds under another name, or '' (chapter 8)."""
    pieces = {id(getattr(attention_triton, n)): n for n in _TRITON_BACKWARD if getattr(attention_triton, n, None) is not None}  # fmt: skip
    spaces = [getattr(fn, "__globals__", {})]
    for cell in getattr(fn, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # an empty cell
            spaces.append({"": cell.cell_contents})
    for name in names_used(fn) | {""}:
        if name in _TRITON_BACKWARD:
            return name
        for space in spaces:
            if name in space and id(space[name]) in pieces:
                return pieces[id(space[name])]
    return ""


@contextlib.contextmanager
def _runs_chapter_backward() -> Iterator[list[str]]:
    """The chapter's Triton backward functions that ran inside, by file and name (chapter 8).

    By file and name, not code object: Triton 3.9's interpreter runs a rewritten copy of each
    kernel, compiled from the same file under the same name.
    """
    seen: list[str] = []
    previous, where = sys.getprofile(), attention_triton.__file__

    def profile(frame, event, arg):  # noqa: ANN001, ANN202
        if event == "call" and frame.f_code.co_name in _TRITON_BACKWARD and frame.f_code.co_filename == where:  # fmt: skip
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


#: Said when the learner's function ran the chapter's own Triton backward.
_CHAPTER_BACKWARD_HINT = tr_mark(
    "your code runs the chapter's own Triton backward ({helper}, helpers.attention_triton), "
    "which does the exercise for you: write your kernels (dK and dV per key tile, dQ per "
    "query tile) in the cell."
)


class _TorchProducts(TorchDispatchMode):
    """Record every matrix product or attention kernel torch runs inside, backward included (chapter 8).

    Seen at aten's level, so that SDPA differentiated by torch.autograd.grad, a product in a
    helper of the learner's or one reached through einsum all count, whatever their name.
    """

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        product = name in (*_PRODUCTS, "dot", "vdot", "mv", "addmv", "linear")
        if (product and not _rowwise(out, args)) or name.startswith("_softmax") or "attention" in name:  # fmt: skip
            self.ran.append(name)
        return out


Launch = list[tuple[tuple[int, ...], np.ndarray, bool]]


class _Launch(list):
    """One Triton launch under the interpreter: its stores as a Launch, and what else the check reads (chapter 8).

    name: the kernel's; loads: (program id, addresses) per tl.load; flops: the multiply-adds
    of its tl.dot calls; tf32: how many of them took float32 tiles at TF32 precision;
    extents: (starts, ends), the memory its tensor arguments cover, merged and sorted.
    """

    def __init__(self, name: str, extents: tuple[np.ndarray, np.ndarray]) -> None:
        super().__init__()
        self.name, self.extents = name, extents
        self.loads: list[tuple[tuple[int, ...], np.ndarray]] = []
        self.flops = self.tf32 = 0


class _Launches(list):
    """The launches recorded by _triton_stores, plus the first access outside every argument
    (outside: kind, kernel, program id, count) and the chapter's kernels run (chapter 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.outside: tuple[str, str, tuple[int, ...], int] | None = None
        self.chapter: list[str] = []


class _OutsideArguments(Exception):
    """Raised by the recorder, before the access, for a load or store outside the launch's tensors (chapter 8)."""


def _extents(args: Any) -> tuple[np.ndarray, np.ndarray]:
    """The memory the tensors among a launch's arguments cover: (starts, ends), merged (chapter 8)."""
    spans: list[tuple[int, int]] = []

    def visit(arg: Any) -> None:
        if isinstance(arg, (tuple, list)):
            for a in arg:
                visit(a)
        elif not isinstance(arg, torch.Tensor) and isinstance(getattr(arg, "base", None), torch.Tensor):  # fmt: skip
            visit(arg.base)  # triton.reinterpret's wrapper, a tensor descriptor
        elif isinstance(arg, torch.Tensor) and arg.numel():
            size = arg.element_size()
            low = sum(min(0, (n - 1) * s) for n, s in zip(arg.shape, arg.stride()))
            high = sum(max(0, (n - 1) * s) for n, s in zip(arg.shape, arg.stride()))
            spans.append((arg.data_ptr() + low * size, arg.data_ptr() + (high + 1) * size))

    visit(args)
    merged: list[list[int]] = []
    for lo, hi in sorted(spans):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return np.array([m[0] for m in merged], np.uint64), np.array([m[1] for m in merged], np.uint64)


def _touched(ptrs: Any, mask: Any) -> np.ndarray:
    """The addresses a load or store reaches: those its mask keeps (chapter 8)."""
    data = np.asarray(ptrs.data)
    if mask is None:
        return data.reshape(-1).astype(np.uint64)
    return data[np.broadcast_to(np.asarray(mask.data).astype(bool), data.shape)].astype(np.uint64)


#: The chapter's own backward kernels, by name, whose code exercise 5 must not run (any copy).
_CHAPTER_KERNELS = ("delta_kernel", "dkdv_kernel", "dq_kernel", "_dkdv_tiles", "_dq_tiles")


def _fingerprint(fn: Any) -> tuple[str, ...]:
    """A kernel's code as exercise 2's _code_key sees it (its names and instructions): equal for a
    copy under any name, in any file or exec'd from a string (chapter 8)."""
    code = getattr(fn, "__code__", None)
    return (repr(_code_key(code)),) if isinstance(code, CodeType) else ()


def _chapter_fingerprints() -> dict[str, str]:
    """{fingerprint: name} of the chapter's backward kernels in helpers/attention_triton.py (chapter 8)."""
    found = {}
    for name in _CHAPTER_KERNELS:
        fn = getattr(attention_triton, name, None)
        for text in _fingerprint(getattr(fn, "fn", fn)) if fn is not None else ():
            found[text] = name
    return found


@contextlib.contextmanager
def _triton_stores() -> Iterator[list[Launch]]:
    """Every address each program of each Triton launch stores to and loads from, under the interpreter (chapter 8).

    One _Launch per launch: a list of (program id, addresses, atomic or not), tl.store
    through the interpreter's store, tl.atomic_add and the other read-modify-writes through
    its atomic ones. tl.atomic_xchg goes through the atomic ones too but counts as a plain store: it
    only swaps in the value the program computed, so a load followed by an atomic_xchg of the
    updated value loses the other programs' updates exactly as load + tl.store does. The
    interpreter runs the programs one after another, so two programs that load, add and store
    the same place lose nothing here, but on a GPU they run at once: the addresses say what
    the values cannot. Besides: each program's loads, each launch's tl.dot work and the
    precision asked of it, and the kernels that are copies of the chapter's (by their code).

    Every load and store is checked before it runs: an address outside the memory of the
    launch's tensor arguments (an unmasked last tile) raises _OutsideArguments and is noted in
    launches.outside, so that it never reads or corrupts memory the kernel does not own.
    """
    launches = _Launches()
    if triton_interpreter is None:
        yield launches
        return
    builder, grid = triton_interpreter.InterpreterBuilder, triton_interpreter.GridExecutor
    function = getattr(triton_interpreter, "InterpretedFunction", None)  # what triton.jit made
    store, rmw, cas, call = builder.create_masked_store, builder.create_atomic_rmw, builder.create_atomic_cas, grid.__call__  # fmt: skip
    load, dot = builder.create_masked_load, builder.create_dot
    entries = _launch_entries(function) if function is not None else []
    device_call = function.__call__ if function is not None else None
    chapter = _chapter_fingerprints()

    def inside(self: Any, ptrs: Any, mask: Any, kind: str) -> np.ndarray | None:
        """The addresses reached, once they are all inside the launch's tensors; None where nothing is watched."""
        launch = launches[-1] if launches else None
        if not isinstance(launch, _Launch):
            return None
        where = _touched(ptrs, mask)
        starts, ends = launch.extents
        size = max(1, getattr(ptrs.get_element_ty(), "primitive_bitwidth", 8) // 8)
        span = np.searchsorted(starts, where, "right") - 1
        ok = np.zeros(where.shape, bool)
        if ends.size:
            ok = (span >= 0) & (where + np.uint64(size) <= ends[np.maximum(span, 0)])
        if not ok.all():
            if launches.outside is None:
                launches.outside = (kind, launch.name, tuple(self.grid_idx), int((~ok).sum()))
            raise _OutsideArguments(launch.name)
        return where

    def record(self: Any, ptrs: Any, mask: Any, atomic: bool) -> None:
        if launches:
            where = inside(self, ptrs, mask, "store")
            launches[-1].append((tuple(self.grid_idx), _touched(ptrs, mask) if where is None else where, atomic))  # fmt: skip

    # Triton's versions add trailing arguments (3.8: cache_modifier and eviction_policy where
    # 3.1 had one cache_policy): pass on whatever follows the ones read here.
    def masked_store(self, ptrs, value, mask, *rest, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        record(self, ptrs, mask, False)
        return store(self, ptrs, value, mask, *rest, **kw)

    def masked_load(self, ptrs, mask, *rest, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        where = inside(self, ptrs, mask, "load")
        if where is not None:
            launches[-1].loads.append((tuple(self.grid_idx), where))
        return load(self, ptrs, mask, *rest, **kw)

    # An exchange is a store, not an accumulation (the enum's name, XCHG, in every version).
    # What the CPU cannot check: Triton 3.9's interpreter refuses a float32 tl.atomic_xchg
    # ("Unsupported data type", the GPU compiler accepts it), so such a kernel fails here on
    # the interpreter's error before this record counts; integer data reaches it.
    def atomic_rmw(self, op, ptr, val, mask, *rest, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        record(self, ptr, mask, "XCHG" not in str(getattr(op, "name", op)).upper())
        return rmw(self, op, ptr, val, mask, *rest, **kw)

    def atomic_cas(self, ptr, *rest, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        record(self, ptr, None, True)
        return cas(self, ptr, *rest, **kw)

    # tl.dot: its multiply-adds, and TF32 asked for float32 tiles (the interpreter computes
    # float32 whatever the precision; a GPU would round the inputs to TF32's 10 bits).
    def create_dot(self, a, b, d, precision, *rest, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        launch = launches[-1] if launches else None
        if isinstance(launch, _Launch):
            launch.flops += int(np.asarray(a.data).size) * int(np.asarray(b.data).shape[-1])
            tf32 = str(getattr(precision, "name", precision)) == "TF32"
            launch.tf32 += int(tf32 and np.asarray(a.data).dtype == np.float32)
        return dot(self, a, b, d, precision, *rest, **kw)

    def launch(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        launches.append(_Launch(getattr(self.fn, "__name__", "?"), _extents([args, list(kwargs.values())])))  # fmt: skip
        return call(self, *args, **kwargs)

    def note(fn: Any) -> None:
        name = next((chapter[f] for f in _fingerprint(fn) if f in chapter), "")
        if name and name not in launches.chapter:
            launches.chapter.append(name)

    def noting(name: str) -> Callable[..., Any]:
        original = getattr(function, name)

        def kernel_launch(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            note(self.fn)
            return original(self, *args, **kwargs)

        return kernel_launch

    def kernel_call(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202  # a device function
        note(self.fn)
        return device_call(self, *args, **kwargs)

    patches = {(builder, "create_masked_store"): masked_store, (builder, "create_atomic_rmw"): atomic_rmw,
               (builder, "create_atomic_cas"): atomic_cas, (grid, "__call__"): launch,
               (builder, "create_masked_load"): masked_load, (builder, "create_dot"): create_dot}  # fmt: skip
    if function is not None:
        patches.update({(function, name): noting(name) for name in entries})
        patches[(function, "__call__")] = kernel_call
    originals = {(owner, name): getattr(owner, name) for owner, name in patches}
    try:
        for (owner, name), fn in patches.items():
            setattr(owner, name, fn)
        yield launches
    finally:
        for (owner, name), fn in originals.items():
            setattr(owner, name, fn)


def _raced(launch: Launch) -> np.ndarray:
    """The addresses that two programs of one launch wrote, one of them with a plain store (chapter 8)."""
    if not launch:
        return np.zeros(0, np.uint64)
    addr = np.concatenate([a for _, a, _ in launch])
    ids = {pid: n for n, pid in enumerate(dict.fromkeys(pid for pid, _, _ in launch))}
    prog = np.concatenate([np.full(a.size, ids[pid]) for pid, a, _ in launch])
    plain = np.concatenate([np.full(a.size, not atomic) for _, a, atomic in launch])
    order = np.lexsort((prog, addr))
    addr, prog, plain = addr[order], prog[order], plain[order]
    first = np.r_[True, addr[1:] != addr[:-1]]
    group = np.cumsum(first) - 1
    programs = np.bincount(group, weights=first | np.r_[True, prog[1:] != prog[:-1]])
    stores = np.bincount(group, weights=plain)
    return addr[first][(programs > 1) & (stores > 0)]


def _addresses(t: torch.Tensor) -> np.ndarray:
    """The address of each element of t, as a Triton pointer holds it (chapter 8)."""
    index = torch.zeros(t.shape, dtype=torch.int64)
    for dim, (size, stride) in enumerate(zip(t.shape, t.stride())):
        shape = [1] * t.dim()
        shape[dim] = size
        index = index + torch.arange(size).view(shape) * stride
    return (t.data_ptr() + index.reshape(-1).numpy() * t.element_size()).astype(np.uint64)


def _read_after_write(launch: Launch) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """Elements one program of a launch stored and another loaded: (how many, a writer, a reader) (chapter 8).

    On a GPU the programs of a launch run at once and in no fixed order: the reader may load
    the value before or after the writer stores it. In either order here, a race.
    """
    loads = getattr(launch, "loads", [])
    if not launch or not loads:
        return 0, (), ()
    pids = list(dict.fromkeys([pid for pid, _, _ in launch] + [pid for pid, _ in loads]))
    ids = {pid: n for n, pid in enumerate(pids)}
    s_addr = np.concatenate([a for _, a, _ in launch])
    s_prog = np.concatenate([np.full(a.size, ids[pid]) for pid, a, _ in launch])
    l_addr = np.concatenate([a for _, a in loads])
    l_prog = np.concatenate([np.full(a.size, ids[pid]) for pid, a in loads])
    keep = np.isin(l_addr, s_addr)
    l_addr, l_prog = l_addr[keep], l_prog[keep]
    if not l_addr.size:
        return 0, (), ()
    order = np.lexsort((s_prog, s_addr))
    s_addr, s_prog = s_addr[order], s_prog[order]
    first = np.flatnonzero(np.r_[True, s_addr[1:] != s_addr[:-1]])
    lowest, highest = s_prog[first], np.maximum.reduceat(s_prog, first)
    at = np.searchsorted(s_addr[first], l_addr)
    other = (lowest[at] != l_prog) | (highest[at] != l_prog)
    if not other.any():
        return 0, (), ()
    n = int(np.unique(l_addr[other]).size)
    i = int(np.flatnonzero(other)[0])
    writer = lowest[at[i]] if lowest[at[i]] != l_prog[i] else highest[at[i]]
    return n, pids[int(writer)], pids[int(l_prog[i])]


def _unset(dtype: torch.dtype) -> float:
    """What the check fills new torch.empty tensors with inside exercise 5: garbage, but finite (chapter 8)."""
    return min(1e30, torch.finfo(dtype).max / 16)


class _TorchWork(TorchDispatchMode):
    """What torch computes inside exercise 5's function, at aten's level (chapter 8).

    scores: (op, shape) of each new result as large as the T x T scores of every (batch, head):
    two dimensions of at least T, or T x T x head_dim elements per (batch, head) (a broadcast
    product before its sum), whatever the op (mul and sum, no matrix product). copies: torch
    copies of q, k, v, dO (clone, .to, copy_), which a kernel may load instead. New
    torch.empty tensors are filled with _unset(dtype), so that a kernel adding into one that
    was never zeroed fails every time, not only when the allocator's memory was not zero.
    """

    EMPTY = ("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided")
    COPY = ("clone", "_to_copy", "copy_")

    def __init__(self, inputs: dict[str, torch.Tensor]) -> None:
        super().__init__()
        b, h, self.t, self.d = inputs["q"].shape
        self.bh = b * h
        self.scores: list[tuple[str, tuple[int, ...]]] = []
        self.copies: dict[str, list[torch.Tensor]] = {name: [] for name in inputs}
        self.storages = {x.untyped_storage().data_ptr(): name for name, x in inputs.items()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in self.EMPTY and isinstance(out, torch.Tensor) and out.is_floating_point():
            out.fill_(_unset(out.dtype))
        elif name in self.COPY:
            source, copy = (args[1], args[0]) if name == "copy_" else (args[0], out)
            if all(isinstance(x, torch.Tensor) and x.layout == torch.strided for x in (source, copy)):  # fmt: skip
                of = self.storages.get(source.untyped_storage().data_ptr())
                if of is not None and copy.numel() == source.numel():
                    self.storages[copy.untyped_storage().data_ptr()] = of
                    self.copies[of].append(copy)
        else:
            given = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor) and a.layout == torch.strided}  # fmt: skip
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.untyped_storage().data_ptr() in given:  # fmt: skip
                    continue  # a view of an input: no new memory
                wide = sum(n >= self.t for n in t.shape) >= 2 or t.numel() >= self.bh * self.t * self.t * self.d  # fmt: skip
                if t.numel() >= self.bh * self.t * self.t and wide:
                    self.scores.append((name, tuple(t.shape)))
        return out


def _origins(part: torch.Tensor, launches: list[Launch], inputs: dict[str, np.ndarray]) -> list[int]:  # fmt: skip
    """The launches whose work went into part: those that stored it, and before them, those
    that stored what they loaded (a scratch buffer, D, a recomputed lse), the inputs aside (chapter 8)."""
    stored = [np.unique(np.concatenate([a for _, a, _ in launch] or [np.zeros(0, np.uint64)])) for launch in launches]  # fmt: skip
    given = np.concatenate(list(inputs.values()))
    todo = [i for i, s in enumerate(stored) if np.isin(_addresses(part), s).any()]
    seen = set(todo)
    while todo:
        i = todo.pop()
        loaded = [a for _, a in getattr(launches[i], "loads", [])]
        if not loaded:
            continue
        need = np.setdiff1d(np.concatenate(loaded), given)
        for j in range(i):
            if j not in seen and np.isin(need, stored[j]).any():
                seen.add(j)
                todo.append(j)
    return sorted(seen)


def _expect_triton_work(name: str, launches: list[Launch], got: tuple[torch.Tensor, ...], inputs: dict[str, torch.Tensor], work: _TorchWork, causal: bool) -> None:  # fmt: skip
    """The launches that computed each gradient ran its products with tl.dot and loaded q, k, v, dO themselves (chapter 8).

    A kernel that only copies values computed beforehand (in PyTorch without a matrix
    product, in NumPy) into dq, dk, dv runs no tl.dot and loads none of the inputs.
    """
    memory = {n: _addresses(x) for n, x in inputs.items()}
    b, h, t, d = inputs["q"].shape
    pairs = t * (t + 1) // 2 if causal else t * t
    need = b * h * pairs * d  # dV = P^T dO alone: one multiply-add per visible pair and column
    for part, gp in zip(("dq", "dk", "dv"), got):
        origins = _origins(gp, launches, memory)
        kernels = ", ".join(dict.fromkeys(getattr(launches[i], "name", "?") for i in origins))
        flops = sum(getattr(launches[i], "flops", 0) for i in origins)
        said = {"part": part, "kernels": kernels, "flops": flops, "need": need, "pairs": pairs, "d": d, "bh": b * h}  # fmt: skip
        expect(
            flops >= need,
            _at(
                name,
                tr(
                    "the Triton kernels that computed {part} ({kernels}) ran {flops} multiply-adds "
                    "in tl.dot, fewer than the {need} that {part} alone takes ({pairs} pairs of a "
                    "query and a key it sees x head_dim {d} x {bh} (batch, head)): compute the "
                    "products of the backward with tl.dot inside your kernels, not beforehand in "
                    "PyTorch or NumPy with a kernel that only copies the result."
                ).format(**said),
            ),
        )
        loaded = np.unique(np.concatenate([a for i in origins for _, a in getattr(launches[i], "loads", [])] or [np.zeros(0, np.uint64)]))  # fmt: skip
        for x in ("q", "k", "dO") if part == "dv" else ("q", "k", "v", "dO"):
            copies = [memory[x]] + [_addresses(c) for c in work.copies.get(x, [])]
            missing = min(int((~np.isin(m, loaded)).sum()) for m in copies)
            said.update(missing=missing, numel=inputs[x].numel(), x=x)
            expect(
                missing == 0,
                _at(
                    name,
                    tr(
                        "the Triton kernels that computed {part} ({kernels}) never loaded {missing} "
                        "of the {numel} elements of {x}: the kernels that compute {part} read q, k, "
                        "v and dO themselves (tl.load), not tensors made from them in PyTorch or "
                        "NumPy (a scaled copy of q included: scale inside the kernel), and "
                        "multiply them with tl.dot."
                    ).format(**said),
                ),
            )


def _kernels_storing(t: torch.Tensor, launches: list[Launch]) -> str:
    """The names of the kernels that stored into t, or "" (on a GPU: none watched) (chapter 8)."""
    if t.device.type != "cpu":
        return ""
    mine = _addresses(t)
    names = [getattr(launch, "name", "") for launch in launches if launch and np.isin(mine, np.concatenate([a for _, a, _ in launch])).any()]  # fmt: skip
    return ", ".join(dict.fromkeys(n for n in names if n))


def _unzeroed_hint(part: str, mine: torch.Tensor, launches: list[Launch]) -> str:
    """The hint for a gradient added into with atomics that never started at zero, or "" (chapter 8)."""
    if mine.device.type != "cpu" or not mine.is_floating_point():
        return ""
    garbage = (mine.abs() >= _unset(mine.dtype) / 2).reshape(-1)
    if not garbage.any():
        return ""
    added = [a for launch in launches for _, a, atomic in launch if atomic]
    if not added or not np.isin(_addresses(mine)[garbage.numpy()], np.concatenate(added)).any():
        return ""
    return tr(
        "{n} of its elements are garbage, and your kernels added into them with tl.atomic_add: "
        "atomic adds add to what the tensor held before, and torch.empty_like leaves whatever "
        "was in memory (the check fills new torch.empty tensors with {unset:.0e} to show it; "
        "elsewhere it is often 0 and sometimes not). Allocate the tensor you accumulate {part} "
        "into with torch.zeros_like(q), or zero it before the launch."
    ).format(n=int(garbage.sum()), unset=_unset(mine.dtype), part=part)


def _unwritten_hint(mine: torch.Tensor, launches: list[Launch]) -> str:
    """The hint for a gradient whose elements still hold what torch.empty left, no kernel having stored them, or "" (chapter 8)."""  # fmt: skip
    if mine.device.type != "cpu" or not mine.is_floating_point():
        return ""
    garbage = (mine.abs() >= _unset(mine.dtype) / 2).reshape(-1)
    if not garbage.any():
        return ""
    stored = [a for launch in launches for _, a, _ in launch] or [np.zeros(0, np.uint64)]
    n = int((~np.isin(_addresses(mine)[garbage.numpy()], np.concatenate(stored))).sum())
    if not n:
        return ""
    return tr(
        "{n} of its elements were never written by your kernels: they still hold what "
        "torch.empty left there (the check fills new torch.empty tensors with {unset:.0e} to "
        "show it). Launch a program for every tile, triton.cdiv(T, BLOCK) of them for each "
        "(batch, head), and keep every row below T in each store's mask."
    ).format(n=n, unset=_unset(mine.dtype))


#: Said where the check ran the kernels in Triton's interpreter (on a CPU).
_CPU_LIMITS = tr_mark(
    "on this CPU, Triton's interpreter ran your kernels one program at a time: the check read "
    "the addresses they load and store (races between programs, accesses past the end) and "
    "the precision each tl.dot asked for, but it cannot check what only a GPU shows: the "
    "speed, the timing of programs that run at the same time, tile sizes that do not fit in "
    "a GPU's shared memory, and code the interpreter runs but the compiler rejects. Run the "
    "check on a GPU for those."
)


def _expect_triton_wrote(name: str, launches: list[Launch], got: tuple[torch.Tensor, ...]) -> None:
    """Under the interpreter: Triton stored every element of dq, dk, dv, and no two programs raced (chapter 8)."""
    expect(launches, _at(name, tr("no Triton kernel ran: launch your kernels (kernel[grid](...)) to compute dq, dk and dv; PyTorch may only allocate the outputs and compute D = rowsum(dO * O).")))  # fmt: skip
    written = np.unique(np.concatenate([a for launch in launches for _, a, _ in launch] or [np.zeros(0, np.uint64)]))  # fmt: skip
    # in any tensor, not only the returned ones: a scratch buffer copied into dq later races too
    races = [_raced(launch) for launch in launches]
    for part, t in zip(("dq", "dk", "dv"), got):
        if t.device.type != "cpu":
            continue
        mine = _addresses(t)
        missing = int((~np.isin(mine, written)).sum())
        expect(
            missing == 0,
            _at(
                name,
                tr(
                    "{missing} of the {numel} elements of the {part} you returned were not stored "
                    "by a Triton kernel: return the tensors your kernels write (tl.store), not "
                    "values computed or copied by PyTorch."
                ).format(missing=missing, numel=t.numel(), part=part),
            ),
        )
        raced = [int(np.isin(r, mine).sum()) for r in races]
        expect(
            not any(raced),
            _at(
                name,
                tr(
                    "{n} elements of {part} were written by more than one program of the same "
                    "launch, at least once with a plain tl.store or a tl.atomic_xchg (load, add, store): on a "
                    "GPU those programs run at the same time and one overwrites the others' sums. "
                    "Triton's interpreter on this CPU runs the programs one after another, so the "
                    "values came out right here; the check found the race in the addresses your "
                    "kernel stores to. Give each element one program that writes it (a dQ kernel "
                    "per query tile), or add with tl.atomic_add."
                ).format(n=max(raced), part=part),
            ),
        )
    expect(
        not any(r.size for r in races),
        _at(
            name,
            tr(
                "{n} elements of a buffer you do not return (a scratch buffer?) were written by "
                "more than one program of the same launch, at least once with a plain tl.store "
                "or a tl.atomic_xchg (load, add, store): on a GPU those programs run at the same time and one "
                "overwrites the others' sums, so whatever you compute or copy from that buffer "
                "afterwards is wrong. Triton's interpreter on this CPU runs the programs one after "
                "another, so the values came out right here; the check found the race in the "
                "addresses your kernel stores to. Give each element one program that writes it, "
                "or add with tl.atomic_add."
            ).format(n=max((r.size for r in races), default=0)),
        ),
    )


def _backward_probe(fn: Callable[..., Any], shape: tuple[int, ...], causal: bool, device: torch.device) -> None:  # fmt: skip
    """dq, dk, dv of the learner's kernels against float64, by helpers.attention_errors' rule (chapter 8).

    Torch's products and attention kernels are watched at aten's level (autograd's too), and
    so is every torch result as large as the T x T scores (_TorchWork); under the interpreter,
    every Triton load, store and tl.dot is watched as well (_triton_stores).
    """
    g = torch.Generator().manual_seed(sum(shape))
    q, k, v, dout = (torch.randn(shape, generator=g).to(device) for _ in range(4))
    out, lse = flash_forward(q, k, v, causal)
    name = tr("shape {shape}, causal={causal}").format(shape=shape, causal=causal)
    inputs = {"q": q, "k": k, "v": v, "dO": dout}
    # (the chapter's flash_backward under another name runs torch's matmul: caught by name)
    with probe(name), _triton_stores() as launches, _NoTorchMatmul(), _TorchProducts() as products, _TorchWork(inputs) as work, _runs_chapter_backward() as chapter:  # fmt: skip
        try:
            got = fn(q, k, v, out, lse, dout, causal)
        except Exception:  # an access outside the tensors, a chapter's kernel: they say more
            if getattr(launches, "outside", None) is None and not getattr(launches, "chapter", None):  # fmt: skip
                raise
            got = None
    outside = getattr(launches, "outside", None)
    if outside is not None:
        kind, kernel, pid, n = outside
        message = {
            "load": tr_mark(
                "your kernel {kernel} loads from {n} addresses outside every tensor it was given "
                "(program {pid}, T = {t}): its last tile runs past the end when T is not a "
                "multiple of the tile, or an offset is wrong. Mask the last tile: "
                "tl.load(ptrs, mask=rows[:, None] < seq_len, other=0.0), and give the rows and "
                "keys past the end P = 0. On a GPU such a load reads garbage or crashes; the "
                "check stopped your kernel before the load, so nothing was read."
            ),
            "store": tr_mark(
                "your kernel {kernel} stores to {n} addresses outside every tensor it was given "
                "(program {pid}, T = {t}): its last tile runs past the end when T is not a "
                "multiple of the tile, or an offset is wrong. Mask the last tile: "
                "tl.store(ptrs, value, mask=rows[:, None] < seq_len). On a GPU such a store "
                "overwrites other memory or crashes; the check stopped your kernel before the "
                "store, so nothing was written."
            ),
        }[kind]
        raise CheckFailed(_at(name, tr(message).format(kernel=kernel, n=n, pid=pid, t=shape[-2])))  # fmt: skip
    expect(not chapter, _at(name, tr(_CHAPTER_BACKWARD_HINT).format(helper=chapter[0] if chapter else "")))  # fmt: skip
    copied = getattr(launches, "chapter", [])
    expect(
        not copied,
        _at(
            name,
            tr(
                "your code ran {kernel}, a copy of the chapter's own Triton kernel "
                "(helpers/attention_triton.py: the same code under another name or from another "
                "file), which does the exercise for you: write your kernels (dK and dV per key "
                "tile, dQ per query tile) in the cell."
            ).format(kernel=copied[0] if copied else ""),
        ),
    )
    expect(
        not products.ran,
        _at(
            name,
            tr(
                "torch ran {ops} inside your function (a matrix product or an attention kernel, "
                "maybe through torch.autograd.grad or a helper): the products of the backward "
                "belong in the Triton kernel (tl.dot). PyTorch may only allocate the outputs and "
                "compute D = rowsum(dO * O)."
            ).format(ops=", ".join(dict.fromkeys(products.ran))),
        ),
    )
    if work.scores:
        op, big = work.scores[0]
        raise CheckFailed(
            _at(
                name,
                tr(
                    "torch computed {op} of shape {shape} inside your function: as large as the "
                    "T x T scores of every (batch, head) (T = {t}) or larger. FlashAttention never "
                    "keeps a T x T matrix in memory: compute each tile's scores inside your "
                    "kernels (tl.dot) and keep them there. PyTorch may only allocate the outputs "
                    "and compute D = rowsum(dO * O)."
                ).format(op=op, shape=big, t=shape[-2]),
            )
        )
    expect(isinstance(got, tuple) and len(got) == 3, _at(name, tr("return (dq, dk, dv).")))
    for part, gp in zip(("dq", "dk", "dv"), got):
        expect(isinstance(gp, torch.Tensor) and gp.shape == q.shape, _at(name, tr("{part} must be a tensor shaped like q.").format(part=part)))  # fmt: skip
        expect(
            gp.dtype == q.dtype,
            _at(
                name,
                tr(
                    "{part} is {got}, but q is {want}: return each gradient in its input's dtype "
                    "(torch.empty_like(q) allocates it so)."
                ).format(part=part, got=gp.dtype, want=q.dtype),
            ),
        )
    ratios = error_ratios(dict(zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *got))), q, k, v, dout, causal)  # fmt: skip
    wrong = [part for part in ("dq", "dk", "dv") if not ratios[part]["ratio"] <= allowed_factor(q.dtype)]  # fmt: skip
    if wrong:
        part = wrong[0]
        mine = got[("dq", "dk", "dv").index(part)]
        unzeroed = _unzeroed_hint(part, mine, launches)
        if unzeroed:
            head = tr("{part} is off by {ratio:.3g} x the error PyTorch makes in float32:").format(part=part, ratio=ratios[part]["ratio"])  # fmt: skip
            raise CheckFailed(_at(name, _then(head, unzeroed)))
        kernel, unwritten = _kernels_storing(mine, launches), _unwritten_hint(mine, launches)
        raise CheckFailed(_at(name, _backward_hint(wrong, got, (q, k, v, dout), causal, ratios, device, kernel, unwritten)))  # fmt: skip
    if device.type == "cpu":
        _expect_triton_wrote(name, launches, got)
        _expect_triton_work(name, launches, got, inputs, work, causal)
        for launch in launches:
            n, writer, reader = _read_after_write(launch)
            expect(
                n == 0,
                _at(
                    name,
                    tr(
                        "{n} elements were stored by one program of {kernel} and loaded by another "
                        "program of the same launch (program {writer} stored, program {reader} "
                        "loaded): on a GPU the programs of a launch run at the same time and in no "
                        "fixed order, so the loading program may read the value before it is "
                        "written. Triton's interpreter on this CPU runs the programs one after "
                        "another, so the values came out right here; the check found it in the "
                        "addresses your kernel loads and stores (the timing itself it cannot "
                        "see). Compute such a value before the launch (in PyTorch, like D, or in "
                        "a kernel of its own launched first), or in every program that needs it."
                    ).format(n=n, kernel=getattr(launch, "name", ""), writer=writer, reader=reader),
                ),
            )
        tf32 = [(launch.name, launch.tf32) for launch in launches if getattr(launch, "tf32", 0)]
        expect(
            not tf32,
            _at(
                name,
                tr(
                    "your kernel {kernel} called tl.dot {n} times on float32 tiles at TF32 "
                    "precision, tl.dot's default: on a GPU (Ampere and later) that rounds the "
                    "float32 inputs to TF32's 10-bit mantissa, and the gradients lose about three "
                    "decimal digits. Triton's interpreter on this CPU computes float32 whatever "
                    "the precision, so the values came out right here; the check read the "
                    'precision each tl.dot asked for. Pass input_precision="ieee" to every tl.dot.'
                ).format(kernel=tf32[0][0] if tf32 else "", n=tf32[0][1] if tf32 else 0),
            ),
        )


#: What each gradient is made of, said in the hint of the first one that is off.
_GRADIENT_FORMULAS = {
    "dv": tr_mark("dV = P^T dO, P = exp(s - lse) recomputed per tile (hidden keys 0)."),
    "dq": tr_mark("dQ = dS K / sqrt(d), dS = P * (dO V^T - D), D = rowsum(dO * O)."),
    "dk": tr_mark("dK = dS^T Q / sqrt(d), summed over every query tile that sees the key tile."),
}


#: Mistakes a float64 model of the backward reproduces, by what it changes (_gradient_model).
_BACKWARD_MISTAKES = {
    "exp2": tr_mark(
        "it is what P = 2^(s - lse) gives instead of e^(s - lse): tl.exp2(x) is 2 to the x, "
        "and the scores and the lse you are given are in base e. Use tl.exp(s - lse), or stay in "
        "base 2 with tl.exp2((s - lse) * log2(e)), log2(e) = 1.4426950408889634, the lse "
        "included in the product."
    ),
    "exp2, lse in base e": tr_mark(
        "it is what P = 2^(s * log2(e) - lse) gives: you moved the scores to base 2 (times "
        "log2(e)) for tl.exp2 but not the lse, which is a natural log. Multiply the whole "
        "difference: tl.exp2((s - lse) * log2(e)), or use tl.exp(s - lse)."
    ),
    "diagonal tile": tr_mark(
        "it is what a causal backward gives that leaves out every pair of a query and a key in "
        "the same tile of {block} (i // {block} == j // {block}): the diagonal tiles. In the dQ "
        "kernel the causal loop over key tiles must include the query tile's own (diagonal) "
        "tile, end = min((tile + 1) * BLOCK, T), not tile * BLOCK; the mask j > i hides the "
        "later keys inside it."
    ),
    "diagonal tile, dk": tr_mark(
        "it is what a causal backward gives that leaves out every pair of a query and a key in "
        "the same tile of {block} (i // {block} == j // {block}): the diagonal tiles. In the dK "
        "and dV kernel the causal loop over query tiles must start at the key tile's own "
        "(diagonal) tile, start = tile * BLOCK, not after it; the mask j > i hides the earlier "
        "queries inside it."
    ),
}


def _gradient_model(inputs: tuple[torch.Tensor, ...], causal: bool, part: str, mistake: str, block: int = 0) -> torch.Tensor:  # fmt: skip
    """dq, dk or dv in float64 with one of _BACKWARD_MISTAKES made (chapter 8).

    P is rebuilt from the right lse and D = rowsum(dO * O) from the right output, as the
    learner's kernels are given them; only the kernels' own step goes wrong: P in base 2, or
    the pairs (query i, key j) of the tiles on the diagonal (i // block == j // block) left out.
    """
    q, k, v, dout = (x.detach().cpu().double() for x in inputs)
    t, scale = q.size(-2), q.size(-1) ** -0.5
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    hidden = (j > i) if causal else torch.zeros(t, t, dtype=torch.bool)
    s = (q @ k.transpose(-2, -1) * scale).masked_fill(hidden, -math.inf)
    lse = torch.logsumexp(s, -1, keepdim=True)
    p = torch.exp(s - lse)
    delta = (dout * (p @ v)).sum(-1, keepdim=True)
    if mistake == "exp2":
        p = torch.exp2(s - lse)
    elif mistake == "exp2, lse in base e":
        p = torch.exp2(s / math.log(2) - lse)
    elif mistake.startswith("diagonal tile"):
        p = p.masked_fill(i // block == j // block, 0.0)
    ds = p * (dout @ v.transpose(-2, -1) - delta)
    return {
        "dq": lambda: ds @ k * scale,
        "dk": lambda: ds.transpose(-2, -1) @ q * scale,
        "dv": lambda: p.transpose(-2, -1) @ dout,
    }[part]()


def _backward_mistake(part: str, mine: torch.Tensor, inputs: tuple[torch.Tensor, ...], causal: bool, within: float) -> str:  # fmt: skip
    """The hint of the _BACKWARD_MISTAKES whose model `mine` matches within `within`, or "" (chapter 8).

    The diagonal tiles' size is not known: every power of two from 8 below the sequence
    length is tried (the one that matches is named).
    """
    t = inputs[0].size(-2)
    tried = [("exp2", 0), ("exp2, lse in base e", 0)]
    if causal:
        diagonal = "diagonal tile" if part == "dq" else "diagonal tile, dk"
        tried += [(diagonal, 2**n) for n in range(3, 12) if 2**n < t]
    for mistake, block in tried:
        model = _gradient_model(inputs, causal, part, mistake, block)
        if (mine - model).abs().max().item() <= within:
            return tr(_BACKWARD_MISTAKES[mistake]).format(block=block)
    return ""


def _scale_hint(part: str, c: float, head_dim: int) -> str:
    """The hint for a gradient that is sqrt(head_dim) or 1 / sqrt(head_dim) times the right one, or "" (chapter 8)."""
    root = math.sqrt(head_dim)
    if part == "dv" and min(abs(c / root - 1), abs(c * root - 1)) <= 1e-3:
        return tr(
            "it is {c:.6g} times the right one, and sqrt(head_dim) = {root:.6g}: dv takes no "
            "scale. dV = P^T dO: P already holds the scale of the scores, and dO none."
        ).format(c=c, root=root)
    if abs(c / root - 1) <= 1e-3:
        return tr(
            "it is {c:.6g} times the right one, and sqrt(head_dim) = {root:.6g}: the 1/sqrt(d) "
            "scale is missing on {part}. The scores carry it, so dQ = dS K / sqrt(d) and "
            "dK = dS^T Q / sqrt(d) carry it too (dV = P^T dO does not)."
        ).format(c=c, root=root, part=part)
    if abs(c * root - 1) <= 1e-3:
        return tr(
            "it is {c:.6g} times the right one, which is 1 / sqrt(head_dim) = {inv:.6g}: {part} "
            "has the 1/sqrt(d) scale twice. Apply it once: dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d)."
        ).format(c=c, inv=1 / root, part=part)
    return ""


def _backward_hint(wrong: list[str], got: tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...], causal: bool, ratios: dict[str, dict[str, float]], device: torch.device, kernel: str = "", unwritten: str = "") -> str:  # fmt: skip
    """Name the mistake behind the first wrong gradient: a constant factor, some rows only, a 16-bit rounding (chapter 8).

    unwritten: _unwritten_hint's, said when no narrower hint (some heads, some rows) fits.
    kernel: the kernels that stored it, named by the causal hint. The check runs every probe
    without causal before the causal ones, so a causal probe that fails found the formulas
    right: what is left of the generic hint is the causal mask.
    """
    part = wrong[0]
    exact = kernel_results(plain_attention, *(x.double() for x in inputs), causal)[part]
    mine = got[("dq", "dk", "dv").index(part)].detach().cpu().double()
    exact = exact.cpu()
    within = allowed_factor(inputs[0].dtype) * ratios[part]["pytorch error"]
    head = tr("{part} is off by {ratio:.3g} x the error PyTorch makes in float32:").format(part=part, ratio=ratios[part]["ratio"])  # fmt: skip
    c = ((mine * exact).sum() / (exact * exact).sum()).item()
    scale = _scale_hint(part, c, inputs[0].size(-1)) if (mine - c * exact).abs().max().item() <= within else ""  # fmt: skip
    if scale:
        return _then(head, scale)
    mistake = _backward_mistake(part, mine, inputs, causal, within)
    if mistake:
        return _then(head, mistake)
    if (mine - c * exact).abs().max().item() <= within:
        return (
            head
            + " "
            + tr(
                "it is {c:.6g} times the right one, a factor on every element, as when every P is "
                "off by one: build each P = exp(s - lse) with the lse exactly as given (no term "
                "added, no other max)."
            ).format(c=c)
        )
    heads = ((mine - exact).abs() > within).flatten(-2).any(-1)  # (batch, head) wrong or not
    if heads.any() and not heads.all():
        return (
            head
            + " "
            + tr(
                "only (batch, head) {which} of {shape} are, the others are right: does your grid "
                "cover every (batch, head) (a program axis of batch x heads), and does each "
                "program offset its pointers by its own (batch, head)?"
            ).format(
                which=", ".join(str(tuple(i)) for i in heads.nonzero().tolist()),
                shape=tuple(heads.shape),
            )
        )
    rows = ((mine - exact).abs() > within).flatten(0, -3).any(0).any(-1).nonzero().flatten()
    if part == "dq" and causal and rows.numel() and int(rows[-1]) - int(rows[0]) < mine.size(-2) // 2:  # fmt: skip
        return (
            head
            + " "
            + tr(
                "only rows {first} to {last} are, the rest are right: look at what your kernel "
                "does differently for those query rows, first the causal mask (hide keys j > i, "
                "global positions)."
            ).format(first=int(rows[0]), last=int(rows[-1]))
        )
    if unwritten:
        return _then(head, unwritten)
    advice = tr(_GRADIENT_FORMULAS[part])
    if (mine - exact).abs().max().item() <= 2**-8 * exact.abs().max().item():
        advice = tr(
            "small, but about what a rounding to 16 bits costs: keep P, dS, D and every tl.dot "
            "input in float32 (no .to(tl.float16), no 16-bit copy of O for D). {advice}"
        ).format(advice=advice)
        if "dv" not in wrong:
            advice += " " + tr("dv is right, so P is: look at dS and D.")
    elif causal:
        where = tr("{kernel}, the kernel that stores {part}").format(kernel=kernel, part=part) if kernel else tr("the kernel that computes {part}").format(part=part)  # fmt: skip
        advice = tr(
            "the probes without causal passed, so your formulas are right and the causal mask "
            "is not: in {where}, P must be 0 where key j > query i, in global positions (each "
            "tile's start plus tl.arange), before P enters any product, and the causal loop "
            "must reach every tile that holds a pair the query sees. {advice}"
        ).format(where=where, advice=advice)
    if device.type == "cuda":
        advice += " " + tr('On a GPU, tl.dot rounds float32 inputs to TF32 unless you pass input_precision="ieee".')  # fmt: skip
    return _then(head, advice)


def check_triton_backward(fn: Callable[..., tuple[torch.Tensor, ...]]) -> CheckResult:
    """Exercise 5 (stretch): the attention backward as Triton kernels, equal to flash_backward's (chapter 8).

    Everywhere: dq, dk, dv against float64 within ALLOWED_FACTOR x plain PyTorch's float32
    error (helpers.attention_errors, FlashAttention's tests' rule), and no matrix
    product or attention kernel run by torch (seen at aten's level, autograd's included), nor
    the chapter's backward under any name, nor any torch result as large as the T x T scores,
    and the gradients in q's dtype. T = 37 is no multiple of any tile: a kernel without
    boundary masks fails there. On a CPU, Triton's interpreter runs the kernels one
    program at a time, so a race between programs (two of them loading, adding and storing
    the same dQ rows) loses no update there: the check instead records every address each
    program stores to and loads from (the interpreter's load, store and atomic functions,
    patched) and fails when two programs of one launch write the same element with a plain
    store, when one program loads what another stored, or when an element returned was not
    stored by a kernel. Each load and store is checked before it runs: one outside the
    memory of the launch's tensors (an unmasked last tile) stops the kernel before it reads
    or corrupts anything. The launches that computed each gradient must have run its
    products with tl.dot, float32 ones at input_precision "ieee" (or "tf32x3"), and loaded
    q, k, v, dO themselves; no launched kernel may be a copy of the chapter's (compared by
    code, under any name or file). What the CPU cannot check, and the check says so after a
    pass: speed, the timing of programs that run at once, tiles too large for a GPU's shared
    memory, and code the interpreter accepts but the compiler rejects. On a GPU the kernels
    are compiled, their loads and stores cannot be watched, and only the values and torch's
    ops are.
    """
    title = tr("Exercise 5, the backward in Triton")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    status = triton_status(device)
    if not status.runs:
        print("⏭ " + tr("{title}: skipped, Triton cannot run here: {status}").format(title=title, status=status))  # fmt: skip
        return CheckResult(title, SKIP, str(status))
    if status.mode == "interpreter":
        device = torch.device("cpu")

    def probes() -> None:
        for helper in _BACKWARD_HELPERS:  # by name first: a hint before anything runs
            expect(
                helper not in names_used(fn),
                tr(
                    "you called {helper}, which computes the backward in PyTorch: the products "
                    "belong in your Triton kernels (tl.dot); PyTorch may only allocate the outputs "
                    "and compute D = rowsum(dO * O)."
                ).format(helper=helper),
            )
        helper = _uses_chapter_backward(fn)
        expect(not helper, tr(_CHAPTER_BACKWARD_HINT).format(helper=helper))
        # every probe without causal first: the causal hint counts on it (_backward_hint)
        for causal in (False, True):
            for shape in ((1, 2, 40, 16), (2, 1, 64, 32), (1, 2, 37, 16)):
                _backward_probe(fn, shape, causal, device)

    result = run_check(title, probes)
    if result.passed and status.mode == "interpreter":
        print("   " + tr(_CPU_LIMITS))
    return result
