"""Checkers for chapter 3's exercises: fp16 rounding, the AMP dtype, the AMP step, the scaler checkpoint (chapter 3)."""

from __future__ import annotations

import copy
import math
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch
from torch import nn

from helpers.amp_choice import choose_amp_dtype
from helpers.checks import CheckFailed, CheckResult, expect, probe, run_check
from helpers.data import make_classification_data
from helpers.i18n import tr, tr_mark

_SUB = 2.0**-24  # fp16's smallest subnormal
_NORMAL = 2.0**-14  # fp16's smallest normal

# (value, hint if the answer is wrong). The values stay clear of exact rounding ties.
_FATE_PROBES: list[tuple[float, str]] = [
    (1.0, tr_mark("1.0 is an ordinary fp16 number")),
    (0.0, tr_mark("zero stays zero")),
    (1e-4, tr_mark("1e-4 is above fp16's smallest normal number (about 6.1e-5)")),
    (
        5e-5,
        tr_mark(
            "5e-5 is below the smallest normal (6.1e-5) but far above the smallest subnormal "
            "(6e-8): fp16 keeps it as a subnormal, not zero"
        ),
    ),
    (
        1e-6,
        tr_mark(
            "1e-6 is below the smallest normal (6.1e-5): fp16 keeps it as a subnormal, not zero"
        ),
    ),
    (
        4e-8,
        tr_mark(
            "values round to the NEAREST fp16 number: 4e-8 rounds up to the smallest subnormal 5.96e-8"
        ),
    ),
    (
        2e-8,
        tr_mark("2e-8 is closer to 0 than to the smallest subnormal 5.96e-8, so it rounds to zero"),
    ),
    (1e-9, tr_mark("1e-9 is far below the smallest subnormal (5.96e-8): it underflows to zero")),
    (-1e-9, tr_mark("the sign does not matter: -1e-9 underflows to (negative) zero")),
    (-3e-5, tr_mark("the sign does not matter: -3e-5 is a (negative) subnormal")),
    (6.5e4, tr_mark("65,000 is below fp16's max (65,504)")),
    (65510.0, tr_mark("65,510 rounds to the nearest fp16 number, 65,504, which is finite")),
    (
        65519.0,
        tr_mark("65,519 is closer to 65,504 than to the next step (65,536): it rounds to max"),
    ),
    (6.6e4, tr_mark("66,000 is above fp16's max (65,504): it overflows to inf")),
    (-7e4, tr_mark("-70,000 overflows to -inf: answer 'inf' for either sign")),
    (
        _NORMAL - _SUB / 4,
        tr_mark(
            "2**-14 - 2**-26 lies between the largest subnormal (2**-14 - 2**-24) and the smallest "
            "normal 2**-14, closer to the normal: it rounds UP to the smallest normal"
        ),
    ),
    (
        -(_NORMAL - _SUB / 4),
        tr_mark("the sign does not matter: -(2**-14 - 2**-26) rounds to minus the smallest normal"),
    ),
    (
        _NORMAL - _SUB,
        tr_mark("2**-14 - 2**-24 is exactly the largest subnormal: it stays a subnormal"),
    ),
    (
        _NORMAL - 0.75 * _SUB,
        tr_mark(
            "2**-14 - 0.75 * 2**-24 is closer to the largest subnormal than to 2**-14: subnormal"
        ),
    ),
    (_SUB * 0.75, tr_mark("0.75 * 2**-24 rounds up to the smallest subnormal 2**-24")),
    (_SUB * 0.25, tr_mark("0.25 * 2**-24 rounds down to zero")),
    (1e-300, tr_mark("1e-300 underflows to zero")),
    (float("inf"), tr_mark("inf stays inf")),
    (3.4e38, tr_mark("3.4e38 (fp32's max) overflows fp16 to inf")),
]


def _cast_fate(x: float) -> str:
    """What a correctly rounded cast of x to fp16 gives: 'zero', 'subnormal', 'normal', 'inf' (chapter 3)."""
    with np.errstate(over="ignore"):
        h = abs(float(np.float16(x)))
    if math.isinf(h):
        return "inf"
    if h == 0.0:
        return "zero"
    return "subnormal" if h < _NORMAL else "normal"


def _sampled_values() -> list[float]:
    """Values across fp16's whole range and both signs, clear of rounding ties (chapter 3)."""
    values = []
    for e in range(-27, 18):
        for m in (1.0, 1.1, 1.37, 1.5, 1.73, 1.999):
            for sign in (1.0, -1.0):
                values.append(sign * m * 2.0**e)
    for k in range(1, 40):  # the bands under the smallest normal and around max
        values += [_NORMAL - k * _SUB / 7, 65504.0 + k * 0.41, k * _SUB / 9]
    # torch casts float64 via float32 (two roundings); keep values where that does not matter
    with np.errstate(over="ignore"):
        return [v for v in values if np.float16(np.float32(v)) == np.float16(v)]


def check_fp16_fate(fn: Callable[[float], str]) -> CheckResult:
    """Exercise 1: fp16_fate(x) says 'zero', 'subnormal', 'normal' or 'inf' like a real cast (chapter 3)."""

    def probes() -> None:
        for value, hint in _FATE_PROBES:
            with probe(f"fp16_fate({value!r})"):
                got = fn(value)
                expect(
                    type(got) is str and got in ("zero", "subnormal", "normal", "inf"),
                    tr("return one of 'zero', 'subnormal', 'normal', 'inf'; got {got!r}.").format(
                        got=got
                    ),
                )
                expected = _cast_fate(value)
                expect(
                    got == expected,
                    tr("expected {expected!r}, got {got!r}: {why}.").format(
                        expected=expected, got=got, why=tr(hint)
                    ),
                )
        wrong = []
        for value in _sampled_values():
            with probe(f"fp16_fate({value!r})"):
                got = fn(value)
            if type(got) is not str or got != _cast_fate(value):
                wrong.append((value, got))
        examples = ", ".join(
            tr("fp16_fate({v!r}) = {got!r}, a cast gives {cast!r}").format(
                v=v, got=g, cast=_cast_fate(v)
            )
            for v, g in wrong[:3]
        )
        expect(
            not wrong,
            tr(
                "{wrong} of {total} values across fp16's range get the wrong answer, e.g. "
                "{examples}. Compare |x| with the rounding boundaries: half a step beyond each edge."
            ).format(wrong=len(wrong), total=len(_sampled_values()), examples=examples),
        )

    return run_check(tr("Exercise 1: predict what fp16 does to a value"), probes)


_MACHINES: list[tuple[str, dict[str, Any], str]] = [
    (
        "Tesla T4",
        {"kind": "cuda", "name": "Tesla T4", "compute_capability": (7, 5), "bf16_reported": True},
        tr_mark(
            "a T4 (7.5) *reports* bf16 because torch counts emulation; it has fp16 tensor cores only"
        ),
    ),
    (
        "Tesla V100",
        {"kind": "cuda", "name": "Tesla V100", "compute_capability": (7, 0), "bf16_reported": True},
        tr_mark("compute capability 7.x means fp16 tensor cores, so fp16 with a GradScaler"),
    ),
    (
        "A100",
        {
            "kind": "cuda",
            "name": "NVIDIA A100",
            "compute_capability": (8, 0),
            "bf16_reported": True,
        },
        tr_mark("compute capability >= 8.0 has bf16 tensor cores: bf16, no scaler"),
    ),
    (
        "H100",
        {
            "kind": "cuda",
            "name": "NVIDIA H100",
            "compute_capability": (9, 0),
            "bf16_reported": True,
        },
        tr_mark("compute capability 9.0 >= 8.0: bf16, no scaler"),
    ),
    (
        "RTX 4090",
        {"kind": "cuda", "name": "RTX 4090", "compute_capability": (8, 9), "bf16_reported": True},
        tr_mark("compute capability 8.9 >= 8.0: bf16, no scaler"),
    ),
    (
        "GTX 1080",
        {"kind": "cuda", "name": "GTX 1080", "compute_capability": (6, 1), "bf16_reported": True},
        tr_mark("below compute capability 7.0 there are no tensor cores: keep fp32"),
    ),
    (
        tr_mark("Xeon with AMX"),
        {
            "kind": "cpu",
            "name": "Xeon 8480",
            "cpu_flags": ["avx2", "avx512f", "amx_bf16", "amx_tile"],
        },
        tr_mark("'amx_bf16' in the CPU flags means bf16 in hardware"),
    ),
    (
        tr_mark("EPYC with AVX512-BF16"),
        {"kind": "cpu", "name": "EPYC 9654", "cpu_flags": ["avx2", "avx512f", "avx512_bf16"]},
        tr_mark("'avx512_bf16' in the CPU flags means bf16 instructions"),
    ),
    (
        tr_mark("Xeon, AVX-512 only"),
        {"kind": "cpu", "name": "Xeon 6248", "cpu_flags": ["avx2", "avx512f", "avx512bw"]},
        tr_mark(
            "no bf16 flag: bf16 would be emulated (measured 0.22x fp32) and fp16 is slower still, so fp32"
        ),
    ),
    (
        "Apple M2",
        {"kind": "mps", "name": "Apple M2"},
        tr_mark("an Apple GPU computes fp16 natively: fp16 with a GradScaler"),
    ),
    # names that decide nothing: the compute capability does
    (
        tr_mark("an unnamed GPU of compute capability 8.6"),
        {"kind": "cuda", "name": "GPU 0", "compute_capability": (8, 6), "bf16_reported": True},
        tr_mark("decide by compute_capability, not by the name: 8.6 >= 8.0 means bf16, no scaler"),
    ),
    (
        tr_mark("an unnamed GPU of compute capability 7.2"),
        {"kind": "cuda", "name": "GPU 1", "compute_capability": (7, 2), "bf16_reported": True},
        tr_mark(
            "decide by compute_capability, not by the name: 7.2 is 7.x, fp16 tensor cores, so fp16 "
            "with a GradScaler"
        ),
    ),
    (
        tr_mark("compute capability 12.0"),
        {"kind": "cuda", "name": "GPU 2", "compute_capability": (12, 0), "bf16_reported": True},
        tr_mark(
            "12.0 >= 8.0: compare (major, minor) as numbers, e.g. tuple(cc) >= (8, 0), not as text "
            "('12.0' < '8.0' as strings) and not the minor number alone"
        ),
    ),
    (
        tr_mark("Tesla P100 (6.0, no bf16 reported)"),
        {"kind": "cuda", "name": "GPU 3", "compute_capability": (6, 0), "bf16_reported": False},
        tr_mark("below compute capability 7.0 there are no tensor cores: keep fp32"),
    ),
    (
        tr_mark("a CPU with no flags listed"),
        {"kind": "cpu", "name": "CPU 0", "cpu_flags": []},
        tr_mark("no bf16 flag: fp32"),
    ),
]


def check_pick_amp_dtype(fn: Callable[[dict[str, Any]], tuple[str, bool]]) -> CheckResult:
    """Exercise 2: pick_amp_dtype(description) -> ('bf16' | 'fp16' | 'fp32', use_scaler) (chapter 3)."""

    def probes() -> None:
        for label, desc, hint in _MACHINES:
            with probe(tr(label)):
                _one_amp_dtype(fn, desc, tr(hint))

    return run_check(tr("Exercise 2: pick the AMP dtype for a machine"), probes)


def _one_amp_dtype(
    fn: Callable[[dict[str, Any]], tuple[str, bool]], desc: dict[str, Any], hint: str
) -> None:
    """One machine of check_pick_amp_dtype: the answer, its types, the description unchanged (chapter 3)."""
    given = copy.deepcopy(desc)
    got = fn(given)
    expect(
        given == desc,
        tr(
            "your function changed the description it was given (now {given!r}): read it, do "
            "not pop, set or sort its entries; the caller still needs it."
        ).format(given=given),
    )
    expect(
        isinstance(got, tuple) and len(got) == 2,
        tr("return a pair (dtype name, use_scaler), e.g. ('fp16', True); got {got!r}.").format(
            got=got
        ),
    )
    name, use_scaler = got
    expected = choose_amp_dtype(desc)
    expect(
        name == expected.name,
        tr("expected {expected!r}, got {got!r}: {why}.").format(
            expected=expected.name, got=name, why=hint
        ),
    )
    expect(
        isinstance(use_scaler, (bool, np.bool_)),
        tr("use_scaler must be True or False, not {got!r}.").format(got=use_scaler),
    )
    expect(
        bool(use_scaler) == expected.use_scaler,
        tr(
            "use_scaler should be {want} (only fp16 needs a GradScaler; bf16 has fp32's range)."
        ).format(want=expected.use_scaler),
    )


def _grad_norm(params: list[nn.Parameter]) -> float:
    """Total L2 norm of the parameters' gradients, in fp32 (chapter 3)."""
    grads = [p.grad.detach().float() for p in params if p.grad is not None]
    if not grads:
        return 0.0
    return torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g) for g in grads])
    ).item()


class _SpyScaler(torch.amp.GradScaler):
    """A CPU GradScaler that records how the learner's step uses it (chapter 3)."""

    def __init__(self, params: list[nn.Parameter], enabled: bool) -> None:
        super().__init__("cpu", init_scale=2.0**10, enabled=enabled)
        self.params = params
        self.events: list[str] = []
        self.at_step: list[tuple[float, bool]] = []  # (grad norm, unscale_ called first)
        self._explicit_unscale = False
        self._inside_step = False
        self._scaled = False

    def scale(self, outputs):  # noqa: ANN001, ANN201 - mirrors GradScaler.scale
        self.events.append("scale")
        self._scaled = True
        return super().scale(outputs)

    def _require_scaled(self) -> None:
        """Fail with a hint (not torch's assertion) when the loss was never scaled (chapter 3)."""
        if self.is_enabled() and not self._scaled:
            raise CheckFailed(
                tr(
                    "{name}: call scaler.scale(loss).backward(), not loss.backward(), so fp16 "
                    "gradients do not underflow (a disabled scaler just returns the loss)."
                ).format(name="fp16")
            )

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        self._require_scaled()
        if not self._inside_step:
            self.events.append("unscale_")
            self._explicit_unscale = True
        super().unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        self._require_scaled()
        self.events.append("step")
        self.at_step.append((_grad_norm(self.params), self._explicit_unscale))
        self._inside_step = True
        try:
            return super().step(optimizer, *args, **kwargs)
        finally:
            self._inside_step = False

    def update(self, new_scale: Any = None) -> None:
        self.events.append("update")
        self._explicit_unscale = self._scaled = False
        super().update(new_scale)


def _true_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype, seen: list) -> float:  # noqa: ANN001
    """The step's loss as a correct answer computes it, before the step; `seen` untouched (chapter 3)."""
    n = len(seen)
    with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
        value = nn.BCEWithLogitsLoss()(model(x), y).item()
    del seen[n:]  # this forward is the checker's, not the learner's
    return value


def _expect_unscaled(got: float, want: float, scaler: torch.amp.GradScaler, name: str) -> None:
    """The returned loss is the true loss, not the scaled one (chapter 3)."""
    scale = scaler.get_scale() if scaler.is_enabled() else 1.0
    # The same forward in the same dtype gives the same loss up to summation order; 1% covers
    # that many times over, and a scale >= 2 (the probe's is 1024) is 100% or more away.
    if math.isclose(got, want, rel_tol=1e-2, abs_tol=1e-6):
        return
    if scale != 1.0 and math.isclose(got, want * scale, rel_tol=1e-2):
        raise CheckFailed(
            tr(
                "{name}: you returned {got:.4g}, the loss times the scaler's scale ({scale:g}): "
                "scaler.scale(loss) is for backward() only. Return loss.item(), the unscaled loss."
            ).format(name=name, got=got, scale=scale)
        )
    raise CheckFailed(
        tr(
            "{name}: you returned {got:.4g}, but the step's loss (computed under autocast before "
            "the step) is {want:.4g}: return loss.item() of this step's forward."
        ).format(name=name, got=got, want=want)
    )


def _probe_train_step(fn: Callable[..., Any], dtype: torch.dtype, steps: int = 20) -> None:
    """Run the learner's AMP step on CPU in `dtype` and check every rule (chapter 3)."""
    name = "fp16" if dtype == torch.float16 else "bf16"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 1))
    params = list(model.parameters())
    optimizer = torch.optim.Adam(params, lr=0.05)
    scaler = _SpyScaler(params, enabled=dtype == torch.float16)  # scale 1024 in fp16
    x, y = make_classification_data(256, 20, seed=1)
    max_norm = 1e-3  # far below the true gradient norm, so clipping always acts
    seen: list[torch.dtype] = []
    model[0].register_forward_hook(lambda mod, inp, out: seen.append(out.dtype))
    losses = []
    for _ in range(steps):
        for p in params:  # stale gradients from "before": a correct step discards them
            p.grad = torch.full_like(p, float("nan"))
        before, want = len(scaler.events), _true_loss(model, x, y, dtype, seen)
        loss = fn(model, optimizer, scaler, x, y, nn.BCEWithLogitsLoss(), "cpu", dtype, max_norm)
        expect(
            isinstance(loss, (float, int)) or (torch.is_tensor(loss) and loss.numel() == 1),
            tr("return the loss as a float (loss.item()), got {type}.").format(
                type=type(loss).__name__
            ),
        )
        _expect_unscaled(float(loss), want, scaler, name)
        losses.append(float(loss))
        events = scaler.events[before:]
        expect(seen, tr("the model was never called: compute model(x) inside the step."))
        expect(
            seen[-1] == dtype,
            tr(
                "{name}: the first Linear produced {got}, not {dtype}: run the forward pass "
                "and the loss inside `with torch.autocast(device_type, dtype=dtype):`."
            ).format(name=name, got=seen[-1], dtype=dtype),
        )
        expect(
            "scale" in events,
            tr(
                "{name}: call scaler.scale(loss).backward(), not loss.backward(), so fp16 "
                "gradients do not underflow (a disabled scaler just returns the loss)."
            ).format(name=name),
        )
        expect(
            "step" in events,
            tr(
                "{name}: call scaler.step(optimizer) instead of optimizer.step(): the scaler skips "
                "steps whose gradients are inf/nan."
            ).format(name=name),
        )
        expect(
            "update" in events[events.index("step") :],
            tr("{name}: call scaler.update() after scaler.step(optimizer), every step.").format(
                name=name
            ),
        )
        norm, unscaled_first = scaler.at_step[-1]
        expect(
            math.isfinite(norm),
            tr(
                "{name}: the gradients at scaler.step() are nan: gradients from before the call "
                "leaked in. Start with optimizer.zero_grad(set_to_none=True)."
            ).format(name=name),
        )
        if scaler.is_enabled():
            expect(
                unscaled_first,
                tr(
                    "{name}: call scaler.unscale_(optimizer) before clipping (and before "
                    "scaler.step), so that max_norm applies to the true gradients."
                ).format(name=name),
            )
        expect(
            norm <= max_norm * 1.01,
            tr(
                "{name}: the gradient norm at scaler.step() was {norm:.3g} > max_norm={max_norm}: "
                "clip with torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) after "
                "unscale_ and before step."
            ).format(name=name, norm=norm, max_norm=max_norm),
        )
        expect(
            norm >= max_norm * 0.99,
            tr(
                "{name}: the gradient norm at scaler.step() was {norm:.3g}, far below max_norm="
                "{max_norm}: you clipped the *scaled* gradients. Call scaler.unscale_(optimizer) "
                "first, then clip."
            ).format(name=name, norm=norm, max_norm=max_norm),
        )
    expect(
        all(math.isfinite(v) for v in losses) and sum(losses[-3:]) / 3 < 0.9 * losses[0],
        tr(
            "{name}: the loss did not go down over {steps} steps ({first:.3f} -> "
            "{last:.3f}); check that the optimizer really steps."
        ).format(name=name, steps=steps, first=losses[0], last=losses[-1]),
    )


def check_amp_train_step(fn: Callable[..., Any]) -> CheckResult:
    """Exercise 3: one AMP step: autocast, scaled backward, unscale_, clip, step, update (chapter 3)."""

    def probes() -> None:
        _probe_train_step(fn, torch.float16)
        _probe_train_step(fn, torch.bfloat16)

    return run_check(tr("Exercise 3: the AMP training step"), probes)


def _scaler_history(
    model: nn.Module, optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler
) -> None:
    """One skipped (inf) step, then two clean ones: scale halved, growth counter at 2 (chapter 3)."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
    for factor in (float("inf"), 1.0, 1.0):
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(model(x).pow(2).mean() * factor).backward()
        scaler.step(optimizer)
        scaler.update()


def _fresh(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler]:
    """A model, Adam and a CPU GradScaler that doubles after 3 clean steps (chapter 3)."""
    torch.manual_seed(seed)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, optimizer, torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=3)


@contextmanager
def _spy_loads() -> Iterator[list[Any]]:
    """Record every object whose load_state_dict() is called inside the block (chapter 3)."""
    seen: list[Any] = []
    with ExitStack() as stack:
        for cls in (nn.Module, torch.optim.Optimizer, torch.amp.GradScaler):
            real = cls.load_state_dict

            def spy(self: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
                seen.append(self)
                return _real(self, *args, **kwargs)

            stack.enter_context(mock.patch.object(cls, "load_state_dict", spy))
        yield seen


def _expect_restored(
    saved: tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler],
    loaded: tuple[nn.Module, torch.optim.Optimizer, torch.amp.GradScaler],
    loaded_into: list[Any],
) -> None:
    """The objects load_checkpoint was given hold what was saved, restored in place (chapter 3)."""
    (model, optimizer, scaler), (model2, optimizer2, scaler2) = saved, loaded
    for what, given, cls in (
        ("model", model2, nn.Module),
        ("optimizer", optimizer2, torch.optim.Optimizer),
        ("GradScaler", scaler2, torch.amp.GradScaler),
    ):
        others = [o for o in loaded_into if isinstance(o, cls) and o is not given]
        expect(
            not others or any(o is given for o in loaded_into),
            tr(
                "you called load_state_dict() on a new {new}, not on the {what} you were "
                "given: load_checkpoint restores in place, into its arguments "
                "({what}.load_state_dict(...)); a new object is lost when it returns."
            ).format(new=type(others[0]).__name__ if others else what, what=what),
        )
    expect(
        all(
            torch.equal(a, b)
            for a, b in zip(model.state_dict().values(), model2.state_dict().values())
        ),
        tr(
            "the model's weights were not restored: save model.state_dict() and call "
            "model.load_state_dict()."
        ),
    )
    expect(
        optimizer2.state_dict()["state"]
        and torch.equal(
            optimizer2.state_dict()["state"][0]["exp_avg"],
            optimizer.state_dict()["state"][0]["exp_avg"],
        ),
        tr(
            "the optimizer's state (Adam's moments) was not restored: save "
            "optimizer.state_dict() and call optimizer.load_state_dict()."
        ),
    )
    expect(
        scaler2.get_scale() == scaler.get_scale(),
        tr(
            "the GradScaler's scale is {loaded:g} after loading, but was {saved:g} when "
            "saved: save scaler.state_dict() and call scaler.load_state_dict()."
        ).format(loaded=scaler2.get_scale(), saved=scaler.get_scale()),
    )
    expect(
        scaler2.state_dict() == scaler.state_dict(),
        tr("the GradScaler's growth counter was not restored: load the whole scaler.state_dict()."),
    )


def check_scaler_checkpoint(
    save_fn: Callable[[Path, nn.Module, torch.optim.Optimizer, torch.amp.GradScaler], Any],
    load_fn: Callable[[Path, nn.Module, torch.optim.Optimizer, torch.amp.GradScaler], Any],
) -> CheckResult:
    """Exercise 4: a checkpoint restores model, optimizer and GradScaler, and loads with weights_only (chapter 3)."""

    def probes() -> None:
        model, optimizer, scaler = _fresh(seed=0)
        _scaler_history(model, optimizer, scaler)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "checkpoint.pt"
            before = (copy.deepcopy(model.state_dict()), scaler.state_dict())
            save_fn(path, model, optimizer, scaler)
            expect(
                scaler.state_dict() == before[1]
                and all(
                    torch.equal(a, b)
                    for a, b in zip(model.state_dict().values(), before[0].values())
                ),
                tr(
                    "save_checkpoint changed the model or the GradScaler it saved: saving only "
                    "reads them."
                ),
            )
            expect(
                path.exists(),
                tr("save_checkpoint did not write {file}: torch.save(..., path).").format(
                    file=path.name
                ),
            )
            try:
                torch.load(path, weights_only=True)
            except Exception as exc:
                raise CheckFailed(
                    tr(
                        "torch.load(path, weights_only=True) cannot read the checkpoint: save the "
                        "state_dict()s (plain tensors and numbers), not the objects "
                        "({error})."
                    ).format(error=type(exc).__name__)  # torch's long English text: not a hint
                ) from None
            model2, optimizer2, scaler2 = _fresh(seed=1)
            with _spy_loads() as loaded_into:
                load_fn(path, model2, optimizer2, scaler2)
        _expect_restored((model, optimizer, scaler), (model2, optimizer2, scaler2), loaded_into)

    return run_check(tr("Exercise 4: checkpoint the GradScaler"), probes)
