"""Checkers for the chapter 1 exercises (devices) (chapter 1).

Each ``check_*`` takes the learner's function and prints ✅, ❌ with a hint, or ⏳ for an
untouched stub; none of them raises. The hints are the same on every machine: the device
picker is probed in simulated worlds (CPU only, CUDA, MPS) rather than on the machine's
real best device, and the other checks probe the ``meta`` device (shapes without data, so a
second "device" exists everywhere) before the real accelerator, whose device-mismatch errors
are translated into the same hint.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from unittest import mock

import numpy as np
import torch
import torch.nn.functional as F

from helpers.checks import CheckFailed, CheckResult, expect, is_stub_error, probe, run_check
from helpers.devices import DEVICE_ENV, pick_device
from helpers.i18n import tr, tr_mark
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


@contextmanager
def _world(kind: str | None) -> Iterator[None]:
    """Make torch report a machine whose accelerator is `kind` ('cuda', 'mps') or none (chapter 1)."""
    with ExitStack() as stack:

        def patch(obj: object, name: str, value: object) -> None:
            if obj is not None and hasattr(obj, name):
                stack.enter_context(mock.patch.object(obj, name, value))

        patch(torch.cuda, "is_available", lambda: kind == "cuda")
        patch(torch.cuda, "device_count", lambda: 2 if kind == "cuda" else 0)
        patch(torch.backends.mps, "is_available", lambda: kind == "mps")
        patch(getattr(torch, "xpu", None), "is_available", lambda: False)
        acc = getattr(torch, "accelerator", None)
        patch(acc, "is_available", lambda: kind is not None)
        patch(acc, "device_count", lambda: {"cuda": 2, "mps": 1}.get(kind or "", 0))
        patch(
            acc,
            "current_accelerator",
            lambda *a, **k: torch.device(kind) if kind is not None else None,
        )
        yield


def _call_picker(fn: Callable[..., object], env: str | None, *args: object) -> object:
    """fn(*args) with $COURSE_DEVICE set to `env`; fail if fn changed the variable (chapter 1)."""
    with _course_device(env):
        got = fn(*args)
        now = os.environ.get(DEVICE_ENV)
    expect(
        now == env,
        tr("your function changed {var} from {env!r} to {now!r}: read it, never write it.").format(
            var=DEVICE_ENV, env=env, now=now
        ),
    )
    return got


def _honours(fn: Callable[..., object], how: str) -> bool:
    """Whether fn returns 'cpu' (CUDA world) and 'cuda:1' (CPU world) when given them by `how` (chapter 1)."""
    ok = True
    for kind, spec in (("cuda", "cpu"), (None, "cuda:1")):
        with _world(kind):
            got = _call_picker(fn, None, spec) if how == "prefer" else _call_picker(fn, spec)
        ok = ok and _same(got, spec)
    return ok


def _same(got: object, want: str) -> bool:
    """got is a torch.device of `want`'s type, and index when `want` names one (chapter 1)."""
    if not isinstance(got, torch.device):
        return False
    w = torch.device(want)
    return got.type == w.type and (w.index is None or got.index == w.index)


def _probe_forced_and_worlds(fn: Callable[..., object]) -> None:
    """Exercise 1's probes of forced devices, and of CPU-only, CUDA and MPS machines (chapter 1)."""
    with probe(tr("{var}=cuda:1 on a CPU-only machine").format(var=DEVICE_ENV)), _world(None):
        got = _call_picker(fn, "cuda:1")
        expect(
            _same(got, "cuda:1"),
            tr(
                "expected device(type='cuda', index=1), got {got!r}: a forced device is used "
                "as it is written, index included."
            ).format(got=got),
        )
    with probe(tr("{var}=cpu on a CUDA machine").format(var=DEVICE_ENV)), _world("cuda"):
        got = _call_picker(fn, "cpu")
        expect(
            _same(got, "cpu"),
            tr(
                "expected device(type='cpu'), got {got!r}: {var} comes before the accelerator."
            ).format(got=got, var=DEVICE_ENV),
        )
    with probe(tr("prefer='meta' with {var}=cpu").format(var=DEVICE_ENV)), _world("cuda"):
        got = _call_picker(fn, "cpu", "meta")
        expect(
            _same(got, "meta"),
            tr(
                "expected device(type='meta'), got {got!r}: an explicit prefer='meta' must win "
                "over {var}."
            ).format(got=got, var=DEVICE_ENV),
        )
    for env in ("",):
        with probe(
            tr("{var}={env!r} (empty means 'not set') on a CUDA machine").format(
                var=DEVICE_ENV, env=env
            )
        ):
            with _world("cuda"):
                got = _call_picker(fn, env)
            expect(
                _same(got, "cuda"),
                tr(
                    "expected device(type='cuda'), got {got!r}: treat an empty {var} as not set."
                ).format(got=got, var=DEVICE_ENV),
            )
    for kind, want in (("cuda", "cuda"), ("mps", "mps"), (None, "cpu")):
        machine = {"cuda": tr_mark("a CUDA machine"), "mps": tr_mark("an MPS machine")}.get(
            kind or "", tr_mark("a CPU-only machine")
        )
        with probe(tr("nothing forced, on {machine}").format(machine=tr(machine))), _world(kind):
            got = _call_picker(fn, None)
            expect(
                _same(got, want),
                tr(
                    "expected device(type='{want}'), got {got!r}. Ask torch.accelerator (or "
                    "torch.cuda.is_available(), then torch.backends.mps.is_available()) every "
                    "time; fall back to the CPU only when there is no accelerator."
                ).format(want=want, got=got),
            )


def check_pick_device(fn: Callable[..., torch.device]) -> CheckResult:
    """Exercise 1: prefer argument, then $COURSE_DEVICE, then the accelerator, then CPU (chapter 1)."""

    def probes() -> None:
        with probe(tr("prefer='meta' on a CUDA machine")), _world("cuda"):
            got = _call_picker(fn, None, "meta")
            expect(
                isinstance(got, torch.device),
                tr(
                    "return a torch.device, not {kind} {got!r}: wrap it in torch.device(...)."
                ).format(kind=type(got).__name__, got=got),
            )
            if not _same(got, "meta"):
                expect(
                    not _honours(fn, "prefer"),
                    tr(
                        "expected device(type='meta'), got {got!r}. You do use `prefer` (cpu and "
                        "cuda:1 came through), but not every value: accept any device string, do "
                        "not keep a list of allowed ones (pick_device checks that it exists)."
                    ).format(got=got),
                )
                expect(
                    False,
                    tr("expected device(type='meta'), got {got!r}: use `prefer`.").format(got=got),
                )
        with probe(tr("{var}=meta on a CUDA machine").format(var=DEVICE_ENV)), _world("cuda"):
            got = _call_picker(fn, "meta")
            if not _same(got, "meta"):
                with _world(None):
                    on_cpu_machine = _same(_call_picker(fn, "cuda:1"), "cuda:1")
                with _world("cuda"):
                    on_cuda_machine = _same(_call_picker(fn, "cpu"), "cpu")
                expect(
                    not (on_cpu_machine and on_cuda_machine),
                    tr(
                        "expected device(type='meta'), got {got!r}. You do read {var} "
                        "(cpu and cuda:1 came through), but not every value: accept any device "
                        "string, do not keep a list of allowed ones (pick_device checks that the "
                        "device exists)."
                    ).format(got=got, var=DEVICE_ENV),
                )
                expect(
                    not on_cpu_machine,
                    tr(
                        "expected device(type='meta'), got {got!r}: you read {var} only "
                        "when there is no accelerator, but {var} comes before the accelerator."
                    ).format(got=got, var=DEVICE_ENV),
                )
                expect(
                    False,
                    tr(
                        "expected device(type='meta'), got {got!r}: read "
                        "os.environ.get('{var}') first and use it when it is set."
                    ).format(got=got, var=DEVICE_ENV),
                )
        _probe_forced_and_worlds(fn)

    return run_check(tr("Exercise 1, a device picker with an override"), probes)


def _other_devices() -> list[str]:
    """'meta' first, then this machine's accelerator if it has one (chapter 1)."""
    device = pick_device()
    return ["meta"] + ([str(device)] if device.type not in ("cpu", "meta") else [])


def _expect_own_memory(got: torch.Tensor, t: torch.Tensor, values: torch.Tensor) -> None:
    """A fresh copy has its own memory, t's values, and left t's values alone (chapter 1)."""
    expect(
        got.untyped_storage().data_ptr() != t.untyped_storage().data_ptr(),
        tr(
            "the result shares memory with the input (a view, e.g. from .view or "
            ".detach), so writing to one changes the other. Make a real copy."
        ),
    )
    expect(
        torch.equal(got.detach().cpu(), values.cpu()),
        tr("expected the same values as t, got different ones."),
    )
    expect(torch.equal(t.detach().cpu(), values.cpu()), tr("your function changed t's values."))


def check_fresh_copy(fn: Callable[[torch.Tensor, str | torch.device], torch.Tensor]) -> CheckResult:
    """Exercise 2: always a new tensor with its own memory on the target device, input untouched (chapter 1)."""

    def one(t: torch.Tensor, target: str, what: str) -> None:
        values = t.detach().clone() if t.device.type != "meta" else None
        grad, device, dtype, shape = t.requires_grad, t.device, t.dtype, t.shape
        with probe(
            tr("fresh_copy({what} on {device}, {target!r})").format(
                what=what, device=t.device, target=target
            )
        ):
            got = fn(t, target)
            expect(
                isinstance(got, torch.Tensor),
                tr("return a tensor, not {kind}.").format(kind=type(got).__name__),
            )
            expect(
                got is not t,
                tr(
                    "expected a new tensor, but it returned t itself: .to() gives back the same tensor when "
                    "it is already there. Ask .to() for a copy."
                ),
            )
            expect(
                got.device.type == torch.device(target).type,
                tr(
                    "expected a tensor on {target}, got one on {device}: use the `device` "
                    "argument (t.clone() copies but never moves)."
                ).format(target=target, device=got.device),
            )
            expect(
                got.dtype == dtype,
                tr("expected dtype {want}, got {got}: keep the dtype (and the values).").format(
                    want=dtype, got=got.dtype
                ),
            )
            expect(
                tuple(got.shape) == tuple(shape),
                tr("expected shape {want}, got {got}.").format(
                    want=tuple(shape), got=tuple(got.shape)
                ),
            )
            expect(
                t.requires_grad == grad and t.device == device and t.dtype == dtype,
                tr(
                    "your function changed its input t (requires_grad, device or dtype): the "
                    "caller's tensor must stay as it was."
                ),
            )
            if got.device.type != "meta" and t.device.type != "meta":
                _expect_own_memory(got, t, values)

    def probes() -> None:
        cases = [
            (tr("an fp32 tensor"), torch.arange(6.0).reshape(2, 3)),
            (tr("an fp16 tensor"), torch.tensor([0.1, 1e-6, 65504.0], dtype=torch.float16)),
            (tr("an int64 tensor"), torch.arange(2**40, 2**40 + 4)),
            (tr("a bool tensor"), torch.tensor([True, False, True])),
            (tr("a transposed (non-contiguous) tensor"), torch.arange(6.0).reshape(2, 3).t()),
            (tr("a tensor that requires grad"), torch.linspace(-1, 1, 4, requires_grad=True)),
        ]
        for what, t in cases:
            one(t, "cpu", what)
        for target in _other_devices():
            for what, t in cases[:3] + cases[5:]:
                one(t, target, what)
                one(fresh_from(t, target), target, what)

    return run_check(tr("Exercise 2, a copy that is always fresh"), probes)


def fresh_from(t: torch.Tensor, target: str) -> torch.Tensor:
    """A tensor like t that already lives on `target` (a leaf, requires_grad kept) (chapter 1)."""
    with torch.no_grad():
        moved = t.detach().to(target)
    return moved.requires_grad_(t.requires_grad)


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


_NO_DATA = ("meta tensor", "no data", "meta device type tensor", "meta tensors")
_MISMATCH = ("same device", "expected device", "Expected all tensors", "is on", "device")


def _mismatch_hint(device: str, msg: str) -> str:
    """The hint for a device-mismatch error raised inside torch (chapter 1)."""
    return tr(
        "with the model on {device} this failed with a device mismatch "
        "({error}): move inputs AND labels to the model's device, "
        "next(model.parameters()).device, not to a fixed device."
    ).format(device=device, error=msg.strip().splitlines()[0][:160])


def _evaluate_on(fn: Callable[..., tuple[float, np.ndarray]], device: str) -> None:
    """Run evaluate with the model on `device` (not meta); check values and side effects (chapter 1)."""
    model, inputs, labels = _tiny_classifier(device)
    weights = [p.detach().clone() for p in model.parameters()]
    inputs_before, labels_before = inputs.clone(), labels.clone()
    try:
        out = fn(model, inputs, labels)
    except RuntimeError as exc:
        if "device" in str(exc) and not is_stub_error(exc):
            raise CheckFailed(_mismatch_hint(device, str(exc))) from None
        raise
    expect(
        isinstance(out, tuple) and len(out) == 2,
        tr(
            "expected a pair (loss as a Python float, probabilities as a NumPy array), got {out!r:.80}."
        ).format(out=out),
    )
    loss, probs = out
    expect(
        isinstance(loss, float),
        tr("expected the loss as a Python float, got {kind}: use .item().").format(
            kind=type(loss).__name__
        ),
    )
    expect(
        isinstance(probs, np.ndarray),
        tr("expected the probabilities as a NumPy array, got {kind}.").format(
            kind=type(probs).__name__
        ),
    )
    expect(
        all(p.device.type == torch.device(device).type for p in model.parameters()),
        tr(
            "your function moved the caller's model off {device}: move the data to the model, "
            "never the model."
        ).format(device=device),
    )
    expect(
        all(p.requires_grad for p in model.parameters())
        and all(
            torch.equal(p.detach().cpu(), w.cpu()) for p, w in zip(model.parameters(), weights)
        ),
        tr(
            "your function changed the caller's model (its weights or requires_grad): evaluate "
            "only reads it."
        ),
    )
    expect(
        inputs.device.type == "cpu"
        and torch.equal(inputs, inputs_before)
        and torch.equal(labels, labels_before),
        tr(
            "your function changed the caller's inputs or labels: .to(device) returns a copy, "
            "assign it to a new name."
        ),
    )
    ref_model, _, _ = _tiny_classifier("cpu")
    with torch.no_grad():
        logits = ref_model(inputs)
        ref_loss = F.cross_entropy(logits, labels).item()
        ref_probs = logits.softmax(dim=1).numpy()
    expect(
        math.isclose(loss, ref_loss, rel_tol=1e-4),
        tr("the loss is {loss:.4f}, expected the mean cross-entropy {ref_loss:.4f}.").format(
            loss=loss, ref_loss=ref_loss
        ),
    )
    expect(
        probs.shape == ref_probs.shape and np.allclose(probs, ref_probs, atol=1e-5),
        tr(
            "the probabilities (shape {shape}) differ from softmax(model(inputs), dim=1) "
            "(shape {ref_shape})."
        ).format(shape=probs.shape, ref_shape=ref_probs.shape),
    )


def _evaluate_on_meta(fn: Callable[..., tuple[float, np.ndarray]]) -> None:
    """With the model on meta, a right answer runs the model there and fails only when reading numbers (chapter 1)."""
    model, inputs, labels = _tiny_classifier("meta")
    seen: list[str] = []
    hook = model.register_forward_pre_hook(lambda m, args: seen.append(args[0].device.type))
    try:
        fn(model, inputs, labels)
    except Exception as exc:
        if is_stub_error(exc):
            raise
        msg = str(exc)
        data_error = isinstance(exc, (NotImplementedError, RuntimeError, TypeError)) and any(
            m in msg for m in _NO_DATA
        )
        if not data_error:
            expect(
                not (isinstance(exc, (RuntimeError, TypeError)) and "device" in msg),
                _mismatch_hint("meta", msg),
            )
            raise
        expect(
            seen and all(d == "meta" for d in seen),
            tr(
                "expected the model to run on its own device (meta), but its input was on "
                "{device}: move inputs AND labels to the model's device, "
                "next(model.parameters()).device, not to a fixed device."
            ).format(device=seen[0])
            if seen
            else tr(
                "expected the model to run on its own device (meta), but it never ran: your "
                "code failed first ({error}). Do not move the model (it is the caller's); "
                "move the data to it."
            ).format(error=f"{type(exc).__name__}: {msg.splitlines()[0][:100]}"),
        )
        expect(
            all(p.device.type == "meta" for p in model.parameters()),
            tr(
                "your function moved the caller's model: move the data to the model, never the model."
            ),
        )
        return
    finally:
        hook.remove()
    expect(
        False,
        tr(
            "with the model on the meta device (shapes, no data) this returned a result, so "
            "the loss or probabilities never left the model's device."
        ),
    )


def check_evaluate(fn: Callable[..., tuple[float, np.ndarray]]) -> CheckResult:
    """Exercise 3: the fixed evaluate() runs with the model on any device and returns plain values (chapter 1)."""

    def probes() -> None:
        with probe(tr("model on {device}").format(device="cpu")):
            _evaluate_on(fn, "cpu")
        with probe(tr("model on meta (shapes, no data)")):
            _evaluate_on_meta(fn)
        for device in _other_devices()[1:]:
            with probe(tr("model on {device}").format(device=device)):
                _evaluate_on(fn, device)

    return run_check(tr("Exercise 3, fix the device bugs in evaluate()"), probes)


def _bench(times: list[float]) -> BenchResult:
    """A BenchResult whose median is that of `times` (chapter 1)."""
    return BenchResult(
        label="matmul",
        median=float(np.median(times)),
        iqr=float(np.subtract(*np.percentile(times, [75, 25]))),
        times=list(times),
        number_per_run=1,
        num_threads=torch.get_num_threads(),
        device="cpu",
        method="torch.utils.benchmark",
    )


#: (m, k, n, raw times): rectangular shapes, and times where the first (cold), the fastest,
#: the slowest, the mean and the median all differ.
_GFLOPS_CASES = [
    (3, 5, 7, [9e-6, 3e-6, 40e-6, 5e-6, 4.5e-6, 6e-6]),
    (64, 3, 129, [2.5e-5, 1.1e-5, 1.3e-5, 1.2e-5, 1.7e-5, 9e-5]),
    (1, 1000, 2, [7e-7, 3e-7, 3.3e-7, 2.9e-7, 3.1e-7]),
]


def check_achieved_gflops(fn: Callable[[int, int, int, BenchResult], float]) -> CheckResult:
    """Exercise 4: GFLOP/s = 2*m*k*n / median seconds / 1e9, on several shapes and timings (chapter 1)."""

    def probes() -> None:
        for m, k, n, times in _GFLOPS_CASES:
            result = _bench(times)
            with probe(
                tr("m, k, n = {m}, {k}, {n}, times {times}").format(m=m, k=k, n=n, times=times)
            ):
                got = fn(m, k, n, result)
                expect(
                    isinstance(got, (int, float))
                    and not isinstance(got, bool)
                    and math.isfinite(got),
                    tr("return a number, got {got!r}.").format(got=got),
                )
                want = 2 * m * k * n / result.median / 1e9
                flops = 2 * m * k * n
                wrong = {
                    tr_mark("half the right answer: each multiply-add is 2 FLOPs (2*m*k*n)."): (
                        want / 2
                    ),
                    tr_mark("a billion times too big: GFLOP/s is FLOP/s divided by 1e9."): want
                    * 1e9,
                    tr_mark("you multiplied by 1e9: divide FLOP/s by 1e9 to get GFLOP/s."): (
                        want * 1e18
                    ),
                    tr_mark("a billion times too small: divide FLOP/s by 1e9 only once."): (
                        want * 1e-9
                    ),
                    tr_mark(
                        "you used the mean time: one slow outlier drags it. Use result.median."
                    ): flops / (sum(times) / len(times)) / 1e9,
                    tr_mark("you used the first time, which is a cold run. Use result.median."): (
                        flops / times[0] / 1e9
                    ),
                    tr_mark(
                        "you used the fastest time (min): it is the luckiest run, not a typical "
                        "one. Use result.median."
                    ): flops / min(times) / 1e9,
                    tr_mark("you used the slowest time (max). Use result.median."): (
                        flops / max(times) / 1e9
                    ),
                    tr_mark("you used the last time. Use result.median."): flops / times[-1] / 1e9,
                }
                for hint, value in wrong.items():
                    if not math.isclose(value, want, rel_tol=1e-6):
                        expect(
                            not math.isclose(got, value, rel_tol=1e-6),
                            tr("expected {want:.6g} GFLOP/s, got {got:.6g}: {mistake}").format(
                                want=want, got=got, mistake=tr(hint)
                            ),
                        )
                expect(
                    math.isclose(got, want, rel_tol=1e-6),
                    tr(
                        "for a ({m} x {k}) @ ({k} x {n}) matmul taking a median {median:.3g} s, "
                        "expected {want:.6g} GFLOP/s, got {got!r}. The matmul does m*n dot products "
                        "of length k."
                    ).format(m=m, k=k, n=n, median=result.median, want=want, got=got),
                )

    return run_check(tr("Exercise 4, achieved GFLOP/s from a benchmark"), probes)


def _to_numpy_call(fn: Callable[[torch.Tensor], np.ndarray], t: torch.Tensor) -> np.ndarray:
    """fn(t), with NumPy's bfloat16 refusal turned into the hint that names the fix (chapter 1)."""
    try:
        return fn(t)
    except TypeError as exc:
        if "BFloat16" not in str(exc):
            raise
        raise CheckFailed(
            tr(
                "NumPy has no bfloat16, so .numpy() refuses a bf16 tensor: convert it to float32 "
                "first (.float()), then call .numpy()."
            )
        ) from None


def check_to_numpy(fn: Callable[[torch.Tensor], np.ndarray]) -> CheckResult:
    """Exercise 5: to_numpy works for grad, bf16, other dtypes and non-CPU tensors, input untouched (chapter 1)."""

    def probes() -> None:
        cases = [
            (tr("a tensor that requires grad"), torch.linspace(-1, 1, 5, requires_grad=True)),
            (tr("a bf16 tensor"), torch.tensor([0.5, -2.0, 3.25], dtype=torch.bfloat16)),
            (tr("an fp16 tensor"), torch.tensor([0.5, -2.0, 1e-6], dtype=torch.float16)),
            (tr("an fp64 tensor"), torch.tensor([1 / 3, 2.0**60 + 1], dtype=torch.float64)),
            (tr("an int64 tensor"), torch.arange(2**53, 2**53 + 4)),
            (tr("an int32 tensor"), torch.arange(4, dtype=torch.int32)),
            (tr("a uint8 tensor"), torch.tensor([0, 255], dtype=torch.uint8)),
            (tr("a bool tensor"), torch.tensor([True, False])),
            (tr("a 0-d tensor"), torch.tensor(7.5)),
            (
                tr("a bf16 tensor that requires grad"),
                torch.ones(2, dtype=torch.bfloat16, requires_grad=True),
            ),
            (tr("a transposed (non-contiguous) tensor"), torch.arange(6).reshape(2, 3).t()),
        ]
        device = pick_device()
        if device.type not in ("cpu", "meta"):
            cases.append(
                (
                    tr("a tensor on {device}").format(device=device),
                    torch.arange(3.0, device=device),
                )
            )
            cases.append(
                (
                    tr("a grad tensor on {device}").format(device=device),
                    torch.ones(2, device=device, requires_grad=True),
                )
            )
        for what, t in cases:
            before = (t.requires_grad, t.device, t.dtype, t.detach().clone())
            with probe(what):
                got = _to_numpy_call(fn, t)
                expect(
                    isinstance(got, np.ndarray),
                    tr("return a NumPy array, got {kind}.").format(kind=type(got).__name__),
                )
                expect(
                    got.shape == tuple(t.shape),
                    tr("the shape changed: expected {want}, got {got}.").format(
                        want=tuple(t.shape), got=got.shape
                    ),
                )
                want = t.detach().cpu()
                if t.dtype == torch.bfloat16:
                    want = want.float()
                    expect(
                        got.dtype == np.float32,
                        tr("NumPy has no bfloat16; expected float32, got {dtype}.").format(
                            dtype=got.dtype
                        ),
                    )
                else:
                    expect(
                        got.dtype == want.numpy().dtype,
                        tr(
                            "keep the dtype: expected {want}, got {got}. "
                            "Convert only what NumPy cannot hold (bf16)."
                        ).format(want=want.numpy().dtype, got=got.dtype),
                    )
                expect(np.array_equal(got, want.numpy()), tr("the values changed."))
                expect(
                    (t.requires_grad, t.device, t.dtype) == before[:3]
                    and torch.equal(t.detach(), before[3]),
                    tr(
                        "your function changed the caller's tensor (its requires_grad, device, "
                        "dtype or values): work on t.detach(), never on t itself."
                    ),
                )

    return run_check(tr("Exercise 5, to_numpy for any tensor"), probes)
