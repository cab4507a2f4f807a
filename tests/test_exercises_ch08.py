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
        "you rescaled l but not acc",
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


# --- issue 31: wrong answers the checks used to accept, right ones they used to refuse ----------


def merge_deciding_for_the_whole_tensor(a, b):
    """Empty states handled for the whole tensor at once: right only when every row is empty."""
    (ma, la, acca), (mb, lb, accb) = a, b
    if torch.isinf(ma).all():
        return mb, lb, accb
    if torch.isinf(mb).all():
        return ma, la, acca
    return merge(a, b, safe=False)


def merge_with_one_safe_max(a, b):
    """One safe max for the whole tensor: 0 as soon as any row is empty."""
    (ma, la, acca), (mb, lb, accb) = a, b
    m = torch.maximum(ma, mb)
    ms = torch.zeros_like(m) if torch.isinf(m).any() else m
    sa, sb = torch.exp(ma - ms), torch.exp(mb - ms)
    return m, la * sa + lb * sb, acca * sa[..., None] + accb * sb[..., None]


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (merge_deciding_for_the_whole_tensor, "choose the safe max row by row"),
        (merge_with_one_safe_max, "every row needs its own safe max"),
    ],
)
def test_rows_empty_beside_real_rows_are_probed(wrong, hint: str) -> None:
    """Accepted before issue 31 (the empty probe only had states empty in every row)."""
    result = check_merge_states(wrong)
    assert fails(result, "[probe: rows empty in a, in b, in both and in neither", hint), result.message  # fmt: skip


def test_a_merge_that_zeroes_the_nan_of_empty_rows_passes() -> None:
    def with_nan_to_num(a, b):
        (ma, la, acca), (mb, lb, accb) = a, b
        m = torch.maximum(ma, mb)
        sa, sb = (torch.nan_to_num(torch.exp(x - m), nan=0.0) for x in (ma, mb))
        return m, la * sa + lb * sb, acca * sa[..., None] + accb * sb[..., None]

    assert check_merge_states(with_nan_to_num).passed


def tiled_by(q, k, v, causal=False, block=16, *, rows=None, keys=None, m0=-math.inf):
    """The right math in tiles of `rows` queries and `keys` keys (None: all of them at once)."""
    t, work = q.size(-2), torch.promote_types(q.dtype, torch.float32)
    rows, keys = rows or t, keys or t
    outs, lses = [], []
    for qs in range(0, t, rows):
        qi = q[..., qs : qs + rows, :].to(work) / math.sqrt(q.size(-1))
        at = torch.arange(qs, qs + qi.size(-2))[:, None]
        m = torch.full(qi.shape[:-1], m0, dtype=work)
        ell, acc = torch.zeros_like(m), torch.zeros_like(qi)
        for ks in range(0, min(t, qs + qi.size(-2)) if causal else t, keys):
            s = qi @ k[..., ks : ks + keys, :].to(work).transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(ks, ks + s.size(-1))[None, :] > at, -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            p, r = torch.exp(s - m_new[..., None]), torch.exp(m - m_new)
            ell = ell * r + p.sum(-1)
            acc = acc * r[..., None] + p @ v[..., ks : ks + keys, :].to(work)
            m = m_new
        outs.append((acc / ell[..., None]).to(q.dtype))
        lses.append(m + torch.log(ell))
    return torch.cat(outs, -2), torch.cat(lses, -1)


HELPERS_IN_A_DICT = {"forward": flash_forward}
aliased_forward = (
    flash_forward  # what `from helpers.flash_attention import flash_forward as f` makes
)


def tiled_with_an_alias(q, k, v, causal=False, block=16):
    return aliased_forward(q, k, v, causal, block, block)


def tiled_through_a_dict(q, k, v, causal=False, block=16):
    return HELPERS_IN_A_DICT["forward"](q, k, v, causal, block, block)


@pytest.mark.parametrize(
    ("wrong", "hints"),
    [
        (
            lambda q, k, v, causal=False, block=16: tiled_by(q, k, v, causal, block, keys=block),
            ("64 x 16 scores", "Tile the queries too"),
        ),  # fmt: skip
        (
            lambda q, k, v, causal=False, block=16: tiled_by(q, k, v, causal, block, rows=block),
            ("16 x 64 scores", "Tile the keys too"),
        ),  # fmt: skip
        (
            lambda q, k, v, causal=False, block=16: tiled_by(q, k, v, causal, 16, rows=16, keys=16),
            ("blocks of 8", "tiles of 16 x 16 scores, but block=8"),
        ),  # fmt: skip
        (tiled_with_an_alias, ("ran the chapter's flash_forward (under another name)",)),
        (tiled_through_a_dict, ("ran the chapter's flash_forward (under another name)",)),
        (
            lambda q, k, v, causal=False, block=16: tiled_by(
                q, k, v, causal, block, rows=block, keys=block, m0=0.0
            ),
            ("underflowed", "Start the running max at -inf"),
        ),  # fmt: skip
    ],
)
def test_tiling_and_the_helpers_are_checked_at_any_block(wrong, hints: tuple[str, ...]) -> None:
    """Accepted before issue 31 (but the last, told it overflowed where it underflowed)."""
    result = check_tiled_attention(wrong)
    assert fails(result, *hints), result.message


def test_a_forward_with_einsum_and_inputs_converted_whole_passes() -> None:
    def with_einsum(q, k, v, causal=False, block=16):
        t, work = q.size(-2), torch.promote_types(q.dtype, torch.float32)
        qw, kw, vw = (x.to(work) for x in (q, k, v))  # whole (T, head_dim) copies: not scores
        qw = qw / math.sqrt(q.size(-1))
        outs, lses = [], []
        for qs in range(0, t, block):
            qi = qw[..., qs : qs + block, :]
            m = torch.full(qi.shape[:-1], -math.inf, dtype=work)
            ell, acc = torch.zeros_like(m), torch.zeros_like(qi)
            for ks in range(0, min(t, qs + block) if causal else t, block):
                s = torch.einsum("bhqd,bhkd->bhqk", qi, kw[..., ks : ks + block, :])
                if causal:
                    later = torch.arange(ks, ks + s.size(-1))[None, :] > torch.arange(qs, qs + s.size(-2))[:, None]  # fmt: skip
                    s = s.masked_fill(later, -math.inf)
                m_new = torch.maximum(m, s.amax(-1))
                p, r = torch.exp(s - m_new[..., None]), torch.exp(m - m_new)
                ell = ell * r + p.sum(-1)
                acc = acc * r[..., None] + torch.einsum("bhqk,bhkd->bhqd", p, vw[..., ks : ks + block, :])  # fmt: skip
                m = m_new
            outs.append((acc / ell[..., None]).to(q.dtype))
            lses.append(m + torch.log(ell))
        return torch.cat(outs, -2), torch.cat(lses, -1)

    result = check_tiled_attention(with_einsum)
    assert result.passed, result.message


def solution_variant(name: str, replacements: list[tuple[str, str]]):
    """The solution's triton_flash_backward with its source edited: a kernel that races, or adds atomically."""
    import json

    cell = next(
        "".join(c["source"])
        for c in json.loads(open(SOLUTIONS, encoding="utf-8").read())["cells"]
        if "def triton_flash_backward" in "".join(c["source"])
    )
    for old, new in replacements:
        assert old in cell, old
        cell = cell.replace(old, new)
    namespace: dict = {}
    exec(compile(cell, f"<{name}>", "exec"), namespace)  # noqa: S102 - the course's own solution
    return namespace["triton_flash_backward"]


#: dQ from the dK/dV kernel: every key tile's program loads, adds and stores the same dQ rows
DQ_FROM_EVERY_KEY_TILE = [
    ("dk_ptr, dv_ptr, seq_len", "dk_ptr, dv_ptr, dq_ptr, seq_len"),
    (
        '            dk += tl.dot(tl.trans(ds), q, input_precision="ieee")\n',
        '            dk += tl.dot(tl.trans(ds), q, input_precision="ieee")\n'
        '            part = tl.dot(ds, k, input_precision="ieee") * scale\n'
        "            old = tl.load(dq_ptr + qo, mask=rows[:, None] < seq_len, other=0.0)\n"
        "            tl.store(dq_ptr + qo, old + part, mask=rows[:, None] < seq_len)\n",
    ),
    ("dq, dk, dv = torch.empty_like(q)", "dq, dk, dv = torch.zeros_like(q)"),
    (
        "dk_dv_kernel[grid](q, k, v, dout, lse, delta, dk, dv, *args, **meta)\n"
        "    dq_kernel[grid](q, k, v, dout, lse, delta, dq, *args, **meta)",
        "dk_dv_kernel[grid](q, k, v, dout, lse, delta, dk, dv, dq, *args, **meta)",
    ),
]
DQ_ADDED_ATOMICALLY = [
    *DQ_FROM_EVERY_KEY_TILE[:1],
    (
        DQ_FROM_EVERY_KEY_TILE[1][0],
        DQ_FROM_EVERY_KEY_TILE[1][0]
        + '            part = tl.dot(ds, k, input_precision="ieee") * scale\n'
        "            tl.atomic_add(dq_ptr + qo, part, mask=rows[:, None] < seq_len)\n",
    ),
    *DQ_FROM_EVERY_KEY_TILE[2:],
]


@pytest.mark.skipif(not RUNS, reason="Triton cannot run here (not installed, or no interpreter)")
def test_the_backward_must_run_in_triton_whatever_torch_calls_it() -> None:
    """SDPA differentiated by torch.autograd.grad: no Triton at all, accepted before issue 31."""

    def sdpa_and_autograd(q, k, v, out, lse, dout, causal=False):
        q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return torch.autograd.grad(o, (q, k, v), dout)

    result = check_triton_backward(sdpa_and_autograd)
    assert fails(result, "torch ran _scaled_dot_product", "torch.autograd.grad"), result.message


@pytest.mark.skipif(
    not RUNS or torch.cuda.is_available(), reason="the store watch needs Triton's interpreter"
)
def test_programs_that_race_on_dq_fail_and_atomic_adds_pass(capsys) -> None:  # noqa: ANN001
    """Two programs storing the same dQ rows: right values in the interpreter, accepted before issue 31."""
    racing = solution_variant("racing", DQ_FROM_EVERY_KEY_TILE)
    result = check_triton_backward(racing)
    assert fails(result, "elements of dq were written by more than one program", "one after another"), result.message  # fmt: skip
    atomic = check_triton_backward(solution_variant("atomic", DQ_ADDED_ATOMICALLY))
    assert atomic.passed, atomic.message
    assert "cannot check what only a GPU shows" in capsys.readouterr().out


@pytest.mark.skipif(not RUNS, reason="Triton cannot run here (not installed, or no interpreter)")
def test_the_store_recorder_passes_on_every_triton_versions_arguments(monkeypatch) -> None:  # noqa: ANN001
    """Triton 3.8's create_masked_store takes 5 arguments after self, 3.1's 4: both pass through."""
    from helpers.checks import ch08 as checks

    builder = checks.triton_interpreter.InterpreterBuilder
    seen = []
    monkeypatch.setattr(builder, "create_masked_store", lambda self, *a: seen.append(a))
    monkeypatch.setattr(builder, "create_atomic_rmw", lambda self, *a: seen.append(a))
    with checks._triton_stores():
        builder.create_masked_store(None, "ptrs", "value", "mask", "cache", "eviction")
        builder.create_masked_store(None, "ptrs", "value", "mask", "cache_policy")
        builder.create_atomic_rmw(None, "op", "ptr", "val", "mask", "sem", "scope")
    assert seen == [
        ("ptrs", "value", "mask", "cache", "eviction"),
        ("ptrs", "value", "mask", "cache_policy"),
        ("op", "ptr", "val", "mask", "sem", "scope"),
    ]


# --- issue 31, item 4: the planted-bug gallery's kinds, against the checkers' new rule ------------
# (helpers.attention_errors: a kernel's error against float64 at most ALLOWED_FACTOR x plain
# PyTorch's error in the same dtype; float64 probes keep float64's rounding bound)


def tiled_with(q, k, v, causal=False, block=16, *, p16=False, lse_off=0.0, late_tile=0):
    """The tiled forward with one of the gallery's bugs, where it does its work in float32 (an fp32 kernel's bug)."""
    t, work = q.size(-2), torch.promote_types(q.dtype, torch.float32)
    in_fp32 = work == torch.float32
    outs, lses = [], []
    for qs in range(0, t, block):
        qi = q[..., qs : qs + block, :].to(work) / math.sqrt(q.size(-1))
        rows = torch.arange(qs, qs + qi.size(-2))[:, None]
        m = torch.full(qi.shape[:-1], -math.inf, dtype=work)
        ell, acc = torch.zeros_like(m), torch.zeros_like(qi)
        for ks in range(0, min(t, qs + block) if causal else t, block):
            kj, vj = k[..., ks : ks + block, :].to(work), v[..., ks : ks + block, :].to(work)
            s = qi @ kj.transpose(-2, -1)
            if causal:  # late_tile: one position late in that query tile only (1 = the second)
                keys = torch.arange(ks, ks + kj.size(-2))[None, :]
                s = s.masked_fill(
                    keys > rows + int(late_tile and qs == late_tile * block), -math.inf
                )
            m_new = torch.maximum(m, s.amax(-1))
            p, r = torch.exp(s - m_new[..., None]), torch.exp(m - m_new)
            ell = ell * r + p.sum(-1)
            acc = acc * r[..., None] + (p.half().to(work) if p16 and in_fp32 else p) @ vj
            m = m_new
        outs.append((acc / ell[..., None]).to(q.dtype))
        lses.append(m + torch.log(ell) + (lse_off if in_fp32 else 0.0))
    return torch.cat(outs, -2), torch.cat(lses, -1)


TILED_GALLERY = [
    ({"p16": True}, ("float32, T = 64", "about what a rounding to 16 bits costs", "no .half()")),
    ({"lse_off": 1e-4}, ("float32, T = 64", "+0.0001 from m + log(l) on every row")),
    ({"late_tile": 1}, ("query tile(s) 2", "one position late", "other tiles are right")),
]


@pytest.mark.parametrize(("bug", "hint"), TILED_GALLERY, ids=lambda x: str(x)[:20])
def test_the_gallerys_bugs_in_a_tiled_forward_fail_with_their_hint(bug, hint) -> None:
    """Refused before too, but with 'your output differs from softmax(...) by up to 0.000221' (P
    in fp16), by up to 4.08e-07 (the lse off by 1e-4: the output was right) and by up to 0.333
    (the late mask): the hint never named the mistake."""
    result = check_tiled_attention(lambda q, k, v, causal=False, block=16: tiled_with(q, k, v, causal, block, **bug))  # fmt: skip
    assert fails(result, *hint), result.message


def test_a_missing_rescale_of_acc_alone_is_named() -> None:
    """The gallery's 'no rescale of acc in the merge': the old hint said 'scale the old l and acc'."""
    result = check_tiled_attention(lambda q, k, v, causal=False, block=16: tiled(q, k, v, causal, block, rescale=False))  # fmt: skip
    assert fails(result, "you rescaled l but not acc", "acc * exp(m - m_new)"), result.message


def test_the_gallerys_forward_without_a_bug_passes() -> None:
    assert check_tiled_attention(lambda q, k, v, causal=False, block=16: tiled_with(q, k, v, causal, block)).passed  # fmt: skip


#: The gallery's kinds in the solution's Triton backward: (replacements, words of the hint)
TRITON_GALLERY = {
    "P rounded to fp16 before P^T dO": (
        [
            (
                "dv += tl.dot(tl.trans(p), do,",
                "dv += tl.dot(tl.trans(p.to(tl.float16).to(tl.float32)), do,",
            )
        ],  # fmt: skip
        ("dv is off by", "rounding to 16 bits", "no .to(tl.float16)"),
    ),
    "D from an fp16-rounded O": (
        [("delta = (dout * out.float())", "delta = (dout * out.half().float())")],
        ("dq is off by", "rounding to 16 bits", "dv is right, so P is: look at dS and D"),
    ),
    "lse off by 1e-4": (
        [("lse = lse.contiguous().float()", "lse = lse.contiguous().float() + 1e-4")],
        ("dq is off by", "0.9999 times the right one", "the lse exactly as given"),
    ),
    "mask one late in query tile 2 (dQ's kernel)": (
        [
            (
                "                hidden = hidden | (keys[None, :] > rows[:, None])\n"
                "            p = tl.where(hidden, 0.0, tl.exp(s - lse[:, None]))\n"
                "            dp",
                "                hidden = hidden | (keys[None, :] > rows[:, None] + (tile == 1).to(tl.int32))\n"
                "            p = tl.where(hidden, 0.0, tl.exp(s - lse[:, None]))\n"
                "            dp",
            )
        ],
        ("dq is off by", "only rows 16 to 30 are, the rest are right", "causal mask"),
    ),
}


@pytest.mark.skipif(not RUNS, reason="Triton cannot run here (not installed, or no interpreter)")
@pytest.mark.parametrize("bug", TRITON_GALLERY)
def test_the_gallerys_bugs_in_the_triton_backward_fail_with_their_hint(bug: str) -> None:
    """Refused before too (at these small probes the old bound was 1.6-4x short of them, where at
    T = 200, d = 32 it let D from a rounded O, the lse off and P in fp16 through: the gallery's
    'grads / bound' 0.30, 0.59, 0.23), but with 'dq is off by 1.63 x the rounding bound: dQ = ...'."""
    replacements, hint = TRITON_GALLERY[bug]
    result = check_triton_backward(solution_variant(bug, replacements))
    assert fails(result, *hint), result.message


# --- the strict grader's answers (issue 31, section 2): accepted, refused or misled before --------


def tiled_graded(q, k, v, causal=False, block=16, *, bq=None, bk=None, work=None, running_max=True, twice=False):  # fmt: skip
    """The grader's tile loop with its knobs: tile sizes, accumulation dtype, running max, the scale twice."""
    t, (bq, bk) = q.size(-2), (bq or block, bk or block)
    work, scale = work or torch.promote_types(q.dtype, torch.float32), 1 / math.sqrt(q.size(-1))
    outs, lses = [], []
    for qs in range(0, t, bq):
        qi = q[..., qs : qs + bq, :].to(work) * scale
        rows = torch.arange(qs, qs + qi.size(-2))[:, None]
        m = torch.full(qi.shape[:-1], -math.inf, dtype=work)
        ell, acc = torch.zeros_like(m), torch.zeros_like(qi)
        for ks in range(0, min(t, qs + qi.size(-2)) if causal else t, bk):
            kj, vj = k[..., ks : ks + bk, :].to(work), v[..., ks : ks + bk, :].to(work)
            s = (qi @ kj.transpose(-2, -1)) * (scale if twice else 1.0)
            if causal:
                s = s.masked_fill(torch.arange(ks, ks + kj.size(-2))[None, :] > rows, -math.inf)
            m_new = torch.maximum(m, s.amax(-1)) if running_max else s.amax(-1)
            p, r = torch.exp(s - m_new[..., None]), torch.exp(m - m_new)
            ell, acc, m = ell * r + p.sum(-1), acc * r[..., None] + p @ vj, m_new
        outs.append((acc / ell[..., None]).to(q.dtype))
        lses.append((m + torch.log(ell)).to(torch.promote_types(q.dtype, torch.float32)))
    return torch.cat(outs, -2), torch.cat(lses, -1)


def fused_cpu_flash_op(q, k, v, causal=False, block=16):
    """No tile loop: aten's fused CPU flash attention through torch.ops, inputs in float32 or float64."""
    work = torch.promote_types(q.dtype, torch.float32)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q.to(work), k.to(work), v.to(work), 0.0, causal)[:2]  # fmt: skip
    return out.to(q.dtype), lse


def math_sdpa_per_tile(q, k, v, causal=False, block=16):
    """aten's math SDPA through torch.ops on each (query tile, key tile), merged by each tile's lse."""
    t, work, scale = q.size(-2), torch.promote_types(q.dtype, torch.float32), q.size(-1) ** -0.5
    outs, lses = [], []
    for qs in range(0, t, block):
        qi = q[..., qs : qs + block, :].to(work)
        rows = torch.arange(qs, qs + qi.size(-2))[:, None]
        lse, out = torch.full(qi.shape[:-1], -math.inf, dtype=work), torch.zeros(qi.shape, dtype=work)  # fmt: skip
        for ks in range(0, min(t, qs + qi.size(-2)) if causal else t, block):
            kj, vj = k[..., ks : ks + block, :].to(work), v[..., ks : ks + block, :].to(work)
            hidden = torch.arange(ks, ks + kj.size(-2))[None, :] > rows if causal else torch.zeros(1, 1, dtype=torch.bool)  # fmt: skip
            mask = torch.zeros(hidden.shape, dtype=work).masked_fill(hidden, -math.inf)
            o_t = torch.ops.aten._scaled_dot_product_attention_math(qi, kj, vj, attn_mask=mask)[0]
            lse_t = torch.logsumexp((qi @ kj.transpose(-2, -1) * scale).masked_fill(hidden, -math.inf), -1)  # fmt: skip
            new = torch.logaddexp(lse, lse_t)
            out = out * torch.exp(lse - new)[..., None] + o_t * torch.exp(lse_t - new)[..., None]
            lse = new
        outs.append(out.to(q.dtype))
        lses.append(lse)
    return torch.cat(outs, -2), torch.cat(lses, -1)


def scores_without_a_product(q, k, v, causal=False, block=16):
    """The right tile loop, its scores a broadcast product summed: no q tile @ k tile^T at all."""
    t, work = q.size(-2), torch.promote_types(q.dtype, torch.float32)
    outs, lses = [], []
    for qs in range(0, t, block):
        qi = q[..., qs : qs + block, :].to(work) / math.sqrt(q.size(-1))
        rows = torch.arange(qs, qs + qi.size(-2))[:, None]
        m = torch.full(qi.shape[:-1], -math.inf, dtype=work)
        ell, acc = torch.zeros_like(m), torch.zeros_like(qi)
        for ks in range(0, min(t, qs + block) if causal else t, block):
            kj, vj = k[..., ks : ks + block, :].to(work), v[..., ks : ks + block, :].to(work)
            s = (qi[..., :, None, :] * kj[..., None, :, :]).sum(-1)
            if causal:
                s = s.masked_fill(torch.arange(ks, ks + kj.size(-2))[None, :] > rows, -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            p, r = torch.exp(s - m_new[..., None]), torch.exp(m - m_new)
            ell, acc, m = ell * r + p.sum(-1), acc * r[..., None] + (p[..., None] * vj[..., None, :, :]).sum(-2), m_new  # fmt: skip
        outs.append((acc / ell[..., None]).to(q.dtype))
        lses.append(m + torch.log(ell))
    return torch.cat(outs, -2), torch.cat(lses, -1)


def graded(**knobs):  # noqa: ANN003, ANN201
    return lambda q, k, v, causal=False, block=16: tiled_graded(q, k, v, causal, block, **knobs)


@pytest.mark.parametrize(
    ("wrong", "hints"),
    [
        (fused_cpu_flash_op, ("_scaled_dot_product_flash_attention_for_cpu", "or SDPA")),
        (math_sdpa_per_tile, ("torch ran aten's", "or SDPA", "not even on one tile")),
        (scores_without_a_product, ("no product of a query tile and a key tile",)),
        (graded(bq=8, bk=8), ("tiles of 8 x 8 scores, but block=16", "the `block` argument")),
        (graded(bk=32), ("tile the keys by block", "key tiles of 32 with block=16")),
        (graded(bk=8), ("tile the keys by block, as the exercise asks", "key tiles of 8 with")),
        (graded(work=torch.float32), ("float64 inputs need float64 tiles",)),
        (graded(running_max=False), ("ignores the running max", "m_new = max(m, rowmax(s))")),
        (graded(twice=True), ("scaled twice",)),
    ],
    ids=lambda x: getattr(x, "__name__", "")[:20] if callable(x) else "",
)
def test_the_graders_tiled_forwards_fail_with_their_hint(wrong, hints: tuple[str, ...]) -> None:
    """The first two were accepted before (the fused op) or refused as 'Stop each query tile's
    loop' (SDPA per tile); key tiles of block // 2 (the exercise asks for tiles of block) and the
    rest got a hint about another mistake: untiled keys, 16-bit rounding, exp(s) without a max."""
    result = check_tiled_attention(wrong)
    assert fails(result, *hints), result.message


#: The grader's Triton backwards: the solution with one change each (/tmp/grader/make_ex5.py)
DK_WITHOUT_SCALE = [("tl.store(dk_ptr + kv, dk * scale,", "tl.store(dk_ptr + kv, dk,")]
GRID_WITHOUT_HEADS = [
    ("dq, dk, dv = torch.empty_like(q)", "dq, dk, dv = torch.zeros_like(q)"),
    ("grid = (triton.cdiv(t, block), b * h)", "grid = (triton.cdiv(t, block), 1)"),
]
RACE_ON_SCRATCH = [
    *DQ_FROM_EVERY_KEY_TILE[:2],
    (
        "    @triton.jit\n    def dq_kernel",
        "    @triton.jit\n    def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):\n"
        "        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)\n\n"
        "    @triton.jit\n    def dq_kernel",
    ),
    (
        DQ_FROM_EVERY_KEY_TILE[3][0],
        "dq_accum = torch.zeros_like(q)\n"
        "    dk_dv_kernel[grid](q, k, v, dout, lse, delta, dk, dv, dq_accum, *args, **meta)\n"
        "    copy_kernel[(triton.cdiv(q.numel(), 256),)](dq_accum, dq, q.numel(), BLOCK=256)",
    ),
]


@pytest.mark.skipif(
    not RUNS or torch.cuda.is_available(), reason="the store watch needs Triton's interpreter"
)
def test_a_race_on_a_scratch_buffer_copied_into_dq_fails() -> None:
    """Accepted before: the race was looked for only in the tensors returned."""
    result = check_triton_backward(solution_variant("scratch", RACE_ON_SCRATCH))
    assert fails(result, "elements of a buffer you do not return", "tl.atomic_add"), result.message


@pytest.mark.skipif(not RUNS, reason="Triton cannot run here (not installed, or no interpreter)")
@pytest.mark.parametrize(
    ("replacements", "hints"),
    [
        (DK_WITHOUT_SCALE, ("dk is off", "sqrt(head_dim) = 4", "scale is missing on dk")),
        (GRID_WITHOUT_HEADS, ("dq is off", "only (batch, head) (0, 1) of (1, 2)", "grid")),
    ],
    ids=["dk without 1/sqrt(d)", "grid without heads"],
)
def test_the_graders_triton_backwards_get_the_hint_of_their_mistake(replacements, hints) -> None:  # noqa: ANN001
    """Before: 'as when every P is off by one' (the factor 4 is sqrt(16)) and the generic dQ formula."""
    result = check_triton_backward(solution_variant("graded", replacements))
    assert fails(result, *hints), result.message


def test_a_merge_returning_the_safe_max_as_m_is_told_to_keep_minus_inf() -> None:
    """Before: 'm differ from the merged state: m = max(m_a, m_b)', no word of the empty rows."""

    def returns_the_safe_max(a, b):
        (ma, la, acca), (mb, lb, accb) = a, b
        m = torch.maximum(ma, mb)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        sa, sb = torch.exp(ma - m), torch.exp(mb - m)
        return m, la * sa + lb * sb, acca * sa[..., None] + accb * sb[..., None]

    result = check_merge_states(returns_the_safe_max)
    assert fails(result, "must keep m = -inf", "only inside the factors"), result.message


class _Triton31Kernel:
    """What triton.jit makes under Triton 3.1's interpreter (torch 2.5's): `run` set on each
    kernel, `kernel[grid]` the class's own __getitem__ (the oldest lane's CI found it)."""

    def __init__(self, fn) -> None:  # noqa: ANN001
        self.fn = fn
        self.run = lambda *args, **kwargs: ("ran", args)

    def __getitem__(self, grid):  # noqa: ANN001, ANN204
        return lambda *args: ("launched", grid, args)

    def __call__(self, *args):  # noqa: ANN002, ANN204
        return self.fn(*args)


@pytest.mark.skipif(not RUNS, reason="Triton cannot run here (not installed, or no interpreter)")
def test_a_launch_is_refused_and_watched_on_triton_31s_kernel_class(monkeypatch) -> None:  # noqa: ANN001
    """Exercise 2 refuses `kernel[grid](...)` and exercise 5's watch enters, with either Triton's kernel class."""
    from helpers.checks import ch08 as checks

    def copy_kernel(x):  # noqa: ANN001, ANN202
        return x

    monkeypatch.setattr(checks.triton_interpreter, "InterpretedFunction", _Triton31Kernel)
    kernel = _Triton31Kernel(copy_kernel)
    assert checks._launch_entries(_Triton31Kernel) == ["__getitem__"]
    with checks._triton_launches() as launched, pytest.raises(checks.CheckFailed, match="copy_kernel"):  # fmt: skip
        kernel[(1,)](1)
    assert launched == [f"{__name__}.copy_kernel"]
    assert kernel[(1,)](2) == ("launched", (1,), (2,))  # restored
    with checks._triton_stores() as launches:
        assert kernel[(2,)](3) == ("launched", (2,), (3,))
    assert not launches.chapter
    assert _Triton31Kernel.__dict__["__getitem__"].__name__ == "__getitem__"  # restored
