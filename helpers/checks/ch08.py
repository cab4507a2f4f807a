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
    else:
        acc = acca * sa[..., None] + accb * sb[..., None]
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
}


def _at(name: str, text: str) -> str:
    """'[probe: name] text', in the current language (chapter 8)."""
    return tr("[probe: {name}] {text}").format(name=name, text=text)


def _merge_hint(got: State, a: State, b: State) -> str:
    """Name the mistake whose result matches `got`, or say which part is off (chapter 8).

    Only picks the hint of a merge already failed against its rounding bound: a loose match
    here costs a less precise hint, never a wrong verdict.
    """
    for mistake, hint in _MERGE_HINTS.items():
        wrong = _merge(a, b, mistake)
        if all(torch.allclose(g.double(), w.double(), rtol=1e-6, atol=1e-9, equal_nan=True) for g, w in zip(got, wrong)):  # fmt: skip
            return tr(hint)
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
    sixteen = _sixteen_bit_factors(got, a, b)
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
    return tr("{parts} differ from the merged state: m = max(m_a, m_b); l and acc are the sum of each state's, each times exp(its m - m).").format(parts=", ".join(parts))  # fmt: skip


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
    eps from the exp; each product and the sum add one eps more (counted as 3).
    """
    eps = torch.finfo(dtype).eps
    (ma, la, acca), (mb, lb, accb) = ((t.double() for t in s) for s in (a, b))
    m = torch.maximum(ma, mb)
    safe = torch.where(torch.isinf(m), 0.0, m)
    terms = [
        ((safe - mx).nan_to_num(posinf=0.0) + 3, torch.exp(mx - safe)) for mx in (ma, mb)
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


def _merge_probe(fn: Callable[..., Any], name: str, rows: tuple[int, ...], dtype: torch.dtype, size: float, seed: int) -> None:  # fmt: skip
    """Two tiles of real scores: the merge must equal the state of both tiles at once (chapter 8)."""
    g = torch.Generator().manual_seed(seed)
    xa, xb = (size * torch.randn(*rows, n, generator=g, dtype=torch.float64) for n in (5, 7))
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

    return run_check(tr("Exercise 1, merging two softmax states"), probes)


# --- exercise 2: the tiled attention forward -----------------------------------------------------


class _Watch(TorchDispatchMode):
    """Record the shape of every tensor an op makes, and which ops ran (chapter 8)."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []
        #: (size of the summed dimension, output shape) of every matrix product
        self.products: list[tuple[int, tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        name = func.overloadpacket.__name__
        if "attention" in name or "softmax" in name:  # aten's own, however reached (torch.ops)
            raise CheckFailed(tr(_ATEN_BANNED).format(name=name))
        out = func(*args, **(kwargs or {}))
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]  # fmt: skip
        self.shapes += [tuple(t.shape) for t in outs]
        if name in _PRODUCTS:
            left = args[1] if name in ("addmm", "baddbmm", "addbmm") else args[0]
            self.products += [(left.shape[-1], tuple(t.shape)) for t in outs]
        return out


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
def _calls_to(banned: dict[CodeType, str]) -> Iterator[list[str]]:
    """The names of the `banned` functions that ran inside, however they were reached (chapter 8).

    A profile function sees every Python call by its code object: an alias (``from ... import
    flash_forward as ff``), a module attribute or a function kept in a dict all end in the same
    code, which a scan of the names in the learner's code cannot follow.
    """
    seen: list[str] = []
    previous = sys.getprofile()

    def profile(frame, event, arg):  # noqa: ANN001, ANN202
        if event == "call" and frame.f_code in banned:
            seen.append(banned[frame.f_code])

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def _code(fn: Any) -> CodeType:
    """The code object of a function, a static method or a Triton kernel (chapter 8)."""
    return getattr(fn, "fn", fn).__code__


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
    that stops at the tile's last query never visits.
    """
    q, k, v = (x.detach().double() for x in (q, k, v))
    t = q.size(-2)
    s = q @ k.transpose(-2, -1) * {"unscaled": 1.0, "twice": q.size(-1) ** -1.0}.get(hide, q.size(-1) ** -0.5)  # fmt: skip
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


def _tiled_hint(got: torch.Tensor, got_lse: torch.Tensor, qkv: list[torch.Tensor], causal: bool, block: int, verdict: _Verdict) -> str:  # fmt: skip
    """Name the mistake behind a wrong output or log-sum-exp (chapter 8).

    With 16-bit inputs, a plain difference also reminds to compute the tiles in float32.
    Called only once the output or lse failed (verdict): the loose `close` below only picks
    the hint, so a near miss costs a less precise hint, never a wrong verdict.
    """
    sixteen_bit = qkv[0].dtype.itemsize < 4
    out = got.detach().double()
    close = lambda a, b: torch.allclose(a, b, rtol=1e-5, atol=1e-7, equal_nan=True)  # noqa: E731
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
            if close(out, _reference(*qkv, causal, hide, block)[0]):
                return tr(hint)
    if close(out, _reference(*qkv, causal, "unscaled")[0]):
        return tr("the scores are not scaled: multiply q @ k^T by 1 / sqrt(head_dim).")
    if close(out, _reference(*qkv, causal, "twice")[0]):
        return tr("the scores are scaled twice (by 1 / head_dim): multiply q @ k^T by 1 / sqrt(head_dim) once, either q's tile or the scores, not both.")  # fmt: skip
    if torch.isnan(out).any():
        return tr("your output has NaN: a row whose first key tile is fully hidden gives exp(-inf - (-inf)); with causal tiles of equal size this cannot happen if you mask with global positions (qs + i, ks + j).")  # fmt: skip
    if verdict.out_ok:
        return _lse_hint(got_lse, want_lse, sixteen_bit)
    late = _late_in_some_tiles(out, qkv, causal, block, verdict.wrong_rows)
    if late:
        return late
    for rescaled, hint in _RESCALE_MISTAKES.items():
        if close(out, _tiles_float64(*qkv, causal, block, rescaled)):
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
    if sixteen_bit:
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


def _lse_hint(got_lse: torch.Tensor, want_lse: torch.Tensor, sixteen_bit: bool) -> str:
    """The output is right, the log-sum-exp is not: by a constant on every row, or otherwise (chapter 8).

    With 16-bit inputs the output's own rounding hides tiles computed in 16 bits; the float32
    lse does not, so the hint says to compute the tiles in float32.
    """
    off = got_lse.detach().double() - want_lse
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
    with probe(name), _calls_to(_FORWARD_CODES) as helpers, _NoSoftmaxOrSdpa(), _Watch() as watch:
        got = fn(*qkv, causal=causal, block=block)
    expect(
        not helpers,
        _at(
            name,
            tr(
                "your code ran the chapter's {helper} (under another name), which does the "
                "exercise for you: write the tile loop."
            ).format(helper=helpers[0] if helpers else ""),
        ),
    )
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
        raise CheckFailed(_at(name, _tiled_hint(out, lse, qkv, causal, block, verdict)))
    return watch


def _score_tiles(watch: _Watch, head_dim: int) -> list[tuple[int, int]]:
    """(queries, keys) of every product of a q tile and a k tile: the ones that sum over head_dim (chapter 8).

    The probes pick a head_dim that no tile has as a length, so that P @ V (summed over keys)
    never counts as scores.
    """
    return [(out[-2], out[-1]) for summed, out in watch.products if summed == head_dim and len(out) >= 2]  # fmt: skip


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
    rows, keys = max(wrong, key=lambda s: abs(s[0] * s[1] - block * block))
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
            tiles = _score_tiles(watch, d)
            hint = _tile_size_hint(tiles, block, t, d)
            if hint:
                raise CheckFailed(_at(name, hint))
            # a T x T tensor made any other way (never one shaped like q or k^T: head_dim is a side)
            big = [s for s in watch.shapes if len(s) >= 2 and min(s[-2:]) > block and d not in s[-2:]]  # fmt: skip
            if big:
                raise CheckFailed(
                    _at(
                        name,
                        tr(
                            "you made a tensor of shape {shape}: "
                            "with tiles, no T x T scores ever exist. Compute one (block x block) tile of "
                            "scores at a time."
                        ).format(shape=max(big, key=lambda s: s[-1] * s[-2])),
                    )
                )
            n = -(-t // block)
            most = n * (n + 1) // 2 if causal else n * n
            if causal and len(tiles) > most:
                raise CheckFailed(
                    _at(
                        name,
                        tr(
                            "you computed {tiles} tiles of scores (q tile @ k tile^T); a "
                            "causal run needs at most {most} ({n} query tiles x the key tiles up "
                            "to the diagonal). Stop each query tile's loop at its last query: later keys are "
                            "all hidden, and computing them doubles the work."
                        ).format(tiles=len(tiles), most=most, n=n),
                    )
                )


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
        for causal in (True, False):
            for name, shape, dtype, block in cases:
                at = tr("{name}, causal={causal}").format(name=name, causal=causal)
                _tiled_value_probe(fn, at, shape, dtype, causal, block)
        _tiled_value_probe(fn, tr("scores of about 100, float32, causal"), (1, 2, 32, 16), torch.float32, True, 8, size=100.0)  # fmt: skip
        _work_probe(fn)

    return run_check(tr("Exercise 2, the tiled attention forward"), probes)


# --- exercise 5 (stretch): the backward as Triton kernels ----------------------------------------


class _NoTorchMatmul(TorchFunctionMode):
    """Fail when the code inside multiplies matrices in PyTorch: the exercise is Triton (chapter 8)."""

    NAMES = ("matmul", "mm", "bmm", "einsum", "__matmul__", "baddbmm", "addmm")

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if getattr(func, "__name__", "") in self.NAMES:
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
        if name in (*_PRODUCTS, "dot", "vdot", "mv", "addmv", "linear", "_softmax", "_softmax_backward_data") or "attention" in name:  # fmt: skip
            self.ran.append(name)
        return func(*args, **(kwargs or {}))


Launch = list[tuple[tuple[int, ...], np.ndarray, bool]]


@contextlib.contextmanager
def _triton_stores() -> Iterator[list[Launch]]:
    """Every address each program of each Triton launch stores to, under the interpreter (chapter 8).

    One list per launch of (program id, addresses, atomic or not): tl.store through the
    interpreter's store, tl.atomic_add and the other read-modify-writes through its atomic
    ones. tl.atomic_xchg goes through the atomic ones too but counts as a plain store: it
    only swaps in the value the program computed, so a load followed by an atomic_xchg of the
    updated value loses the other programs' updates exactly as load + tl.store does. The
    interpreter runs the programs one after another, so two programs that load, add and store
    the same place lose nothing here, but on a GPU they run at once: the addresses say what
    the values cannot.
    """
    launches: list[Launch] = []
    if triton_interpreter is None:
        yield launches
        return
    builder, grid = triton_interpreter.InterpreterBuilder, triton_interpreter.GridExecutor
    store, rmw, cas, call = builder.create_masked_store, builder.create_atomic_rmw, builder.create_atomic_cas, grid.__call__  # fmt: skip

    def record(self: Any, ptrs: Any, mask: Any, atomic: bool) -> None:
        if launches:
            where = np.ones(ptrs.data.shape, bool) if mask is None else np.broadcast_to(mask.data.astype(bool), ptrs.data.shape)  # fmt: skip
            launches[-1].append((tuple(self.grid_idx), np.asarray(ptrs.data)[where].astype(np.uint64), atomic))  # fmt: skip

    # Triton's versions add trailing arguments (3.8: cache_modifier and eviction_policy where
    # 3.1 had one cache_policy): pass on whatever follows the ones read here.
    def masked_store(self, ptrs, value, mask, *rest, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        record(self, ptrs, mask, False)
        return store(self, ptrs, value, mask, *rest, **kw)

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

    def launch(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        launches.append([])
        return call(self, *args, **kwargs)

    patches = {(builder, "create_masked_store"): masked_store, (builder, "create_atomic_rmw"): atomic_rmw,
               (builder, "create_atomic_cas"): atomic_cas, (grid, "__call__"): launch}  # fmt: skip
    try:
        for (owner, name), fn in patches.items():
            setattr(owner, name, fn)
        yield launches
    finally:
        for (owner, name), fn in zip(patches, (store, rmw, cas, call)):
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


#: Said where the check ran the kernels in Triton's interpreter (on a CPU).
_CPU_LIMITS = tr_mark(
    "on this CPU, Triton's interpreter ran your kernels one program at a time: the check read "
    "their stores for races, but it cannot check what only a GPU shows: the speed, TF32 "
    "rounding (input_precision), tile sizes that do not fit in a GPU's shared memory, and "
    "code the interpreter runs but the compiler rejects. Run the check on a GPU for those."
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

    Torch's products and attention kernels are watched at aten's level (autograd's too); under
    the interpreter, every Triton store is watched as well (_triton_stores).
    """
    g = torch.Generator().manual_seed(sum(shape))
    q, k, v, dout = (torch.randn(shape, generator=g).to(device) for _ in range(4))
    out, lse = flash_forward(q, k, v, causal)
    name = tr("shape {shape}, causal={causal}").format(shape=shape, causal=causal)
    # (the chapter's flash_backward under another name runs torch's matmul: caught by name)
    with probe(name), _triton_stores() as launches, _NoTorchMatmul(), _TorchProducts() as products, _runs_chapter_backward() as chapter:  # fmt: skip
        got = fn(q, k, v, out, lse, dout, causal)
    expect(not chapter, _at(name, tr(_CHAPTER_BACKWARD_HINT).format(helper=chapter[0] if chapter else "")))  # fmt: skip
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
    expect(isinstance(got, tuple) and len(got) == 3, _at(name, tr("return (dq, dk, dv).")))
    for part, gp in zip(("dq", "dk", "dv"), got):
        expect(isinstance(gp, torch.Tensor) and gp.shape == q.shape, _at(name, tr("{part} must be a tensor shaped like q.").format(part=part)))  # fmt: skip
    ratios = error_ratios(dict(zip(("out", "lse", "dq", "dk", "dv"), (out, lse, *got))), q, k, v, dout, causal)  # fmt: skip
    wrong = [part for part in ("dq", "dk", "dv") if not ratios[part]["ratio"] <= allowed_factor(q.dtype)]  # fmt: skip
    if wrong:
        raise CheckFailed(_at(name, _backward_hint(wrong, got, (q, k, v, dout), causal, ratios, device)))  # fmt: skip
    if device.type == "cpu":
        _expect_triton_wrote(name, launches, got)


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


def _backward_hint(wrong: list[str], got: tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...], causal: bool, ratios: dict[str, dict[str, float]], device: torch.device) -> str:  # fmt: skip
    """Name the mistake behind the first wrong gradient: a constant factor, some rows only, a 16-bit rounding (chapter 8)."""
    part = wrong[0]
    exact = kernel_results(plain_attention, *(x.double() for x in inputs), causal)[part]
    mine = got[("dq", "dk", "dv").index(part)].detach().cpu().double()
    exact = exact.cpu()
    within = allowed_factor(inputs[0].dtype) * ratios[part]["pytorch error"]
    head = tr("{part} is off by {ratio:.3g} x the error PyTorch makes in float32:").format(part=part, ratio=ratios[part]["ratio"])  # fmt: skip
    c = ((mine * exact).sum() / (exact * exact).sum()).item()
    scale = _scale_hint(part, c, inputs[0].size(-1)) if (mine - c * exact).abs().max().item() <= within else ""  # fmt: skip
    if scale:
        return head + " " + scale
    mistake = _backward_mistake(part, mine, inputs, causal, within)
    if mistake:
        return head + " " + mistake
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
    advice = tr(_GRADIENT_FORMULAS[part])
    if (mine - exact).abs().max().item() <= 2**-8 * exact.abs().max().item():
        advice = tr(
            "small, but about what a rounding to 16 bits costs: keep P, dS, D and every tl.dot "
            "input in float32 (no .to(tl.float16), no 16-bit copy of O for D). {advice}"
        ).format(advice=advice)
        if "dv" not in wrong:
            advice += " " + tr("dv is right, so P is: look at dS and D.")
    if device.type == "cuda":
        advice += " " + tr('On a GPU, tl.dot rounds float32 inputs to TF32 unless you pass input_precision="ieee".')  # fmt: skip
    return head + " " + advice


def check_triton_backward(fn: Callable[..., tuple[torch.Tensor, ...]]) -> CheckResult:
    """Exercise 5 (stretch): the attention backward as Triton kernels, equal to flash_backward's (chapter 8).

    Everywhere: dq, dk, dv against float64 within ALLOWED_FACTOR x plain PyTorch's float32
    error (helpers.attention_errors, FlashAttention's tests' rule), and no matrix
    product or attention kernel run by torch (seen at aten's level, autograd's included), nor
    the chapter's backward under any name. On a CPU, Triton's interpreter runs the kernels one
    program at a time, so a race between programs (two of them loading, adding and storing
    the same dQ rows) loses no update there: the check instead records every address each
    program stores to (the interpreter's store and atomic functions, patched) and fails when
    two programs of one launch write the same element with a plain store, or when an element
    returned was not stored by a kernel. What the CPU cannot check, and the check says so
    after a pass: speed, TF32 rounding (input_precision), tiles too large for a GPU's shared
    memory, and code the interpreter accepts but the compiler rejects. On a GPU the kernels
    are compiled, their stores cannot be watched, and only the values and torch's ops are.
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
        for causal in (False, True):
            for shape in ((1, 2, 40, 16), (2, 1, 64, 32)):
                _backward_probe(fn, shape, causal, device)

    result = run_check(title, probes)
    if result.passed and status.mode == "interpreter":
        print("   " + tr(_CPU_LIMITS))
    return result
