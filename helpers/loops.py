"""Training loops and optimizers that the notebook prints and benchmarks/ch02 runs (chapter 2)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from helpers.devices import resolve_device, synchronize
from helpers.i18n import tr, tr_mark
from helpers.units import Printed
from helpers.validate import positive_int

#: Two of chapter 2's loops that differ only in rounding (Sigmoid + BCELoss against
#: BCEWithLogitsLoss, for-loop against foreach or fused Adam or FlatAdam, a CUDA graph against
#: the same kernels run eagerly) give losses within this of each other, step for step, over its
#: 314 steps. tests/test_same_math_ch02.py computes those gaps on permutation seeds 0-7
#: (test_rounding_only_pairs_leave_headroom): on 2026-11-27, on the course's 2-core CI machine
#: (a Xeon under KVM, torch 2.13 CPU, 1 thread, the CPU shared with a CI run), at most 1.2e-7,
#: two units in the last place of the loss, so 1e-5 leaves about 80x headroom. It bounds
#: rounding only: a change of the math itself (Adam's bias corrections from a float32 beta:
#: float32_bias_corrections) must be measured and removed first (same_but_for's `effect`).
ROUNDING_RTOL, ROUNDING_ATOL = 1e-4, 1e-5
#: The same for the parameters after those 314 steps: rounding moved a few parameters further
#: than the losses, at most 1.4e-6 (seed 5, the same runs), so 1e-4 leaves about 70x headroom.
ROUNDING_PARAMS_ATOL = 1e-4


def best_adam_impl(device: str | torch.device) -> str:
    """'fused' where this torch has a fused Adam for `device`, else 'foreach' (chapter 2)."""
    probe = torch.zeros(1, device=resolve_device(device), requires_grad=True)
    probe.grad = torch.zeros_like(probe)
    try:  # newer torch checks the device at the first step, older at construction
        torch.optim.Adam([probe], fused=True).step()
    except Exception:  # RuntimeError on most devices; be lenient on exotic backends
        return "foreach"
    return "fused"


def make_adam(
    params: Iterable[nn.Parameter], lr: float = 1e-3, impl: str = "for-loop"
) -> torch.optim.Adam:
    """Adam with one implementation: 'for-loop' (one op per tensor), 'foreach', 'fused' or 'capturable' (chapter 2)."""
    flags = {
        "for-loop": {"foreach": False},
        "foreach": {"foreach": True},
        "fused": {"fused": True},
        "capturable": {"foreach": True, "capturable": True},  # what a CUDA graph needs
    }
    if impl not in flags:
        raise ValueError(
            tr("impl must be one of {kinds}, got {impl!r}.").format(kinds=tuple(flags), impl=impl)
        )
    params = list(params)
    if impl == "fused":
        devices = {p.device for p in params}
        unsupported = sorted(str(d) for d in devices if best_adam_impl(d) != "fused")
        if unsupported:
            raise RuntimeError(
                tr(
                    "Adam(impl='fused') is not supported on {devices} with torch "
                    "{version}. Use impl='foreach' (or best_adam_impl(device))."
                ).format(devices=", ".join(unsupported), version=torch.__version__)
            )
    return torch.optim.Adam(params, lr=lr, **flags[impl])


#: The device types whose fused Adam kernel computes the bias corrections 1 - beta**t from beta
#: as a double, like the Python floats of the for-loop and foreach paths, and rounds only the
#: result to float32: CUDA (aten/src/ATen/native/cuda/fused_adam_utils.cuh, beta a double) and
#: the CPU (native/cpu/FusedAdamKernel.cpp: "need to use double here to align with non-fused
#: adam"). MPS's Metal kernel (native/mps/kernels/FusedOptimizerOps.metal) takes `constant
#: float& beta1, beta2` and computes 1 - pow(beta, t) in float32; other devices' fused kernels
#: are not known here.
FUSED_ADAM_FLOAT64_DEVICES = ("cuda", "cpu")


def float32_bias_corrections(impl: str, device: str | torch.device) -> bool:
    """Whether make_adam(impl=...) computes 1 - beta**t from a float32 beta on `device`: capturable anywhere, fused off CUDA and CPU (chapter 2).

    Where it does, the run differs from float64 Adam by a few parts per million per update,
    systematically (fp32(0.999) = 0.99900001287): not rounding, so measure it (adam_pair).
    """
    kinds = ("for-loop", "foreach", "fused", "capturable")
    if impl not in kinds:
        raise ValueError(
            tr("impl must be one of {kinds}, got {impl!r}.").format(kinds=kinds, impl=impl)
        )
    if impl == "capturable":  # the step count is a float32 tensor: torch._foreach_pow(beta, steps)
        return True
    if impl == "fused":
        return resolve_device(device).type not in FUSED_ADAM_FLOAT64_DEVICES
    return False  # Python floats: 1 - beta**step in float64


def flatten_parameters(model: nn.Module) -> nn.Parameter:
    """Make `model`'s parameters (and .grads) views of one flat tensor (and its .grad); returns it (chapter 2)."""
    params = list(model.parameters())
    if not params:
        raise ValueError(tr("The model has no parameters to flatten."))
    kinds = {(p.device, p.dtype) for p in params}
    if len(kinds) > 1:
        raise ValueError(
            tr(
                "All parameters must share one device and dtype to live in one buffer; got "
                "{kinds}. Move the model with .to(device, dtype) first."
            ).format(kinds=sorted(f"{d}/{t}" for d, t in kinds))
        )
    if not all(p.requires_grad for p in params):
        raise ValueError(
            tr("Every parameter must require grad (unfreeze them, or leave them out).")
        )
    flat = nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
    flat.grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        n = p.numel()
        # `.data` swaps the storage behind the Parameter without autograd seeing an operation
        p.data = flat.data[offset : offset + n].view_as(p)
        p.grad = flat.grad[offset : offset + n].view_as(p)
        offset += n
    return flat


class FlatAdam:
    """Adam on one flat parameter in seven tensor ops: torch.optim.Adam's math without its per-step bookkeeping (chapter 2)."""

    def __init__(
        self,
        flat: torch.Tensor,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        if not isinstance(flat, torch.Tensor) or flat.dim() != 1 or flat.grad is None:
            raise ValueError(
                tr(
                    "FlatAdam needs the 1-D parameter returned by flatten_parameters(model), whose "
                    ".grad is the gradient buffer."
                )
            )
        if not lr > 0 or not eps > 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(
                tr("Need lr > 0, eps > 0 and 0 <= betas < 1; got {lr}, {eps}, {betas}.").format(
                    lr=lr, eps=eps, betas=betas
                )
            )
        self.flat, self.lr, self.betas, self.eps = flat, float(lr), betas, float(eps)
        self.steps = 0  # a Python int: reading it never syncs
        self.exp_avg = torch.zeros_like(flat)
        self.exp_avg_sq = torch.zeros_like(flat)

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the gradient buffer in place; never None, because the model's .grad are views of it (chapter 2)."""
        self.flat.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        """One Adam update of the flat parameter, the formula of torch.optim.Adam (chapter 2)."""
        self.steps += 1
        beta1, beta2 = self.betas
        grad = self.flat.grad
        self.exp_avg.lerp_(grad, 1 - beta1)  # m = beta1 * m + (1 - beta1) * g
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)  # v = beta2 * v + ...
        bias1 = 1 - beta1**self.steps
        bias2_sqrt = math.sqrt(1 - beta2**self.steps)
        denom = (self.exp_avg_sq.sqrt() / bias2_sqrt).add_(self.eps)
        self.flat.addcdiv_(self.exp_avg, denom, value=-self.lr / bias1)


def sources_epoch(
    model: nn.Module,
    loader: Iterable,
    optimizer: torch.optim.Optimizer,
    criterion: nn.Module,
    device: torch.device,
) -> list[float]:
    """One epoch of the sources' loop, made device-agnostic; returns each step's loss (chapter 2)."""
    model.train()
    losses = []
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = criterion(output, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())  # a host sync on every step
    return losses


def fast_epoch(
    model: nn.Module,
    batches: Iterable,
    optimizer: torch.optim.Optimizer | FlatAdam,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    set_to_none: bool = True,
) -> list[float]:
    """One epoch over device-resident batches, one host sync at the end; returns each step's loss (chapter 2)."""
    model.train()
    losses = []
    for xb, yb in batches:
        optimizer.zero_grad(set_to_none=set_to_none)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())  # stays on the device: no sync
    return torch.stack(losses).tolist()  # the one host sync of the epoch


@contextmanager
def torch_threads(n: int | None) -> Iterator[int]:
    """Run a block with `n` intra-op CPU threads (None: unchanged), then restore the old count (chapter 2)."""
    old = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(positive_int(n, tr("n (threads)")))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(old)


def time_once(fn: Callable[[], object], device: str | torch.device = "cpu") -> float:
    """Seconds one call of fn() takes, syncing the device before and after: for one-off costs like compiling (chapter 2)."""
    if not callable(fn):
        raise TypeError(
            tr("time_once() needs a function to call, got {type}.").format(type=type(fn).__name__)
        )
    device = resolve_device(device)
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


@dataclass
class EagerRun:
    """The losses of every step and the final parameters (one vector) of one training run (chapter 2)."""

    losses: list[float]
    params: torch.Tensor


def adam_pair(
    make_model: Callable[[], nn.Module],
    make_batches: Callable[[], Iterable],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    epochs: int,
    impl: str,
    lr: float = 1e-3,
) -> tuple[EagerRun, EagerRun]:
    """The eager loop twice from the same start and batches: foreach Adam, then make_adam(impl=...); what `impl` changes (chapter 2)."""
    epochs = positive_int(epochs, "epochs")
    runs = []
    for kind in ("foreach", impl):
        model, batches = make_model(), make_batches()
        opt = make_adam(model.parameters(), lr=lr, impl=kind)
        losses = [v for _ in range(epochs) for v in fast_epoch(model, batches, opt, loss_fn)]
        runs.append(EagerRun(losses, parameters_to_vector(model.parameters()).detach().clone()))
    return runs[0], runs[1]


def _as_vector(values: Sequence[float] | torch.Tensor, name: str) -> torch.Tensor:
    """Losses or parameters as one float64 vector on the CPU; a clear error otherwise (chapter 2)."""
    try:
        vector = torch.as_tensor(values, dtype=torch.float64, device="cpu").detach().reshape(-1)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ValueError(
            tr("{name} must be numbers (a list or a tensor), got {type}.").format(
                name=name, type=type(values).__name__
            )
        ) from exc
    if not torch.isfinite(vector).all():
        raise ValueError(
            tr("{name} holds a NaN or an infinity: the run diverged.").format(name=name)
        )
    return vector


@dataclass(repr=False)
class SameButFor(Printed):
    """Two runs compared value by value, before and after removing a measured effect (chapter 2)."""

    what: str
    count: int
    gap: float  # largest |final - reference|
    effect: float | None  # largest |with - without| of the removed effect; None: nothing removed
    residual: float  # largest |final - reference - (with - without)|
    beyond: int  # values beyond the rounding tolerance once the effect is removed
    rtol: float
    atol: float
    effect_name: str = ""

    @property
    def ok(self) -> bool:
        """Every value within rounding of the reference, once the effect is removed (chapter 2)."""
        return self.beyond == 0

    def __str__(self) -> str:
        if self.ok:
            verdict = tr("within rounding")
        else:
            verdict = tr("{n} value(s) BEYOND rounding").format(n=self.beyond)
        tol = f"(rtol {self.rtol:g}, atol {self.atol:g})"
        what = _name(self.what)
        if self.effect is None:
            return tr("{what}: {count} values, largest gap {gap:.1e}: {verdict} {tol}").format(
                what=what, count=self.count, gap=self.gap, verdict=verdict, tol=tol
            )
        return tr(
            "{what}: {count} values, largest gap {gap:.1e}; {effect_name} alone moves them by "
            "up to {effect:.1e}; with that removed, the largest gap is {residual:.1e}: "
            "{verdict} {tol}"
        ).format(
            what=what,
            count=self.count,
            gap=self.gap,
            effect_name=_name(self.effect_name),
            effect=self.effect,
            residual=self.residual,
            verdict=verdict,
            tol=tol,
        )


#: same_but_for's default names of what it compares and of the removed effect, for the catalog.
DEFAULT_WHAT, DEFAULT_EFFECT = tr_mark("losses"), tr_mark("the known effect")
#: The one-word name chapter 2 gives (what="parameters"): a translated notebook keeps one-word
#: strings English, so it is translated here.
SHOWN_NAMES = (tr_mark("parameters"),)


def _name(name: str) -> str:
    """A name given to same_but_for, in the learner's language where the catalogs have it (chapter 2).

    A name that is already in the learner's language (a translated notebook's string) or has
    no catalog entry prints as it was given.
    """
    return tr(name) if name else name


def same_but_for(
    final: Sequence[float] | torch.Tensor,
    reference: Sequence[float] | torch.Tensor,
    effect: tuple[Sequence[float], Sequence[float]] | None = None,
    *,
    what: str = DEFAULT_WHAT,
    effect_name: str = DEFAULT_EFFECT,
    rtol: float = ROUNDING_RTOL,
    atol: float = ROUNDING_ATOL,
) -> SameButFor:
    """Is `final` `reference` up to rounding, once `effect` = (without, with) is subtracted value by value? (chapter 2)"""
    a, b = _as_vector(final, "final"), _as_vector(reference, "reference")
    if a.shape != b.shape:
        raise ValueError(
            tr("Compare runs of the same length: final has {a} values, reference {b}.").format(
                a=len(a), b=len(b)
            )
        )
    shift, size = torch.zeros_like(a), None
    if effect is not None:
        without, with_ = (_as_vector(v, f"effect[{i}]") for i, v in enumerate(effect))
        if without.shape != a.shape or with_.shape != a.shape:
            raise ValueError(
                tr(
                    "The effect's two runs need {n} values each, like final; got "
                    "{without} and {with_}."
                ).format(n=len(a), without=len(without), with_=len(with_))
            )
        shift = with_ - without  # what the effect alone changes, value by value
        size = shift.abs().max().item() if len(shift) else 0.0
    residual = (a - b - shift).abs()
    beyond = int((residual > atol + rtol * b.abs()).sum())  # torch.testing.assert_close's rule
    largest = (a - b).abs().max().item() if len(a) else 0.0
    rest = residual.max().item() if len(a) else 0.0
    return SameButFor(what, len(a), largest, size, rest, beyond, rtol, atol, effect_name)
