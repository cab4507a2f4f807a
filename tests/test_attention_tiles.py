"""helpers.attention_tiles: the rounding bound holds for correct attentions and not for wrong ones;
saved bytes and their plot (chapter 8)."""

from __future__ import annotations

import math
from functools import partial

import matplotlib.pyplot as plt
import pytest
import torch
import torch.nn.functional as F

from helpers.attention_tiles import (
    BOUNDED,
    attention_and_grads,
    loglog_slope,
    lse_rounding_bound,
    plot_saved_bytes,
    rounding_bound,
    saved_bytes,
    saved_bytes_sweep,
    sdpa,
    worst_ratio,
)
from helpers.flash_attention import flash_attention
from helpers.gpt import manual_attention


def fp32_inputs(shape, seed, size=1.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(shape, generator=g) for _ in range(4))
    return size * q, k, v, dout


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("size", [1.0, 3.0])
def test_bound_holds_for_correct_fp32_attentions(seed: int, size: float) -> None:
    """Written-out, tiles and SDPA, each against float64: within the bound (the cause it models)."""
    q, k, v, dout = fp32_inputs((2, 2, 96, 32), seed, size)
    exact = attention_and_grads(partial(sdpa, causal=True), *(t.double() for t in (q, k, v, dout)))
    bound = rounding_bound(q, k, v, dout, causal=True)
    for attention in (manual_attention, partial(flash_attention, causal=True), partial(sdpa, causal=True)):  # fmt: skip
        ratios = worst_ratio(attention_and_grads(attention, q, k, v, dout), exact, bound)
        assert max(ratios.values()) <= 0.5, ratios  # one computation: within the bound itself


def test_bound_is_far_below_a_real_mistake() -> None:
    """A mask one position late is thousands of bounds away: the tolerance cannot hide it."""
    q, k, v, dout = fp32_inputs((1, 2, 64, 16), 0)

    def one_late(q, k, v):
        t = q.size(-2)
        s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(2), -math.inf)
        return torch.softmax(s, -1) @ v

    right = attention_and_grads(partial(sdpa, causal=True), q, k, v, dout)
    ratios = worst_ratio(attention_and_grads(one_late, q, k, v, dout), right, rounding_bound(q, k, v, dout, True))  # fmt: skip
    assert min(ratios.values()) > 1000, ratios


def test_bound_scales_with_eps_and_sixteen_bit_rounding() -> None:
    q, k, v, dout = fp32_inputs((1, 1, 16, 8), 1)
    b32 = rounding_bound(q, k, v, dout)
    b64 = rounding_bound(q.double(), k.double(), v.double(), dout.double())
    assert set(b32) == set(BOUNDED)
    ratio = torch.finfo(torch.float32).eps / torch.finfo(torch.float64).eps
    assert torch.allclose(b32["out"] / b64["out"], torch.full_like(b32["out"], ratio))
    bf = rounding_bound(q, k, v, dout, rounded_to=torch.bfloat16)
    assert (bf["out"] > 100 * b32["out"]).all() and torch.equal(bf["dv"], b32["dv"])


def test_saved_bytes_excludes_the_inputs_and_counts_the_probabilities() -> None:
    q = torch.randn(1, 1, 128, 16, requires_grad=True)
    assert saved_bytes(manual_attention, q, q, q) == 128 * 128 * (4 + 1)  # P (fp32) + the mask
    assert saved_bytes(partial(flash_attention, causal=True), q, q, q) == 128 * 17 * 4


def test_saved_bytes_sweep_rows_and_plot() -> None:
    rows = saved_bytes_sweep({"tiles": partial(flash_attention, causal=True)}, [32, 64], head_dim=8, heads=2)  # fmt: skip
    assert [r["T"] for r in rows] == [32, 64]
    assert rows[1]["tiles MiB"] * 2**20 == 2 * 64 * 9 * 4
    fig = plot_saved_bytes(rows)
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_legend() is not None
    plt.close(fig)
    with pytest.raises(ValueError, match="sequence length"):
        saved_bytes_sweep({"tiles": flash_attention}, [0])
    with pytest.raises(ValueError, match="head_dim"):
        saved_bytes_sweep({"tiles": flash_attention}, [8], head_dim=0)


def test_loglog_slope() -> None:
    assert loglog_slope([1, 2, 4, 8], [3, 6, 12, 24]) == pytest.approx(1.0)
    assert loglog_slope([1, 2, 4, 8], [1, 4, 16, 64]) == pytest.approx(2.0)
    for xs, ys in (([1], [1]), ([1, 2], [1]), ([0, 2], [1, 2]), ([1, 2], [1, -2])):
        with pytest.raises(ValueError, match="positive"):
            loglog_slope(xs, ys)


def test_sdpa_wrapper_passes_causal() -> None:
    q, k, v, _ = fp32_inputs((1, 1, 8, 4), 2)
    assert torch.equal(sdpa(q, k, v, True), F.scaled_dot_product_attention(q, k, v, is_causal=True))  # fmt: skip


def test_lse_bound_holds_and_uses_the_inputs_eps() -> None:
    q, k, v, _ = fp32_inputs((1, 2, 64, 16), 4, size=3.0)
    got = torch.logsumexp(q @ k.transpose(-2, -1) / 4, -1).double()
    want = torch.logsumexp(q.double() @ k.double().transpose(-2, -1) / 4, -1)
    bound = lse_rounding_bound(q, k)
    assert ((got - want).abs() <= bound).all()
    ratio = torch.finfo(torch.float32).eps / torch.finfo(torch.float64).eps
    assert torch.allclose(bound / lse_rounding_bound(q.double(), k.double()), torch.full_like(bound, ratio))  # fmt: skip
