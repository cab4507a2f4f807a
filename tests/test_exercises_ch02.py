"""Chapter 2 checkers fail typical wrong answers (solution/stub: test_exercise_checks.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.checks import FAIL
from helpers.checks.ch02 import (
    check_fastest_batch_size,
    check_resident_batches,
    check_train_epoch,
    check_train_steps,
)

from nbfiles import exercise_namespace

SOLUTIONS = "solutions/02_training_loop_solutions.ipynb"


@pytest.fixture(scope="module")
def solutions() -> dict:
    return exercise_namespace(SOLUTIONS)


# Exercise 1: typical wrong answers ----------------------------------------------------------


def cpu_only_steps(model, x, y, device, steps=20):
    """The starting code with its `raise` line deleted: it still only works on the CPU."""
    model = model.cpu()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = torch.zeros(steps)
    for i in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x.cpu()), y.cpu())
        loss.backward()
        optimizer.step()
        losses[i] = loss.item()
    return losses


def item_steps(model, x, y, device, steps=20):
    """Moves everything, but still reads each loss with .item()."""
    model.to(device)
    x, y = x.to(device), y.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return torch.tensor(losses, device=device)


def forgot_data_steps(model, x, y, device, steps=20):
    """Moves the model but not the data."""
    model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = torch.zeros(steps, device=device)
    for i in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses[i] = loss.detach()
    return losses


def wrong_lr_steps(model, x, y, device, steps=20):
    """Device-agnostic, but changed the maths."""
    model.to(device)
    x, y = x.to(device), y.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = torch.zeros(steps, device=device)
    for i in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses[i] = loss.detach()
    return losses


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (cpu_only_steps, "still reads values on the host"),
        (item_steps, "still reads values on the host"),
        (forgot_data_steps, "device='meta'"),
        (wrong_lr_steps, "differ from full-batch SGD"),
    ],
)
def test_train_steps_wrong_answers(fn, hint: str) -> None:
    result = check_train_steps(fn)
    assert result.status == FAIL and hint in result.message


# Exercise 2 ----------------------------------------------------------------------------------


def syncing_epoch(model, batches, optimizer):
    """The starting code with its `raise` line deleted: right numbers, three syncs per step."""
    loss_fn = nn.BCEWithLogitsLoss()
    total, correct, seen, best = 0.0, 0.0, 0, float("inf")
    for xb, yb in batches:
        optimizer.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = loss_fn(logits, yb)
        loss.backward()
        optimizer.step()
        if loss < best:
            best = loss.detach()
        total += loss.item() * len(xb)
        correct += ((logits > 0).float() == yb).sum().item()
        seen += len(xb)
    device = next(model.parameters()).device
    return (
        torch.tensor(total / seen, device=device),
        torch.tensor(correct / seen, device=device),
        best,
    )


def unweighted_epoch(model, batches, optimizer):
    """No syncs, but averages the batch losses without weighting the short last batch."""
    loss_fn = nn.BCEWithLogitsLoss()
    losses, correct, seen = [], 0, 0
    best = None
    for xb, yb in batches:
        optimizer.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = loss_fn(logits, yb)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        best = loss.detach() if best is None else torch.minimum(best, loss.detach())
        correct = correct + ((logits > 0).float() == yb).sum()
        seen += len(xb)
    return torch.stack(losses).mean(), correct / seen, best


def float_epoch(model, batches, optimizer):
    """Returns Python floats: the syncs moved into the return statement."""
    mean, acc, best = unweighted_epoch(model, batches, optimizer)
    return float(mean), float(acc), float(best)


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (syncing_epoch, "host sync(s)"),
        (unweighted_epoch, "mean loss"),
        (float_epoch, "as tensors"),
    ],
)
def test_train_epoch_wrong_answers(fn, hint: str) -> None:
    result = check_train_epoch(fn)
    assert result.status == FAIL and hint in result.message


# Exercise 3 ----------------------------------------------------------------------------------


def unshuffled(x, y, batch_size, generator):
    if batch_size < 1:
        raise ValueError("batch_size")
    for start in range(0, len(x), batch_size):
        yield x[start : start + batch_size], y[start : start + batch_size]


def drops_last(x, y, batch_size, generator):
    perm = torch.randperm(len(x), generator=generator).to(x.device)
    for start in range(0, len(x) - batch_size + 1, batch_size):
        idx = perm[start : start + batch_size]
        yield x[idx], y[idx]


def tolist_indexing(x, y, batch_size, generator):
    if batch_size < 1:
        raise ValueError("batch_size")
    order = torch.randperm(len(x), generator=generator).tolist()
    for start in range(0, len(x), batch_size):
        idx = torch.tensor(order[start : start + batch_size], device=x.device)
        yield x[idx], y[idx]


def two_permutations(x, y, batch_size, generator):
    px = torch.randperm(len(x), generator=generator).to(x.device)
    py = torch.randperm(len(x), generator=generator).to(x.device)
    for start in range(0, len(x), batch_size):
        yield x[px[start : start + batch_size]], y[py[start : start + batch_size]]


def no_generator(x, y, batch_size, generator):
    if batch_size < 1:
        raise ValueError("batch_size")
    perm = torch.randperm(len(x)).to(x.device)
    for start in range(0, len(x), batch_size):
        idx = perm[start : start + batch_size]
        yield x[idx], y[idx]


def same_order_each_epoch(x, y, batch_size, generator):
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0)).to(x.device)
    for start in range(0, len(x), batch_size):
        idx = perm[start : start + batch_size]
        yield x[idx], y[idx]


def accepts_zero(x, y, batch_size, generator):
    perm = torch.randperm(len(x), generator=generator).to(x.device)
    for start in range(0, len(x), max(batch_size, 1)):
        idx = perm[start : start + max(batch_size, 1)]
        yield x[idx], y[idx]


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (unshuffled, "original order"),
        (drops_last, "Keep the last"),
        (tolist_indexing, "reads values on the host"),
        (two_permutations, "out of step"),
        (no_generator, "same seed"),
        (same_order_each_epoch, "same in two epochs"),
        (accepts_zero, "batch_size=0"),
    ],
)
def test_resident_batches_wrong_answers(fn, hint: str) -> None:
    result = check_resident_batches(fn)
    assert result.status == FAIL and hint in result.message


# Exercise 4 ----------------------------------------------------------------------------------


def ignores_cap(rows, memory_cap):
    return max(rows, key=lambda r: r["samples/s"])["batch size"]


def largest_fitting(rows, memory_cap):
    fitting = [r for r in rows if r["peak memory"] <= memory_cap]
    if not fitting:
        raise ValueError("nothing fits")
    return max(r["batch size"] for r in fitting)


def strict_cap(rows, memory_cap):
    fitting = [r for r in rows if r["peak memory"] < memory_cap]
    if not fitting:
        raise ValueError("nothing fits")
    return max(fitting, key=lambda r: (r["samples/s"], -r["batch size"]))["batch size"]


def returns_none_when_nothing_fits(rows, memory_cap):
    fitting = [r for r in rows if r["peak memory"] <= memory_cap]
    if not fitting:
        return None
    return max(fitting, key=lambda r: (r["samples/s"], -r["batch size"]))["batch size"]


def sorts_in_place(rows, memory_cap):
    rows.sort(key=lambda r: -r["samples/s"])
    return next(r["batch size"] for r in rows if r["peak memory"] <= memory_cap)


@pytest.mark.parametrize(
    ("fn", "hint"),
    [
        (ignores_cap, "128 MiB cap"),
        (largest_fitting, "fastest"),
        (strict_cap, "equals the cap"),
        (returns_none_when_nothing_fits, "raise ValueError"),
        (sorts_in_place, "do not change the rows"),
    ],
)
def test_fastest_batch_size_wrong_answers(fn, hint: str) -> None:
    result = check_fastest_batch_size(fn)
    assert result.status == FAIL and hint in result.message


# --- new wrong answers of each kind (issue 16) and other correct styles --------------------


def graph_keeping_steps(model, x, y, device, steps=20):
    """Stores the losses without detach(): every step's graph stays alive."""
    model.to(device)
    x, y = x.to(device), y.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss)
    return torch.stack(losses)


def graph_keeping_epoch(model, batches, optimizer):
    loss_fn = nn.BCEWithLogitsLoss()
    device = next(model.parameters()).device
    total = torch.zeros((), device=device)
    correct = torch.zeros((), device=device)
    best = torch.full((), float("inf"), device=device)
    seen = 0
    for xb, yb in batches:
        optimizer.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = loss_fn(logits, yb)
        loss.backward()
        optimizer.step()
        best = torch.minimum(best, loss)
        total = total + loss * len(xb)
        correct = correct + ((logits > 0).float() == yb).sum()
        seen += len(xb)
    return total / seen, correct / seen, best


def divides_by_zero(x, y, batch_size, generator):
    steps = len(x) // batch_size  # ZeroDivisionError for batch_size=0
    perm = torch.randperm(len(x), generator=generator).to(x.device)
    for s in range(steps + (len(x) % batch_size > 0)):
        idx = perm[s * batch_size : (s + 1) * batch_size]
        yield x[idx], y[idx]


def assumes_sorted(rows, memory_cap):
    best = None
    for r in rows:
        if r["peak memory"] > memory_cap:
            break
        if best is None or r["samples/s"] > best["samples/s"]:
            best = r
    if best is None:
        raise ValueError("nothing fits")
    return best["batch size"]


def test_keeping_the_graph_fails() -> None:
    assert "graph" in check_train_steps(graph_keeping_steps).message
    assert "graph" in check_train_epoch(graph_keeping_epoch).message


def test_a_crash_in_a_probe_names_the_probe() -> None:
    result = check_resident_batches(divides_by_zero)
    assert result.status == FAIL and result.message.startswith("[probe: batch_size=0]")
    assert "ZeroDivisionError" in result.message and "len(x) // batch_size" in result.message


def test_assuming_sorted_rows_fails() -> None:
    result = check_fastest_batch_size(assumes_sorted)
    assert result.status == FAIL and "another order" in result.message


def test_other_correct_styles_pass() -> None:
    def batches_by_split(x, y, batch_size, generator):
        if batch_size <= 0:
            raise ValueError("batch_size must be positive")
        perm = torch.randperm(x.shape[0], generator=generator, device="cpu").to(x.device)
        for idx in perm.split(batch_size):
            yield x[idx], y[idx]

    def sorted_pick(rows, memory_cap):
        ok = sorted(
            (r for r in rows if r["peak memory"] <= memory_cap),
            key=lambda r: (-r["samples/s"], r["batch size"]),
        )
        if not ok:
            raise ValueError("no row fits under the cap")
        return int(ok[0]["batch size"])

    assert check_resident_batches(batches_by_split).passed
    assert check_fastest_batch_size(sorted_pick).passed
