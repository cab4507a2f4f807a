"""helpers.same_math: loss curves compared step by step against a noise floor (chapter 7)."""

from __future__ import annotations

import math

import pytest

from helpers.same_math import (
    SAME_MATH_FACTOR,
    NoiseFloor,
    SameMath,
    check_not_run,
    loss_gaps,
    loss_ulp,
    noise_floor,
    same_math,
)


def test_loss_ulp_is_float32_spacing() -> None:
    assert loss_ulp(1.0) == 2**-23
    assert loss_ulp(5.5) == 2**-21  # in [4, 8): 4 x 2^-23
    assert loss_ulp(3.9) == 2**-22
    assert loss_ulp(0.0) > 0  # the smallest subnormal: still a floor above zero


def test_loss_gaps_and_length_mismatch() -> None:
    assert loss_gaps([1.0, 2.5], [1.5, 2.0]) == [0.5, 0.5]
    with pytest.raises(ValueError, match="2 and 3 steps"):
        loss_gaps([1.0, 2.0], [1.0, 2.0, 3.0])


def test_noise_floor_is_the_running_max_of_rerun_nudge_and_ulp() -> None:
    losses = [5.5, 5.0, 4.0, 3.9]
    rerun = [5.5, 5.0, 4.0 + 1e-5, 3.9]
    nudged = [5.5, 5.0 + 4e-6, 4.0, 3.9]
    floor = noise_floor("base", losses, rerun, nudged)
    assert isinstance(floor, NoiseFloor) and floor.steps == 4
    ulp = loss_ulp(5.5)
    assert floor.per_step[0] == ulp  # both gaps 0: the loss's own ulp
    assert floor.per_step[1] == pytest.approx(4e-6, rel=1e-3)
    assert floor.per_step[2] == pytest.approx(1e-5, rel=1e-3)
    assert floor.per_step[3] == floor.per_step[2]  # a floor does not fall back
    text = str(floor)
    assert (
        text.startswith("noise floor of base over 4 steps")
        and "rerun differs by up to 1.0e-05" in text
    )


def test_noise_floor_refuses_a_diverged_run() -> None:
    with pytest.raises(ValueError, match="finite losses"):
        noise_floor("x", [1.0, math.nan], [1.0, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="finite losses"):
        noise_floor("x", [], [], [])


def floor_of(losses: list[float]) -> NoiseFloor:
    """A floor whose rerun and nudge are exact: the loss's ulp at each step."""
    return noise_floor("base", losses, list(losses), list(losses))


def test_same_math_passes_within_64_floors_and_fails_beyond() -> None:
    base = [5.5, 5.2, 5.0]
    floor = floor_of(base)
    ulp = loss_ulp(5.5)
    close = same_math("lever vs base", [5.5, 5.2 + 3 * ulp, 5.0], base, floor)
    assert close.checked and close.passed and close.check() is close
    assert close.tolerance == [SAME_MATH_FACTOR * ulp] * 3
    assert close.worst == (2, pytest.approx(3 / 64))
    assert close.verdict().startswith("lever vs base: same math over 3 steps (largest gap")
    identical = same_math("resident vs baseline", base, base, floor)
    assert identical.passed and identical.verdict() == (  # not "0x the tolerance" (learner 32)
        "resident vs baseline: bit-identical over 3 steps (every gap is 0)"
    )
    assert str(identical).splitlines()[1:3] == [
        "  step             1       2       3",
        "  gap        0.0e+00 0.0e+00 0.0e+00",
    ]
    far = same_math("bug vs base", [5.5, 5.2, 5.0 + 100 * ulp], base, floor, "a bug")
    assert not far.passed and far.worst[0] == 3
    assert "DIFFERENT: at step 3 the gap is 1.56x the tolerance" in far.verdict()
    with pytest.raises(AssertionError, match="DIFFERENT") as exc:
        far.check()
    assert "tolerance" in str(exc.value) and "step " in str(exc.value)  # the per-step table


def test_same_math_not_checked_prints_the_gaps() -> None:
    rounding = same_math("amp vs base", [5.5, 5.3], [5.5, 5.2], None, "rounding changed by amp")
    assert not rounding.checked and rounding.passed and rounding.tolerance == []
    assert rounding.verdict() == (
        "amp vs base: rounding changed by amp; largest gap over 2 steps 1.0e-01 (not checked)"
    )
    lines = str(rounding).splitlines()
    assert lines[1].split() == ["step", "1", "2"] and lines[2].startswith("  gap ")
    assert len(lines) == 3  # no tolerance row


def test_same_math_shows_every_step_up_to_sixteen() -> None:
    base = [5.0] * 20
    check = same_math("x", base, base, floor_of(base))
    text = str(check)
    assert text.splitlines()[1].split()[-1] == "16" and "... 4 more steps" in text
    empty = SameMath("compile", [], None, "skipped: left out")
    assert empty.passed and empty.verdict().startswith("compile: skipped: left out")


def test_floor_must_cover_the_compared_steps() -> None:
    with pytest.raises(ValueError, match="covers 2 steps and the curves 3"):
        same_math("x", [1.0] * 3, [1.0] * 3, floor_of([1.0, 1.0]))


def test_a_check_that_could_not_run_fails_with_its_reason() -> None:
    """A lever that must keep the math is not passed because its check could not run."""
    missing = check_not_run("sdpa vs baseline", "RuntimeError: CUDA out of memory")
    assert not missing.passed and missing.error == "RuntimeError: CUDA out of memory"
    assert (
        str(missing)
        == missing.verdict()
        == (
            "sdpa vs baseline: NOT CHECKED, and this lever must keep the math: the check could not "
            "run (RuntimeError: CUDA out of memory)"
        )
    )
    with pytest.raises(AssertionError, match="CUDA out of memory"):
        missing.check()
    assert not check_not_run("x", "").passed  # no reason given is still no check


def test_first_over_and_the_negative_control_line() -> None:
    base = [5.5, 5.2, 5.0, 4.8]
    floor = floor_of(base)
    ulp = loss_ulp(5.5)
    drift = same_math("lr x 1.001 vs base", [5.5, 5.2, 5.0 + 100 * ulp, 4.8 + 400 * ulp], base,
                      floor, "a learning rate 0.1% larger")  # fmt: skip
    assert drift.first_over == 3 and drift.worst[0] == 4
    assert drift.as_control() == (
        "lr x 1.001 vs base: past the tolerance from step 3 of 4 (worst: step 4, 6.25x the "
        "tolerance, 64 x the noise floor): the check sees a learning rate 0.1% larger"
    )
    tiny = same_math("lr x 1.0001 vs base", base, base, floor, "a learning rate 0.01% larger")
    assert tiny.first_over is None
    assert tiny.as_control() == (  # every gap 0: no "closest at 0x the tolerance" (learner 32)
        "lr x 1.0001 vs base: bit-identical over all 4 steps (every gap is 0): this check cannot "
        "tell a learning rate 0.01% larger from this device's noise"
    )
    near = same_math("lr x 1.00001 vs base", [5.5, 5.2, 5.0, 4.8 + ulp], base, floor, "a nudge")
    assert near.first_over is None and near.as_control().startswith(
        "lr x 1.00001 vs base: within the tolerance over all 4 steps (closest at step 4, "
    )
    with pytest.raises(ValueError, match="needs a noise floor"):
        same_math("amp", base, base, None, "rounding").as_control()
