"""Chapter 4 checkers fail typical wrong answers (solution/stub: test_exercise_checks.py).

The distributed checkers launch 2 gloo ranks with torchrun (a few seconds each); an
untouched stub is recognised without launching anything.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from helpers.checks import FAIL, CheckFailed, ch04

from nbfiles import exercise_namespace

SOLUTIONS = "solutions/04_multi_gpu_solutions.ipynb"
CHECKS = {
    "scaled_lr": ch04.check_scaled_lr,
    "average_gradients": ch04.check_average_gradients,
    "accumulate": ch04.check_accumulate,
    "train_ddp": ch04.check_train_ddp,
}


@pytest.fixture(scope="module")
def solutions() -> dict:
    return exercise_namespace(SOLUTIONS)


# --- typical wrong answers --------------------------------------------------------------------


def lr_without_accumulation(base_lr, base_batch, per_rank_batch, world_size, accum_steps):
    effective = per_rank_batch * world_size
    return effective, base_lr * effective / base_batch


def lr_not_scaled(base_lr, base_batch, per_rank_batch, world_size, accum_steps):
    return per_rank_batch * world_size * accum_steps, base_lr


def sum_without_division(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def accumulate_syncing_every_step(model, micro_batches, loss_fn):
    for x, y in micro_batches:
        (loss_fn(model(x), y) / len(micro_batches)).backward()


def accumulate_without_scaling(model, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == k - 1 else model.no_sync():
            loss_fn(model(x), y).backward()


def train_saving_everywhere(model, dataset, *, epochs, batch_size, lr, checkpoint_path):
    ddp = DDP(model)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            nn.BCEWithLogitsLoss()(ddp(x), y).backward()
            opt.step()
    torch.save(ddp.state_dict(), checkpoint_path)


@pytest.mark.parametrize(
    ("name", "wrong", "hint"),
    [
        ("scaled_lr", lr_without_accumulation, "ignores accumulation"),
        ("scaled_lr", lr_not_scaled, "scale the learning rate linearly"),
        ("average_gradients", sum_without_division, "2x too large"),
        ("accumulate", accumulate_syncing_every_step, "instead of once"),
        ("train_ddp", train_saving_everywhere, "rank 1 saved"),
    ],
)
def test_typical_mistake_fails(name: str, wrong, hint: str) -> None:  # noqa: ANN001
    result = CHECKS[name](wrong)
    assert result.status == FAIL and hint in result.message, result.message


def test_accumulate_without_scaling_fails() -> None:
    result = ch04.check_accumulate(accumulate_without_scaling)
    assert result.status == FAIL and "3x too large" in result.message, result.message


# --- sending a function to the ranks ------------------------------------------------------------

NOTEBOOK_HELPER = object()


def uses_a_notebook_object(model):
    return NOTEBOOK_HELPER


def test_payload_refuses_notebook_objects_with_a_hint() -> None:
    with pytest.raises(CheckFailed, match="Import or define"):
        ch04.payload(uses_a_notebook_object)
    result = ch04.check_average_gradients(uses_a_notebook_object)
    assert result.status == FAIL and "NOTEBOOK_HELPER" in result.message


def test_payload_carries_modules_and_imported_names() -> None:
    data = ch04.payload(train_saving_everywhere)
    assert data["modules"]["torch"] == "torch" and data["modules"]["nn"] == "torch.nn"
    assert data["objects"]["DDP"] == ("torch.nn.parallel.distributed", "DistributedDataParallel")
    assert ch04.is_stub(train_saving_everywhere) is False
