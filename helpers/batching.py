"""Feeding the device: batches of device-resident tensors, and the DataLoader pieces (chapter 2)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import torch
from torch.utils.data import Dataset, Sampler

from helpers.i18n import tr
from helpers.validate import positive_int


def check_batch_size(batch_size: int, n_samples: int) -> int:
    """`batch_size` as an int if 0 < batch_size <= n_samples, else a ValueError saying what to do (chapter 2)."""
    if n_samples == 0:
        raise ValueError(tr("The dataset is empty (0 samples): there is nothing to batch."))
    batch_size = positive_int(batch_size, "batch_size")
    if batch_size > n_samples:
        raise ValueError(
            tr(
                "batch_size={batch_size} is larger than the dataset ({n} samples), so "
                "every epoch would be a single short batch. Use batch_size <= {n}."
            ).format(batch_size=batch_size, n=n_samples)
        )
    return batch_size


def _check_tensors(tensors: tuple[torch.Tensor, ...]) -> int:
    """The common number of samples of `tensors`; errors for mismatched lengths or devices (chapter 2)."""
    if not tensors:
        raise ValueError(tr("Pass at least one tensor, e.g. ResidentBatches(x, y, batch_size=64)."))
    bad = [type(t).__name__ for t in tensors if not isinstance(t, torch.Tensor)]
    if bad:
        raise TypeError(
            tr("Every argument must be a tensor; got {types}.").format(types=", ".join(bad))
        )
    if any(t.dim() == 0 for t in tensors):
        raise ValueError(tr("Tensors need a first (sample) dimension; got a 0-dim tensor."))
    lengths = {len(t) for t in tensors}
    if len(lengths) > 1:
        raise ValueError(
            tr(
                "All tensors need the same number of samples (first dimension); got {lengths}."
            ).format(lengths=[len(t) for t in tensors])
        )
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(
            tr(
                "All tensors must be on one device; got {devices}. "
                "Move them with .to(device) once, before training."
            ).format(devices=sorted(str(d) for d in devices))
        )
    return lengths.pop()


class ResidentBatches:
    """Shuffled mini-batches of device-resident tensors: one randperm per epoch, one gather per batch (chapter 2)."""

    def __init__(
        self,
        *tensors: torch.Tensor,
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        self.n = _check_tensors(tensors)
        self.batch_size = check_batch_size(batch_size, self.n)
        if generator is not None and not isinstance(generator, torch.Generator):
            raise TypeError(
                tr("generator must be a torch.Generator, got {type}.").format(
                    type=type(generator).__name__
                )
            )
        self.tensors, self.shuffle, self.drop_last = tensors, shuffle, drop_last
        self.generator = generator
        self.device = tensors[0].device

    def __len__(self) -> int:
        """Batches per epoch (chapter 2)."""
        if self.drop_last:
            return self.n // self.batch_size
        return math.ceil(self.n / self.batch_size)

    def permutation(self) -> torch.Tensor:
        """This epoch's order of the samples, on the tensors' device (chapter 2)."""
        if not self.shuffle:
            return torch.arange(self.n, device=self.device)
        where = self.generator.device if self.generator is not None else self.device
        perm = torch.randperm(self.n, generator=self.generator, device=where)
        return perm.to(self.device, non_blocking=True)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        perm = self.permutation()
        stop = len(self) * self.batch_size if self.drop_last else self.n
        for start in range(0, stop, self.batch_size):
            idx = perm[start : start + self.batch_size]
            yield tuple(t.index_select(0, idx) for t in self.tensors)


class PermutationSampler(Sampler[int]):
    """A DataLoader sampler drawing exactly one randperm(n, generator) per epoch, like ResidentBatches (chapter 2)."""

    def __init__(self, n_samples: int, generator: torch.Generator) -> None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(
                tr("generator must be a torch.Generator, got {type}.").format(
                    type=type(generator).__name__
                )
            )
        self.n, self.generator = positive_int(n_samples, "n_samples"), generator

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        yield from torch.randperm(self.n, generator=self.generator).tolist()


class SlowReadDataset(Dataset):
    """(x[i], y[i]) after `read_seconds`: a slow disk read that spawned DataLoader workers can import (chapter 2)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, read_seconds: float) -> None:
        _check_tensors((x, y))
        if not isinstance(read_seconds, (int, float)) or not 0 <= read_seconds < 1:
            raise ValueError(
                tr("read_seconds must be in [0, 1), got {value!r}.").format(value=read_seconds)
            )
        self.x, self.y, self.read_seconds = x, y, float(read_seconds)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.read_seconds:
            time.sleep(self.read_seconds)
        return self.x[i], self.y[i]
