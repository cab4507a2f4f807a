"""helpers.attention_errors: correct kernels stay within the factor of plain PyTorch's error on
reruns (the calibration of ALLOWED_FACTOR), and every planted bug of the gallery fails (chapter 8)."""

from __future__ import annotations

import pytest
import torch

import helpers.attention_triton as at
from helpers.attention_errors import (
    GRADS_SHARE,
    JUDGED,
    OUT_SHARE,
    PLANTED_BUGS,
    PlantedBug,
    allowed_factor,
    bug_gallery,
    error_ratios,
    judge_inputs,
    kernel_results,
    lse_ratio,
    plant,
    tiles_pair,
    worst,
)
from helpers.attention_tiles import attention_and_grads
from helpers.flash_attention import BLOCK_Q, flash_attention, flash_backward, flash_forward

#: Lengths that are not a multiple of the tiles' 64 (nor of the interpreter's 16), and one that is.
SHAPES = [(1, 2, 200, 32), (1, 1, 37, 16), (2, 2, 100, 64), (1, 2, 128, 32)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def judged(attention, shape, dtype, causal, seed=0):
    q, k, v, dout = judge_inputs(shape, dtype, seed)
    return error_ratios(kernel_results(attention, q, k, v, dout, causal), q, k, v, dout, causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_the_tiles_pass_on_reruns(dtype, causal) -> None:
    """The calibration: 8 seeds x 4 shapes x causal or not, every result within the factor.

    On torch 2.13's CPU (2026-11-28) the worst were 3.65x PyTorch's error in float32 (dq),
    1.22x in bf16 and 1.57x in fp16; over a wider rerun (60 seeds x 5 shapes, the floor
    included) 5.75x in float32, where SDPA, also correct, reached 7.6x: hence 10 for float32.
    """
    for seed in range(8):
        for shape in SHAPES:
            name, ratio = worst(judged(tiles_pair(), shape, dtype, causal, seed))
            assert ratio <= allowed_factor(dtype), (shape, seed, name, ratio)


@pytest.mark.parametrize("bug", PLANTED_BUGS, ids=lambda b: b.name)
@pytest.mark.parametrize("seed", range(3))
def test_every_planted_bug_fails_the_check(bug: PlantedBug, seed: int) -> None:
    ratios = judged(bug.attention(), (1, 2, 200, 32), bug.dtype, True, seed)
    name, ratio = worst(ratios)
    assert ratio > 5 * allowed_factor(bug.dtype), (name, ratio)  # caught, by a margin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_late_mask_fails_in_both_dtypes_with_a_partial_last_tile(dtype) -> None:
    """Tile 2 whole, a partial tile after it. (At T = 67 tile 2 has 3 rows, each one key of
    about 65 off: in bf16 that can sit within the rounding, 1.9x PyTorch's error at seed 0.)"""
    bug = next(b for b in PLANTED_BUGS if b.name.startswith("mask one late"))
    for t in (2 * BLOCK_Q + 8, 3 * BLOCK_Q + 5):
        assert worst(judged(bug.attention(), (1, 2, t, 32), dtype, True))[1] > allowed_factor(dtype)


def test_the_late_mask_is_only_in_the_second_query_tile() -> None:
    bug = next(b for b in PLANTED_BUGS if b.name.startswith("mask one late"))
    q, k, v, _ = judge_inputs((1, 1, 200, 16), torch.float64)
    got, _ = bug.attention()(q, k, v, True)
    want, _ = flash_forward(q, k, v, True)
    wrong = (got - want).abs().amax(-1)[0, 0] > 1e-12
    rows = wrong.nonzero().flatten().tolist()
    assert rows and min(rows) >= BLOCK_Q and max(rows) < 2 * BLOCK_Q


def test_gallery_rows_say_caught() -> None:
    rows = bug_gallery()
    assert [r["planted bug"] for r in rows] == [b.name for b in PLANTED_BUGS]
    assert all(r["caught"] for r in rows)
    by_name = {r["planted bug"]: r for r in rows}
    # what the worst-case bound let through: D from a rounded O, in every result
    assert by_name["D from an fp16-rounded O"][GRADS_SHARE] < 1
    assert by_name["D from an fp16-rounded O"][OUT_SHARE] < 1


def test_the_pair_is_the_chapters_function() -> None:
    q, k, v, dout = judge_inputs((1, 2, 70, 16), torch.float64)
    mine = kernel_results(tiles_pair(), q, k, v, dout, True)
    theirs = attention_and_grads(lambda q, k, v: flash_attention(q, k, v, True), q, k, v, dout)
    assert all(torch.equal(mine[n], theirs[n]) for n in ("out", "dq", "dk", "dv"))
    assert torch.equal(mine["lse"], flash_forward(q, k, v, True)[1])
    assert set(mine) == set(JUDGED)


def test_plant_refuses_a_stale_line() -> None:
    with pytest.raises(ValueError, match="stale"):
        plant(flash_backward, "this line is not there", "x")
    with pytest.raises(ValueError, match="stale"):
        plant(flash_forward, 'float("-inf")', "0.0")  # more than once


def test_allowed_factor_judges_only_what_float64_can() -> None:
    assert allowed_factor(torch.bfloat16) == allowed_factor(torch.float16) == 2.0
    with pytest.raises(ValueError, match="float64"):
        allowed_factor(torch.float64)


def test_a_perfect_result_has_ratio_zero() -> None:
    q, k, v, dout = judge_inputs((1, 1, 20, 8), torch.float32)
    exact = kernel_results(tiles_pair(), *(x.double() for x in (q, k, v, dout)), True)
    ratios = error_ratios({n: t.float() for n, t in exact.items()}, q, k, v, dout, True)
    assert all(r["ratio"] <= 1 for r in ratios.values())  # rounded once: at most the floor


CAN_RUN = at.triton_status("cpu").runs or torch.cuda.is_available()
DEVICE = torch.device("cpu" if at.interpreting() or not torch.cuda.is_available() else "cuda")
#: The interpreter runs kernels in numpy, which has no bfloat16: bf16 is checked compiled only.
TRITON_DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])


@pytest.mark.skipif(not CAN_RUN, reason="Triton cannot run here")
@pytest.mark.parametrize("dtype", TRITON_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [True, False])
def test_the_triton_forward_passes(dtype, causal) -> None:
    pair = tiles_pair(forward=at.triton_flash_forward)
    for shape in [(1, 2, 40, 16), (1, 1, 72, 32)]:
        q, k, v, dout = (x.to(DEVICE) for x in judge_inputs(shape, dtype))
        ratios = error_ratios(kernel_results(pair, q, k, v, dout, causal), q, k, v, dout, causal)
        assert worst(ratios)[1] <= allowed_factor(dtype), (shape, ratios)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_lse_ratio_judges_the_lse_in_its_own_dtype(dtype) -> None:
    """The tiles return the lse in float32 for bf16 inputs: judged against float32's logsumexp."""
    q, k, v, _ = judge_inputs((1, 2, 200, 32), dtype)
    _, lse = flash_forward(q, k, v, True)
    assert lse.dtype == torch.float32
    assert lse_ratio(lse, q, k, True)["ratio"] <= allowed_factor(lse.dtype)
    assert lse_ratio(lse + 1e-4, q, k, True)["ratio"] > 5 * allowed_factor(lse.dtype)
