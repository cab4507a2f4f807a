"""The course's one MLP builder, for every chapter, script and checker (chapter 2).
A ground-floor module: it imports only torch and helpers.validate."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from helpers.i18n import tr
from helpers.validate import positive_int


def make_mlp(
    sizes: Sequence[int] = (20, 64, 32, 1),
    *,
    sigmoid: bool = False,
    blocks: bool = False,
    seed: int | None = None,
    device: str | torch.device | None = None,
) -> nn.Sequential:
    """Linear layers of `sizes` with ReLU between; `blocks` groups them as [block0, ..., head] (chapters 2 and 5)."""
    sizes = [positive_int(s, "every layer size") for s in sizes]
    if len(sizes) < 2:
        raise ValueError(
            tr("make_mlp needs at least an input and an output size, got {sizes}.").format(
                sizes=sizes
            )
        )
    if seed is not None:
        torch.manual_seed(seed)
    hidden = [nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(sizes[:-2], sizes[1:-1])]
    layers = [*hidden] if blocks else [m for block in hidden for m in block]
    layers.append(nn.Linear(sizes[-2], sizes[-1]))
    if sigmoid:
        layers.append(nn.Sigmoid())
    model = nn.Sequential(*layers)
    return model if device is None else model.to(device)


def wide_mlp_sizes(width: int, depth: int = 4, n_out: int = 1) -> tuple[int, ...]:
    """(width,) * (depth + 1) + (n_out,): `depth` square layers and a head (chapters 3 and 5)."""
    width, depth = positive_int(width, "width"), positive_int(depth, "depth")
    return (width,) * (depth + 1) + (positive_int(n_out, "n_out"),)
