"""Attention in tiles, in plain PyTorch: online softmax, the FlashAttention-2 forward and its
backward by recomputation (chapter 8).

The chapter prints each function with ``inspect.getsource``; the benchmark, the Triton kernel's
tests and the exercise checkers use the same code from here. Tensors are shaped
(batch, heads, sequence, head_dim), as for ``F.scaled_dot_product_attention``; causal means
key j is hidden from query i when j > i.
"""

from __future__ import annotations

import math

import torch

from helpers.i18n import tr

#: Tile sizes of the PyTorch version: queries per tile, keys per tile.
BLOCK_Q, BLOCK_K = 64, 64


def merge_softmax_stats(
    m_a: torch.Tensor, l_a: torch.Tensor, m_b: torch.Tensor, l_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two tiles' (running max, sum of exp(x - max)) into those of both tiles (chapter 8)."""
    m = torch.maximum(m_a, m_b)
    # each sum was taken against its own max: rescale both to the common one before adding
    return m, l_a * torch.exp(m_a - m) + l_b * torch.exp(m_b - m)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for 16-bit inputs, the input's own dtype for float32 and float64 (chapter 8)."""
    return torch.promote_types(dtype, torch.float32)


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Clear errors for shapes the tiled attention does not take (chapter 8)."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        raise TypeError(tr("q, k and v must be tensors shaped (batch, heads, sequence, head_dim)."))
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(
            tr(
                "q, k and v must have one shape (batch, heads, sequence, head_dim); got "
                "{q}, {k}, {v}."
            ).format(q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape))
        )


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention-2 forward over query and key tiles: the output and each row's log-sum-exp (chapter 8)."""
    _check_qkv(q, k, v)
    t, acc_dtype = q.size(-2), _accumulation_dtype(q.dtype)
    scale = 1 / math.sqrt(q.size(-1))
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=acc_dtype, device=q.device)
    for qs in range(0, t, block_q):
        qi = q[..., qs : qs + block_q, :].to(acc_dtype) * scale
        rows = torch.arange(qs, qs + qi.size(-2), device=q.device)[:, None]
        m = torch.full(qi.shape[:-1], float("-inf"), dtype=acc_dtype, device=q.device)
        ell = torch.zeros_like(m)  # running sum of exp(s - m): the paper's l
        acc = torch.zeros_like(qi)
        last = min(t, qs + block_q) if causal else t  # causal: no key after the tile's last query
        for ks in range(0, last, block_k):
            kj = k[..., ks : ks + block_k, :].to(acc_dtype)
            vj = v[..., ks : ks + block_k, :].to(acc_dtype)
            s = qi @ kj.transpose(-2, -1)
            if causal and ks + kj.size(-2) - 1 > qs:  # the tile crosses the diagonal
                keys = torch.arange(ks, ks + kj.size(-2), device=q.device)[None, :]
                s = s.masked_fill(keys > rows, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1))
            p = torch.exp(s - m_new[..., None])
            rescale = torch.exp(m - m_new)  # how much the old running sums shrink
            ell = ell * rescale + p.sum(-1)
            acc = acc * rescale[..., None] + p @ vj
            m = m_new
        out[..., qs : qs + block_q, :] = (acc / ell[..., None]).to(q.dtype)
        lse[..., qs : qs + block_q] = m + torch.log(ell)
    return out, lse


def flash_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dout: torch.Tensor,
    causal: bool = False,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of q, k, v, recomputing each tile's probabilities from the saved log-sum-exp (chapter 8)."""
    t, acc_dtype = q.size(-2), _accumulation_dtype(q.dtype)
    scale = 1 / math.sqrt(q.size(-1))
    q, k, v, out, dout = (x.to(acc_dtype) for x in (q, k, v, out, dout))
    delta = (dout * out).sum(-1)  # rowsum(dO * O): the softmax backward's correction per row
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for ks in range(0, t, block_k):  # outer loop over key tiles: their dk, dv stay local
        kj, vj = k[..., ks : ks + block_k, :], v[..., ks : ks + block_k, :]
        keys = torch.arange(ks, ks + kj.size(-2), device=q.device)[None, :]
        first = (ks // block_q) * block_q if causal else 0  # earlier queries see none of these keys
        for qs in range(first, t, block_q):
            qi, doi = q[..., qs : qs + block_q, :], dout[..., qs : qs + block_q, :]
            s = (qi @ kj.transpose(-2, -1)) * scale
            if causal:
                rows = torch.arange(qs, qs + qi.size(-2), device=q.device)[:, None]
                s = s.masked_fill(keys > rows, float("-inf"))
            p = torch.exp(s - lse[..., qs : qs + block_q, None])  # recomputed, never stored
            dv[..., ks : ks + block_k, :] += p.transpose(-2, -1) @ doi
            dp = doi @ vj.transpose(-2, -1)
            ds = p * (dp - delta[..., qs : qs + block_q, None])
            dq[..., qs : qs + block_q, :] += (ds @ kj) * scale
            dk[..., ks : ks + block_k, :] += (ds.transpose(-2, -1) @ qi) * scale
    return dq, dk, dv


class FlashAttention(torch.autograd.Function):
    """Attention that saves only q, k, v, the output and the log-sum-exp; backward recomputes (chapter 8)."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False, block_q=BLOCK_Q, block_k=BLOCK_K):  # noqa: ANN001, ANN205
        out, lse = flash_forward(q, k, v, causal, block_q, block_k)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.blocks = causal, (block_q, block_k)
        return out

    @staticmethod
    def backward(ctx, dout):  # noqa: ANN001, ANN205
        q, k, v, out, lse = ctx.saved_tensors
        grads = flash_backward(q, k, v, out, lse, dout, ctx.causal, *ctx.blocks)
        return *(g.to(x.dtype) for g, x in zip(grads, (q, k, v))), None, None, None


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    block_q: int = BLOCK_Q,
    block_k: int = BLOCK_K,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v computed in tiles, differentiable, O(T) saved bytes (chapter 8)."""
    return FlashAttention.apply(q, k, v, causal, block_q, block_k)
