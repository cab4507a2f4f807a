"""Chapter 5 checkers fail typical wrong answers (solution/stub: test_exercise_checks.py)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from helpers.checks import FAIL
from helpers.checks import ch05 as checks
from helpers.sweeps import is_out_of_memory

from nbfiles import exercise_namespace

SOLUTIONS = exercise_namespace("solutions/05_memory_solutions.ipynb")


def fails(result, *words: str) -> bool:
    return result.status == FAIL and all(w in result.message for w in words)


# --- exercise 1: the training bill -----------------------------------------------------------


def bill_with(**overrides):
    def bill(model, batch_size):
        got = SOLUTIONS["training_bill"](model, batch_size)
        return {**got, **{k: f(model, batch_size, got) for k, f in overrides.items()}}

    return bill


def test_bill_forgetting_the_step_counters_fails() -> None:
    wrong = bill_with(optimizer_state=lambda m, b, got: 2 * got["parameters"])
    assert fails(checks.check_training_bill(wrong), "step counter")


def test_bill_counting_linear_outputs_too_fails() -> None:
    def extra(model, batch, got):
        outs = sum(batch * layer.out_features for layer in model if isinstance(layer, nn.Linear))
        return got["activations"] + 4 * outs

    assert fails(checks.check_training_bill(bill_with(activations=extra)), "activations", "meter")


def test_bill_with_one_adam_copy_or_missing_keys_fails() -> None:
    one_copy = bill_with(optimizer_state=lambda m, b, got: got["parameters"])
    assert checks.check_training_bill(one_copy).status == FAIL
    assert fails(checks.check_training_bill(lambda m, b: {"parameters": 0}), "lacks")


# --- exercise 2: gradient accumulation --------------------------------------------------------


def test_accumulation_without_scaling_fails() -> None:
    def unscaled(model, loss_fn, x, y, micro):
        model.zero_grad(set_to_none=True)
        for xb, yb in zip(x.split(micro), y.split(micro)):
            loss_fn(model(xb), yb).backward()

    assert fails(checks.check_accumulate_gradients(unscaled), "scale it before backward")


def test_accumulation_dividing_by_steps_fails_on_uneven_batches() -> None:
    def by_steps(model, loss_fn, x, y, micro):
        model.zero_grad(set_to_none=True)
        chunks = list(zip(x.split(micro), y.split(micro)))
        for xb, yb in chunks:
            (loss_fn(model(xb), yb) / len(chunks)).backward()

    assert fails(checks.check_accumulate_gradients(by_steps), "smaller", "len(micro-batch)")


def test_accumulation_keeping_old_gradients_fails() -> None:
    def no_zero(model, loss_fn, x, y, micro):
        for xb, yb in zip(x.split(micro), y.split(micro)):
            (loss_fn(model(xb), yb) * len(xb) / len(x)).backward()

    assert fails(checks.check_accumulate_gradients(no_zero), "old values")


def test_accumulation_on_the_whole_batch_fails() -> None:
    def whole(model, loss_fn, x, y, micro):
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()

    assert fails(checks.check_accumulate_gradients(whole), "micro_batch")


# --- exercise 3: checkpoint placement ---------------------------------------------------------


def test_checkpointing_every_block_fails() -> None:
    def each_block(model, x):
        h = x
        for block in model[:-1]:
            h = checkpoint(block, h, use_reentrant=False)
        return model[-1](h)

    assert fails(checks.check_forward_low_memory(each_block), "saves nothing")


def test_reentrant_checkpointing_loses_gradients() -> None:
    def reentrant(model, x):
        h = x
        for i in range(0, len(model) - 1, 2):
            h = checkpoint(model[i : i + 2], h, use_reentrant=True)
        return model[-1](h)

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert fails(checks.check_forward_low_memory(reentrant), "use_reentrant=False")


def test_changing_the_output_fails() -> None:
    assert fails(checks.check_forward_low_memory(lambda model, x: model(x) * 2), "differs")


# --- exercise 4: the max-batch search ---------------------------------------------------------


def test_linear_search_uses_too_many_probes() -> None:
    def linear(fits, limit):
        best = 0
        for b in range(1, limit + 1):
            if not fits(b):
                break
            best = b
        return best

    assert fails(checks.check_largest_batch(linear), "times")


def test_doubling_without_binary_search_fails() -> None:
    def doubling_only(fits, limit):
        if not fits(1):
            return 0
        b = 1
        while b * 2 <= limit and fits(b * 2):
            b *= 2
        return b

    assert fails(checks.check_largest_batch(doubling_only), "returned")


def test_never_trying_the_limit_fails() -> None:
    def off_by_one(fits, limit):
        return min(SOLUTIONS["largest_batch"](fits, limit), limit - 1)

    assert checks.check_largest_batch(off_by_one).status == FAIL


# --- exercise 5: surviving out-of-memory ------------------------------------------------------


def test_keeping_the_exception_keeps_the_tensors() -> None:
    errors = []

    def hoarder(step, batch):
        try:
            step(batch)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            errors.append(exc)
            return False
        return True

    assert fails(checks.check_safe_step(hoarder), "still alive")


def test_swallowing_every_error_fails() -> None:
    def swallow(step, batch):
        try:
            step(batch)
        except Exception:
            return False
        return True

    assert fails(checks.check_safe_step(swallow), "ValueError")


def test_letting_out_of_memory_escape_is_reported_not_raised() -> None:
    def naive(step, batch):
        step(batch)
        return True

    result = checks.check_safe_step(naive)
    assert result.status == FAIL and "RuntimeError" in result.message
    assert torch.ones(1).item() == 1
