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


def pick_whitelist(prefer=None):
    """Reads COURSE_DEVICE, but only accepts the devices it knows."""
    forced = prefer or os.environ.get("COURSE_DEVICE", "")
    if forced.split(":")[0] in ("cpu", "cuda", "mps"):
        return torch.device(forced)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_accelerator_first(prefer=None):
    """Asks for the accelerator before the override."""
    if prefer:
        return torch.device(prefer)
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device(os.environ.get("COURSE_DEVICE") or "cpu")


def pick_drops_index(prefer=None):
    forced = prefer or os.environ.get("COURSE_DEVICE")
    if forced:
        return torch.device(torch.device(forced).type)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_writes_env(prefer=None):
    if prefer:
        os.environ["COURSE_DEVICE"] = str(prefer)
    forced = os.environ.get("COURSE_DEVICE", "")
    return torch.device(forced or ("cuda" if torch.cuda.is_available() else "cpu"))


def pick_cpu_unless_forced(prefer=None):
    return torch.device(prefer or os.environ.get("COURSE_DEVICE") or "cpu")


def pick_no_mps(prefer=None):
    forced = prefer or os.environ.get("COURSE_DEVICE")
    if forced:
        return torch.device(forced)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (pick_whitelist, "accept any device string"),
        (pick_accelerator_first, "comes before the accelerator"),
        (pick_drops_index, "index included"),
        (pick_writes_env, "changed COURSE_DEVICE"),
        (pick_cpu_unless_forced, "a CUDA machine] expected device(type='cuda')"),
        (pick_no_mps, "an MPS machine] expected device(type='mps')"),
    ],
)
def test_pick_device_new_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_pick_device(wrong)
    assert result.status == FAIL and hint in result.message


def pick_cuda_mps_chain(prefer=None):
    forced = prefer or os.environ.get("COURSE_DEVICE", "").strip()
    if forced:
        return torch.device(forced)
    if torch.cuda.device_count() > 0:
        return torch.device("cuda:0")
    return torch.device("mps" if torch.backends.mps.is_available() else "cpu")


def pick_via_accelerator(prefer=None):
    if prefer is not None:
        return torch.device(prefer)
    env = os.getenv("COURSE_DEVICE")
    if env and env.strip():
        return torch.device(env.strip())
    acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return acc if acc is not None else torch.device("cpu")


@pytest.mark.parametrize("right", [pick_cuda_mps_chain, pick_via_accelerator])
@pytest.mark.parametrize("machine", [None, "h100_sxm", "mps"])
def test_pick_device_other_correct_styles_pass(right, machine, fake_gpu) -> None:
    if machine:
        fake_gpu(machine)
    assert checks.check_pick_device(right).passed


@pytest.mark.parametrize("machine", [None, "h100_sxm", "t4", "mps", "mi300x"])
def test_pick_device_hints_are_the_same_on_every_machine(machine, fake_gpu) -> None:
    """Issue 13: on a GPU the hints used to become "this machine's best device is cuda:0"."""
    if machine:
        fake_gpu(machine)
    for wrong, hint in [
        (pick_ignores_override, "read os.environ"),
        (pick_env_beats_prefer, "must win"),
        (pick_empty_env_breaks, "Device string must not be empty"),
        (pick_cpu_unless_forced, "a CUDA machine] expected device(type='cuda')"),
    ]:
        result = checks.check_pick_device(wrong)
        assert result.status == FAIL and hint in result.message, (wrong.__name__, result.message)
    assert checks.check_pick_device(SOLUTIONS["my_pick_device"]).passed


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


def fresh_via_list(t, device):
    return torch.tensor(t.tolist(), device=device)


def fresh_turns_off_grad(t, device):
    return t.requires_grad_(False).to(device, copy=True)


def fresh_widens(t, device):
    return t.to(device, copy=True).float() if t.is_floating_point() else t.to(device, copy=True)


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (fresh_via_list, "expected dtype torch.float16"),
        (fresh_turns_off_grad, "changed its input t"),
        (fresh_widens, "keep the dtype"),
    ],
)
def test_fresh_copy_new_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_fresh_copy(wrong)
    assert result.status == FAIL and hint in result.message


@pytest.mark.parametrize(
    "right",
    [
        lambda t, device: t.clone().to(device),
        lambda t, device: t.detach().clone().to(device),
        lambda t, device: torch.empty_like(t, device=device).copy_(t),
        lambda t, device: t.to(device=device, dtype=t.dtype, copy=True),
    ],
)
def test_fresh_copy_other_correct_styles_pass(right) -> None:
    assert checks.check_fresh_copy(right).passed


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


def evaluate_moves_model(model, inputs, labels):
    """Moves the caller's model to the CPU: right numbers there, an error counted as success on meta."""
    model = model.cpu()
    with torch.no_grad():
        logits = model(inputs)
        loss = F.cross_entropy(logits, labels)
    return loss.item(), logits.softmax(dim=1).numpy()


def evaluate_raises_not_implemented_on_meta(model, inputs, labels):
    device = next(model.parameters()).device
    if device.type == "meta":
        raise NotImplementedError("Cannot copy out of meta tensor; no data!")
    with torch.no_grad():
        logits = model(inputs.to(device))
        loss = F.cross_entropy(logits, labels.to(device))
    return loss.item(), logits.softmax(dim=1).cpu().numpy()


def evaluate_freezes_model(model, inputs, labels):
    device = next(model.parameters()).device
    model.requires_grad_(False)
    logits = model(inputs.to(device))
    loss = F.cross_entropy(logits, labels.to(device))
    return loss.item(), logits.softmax(dim=1).cpu().numpy()


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (evaluate_moves_model, "never ran"),
        (evaluate_freezes_model, "changed the caller's model"),
    ],
)
def test_evaluate_new_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_evaluate(wrong)
    assert result.status == FAIL and hint in result.message


def test_evaluate_own_not_implemented_on_meta_is_not_success() -> None:
    """A NotImplementedError raised by the learner is 'not done yet', never 'correct'."""
    assert not checks.check_evaluate(evaluate_raises_not_implemented_on_meta).passed


def evaluate_no_grad_free(model, inputs, labels):
    device = model.weight.device
    logits = model(inputs.to(device))
    loss = torch.nn.CrossEntropyLoss()(logits, labels.to(device))
    return float(loss.item()), logits.detach().softmax(-1).to("cpu").numpy()


def evaluate_nll(model, inputs, labels):
    device = next(model.parameters()).device
    with torch.inference_mode():
        log_probs = F.log_softmax(model(inputs.to(device)), dim=1)
        loss = F.nll_loss(log_probs, labels.to(device))
        probs = log_probs.exp()
    return loss.item(), probs.cpu().numpy()


@pytest.mark.parametrize("right", [evaluate_no_grad_free, evaluate_nll])
def test_evaluate_other_correct_styles_pass(right) -> None:
    assert checks.check_evaluate(right).passed


@pytest.mark.parametrize("machine", ["h100_sxm", "mps", "mi300x"])
def test_evaluate_hints_are_the_same_on_a_gpu(machine, fake_gpu) -> None:
    """Issue 13: on CUDA these became a raw "Expected all tensors to be on the same device"."""
    fake_gpu(machine)
    for wrong, hint in [
        (evaluate_item_only, "device mismatch"),
        (evaluate_fixed_device, "not to a fixed device"),
        (evaluate_forgets_labels, "inputs AND labels"),
        (evaluate_moves_model, "never ran"),
    ]:
        result = checks.check_evaluate(wrong)
        assert result.status == FAIL and hint in result.message, (wrong.__name__, result.message)


def test_a_device_mismatch_on_a_gpu_is_translated(fake_gpu, monkeypatch) -> None:
    """The error a real GPU raises in the last probe (simulated) becomes the same hint."""
    fake_gpu("h100_sxm")

    class OnGpu(torch.nn.Linear):
        def forward(self, x):
            raise RuntimeError(
                "Expected all tensors to be on the same device, but got mat1 is on cpu, "
                "different from other tensors on cuda:0"
            )

    real = checks._tiny_classifier

    def tiny(device):
        model, inputs, labels = real("cpu" if str(device).startswith("cuda") else device)
        return (OnGpu(4, 3) if str(device).startswith("cuda") else model), inputs, labels

    monkeypatch.setattr(checks, "_tiny_classifier", tiny)
    result = checks.check_evaluate(SOLUTIONS["evaluate"])
    assert result.status == FAIL
    assert result.message.startswith("[probe: model on cuda:0]")
    assert "device mismatch" in result.message and "inputs AND labels" in result.message


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


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (lambda m, k, n, r: 2 * m * k * n / min(r.times) / 1e9, "fastest time"),
        (lambda m, k, n, r: 2 * m * k * n / r.times[-1] / 1e9, "last time"),
        (lambda m, k, n, r: 2 * m * n * n / r.median / 1e9, "m*n dot products"),
        (lambda m, k, n, r: 2 * m * k * n // r.median // 1e9, "expected"),
        (lambda m, k, n, r: 0.21, "expected"),
    ],
)
def test_achieved_gflops_new_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_achieved_gflops(wrong)
    assert result.status == FAIL and hint in result.message


@pytest.mark.parametrize(
    "right",
    [
        lambda m, k, n, r: (2 * m * k * n / 1e9) / r.median,
        lambda m, k, n, r: 2e-9 * m * n * k / float(np.median(r.times)),
    ],
)
def test_achieved_gflops_other_correct_styles_pass(right) -> None:
    assert checks.check_achieved_gflops(right).passed


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
        (lambda t: t.detach().cpu().numpy(), "convert it to float32 first"),  # names the fix
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


def to_numpy_widens_fp16(t):
    t = t.detach().cpu()
    return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).numpy()


def to_numpy_turns_off_grad(t):
    t.requires_grad_(False)
    t = t.cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (to_numpy_widens_fp16, "keep the dtype"),
        (to_numpy_turns_off_grad, "changed the caller's tensor"),
    ],
)
def test_to_numpy_new_wrong_answers_fail(wrong, hint: str) -> None:
    result = checks.check_to_numpy(wrong)
    assert result.status == FAIL and hint in result.message


@pytest.mark.parametrize(
    "right",
    [
        lambda t: (
            t.detach().to("cpu", torch.float32 if t.dtype == torch.bfloat16 else t.dtype).numpy()
        ),
        lambda t: np.asarray((t.float() if t.dtype == torch.bfloat16 else t).detach().cpu()),
    ],
)
def test_to_numpy_other_correct_styles_pass(right) -> None:
    assert checks.check_to_numpy(right).passed
