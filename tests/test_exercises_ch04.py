"""Chapter 4 checkers fail typical wrong answers (solution/stub: test_exercise_checks.py).

The distributed checkers first run the answer in this process at world size 1 (a one-rank
gloo group, no launch), then launch 3 gloo ranks with torchrun (15-30 s each on a busy
2-core machine); an untouched stub is recognised without launching anything. Wrong answers
caught at world size 1 cost no launch.
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
    torch.save(ddp.module.state_dict(), checkpoint_path)
    dist.barrier()


@pytest.mark.parametrize(
    ("name", "wrong", "hint"),
    [
        ("scaled_lr", lr_without_accumulation, "ignores accumulation"),
        ("scaled_lr", lr_not_scaled, "scale the learning rate linearly"),
        ("average_gradients", sum_without_division, "x too large: all_reduce sums"),
        ("accumulate", accumulate_syncing_every_step, "instead of once"),
        ("train_ddp", train_saving_everywhere, "saved a checkpoint too"),
    ],
)
def test_typical_mistake_fails(name: str, wrong, hint: str) -> None:  # noqa: ANN001
    result = CHECKS[name](wrong)
    assert result.status == FAIL and hint in result.message, result.message


def test_accumulate_without_scaling_fails() -> None:
    result = ch04.check_accumulate(accumulate_without_scaling)
    assert result.status == FAIL and "4x too large" in result.message, result.message
    assert "[probe: 1 rank] 4 micro-batches" in result.message


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


# --- new wrong answers of each kind (issue 16) and other correct styles --------------------


def lr_whole_ratio(base_lr, base_batch, per_rank_batch, world_size, accum_steps):
    effective = per_rank_batch * world_size * accum_steps
    return effective, base_lr * (effective // base_batch)


def lr_other_style(base_lr, base_batch, per_rank_batch, world_size, accum_steps):
    effective = per_rank_batch * accum_steps * world_size
    return effective, effective / base_batch * base_lr


def test_a_whole_number_ratio_fails_and_other_styles_pass() -> None:
    result = ch04.check_scaled_lr(lr_whole_ratio)
    assert result.status == FAIL and "not //" in result.message and "world_size=3" in result.message
    assert ch04.check_scaled_lr(lr_other_style).passed


def train_without_barrier(model, dataset, *, epochs, batch_size, lr, checkpoint_path):
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
    if dist.get_rank() == 0:
        torch.save(ddp.module.state_dict(), checkpoint_path)


def test_saving_without_a_barrier_fails() -> None:
    """The harness runs its own barrier after the function; the check must not count it."""
    result = ch04.check_train_ddp(train_without_barrier)
    assert result.status == FAIL and "dist.barrier()" in result.message, result.message


# --- world sizes 1 to 3, order of work, side effects (issue 16) -------------------------------


def halve_after_sum(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= 2  # the world size of the chapter's examples, hard-coded


def average_then_step(model):
    w = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= w
        p.data -= 0.1 * p.grad  # an optimizer step nobody asked for


def swap_with_partner(model):
    partner = 1 - dist.get_rank()  # only right for exactly 2 ranks
    for p in model.parameters():
        other = torch.empty_like(p.grad)
        req = dist.isend(p.grad, dst=partner)
        dist.recv(other, src=partner)
        req.wait()
        p.grad += other
        p.grad /= 2


def accumulate_summed_loss(model, micro_batches, loss_fn):
    k = len(micro_batches)
    losses = [loss_fn(model(x), y) / k for x, y in micro_batches]
    sum(losses).backward()  # right gradients, one all-reduce, every activation alive at once


def accumulate_fixed_three(model, micro_batches, loss_fn):
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            (loss_fn(model(x), y) / 3).backward()  # the number of micro-batches, hard-coded


def accumulate_and_step(model, micro_batches, loss_fn):
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == k - 1 else model.no_sync():
            (loss_fn(model(x), y) / k).backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad


def accumulate_over_world_too(model, micro_batches, loss_fn):
    k = len(micro_batches) * dist.get_world_size()  # DDP averages over ranks already
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.nullcontext() if i == len(micro_batches) - 1 else model.no_sync():
            (loss_fn(model(x), y) / k).backward()


def train_two_replicas(model, dataset, *, epochs, batch_size, lr, checkpoint_path):
    ddp = DDP(model)
    sampler = DistributedSampler(dataset, num_replicas=2, rank=dist.get_rank())
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            nn.BCEWithLogitsLoss()(ddp(x), y).backward()
            opt.step()
    if dist.get_rank() == 0:
        torch.save(ddp.module.state_dict(), checkpoint_path)
    dist.barrier()


@pytest.mark.parametrize(
    ("name", "wrong", "hints"),
    [
        ("average_gradients", halve_after_sum, ("[probe: 1 rank]", "2x too small", "(here 1)")),
        ("average_gradients", average_then_step, ("[probe: 1 rank]", "the weights changed")),
        (
            "average_gradients",
            swap_with_partner,
            ("[probe: 1 rank, in this process]", "at line", "no other rank"),
        ),
        ("accumulate", accumulate_summed_loss, ("[probe: 1 rank]", "4 forwards before a backward")),
        ("accumulate", accumulate_fixed_three, ("4 micro-batches", "1.33x too large", "(here 4)")),
        ("accumulate", accumulate_and_step, ("[probe: 1 rank]", "the weights changed")),
        ("train_ddp", train_two_replicas, ("[probe: 1 rank]", "instead of 128", "num_replicas")),
    ],
)
def test_caught_at_world_size_one_without_a_launch(name: str, wrong, hints: tuple) -> None:  # noqa: ANN001
    result = CHECKS[name](wrong)
    assert result.status == FAIL and all(h in result.message for h in hints), result.message


def test_dividing_by_the_world_size_twice_fails_on_the_launched_ranks() -> None:
    result = ch04.check_accumulate(accumulate_over_world_too)
    assert result.status == FAIL, result.message
    assert "ranks, rank 0] 3 micro-batches" in result.message and "x too small" in result.message


def average_flat_divide_first(model):
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads]) / dist.get_world_size()
    dist.all_reduce(flat)
    for g, part in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def accumulate_exit_stack(model, micro_batches, loss_fn):
    n = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with contextlib.ExitStack() as stack:
            if i < n - 1:
                stack.enter_context(model.no_sync())
            loss = loss_fn(model(x), y) * (1.0 / n)
            loss.backward()


def average_reading_torchrun_env(model):
    import os

    world = int(os.environ["WORLD_SIZE"])  # as a torchrun script reads it (issue 24)
    rank = int(os.environ["RANK"])
    assert rank == dist.get_rank(), (rank, dist.get_rank())
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world


@pytest.mark.parametrize(
    ("name", "right"),
    [
        ("average_gradients", average_flat_divide_first),
        ("accumulate", accumulate_exit_stack),
        ("average_gradients", average_reading_torchrun_env),
    ],
)
def test_other_correct_styles_pass_at_every_world_size(name: str, right) -> None:  # noqa: ANN001
    result = CHECKS[name](right)
    assert result.passed, result.message


def test_a_notebook_process_group_leaves_world_size_one_to_the_launch(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    assert ch04.run_in_process(halve_after_sum, "average_gradients") == {}


def test_the_in_process_probe_sets_torchrun_s_environment_and_restores_it(tmp_path) -> None:  # noqa: ANN001
    import os

    before = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")}
    with ch04._one_rank_world(tmp_path):
        seen = {k: os.environ.get(k) for k in before}
    assert seen == {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    assert {k: os.environ.get(k) for k in before} == before
