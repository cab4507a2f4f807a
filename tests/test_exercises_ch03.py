"""Chapter 3 checkers fail typical wrong answers (solution/stub: test_exercise_checks.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.checks import FAIL
from helpers.checks import ch03 as checks

from nbfiles import exercise_namespace

SOLUTIONS = exercise_namespace("solutions/03_mixed_precision_solutions.ipynb")


# --- exercise 1: fp16_fate --------------------------------------------------------------------

F16 = torch.finfo(torch.float16)


def fate_forgets_subnormals(x: float) -> str:
    size = abs(x)
    if size > F16.max:
        return "inf"
    return "zero" if size < F16.smallest_normal else "normal"


def fate_truncates(x: float) -> str:
    size = abs(x)
    if size > F16.max:
        return "inf"
    if size < F16.smallest_normal * F16.eps:  # no rounding: 4e-8 would "vanish"
        return "zero"
    return "subnormal" if size < F16.smallest_normal else "normal"


def fate_overflows_early(x: float) -> str:
    size = abs(x)
    if size > F16.max:  # 65,510 rounds to 65,504, it does not overflow
        return "inf"
    if size <= F16.smallest_normal * F16.eps / 2:
        return "zero"
    return "subnormal" if size < F16.smallest_normal else "normal"


def fate_ignores_sign(x: float) -> str:
    if x >= F16.max + 16:
        return "inf"
    if 0 <= x <= F16.smallest_normal * F16.eps / 2:
        return "zero"
    return "subnormal" if x < F16.smallest_normal else "normal"


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (fate_forgets_subnormals, "subnormal, not zero"),
        (fate_truncates, "NEAREST"),
        (fate_overflows_early, "65,504, which is finite"),
        (fate_ignores_sign, "the sign does not matter"),
        (lambda x: "fp16", "return one of"),
    ],
)
def test_fp16_fate_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_fp16_fate(wrong)
    assert result.status == FAIL and hint in result.message


# --- exercise 2: pick_amp_dtype ---------------------------------------------------------------


def pick_trusts_reported_bf16(desc):
    if desc["kind"] == "cuda":
        if desc.get("bf16_reported"):
            return "bf16", False
        return "fp16", True
    return SOLUTIONS["pick_amp_dtype"](desc)


def pick_bf16_on_every_cpu(desc):
    if desc["kind"] == "cpu":
        return "bf16", False
    return SOLUTIONS["pick_amp_dtype"](desc)


def pick_scaler_for_bf16(desc):
    name, _ = SOLUTIONS["pick_amp_dtype"](desc)
    return name, name != "fp32"


def pick_fp16_on_old_gpus(desc):
    if desc["kind"] == "cuda" and tuple(desc["compute_capability"]) < (8, 0):
        return "fp16", True
    return SOLUTIONS["pick_amp_dtype"](desc)


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (pick_trusts_reported_bf16, "counts emulation"),
        (pick_bf16_on_every_cpu, "no bf16 flag"),
        (pick_scaler_for_bf16, "only fp16 needs a GradScaler"),
        (pick_fp16_on_old_gpus, "no tensor cores"),
        (lambda desc: "bf16", "return a pair"),
    ],
)
def test_pick_amp_dtype_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_pick_amp_dtype(wrong)
    assert result.status == FAIL and hint in result.message


# --- exercise 3: amp_train_step ---------------------------------------------------------------


def step_without_autocast(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def step_unscaled_backward(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = loss_fn(model(x), y)
    loss.backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def step_bypasses_scaler(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    scaler.update()
    return loss.item()


def step_clips_scaled_grads(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # before unscale_: wrong units
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def step_clip_then_unscale(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def step_never_clips(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def step_keeps_old_grads(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    with torch.autocast(device_type, dtype=dtype):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def step_forgets_update(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    return loss.item()


def step_returns_tensor(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    SOLUTIONS["amp_train_step"](
        model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm
    )
    return [0.5]


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (step_without_autocast, "torch.autocast"),
        (step_unscaled_backward, "scaler.scale(loss).backward()"),
        (step_bypasses_scaler, "instead of optimizer.step()"),
        (step_clips_scaled_grads, "before clipping"),
        (step_clip_then_unscale, "clipped the *scaled* gradients"),
        (step_never_clips, "clip with torch.nn.utils.clip_grad_norm_"),
        (step_keeps_old_grads, "zero_grad"),
        (step_forgets_update, "scaler.update()"),
        (step_returns_tensor, "as a float"),
    ],
)
def test_amp_train_step_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_amp_train_step(wrong)
    assert result.status == FAIL and hint in result.message


# --- exercise 4: the scaler in the checkpoint -------------------------------------------------


def save_without_scaler(path, model, optimizer, scaler):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)


def load_without_scaler(path, model, optimizer, scaler):
    checkpoint = torch.load(path, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])


def save_whole_objects(path, model, optimizer, scaler):
    torch.save({"model": model, "optimizer": optimizer, "scaler": scaler}, path)


def load_only_model(path, model, optimizer, scaler):
    model.load_state_dict(torch.load(path, weights_only=True)["model"])


def save_nothing(path, model, optimizer, scaler):
    return None


@pytest.mark.parametrize(
    ("save", "load", "hint"),
    [
        (save_without_scaler, load_without_scaler, "save scaler.state_dict()"),
        (save_whole_objects, load_without_scaler, "weights_only=True"),
        (None, load_only_model, "optimizer's state"),
        (save_nothing, None, "did not write"),
    ],
)
def test_scaler_checkpoint_wrong_answers_fail(save, load, hint: str) -> None:
    save = save or SOLUTIONS["save_checkpoint"]
    load = load or SOLUTIONS["load_checkpoint"]
    result = checks.check_scaler_checkpoint(save, load)
    assert result.status == FAIL and hint in result.message
