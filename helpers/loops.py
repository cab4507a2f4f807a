"""The sources' training loop and the chapter's fast loop, shared by notebooks and benchmarks (chapter 2).

Both loops train the sources' MLP (20-64-32-1) on the sources' task. The notebook prints
their code with ``inspect.getsource`` and ``benchmarks/ch02_training_loop.py`` runs exactly
the same functions, so what the chapter shows is what the benchmark measures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from helpers.devices import resolve_device, synchronize
from helpers.sweeps import positive_int

ADAM_IMPLS = ("for-loop", "foreach", "fused")


def make_mlp(logits: bool = False) -> nn.Sequential:
    """The sources' MLP 20-64-32-1 ending in Sigmoid, or returning logits if `logits` (chapter 2)."""
    layers: list[nn.Module] = [
        nn.Linear(20, 64),
        nn.ReLU(),
        nn.Linear(64, 32),
        nn.ReLU(),
        nn.Linear(32, 1),
    ]
    if not logits:
        layers.append(nn.Sigmoid())
    return nn.Sequential(*layers)


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
    if impl not in ADAM_IMPLS:
        raise ValueError(f"impl must be one of {ADAM_IMPLS}, got {impl!r}.")
    params = list(params)
    if impl == "fused":
        devices = {p.device for p in params}
        unsupported = sorted(str(d) for d in devices if best_adam_impl(d) != "fused")
        if unsupported:
            raise RuntimeError(
                f"Adam(impl='fused') is not supported on {', '.join(unsupported)} with torch "
                f"{torch.__version__}. Use impl='foreach' (or best_adam_impl(device))."
            )
    flags = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
    return torch.optim.Adam(params, lr=lr, **flags[impl])


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
    optimizer: torch.optim.Optimizer,
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
