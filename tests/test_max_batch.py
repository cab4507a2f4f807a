"""helpers.max_batch: surviving out-of-memory, and the doubling + binary search for the largest batch."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref

import pytest
import torch

from helpers.max_batch import (
    MaxBatchResult,
    find_max_batch,
    max_batch_before_oom,
    max_batch_under_budget,
    try_step,
)
from helpers.memory_bill import estimate_training_memory
from helpers.models import make_mlp, wide_mlp_sizes

MiB = 2**20
under = max_batch_under_budget


def mlp(width: int, depth: int) -> torch.nn.Sequential:
    """Chapter 5's MLP: `depth` blocks of Linear + ReLU, then a 10-way head."""
    return make_mlp(wide_mlp_sizes(width, depth, 10), blocks=True)


IMPOSSIBLE = 2**60  # 1 EiB: no machine can allocate it


@pytest.mark.parametrize("true_max", [1, 2, 3, 7, 100, 1000, 1024, 1025, 4095, 4096])
def test_find_max_batch_is_exact_and_logarithmic(true_max: int) -> None:
    calls: list[int] = []

    def fits(batch: int) -> bool:
        calls.append(batch)
        return batch <= true_max

    result = find_max_batch(fits, limit=4096)
    assert result.largest == true_max
    assert len(calls) <= 2 * 12 + 1
    assert all(1 <= b <= 4096 for b in calls)
    assert ("(the search limit; larger may fit too)" in str(result)) == (true_max == 4096)
    assert [p["batch"] for p in result.probes] == calls


def test_find_max_batch_respects_start_and_detail() -> None:
    result = find_max_batch(lambda b: (b <= 50, f"b={b}"), start=8, limit=100)
    assert result.largest == 50 and result.probes[0]["batch"] == 8
    assert result.probes[0]["detail"] == "b=8"
    assert "largest batch that fits: 50" in str(result)


def test_nothing_fits_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="Even batch size 1 does not fit: too big"):
        find_max_batch(lambda b: (False, "too big"))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"start": -1}, "start"),
        ({"start": 0}, "start"),
        ({"limit": 0}, "limit"),
        ({"start": 8, "limit": 4}, "must be >= start"),
    ],
)
def test_find_max_batch_rejects_bad_ranges(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        find_max_batch(lambda b: True, **kwargs)


def test_fits_must_answer_with_a_bool() -> None:
    with pytest.raises(TypeError, match="must return a bool"):
        find_max_batch(lambda b: "yes")
    with pytest.raises(TypeError, match="function of the batch size"):
        find_max_batch(42)


def test_budget_search_meter_and_estimate_agree_and_are_tight() -> None:
    model = mlp(256, 3)
    fixed = estimate_training_memory(model, 1, (256,), activation_bytes=0).total
    budget = fixed + 2 * MiB
    by_meter = max_batch_under_budget(model, (256,), budget, method="meter", limit=8192)
    by_estimate = max_batch_under_budget(model, (256,), budget, method="estimate", limit=8192)
    assert isinstance(by_meter, MaxBatchResult)
    assert by_meter.largest == by_estimate.largest
    per_sample = 4 * 256 * 4  # the input and three ReLU outputs, fp32
    assert by_meter.largest == 2 * MiB // per_sample
    best = by_meter.largest
    assert fixed + estimate_training_memory(model, best, (256,)).activations <= budget
    assert fixed + estimate_training_memory(model, best + 1, (256,)).activations > budget


def test_checkpointing_and_precision_raise_the_max_batch() -> None:
    model = mlp(128, 4)
    fixed = estimate_training_memory(model, 1, (128,), activation_bytes=0).total
    budget = fixed + MiB
    plain = max_batch_under_budget(model, (128,), budget, method="estimate").largest
    ckpt = max_batch_under_budget(
        model, (128,), budget, method="estimate", checkpoint_every=2
    ).largest
    assert ckpt > plain


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: under(mlp(8, 1), (8,), 0), ValueError, "budget_bytes must be > 0"),
        (lambda: under(mlp(8, 1), (8,), -5), ValueError, "must be > 0"),
        (lambda: under(mlp(8, 1), (8,), "1GB"), ValueError, "number of bytes"),
        (lambda: under(torch.nn.ReLU(), (8,), 10**9), ValueError, "has no parameters"),
        (lambda: under(mlp(8, 1), (8,), 10**9, method="guess"), ValueError, "meter"),
        (lambda: under(mlp(64, 1), (64,), 1000), ValueError, "The model alone needs"),
        (lambda: max_batch_before_oom(lambda b: None, "cpu"), ValueError, "OOM killer"),
        (lambda: max_batch_before_oom(3, "cuda"), TypeError, "function of the batch size"),
        (lambda: try_step("not callable"), TypeError, "function to call"),
    ],
)
def test_bad_input_gets_a_clear_error(call, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_impossible_allocation_gives_a_clear_message_not_a_crash() -> None:
    outcome = try_step(torch.empty, IMPOSSIBLE, dtype=torch.uint8)
    assert not outcome.ok and outcome.value is None
    assert outcome.message.startswith("Out of memory in torch.empty: tried to allocate")
    assert "1.00 EiB" in outcome.message and "smaller batch" in outcome.message
    assert torch.ones(4).sum().item() == 4  # the process goes on


def test_try_step_frees_what_the_failed_call_held() -> None:
    seen = {}

    def failing_step(batch: int) -> None:
        held = torch.ones(batch, 64)
        seen["ref"] = weakref.ref(held)
        torch.empty(IMPOSSIBLE, dtype=torch.uint8)

    assert not try_step(failing_step, 128).ok
    gc.collect()
    assert seen["ref"]() is None


def test_try_step_passes_values_and_real_bugs_through() -> None:
    assert try_step(lambda a, b=1: a + b, 2, b=3).value == 5
    with pytest.raises(ZeroDivisionError):
        try_step(lambda: 1 / 0)


def test_real_out_of_memory_means_does_not_fit(fake_gpu) -> None:
    fake_gpu("t4")  # the search refuses the CPU; the step's OOM is the CPU allocator's, for real

    def step(batch: int) -> None:
        torch.empty(IMPOSSIBLE if batch > 20 else batch, dtype=torch.uint8)

    result = max_batch_before_oom(step, "cuda", limit=64)
    assert result.largest == 20 and result.probes[-1]["detail"].startswith("Out of memory in step")


def test_the_interpreter_survives_an_impossible_allocation() -> None:
    code = (
        "import torch\n"
        "from helpers.max_batch import try_step\n"
        "o = try_step(torch.empty, 2**60, dtype=torch.uint8)\n"
        "print(o.ok, torch.ones(2).sum().item())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "2.0"]
