"""helpers.flash_attention: the tiles equal SDPA to float64 rounding, save O(T) bytes, refuse bad input (chapter 8)."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from helpers.attention_tiles import attention_and_grads, rounding_bound, saved_bytes, worst_ratio
from helpers.flash_attention import (
    FlashAttention,
    flash_attention,
    flash_backward,
    flash_forward,
    merge_softmax_stats,
)


def qkvd(shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) for _ in range(4)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    ("shape", "block_q", "block_k"),
    [
        ((2, 3, 100, 16), 32, 16),
        ((1, 2, 64, 8), 64, 64),
        ((1, 1, 7, 4), 4, 2),
        ((1, 1, 1, 8), 64, 64),
    ],
)
def test_forward_and_backward_equal_sdpa_in_float64(shape, block_q, block_k, causal) -> None:
    q, k, v, dout = qkvd(shape)
    sdpa = partial(F.scaled_dot_product_attention, is_causal=causal)
    tiles = partial(flash_attention, causal=causal, block_q=block_q, block_k=block_k)
    bound = rounding_bound(q, k, v, dout, causal)
    ratios = worst_ratio(attention_and_grads(tiles, q, k, v, dout), attention_and_grads(sdpa, q, k, v, dout), bound)  # fmt: skip
    assert max(ratios.values()) <= 1, ratios


def test_log_sum_exp_is_that_of_the_scaled_scores() -> None:
    q, k, v, _ = qkvd((2, 2, 50, 8))
    for causal in (False, True):
        _, lse = flash_forward(q, k, v, causal, 16, 16)
        s = q @ k.transpose(-2, -1) / math.sqrt(8)
        if causal:
            s = s.masked_fill(torch.ones(50, 50, dtype=torch.bool).triu(1), -math.inf)
        assert torch.allclose(lse, torch.logsumexp(s, -1), rtol=0, atol=1e-12)


def test_sixteen_bit_inputs_compute_in_float32() -> None:
    q, k, v, dout = qkvd((1, 2, 40, 16), torch.bfloat16)
    out, lse = flash_forward(q, k, v, True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    bound = rounding_bound(q, k, v, dout, True, rounded_to=torch.bfloat16)["out"]
    want = F.scaled_dot_product_attention(*(t.double() for t in (q, k, v)), is_causal=True)
    assert ((out.double() - want).abs() <= bound).all()
    grads = attention_and_grads(partial(flash_attention, causal=True), q, k, v, dout)
    assert all(grads[n].dtype == torch.bfloat16 for n in ("dq", "dk", "dv"))


def test_backward_by_hand_matches_autograd_of_the_function() -> None:
    q, k, v, dout = qkvd((1, 2, 33, 8))
    out, lse = flash_forward(q, k, v, True, 8, 8)
    by_hand = flash_backward(q, k, v, out, lse, dout, True, 8, 8)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    FlashAttention.apply(*leaves, True, 8, 8).backward(dout)
    assert all(torch.equal(a, b.grad) for a, b in zip(by_hand, leaves))


def test_the_function_saves_output_and_lse_only() -> None:
    q = torch.randn(1, 2, 300, 32, requires_grad=True)
    got = saved_bytes(partial(flash_attention, causal=True), q, q, q)
    assert got == 2 * 300 * (32 + 1) * 4
    recorded = saved_bytes(lambda q, k, v: flash_forward(q, k, v, True)[0], q, q, q)
    assert recorded > 8 * got  # autograd would keep every tile of P


def test_merge_softmax_stats_is_exact_and_symmetric() -> None:
    x = 50 * torch.randn(3, 40, dtype=torch.float64)
    a, b = x[:, :17], x[:, 17:]
    sa = (a.amax(-1), torch.exp(a - a.amax(-1, keepdim=True)).sum(-1))
    sb = (b.amax(-1), torch.exp(b - b.amax(-1, keepdim=True)).sum(-1))
    for m, ell in (merge_softmax_stats(*sa, *sb), merge_softmax_stats(*sb, *sa)):
        assert torch.allclose(m + ell.log(), torch.logsumexp(x, -1), rtol=1e-14, atol=0)


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        ((torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)), ValueError, "one shape"),
        (
            (torch.randn(1, 1, 4, 2), torch.randn(1, 1, 5, 2), torch.randn(1, 1, 5, 2)),
            ValueError,
            "(1, 1, 5, 2)",
        ),  # fmt: skip
        (([1.0], torch.randn(1, 1, 4, 2), torch.randn(1, 1, 4, 2)), TypeError, "must be tensors"),
    ],
)
def test_bad_input_gets_a_clear_message(args, error, words) -> None:
    with pytest.raises(error, match=None) as exc:
        flash_forward(*args)
    assert words in str(exc.value)
