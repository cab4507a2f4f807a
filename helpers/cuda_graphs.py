"""The whole training step as CUDA graphs, the docs' "whole network capture" (chapter 2)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from helpers.batching import ResidentBatches
from helpers.devices import resolve_device
from helpers.i18n import tr, tr_mark
from helpers.loops import make_adam
from helpers.validate import positive_int


@dataclass
class StaticStep:
    """Static input buffers, the static loss, and replay(): one captured step for one batch shape (chapter 2)."""

    x: torch.Tensor
    y: torch.Tensor
    loss: torch.Tensor
    replay: Callable[[], None]


def graph_capture_plan(device: str | torch.device) -> tuple[bool, str]:
    """(capture the step?, why): True only on a CUDA or ROCm device (chapter 2)."""
    device = resolve_device(device)
    if device.type != "cuda":
        return False, tr(
            "CUDA graphs need a CUDA or ROCm GPU and this is {kind}: the final loop "
            "stays the eager resident loop"
        ).format(kind=device.type)
    return True, tr("CUDA: the whole step is captured once per batch shape and replayed")


def batch_shapes(n_samples: int, batch_size: int) -> list[int]:
    """The batch sizes one epoch uses: the full batch, and the short last one if any (chapter 2)."""
    if n_samples < 1 or batch_size < 1:
        raise ValueError(
            tr("need n_samples >= 1 and batch_size >= 1, got {n_samples}, {batch_size}.").format(
                n_samples=n_samples, batch_size=batch_size
            )
        )
    full, rest = min(batch_size, n_samples), n_samples % batch_size
    return [full] + ([rest] if rest and n_samples > batch_size else [])


def capturable_adam(params: Iterable[nn.Parameter], lr: float = 1e-3) -> torch.optim.Adam:
    """torch.optim.Adam that a CUDA graph can capture: capturable=True, foreach (chapter 2).

    Capturable Adam keeps each step count as a float32 tensor on the device and computes the
    bias corrections 1 - beta**t there, in float32; without capturable they are Python floats
    (float64). fp32(0.999) = 0.99900001287, so sqrt(1 - beta2**t) comes out about 6e-6 too
    small, relative, and every update about 6e-6 smaller (bias_correction_rows).
    """
    return make_adam(params, lr=lr, impl="capturable")


#: bias_correction_rows' column headers, for the catalog (format_table prints them translated).
_BIAS_COLUMNS = (
    tr_mark("step t"), tr_mark("1 - β1^t, rel. error"), tr_mark("sqrt(1 - β2^t), rel. error"),
    tr_mark("update, rel. change"),
)  # fmt: skip


def bias_correction_rows(
    steps: Sequence[int] = (1, 10, 100, 314),
    betas: tuple[float, float] = (0.9, 0.999),
    device: str | torch.device = "cpu",
) -> list[dict]:
    """Adam's bias corrections as capturable Adam computes them (float32 on `device`) against float64 (chapter 2)."""
    beta1, beta2 = betas
    rows = []
    for t in steps:
        t = positive_int(t, "step")
        count = torch.tensor(float(t), device=resolve_device(device))  # float32, as Adam keeps it
        bc1 = (1 - torch.pow(beta1, count)).item()  # what torch._foreach_pow(beta, steps) gives
        bc2_sqrt = (1 - torch.pow(beta2, count)).sqrt().item()
        exact1, exact2_sqrt = 1 - beta1**t, math.sqrt(1 - beta2**t)
        rows.append(
            {
                "step t": t,
                "1 - β1^t, rel. error": bc1 / exact1 - 1,
                "sqrt(1 - β2^t), rel. error": bc2_sqrt / exact2_sqrt - 1,
                # the update is lr / (1 - β1^t) * m / (sqrt(v) / sqrt(1 - β2^t) + eps); eps aside,
                # it scales with sqrt(1 - β2^t) / (1 - β1^t):
                "update, rel. change": (bc2_sqrt / exact2_sqrt) * (exact1 / bc1) - 1,
            }
        )
    return rows


def capture_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    sizes: Iterable[int],
    warmup: int = 3,
) -> dict[int, StaticStep]:
    """Capture one training step per batch size as a CUDA graph (capturable Adam, warm-up undone) (chapter 2)."""
    with torch.cuda.device(x.device):  # streams and capture on the data's GPU, not the current one
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
