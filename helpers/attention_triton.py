"""The FlashAttention-2 forward as one Triton kernel: compiled for a GPU, or run on the CPU by
Triton's interpreter; its backward reuses the PyTorch recomputation (chapter 8).

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

from helpers.flash_attention import BLOCK_K, BLOCK_Q, flash_backward, flash_forward
from helpers.units import Printed
from helpers.validate import first_line

try:
    import triton
    import triton.language as tl
except ImportError:  # macOS, Windows, or not installed: the chapter says so and goes on
    triton = None
    tl = SimpleNamespace(constexpr="constexpr")  # for the kernel's annotations; it never runs

#: Tile sizes for the compiled kernel (queries, keys), warps and pipeline stages per program:
#: 16-bit on Ampere and later, 16-bit before Ampere (a T4's 64 KiB of shared memory), float32
#: (twice the bytes per tile); and the smaller tiles the interpreter uses (it runs each
#: program in numpy, one at a time).
GPU_BLOCKS = {"block_m": 128, "block_n": 64, "num_warps": 4, "num_stages": 3}
GPU_BLOCKS_PRE_AMPERE = {"block_m": 64, "block_n": 64, "num_warps": 4, "num_stages": 2}
GPU_BLOCKS_FP32 = {"block_m": 64, "block_n": 32, "num_warps": 4, "num_stages": 2}
INTERPRETER_BLOCKS = {"block_m": 16, "block_n": 16}


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
    """One program: BLOCK_M queries of one (batch, head) against their keys, BLOCK_N at a time (chapter 8)."""
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
    end = seq_len
    if CAUSAL:
        end = tl.minimum((tile + 1) * BLOCK_M, seq_len)  # no key after the tile's last query
    for start in range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        kv = base + keys[:, None] * HEAD_DIM + cols[None, :]
        k = tl.load(k_ptr + kv, mask=keys[:, None] < seq_len, other=0.0)
        v = tl.load(v_ptr + kv, mask=keys[:, None] < seq_len, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
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
        return f"Triton has no release for {system}; its kernels run on Linux only."
    return (
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
        return what + (f"runs ({self.mode}); {self.reason}" if self.runs else self.reason)


@functools.cache
def _interpreter_fails() -> str:
    """'' if the interpreted kernel matches flash_forward on a tiny causal input, else why not (chapter 8)."""
    q = torch.randn(1, 1, 16, 16, generator=torch.Generator().manual_seed(0))
    try:
        out, _ = triton_flash_forward(q, q, q, causal=True)
    except Exception as exc:  # e.g. triton 3.1's interpreter with numpy >= 2.3: int() of an array
        return f"{type(exc).__name__}: {first_line(exc)}"
    want, _ = flash_forward(q, q, q, causal=True)
    return "" if torch.allclose(out, want, atol=1e-5) else "its output differs from flash_forward's"


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
            return TritonStatus(False, "unavailable", f"the interpreter of this Triton failed a 16-token probe: {failed}", version)  # fmt: skip
        where = "no GPU" if device.type == "cpu" else f"device {device.type}"
        return TritonStatus(True, "interpreter", f"{where}: TRITON_INTERPRET=1, so Triton's interpreter runs the kernel on CPU tensors, in numpy (slow, for checking)", version)  # fmt: skip
    if device.type == "cuda":
        return TritonStatus(True, "compiled", f"compiled for {torch.cuda.get_device_name(device)}", version)  # fmt: skip
    if not _has_interpreter():
        return TritonStatus(False, "unavailable", "this Triton has no interpreter (TRITON_INTERPRET)", version)  # fmt: skip
    return TritonStatus(False, "unavailable", "triton was imported without TRITON_INTERPRET=1, so it compiles for GPUs, and there is none for this device. Set it before anything imports triton (restart the kernel, then run the chapter from the top)", version)  # fmt: skip


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Clear errors for inputs the kernel does not take (chapter 8)."""
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(
            f"q, k and v must share one shape (batch, heads, sequence, head_dim); got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}."
        )
    d = q.size(-1)
    if d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16 for tl.dot, got {d}.")
    if not (q.device == k.device == v.device) or not (q.dtype == k.dtype == v.dtype):
        raise ValueError("q, k and v must be on one device, in one dtype.")


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
        raise RuntimeError(f"Triton cannot run here: {triton_missing_reason()}")
    interpret = interpreting()
    if interpret != (q.device.type == "cpu"):
        raise ValueError(
            f"q is on {q.device}, but {triton_status(q.device)}. The interpreter takes CPU "
            "tensors, a compiled kernel CUDA tensors."
        )
    options = {**(INTERPRETER_BLOCKS if interpret else gpu_blocks(q)), **blocks}
    block_m, block_n = options.pop("block_m"), options.pop("block_n")
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


class TritonFlashAttention(torch.autograd.Function):
    """Forward: the Triton kernel; backward: flash_backward's PyTorch recomputation (chapter 8)."""

    @staticmethod
    def forward(ctx, q, k, v, causal=False):  # noqa: ANN001, ANN205
        out, lse = triton_flash_forward(q, k, v, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        return out

    @staticmethod
    def backward(ctx, dout):  # noqa: ANN001, ANN205
        q, k, v, out, lse = ctx.saved_tensors
        grads = flash_backward(q, k, v, out, lse, dout, ctx.causal, BLOCK_Q, BLOCK_K)
        return *(g.to(x.dtype) for g, x in zip(grads, (q, k, v))), None


def triton_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> torch.Tensor:
    """Differentiable attention whose forward is the Triton kernel (chapter 8)."""
    return TritonFlashAttention.apply(q, k, v, causal)
