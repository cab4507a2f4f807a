"""Chapter 8, exercise 2, fifth round: three wrong tiled forwards a strict grader found refused with
only the generic hint are refused with the hint of their mistake (issue 31, the second grader).

Scores scaled by 1 / sqrt(block) instead of 1 / sqrt(head_dim), heads mixed by a transpose before
reshape when (batch, heads) are folded, and a log-sum-exp returned in base 2. Before, the first two
got "your output differs from softmax(q k^T / sqrt(d)) v by up to ... Per key tile: ...", the third
"the output is right but the log-sum-exp is not: return m + log(l) per query row, ...".

The answers named W_* are the grader's, copied here; the others make the same mistake another way.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_exercises_ch08 import fails

from helpers.checks.ch08 import check_tiled_attention


def _loop(q, k, v, causal, block, scale, base2=False):
    """(not an answer) the tile loop over q, k, v of any shape (..., T, D), scores times `scale`;
    with base2, exp2 throughout on scores times log2(e), and the lse left in base 2."""
    t = q.size(-2)
    work = torch.promote_types(q.dtype, torch.float32)
    exp = torch.exp2 if base2 else torch.exp
    log = torch.log2 if base2 else torch.log
    scale = scale * (math.log2(math.e) if base2 else 1.0)
    outs, lses = [], []
    for qs in range(0, t, block):
        qi = q[..., qs : qs + block, :].to(work) * scale
        rows = torch.arange(qs, qs + qi.size(-2))[:, None]
        m = torch.full(qi.shape[:-1], -math.inf, dtype=work)
        ell, acc = torch.zeros_like(m), torch.zeros_like(qi)
        for ks in range(0, min(t, qs + block) if causal else t, block):
            kj, vj = k[..., ks : ks + block, :].to(work), v[..., ks : ks + block, :].to(work)
            s = qi @ kj.transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(ks, ks + kj.size(-2))[None, :] > rows, -math.inf)
            m_new = torch.maximum(m, s.amax(-1))
            p, r = exp(s - m_new[..., None]), exp(m - m_new)
            ell, acc, m = ell * r + p.sum(-1), acc * r[..., None] + p @ vj, m_new
        outs.append((acc / ell[..., None]).to(q.dtype))
        lses.append(m + log(ell))
    return torch.cat(outs, -2), torch.cat(lses, -1)


def W_scale_sqrt_block(q, k, v, causal=False, block=16):  # noqa: N802
    return _loop(q, k, v, causal, block, 1 / math.sqrt(block))


def W_heads_scrambled(q, k, v, causal=False, block=16):  # noqa: N802
    """(B, H) folded with x.transpose(1, 2).reshape(B * H, T, D), unfolded with .view(B, H, T, D)."""
    b, h, t, d = q.shape
    qf, kf, vf = (x.transpose(1, 2).reshape(b * h, t, d) for x in (q, k, v))
    out, lse = _loop(qf, kf, vf, causal, block, 1 / math.sqrt(d))
    return out.view(b, h, t, d), lse.view(b, h, t)


def heads_unfolded_through_transpose(q, k, v, causal=False, block=16):
    """Folded right, x.reshape(B * H, T, D), unfolded with .view(B, T, H, D).transpose(1, 2)."""
    b, h, t, d = q.shape
    out, lse = _loop(*(x.reshape(b * h, t, d) for x in (q, k, v)), causal, block, 1 / math.sqrt(d))
    return out.view(b, t, h, d).transpose(1, 2), lse.view(b, t, h).transpose(1, 2)


def W_lse_base2(q, k, v, causal=False, block=16):  # noqa: N802
    return _loop(q, k, v, causal, block, 1 / math.sqrt(q.size(-1)), base2=True)


def lse_divided_by_ln2(q, k, v, causal=False, block=16):
    """exp and log throughout, the lse divided by ln(2) at the end."""
    out, lse = _loop(q, k, v, causal, block, 1 / math.sqrt(q.size(-1)))
    return out, lse / math.log(2)


@pytest.mark.parametrize(
    ("wrong", "hints"),
    [
        (W_scale_sqrt_block, ("scaled by 1 / sqrt(block)", "1 / sqrt(head_dim)", "here 8")),
        (W_heads_scrambled, ("mixes heads and positions", "q.reshape(B * H, T, D)")),
        (heads_unfolded_through_transpose, ("mixes heads and positions",)),
        (W_lse_base2, ("log-sum-exp is in base 2", "by ln(2)")),
        (lse_divided_by_ln2, ("log-sum-exp is in base 2",)),
    ],
    ids=[
        "scale 1/sqrt(block)",
        "heads folded through transpose",
        "heads unfolded through transpose",
        "lse base 2",
        "lse / ln 2",
    ],  # fmt: skip
)
def test_the_graders_wrong_tiled_forwards_name_their_mistake(wrong, hints) -> None:  # noqa: ANN001
    """Before: the scale and heads ones got the generic 'your output differs from softmax(q k^T /
    sqrt(d)) v ...', the base-2 ones 'the log-sum-exp is not: return m + log(l) per query row'."""
    result = check_tiled_attention(wrong)
    assert fails(result, *hints), result.message
    assert "Per key tile" not in result.message, result.message
    assert "per query row, the running max" not in result.message, result.message


def test_the_right_loop_of_this_file_passes() -> None:
    """The wrong answers above differ from the right loop only in their mistake."""
    result = check_tiled_attention(lambda q, k, v, causal=False, block=16: _loop(q, k, v, causal, block, 1 / math.sqrt(q.size(-1))))  # fmt: skip
    assert result.passed, result.message
