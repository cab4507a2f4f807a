"""Chapter 8 checkers fail typical wrong answers with their own hint (solution/stub: test_exercise_checks.py)."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.attention_triton import triton_flash_forward, triton_status
from helpers.checks import FAIL
from helpers.checks.ch08 import (
    SKIP,
    check_merge_states,
    check_tiled_attention,
    check_triton_backward,
)
from helpers.flash_attention import flash_attention, flash_backward, flash_forward

from nbfiles import exercise_namespace

SOLUTIONS = "solutions/08_build_it_solutions.ipynb"


@pytest.fixture(scope="module")
def solutions() -> dict:
    return exercise_namespace(SOLUTIONS)


def fails(result, *words: str) -> bool:
    return result.status == FAIL and all(w in result.message for w in words)


# --- exercise 1: merging two softmax states -------------------------------------------------------


def merge(a, b, *, rescale_l=True, rescale_acc=True, pick=torch.maximum, flip=False, safe=True, divide=False):  # fmt: skip
    """A merge with one knob turned the wrong way."""
    (ma, la, acca), (mb, lb, accb) = a, b
    m = pick(ma, mb)
    ms = torch.where(torch.isinf(m), torch.zeros_like(m), m) if safe else m
    sa, sb = (torch.exp(ms - ma), torch.exp(ms - mb)) if flip else (torch.exp(ma - ms), torch.exp(mb - ms))  # fmt: skip
    ell = la * sa + lb * sb if rescale_l else la + lb
    acc = acca * sa[..., None] + accb * sb[..., None] if rescale_acc else acca + accb
    return m, ell, (acc / ell[..., None] if divide else acc)


def merge_without_the_max(a, b):
    (ma, la, acca), (mb, lb, accb) = a, b
    m = torch.maximum(ma, mb)
    total = torch.exp(ma) * la + torch.exp(mb) * lb  # overflows for large scores
    acc = torch.exp(ma)[..., None] * acca + torch.exp(mb)[..., None] * accb
    return m, total / torch.exp(m), acc / torch.exp(m)[..., None]


def merge_in_place(a, b):
    m, ell, acc = merge(a, b)
    a[1].mul_(1.0)  # touches the caller's tensor
    a[1].add_(1.0)
    return m, ell, acc


MERGE_MISTAKES = [
    (lambda a, b: merge(a, b, rescale_l=False), "rescale both to the common max m first"),
    (lambda a, b: merge(a, b, rescale_acc=False), "acc was accumulated against the same max"),
    (
        lambda a, b: merge(a, b, rescale_l=False, rescale_acc=False),
        "you added the sums and the accumulators",
    ),
    (lambda a, b: merge(a, b, pick=torch.minimum), "the common max is the larger"),
    (lambda a, b: merge(a, b, flip=True), "upside down"),
    (lambda a, b: merge(a, b, divide=True), "keep acc unnormalised"),
    (lambda a, b: merge(a, b, safe=False), "you got NaN"),
    (merge_without_the_max, "exp overflows"),
    (merge_in_place, "in place"),
    (lambda a, b: list(merge(a, b)), "return a tuple of three tensors"),
    (lambda a, b: tuple(t.double() for t in merge(a, b)), "keep it"),
    (lambda a, b: (a[0], a[1], a[2]), "differ from the merged state"),
]


@pytest.mark.parametrize(("wrong", "hint"), MERGE_MISTAKES)
def test_wrong_merges_fail_with_their_hint(wrong, hint: str) -> None:
    result = check_merge_states(wrong)
    assert fails(result, hint), result.message


def test_merge_in_another_correct_style_passes() -> None:
    def with_logaddexp(a, b):
        (ma, la, acca), (mb, lb, accb) = a, b
        m = torch.maximum(ma, mb)
        wa = torch.where(ma == -math.inf, torch.zeros_like(ma), torch.exp(ma - m.clamp(min=-1e30)))  # fmt: skip
        wb = torch.where(mb == -math.inf, torch.zeros_like(mb), torch.exp(mb - m.clamp(min=-1e30)))  # fmt: skip
        return m, la * wa + lb * wb, acca * wa.unsqueeze(-1) + accb * wb.unsqueeze(-1)

    assert check_merge_states(with_logaddexp).passed


# --- exercise 2: the tiled attention forward ------------------------------------------------------


def tiled(q, k, v, causal=False, block=16, *, hide="future", local=False, rescale=True, subtract_max=True,
          scale=True, lse="right", skip=True, work=torch.float32, cast=True, in_place=False):  # fmt: skip
    """A tiled forward with one knob turned the wrong way."""
    t = q.size(-2)
    work = torch.promote_types(q.dtype, work)
    if in_place:
        q.mul_(1.0)
    factor = 1 / math.sqrt(q.size(-1)) if scale else 1.0
    outs, lses = [], []
    for qs in range(0, t, block):
        qi = q[..., qs : qs + block, :].to(work) * factor
        rows = torch.arange(qi.size(-2))[:, None] + (0 if local else qs)
        m = torch.full(qi.shape[:-1], -math.inf, dtype=work)
        ell, acc = torch.zeros_like(m), torch.zeros_like(qi)
        for ks in range(0, min(t, qs + block) if (causal and skip) else t, block):
            kj, vj = k[..., ks : ks + block, :].to(work), v[..., ks : ks + block, :].to(work)
            s = qi @ kj.transpose(-2, -1)
            if causal:
                keys = torch.arange(kj.size(-2))[None, :] + (0 if local else ks)
                hidden = {"future": keys > rows, "diagonal": keys >= rows, "late": keys > rows + 1}[hide]  # fmt: skip
                s = s.masked_fill(hidden, -math.inf)
            m_new = torch.maximum(m, s.amax(-1)) if subtract_max else torch.zeros_like(m)
            p = torch.exp(s - m_new[..., None])
            r = torch.exp(m - m_new) if subtract_max else torch.ones_like(m)
            ell = ell * r + p.sum(-1)
            acc = (acc * r[..., None] if rescale else acc) + p @ vj
            m = m_new
        outs.append((acc / ell[..., None]).to(q.dtype if cast else work))
        lses.append({"right": m + torch.log(ell), "max": m, "log l": torch.log(ell)}[lse])
    return torch.cat(outs, -2), torch.cat(lses, -1)


def in_bf16(q, k, v, causal=False, block=16):
    out, lse = tiled(q, k, v, causal, block, work=torch.bfloat16)
    return out, lse.float() if lse.dtype == torch.bfloat16 else lse  # tiles still in bf16


def with_a_nan(q, k, v, causal=False, block=16):
    out, lse = tiled(q, k, v, causal, block)
    out = out.clone()
    out[..., -1, 0] = math.nan
    return out, lse


def full_scores_first(q, k, v, causal=False, block=16):
    s = q @ k.transpose(-2, -1)  # the whole T x T, then tiles of it
    del s
    return tiled(q, k, v, causal, block)


def with_softmax(q, k, v, causal=False, block=16):
    torch.softmax(q[..., :1, :1], dim=-1)
    return tiled(q, k, v, causal, block)


def calls_the_helper(q, k, v, causal=False, block=16):
    return flash_forward(q, k, v, causal, block, block)


def calls_flash_attention(q, k, v, causal=False, block=16):
    return flash_attention(q, k, v, causal), None  # refused by name before it runs


def calls_the_triton_forward(q, k, v, causal=False, block=16):
    return triton_flash_forward(q, k, v, causal)


def lse_in(dtype):
    """A right forward whose log-sum-exp comes back in `dtype`."""

    def forward(q, k, v, causal=False, block=16):
        out, lse = tiled(q, k, v, causal, block)
        return out, lse.to(dtype)

    return forward


TILED_MISTAKES = [
    (lambda q, k, v, causal=False, block=16: tiled(q, k, v, False, block), "it is not causal"),
    (
        lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block, hide="diagonal"),
        "hid the diagonal",
    ),
    (
        lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block, hide="late"),
        "one position late",
    ),
    (
        lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block, local=True),
        "global positions",
    ),
    (
        lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block, rescale=False),
        "scale the old l and acc",
    ),
    (
        lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block, subtract_max=False),
        "subtract the running max",
    ),
    (
        lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block, scale=False),
        "not scaled",
    ),
    (
        lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block, lse="max"),
        "log-sum-exp is not",
    ),
    (
        lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block, lse="log l"),
        "m + log(l)",
    ),
    (
        lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block, skip=False),
        "Stop each query tile's loop",
    ),
    (
        lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block, cast=False),
        "cast back",
    ),
    (
        in_bf16,
        "compute each tile in float32",
    ),
    (
        lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block, in_place=True),
        "in place",
    ),
    (full_scores_first, "no T x T scores ever exist"),
    (with_a_nan, "your output has NaN"),
    (with_softmax, "you called softmax", "not even on one tile"),
    (calls_the_helper, "you called flash_forward"),
    (calls_flash_attention, "you called flash_attention"),
    (calls_the_triton_forward, "you called triton_flash_forward"),
    # float64 inputs: float32 would fail the lse bound, which is float64's rounding
    (lse_in(torch.float32), "lse is torch.float32 for torch.float64", "float64 for float64"),
    (lse_in(torch.float64), "lse is torch.float64 for torch.float32", "here torch.float32"),
    (
        lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block)[0],
        "return (out, lse)",
    ),
]


@pytest.mark.parametrize(("wrong", "hint"), [(m[0], m[1:]) for m in TILED_MISTAKES])
def test_wrong_tiled_forwards_fail_with_their_hint(wrong, hint: tuple[str, ...]) -> None:
    result = check_tiled_attention(wrong)
    assert fails(result, *hint), result.message


def test_the_mistakes_pass_when_fixed() -> None:
    assert check_tiled_attention(lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block)).passed  # fmt: skip


# --- exercise 5 (stretch): the backward in Triton ----------------------------------------------

RUNS = triton_status("cuda" if torch.cuda.is_available() else "cpu").runs


@pytest.mark.skipif(not RUNS, reason="Triton cannot run here (not installed, or no interpreter)")
@pytest.mark.parametrize(("part", "hint"), [(0, "dq is off"), (1, "dk is off"), (2, "dv is off")])
def test_a_wrong_gradient_gets_its_hint(solutions, part: int, hint: str) -> None:
    right = solutions["triton_flash_backward"]

    def wrong(*args):
        grads = list(right(*args))
        grads[part] = grads[part] * 1.01
        return tuple(grads)

    result = check_triton_backward(wrong)
    assert fails(result, hint), result.message


@pytest.mark.skipif(not RUNS, reason="Triton cannot run here (not installed, or no interpreter)")
def test_the_backward_must_be_triton() -> None:
    def in_pytorch(q, k, v, out, lse, dout, causal=False):
        return flash_backward(q, k, v, out, lse, dout, causal)

    def with_torch_products(q, k, v, out, lse, dout, causal=False):
        return q @ k.transpose(-2, -1), k, v

    assert fails(check_triton_backward(in_pytorch), "you called flash_backward", "Triton kernels")
    assert fails(check_triton_backward(with_torch_products), "you called torch's matmul")
    assert fails(check_triton_backward(lambda *args: None), "return (dq, dk, dv)")


def test_the_stretch_check_says_why_it_cannot_run(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from helpers.attention_triton import TritonStatus
    from helpers.checks import ch08

    monkeypatch.setattr(ch08, "triton_status", lambda d: TritonStatus(False, "unavailable", "no triton for Darwin"))  # fmt: skip
    result = check_triton_backward(lambda *args: None)
    assert result.status == SKIP and "no triton for Darwin" in capsys.readouterr().out
