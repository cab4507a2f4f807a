"""Chapter 1 checkers fail typical wrong answers (solution/stub: test_exercise_checks.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from helpers.checks import FAIL
from helpers.checks import ch01 as checks
from helpers.timing import BenchResult

from nbfiles import exercise_namespace

SOLUTIONS = exercise_namespace("solutions/01_devices_solutions.ipynb")


def test_checks_leave_course_device_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COURSE_DEVICE", "cpu")
    checks.check_pick_device(SOLUTIONS["my_pick_device"])
    assert os.environ["COURSE_DEVICE"] == "cpu"
    monkeypatch.delenv("COURSE_DEVICE")
    checks.check_pick_device(SOLUTIONS["my_pick_device"])
    assert "COURSE_DEVICE" not in os.environ


# --- exercise 1: typical wrong answers ------------------------------------------------------


def pick_ignores_override(prefer=None):
    return torch.device(prefer) if prefer else torch.device("cpu")


def pick_returns_string(prefer=None):
    return prefer or os.environ.get("COURSE_DEVICE") or "cpu"


def pick_env_beats_prefer(prefer=None):
    return torch.device(os.environ.get("COURSE_DEVICE") or prefer or "cpu")


def pick_empty_env_breaks(prefer=None):
    if prefer:
        return torch.device(prefer)
    if "COURSE_DEVICE" in os.environ:
        return torch.device(os.environ["COURSE_DEVICE"])
    return torch.device("cpu")


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (pick_ignores_override, "read os.environ"),
        (pick_returns_string, "return a torch.device"),
        (pick_env_beats_prefer, "must win"),
        (pick_empty_env_breaks, "Device string must not be empty"),
    ],
)
def test_pick_device_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_pick_device(wrong)
    assert result.status == FAIL and hint in result.message


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU-only answer is right on a CPU box")
def test_pick_device_cpu_only_answer_is_right_here() -> None:
    def cpu_unless_forced(prefer=None):
        return torch.device(prefer or os.environ.get("COURSE_DEVICE") or "cpu")

    assert checks.check_pick_device(cpu_unless_forced).passed


# --- exercise 2 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (lambda t, device: t.to(device), "returned t itself"),
        (lambda t, device: t.detach(), "shares memory"),
        (lambda t, device: t.clone(), "never moves"),
        (lambda t, device: t.to(device, torch.float64, copy=True), "keep the dtype"),
        (lambda t, device: t.tolist(), "return a tensor"),
    ],
)
def test_fresh_copy_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_fresh_copy(wrong)
    assert result.status == FAIL and hint in result.message


# --- exercise 3 ------------------------------------------------------------------------------


def evaluate_unfixed(model, inputs, labels):
    logits = model(inputs)
    loss = F.cross_entropy(logits, labels)
    probs = logits.softmax(dim=1)
    return loss, probs.numpy()


def evaluate_item_only(model, inputs, labels):
    logits = model(inputs)
    probs = logits.softmax(dim=1)
    return F.cross_entropy(logits, labels).item(), probs.detach().cpu().numpy()


def evaluate_fixed_device(model, inputs, labels):
    device = torch.device("cpu")  # assumes a device instead of asking the model
    logits = model(inputs.to(device))
    loss = F.cross_entropy(logits, labels.to(device))
    return loss.item(), logits.softmax(dim=1).detach().cpu().numpy()


def evaluate_forgets_labels(model, inputs, labels):
    device = next(model.parameters()).device
    logits = model(inputs.to(device))
    loss = F.cross_entropy(logits, labels)
    return loss.item(), logits.softmax(dim=1).detach().cpu().numpy()


def evaluate_wrong_math(model, inputs, labels):
    device = next(model.parameters()).device
    logits = model(inputs.to(device))
    loss = F.cross_entropy(logits, labels.to(device), reduction="sum")
    return loss.item(), logits.softmax(dim=0).detach().cpu().numpy()


def evaluate_returns_tensor(model, inputs, labels):
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(inputs.to(device))
        loss = F.cross_entropy(logits, labels.to(device))
    return loss, logits.softmax(dim=1).cpu().numpy()


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (evaluate_unfixed, "requires grad"),
        (evaluate_returns_tensor, "Python float"),
        (evaluate_item_only, "device mismatch"),
        (evaluate_fixed_device, "not to a fixed device"),
        (evaluate_forgets_labels, "inputs AND labels"),
        (evaluate_wrong_math, "mean cross-entropy"),
    ],
)
def test_evaluate_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_evaluate(wrong)
    assert result.status == FAIL and hint in result.message


def test_evaluate_with_the_raise_line_deleted_still_fails() -> None:
    source = "\n".join(
        line
        for line in _exercise_source("def evaluate").splitlines()
        if "raise NotImplementedError" not in line
    )
    namespace: dict = {}
    exec(source, namespace)
    assert checks.check_evaluate(namespace["evaluate"]).status == FAIL


def _exercise_source(start: str) -> str:
    import nbfiles
    from nbfiles import ROOT

    nb = nbfiles.read(ROOT / "exercises" / "01_devices_exercises.ipynb")
    return next(c.source for c in nb.cells if c.cell_type == "code" and start in c.source)


# --- exercise 4 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (lambda m, k, n, r: m * k * n / r.median / 1e9, "2 FLOPs"),
        (lambda m, k, n, r: 2 * m * k * n / r.median * 1e9, "you multiplied by 1e9"),
        (lambda m, k, n, r: 2 * m * k * n / r.median, "billion times too big"),
        (lambda m, k, n, r: 2 * m * k * n / (sum(r.times) / len(r.times)) / 1e9, "mean time"),
        (lambda m, k, n, r: 2 * m * k * n / r.times[0] / 1e9, "first time"),
        (lambda m, k, n, r: 2 * n**3 / r.median / 1e9, "m*n dot products"),
        (lambda m, k, n, r: "fast", "return a number"),
    ],
)
def test_achieved_gflops_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_achieved_gflops(wrong)
    assert result.status == FAIL and hint in result.message


def test_achieved_gflops_on_a_real_benchmark_is_positive() -> None:
    from helpers.timing import benchmark

    a, b = torch.randn(64, 32), torch.randn(32, 16)
    result = benchmark(torch.matmul, a, b, min_run_time=0.01)
    assert isinstance(result, BenchResult)
    assert SOLUTIONS["achieved_gflops"](64, 32, 16, result) > 0


# --- exercise 5 ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (lambda t: t.numpy(), "requires grad"),
        (lambda t: t.detach().numpy(), "bf16"),
        (lambda t: t.detach().cpu().float().numpy(), "keep the dtype"),
        (lambda t: t.detach().cpu().tolist(), "return a NumPy array"),
        (lambda t: np.atleast_1d(SOLUTIONS["to_numpy"](t)), "shape changed"),
    ],
)
def test_to_numpy_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_to_numpy(wrong)
    assert result.status == FAIL and hint in result.message


def test_to_numpy_that_changes_values_fails() -> None:
    def rounds(t: torch.Tensor) -> np.ndarray:
        t = t.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).round().numpy()

    result = checks.check_to_numpy(rounds)
    assert result.status == FAIL and "values" in result.message
