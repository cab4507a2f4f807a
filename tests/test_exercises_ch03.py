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


def step_returns_scaled_loss(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = loss_fn(model(x), y)
    scaled = scaler.scale(loss)  # issue 24: accepted before, since no probe compared the value
    scaled.backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return scaled.item()


def step_returns_last_loss(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    SOLUTIONS["amp_train_step"](
        model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm
    )
    with torch.no_grad(), torch.autocast(device_type, dtype=dtype):
        return loss_fn(model(x), y).item()  # the loss after the step, not this step's


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
        (step_returns_scaled_loss, "times the scaler's scale (1024)"),
        (step_returns_last_loss, "return loss.item() of this step's forward"),
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


# --- new wrong answers of each kind (issue 16) and other correct styles --------------------


def fate_old_official(x: float) -> str:
    """The solution before issue 16: just under 2**-14 it says 'subnormal' where a cast rounds up."""
    info = torch.finfo(torch.float16)
    size = abs(x)
    if size >= info.max + 16:
        return "inf"
    if size <= info.smallest_normal * info.eps / 2:
        return "zero"
    return "subnormal" if size < info.smallest_normal else "normal"


def fate_strict_max(x: float) -> str:
    info = torch.finfo(torch.float16)
    size = abs(x)
    if size > info.max:
        return "inf"
    if size < info.smallest_normal * info.eps / 2:
        return "zero"
    return "subnormal" if size < info.smallest_normal else "normal"


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [(fate_old_official, "rounds UP to the smallest normal"), (fate_strict_max, "65,504")],
)
def test_fp16_fate_edge_answers_fail(wrong, hint: str) -> None:
    result = checks.check_fp16_fate(wrong)
    assert result.status == FAIL and hint in result.message


def fate_by_frexp(x: float) -> str:
    size = abs(x)
    if size >= 65520.0:
        return "inf"
    if size <= 2.0**-25:
        return "zero"
    return "normal" if size >= 2.0**-14 - 2.0**-25 else "subnormal"


def test_fp16_fate_other_correct_style_passes() -> None:
    assert checks.check_fp16_fate(fate_by_frexp).passed


def step_deprecated_autocast(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    optimizer.zero_grad(set_to_none=True)
    with torch.cpu.amp.autocast(dtype=dtype):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def test_amp_step_with_the_deprecated_cpu_autocast_fails() -> None:
    result = checks.check_amp_train_step(step_deprecated_autocast)
    assert result.status == FAIL and "deprecated API" in result.message
    assert "torch.cpu.amp.autocast" in result.message


def step_amp_autocast_style(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):
    for p in model.parameters():
        p.grad = None
    with torch.amp.autocast(device_type, dtype=dtype):
        out = model(x)
        loss = loss_fn(out, y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(list(model.parameters()), max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()
    return float(loss.detach())


def test_amp_step_other_correct_style_passes() -> None:
    assert checks.check_amp_train_step(step_amp_autocast_style).passed


def save_all(path, model, optimizer, scaler):
    torch.save(
        {"m": model.state_dict(), "o": optimizer.state_dict(), "s": scaler.state_dict()}, path
    )


def load_into_new_scaler(path, model, optimizer, scaler):
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["m"])
    optimizer.load_state_dict(state["o"])
    scaler = torch.amp.GradScaler("cpu")
    scaler.load_state_dict(state["s"])


def load_with_map_location(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["m"])
    optimizer.load_state_dict(state["o"])
    scaler.load_state_dict(state["s"])


def test_loading_into_a_new_scaler_names_the_mistake() -> None:
    result = checks.check_scaler_checkpoint(save_all, load_into_new_scaler)
    assert result.status == FAIL and "on a new GradScaler" in result.message


def test_checkpoint_other_correct_style_passes() -> None:
    assert checks.check_scaler_checkpoint(save_all, load_with_map_location).passed


# --- pick_amp_dtype: names decide nothing, the description stays as given (issue 16) ----------

_BY_NAME = {"T4": ("fp16", True), "V100": ("fp16", True), "1080": ("fp32", False)}


def amp_dtype_by_name(desc):
    if desc["kind"] == "cuda":
        for key, answer in _BY_NAME.items():
            if key in desc.get("name", ""):
                return answer
        return "bf16", False
    flags = desc.get("cpu_flags", [])
    if desc["kind"] == "cpu":
        return ("bf16", False) if {"avx512_bf16", "amx_bf16"} & set(flags) else ("fp32", False)
    return "fp16", True


def amp_dtype_as_text(desc):
    if desc["kind"] == "cuda":
        cc = "{}.{}".format(*desc["compute_capability"])
        return (
            ("bf16", False) if cc >= "8.0" else ("fp16", True) if cc >= "7.0" else ("fp32", False)
        )
    return SOLUTIONS["pick_amp_dtype"](desc)


def amp_dtype_popping(desc):
    desc.setdefault("cpu_flags", []).sort()  # tidies the caller's description in place
    return SOLUTIONS["pick_amp_dtype"](desc)


def amp_dtype_none_for_no(desc):
    name, scaler = SOLUTIONS["pick_amp_dtype"](desc)
    return name, (True if scaler else None)


def amp_dtype_other_style(desc):
    kind = desc.get("kind")
    if kind == "cuda":
        major, minor = desc["compute_capability"]
        if major >= 8:
            return "bf16", False
        return ("fp16", True) if major == 7 else ("fp32", False)
    if kind == "mps":
        return "fp16", True
    bf16 = any(f in ("avx512_bf16", "amx_bf16") for f in desc.get("cpu_flags", ()))
    return ("bf16" if bf16 else "fp32"), False


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (amp_dtype_by_name, "not by the name"),
        (amp_dtype_as_text, "not as text"),
        (amp_dtype_none_for_no, "True or False"),
    ],
)
def test_pick_amp_dtype_new_wrong_answers(wrong, hint: str) -> None:  # noqa: ANN001
    result = checks.check_pick_amp_dtype(wrong)
    assert result.status == FAIL and hint in result.message and "[probe:" in result.message


def test_pick_amp_dtype_reordering_the_description_fails_and_other_styles_pass() -> None:
    result = checks.check_pick_amp_dtype(amp_dtype_popping)
    assert result.status == FAIL and "changed the description" in result.message, result.message
    assert checks.check_pick_amp_dtype(amp_dtype_other_style).passed
