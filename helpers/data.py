"""Synthetic data made in code, so nothing is downloaded (chapter 2)."""

from __future__ import annotations

import torch

from helpers.validate import positive_int


def make_classification_data(
    n_samples: int = 10_000, n_features: int = 20, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sources' task: x ~ N(0, 1), label 1.0 where the features sum to > 0; shapes (n, f), (n, 1) (chapter 2)."""
    n_samples = positive_int(n_samples, "n_samples")
    n_features = positive_int(n_features, "n_features")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_samples, n_features, generator=g)
    y = (x.sum(dim=1) > 0).float().unsqueeze(1)
    return x, y
