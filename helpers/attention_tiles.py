"""Measuring attention in tiles: the rounding bound its checks use, and the bytes it saves for
backward against the written-out attention's (chapter 8)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure

from helpers.activations import ActivationMeter
from helpers.i18n import tr
from helpers.units import MiB
from helpers.validate import positive_int

#: The names of the tensors rounding_bound bounds, in the order it returns them.
BOUNDED = ("out", "dq", "dk", "dv")


def _probabilities(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) in float64, the future hidden if causal (chapter 8)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if causal:
        t = q.size(-2)
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    return torch.softmax(s, dim=-1)


def rounding_bound(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    causal: bool = False,
    eps: float | None = None,
    rounded_to: torch.dtype | None = None,
) -> dict[str, torch.Tensor]:
    """First-order worst-case rounding error of each element of out, dq, dk, dv (chapter 8).

    Every sum of n terms computed in floating point is off by at most n * eps * (the sum of
    the terms' absolute values); this follows that rule through the scores (d terms), the
    softmax (T terms), the weighted sum and the backward's products, in float64, element by
    element. eps is the accumulation dtype's (float32's for 16-bit and 32-bit inputs): each
    rounding is counted as eps, twice the unit roundoff, which also covers the few single
    roundings (exp, log, a division, a tile's rescaling) the sums do not name. It bounds one
    computation against the exact result; two computations differ by at most twice this.
    With ``rounded_to`` (bf16, fp16), the output bound adds that dtype's eps for the roundings
    a 16-bit computation may make: the probabilities before they multiply v and the output
    (eps), and the scores themselves, as a 16-bit matmul and scaling return them, which moves
    each probability by up to 2 x eps x its largest score's terms.
    """
    eps = eps if eps is not None else torch.finfo(torch.promote_types(q.dtype, torch.float32)).eps
    q, k, v, do = (x.detach().cpu().double() for x in (q, k, v, dout))  # MPS has no float64
    t, d = q.size(-2), q.size(-1)
    scale = 1 / math.sqrt(d)
    p = _probabilities(q, k, causal)
    out = p @ v
    a_max = (scale * q.abs() @ k.abs().transpose(-2, -1)).amax(-1, keepdim=True)
    e_p = (2 * d * a_max + t + 3) * eps  # relative error of each probability, per row
    low = torch.finfo(rounded_to).eps if rounded_to is not None else 0.0
    b_out = (e_p + t * eps + low * (1 + 2 * a_max)) * (p @ v.abs())
    dp = do @ v.transpose(-2, -1)
    b_dp = d * eps * (do.abs() @ v.abs().transpose(-2, -1))
    delta = (do * out).sum(-1, keepdim=True)
    b_delta = (d * eps * (do.abs() * out.abs()) + do.abs() * b_out).sum(-1, keepdim=True) + (
        t * eps * p * dp.abs() + e_p * p * dp.abs() + p * b_dp
    ).sum(-1, keepdim=True)  # both ways to compute it: rowsum(dO * O) and rowsum(P * dP)
    ds = p * (dp - delta)
    b_ds = e_p * p * (dp - delta).abs() + p * (b_dp + b_delta) + eps * ds.abs()
    b_dv = p.transpose(-2, -1) @ ((e_p + t * eps) * do.abs())
    b_dq = scale * (b_ds + t * eps * ds.abs()) @ k.abs()
    b_dk = scale * (b_ds + t * eps * ds.abs()).transpose(-2, -1) @ q.abs()
    return dict(zip(BOUNDED, (b_out, b_dq, b_dk, b_dv)))


def lse_rounding_bound(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Rounding bound of each row's log-sum-exp: its scores' d-term sums, then T terms and a log (chapter 8)."""
    eps = torch.finfo(torch.promote_types(q.dtype, torch.float32)).eps
    q, k = (x.detach().cpu().double() for x in (q, k))
    t, d = q.size(-2), q.size(-1)
    a_max = (q.abs() @ k.abs().transpose(-2, -1) / math.sqrt(d)).amax(-1)
    return (2 * d * a_max + t + 3) * eps


def attention_and_grads(
    attention: Callable[..., torch.Tensor],
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """attention(q, k, v)'s output and the gradients of q, k, v for the upstream gradient dout (chapter 8)."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = attention(*leaves)
    out.backward(dout)
    return dict(zip(BOUNDED, (out.detach(), *(x.grad for x in leaves))))


def worst_ratio(
    got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], bound: dict[str, torch.Tensor]
) -> dict[str, float]:
    """For each tensor, the largest |got - want| / (2 x bound): at most 1 where the bound holds (chapter 8)."""
    return {
        name: ((got[name].cpu().double() - want[name].cpu().double()).abs() / (2 * bound[name]))
        .max()
        .item()
        for name in BOUNDED
    }


def saved_bytes(
    attention: Callable[..., torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> int:
    """Bytes one forward of attention(q, k, v) saves for backward, q, k and v themselves left out (chapter 8)."""
    with ActivationMeter(q, k, v) as meter:
        out = attention(q, k, v)
    del out
    return meter.total_bytes


def saved_bytes_sweep(
    attentions: dict[str, Callable[..., torch.Tensor]],
    lengths: Sequence[int],
    *,
    head_dim: int = 64,
    heads: int = 1,
    device: str | torch.device = "cpu",
) -> list[dict[str, Any]]:
    """Saved bytes of each attention at each sequence length T, one row per T (chapter 8)."""
    head_dim, heads = positive_int(head_dim, "head_dim"), positive_int(heads, "heads")
    rows = []
    for t in lengths:
        t = positive_int(t, tr("each sequence length"))
        q, k, v = (
            torch.randn(1, heads, t, head_dim, device=device, requires_grad=True) for _ in "qkv"
        )
        row: dict[str, Any] = {"T": t}
        for name, attention in attentions.items():
            row[f"{name} MiB"] = saved_bytes(attention, q, k, v) / MiB
        rows.append(row)
    return rows


def loglog_slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """The least-squares slope of log(y) against log(x): 1 for linear growth, 2 for quadratic (chapter 8)."""
    if len(xs) != len(ys) or len(xs) < 2 or min(*xs, *ys) <= 0:
        raise ValueError(
            tr("loglog_slope needs at least two positive (x, y) pairs of equal count.")
        )
    lx, ly = (
        torch.tensor(xs, dtype=torch.float64).log(),
        torch.tensor(ys, dtype=torch.float64).log(),
    )
    lx, ly = lx - lx.mean(), ly - ly.mean()
    return float((lx * ly).sum() / (lx * lx).sum())


def plot_saved_bytes(rows: Sequence[dict[str, Any]]) -> Figure:
    """Saved MiB against T on log-log axes, one line per attention (chapter 8)."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ts = [r["T"] for r in rows]
    for column in [c for c in rows[0] if c.endswith(" MiB")]:
        ax.loglog(ts, [r[column] for r in rows], marker="o", label=column.removesuffix(" MiB"))
    ax.set_xlabel(tr("sequence length T"))
    ax.set_ylabel(tr("MiB saved for backward (q, k, v excluded)"))
    ax.set_title(tr("what one forward keeps for backward"))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """F.scaled_dot_product_attention with the chapter's argument order (chapter 8)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def forward_hbm_bytes(t: int, head_dim: int, block_m: int, itemsize: int) -> int:
    """HBM bytes one (batch, head) of a FlashAttention-2 forward moves: Q once, K and V once per query tile, O and a float32 lse written (chapter 8)."""
    tiles = -(-t // block_m)
    return itemsize * (2 * t * head_dim + tiles * 2 * t * head_dim) + 4 * t


def written_out_hbm_bytes(t: int, head_dim: int, itemsize: int) -> int:
    """HBM bytes of the written-out forward, one (batch, head): Q, K, V read, S written and read, P written and read, O written (chapter 8)."""
    return itemsize * (4 * t * head_dim + 4 * t * t)


def tile_sram_bytes(block_m: int, block_n: int, head_dim: int, itemsize: int) -> int:
    """On-chip bytes one forward program holds: its Q tile, a K and a V tile, float32 scores, acc, m and l (chapter 8)."""
    return itemsize * (block_m + 2 * block_n) * head_dim + 4 * (block_m * block_n + block_m * head_dim + 2 * block_m)  # fmt: skip
