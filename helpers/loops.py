"""Training loops and optimizers that the notebook prints and benchmarks/ch02 runs (chapter 2)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from helpers.devices import resolve_device, synchronize
from helpers.validate import positive_int


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
    """Adam with one implementation: 'for-loop' (one op per tensor), 'foreach' or 'fused' (chapter 2)."""
    flags = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    if impl not in flags:
        raise ValueError(f"impl must be one of {tuple(flags)}, got {impl!r}.")
    params = list(params)
    if impl == "fused":
        devices = {p.device for p in params}
        unsupported = sorted(str(d) for d in devices if best_adam_impl(d) != "fused")
        if unsupported:
            raise RuntimeError(
                f"Adam(impl='fused') is not supported on {', '.join(unsupported)} with torch "
                f"{torch.__version__}. Use impl='foreach' (or best_adam_impl(device))."
            )
    return torch.optim.Adam(params, lr=lr, **flags[impl])


def flatten_parameters(model: nn.Module) -> nn.Parameter:
    """Make `model`'s parameters (and .grads) views of one flat tensor (and its .grad); returns it (chapter 2)."""
    params = list(model.parameters())
    if not params:
        raise ValueError("The model has no parameters to flatten.")
    kinds = {(p.device, p.dtype) for p in params}
    if len(kinds) > 1:
        raise ValueError(
            f"All parameters must share one device and dtype to live in one buffer; got "
            f"{sorted(f'{d}/{t}' for d, t in kinds)}. Move the model with .to(device, dtype) first."
        )
    if not all(p.requires_grad for p in params):
        raise ValueError("Every parameter must require grad (unfreeze them, or leave them out).")
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
                "FlatAdam needs the 1-D parameter returned by flatten_parameters(model), whose "
                ".grad is the gradient buffer."
            )
        if not lr > 0 or not eps > 0 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"Need lr > 0, eps > 0 and 0 <= betas < 1; got {lr}, {eps}, {betas}.")
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
        torch.set_num_threads(positive_int(n, "n (threads)"))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(old)


def time_once(fn: Callable[[], object], device: str | torch.device = "cpu") -> float:
    """Seconds one call of fn() takes, syncing the device before and after: for one-off costs like compiling (chapter 2)."""
    if not callable(fn):
        raise TypeError(f"time_once() needs a function to call, got {type(fn).__name__}.")
    device = resolve_device(device)
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start
