"""Checkers for the chapter 1 exercises (devices) (chapter 1).

Each ``check_*`` takes the learner's function, runs probes on the device in use and on the
``meta`` device (shapes without data, so a second "device" exists on every machine), and
prints ✅, ❌ with a hint, or ⏳ for an untouched stub. None of them raises.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

from helpers.checks import CheckResult, expect, run_check
from helpers.devices import DEVICE_ENV, pick_device
from helpers.timing import BenchResult


@contextmanager
def _course_device(value: str | None) -> Iterator[None]:
    """Set (or unset, for None) $COURSE_DEVICE inside the block, restoring it afterwards (chapter 1)."""
    old = os.environ.pop(DEVICE_ENV, None)
    if value is not None:
        os.environ[DEVICE_ENV] = value
    try:
        yield
    finally:
        os.environ.pop(DEVICE_ENV, None)
        if old is not None:
            os.environ[DEVICE_ENV] = old


def _best_device() -> torch.device:
    """What pick_device() chooses with no override (chapter 1)."""
    with _course_device(None):
        return pick_device()


def check_pick_device(fn: Callable[..., torch.device]) -> CheckResult:
    """Exercise 1: prefer argument, then $COURSE_DEVICE, then the best accelerator, then CPU (chapter 1)."""

    def probes() -> None:
        best = _best_device()
        with _course_device(None):
            got = fn()
        expect(
            isinstance(got, torch.device),
            f"return a torch.device, not {type(got).__name__} {got!r}: wrap it in torch.device(...).",
        )
        expect(
            got.type == best.type,
            f"with nothing forced you returned {got}, but this machine's best device is {best}. "
            "Try CUDA, then MPS, then fall back to the CPU.",
        )
        with _course_device("meta"):
            got = fn()
        expect(
            isinstance(got, torch.device) and got.type == "meta",
            f"with {DEVICE_ENV}=meta you returned {got!r}: read os.environ.get('{DEVICE_ENV}') "
            "first and use it when it is set.",
        )
        with _course_device("cpu"):
            got = fn()
        expect(got == torch.device("cpu"), f"with {DEVICE_ENV}=cpu you returned {got!r}.")
        with _course_device(""):
            got = fn()
        expect(
            isinstance(got, torch.device) and got.type == best.type,
            f"an empty {DEVICE_ENV} means 'not set', so expect {best}; you returned {got!r}.",
        )
        with _course_device("cpu"):
            got = fn("meta")
        expect(
            isinstance(got, torch.device) and got.type == "meta",
            f"an explicit prefer='meta' must win over {DEVICE_ENV}=cpu; you returned {got!r}.",
        )

    return run_check("Exercise 1, a device picker with an override", probes)


def check_fresh_copy(fn: Callable[[torch.Tensor, str | torch.device], torch.Tensor]) -> CheckResult:
    """Exercise 2: always a new tensor with its own memory on the target device (chapter 1)."""

    def probes() -> None:
        device = pick_device()
        for target in ("cpu", device):
            t = torch.arange(6.0).reshape(2, 3).to(target)
            got = fn(t, target)
            expect(isinstance(got, torch.Tensor), f"return a tensor, not {type(got).__name__}.")
            expect(
                got is not t,
                f"fresh_copy(t, {str(target)!r}) returned t itself: .to() gives back the same "
                "tensor when it is already there. Ask .to() for a copy.",
            )
            expect(
                got.device.type == torch.device(target).type,
                f"the copy is on {got.device}, not on {target}.",
            )
            expect(
                got.untyped_storage().data_ptr() != t.untyped_storage().data_ptr(),
                "the result shares memory with the input (a view, e.g. from .view or .detach), "
                "so writing to one changes the other. Make a real copy.",
            )
            expect(
                got.dtype == t.dtype and torch.equal(got.cpu(), t.cpu()),
                "the copy must keep the dtype and the values.",
            )
        got = fn(torch.ones(2, 3), "meta")
        expect(
            isinstance(got, torch.Tensor) and got.device.type == "meta" and got.shape == (2, 3),
            "fresh_copy(t, 'meta') must give a tensor on the meta device: use the `device` "
            "argument (t.clone() copies but never moves).",
        )

    return run_check("Exercise 2, a copy that is always fresh", probes)


def _tiny_classifier(
    device: str | torch.device,
) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """A seeded 4-feature, 3-class linear model on `device`, and CPU inputs and labels (chapter 1)."""
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.copy_(torch.randn(3, 4, generator=g))
        model.bias.copy_(torch.randn(3, generator=g))
    inputs, labels = torch.randn(5, 4, generator=g), torch.tensor([0, 2, 1, 1, 0])
    return model.to(device), inputs, labels


_NO_DATA = ("meta tensor", "no data", "meta device type tensor")


def check_evaluate(fn: Callable[..., tuple[float, np.ndarray]]) -> CheckResult:
    """Exercise 3: the fixed evaluate() runs with the model on any device and returns plain values (chapter 1)."""

    def probes() -> None:
        targets = ["cpu"] + ([str(pick_device())] if pick_device().type != "cpu" else [])
        for target in targets:
            model, inputs, labels = _tiny_classifier(target)
            out = fn(model, inputs, labels)
            expect(
                isinstance(out, tuple) and len(out) == 2,
                "return a pair: (loss as a Python float, probabilities as a NumPy array).",
            )
            loss, probs = out
            expect(
                isinstance(loss, float),
                f"the loss must be a Python float, got {type(loss).__name__}: use .item().",
            )
            expect(
                isinstance(probs, np.ndarray),
                f"the probabilities must be a NumPy array, got {type(probs).__name__}.",
            )
            ref_model, _, _ = _tiny_classifier("cpu")
            with torch.no_grad():
                logits = ref_model(inputs)
                ref_loss = F.cross_entropy(logits, labels).item()
                ref_probs = logits.softmax(dim=1).numpy()
            expect(
                math.isclose(loss, ref_loss, rel_tol=1e-4),
                f"the loss is {loss:.4f}, expected the mean cross-entropy {ref_loss:.4f}.",
            )
            expect(
                probs.shape == ref_probs.shape and np.allclose(probs, ref_probs, atol=1e-5),
                "the probabilities differ from softmax(model(inputs), dim=1).",
            )
        model, inputs, labels = _tiny_classifier("meta")
        try:
            fn(model, inputs, labels)
        except NotImplementedError as exc:
            if "Write your solution" in str(exc) or "delete this line" in str(exc):
                raise
            return  # "Cannot copy out of meta tensor": the data reached the model's device
        except (RuntimeError, TypeError) as exc:
            msg = str(exc)
            expect(
                any(m in msg for m in _NO_DATA),
                "with the model on the meta device this failed with a device mismatch "
                f"({msg.splitlines()[0]}): move inputs AND labels to the model's device, "
                "next(model.parameters()).device, not to a fixed device.",
            )
            return
        expect(
            False,
            "with the model on the meta device (shapes, no data) this returned a result, so "
            "the loss or probabilities never left the model's device.",
        )

    return run_check("Exercise 3, fix the device bugs in evaluate()", probes)


def _bench(median: float, times: list[float]) -> BenchResult:
    """A BenchResult with a chosen median and raw times, to check arithmetic on (chapter 1)."""
    return BenchResult(
        label="matmul",
        median=median,
        iqr=0.0,
        times=times,
        number_per_run=1,
        num_threads=torch.get_num_threads(),
        device="cpu",
        method="torch.utils.benchmark",
    )


def check_achieved_gflops(fn: Callable[[int, int, int, BenchResult], float]) -> CheckResult:
    """Exercise 4: GFLOP/s = 2*m*k*n / median seconds / 1e9 (chapter 1)."""

    def probes() -> None:
        m, k, n = 3, 5, 7
        # the first run is cold (slow) and one is an outlier, so first, mean and median all differ
        result = _bench(2e-6, [7e-6, 2e-6, 2e-6, 2e-6, 30e-6])
        want = 2 * m * k * n / 2e-6 / 1e9
        got = fn(m, k, n, result)
        expect(
            isinstance(got, (int, float)) and math.isfinite(got),
            f"return a number, got {got!r}.",
        )
        ratio = got / want if want else float("nan")
        hints = {
            0.5: "half the right answer: each multiply-add is 2 FLOPs (2*m*k*n).",
            1e9: "a billion times too big: GFLOP/s is FLOP/s divided by 1e9.",
            1e18: "you multiplied by 1e9: divide FLOP/s by 1e9 to get GFLOP/s.",
            1e-9: "a billion times too small: divide FLOP/s by 1e9 only once.",
        }
        for r, hint in hints.items():
            expect(not math.isclose(ratio, r, rel_tol=1e-6), hint)
        mean = sum(result.times) / len(result.times)
        expect(
            not math.isclose(got, 2 * m * k * n / mean / 1e9, rel_tol=1e-6),
            "you used the mean time: one slow outlier drags it. Use result.median.",
        )
        expect(
            not math.isclose(got, 2 * m * k * n / result.times[0] / 1e9, rel_tol=1e-6),
            "you used the first time, which is a cold run. Use result.median.",
        )
        expect(
            math.isclose(got, want, rel_tol=1e-6),
            f"for a ({m} x {k}) @ ({k} x {n}) matmul taking a median {result.median} s, expected "
            f"{want:.6g} GFLOP/s, got {got!r}. The matmul does m*n dot products of length k.",
        )
        big = fn(1024, 1024, 1024, _bench(0.01, [0.01] * 5))
        expect(
            math.isclose(big, 2 * 1024**3 / 0.01 / 1e9, rel_tol=1e-6), "check a square case too."
        )

    return run_check("Exercise 4, achieved GFLOP/s from a benchmark", probes)


def check_to_numpy(fn: Callable[[torch.Tensor], np.ndarray]) -> CheckResult:
    """Exercise 5: to_numpy works for grad, bf16, integer and non-CPU tensors (chapter 1)."""

    def probes() -> None:
        device = pick_device()
        cases = [
            ("a tensor that requires grad", torch.linspace(-1, 1, 5, requires_grad=True)),
            ("a bf16 tensor", torch.tensor([0.5, -2.0, 3.25], dtype=torch.bfloat16)),
            ("an fp16 tensor", torch.tensor([0.5, -2.0], dtype=torch.float16)),
            ("an int64 tensor", torch.arange(4)),
            ("a bool tensor", torch.tensor([True, False])),
            ("a 0-d tensor", torch.tensor(7.5)),
        ]
        if device.type != "cpu":
            cases.append((f"a tensor on {device}", torch.arange(3.0, device=device)))
            cases.append(
                (f"a grad tensor on {device}", torch.ones(2, device=device, requires_grad=True))
            )
        for what, t in cases:
            try:
                got = fn(t)
            except NotImplementedError:
                raise  # the untouched stub: "not done yet"
            except (RuntimeError, TypeError) as exc:
                expect(False, f"it failed on {what}: {str(exc).splitlines()[0]}")
            expect(
                isinstance(got, np.ndarray),
                f"for {what} return a NumPy array, got {type(got).__name__}.",
            )
            expect(got.shape == tuple(t.shape), f"for {what} the shape changed to {got.shape}.")
            want = t.detach().cpu()
            if t.dtype == torch.bfloat16:
                want = want.float()
                expect(
                    got.dtype == np.float32,
                    f"NumPy has no bfloat16; return float32 for {what}, got {got.dtype}.",
                )
            elif t.dtype in (torch.int64, torch.bool):
                expect(
                    got.dtype == want.numpy().dtype,
                    f"keep the dtype of {what}: expected {want.numpy().dtype}, got {got.dtype}. "
                    "Convert only what NumPy cannot hold (bf16).",
                )
            expect(
                np.array_equal(got.astype(np.float64), want.double().numpy()),
                f"the values of {what} changed.",
            )

    return run_check("Exercise 5, to_numpy for any tensor", probes)
