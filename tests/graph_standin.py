"""A CUDA graph's stand-in for CPU tests: a StaticStep whose replay() runs the step eagerly.

`helpers.cuda_graphs.graphed_epoch` only copies each batch into a step's static buffers, calls
`replay()` and copies the static loss; here `replay()` runs the same forward, backward and
optimizer step eagerly on those buffers, so the graph loop's data flow (permutation, short last
batch, static buffers, one sync per epoch) and its math run on a CPU. What a real capture adds
(replaying recorded kernels) needs a GPU: chapter 2's notebook checks it there (section 5.4).

`allow_capturable_on_cpu(monkeypatch)` lets torch run capturable Adam (which a graph needs) on
CPU tensors, as the audit's experiments/ch2_drift.py did; monkeypatch undoes it after the test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
import torch
import torch.optim.adam as adam_module
from torch import nn

from helpers.cuda_graphs import StaticStep


def eager_static_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x_example: torch.Tensor,
    y_example: torch.Tensor,
) -> StaticStep:
    """A StaticStep whose replay() runs the step eagerly on its buffers: graphed_epoch on a CPU."""
    static_x, static_y = x_example.clone(), y_example.clone()
    static_loss = torch.zeros((), device=static_x.device)

    def replay() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(static_x), static_y)
        loss.backward()
        optimizer.step()
        static_loss.copy_(loss.detach())

    return StaticStep(static_x, static_y, static_loss, replay)


def eager_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    sizes: Iterable[int],
) -> dict[int, StaticStep]:
    """capture_steps' result, one stand-in step per batch size (the signature of capture_steps)."""
    return {b: eager_static_step(model, optimizer, loss_fn, x[:b], y[:b]) for b in sizes}


def allow_capturable_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Add "cpu" to the devices torch.optim.Adam accepts with capturable=True, for one test."""
    if not hasattr(adam_module, "_get_capturable_supported_devices"):
        pytest.skip(f"torch {torch.__version__} has no capturable-device list to extend")
    supported = adam_module._get_capturable_supported_devices  # where Adam's step looks it up
    monkeypatch.setattr(
        adam_module,
        "_get_capturable_supported_devices",
        lambda *a, **k: [*supported(*a, **k), "cpu"],
    )
