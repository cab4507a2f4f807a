"""Issue 31, chapter 8, round 4: exercise 5's check against the strict grader's round 31b answers.

/tmp/grader31b/REPORT.md, check_triton_backward, defects 1, 9 and 10. Accepted before: a backward
computed in PyTorch without a matrix product, or in NumPy, and only copied out by a Triton
kernel; the chapter's module copied under another name; D computed by program 0 and loaded by
the other programs of the same launch (a race on a GPU); tiles of 8 without boundary masks
(every probe length was a multiple of 8, and T = 41 corrupted the process's memory);
float64 gradients for float32 inputs; tl.dot at TF32. Refused with a vague hint: dQ added
atomically into torch.empty_like(q), a causal mask left out of the dK/dV kernel. The grader's
correct alternatives pass. The wrong answers are the grader's: its handwritten ones in
tests/ch08_round4_triton_answers.py, the others built as its make_ex5.py built them, from the
solution's cell with its replacements (copied below).
"""

from __future__ import annotations

import sys

import ch08_round4_triton_answers as handwritten
import pytest
import torch
from test_exercises_ch08 import RUNS, fails, solution_variant

from helpers.checks import ch08
from helpers.checks.ch08 import check_triton_backward

INTERPRETER = RUNS and not torch.cuda.is_available()
needs_triton = pytest.mark.skipif(not RUNS, reason="Triton cannot run here (not installed, or no interpreter)")  # fmt: skip
needs_interpreter = pytest.mark.skipif(not INTERPRETER, reason="the load and store watch needs Triton's interpreter")  # fmt: skip

# --- the grader's generated answers (/tmp/grader31b/make_ex5.py, its replacements verbatim) --------

LAUNCH = (
    "dk_dv_kernel[grid](q, k, v, dout, lse, delta, dk, dv, *args, **meta)\n"
    "    dq_kernel[grid](q, k, v, dout, lse, delta, dq, *args, **meta)"
)
GRADER = {
    "W_block8_no_masks": [
        ('block = 16 if q.device.type == "cpu" else 32', "block = 8"),
        (", mask=keys[:, None] < seq_len, other=0.0)", ")"),
        (", mask=rows[:, None] < seq_len, other=0.0)", ")"),
        (", mask=rows < seq_len, other=0.0)", ")"),
        (", mask=keys[:, None] < seq_len)", ")"),
        (", mask=rows[:, None] < seq_len)", ")"),
        (
            "hidden = (keys[None, :] >= seq_len) | (rows[:, None] >= seq_len)",
            "hidden = keys[None, :] < 0",
        ),
        ("hidden = keys[None, :] >= seq_len", "hidden = keys[None, :] < 0"),
    ],
    "W_atomic_dq_empty_not_zeroed": [
        ("dk_ptr, dv_ptr, seq_len", "dk_ptr, dv_ptr, dq_ptr, seq_len"),
        (
            '            dk += tl.dot(tl.trans(ds), q, input_precision="ieee")\n',
            '            dk += tl.dot(tl.trans(ds), q, input_precision="ieee")\n'
            '            tl.atomic_add(dq_ptr + qo, tl.dot(ds, k, input_precision="ieee") * scale, mask=rows[:, None] < seq_len)\n',
        ),
        (LAUNCH, "dk_dv_kernel[grid](q, k, v, dout, lse, delta, dk, dv, dq, *args, **meta)"),
    ],
    "W_delta_in_program0": [
        ("    dq_kernel[grid](q, k, v, dout, lse, delta, dq, *args, **meta)", ""),
        (
            "    delta = (dout * out.float()).sum(-1).contiguous()  # D = rowsum(dO * O)\n",
            "    delta = torch.empty(lse.shape, dtype=torch.float32)\n    o32 = out.float().contiguous()\n",
        ),
        (
            "    dk_dv_kernel[grid](q, k, v, dout, lse, delta, dk, dv, *args, **meta)",
            "    dq_kernel[grid](q, k, v, dout, lse, delta, dq, o32, *args, **meta)\n"
            "    dk_dv_kernel[grid](q, k, v, dout, lse, delta, dk, dv, *args, **meta)",
        ),
        (
            "def dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, seq_len, scale,",
            "def dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, o_ptr, seq_len, scale,",
        ),
        (
            "        rows = tile * BLOCK + tl.arange(0, BLOCK)\n        cols = tl.arange(0, HEAD_DIM)\n        qo = base",
            "        cols = tl.arange(0, HEAD_DIM)\n"
            "        if tile == 0:  # D for the whole (batch, head), once\n"
            "            for rs in range(0, seq_len, BLOCK):\n"
            "                r = rs + tl.arange(0, BLOCK)\n"
            "                off = base + r[:, None] * HEAD_DIM + cols[None, :]\n"
            "                o_ = tl.load(o_ptr + off, mask=r[:, None] < seq_len, other=0.0)\n"
            "                do_ = tl.load(do_ptr + off, mask=r[:, None] < seq_len, other=0.0)\n"
            "                tl.store(delta_ptr + bh * seq_len + r, tl.sum(o_ * do_, 1), mask=r < seq_len)\n"
            "        rows = tile * BLOCK + tl.arange(0, BLOCK)\n        qo = base",
        ),
    ],
    "W_grads_float64": [
        (
            "dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)",
            "dq, dk, dv = (torch.empty_like(x, dtype=torch.float64) for x in (q, k, v))",
        )
    ],
    "W_tf32_default": [(', input_precision="ieee"', "")],
    "C_grid_1d": [
        (
            "        tile, bh = tl.program_id(0), tl.program_id(1)\n",
            "        n_tiles = tl.cdiv(seq_len, BLOCK)\n        tile, bh = tl.program_id(0) % n_tiles, tl.program_id(0) // n_tiles\n",
        ),
        ("grid = (triton.cdiv(t, block), b * h)", "grid = (triton.cdiv(t, block) * b * h,)"),
    ],
    "C_delta_triton": [
        (
            "    @triton.jit\n    def dq_kernel",
            "    @triton.jit\n    def delta_kernel(o_ptr, do_ptr, d_ptr, n_rows, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):\n"
            "        r = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
            "        off = r[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]\n"
            "        o = tl.load(o_ptr + off, mask=r[:, None] < n_rows, other=0.0)\n"
            "        do = tl.load(do_ptr + off, mask=r[:, None] < n_rows, other=0.0)\n"
            "        tl.store(d_ptr + r, tl.sum(o * do, 1), mask=r < n_rows)\n\n"
            "    @triton.jit\n    def dq_kernel",
        ),
        (
            "    delta = (dout * out.float()).sum(-1).contiguous()  # D = rowsum(dO * O)\n",
            "    o32 = out.float().contiguous()\n    delta = torch.empty(lse.shape, dtype=torch.float32)\n"
            "    n_rows = delta.numel()\n    delta_kernel[(triton.cdiv(n_rows, 32),)](o32, dout, delta, n_rows, HEAD_DIM=q.size(-1), BLOCK=32)\n",
        ),
    ],
    "C_kT_pointer_load": [
        (
            "            k = tl.load(k_ptr + kv, mask=keys[:, None] < seq_len, other=0.0)\n"
            "            v = tl.load(v_ptr + kv, mask=keys[:, None] < seq_len, other=0.0)\n"
            '            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale\n',
            "            kvt = base + keys[None, :] * HEAD_DIM + cols[:, None]\n"
            "            kt = tl.load(k_ptr + kvt, mask=keys[None, :] < seq_len, other=0.0)\n"
            "            vt = tl.load(v_ptr + kvt, mask=keys[None, :] < seq_len, other=0.0)\n"
            "            k = tl.trans(kt)\n"
            '            s = tl.dot(q, kt, input_precision="ieee") * scale\n',
        ),
        (
            '            dp = tl.dot(do, tl.trans(v), input_precision="ieee")\n            dq +=',
            '            dp = tl.dot(do, vt, input_precision="ieee")\n            dq +=',
        ),
    ],
}


def graded(name: str):
    """The grader's answer `name`, built from the solution's cell as make_ex5.py built it."""
    return solution_variant(name, GRADER[name])


# --- kind 1: a backward with no Triton maths -------------------------------------------------------


@needs_triton
def test_a_backward_in_torch_without_a_product_copied_by_triton_is_refused() -> None:
    """Before: accepted (broadcast mul + sum runs no matmul op; a Triton kernel copied each gradient out)."""
    result = check_triton_backward(handwritten.W_torch_broadcast_then_triton_copy)
    assert fails(result, "torch computed mul of shape (1, 2, 40, 40, 16)", "T x T scores", "(tl.dot)"), result.message  # fmt: skip


@needs_interpreter
def test_a_backward_in_numpy_copied_by_triton_is_refused() -> None:
    """Before: accepted (NumPy is invisible to torch's dispatch; every element was stored by Triton)."""
    result = check_triton_backward(handwritten.W_numpy_then_triton_copy)
    assert fails(result, "the Triton kernels that computed dq (copy_kernel) ran 0 multiply-adds in tl.dot", "fewer than the 51200"), result.message  # fmt: skip


def numpy_then_copy_with_dummy_products(q, k, v, out, lse, dout, causal=False):
    """The grader's NumPy cheat, its copy kernel padded with products of zeros: the work, not the inputs."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        zero = tl.zeros([16, 16], tl.float32)
        waste = tl.zeros([16, 16], tl.float32)
        for _ in range(64):
            waste += tl.dot(zero, zero, input_precision="ieee")
        keep = tl.load(src_ptr + offs, mask=offs < n) + tl.sum(tl.sum(waste, 1), 0)
        tl.store(dst_ptr + offs, keep, mask=offs < n)

    grads = handwritten.W_numpy_then_triton_copy(q, k, v, out, lse, dout, causal)
    res = []
    for g in grads:
        o = torch.empty_like(q)
        copy_kernel[(triton.cdiv(g.numel(), 256),)](g, o, g.numel(), BLOCK=256)
        res.append(o)
    return tuple(res)


@needs_interpreter
def test_a_copy_kernel_padded_with_products_must_still_load_the_inputs() -> None:
    """The second rule of kind 1: enough tl.dot work is not enough, the kernels must read q, k, v, dO."""
    result = check_triton_backward(numpy_then_copy_with_dummy_products)
    assert fails(result, "never loaded 1280 of the 1280 elements of q", "tl.load"), result.message


@needs_interpreter
def test_the_chapters_module_copied_under_another_name_is_refused(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """Before: accepted (the run watch matched the chapter's file name). Its copy goes to tmp_path,
    not the system temp folder the suite must leave as it found it."""
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path))
    try:
        result = check_triton_backward(handwritten.W_chapter_module_copy)
    finally:
        sys.modules.pop("my_kernels_" + str(os.getpid()), None)
    assert fails(result, "a copy of the chapter's own Triton kernel", "under another name or from another file"), result.message  # fmt: skip


@needs_interpreter
def test_the_chapters_module_run_from_a_string_is_refused_by_its_bytecode(monkeypatch) -> None:  # noqa: ANN001
    """No file, no source to compare: the bytecode of the chapter's kernels gives the copy away."""
    import types

    import helpers.attention_triton as at

    module = types.ModuleType("copied_from_a_string")
    monkeypatch.setitem(sys.modules, module.__name__, module)  # its dataclasses look it up
    with open(at.__file__, encoding="utf-8") as f:
        exec(compile(f.read(), "<string>", "exec"), module.__dict__)  # noqa: S102 - the course's own module
    backward = module.__dict__["triton_attention_" + "backward"]
    result = check_triton_backward(lambda q, k, v, out, lse, dout, causal=False: backward(q, k, v, out, lse, dout, causal))  # fmt: skip
    assert fails(result, "a copy of the chapter's own Triton kernel"), result.message


# --- kind 2: a value one program stores and another loads ------------------------------------------


@needs_interpreter
def test_d_stored_by_program_0_and_loaded_by_the_others_is_a_race() -> None:
    """Before: accepted (the store watch saw two stores to one address only)."""
    result = check_triton_backward(graded("W_delta_in_program0"))
    assert fails(
        result,
        "elements were stored by one program of dq_kernel and loaded by another program of the same launch",
        "program (0, 0, 0) stored, program (1, 0, 0) loaded",
        "the timing itself it cannot see",
    ), result.message


# --- kind 3: a probe length no tile divides; out-of-range accesses stopped before they happen ----


@needs_interpreter
def test_tiles_of_8_without_masks_are_stopped_before_they_read_past_the_end() -> None:
    """Before: accepted (T = 40 and 64 are multiples of 8); T = 41 aborted the grader's process with
    'malloc(): corrupted top size'. The check now stops the kernel at its first access outside
    its tensors, and this process goes on: the solution passes right after."""
    result = check_triton_backward(graded("W_block8_no_masks"))
    assert fails(
        result,
        "[probe: shape (1, 2, 37, 16), causal=False]",
        "your kernel dk_dv_kernel loads from",
        "outside every tensor it was given",
        "Mask the last tile",
        "nothing was read",
    ), result.message
    assert check_triton_backward(solution_variant("after the unmasked one", [])).passed


@needs_interpreter
def test_stores_without_masks_are_stopped_before_they_write() -> None:
    """The loads masked, the stores not: at T = 40, tiles of 16, the last tile's store runs past."""
    unmasked = [(", mask=keys[:, None] < seq_len)", ")"), (", mask=rows[:, None] < seq_len)", ")")]
    result = check_triton_backward(solution_variant("unmasked stores", unmasked))
    assert fails(result, "your kernel dk_dv_kernel stores to", "outside every tensor", "tl.store(ptrs, value, mask=", "nothing was written"), result.message  # fmt: skip


if RUNS:  # module level: the interpreter rereads a kernel's source from its file
    import triton
    import triton.language as tl

    @triton.jit
    def store_32(x_ptr):
        tl.store(x_ptr + tl.arange(0, 32), 1.0)


@needs_interpreter
def test_the_recorder_refuses_a_store_past_the_end_before_it_writes() -> None:
    """x is the first 16 elements of a buffer of 64: the memory behind x must stay as it was."""
    buffer = torch.zeros(64)
    with ch08._triton_stores() as launches, pytest.raises(Exception, match="_OutsideArguments|store_32"):  # fmt: skip
        store_32[(1,)](buffer[:16])
    assert launches.outside == ("store", "store_32", (0, 0, 0), 16)
    assert not buffer.any(), "the store ran"


# --- kind 4: the gradients' dtype -------------------------------------------------------------------


@needs_triton
def test_float64_gradients_for_float32_inputs_are_refused() -> None:
    """Before: accepted (the values are right; the dtype was not checked)."""
    result = check_triton_backward(graded("W_grads_float64"))
    assert fails(result, "dq is torch.float64, but q is torch.float32", "torch.empty_like(q)"), result.message  # fmt: skip


# --- kind 5: TF32 -------------------------------------------------------------------------------------


@needs_interpreter
def test_tl_dot_at_tf32_is_refused() -> None:
    """Before: accepted, with 'it cannot check ... TF32 rounding (input_precision)' after the pass."""
    result = check_triton_backward(graded("W_tf32_default"))
    assert fails(result, "your kernel dk_dv_kernel called tl.dot", "at TF32 precision", 'input_precision="ieee"'), result.message  # fmt: skip


@needs_interpreter
def test_tl_dot_at_tf32x3_passes() -> None:
    """Three TF32 products per float32 product: float32's accuracy on a GPU, not TF32's."""
    result = check_triton_backward(solution_variant("tf32x3", [('input_precision="ieee"', 'input_precision="tf32x3"')]))  # fmt: skip
    assert result.passed, result.message


# --- kind 6: hints --------------------------------------------------------------------------------------


@needs_interpreter
def test_an_atomic_accumulator_that_was_not_zeroed_is_named() -> None:
    """Before: refused only when the allocator's memory was not zero, and then told 'only (batch,
    head) (0, 0) of (1, 2) are' or the dQ formula. New torch.empty tensors are now filled with
    garbage inside the check: refused every time, with the hint of the mistake."""
    result = check_triton_backward(graded("W_atomic_dq_empty_not_zeroed"))
    assert fails(
        result,
        "[probe: shape (1, 2, 40, 16), causal=False] dq is off by",
        "your kernels added into them with tl.atomic_add",
        "torch.zeros_like(q)",
    ), result.message


@needs_interpreter
def test_elements_no_kernel_wrote_are_named() -> None:
    """The same garbage shows a dQ launch of one query tile per (batch, head): before, whatever
    torch.empty_like's memory held, and the generic 'dQ = dS K / sqrt(d), ...'."""
    one_tile = [("    dq_kernel[grid](q, k,", "    dq_kernel[(1, b * h)](q, k,")]
    result = check_triton_backward(solution_variant("one dq tile", one_tile))
    assert fails(result, "dq is off by", "768 of its elements were never written by your kernels", "triton.cdiv(T, BLOCK)"), result.message  # fmt: skip


#: the learner's answer: the causal mask left out of the dK/dV kernel only
DKDV_WITHOUT_CAUSAL_MASK = [
    (
        "            if CAUSAL:\n"
        "                hidden = hidden | (keys[None, :] > rows[:, None])\n"
        "            p = tl.where(hidden, 0.0, tl.exp(s - lse[:, None]))\n"
        "            dv +=",
        "            p = tl.where(hidden, 0.0, tl.exp(s - lse[:, None]))\n            dv +=",
    )
]


@needs_interpreter
def test_a_causal_mask_left_out_of_the_dk_dv_kernel_is_named() -> None:
    """Before: 'dk is off by ...: dK = dS^T Q / sqrt(d), summed over every query tile ...' only."""
    result = check_triton_backward(solution_variant("no causal mask in dk_dv", DKDV_WITHOUT_CAUSAL_MASK))  # fmt: skip
    assert fails(
        result,
        "causal=True] dk is off by",
        "the probes without causal passed",
        "in dk_dv_kernel, the kernel that stores dk",
        "P must be 0 where key j > query i",
    ), result.message


# --- the grader's correct answers and the solution still pass ----------------------------------------


@needs_triton
@pytest.mark.parametrize("name", ["C_grid_1d", "C_delta_triton", "C_kT_pointer_load", "C_recompute_lse_triton", "solution"])  # fmt: skip
def test_the_graders_correct_answers_pass(name: str, capsys) -> None:  # noqa: ANN001
    if name == "solution":
        answer = solution_variant("solution", [])
    elif name in GRADER:
        answer = graded(name)
    else:
        answer = getattr(handwritten, name)
    result = check_triton_backward(answer)
    assert result.passed, result.message
    if INTERPRETER:
        assert "cannot check what only a GPU shows" in capsys.readouterr().out


@needs_interpreter
def test_after_a_pass_the_check_no_longer_says_it_cannot_see_tf32(capsys) -> None:  # noqa: ANN001
    """Before: '... it cannot check what only a GPU shows: the speed, TF32 rounding (input_precision), ...'."""
    assert check_triton_backward(solution_variant("solution", [])).passed
    out = capsys.readouterr().out
    assert "cannot check what only a GPU shows" in out and "TF32" not in out, out
    assert "the precision each tl.dot asked for" in out, out


# --- the second grader's round (issue 31): D through einsum, a pre-scaled q, dV scaled -------------

DELTA = "delta = (dout * out.float()).sum(-1).contiguous()"


@needs_triton
@pytest.mark.parametrize(
    "delta",
    [
        "delta = torch.einsum('bhtd,bhtd->bht', dout, out.float()).contiguous()",
        "delta = (dout.unsqueeze(-2) @ out.float().unsqueeze(-1)).flatten(-2).contiguous()",
        "delta = torch.linalg.vecdot(dout, out.float()).contiguous()",
    ],
    ids=["einsum", "batched dot", "vecdot"],
)
def test_d_may_be_computed_with_any_rowwise_product(delta: str) -> None:
    """Before: einsum and @ were refused by name, while the exercise lets PyTorch compute D."""
    result = check_triton_backward(solution_variant("D by a product", [(DELTA, delta)]))
    assert result.passed, result.message


@needs_triton
def test_a_product_that_is_not_rowwise_is_still_refused() -> None:
    """dQ = dS K in torch (a T x d result summed over T) is no row reduction."""
    cheat = (
        "delta = (dout * out.float()).sum(-1).contiguous()\n    _ = (q @ k.transpose(-2, -1)) @ v"
    )
    result = check_triton_backward(solution_variant("a torch product", [(DELTA, cheat)]))
    assert fails(result, "matmul"), result.message


@needs_triton
def test_dv_scaled_is_told_that_dv_takes_no_scale() -> None:
    """Before: 'dv has the 1/sqrt(d) scale twice', though dV = P^T dO takes none."""
    wrong = solution_variant("dv scaled", [("tl.store(dv_ptr + kv, dv,", "tl.store(dv_ptr + kv, dv * scale,")])  # fmt: skip
    result = check_triton_backward(wrong)
    assert fails(result, "dv takes no scale", "dV = P^T dO"), result.message
    assert "twice" not in result.message


@needs_triton
def test_a_q_scaled_in_torch_is_told_to_scale_in_the_kernel() -> None:
    """The rule: the kernels load q itself; the hint says so instead of "only copied"."""
    scaled = solution_variant(
        "q scaled in torch",
        [("    b, h, t, d = q.shape\n", "    b, h, t, d = q.shape\n    q = q * 1.0\n")],
    )
    result = check_triton_backward(scaled)
    assert fails(result, "never loaded", "scale inside the kernel"), result.message
