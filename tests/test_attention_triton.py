"""helpers.attention_triton: the Triton forward equals the PyTorch tiles through the interpreter (on a
CPU; tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported), and triton_status says
what runs where and why not (chapter 8)."""

from __future__ import annotations

import importlib.util
from functools import partial

import pytest
import torch

import helpers.attention_triton as at
from helpers.attention_tiles import attention_and_grads, rounding_bound, worst_ratio
from helpers.flash_attention import flash_attention, flash_forward

CAN_RUN = at.triton_status("cpu").runs or torch.cuda.is_available()
needs_triton = pytest.mark.skipif(
    not CAN_RUN, reason=f"Triton cannot run its interpreter here: {at.triton_status('cpu')}"
)
DEVICE = torch.device("cpu" if at.interpreting() or not torch.cuda.is_available() else "cuda")


def inputs(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to(DEVICE, dtype) for _ in range(4)]


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(1, 2, 40, 16), (2, 1, 64, 32), (1, 1, 16, 16), (1, 1, 3, 16)])
def test_kernel_equals_the_pytorch_tiles_within_the_rounding_bound(shape, causal) -> None:
    q, k, v, _ = inputs(shape)
    (got, got_lse), (want, want_lse) = at.triton_flash_forward(q, k, v, causal), flash_forward(q, k, v, causal)  # fmt: skip
    bound = rounding_bound(q, k, v, torch.zeros_like(q), causal)["out"]
    assert ((got - want).abs().cpu().double() <= 2 * bound).all()
    assert got_lse.dtype == torch.float32 and got_lse.shape == q.shape[:-1]
    assert torch.allclose(got_lse, want_lse, rtol=0, atol=1e-5)


@needs_triton
def test_kernel_takes_sixteen_bit_inputs() -> None:
    q, k, v, _ = inputs((1, 2, 32, 16), torch.float16)
    out, _ = at.triton_flash_forward(q, k, v, True)
    assert out.dtype == torch.float16
    bound = rounding_bound(q, k, v, torch.zeros_like(q), True, rounded_to=torch.float16)["out"]
    want = flash_forward(q.double(), k.double(), v.double(), True)[0]
    assert ((out.double() - want).abs().cpu() <= bound).all()


@needs_triton
def test_triton_attention_gradients_are_the_tiles_own() -> None:
    q, k, v, dout = inputs((1, 2, 24, 16), seed=3)
    mine = attention_and_grads(partial(at.triton_attention, causal=True), q, k, v, dout)
    tiles = attention_and_grads(partial(flash_attention, causal=True), q, k, v, dout)
    assert max(worst_ratio(mine, tiles, rounding_bound(q, k, v, dout, True)).values()) <= 1


@pytest.mark.skipif(at.triton is None, reason="triton is not installed")
@pytest.mark.parametrize(
    ("shape", "words"),
    [
        ((1, 1, 8, 12), "power of two >= 16"),
        ((1, 1, 8, 8), "power of two >= 16"),
        ((8, 16), "share one shape"),
    ],  # fmt: skip
)
def test_bad_shapes_are_refused(shape, words) -> None:
    q = torch.zeros(shape)
    with pytest.raises(ValueError, match=None) as exc:
        at.triton_flash_forward(q, q, q)
    assert words in str(exc.value)


@pytest.mark.skipif(at.triton is None, reason="triton is not installed")
def test_mixed_dtypes_and_the_wrong_device_are_refused() -> None:
    q = torch.zeros(1, 1, 8, 16)
    with pytest.raises(ValueError, match="one device, in one dtype"):
        at.triton_flash_forward(q, q.double(), q)
    meta = torch.empty(1, 1, 8, 16, device="meta")
    with pytest.raises(ValueError, match="interpreter takes CPU tensors"):
        at.triton_flash_forward(meta, meta, meta)


def test_status_without_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(at, "triton", None)
    monkeypatch.setattr(at, "KERNEL", None)
    for system, words in (("Darwin", "no release for Darwin"), ("Windows", "no release for Windows"), ("Linux", "pip install triton")):  # fmt: skip
        monkeypatch.setattr(at.platform, "system", lambda s=system: s)
        status = at.triton_status("cpu")
        assert not status.runs and status.mode == "unavailable" and words in str(status)
    with pytest.raises(RuntimeError, match="Triton cannot run here"):
        at.triton_flash_forward(*(torch.zeros(1, 1, 8, 16) for _ in range(3)))


def test_status_with_a_compiling_triton(monkeypatch: pytest.MonkeyPatch, fake_gpu) -> None:
    if at.triton is None:
        monkeypatch.setattr(at, "triton", type("FakeTriton", (), {"__version__": "3.9.0"}))
    monkeypatch.setattr(at, "interpreting", lambda: False)
    gpu = fake_gpu("h100_sxm")
    status = at.triton_status(gpu.device)
    assert status.runs and status.mode == "compiled" and "H100" in str(status)
    cpu = at.triton_status("cpu")
    assert not cpu.runs and "without TRITON_INTERPRET=1" in cpu.reason and "restart" in cpu.reason
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert "no interpreter" in at.triton_status("cpu").reason


@pytest.mark.skipif(at.triton is None, reason="triton is not installed")
def test_status_of_a_failing_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(at, "interpreting", lambda: True)
    monkeypatch.setattr(at, "_interpreter_fails", lambda: "TypeError: only 0-dimensional arrays")
    status = at.triton_status("cpu")
    assert not status.runs and "failed a 16-token probe: TypeError" in str(status)
    monkeypatch.setattr(at, "_interpreter_fails", lambda: "")
    status = at.triton_status("mps")
    assert status.runs and status.mode == "interpreter" and "device mps" in str(status)


@needs_triton
def test_interpreter_probe_passes_here() -> None:
    if at.interpreting():
        assert at._interpreter_fails() == ""


@pytest.mark.skipif(at.triton is None, reason="triton is not installed")
def test_interpreter_probe_reports_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise TypeError("only 0-dimensional arrays can be converted to Python scalars")

    monkeypatch.setattr(at, "triton_flash_forward", broken)
    at._interpreter_fails.cache_clear()
    try:
        assert at._interpreter_fails() == "TypeError: only 0-dimensional arrays can be converted to Python scalars"  # fmt: skip
        monkeypatch.setattr(at, "triton_flash_forward", lambda q, k, v, causal: (q + 1, None))
        at._interpreter_fails.cache_clear()
        assert "differs" in at._interpreter_fails()
    finally:
        at._interpreter_fails.cache_clear()


@pytest.mark.parametrize(
    ("kind", "dtype", "blocks"),
    [
        ("h100_sxm", torch.bfloat16, at.GPU_BLOCKS),
        ("a100", torch.float16, at.GPU_BLOCKS),
        ("t4", torch.float16, at.GPU_BLOCKS_PRE_AMPERE),
        ("mi300x", torch.bfloat16, at.GPU_BLOCKS),
        ("h100_sxm", torch.float32, at.GPU_BLOCKS_FP32),
        ("t4", torch.float32, at.GPU_BLOCKS_FP32),
    ],
)
def test_gpu_blocks_by_dtype_and_generation(fake_gpu, kind, dtype, blocks) -> None:
    gpu = fake_gpu(kind)

    class OnTheGpu:  # the dtype and device of a tensor, without a kernel launch
        pass

    q = OnTheGpu()
    q.dtype, q.device = dtype, gpu.device
    assert at.gpu_blocks(q) == blocks


# --- the backward in Triton (issue 31, item 6) ---------------------------------------------------

#: Lengths that are not a multiple of the interpreter's tiles (16 and 32), one shorter than a tile.
BACKWARD_SHAPES = [(1, 2, 40, 16), (2, 1, 72, 32), (1, 1, 3, 16), (1, 1, 50, 64)]


def triton_results(q, k, v, dout, causal):
    """out, lse, dq, dk, dv of the Triton forward and backward, as attention_errors judges them."""
    leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    out = at.triton_attention(*leaves, causal)
    out.backward(dout)
    lse = at.triton_flash_forward(q, k, v, causal)[1]
    return {"out": out.detach(), "lse": lse, **{n: x.grad for n, x in zip(("dq", "dk", "dv"), leaves)}}  # fmt: skip


@needs_triton
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", BACKWARD_SHAPES)
# fp16, not bf16: Triton 3.9's interpreter mishandles bf16 on the CPU
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_backward_kernels_pass_the_float64_rule(shape, causal, dtype) -> None:
    from helpers.attention_errors import allowed_factor, error_ratios, judge_inputs

    q, k, v, dout = judge_inputs(shape, dtype, seed=sum(shape), device=DEVICE)
    ratios = error_ratios(triton_results(q, k, v, dout, causal), q, k, v, dout, causal)
    worst = {n: r["ratio"] for n, r in ratios.items() if n in ("dq", "dk", "dv")}
    assert max(worst.values()) <= allowed_factor(dtype), worst
    grads = triton_results(q, k, v, dout, causal)
    assert all(grads[n].dtype == dtype for n in ("dq", "dk", "dv"))


@needs_triton
def test_backward_is_triton_kernels_only() -> None:
    """No matrix product of torch's runs in the backward: every product is a tl.dot."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Products(TorchDispatchMode):
        ran: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("mm", "bmm", "matmul", "addmm", "baddbmm"):
                self.ran.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    q, k, v, dout = inputs((1, 1, 40, 16), seed=5)
    out, lse = at.triton_flash_forward(q, k, v, True)
    with Products() as watch:
        grads = at.triton_attention_backward(q, k, v, out, lse, dout, True)
    assert watch.ran == [] and len(grads) == 3


@needs_triton
def test_backward_blocks_must_nest() -> None:
    q, k, v, dout = inputs((1, 1, 40, 16))
    out, lse = at.triton_flash_forward(q, k, v)
    with pytest.raises(ValueError, match="multiple of block_small"):
        at.triton_attention_backward(q, k, v, out, lse, dout, block_small=32, block_big=48)


@pytest.mark.parametrize(
    ("kind", "dtype", "head_dim", "big", "small"),
    [
        ("h100_sxm", torch.bfloat16, 64, 128, 32),
        ("h100_sxm", torch.bfloat16, 128, 128, 32),
        ("t4", torch.float16, 64, 64, 32),
        ("t4", torch.float16, 128, 32, 32),  # 82 KiB of shared memory at 64: over a T4's 64 KiB
        ("h100_sxm", torch.float32, 64, 64, 16),
        ("h100_sxm", torch.float32, 128, 32, 16),
        ("mi300x", torch.bfloat16, 128, 128, 32),
    ],
)
def test_gpu_backward_blocks(fake_gpu, kind, dtype, head_dim, big, small) -> None:
    gpu = fake_gpu(kind)
    q = torch.empty(1, 1, 1, head_dim, device="meta", dtype=dtype)
    q_on_gpu = type("OnTheGpu", (), {"dtype": dtype, "device": gpu.device, "size": q.size})()
    blocks = at.gpu_backward_blocks(q_on_gpu)
    assert (blocks["block_big"], blocks["block_small"]) == (big, small)
    assert blocks["block_big"] % blocks["block_small"] == 0


@needs_triton
def test_exercise_5_refuses_the_chapters_own_backward() -> None:
    """The stretch exercise stays an exercise: calling the chapter's backward, by name, alias or module, fails."""
    from helpers.checks.ch08 import check_triton_backward

    def by_name(q, k, v, out, lse, dout, causal=False):
        return at.triton_attention_backward(q, k, v, out, lse, dout, causal)

    mine = at.triton_attention_backward

    def by_alias(q, k, v, out, lse, dout, causal=False):
        return mine(q, k, v, out, lse, dout, causal)

    table = {"bwd": at.triton_attention_backward}

    def through_a_dict(q, k, v, out, lse, dout, causal=False):
        return table["bwd"](q, k, v, out, lse, dout, causal)

    for answer in (by_name, by_alias, through_a_dict):
        result = check_triton_backward(answer)
        assert not result.passed, result.message
        assert "chapter's own Triton backward" in result.message, result.message


def test_forward_tiles_must_nest() -> None:
    # The forward runs the key tiles before the diagonal unmasked: that needs the query tile
    # to be a whole number of key tiles, or a key tile would cross the diagonal unmasked.
    q, k, v, _ = inputs((1, 1, 32, 16))
    with pytest.raises(ValueError, match="multiple of block_n"):
        at.triton_flash_forward(q, k, v, True, block_m=16, block_n=32)
