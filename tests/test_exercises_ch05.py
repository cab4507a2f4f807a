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

    result = checks.check_forward_low_memory(each_block)
    assert fails(result, "saves nothing", "activation bytes stayed at 0.44 MiB (no cut)")
    assert "went from" not in result.message  # not "from 0.44 MiB to 0.44 MiB" (learner 32)


def test_checkpointing_too_little_says_how_much_it_cut() -> None:
    def first_pair(model, x):
        return model[2:](checkpoint(model[:2], x, use_reentrant=False))

    result = checks.check_forward_low_memory(first_pair)
    assert fails(result, "activation bytes went from 0.44 MiB to ", "at least a cut of 40%")


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

    # the first probe that catches it: a shape bug (a RuntimeError, not out-of-memory) swallowed
    assert fails(checks.check_safe_step(swallow), "swallowed")


def test_swallowing_everything_but_runtime_errors_still_fails() -> None:
    def swallow_other(step, batch):
        from helpers.sweeps import is_out_of_memory

        try:
            step(batch)
        except RuntimeError as exc:
            if is_out_of_memory(exc):
                return False
            raise
        except Exception:  # a ValueError is a bug too, and it is swallowed here
            return False
        return True

    assert fails(checks.check_safe_step(swallow_other), "ValueError")


def test_letting_out_of_memory_escape_is_reported_not_raised() -> None:
    def naive(step, batch):
        step(batch)
        return True

    result = checks.check_safe_step(naive)
    assert result.status == FAIL and "RuntimeError" in result.message
    assert torch.ones(1).item() == 1


# --- new wrong answers of each kind (issue 16) and other correct styles --------------------


def test_accumulation_with_one_backward_on_the_summed_loss_fails() -> None:
    def all_forwards_first(model, loss_fn, x, y, micro):
        model.zero_grad(set_to_none=True)
        total = sum(
            loss_fn(model(xb), yb) * len(xb) / len(x)
            for xb, yb in zip(x.split(micro), y.split(micro))
        )
        total.backward()

    assert fails(
        checks.check_accumulate_gradients(all_forwards_first), "forwards before a backward"
    )


def test_accumulation_that_steps_fails() -> None:
    def steps(model, loss_fn, x, y, micro):
        model.zero_grad(set_to_none=True)
        for xb, yb in zip(x.split(micro), y.split(micro)):
            (loss_fn(model(xb), yb) * len(xb) / len(x)).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.0 * p.grad + 1e-3

    assert fails(checks.check_accumulate_gradients(steps), "no optimizer step")


def test_accumulation_other_correct_style_passes() -> None:
    def by_index(model, loss_fn, x, y, micro):
        for p in model.parameters():
            p.grad = None
        n = x.shape[0]
        for start in range(0, n, micro):
            xb, yb = x[start : start + micro], y[start : start + micro]
            loss = loss_fn(model(xb), yb)
            (loss * xb.shape[0] / n).backward()

    assert checks.check_accumulate_gradients(by_index).passed


def test_search_that_assumes_a_power_of_two_limit_fails() -> None:
    def doubling_past_limit(fits, limit):
        if not fits(1):
            return 0
        good = 1
        while good < limit and fits(2 * good):
            good *= 2
        bad = 2 * good
        while bad - good > 1:
            mid = (good + bad) // 2
            if fits(mid):
                good = mid
            else:
                bad = mid
        return min(good, limit)

    assert fails(checks.check_largest_batch(doubling_past_limit), "outside 1..")


def test_checkpointing_that_rewires_the_model_fails() -> None:
    from torch.utils.checkpoint import checkpoint

    def rewires(model, x):
        class Seg(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, h):
                return checkpoint(self.inner, h, use_reentrant=False)

        if not isinstance(model[0], Seg):
            blocks = list(model)
            for i in range(0, len(blocks) - 1, 2):
                model[i] = Seg(torch.nn.Sequential(*blocks[i : i + 2]))
                model[i + 1] = torch.nn.Identity()
        return model(x)

    assert fails(checks.check_forward_low_memory(rewires), "changed the caller's model")


# --- training_bill: bias-free and one-Linear MLPs, the caller's model untouched (issue 16) -----


def bill_two_tensors_per_linear(model, batch_size):
    got = SOLUTIONS["training_bill"](model, batch_size)
    linears = sum(isinstance(m, nn.Linear) for m in model)
    params = got["parameters"]
    return {**got, "optimizer_state": 2 * params + 4 * 2 * linears}  # assumes every bias exists


def bill_by_training(model, batch_size):
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(batch_size, model[0].in_features)
    model(x).sum().backward()
    opt.step()
    return SOLUTIONS["training_bill"](model, batch_size)


def test_training_bill_new_wrong_answers() -> None:
    result = checks.check_training_bill(bill_two_tensors_per_linear)
    assert result.status == FAIL and "TENSOR" in result.message and "24-40-8" in result.message
    result = checks.check_training_bill(bill_by_training)
    assert result.status == FAIL and "train nothing" in result.message, result.message


# --- safe_step: only out-of-memory is caught, the step runs once (issue 16) --------------------


def safe_step_any_runtime_error(step, batch):
    try:
        step(batch)
    except RuntimeError as exc:
        exc.__traceback__ = None
        return False
    return True


def safe_step_twice(step, batch):
    try:
        step(batch)  # a dry run "to see whether it fits"
        step(batch)
    except Exception as exc:
        if not is_out_of_memory(exc):
            raise
        exc.__traceback__ = None
        return False
    return True


def test_safe_step_new_wrong_answers() -> None:
    result = checks.check_safe_step(safe_step_any_runtime_error)
    assert result.status == FAIL and "shape mismatch" in result.message, result.message
    result = checks.check_safe_step(safe_step_twice)
    assert result.status == FAIL and "call it once" in result.message, result.message
