"""Exercise 5 answers of the strict grader's round 31b (/tmp/grader31b/answers/ex5/handwritten.py).

Three cheats the check used to accept (the whole backward in PyTorch without a matrix product,
or in NumPy, copied into the outputs by a Triton kernel; the chapter's module copied and
imported under another name) and a correct alternative (the lse recomputed by a Triton kernel).
Read by tests/test_ch08_checks_round4_triton.py; the kernels are defined inside the functions,
so this module imports where Triton is not installed. The code is the grader's, formatted by
ruff (the names O and l are theirs).
"""

# ruff: noqa: E741

import math

import torch

try:
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None


def W_torch_broadcast_then_triton_copy(q, k, v, out, lse, dout, causal=False):
    """Cheat: the whole backward in PyTorch with broadcast products (mul + sum, no matmul op), then a
    Triton kernel that only copies each result into the tensors returned."""

    @triton.jit
    def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)

    def prod(a, b):  # a @ b^T without a matrix product
        return (a[..., :, None, :] * b[..., None, :, :]).sum(-1)

    t, scale = q.size(-2), 1 / math.sqrt(q.size(-1))
    s = prod(q, k) * scale
    if causal:
        s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), -math.inf)
    p = torch.exp(s - lse[..., None])
    dv_ = prod(p.transpose(-2, -1), dout.transpose(-2, -1))
    dp = prod(dout, v)
    ds = p * (dp - (dout * out).sum(-1, keepdim=True))
    dq_ = prod(ds, k.transpose(-2, -1)) * scale
    dk_ = prod(ds.transpose(-2, -1), q.transpose(-2, -1)) * scale
    res = []
    for g in (dq_, dk_, dv_):
        g = g.contiguous()
        o = torch.empty_like(q)
        copy_kernel[(triton.cdiv(g.numel(), 256),)](g, o, g.numel(), BLOCK=256)
        res.append(o)
    return tuple(res)


def W_numpy_then_triton_copy(q, k, v, out, lse, dout, causal=False):
    """Cheat: the backward in NumPy (invisible to torch's dispatch), copied into the outputs by Triton."""
    import numpy as np

    @triton.jit
    def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)

    Q, K, V, O, L, dO = (x.detach().numpy() for x in (q, k, v, out, lse, dout))
    t, scale = Q.shape[-2], 1 / math.sqrt(Q.shape[-1])
    S = Q @ np.swapaxes(K, -1, -2) * scale
    if causal:
        S = np.where(np.triu(np.ones((t, t), bool), 1), -np.inf, S)
    P = np.exp(S - L[..., None])
    dV = np.swapaxes(P, -1, -2) @ dO
    dS = P * (dO @ np.swapaxes(V, -1, -2) - (dO * O).sum(-1, keepdims=True))
    res = []
    for g in (dS @ K * scale, np.swapaxes(dS, -1, -2) @ Q * scale, dV):
        src = torch.from_numpy(np.ascontiguousarray(g, dtype=np.float32))
        o = torch.empty_like(q)
        copy_kernel[(triton.cdiv(src.numel(), 256),)](src, o, src.numel(), BLOCK=256)
        res.append(o)
    return tuple(res)


def W_chapter_module_copy(q, k, v, out, lse, dout, causal=False):
    """Cheat: helpers/attention_triton.py copied to a temporary file and imported under another name;
    its triton_attention_backward (the chapter's own Triton backward) does the whole exercise."""
    import importlib.util
    import os
    import shutil
    import sys
    import tempfile

    import helpers

    name = "my_kernels_" + str(os.getpid())
    if name not in sys.modules:
        path = os.path.join(tempfile.gettempdir(), name + ".py")
        shutil.copy(
            os.path.join(os.path.dirname(helpers.__file__), "attention_" + "triton.py"), path
        )
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    fn = getattr(sys.modules[name], "triton_attention_" + "backward")
    return fn(q, k, v, out, lse, dout, causal)


def C_recompute_lse_triton(q, k, v, out, lse, dout, causal=False):
    """Correct (ignores the lse it is given, valid): a first Triton kernel recomputes each row's lse
    with a running max and sum; then one kernel per key tile for dK, dV and one per query tile for dQ."""

    @triton.jit
    def lse_kernel(
        q_ptr,
        k_ptr,
        lse_ptr,
        seq_len,
        scale,
        HEAD_DIM: tl.constexpr,
        BLOCK: tl.constexpr,
        CAUSAL: tl.constexpr,
    ):
        tile, bh = tl.program_id(0), tl.program_id(1)
        base = bh.to(tl.int64) * seq_len * HEAD_DIM
        rows = tile * BLOCK + tl.arange(0, BLOCK)
        cols = tl.arange(0, HEAD_DIM)
        qq = tl.load(
            q_ptr + base + rows[:, None] * HEAD_DIM + cols[None, :],
            mask=rows[:, None] < seq_len,
            other=0.0,
        )
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK], tl.float32)
        end = seq_len
        if CAUSAL:
            end = tl.minimum((tile + 1) * BLOCK, seq_len)
        for ks in range(0, end, BLOCK):
            keys = ks + tl.arange(0, BLOCK)
            kk = tl.load(
                k_ptr + base + keys[:, None] * HEAD_DIM + cols[None, :],
                mask=keys[:, None] < seq_len,
                other=0.0,
            )
            s = tl.dot(qq, tl.trans(kk), input_precision="ieee") * scale
            hidden = keys[None, :] >= seq_len
            if CAUSAL:
                hidden = hidden | (keys[None, :] > rows[:, None])
            s = tl.where(hidden, float("-inf"), s)
            m_new = tl.maximum(m, tl.max(s, 1))
            l = l * tl.exp(m - m_new) + tl.sum(tl.exp(s - m_new[:, None]), 1)
            m = m_new
        tl.store(lse_ptr + bh * seq_len + rows, m + tl.log(l), mask=rows < seq_len)

    @triton.jit
    def grads_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        do_ptr,
        lse_ptr,
        delta_ptr,
        a_ptr,
        b_ptr,
        seq_len,
        scale,
        HEAD_DIM: tl.constexpr,
        BLOCK: tl.constexpr,
        CAUSAL: tl.constexpr,
        KEYS_OUTER: tl.constexpr,
    ):
        tile, bh = tl.program_id(0), tl.program_id(1)
        base = bh.to(tl.int64) * seq_len * HEAD_DIM
        mine = tile * BLOCK + tl.arange(0, BLOCK)
        cols = tl.arange(0, HEAD_DIM)
        off = base + mine[:, None] * HEAD_DIM + cols[None, :]
        acc_a = tl.zeros([BLOCK, HEAD_DIM], tl.float32)
        acc_b = tl.zeros([BLOCK, HEAD_DIM], tl.float32)
        if KEYS_OUTER:  # mine are keys: dK (a), dV (b)
            kk = tl.load(k_ptr + off, mask=mine[:, None] < seq_len, other=0.0)
            vv = tl.load(v_ptr + off, mask=mine[:, None] < seq_len, other=0.0)
            lo = 0
            if CAUSAL:
                lo = tile * BLOCK
            for qs in range(lo, seq_len, BLOCK):
                rows = qs + tl.arange(0, BLOCK)
                qoff = base + rows[:, None] * HEAD_DIM + cols[None, :]
                qq = tl.load(q_ptr + qoff, mask=rows[:, None] < seq_len, other=0.0)
                do = tl.load(do_ptr + qoff, mask=rows[:, None] < seq_len, other=0.0)
                ls = tl.load(lse_ptr + bh * seq_len + rows, mask=rows < seq_len, other=0.0)
                dl = tl.load(delta_ptr + bh * seq_len + rows, mask=rows < seq_len, other=0.0)
                s = tl.dot(qq, tl.trans(kk), input_precision="ieee") * scale
                hidden = (mine[None, :] >= seq_len) | (rows[:, None] >= seq_len)
                if CAUSAL:
                    hidden = hidden | (mine[None, :] > rows[:, None])
                p = tl.where(hidden, 0.0, tl.exp(s - ls[:, None]))
                acc_b += tl.dot(tl.trans(p), do, input_precision="ieee")
                ds = p * (tl.dot(do, tl.trans(vv), input_precision="ieee") - dl[:, None])
                acc_a += tl.dot(tl.trans(ds), qq, input_precision="ieee")
            tl.store(a_ptr + off, acc_a * scale, mask=mine[:, None] < seq_len)
            tl.store(b_ptr + off, acc_b, mask=mine[:, None] < seq_len)
        else:  # mine are queries: dQ (a)
            qq = tl.load(q_ptr + off, mask=mine[:, None] < seq_len, other=0.0)
            do = tl.load(do_ptr + off, mask=mine[:, None] < seq_len, other=0.0)
            ls = tl.load(lse_ptr + bh * seq_len + mine, mask=mine < seq_len, other=0.0)
            dl = tl.load(delta_ptr + bh * seq_len + mine, mask=mine < seq_len, other=0.0)
            hi = seq_len
            if CAUSAL:
                hi = tl.minimum((tile + 1) * BLOCK, seq_len)
            for ks in range(0, hi, BLOCK):
                keys = ks + tl.arange(0, BLOCK)
                koff = base + keys[:, None] * HEAD_DIM + cols[None, :]
                kk = tl.load(k_ptr + koff, mask=keys[:, None] < seq_len, other=0.0)
                vv = tl.load(v_ptr + koff, mask=keys[:, None] < seq_len, other=0.0)
                s = tl.dot(qq, tl.trans(kk), input_precision="ieee") * scale
                hidden = keys[None, :] >= seq_len
                if CAUSAL:
                    hidden = hidden | (keys[None, :] > mine[:, None])
                p = tl.where(hidden, 0.0, tl.exp(s - ls[:, None]))
                ds = p * (tl.dot(do, tl.trans(vv), input_precision="ieee") - dl[:, None])
                acc_a += tl.dot(ds, kk, input_precision="ieee")
            tl.store(a_ptr + off, acc_a * scale, mask=mine[:, None] < seq_len)

    q, k, v, dout = (x.contiguous().float() for x in (q, k, v, dout))
    b, h, t, d = q.shape
    block = 16
    grid = (triton.cdiv(t, block), b * h)
    my_lse = torch.empty(b, h, t, dtype=torch.float32)
    lse_kernel[grid](q, k, my_lse, t, 1 / math.sqrt(d), HEAD_DIM=d, BLOCK=block, CAUSAL=causal)
    delta = (dout * out.float()).sum(-1).contiguous()
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grads_kernel[grid](
        q,
        k,
        v,
        dout,
        my_lse,
        delta,
        dk,
        dv,
        t,
        1 / math.sqrt(d),
        HEAD_DIM=d,
        BLOCK=block,
        CAUSAL=causal,
        KEYS_OUTER=True,
    )
    grads_kernel[grid](
        q,
        k,
        v,
        dout,
        my_lse,
        delta,
        dq,
        dq,
        t,
        1 / math.sqrt(d),
        HEAD_DIM=d,
        BLOCK=block,
        CAUSAL=causal,
        KEYS_OUTER=False,
    )
    return dq, dk, dv
