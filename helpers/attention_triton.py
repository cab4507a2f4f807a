"""FlashAttention-2 in Triton, forward and backward: compiled for a GPU, or run on the CPU by
Triton's interpreter (chapter 8).

The interpreter is a NumPy emulation of the kernels, one program after another, at the small
tiles of INTERPRETER_BLOCKS: it checks the index arithmetic and the algebra, not the compiled
code. It is not exact (its dots and exponentials are NumPy's, not the GPU's), and it checks no
resource limit: a tile too large for a GPU's shared memory or registers runs here and fails to
compile (or spills) there.

Triton reads ``TRITON_INTERPRET`` once per ``triton.jit``, and its own library functions
(``tl.zeros``, ``tl.sum``, ...) are wrapped when ``triton`` is imported: so the variable must
be set before anything imports triton. The chapter's notebook sets it in a cell before its
first import of this module when the device is not a GPU, and ``tests/conftest.py`` sets it
for the test session on a machine without CUDA. ``triton_status`` says what this process can
do, and why not.
"""

import functools
import importlib.util
import math
import platform
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from helpers.flash_attention import flash_forward
from helpers.i18n import tr, tr_mark
from helpers.units import Printed
from helpers.validate import first_line

try:
    import triton
    import triton.language as tl
except ImportError:  # macOS, Windows, or not installed: the chapter says so and goes on
    triton = None
    tl = SimpleNamespace(constexpr="constexpr")  # for the kernel's annotations; it never runs

#: triton.jit where Triton is installed, for the functions the backward kernels call (a kernel
#: calls only jitted functions); without Triton they stay plain and never run.
_jit = triton.jit if triton is not None else (lambda fn: fn)

#: Tile sizes for the compiled kernel (queries, keys), warps and pipeline stages per program:
#: 16-bit on Ampere and later, 16-bit before Ampere (a T4's 64 KiB of shared memory), float32
#: (twice the bytes per tile); and the smaller tiles the interpreter uses (it runs each
#: program in numpy, one at a time).
GPU_BLOCKS = {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 3}
GPU_BLOCKS_PRE_AMPERE = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2}
GPU_BLOCKS_FP32 = {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2}
INTERPRETER_BLOCKS = {"block_m": 16, "block_n": 16}


@_jit
def forward_tiles(q, m, ell, acc, rows, k_ptr, v_ptr, base, lo, hi, seq_len, qk_scale,  # noqa: ANN001, ANN202
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
                   CAUSAL: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """Merge the key tiles from lo to hi into one query tile's running m, l, acc; if MASK, hide keys past the end (and the future if CAUSAL) (chapter 8)."""
    cols = tl.arange(0, HEAD_DIM)
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        kv = base + keys[:, None] * HEAD_DIM + cols[None, :]
        k = tl.load(k_ptr + kv, mask=keys[:, None] < seq_len, other=0.0)
        v = tl.load(v_ptr + kv, mask=keys[:, None] < seq_len, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        if MASK:  # only the tiles on the diagonal or past the end: the others skip this
            hidden = keys[None, :] >= seq_len  # past the end
            if CAUSAL:
                hidden = hidden | (keys[None, :] > rows[:, None])  # the future
            s = tl.where(hidden, float("-inf"), s)
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        rescale = tl.math.exp2(m - m_new)  # how much the old running sums shrink
        ell = ell * rescale + tl.sum(p, 1)
        acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    return m, ell, acc


def flash_forward_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
    seq_len,
    scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr,
) -> None:
    """One program: BLOCK_M queries of one (batch, head) against their keys, BLOCK_N at a time (chapter 8).

    The key tiles wholly before the diagonal (causal) or wholly inside the sequence need no
    mask: they run first, unmasked; only the diagonal tiles and a last partial tile pay for
    it. BLOCK_M is a multiple of BLOCK_N, so the diagonal starts on a key tile's edge.
    """
    tile, bh = tl.program_id(0), tl.program_id(1)  # which query tile, which (batch, head)
    base = bh.to(tl.int64) * seq_len * HEAD_DIM  # q, k, v, out are contiguous (B, H, T, d)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)  # this tile's query positions
    cols = tl.arange(0, HEAD_DIM)
    tile_rows = base + rows[:, None] * HEAD_DIM + cols[None, :]  # their offsets in q and out
    q = tl.load(q_ptr + tile_rows, mask=rows[:, None] < seq_len, other=0.0)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running max of the scores, base 2
    ell = tl.zeros([BLOCK_M], tl.float32)  # running sum of exp2(s - m)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)  # running sum of exp2(s - m) @ v
    qk_scale = scale * 1.4426950408889634  # 1/sqrt(d) times log2(e): scores in base 2
    if CAUSAL:  # keys before the tile's first query: seen by every query of the tile
        full = tile * BLOCK_M
        end = tl.minimum(full + BLOCK_M, seq_len)  # no key after the tile's last query
    else:  # every whole key tile, then the last partial one
        full = (seq_len // BLOCK_N) * BLOCK_N
        end = seq_len
    m, ell, acc = forward_tiles(q, m, ell, acc, rows, k_ptr, v_ptr, base, 0, full, seq_len, qk_scale, HEAD_DIM, BLOCK_N, False, CAUSAL, PRECISION)  # fmt: skip
    m, ell, acc = forward_tiles(q, m, ell, acc, rows, k_ptr, v_ptr, base, full, end, seq_len, qk_scale, HEAD_DIM, BLOCK_N, True, CAUSAL, PRECISION)  # fmt: skip
    out = acc / ell[:, None]
    tl.store(out_ptr + tile_rows, out.to(out_ptr.dtype.element_ty), mask=rows[:, None] < seq_len)
    lse = (m + tl.math.log2(ell)) / 1.4426950408889634  # back to base e, as flash_forward's
    tl.store(lse_ptr + bh.to(tl.int64) * seq_len + rows, lse, mask=rows < seq_len)


#: The kernel wrapped by triton.jit when this module was imported: compiled for a GPU, or
#: interpreted if TRITON_INTERPRET=1 was set before triton was imported.
KERNEL = triton.jit(flash_forward_kernel) if triton is not None else None


def interpreting() -> bool:
    """True when Triton runs kernels in its interpreter (TRITON_INTERPRET=1 before the import) (chapter 8)."""
    return type(KERNEL).__name__ == "InterpretedFunction"


def triton_missing_reason() -> str:
    """Why `import triton` fails on this machine, in words (chapter 8)."""
    system = platform.system()
    if system in ("Darwin", "Windows"):
        return tr("Triton has no release for {system}; its kernels run on Linux only.").format(
            system=system
        )
    return tr(
        "the triton package is not installed (pip install triton; CUDA builds of torch bring it)."
    )


@dataclass
class TritonStatus(Printed):
    """Whether the Triton kernel can run on a device, how (compiled or interpreted) and why not (chapter 8)."""

    runs: bool
    mode: str  # "compiled", "interpreter" or "unavailable"
    reason: str
    version: str = ""

    def __str__(self) -> str:
        what = f"triton {self.version}: " if self.version else ""
        runs = tr("runs ({mode}); {reason}").format(mode=tr(self.mode), reason=self.reason)
        return what + (runs if self.runs else self.reason)


#: The modes of TritonStatus, translated where it is printed.
_MODES = (tr_mark("compiled"), tr_mark("interpreter"), tr_mark("unavailable"))
#: What _interpreter_fails says when the interpreted kernel ran but computed something else.
_DIFFERS = tr_mark("its output differs from flash_forward's")


@functools.cache
def _interpreter_fails() -> str:
    """'' if the interpreted kernel matches flash_forward on a tiny causal input, else why not (chapter 8)."""
    q = torch.randn(1, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    try:
        out, _ = triton_flash_forward(q, q, q, causal=True)
    except Exception as exc:  # e.g. triton 3.1's interpreter with numpy >= 2.3: int() of an array
        return f"{type(exc).__name__}: {first_line(exc)}"
    want, _ = flash_forward(q, q, q, causal=True)
    return "" if torch.allclose(out, want, atol=1e-5) else _DIFFERS


def _has_interpreter() -> bool:
    """Whether this Triton ships its interpreter (TRITON_INTERPRET), False without triton (chapter 8)."""
    try:
        return importlib.util.find_spec("triton.runtime.interpreter") is not None
    except ModuleNotFoundError:  # no triton at all (a stand-in module in tests)
        return False


def triton_status(device: str | torch.device) -> TritonStatus:
    """Can the kernel run for `device` here: compiled on a CUDA/ROCm GPU, interpreted on the CPU? (chapter 8)."""
    device = torch.device(device)
    if triton is None:
        return TritonStatus(False, "unavailable", triton_missing_reason())
    version = triton.__version__
    if interpreting():
        failed = _interpreter_fails()
        if failed:
            why = tr("the interpreter of this Triton failed a 16-token probe: {failed}").format(failed=tr(failed) if failed == _DIFFERS else failed)  # fmt: skip
            return TritonStatus(False, "unavailable", why, version)
        where = tr("no GPU") if device.type == "cpu" else tr("device {device}").format(device=device.type)  # fmt: skip
        return TritonStatus(True, "interpreter", tr("{where}: TRITON_INTERPRET=1, so Triton's interpreter runs the kernel on CPU tensors, in numpy (slow, for checking)").format(where=where), version)  # fmt: skip
    if device.type == "cuda":
        return TritonStatus(True, "compiled", tr("compiled for {gpu}").format(gpu=torch.cuda.get_device_name(device)), version)  # fmt: skip
    if not _has_interpreter():
        return TritonStatus(False, "unavailable", tr("this Triton has no interpreter (TRITON_INTERPRET)"), version)  # fmt: skip
    return TritonStatus(False, "unavailable", tr("triton was imported without TRITON_INTERPRET=1, so it compiles for GPUs, and there is none for this device. Set it before anything imports triton (restart the kernel, then run the chapter from the top)"), version)  # fmt: skip


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Clear errors for inputs the kernel does not take (chapter 8)."""
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(
            tr(
                "q, k and v must share one shape (batch, heads, sequence, head_dim); got "
                "{q}, {k}, {v}."
            ).format(q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape))
        )
    d = q.size(-1)
    if d < 16 or d & (d - 1):
        raise ValueError(
            tr("head_dim must be a power of two >= 16 for tl.dot, got {d}.").format(d=d)
        )
    if not (q.device == k.device == v.device) or not (q.dtype == k.dtype == v.dtype):
        raise ValueError(tr("q, k and v must be on one device, in one dtype."))


def gpu_blocks(q: torch.Tensor) -> dict[str, int]:
    """Tiles, warps and stages for the compiled kernel, by q's dtype and the GPU's generation (chapter 8)."""
    if q.dtype == torch.float32:
        return GPU_BLOCKS_FP32
    ampere = torch.version.hip is not None or torch.cuda.get_device_capability(q.device) >= (8, 0)
    return GPU_BLOCKS if ampere else GPU_BLOCKS_PRE_AMPERE


def triton_flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, **blocks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel: the attention output and each row's log-sum-exp, as flash_forward returns them (chapter 8)."""
    _check_inputs(q, k, v)
    if KERNEL is None:
        raise RuntimeError(tr("Triton cannot run here: {why}").format(why=triton_missing_reason()))
    interpret = interpreting()
    if interpret != (q.device.type == "cpu"):
        raise ValueError(
            tr(
                "q is on {device}, but {status}. The interpreter takes CPU tensors, a compiled "
                "kernel CUDA tensors."
            ).format(device=q.device, status=triton_status(q.device))
        )
    options = {**(INTERPRETER_BLOCKS if interpret else gpu_blocks(q)), **blocks}
    block_m, block_n = options.pop("block_m"), options.pop("block_n")
    if block_m % block_n:  # the unmasked key tiles must end where the diagonal begins
        raise ValueError(
            tr("block_m ({block_m}) must be a multiple of block_n ({block_n}).").format(
                block_m=block_m, block_n=block_n
            )
        )
    q, k, v = (x.contiguous() for x in (q, k, v))
    b, h, t, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(b, h, t, dtype=torch.float32, device=q.device)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"  # fp32 inputs: no TF32 rounding
    grid = (triton.cdiv(t, block_m), b * h)
    KERNEL[grid](
        q, k, v, out, lse, t, 1 / math.sqrt(d), HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n,
        CAUSAL=causal, PRECISION=precision, **({} if interpret else options),
    )  # fmt: skip
    return out, lse


#: The backward's tiles: each dK/dV program takes block_big keys and walks the queries
#: block_small at a time; each dQ program takes block_big queries and walks the keys
#: block_small at a time (block_big a multiple of block_small, so the diagonal is whole tiles).
#: Not yet tuned on a GPU: the sizes of Triton's fused-attention tutorial, halved for float32
#: (twice the bytes per tile) and before Ampere (a T4's 64 KiB of shared memory).
GPU_BACKWARD_BLOCKS = {"block_small": 32, "block_big": 128, "num_warps": 4, "num_stages": 3}
GPU_BACKWARD_BLOCKS_PRE_AMPERE = {"block_small": 32, "block_big": 64, "num_warps": 4, "num_stages": 2}  # fmt: skip
GPU_BACKWARD_BLOCKS_FP32 = {"block_small": 16, "block_big": 64, "num_warps": 4, "num_stages": 2}
INTERPRETER_BACKWARD_BLOCKS = {"block_small": 16, "block_big": 32}
#: Rows of O and dO per program of the D = rowsum(dO * O) kernel.
DELTA_BLOCK = 64


def delta_kernel(out_ptr, dout_ptr, delta_ptr, n_rows, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr) -> None:  # fmt: skip  # noqa: ANN001
    """D = rowsum(dO * O) in float32 for BLOCK rows of all (batch, head, position) rows (chapter 8)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    offsets = rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    o = tl.load(out_ptr + offsets, mask=rows[:, None] < n_rows, other=0.0).to(tl.float32)
    do = tl.load(dout_ptr + offsets, mask=rows[:, None] < n_rows, other=0.0).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(o * do, 1), mask=rows < n_rows)


@_jit
def _dkdv_tiles(dk, dv, k, v, keys, q_ptr, do_ptr, lse_ptr, delta_ptr, base, row_base, lo, hi,  # noqa: ANN001, ANN202
                seq_len, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                MASK: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """Add to one key tile's dK and dV the query tiles from lo to hi, masking the future if MASK (chapter 8).

    Query rows past seq_len load as zeros (q, dO, lse and D): their P is 1 but dO = 0 and
    dS = 0, so they add nothing, and only the causal diagonal needs a mask.
    """
    cols = tl.arange(0, HEAD_DIM)
    for start in range(lo, hi, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        qo = base + rows[:, None] * HEAD_DIM + cols[None, :]
        q = tl.load(q_ptr + qo, mask=rows[:, None] < seq_len, other=0.0)
        do = tl.load(do_ptr + qo, mask=rows[:, None] < seq_len, other=0.0)
        lse = tl.load(lse_ptr + row_base + rows, mask=rows < seq_len, other=0.0) * 1.4426950408889634  # fmt: skip
        delta = tl.load(delta_ptr + row_base + rows, mask=rows < seq_len, other=0.0)
        st = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale  # S^T, base 2
        pt = tl.math.exp2(st - lse[None, :])  # P^T recomputed from the forward's lse
        if MASK:
            pt = tl.where(keys[:, None] > rows[None, :], 0.0, pt)
        dv += tl.dot(pt.to(do.dtype), do, input_precision=PRECISION)
        dpt = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        dst = pt * (dpt - delta[None, :])  # dS^T = P^T * (dP^T - D)
        dk += tl.dot(dst.to(q.dtype), q, input_precision=PRECISION)
    return dk, dv


def dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, seq_len, scale,  # noqa: ANN001
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, PRECISION: tl.constexpr) -> None:  # fmt: skip
    """One program: dK and dV of BLOCK_N keys of one (batch, head), the queries BLOCK_M at a time (chapter 8)."""
    tile, bh = tl.program_id(0), tl.program_id(1)
    base = bh.to(tl.int64) * seq_len * HEAD_DIM
    row_base = bh.to(tl.int64) * seq_len
    keys = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, HEAD_DIM)
    kv = base + keys[:, None] * HEAD_DIM + cols[None, :]
    k = tl.load(k_ptr + kv, mask=keys[:, None] < seq_len, other=0.0)
    v = tl.load(v_ptr + kv, mask=keys[:, None] < seq_len, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    qk_scale = scale * 1.4426950408889634
    lo = 0
    if CAUSAL:  # earlier queries see none of these keys; the diagonal tiles need the mask
        lo = tile * BLOCK_N
        dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptr, do_ptr, lse_ptr, delta_ptr, base, row_base, lo, tl.minimum(lo + BLOCK_N, seq_len), seq_len, qk_scale, HEAD_DIM, BLOCK_M, True, PRECISION)  # fmt: skip
        lo = lo + BLOCK_N
    dk, dv = _dkdv_tiles(dk, dv, k, v, keys, q_ptr, do_ptr, lse_ptr, delta_ptr, base, row_base, lo, seq_len, seq_len, qk_scale, HEAD_DIM, BLOCK_M, False, PRECISION)  # fmt: skip
    tl.store(dk_ptr + kv, (dk * scale).to(dk_ptr.dtype.element_ty), mask=keys[:, None] < seq_len)
    tl.store(dv_ptr + kv, dv.to(dv_ptr.dtype.element_ty), mask=keys[:, None] < seq_len)


@_jit
def _dq_tiles(dq, q, do, lse, delta, rows, k_ptr, v_ptr, base, lo, hi, seq_len, qk_scale,  # noqa: ANN001, ANN202
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
              CAUSAL: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """Add to one query tile's dQ the key tiles from lo to hi; if MASK, hide keys past the end (and the future if CAUSAL) (chapter 8)."""
    cols = tl.arange(0, HEAD_DIM)
    for start in range(lo, hi, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        kv = base + keys[:, None] * HEAD_DIM + cols[None, :]
        k = tl.load(k_ptr + kv, mask=keys[:, None] < seq_len, other=0.0)
        v = tl.load(v_ptr + kv, mask=keys[:, None] < seq_len, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        p = tl.math.exp2(s - lse[:, None])
        if MASK:
            hidden = keys[None, :] >= seq_len
            if CAUSAL:
                hidden = hidden | (keys[None, :] > rows[:, None])
            p = tl.where(hidden, 0.0, p)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    return dq


def dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, seq_len, scale,  # noqa: ANN001
              HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, PRECISION: tl.constexpr) -> None:  # fmt: skip
    """One program: dQ of BLOCK_M queries of one (batch, head), the keys BLOCK_N at a time (chapter 8)."""
    tile, bh = tl.program_id(0), tl.program_id(1)
    base = bh.to(tl.int64) * seq_len * HEAD_DIM
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    qo = base + rows[:, None] * HEAD_DIM + cols[None, :]
    q = tl.load(q_ptr + qo, mask=rows[:, None] < seq_len, other=0.0)
    do = tl.load(do_ptr + qo, mask=rows[:, None] < seq_len, other=0.0)
    row_offsets = bh.to(tl.int64) * seq_len + rows
    lse = tl.load(lse_ptr + row_offsets, mask=rows < seq_len, other=0.0) * 1.4426950408889634
    delta = tl.load(delta_ptr + row_offsets, mask=rows < seq_len, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    qk_scale = scale * 1.4426950408889634
    if CAUSAL:  # key tiles wholly before the diagonal unmasked, the diagonal ones masked
        full = tile * BLOCK_M
        end = tl.minimum(full + BLOCK_M, seq_len)
    else:  # every whole key tile unmasked, the last partial one masked
        full = (seq_len // BLOCK_N) * BLOCK_N
        end = seq_len
    dq = _dq_tiles(dq, q, do, lse, delta, rows, k_ptr, v_ptr, base, 0, full, seq_len, qk_scale, HEAD_DIM, BLOCK_N, False, CAUSAL, PRECISION)  # fmt: skip
    dq = _dq_tiles(dq, q, do, lse, delta, rows, k_ptr, v_ptr, base, full, end, seq_len, qk_scale, HEAD_DIM, BLOCK_N, True, CAUSAL, PRECISION)  # fmt: skip
    tl.store(dq_ptr + qo, (dq * scale).to(dq_ptr.dtype.element_ty), mask=rows[:, None] < seq_len)


#: The backward's kernels, wrapped as KERNEL is.
DELTA_KERNEL = triton.jit(delta_kernel) if triton is not None else None
DKDV_KERNEL = triton.jit(dkdv_kernel) if triton is not None else None
DQ_KERNEL = triton.jit(dq_kernel) if triton is not None else None


def gpu_backward_blocks(q: torch.Tensor) -> dict[str, int]:
    """The backward's tiles, warps and stages, by q's dtype and head size and the GPU's generation (chapter 8).

    Compiled offline (triton.compile for sm_75 and sm_90, Triton 3.9), head_dim 128 needs
    about 82 KiB of shared memory per program in 16-bit and 86 KiB in float32 at these
    tiles: over a T4's 64 KiB, so before Ampere, and in float32, its key or query tile halves.
    """
    ampere = torch.version.hip is not None or torch.cuda.get_device_capability(q.device) >= (8, 0)
    if q.dtype == torch.float32:
        blocks = GPU_BACKWARD_BLOCKS_FP32
    else:
        blocks = GPU_BACKWARD_BLOCKS if ampere else GPU_BACKWARD_BLOCKS_PRE_AMPERE
    if q.size(-1) >= 128 and (q.dtype == torch.float32 or not ampere):
        blocks = {**blocks, "block_big": blocks["block_big"] // 2}
    return blocks


def triton_attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
    dout: torch.Tensor, causal: bool = False, **blocks: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """dq, dk, dv of attention from the forward's out and lse, by three Triton kernels (chapter 8).

    FlashAttention-2's backward (Dao 2023, Algorithm 2), in three launches: D = rowsum(dO * O);
    dK and dV with the key tiles outer (one program per key tile walks the queries it is seen
    by, so it owns its rows of dK and dV); and dQ by a second pass with the query tiles outer.
    The paper adds each key tile's share of dQ with atomics instead: one pass, but float32
    atomic adds to memory from every key tile, in an order that changes from run to run (dQ
    not bit-reproducible), and programs that write the same rows. The second pass recomputes
    S and dP (two more products per tile, 7 instead of 5) but every program writes its own
    rows once, deterministic and free of races (exercise 5's rule). P is rebuilt per tile from
    lse; only the tiles on the causal diagonal (and the last, partial key tile of dQ without
    causal) are masked. 16-bit inputs: P and dS are rounded to q's dtype before their products,
    as FlashAttention does, with float32 accumulators; float32 inputs use input_precision="ieee",
    no TF32, so tl.dot runs on the CUDA cores, not the tensor cores.
    """
    _check_inputs(q, k, v)
    if DQ_KERNEL is None:
        raise RuntimeError(tr("Triton cannot run here: {why}").format(why=triton_missing_reason()))
    interpret = interpreting()
    if interpret != (q.device.type == "cpu"):
        raise ValueError(
            tr("q is on {device}, but {status}.").format(
                device=q.device, status=triton_status(q.device)
            )
        )
    options = {**(INTERPRETER_BACKWARD_BLOCKS if interpret else gpu_backward_blocks(q)), **blocks}
    small, big = options.pop("block_small"), options.pop("block_big")
    if big % small:
        raise ValueError(
            tr("block_big ({big}) must be a multiple of block_small ({small}).").format(
                big=big, small=small
            )
        )
    q, k, v, out, dout = (x.contiguous() for x in (q, k, v, out, dout))
    lse = lse.contiguous().float()
    b, h, t, d = q.shape
    delta = torch.empty(b, h, t, dtype=torch.float32, device=q.device)
    DELTA_KERNEL[(triton.cdiv(b * h * t, DELTA_BLOCK),)](out, dout, delta, b * h * t, HEAD_DIM=d, BLOCK=DELTA_BLOCK)  # fmt: skip
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    grid = (triton.cdiv(t, big), b * h)
    meta = {"HEAD_DIM": d, "CAUSAL": causal, "PRECISION": "ieee" if q.dtype == torch.float32 else "tf32", **({} if interpret else options)}  # fmt: skip
    DKDV_KERNEL[grid](q, k, v, dout, lse, delta, dk, dv, t, 1 / math.sqrt(d), BLOCK_M=small, BLOCK_N=big, **meta)  # fmt: skip
    DQ_KERNEL[grid](q, k, v, dout, lse, delta, dq, t, 1 / math.sqrt(d), BLOCK_M=big, BLOCK_N=small, **meta)  # fmt: skip
    return dq, dk, dv


class TritonFlashAttention(torch.autograd.Function):
    """Attention whose forward and backward are Triton kernels: triton_flash_forward, triton_attention_backward (chapter 8)."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False):  # noqa: ANN001, ANN205
        out, lse = triton_flash_forward(q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, dout):  # noqa: ANN001, ANN205
        q, k, v, out, lse = ctx.saved_tensors
        return *triton_attention_backward(q, k, v, out, lse, dout, ctx.causal), None


def triton_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """Differentiable attention, forward and backward in Triton kernels (chapter 8)."""
    return TritonFlashAttention.apply(q, k, v, causal)
