"""Negative and positive controls for chapter 7's same-math tolerance (64 x the noise floor).

Real bugs planted in the chapter's own Trainer (a tiny GPT on the CPU, 8 steps, the chapter's
training regime) must fail the check: attention without its causal mask, and the gradient
clipping dropped from the step. Levers that keep the math (SDPA for the written-out
attention, fused AdamW for the foreach one) must pass it. The planted bugs are caught by far
more than the tolerance (on torch 2.13's CPU build, 2026-11-27: the mask at step 1, 128x the
tolerance by step 7; the clipping from step 4, 9.8x by step 7), the levers stay within
1/64 of it (one loss ulp), so neither side rests on a tuned threshold.

What the check cannot see within these 8 steps is shown too, so nobody reads more into a
pass than it says: attention's scale 10% off, while the tiny model's initial attention is
nearly uniform (0.08x the tolerance).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from helpers.capstone import Levers, Trainer
from helpers.gpt import GPTConfig, text_bytes
from helpers.same_math import SAME_MATH_FACTOR, NoiseFloor, SameMath, noise_floor, same_math

TINY = GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=8)
TOKENS = text_bytes()[:3000]
STEPS = 8
REAL_SDPA = F.scaled_dot_product_attention


def make(levers: Levers = Levers(), **options: object) -> Trainer:
    """The chapter's Trainer of the tiny GPT: batch 4, 8 steps of batches."""
    return Trainer(
        TINY, levers, TOKENS, device="cpu", batch_size=4, interval=2, steps=STEPS, **options
    )


def reference(levers: Levers) -> tuple[list[float], NoiseFloor]:
    """The losses of `levers` and their noise floor (a rerun, and every weight one ulp up)."""
    trainer = make(levers)
    losses = trainer.losses(STEPS)
    runs = []
    for nudge in (False, True):
        trainer.restart(nudge=nudge)
        runs.append(trainer.losses(STEPS))
    return losses, noise_floor(levers.label(), losses, *runs)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread: the same sums in the same order on every machine that runs this."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def check(label: str, got: list[float], ref: tuple[list[float], NoiseFloor]) -> SameMath:
    """`got` against the reference losses, held to their noise floor."""
    losses, floor = ref
    return same_math(label, got, losses, floor, label)


def test_the_tolerance_is_64_times_the_floor() -> None:
    assert SAME_MATH_FACTOR == 64.0


def test_a_dropped_causal_mask_is_caught_at_the_first_step(monkeypatch: pytest.MonkeyPatch) -> None:
    ref = reference(Levers(sdpa=True))  # before the bug is planted
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, k, v, **kw: REAL_SDPA(q, k, v))
    bug = check("no causal mask", make(Levers(sdpa=True)).losses(STEPS), ref)
    assert bug.first_over == 1, str(bug)
    assert bug.worst[1] > 10, str(bug)  # far past the tolerance, not at its edge
    with pytest.raises(AssertionError):
        bug.check()


def test_dropped_gradient_clipping_is_caught_within_eight_steps() -> None:
    base = make()
    unclipped = make(regime=replace(base.regime, clip=math.inf))  # the clipping term dropped
    bug = check("no clipping", unclipped.losses(STEPS), reference(Levers()))
    assert bug.first_over is not None and bug.worst[1] > 4, str(bug)
    assert "past the tolerance from step" in bug.as_control()


@pytest.mark.parametrize(
    ("lever", "parent"),
    [(Levers(sdpa=True), Levers()), (Levers(fused_adamw=True), Levers())],
    ids=["sdpa", "fused_adamw"],
)
def test_levers_that_keep_the_math_stay_far_inside(lever: Levers, parent: Levers) -> None:
    kept = check(
        f"{lever.label()} vs {parent.label()}", make(lever).losses(STEPS), reference(parent)
    )
    assert kept.passed and kept.worst[1] <= 1 / 8, str(kept)  # 8 times inside, at least


def test_what_eight_steps_cannot_see(monkeypatch: pytest.MonkeyPatch) -> None:
    """Attention's scale 10% off, on a nearly uniform initial attention: below the tolerance."""

    def scaled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> torch.Tensor:
        return REAL_SDPA(q, k, v, **kw, scale=1.1 / math.sqrt(q.shape[-1]))

    ref = reference(Levers(sdpa=True))
    monkeypatch.setattr(F, "scaled_dot_product_attention", scaled)
    blind = check("scale x 1.1", make(Levers(sdpa=True)).losses(STEPS), ref)
    assert blind.first_over is None and "cannot tell" in blind.as_control()
