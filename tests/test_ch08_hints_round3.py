"""Issue 31, chapter 8, third round: the grader's wrong answers refused with a vague hint now get
the hint of their mistake, and its correct alternatives still pass (/tmp/grader/REPORT.md).

Exercise 1: acc's factors unsqueezed on dim 1, factors computed in 16 bits. Exercise 5: P built
with tl.exp2 against a natural-log lse, the diagonal tile left out of a causal loop. The store
watch: a load followed by tl.atomic_xchg is a read-modify-write race like a plain store.
"""

from __future__ import annotations

import re

import pytest
import torch
from test_exercises_ch08 import RUNS, fails, solution_variant

from helpers.checks import FAIL, ch08
from helpers.checks.ch08 import check_merge_states, check_triton_backward

CJK = re.compile(r"[\u4e00-\u9fff]")
INTERPRETER = RUNS and not torch.cuda.is_available()

# --- exercise 1: merging two softmax states --------------------------------------------------------


def merge_unsqueezed_on_dim_1(a, b):
    """The grader's W_unsqueeze_1: right for 1-D rows only."""
    (ma, la, acca), (mb, lb, accb) = a, b
    m = torch.maximum(ma, mb)
    ms = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    sa, sb = torch.exp(ma - ms), torch.exp(mb - ms)
    return m, la * sa + lb * sb, acca * sa.unsqueeze(1) + accb * sb.unsqueeze(1)


def merge_with_factors_in(dtype: torch.dtype):
    """The grader's W_half_factors ("they are <= 1 anyway"), in any dtype."""

    def merge(a, b):
        (ma, la, acca), (mb, lb, accb) = a, b
        m = torch.maximum(ma, mb)
        ms = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        sa, sb = (torch.exp((x - ms).to(dtype)).to(x.dtype) for x in (ma, mb))
        return m, la * sa + lb * sb, acca * sa[..., None] + accb * sb[..., None]

    return merge


def merge_in_log_domain(a, b):
    (ma, la, acca), (mb, lb, accb) = a, b
    m = torch.maximum(ma, mb)
    ms = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    sa, sb = torch.exp(ma - ms), torch.exp(mb - ms)
    ell = torch.exp(torch.log(la) + ma - ms) + torch.exp(torch.log(lb) + mb - ms)
    return m, ell, acca * sa[..., None] + accb * sb[..., None]


def merge_where_neginf(a, b):
    (ma, la, acca), (mb, lb, accb) = a, b
    m = torch.maximum(ma, mb)
    sa = torch.where(torch.isneginf(ma), 0.0, torch.exp(ma - m))
    sb = torch.where(torch.isneginf(mb), 0.0, torch.exp(mb - m))
    return m, la * sa + lb * sb, acca * sa[..., None] + accb * sb[..., None]


def merge_larger_gets_one(a, b):
    (ma, la, acca), (mb, lb, accb) = a, b
    m = torch.maximum(ma, mb)
    small = torch.where(torch.isinf(m), torch.zeros_like(m), torch.exp(torch.minimum(ma, mb) - m))
    a_big = ma >= mb
    sa = torch.where(a_big, torch.ones_like(m), small)
    sb = torch.where(a_big, small, torch.ones_like(m))
    return m, la * sa + lb * sb, acca * sa[..., None] + accb * sb[..., None]


def merge_masked_fill_l_zero(a, b):
    (ma, la, acca), (mb, lb, accb) = a, b
    m = torch.maximum(ma, mb)
    sa = torch.exp(ma - m).masked_fill(la == 0, 0.0)
    sb = torch.exp(mb - m).masked_fill(lb == 0, 0.0)
    return m, la * sa + lb * sb, acca * sa[..., None] + accb * sb[..., None]


def test_factors_unsqueezed_on_dim_1_are_told_to_broadcast_over_the_last_dimension() -> None:
    """Before: 'acc differ from the merged state', no word of the broadcast."""
    result = check_merge_states(merge_unsqueezed_on_dim_1)
    assert fails(
        result,
        "rows shaped (2, 3)",
        "m and l are right but acc is not",
        "over acc's last dimension, factor[..., None]",
        "unsqueeze(1) is the same only for 1-D rows",
    ), result.message


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_factors_in_16_bits_are_named(dtype: torch.dtype) -> None:
    """Before: 'l, acc differ from the merged state', no word of the 16-bit rounding."""
    result = check_merge_states(merge_with_factors_in(dtype))
    assert fails(result, "l and acc are off by up to", "a rounding to 16 bits", "no .half() or .bfloat16()"), result.message  # fmt: skip


def test_factors_in_float32_for_float64_inputs_are_not_called_16_bit() -> None:
    """A float32 rounding is far below the 16-bit band: the generic hint, not a wrong one."""
    result = check_merge_states(merge_with_factors_in(torch.float32))
    assert result.status == FAIL and "16 bits" not in result.message, result.message


@pytest.mark.parametrize(
    "right",
    [merge_in_log_domain, merge_where_neginf, merge_larger_gets_one, merge_masked_fill_l_zero],
)
def test_the_graders_correct_merges_still_pass(right) -> None:  # noqa: ANN001
    result = check_merge_states(right)
    assert result.passed, result.message


# --- exercise 5: the backward in Triton -----------------------------------------------------------

EXP = "tl.exp(s - lse[:, None])"
#: P in base 2 against the natural-log lse (the grader's W_exp2)
EXP2 = [(EXP, "tl.exp2(s - lse[:, None])")]
#: the scores moved to base 2, the lse not
EXP2_SCORES_ONLY = [(EXP, "tl.exp2(s * 1.4426950408889634 - lse[:, None])")]
#: base 2 done right: both moved, a correct alternative
EXP2_RIGHT = [(EXP, "tl.exp2((s - lse[:, None]) * 1.4426950408889634)")]
#: the causal dQ loop stops before its diagonal key tile (the grader's W_dq_causal_no_diag)
DQ_WITHOUT_DIAGONAL = [
    (
        "end = tl.minimum((tile + 1) * BLOCK, seq_len)",
        "end = tl.minimum(tile * BLOCK, seq_len)",
    )
]
#: the causal dK/dV loop starts after its diagonal query tile
DK_WITHOUT_DIAGONAL = [("first = tile * BLOCK", "first = (tile + 1) * BLOCK")]


@pytest.mark.skipif(not RUNS, reason="Triton cannot run here (not installed, or no interpreter)")
@pytest.mark.parametrize(
    ("replacements", "hints"),
    [
        (EXP2, ("dq is off", "P = 2^(s - lse)", "tl.exp2(x) is 2 to the x", "log2(e)")),
        (EXP2_SCORES_ONLY, ("dq is off", "P = 2^(s * log2(e) - lse)", "not the lse")),
        (
            DQ_WITHOUT_DIAGONAL,
            (
                "causal=True",
                "dq is off",
                "same tile of 16",
                "the diagonal tiles",
                "(tile + 1) * BLOCK",
            ),
        ),
        (
            DK_WITHOUT_DIAGONAL,
            (
                "causal=True",
                "dk is off",
                "same tile of 16",
                "dK and dV kernel",
                "start = tile * BLOCK",
            ),
        ),
    ],
    ids=["exp2", "exp2 of the scores only", "dq without its diagonal", "dk without its diagonal"],
)
def test_the_graders_triton_backwards_name_exp2_and_the_diagonal_tile(replacements, hints) -> None:  # noqa: ANN001
    """Before: the generic 'dQ = dS K / sqrt(d), dS = P * (dO V^T - D)' for all four."""
    result = check_triton_backward(solution_variant("round3", replacements))
    assert fails(result, *hints), result.message


@pytest.mark.skipif(not RUNS, reason="Triton cannot run here (not installed, or no interpreter)")
def test_exp2_with_log2e_on_the_whole_difference_passes() -> None:
    result = check_triton_backward(solution_variant("exp2 right", EXP2_RIGHT))
    assert result.passed, result.message


# --- the store watch: tl.atomic_xchg is a store ----------------------------------------------------


if RUNS:  # module level: the interpreter rereads a kernel's source from its file
    import triton
    import triton.language as tl

    @triton.jit
    def load_then_xchg(x_ptr):
        offs = tl.arange(0, 4)
        tl.atomic_xchg(x_ptr + offs, tl.load(x_ptr + offs) + 1)

    @triton.jit
    def atomic_add(x_ptr):
        tl.atomic_add(x_ptr + tl.arange(0, 4), 1)


@pytest.mark.skipif(not INTERPRETER, reason="the store watch needs Triton's interpreter")
def test_a_load_then_atomic_xchg_counts_as_a_plain_store() -> None:
    """Before: recorded as atomic, so the lost update of load + atomic_xchg was never a race.

    On int32 data: Triton 3.9's interpreter refuses a float32 tl.atomic_xchg ('Unsupported
    data type', which the GPU compiler accepts), so a float32 dQ kernel written so fails on
    the interpreter's error on a CPU; the classification itself is what is tested here.
    """
    x = torch.zeros(4, dtype=torch.int32)
    with ch08._triton_stores() as launches:
        load_then_xchg[(3,)](x)
        atomic_add[(3,)](x)
    xchg, add = launches
    assert [atomic for _, _, atomic in xchg] == [False] * 3
    assert sorted(ch08._raced(xchg).tolist()) == ch08._addresses(x).tolist()
    assert [atomic for _, _, atomic in add] == [True] * 3 and ch08._raced(add).size == 0


@pytest.mark.skipif(not RUNS, reason="Triton cannot run here (not installed, or no interpreter)")
def test_the_store_recorder_tells_an_exchange_from_an_accumulation(monkeypatch) -> None:  # noqa: ANN001
    """Unit level, whatever the data type: the op the builder is given decides (XCHG: a store)."""
    from triton._C.libtriton import ir

    builder = ch08.triton_interpreter.InterpreterBuilder
    monkeypatch.setattr(builder, "create_atomic_rmw", lambda self, *a: None)
    fake = type("Builder", (), {"grid_idx": (0, 0, 0)})()
    ptrs = type("Handle", (), {"data": ch08.np.arange(4, dtype=ch08.np.uint64)})()
    with ch08._triton_stores() as launches:
        launches.append([])
        for op in (ir.ATOMIC_OP.XCHG, ir.ATOMIC_OP.ADD, ir.ATOMIC_OP.FADD, ir.ATOMIC_OP.MAX):
            builder.create_atomic_rmw(fake, op, ptrs, None, None, "sem", "scope")
    assert [atomic for _, _, atomic in launches[0]] == [False, True, True, True]


# --- the new hints in Chinese ----------------------------------------------------------------------


@pytest.mark.usefixtures("chinese")
@pytest.mark.parametrize(
    ("wrong", "kept", "english"),
    [
        (
            merge_unsqueezed_on_dim_1,
            ("(2, 3)", "factor[..., None]", "unsqueeze(1)"),
            "acc is not",
        ),  # fmt: skip
        (merge_with_factors_in(torch.float16), (".half()", "exp(m_a - m)"), "16 bits"),
    ],
    ids=["unsqueeze(1)", "16-bit factors"],
)
def test_the_new_merge_hints_speak_chinese(wrong, kept, english) -> None:  # noqa: ANN001
    result = check_merge_states(wrong)
    hint = result.message.split("]", 1)[1]  # the probe's name is Chinese already
    assert result.status == FAIL and CJK.search(hint), result.message
    assert all(k in hint for k in kept) and english not in hint, result.message


@pytest.mark.skipif(not RUNS, reason="Triton cannot run here (not installed, or no interpreter)")
@pytest.mark.usefixtures("chinese")
def test_the_diagonal_tile_hint_speaks_chinese() -> None:
    result = check_triton_backward(solution_variant("round3 zh", DQ_WITHOUT_DIAGONAL))
    assert result.status == FAIL and CJK.search(result.message), result.message
    assert "(tile + 1) * BLOCK" in result.message and "it is what" not in result.message
