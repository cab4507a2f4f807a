"""Chapter 2: one whole training step (forward, backward, Adam) captured as a CUDA graph, replayed per batch.

The CUDA-only lines follow the PyTorch docs (torch.cuda.graphs, "whole network capture" in the
CUDA semantics notes): warm up on a side stream, capture with ``torch.cuda.graph(g)``, copy each
batch into static input buffers, and use an optimizer built with ``capturable=True``. Every
decision around them (can this device capture, which batch shapes, the epoch's data flow) is
plain Python that CPU tests run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from helpers.batching import ResidentBatches
from helpers.devices import resolve_device


@dataclass
class StaticStep:
    """Static input buffers, the static loss, and replay(): one captured step for one batch shape (chapter 2)."""

    x: torch.Tensor
    y: torch.Tensor
    loss: torch.Tensor
    replay: Callable[[], None]


def graph_capture_plan(device: str | torch.device) -> tuple[bool, str]:
    """(capture the step?, why): True only on a CUDA or ROCm device with torch.cuda.graph (chapter 2)."""
    device = resolve_device(device)
    if device.type != "cuda":
        return False, (
            f"CUDA graphs need a CUDA or ROCm GPU and this is {device.type}: the final loop "
            "stays the eager resident loop"
        )
    if not hasattr(torch.cuda, "graph") or not hasattr(torch.cuda, "CUDAGraph"):
        return False, "this torch has no torch.cuda.graph: the final loop stays eager"
    return True, "CUDA: the whole step is captured once per batch shape and replayed"


def batch_shapes(n_samples: int, batch_size: int) -> list[int]:
    """The batch sizes one epoch uses: the full batch, and the short last one if any (chapter 2)."""
    if n_samples < 1 or batch_size < 1:
        raise ValueError(f"need n_samples >= 1 and batch_size >= 1, got {n_samples}, {batch_size}.")
    full, rest = min(batch_size, n_samples), n_samples % batch_size
    return [full] + ([rest] if rest and n_samples > batch_size else [])


def capturable_adam(params: Iterable[nn.Parameter], lr: float = 1e-3) -> torch.optim.Adam:
    """torch.optim.Adam that a CUDA graph can capture: capturable=True, foreach (chapter 2)."""
    return torch.optim.Adam(params, lr=lr, capturable=True, foreach=True)


def capture_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    sizes: Iterable[int],
    warmup: int = 3,
) -> dict[int, StaticStep]:
    """Capture one whole training step per batch size as a CUDA graph; model and Adam state restored first (chapter 2).

    CUDA only. The optimizer must be an Adam built with ``capturable=True`` (its fresh state is
    all zeros, which is how the warm-up's steps are undone).
    """
    sizes = list(dict.fromkeys(sizes))
    start = [p.detach().clone() for p in model.parameters()]
    side = torch.cuda.Stream(x.device)
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):  # warm-up on a side stream: lazy state is created here
        for b in sizes:
            for _ in range(warmup):
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x[:b]), y[:b]).backward()
                optimizer.step()
    torch.cuda.current_stream(x.device).wait_stream(side)
    with torch.no_grad():  # undo the warm-up: same weights, fresh (all-zero) Adam state
        for p, p0 in zip(model.parameters(), start):
            p.copy_(p0)
        for state in optimizer.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor):
                    v.zero_()
    steps = {}
    for b in sizes:
        static_x, static_y = x[:b].clone(), y[:b].clone()
        graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)  # this graph's gradients live in its own pool
        with torch.cuda.graph(graph):
            static_loss = loss_fn(model(static_x), static_y)
            static_loss.backward()
            optimizer.step()
        steps[b] = StaticStep(static_x, static_y, static_loss, graph.replay)
    return steps


def eager_static_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x_example: torch.Tensor,
    y_example: torch.Tensor,
) -> StaticStep:
    """A StaticStep whose replay() runs the step eagerly on its buffers: graphed_epoch's data flow on any device (chapter 2)."""
    static_x, static_y = x_example.clone(), y_example.clone()
    static_loss = torch.zeros((), device=static_x.device)

    def replay() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(static_x), static_y)
        loss.backward()
        optimizer.step()
        static_loss.copy_(loss.detach())

    return StaticStep(static_x, static_y, static_loss, replay)


def graphed_epoch(steps: dict[int, StaticStep], batches: ResidentBatches) -> list[float]:
    """One epoch of replays: each batch is gathered into its shape's static buffers, one sync at the end (chapter 2)."""
    x, y = batches.tensors
    perm = batches.permutation()  # the same order fast_epoch would draw
    starts = range(0, len(batches) * batches.batch_size, batches.batch_size)
    losses = torch.empty(len(starts), device=x.device)
    for i, start in enumerate(starts):
        idx = perm[start : start + batches.batch_size]
        step = steps[len(idx)]
        torch.index_select(x, 0, idx, out=step.x)  # copy into the static input buffers
        torch.index_select(y, 0, idx, out=step.y)
        step.replay()
        losses[i] = step.loss.detach()  # a device-side copy: the next replay overwrites it
    return losses.tolist()  # the one host sync of the epoch
