"""helpers.batching: resident batches, the permutation sampler, the slow dataset, bad input."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers.batching import (
    PermutationSampler,
    ResidentBatches,
    SlowReadDataset,
    check_batch_size,
)
from helpers.syncs import count_syncs


def id_data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.arange(n)
    return torch.stack([ids.float(), -ids.float()], dim=1), ids


@pytest.mark.parametrize(
    ("n", "bs", "sizes"), [(10, 4, [4, 4, 2]), (8, 4, [4, 4]), (5, 5, [5]), (3, 1, [1, 1, 1])]
)
def test_every_sample_once_per_epoch(n: int, bs: int, sizes: list[int]) -> None:
    x, y = id_data(n)
    batches = ResidentBatches(x, y, batch_size=bs, generator=torch.Generator().manual_seed(0))
    got = list(batches)
    assert [len(b[1]) for b in got] == sizes and len(batches) == len(sizes)
    seen = torch.cat([yb for _, yb in got])
    assert torch.equal(seen.sort().values, torch.arange(n))
    assert all(torch.equal(xb[:, 0].long(), yb) for xb, yb in got)  # x and y stay aligned


def test_order_changes_between_epochs_and_seed_reproduces_it() -> None:
    x, y = id_data(100)
    g = torch.Generator().manual_seed(0)
    batches = ResidentBatches(x, y, batch_size=10, generator=g)
    first = torch.cat([yb for _, yb in batches])
    second = torch.cat([yb for _, yb in batches])
    assert not torch.equal(first, second)
    again = ResidentBatches(x, y, batch_size=10, generator=torch.Generator().manual_seed(0))
    assert torch.equal(torch.cat([yb for _, yb in again]), first)


def test_drop_last_and_no_shuffle() -> None:
    x, y = id_data(10)
    batches = ResidentBatches(x, y, batch_size=4, drop_last=True)
    assert len(batches) == 2 and [len(b[0]) for b in batches] == [4, 4]
    ordered = ResidentBatches(x, y, batch_size=4, shuffle=False)
    assert torch.equal(torch.cat([yb for _, yb in ordered]), torch.arange(10))


def test_same_permutations_as_the_dataloader_with_the_permutation_sampler() -> None:
    x, y = id_data(50)
    loader = DataLoader(
        TensorDataset(x, y),
        batch_size=8,
        sampler=PermutationSampler(50, torch.Generator().manual_seed(3)),
    )
    resident = ResidentBatches(x, y, batch_size=8, generator=torch.Generator().manual_seed(3))
    for _ in range(2):  # two epochs: same order each epoch, and the order changes
        for (xa, ya), (xb, yb) in zip(loader, resident, strict=True):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_resident_batches_do_no_host_sync() -> None:
    x, y = id_data(64)
    batches = ResidentBatches(x, y, batch_size=16, generator=torch.Generator().manual_seed(0))
    _, counter = count_syncs(lambda: list(batches))
    assert counter.count == 0


def test_slow_read_dataset_returns_samples() -> None:
    x, y = id_data(4)
    ds = SlowReadDataset(x, y, read_seconds=0.0)
    assert len(ds) == 4 and torch.equal(ds[2][0], x[2]) and int(ds[2][1]) == 2
    assert torch.equal(next(iter(DataLoader(SlowReadDataset(x, y, 1e-4), batch_size=4)))[1], y)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"batch_size": 0}, ValueError, "batch_size must be > 0"),
        ({"batch_size": -3}, ValueError, "batch_size must be > 0"),
        ({"batch_size": 2.5}, ValueError, "whole number"),
        ({"batch_size": 11}, ValueError, "larger than the dataset"),
        ({"batch_size": 4, "generator": 7}, TypeError, "torch.Generator"),
    ],
)
def test_bad_batch_arguments(kwargs: dict, error: type, match: str) -> None:
    x, y = id_data(10)
    with pytest.raises(error, match=match):
        ResidentBatches(x, y, **kwargs)


def test_bad_tensors() -> None:
    with pytest.raises(ValueError, match="empty"):
        ResidentBatches(torch.empty(0, 3), torch.empty(0), batch_size=1)
    with pytest.raises(ValueError, match="at least one tensor"):
        ResidentBatches(batch_size=1)
    with pytest.raises(ValueError, match="same number of samples"):
        ResidentBatches(torch.zeros(5, 2), torch.zeros(4), batch_size=2)
    with pytest.raises(ValueError, match="one device"):
        ResidentBatches(torch.zeros(5, 2), torch.zeros(5, device="meta"), batch_size=2)
    with pytest.raises(TypeError, match="tensor"):
        ResidentBatches(torch.zeros(5, 2), [1, 2, 3, 4, 5], batch_size=2)
    with pytest.raises(ValueError, match="0-dim"):
        ResidentBatches(torch.tensor(1.0), batch_size=1)


def test_check_batch_size() -> None:
    assert check_batch_size(64, 10_000) == 64 and check_batch_size(10.0, 10) == 10
    with pytest.raises(ValueError, match="empty"):
        check_batch_size(1, 0)
    with pytest.raises(ValueError, match="batch_size <= 10"):
        check_batch_size(11, 10)


def test_bad_sampler_and_dataset_arguments() -> None:
    with pytest.raises(ValueError, match="n_samples"):
        PermutationSampler(0, torch.Generator())
    with pytest.raises(TypeError, match="Generator"):
        PermutationSampler(5, None)
    x, y = id_data(4)
    with pytest.raises(ValueError, match="read_seconds"):
        SlowReadDataset(x, y, read_seconds=-1)
    with pytest.raises(ValueError, match="same number"):
        SlowReadDataset(x, y[:2], read_seconds=0)
