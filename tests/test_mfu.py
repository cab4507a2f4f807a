"""helpers.mfu: FLOPs from FlopCounterMode, MFU arithmetic and its input checks, the reference peak."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import helpers.mfu as mfu_module
from helpers.matmul import MatmulSweep, achievable_rate, tf32_matmuls
from helpers.mfu import (
    MfuResult,
    Peak,
    count_flops,
    flops_by_op,
    measure_mfu,
    mfu,
    reference_peak,
)


def mlp_step(layers: int = 3, width: int = 64, batch: int = 8):
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    x = torch.randn(batch, width)

    def step() -> None:
        model(x).square().mean().backward()

    # forward + weight gradients for every layer, input gradients for all but the first
    return step, (layers + layers + layers - 1) * 2 * batch * width**2


def test_count_flops_matches_the_analytic_count() -> None:
    step, expected = mlp_step()
    assert count_flops(step) == expected


def test_the_4x2048_mlp_at_batch_512_is_47_2_gflop() -> None:
    # The REFERENCES figure, counted on the meta device so no memory or time is spent.
    model = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(4)]).to("meta")
    x = torch.randn(512, 2048, device="meta")
    flops = count_flops(lambda: model(x).sum().backward())
    assert flops == 11 * 2 * 512 * 2048**2 and round(flops / 1e9, 1) == 47.2


def test_flops_by_op_names_the_matmuls() -> None:
    step, expected = mlp_step()
    per_op = flops_by_op(step)
    assert set(per_op) == {"aten.addmm", "aten.mm"} and sum(per_op.values()) == expected


def test_count_flops_needs_a_function() -> None:
    with pytest.raises(TypeError, match="needs a function"):
        count_flops(42)


def test_mfu_arithmetic() -> None:
    assert mfu(47.2e9, 0.211, 378e9) == pytest.approx(0.5918, abs=1e-4)
    assert mfu(1, 1, 1) == 1.0


@pytest.mark.parametrize(
    ("flops", "seconds", "peak", "match"),
    [
        (1e9, 0.0, 1e12, "seconds must be a finite number of seconds > 0"),
        (1e9, -0.1, 1e12, "seconds must be"),
        (0, 0.1, 1e12, "flops must be"),
        (-5, 0.1, 1e12, "flops must be"),
        (1e9, 0.1, 0, "peak must be"),
        (1e9, float("nan"), 1e12, "seconds must be"),
        (1e9, float("inf"), 1e12, "seconds must be"),
        (1e9, "0.1", 1e12, "seconds must be a number"),
        (True, 0.1, 1e12, "flops must be a number"),
    ],
)
def test_mfu_rejects_bad_input(flops, seconds, peak, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        mfu(flops, seconds, peak)


def test_mfu_result_properties_and_text() -> None:
    result = MfuResult(flops=47_200_000_000, seconds=0.211, peak=Peak(378e9, "test", True))
    assert result.achieved == pytest.approx(47.2e9 / 0.211)
    assert result.mfu == pytest.approx(0.5918, abs=1e-4)
    assert "MFU 59.2% of the peak, 0.378 TFLOP/s (test)" in str(result)


def test_zero_time_mfu_result_raises_clearly() -> None:
    result = MfuResult(flops=10, seconds=0.0, peak=Peak(1e9, "test", True))
    with pytest.raises(ValueError, match="seconds must be"):
        _ = result.mfu


def search_result(rates: dict[int, float]) -> MatmulSweep:
    """What achievable_rate returns for square shapes n -> GFLOP/s."""
    rows = [{"m, k, n": (n, n, n), "GFLOP/s": r / 1e9} for n, r in rates.items()]
    return MatmulSweep(param="m, k, n", rows=rows, dtype="fp32", device="cpu")


def test_achievable_peak_measures_the_shapes_asked_and_checks_them() -> None:
    assert mfu_module.achievable_peak("cpu", shapes=[(64, 64, 64)]).flops > 0
    with pytest.raises(ValueError, match=r"Each shape must be \(m, k, n\)"):
        mfu_module.achievable_peak("cpu", shapes=[(64, 64)])


def test_reference_peak_on_cpu_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    rates = {32: 1e9, 64: 3e9}
    monkeypatch.setattr(mfu_module, "achievable_rate", lambda d, dev, s: search_result(rates))
    peak = reference_peak("cpu", shapes=[(32, 32, 32), (64, 64, 64)])
    assert peak.measured and peak.flops == 3e9 and "m=64, k=64, n=64" in peak.source
    with pytest.raises(ValueError, match="at least one"):
        reference_peak("cpu", shapes=())


def test_measure_mfu_end_to_end() -> None:
    step, expected = mlp_step()
    result = measure_mfu(step, "cpu", Peak(1e12, "test", True), min_run_time=0.05)
    assert result.flops == expected and result.seconds > 0
    assert 0 < result.mfu and math.isfinite(result.mfu)
    # the machine's state over the timed window comes with the MFU, and is printed with it
    assert result.machine is not None and result.machine.device == "cpu"
    assert str(result).splitlines()[-1] == str(result.machine)


def test_measure_mfu_without_flops_explains() -> None:
    x = torch.randn(100)
    with pytest.raises(ValueError, match="counted no FLOPs"):
        measure_mfu(lambda: x.relu(), "cpu", Peak(1e12, "test", True))


def test_measure_mfu_with_given_flops_does_not_count() -> None:
    calls = []
    result = measure_mfu(
        lambda: calls.append(1), "cpu", Peak(1e9, "test", True), min_run_time=0.01, flops=1000
    )
    assert result.flops == 1000 and len(calls) >= 4  # warm-up + at least 3 timed calls
    with pytest.raises(ValueError, match="counted no FLOPs"):
        measure_mfu(lambda: None, "cpu", Peak(1e9, "test", True), flops=0)


@pytest.mark.parametrize("measured", [True, False])
def test_mfu_above_100_percent_says_the_reference_is_wrong(measured: bool) -> None:
    result = MfuResult(flops=2_000_000_000, seconds=1.0, peak=Peak(1e9, "test", measured))
    assert result.mfu == pytest.approx(2.0)
    text = str(result)
    assert "MFU 200.0%" in text and "the reference is wrong, not the step" in text
    assert ("measure it again" in text) == measured


def test_mfu_below_100_percent_has_no_warning() -> None:
    assert "wrong" not in str(MfuResult(flops=10**9, seconds=2.0, peak=Peak(1e9, "test", True)))


def test_mfu_result_against_the_achievable_rate_too() -> None:
    result = MfuResult(
        flops=600_000_000_000,
        seconds=1e-3,
        peak=Peak(989e12, "datasheet dense bf16 peak", False),
        achievable=Peak(800e12, "best bf16 matmul measured here", True),
    )
    assert result.mfu == pytest.approx(600 / 989)
    text = str(result)
    assert "MFU 60.7% of the peak, 989 TFLOP/s (datasheet" in text
    assert "75.0% of the achievable rate, 800 TFLOP/s (best bf16 matmul" in text
    assert "achievable" not in str(MfuResult(1, 1.0, Peak(1.0, "x", True)))


def test_measure_mfu_passes_the_achievable_rate_on() -> None:
    step, _ = mlp_step()
    best = Peak(2e12, "best", True)
    result = measure_mfu(step, "cpu", Peak(4e12, "peak", False), min_run_time=0.02, achievable=best)
    assert result.achievable is best
    assert f"{2 * result.mfu:.1%} of the achievable rate" in str(result)


def test_achievable_peak_is_the_best_shape_of_the_mamf_search() -> None:
    peak = mfu_module.achievable_peak("cpu", torch.float32)
    assert peak.measured and peak.flops > 0
    assert "best fp32 matmul measured here, m=" in peak.source
    assert peak.source.count("(") == 0  # printed in brackets by Peak: none inside


def test_achievable_peak_says_when_nothing_was_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = MatmulSweep(param="m, k, n", rows=[], stopped="out of memory at m, k, n=(1, 1, 1)")
    monkeypatch.setattr(mfu_module, "achievable_rate", lambda dtype, device, shapes: empty)
    with pytest.raises(RuntimeError, match="No matmul shape could be measured on cpu"):
        mfu_module.achievable_peak("cpu")


@pytest.mark.parametrize("tf32", [False, True])
def test_achievable_peak_of_fp32_is_tf32_while_tf32_is_on(monkeypatch, tf32: bool) -> None:  # noqa: ANN001
    """reference_peak picks the TF32 datasheet figure then; the measured rate must match it."""
    asked = []

    def search(dtype, device, shapes):  # noqa: ANN001, ANN202
        asked.append(dtype)
        return achievable_rate(torch.float32, device, [(32, 32, 32)])

    monkeypatch.setattr(mfu_module, "achievable_rate", search)
    monkeypatch.setattr(mfu_module, "tf32_available", lambda device: True)
    with tf32_matmuls(tf32):
        peak = mfu_module.achievable_peak("cpu", torch.float32)
    assert asked == ["tf32" if tf32 else torch.float32] and peak.measured
    asked.clear()
    with tf32_matmuls(True):
        mfu_module.achievable_peak("cpu", torch.bfloat16)
    assert asked == [torch.bfloat16], "TF32 concerns fp32 matmuls only"
