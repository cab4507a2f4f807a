"""Checkers for chapter 2's exercises: the training loop on the GPU (chapter 2)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from helpers.batching import ResidentBatches
from helpers.checks import CheckFailed, CheckResult, expect, probe, run_check
from helpers.data import make_classification_data
from helpers.devices import pick_device
from helpers.i18n import tr, tr_mark
from helpers.models import make_mlp
from helpers.syncs import count_syncs


def _where_syncs(counter: Any) -> str:
    """'.item() at cell:12 x20, ...' for a hint (chapter 2)."""
    return ", ".join(f"{k} x{v}" for k, v in counter.by_place().most_common(4))


# Exercise 1 -------------------------------------------------------------------------------


def _reference_train_steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int):
    """The losses a correct train_steps gives, computed on the CPU (chapter 2)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = torch.zeros(steps)
    for i in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses[i] = loss.detach()
    return losses


def _train_steps_case(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A small regression problem on the CPU (chapter 2)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 4, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]]) + 0.1
    torch.manual_seed(seed)
    return nn.Linear(4, 1), x, y


def check_train_steps(train_steps: Callable[..., torch.Tensor]) -> CheckResult:
    """Exercise 1: a device-agnostic loop, checked on the CPU, the meta device and this machine's device (chapter 2)."""

    def probes() -> None:
        model, x, y = _train_steps_case()
        expected = _reference_train_steps(copy.deepcopy(model), x, y, steps=5)
        losses = train_steps(model, x, y, "cpu", steps=5)
        expect(
            isinstance(losses, torch.Tensor),
            tr("return the losses as a tensor, not a {kind}.").format(kind=type(losses).__name__),
        )
        expect(
            tuple(losses.shape) == (5,),
            tr("return one loss per step: shape (5,), got {shape}.").format(
                shape=tuple(losses.shape)
            ),
        )
        expect(
            torch.allclose(losses.detach().cpu().float(), expected, rtol=1e-4, atol=1e-6),
            tr(
                "the losses differ from full-batch SGD (lr=0.1) on the MSE loss; keep the maths of "
                "the original loop and change only where tensors live."
            ),
        )
        expect(
            not losses.requires_grad,
            tr(
                "the losses tensor requires grad: it holds every step's autograd graph alive. "
                "Store loss.detach()."
            ),
        )
        model, x, y = _train_steps_case(1)
        _, counter = count_syncs(train_steps, model, x, y, "cpu", steps=5)
        expect(
            counter.count == 0,
            tr(
                "the loop still reads values on the host ({where}); on a GPU each "
                "is a sync. Store loss.detach() in a tensor on the device instead of loss.item()."
            ).format(where=_where_syncs(counter)),
        )
        model, x, y = _train_steps_case(2)
        try:
            meta_losses = train_steps(model, x, y, "meta", steps=3)
        except Exception as exc:  # a hard-coded device shows up here
            raise CheckFailed(
                tr(
                    "with device='meta' (a device with no data, which behaves like a GPU you do not "
                    "have) your function failed: {error}. "
                    "Something is still created on, moved to or read from the CPU: move the model "
                    "and the data with .to(device), create new tensors with device=device, and do "
                    "not call .item() or .cpu()."
                ).format(error=f"{type(exc).__name__}: {str(exc).strip()[:160]}")
            ) from None
        expect(
            isinstance(meta_losses, torch.Tensor) and meta_losses.device.type == "meta",
            tr(
                "with device='meta' the losses must be a tensor on the meta device (create it with "
                "device=device)."
            ),
        )
        expect(
            next(model.parameters()).device.type == "meta",
            tr("move the model to `device` (model.to(device))."),
        )
        device = pick_device()
        if device.type != "cpu":
            model, x, y = _train_steps_case()
            losses = train_steps(model, x, y, device, steps=5)
            expect(
                losses.device.type == device.type,
                tr("the losses should live on {device}.").format(device=device),
            )
            expect(
                torch.allclose(losses.detach().cpu().float(), expected, rtol=1e-3, atol=1e-5),
                tr("on {device} the losses differ from the CPU's.").format(device=device),
            )

    return run_check(tr("Exercise 1: a device-agnostic loop"), probes)


# Exercise 2 -------------------------------------------------------------------------------


def _reference_epoch(model: nn.Module, batches: Iterable, optimizer: torch.optim.Optimizer):
    """Mean loss, accuracy and lowest batch loss of one epoch, the straightforward way (chapter 2)."""
    loss_fn = nn.BCEWithLogitsLoss()
    total, correct, seen, best = 0.0, 0.0, 0, float("inf")
    for xb, yb in batches:
        optimizer.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = loss_fn(logits, yb)
        loss.backward()
        optimizer.step()
        best = min(best, loss.item())
        total += loss.item() * len(xb)
        correct += ((logits > 0).float() == yb).sum().item()
        seen += len(xb)
    return total / seen, correct / seen, best


def _epoch_case(device: torch.device, seed: int = 0):
    """A model, optimizer and batches for exercise 2, rebuilt identically for each run (chapter 2)."""
    x, y = make_classification_data(610, 20, seed=seed)  # the last batch has 10 samples
    torch.manual_seed(seed)
    model = make_mlp(device=device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed)
    batches = ResidentBatches(x.to(device), y.to(device), batch_size=50, generator=g)
    return model, batches, optimizer


def check_train_epoch(train_epoch: Callable[..., Any]) -> CheckResult:
    """Exercise 2: the same epoch statistics with no host sync inside the epoch (chapter 2)."""

    def probes() -> None:
        device = pick_device()
        expected = _reference_epoch(*_epoch_case(device))
        result, counter = count_syncs(train_epoch, *_epoch_case(device))
        expect(
            isinstance(result, tuple) and len(result) == 3,
            tr("return a tuple (mean_loss, accuracy, best_loss)."),
        )
        expect(
            all(isinstance(r, torch.Tensor) for r in result),
            tr(
                "return the three results as tensors on the device; reading them is the caller's "
                "(one) sync, after the epoch."
            ),
        )
        expect(
            all(r.device.type == device.type and r.dim() == 0 for r in result),
            tr("each result should be a 0-dim tensor on {device}; got {got}.").format(
                device=device, got=[(tuple(r.shape), str(r.device)) for r in result]
            ),
        )
        expect(
            not any(r.requires_grad for r in result),
            tr(
                "a result requires grad, so it keeps every step's autograd graph alive until the "
                "caller drops it: accumulate loss.detach(), not loss."
            ),
        )
        got = [float(r) for r in result]
        names = (tr_mark("mean loss"), tr_mark("accuracy"), tr_mark("best (lowest) batch loss"))
        for name, g, e in zip(names, got, expected):
            expect(
                abs(g - e) <= 1e-5 * max(1.0, abs(e)),
                tr(
                    "the {name} is {got:.6f}, expected {want:.6f}. The mean loss weights each batch by "
                    "its size (the last batch is short); accuracy counts logits > 0 as class 1."
                ).format(name=tr(name), got=g, want=e),
            )
        expect(
            counter.count == 0,
            tr(
                "the epoch still does {count} host sync(s): {where}. Keep "
                "running sums on the device (total = total + loss.detach() * len(xb)), use "
                "torch.minimum instead of `if loss < best`, and convert nothing inside the loop."
            ).format(count=counter.count, where=_where_syncs(counter)),
        )

    return run_check(tr("Exercise 2: remove the hidden syncs"), probes)


# Exercise 3 -------------------------------------------------------------------------------


def _id_data(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """x whose first column is the sample's index, and y = the index: checkable batches (chapter 2)."""
    ids = torch.arange(n, device=device)
    x = torch.stack([ids.float(), -ids.float()], dim=1)
    return x, ids


def _one_epoch(fn: Callable[..., Any], x, y, batch_size: int, g: torch.Generator) -> list:
    """The batches of one epoch as a list (chapter 2)."""
    batches = fn(x, y, batch_size, g)
    expect(
        batches is not None and hasattr(batches, "__iter__"),
        tr("return (or yield) the batches: write a generator with `yield xb, yb`."),
    )
    return list(batches)


def _probe_batch_sizes(
    resident_batches: Callable[..., Any], x: torch.Tensor, y: torch.Tensor, g: torch.Generator
) -> None:
    """Exercise 3's probes of awkward batch sizes, and of 0 and -1 (chapter 2)."""
    n = len(x)
    for bs in (1, 33, 150):  # one sample each; 33 divides nothing here; more than n
        with probe(tr("{n} samples, batch_size={bs}").format(n=n, bs=bs)):
            batches = _one_epoch(resident_batches, x, y, bs, g)
            sizes = [len(yb) for _, yb in batches]
            want = [bs] * (n // bs) + ([n % bs] if n % bs else [])
            expect(
                sizes == want,
                tr("expected batch sizes {want}..., got {got}...").format(
                    want=want[:5], got=sizes[:5]
                ),
            )
            seen = torch.cat([yb for _, yb in batches]).cpu()
            expect(
                bool((torch.bincount(seen, minlength=n) == 1).all()),
                tr("every sample must appear exactly once per epoch."),
            )
    for bs in (0, -1):
        with probe(f"batch_size={bs}"):
            try:
                list(resident_batches(x, y, bs, g))
            except ValueError:
                continue
            raise CheckFailed(
                tr(
                    "batch_size={bs} should raise ValueError with a clear message; it did not."
                ).format(bs=bs)
            )


def check_resident_batches(resident_batches: Callable[..., Any]) -> CheckResult:
    """Exercise 3: every sample exactly once per epoch, a new order each epoch, on the device, no syncs (chapter 2)."""

    def probes() -> None:
        device = pick_device()
        n, bs = 100, 32
        x, y = _id_data(n, device)
        g = torch.Generator().manual_seed(0)
        first = _one_epoch(resident_batches, x, y, bs, g)
        expect(first, tr("the iterator yielded no batches."))
        expect(
            all(isinstance(b, (tuple, list)) and len(b) == 2 for b in first),
            tr("yield pairs (xb, yb)."),
        )
        sizes = [len(yb) for _, yb in first]
        expect(
            sizes == [32, 32, 32, 4],
            tr(
                "100 samples in batches of 32 should give sizes [32, 32, 32, 4], got {sizes}. "
                "Keep the last, shorter batch."
            ).format(sizes=sizes),
        )
        expect(
            all(
                xb.device.type == device.type and yb.device.type == device.type for xb, yb in first
            ),
            tr("the batches should stay on {device}, where x and y live.").format(device=device),
        )
        seen = torch.cat([yb for _, yb in first]).cpu()
        counts = torch.bincount(seen, minlength=n)
        expect(
            bool((counts == 1).all()),
            tr(
                "every sample must appear exactly once per epoch; {missing} "
                "missing, {repeated} repeated."
            ).format(missing=int((counts == 0).sum()), repeated=int((counts > 1).sum())),
        )
        expect(
            all(torch.equal(xb[:, 0].long().cpu(), yb.cpu()) for xb, yb in first),
            tr("xb and yb are out of step: index x and y with the same indices."),
        )
        expect(
            not torch.equal(seen, torch.arange(n)),
            tr("the samples come in their original order: shuffle with torch.randperm."),
        )
        second = torch.cat([yb for _, yb in _one_epoch(resident_batches, x, y, bs, g)]).cpu()
        expect(
            not torch.equal(second, seen),
            tr(
                "the order is the same in two epochs: draw a new permutation each time the iterator "
                "starts (inside the function)."
            ),
        )
        again = _one_epoch(resident_batches, x, y, bs, torch.Generator().manual_seed(0))
        expect(
            torch.equal(torch.cat([yb for _, yb in again]).cpu(), seen),
            tr(
                "the same seed must give the same order: pass generator=generator to torch.randperm."
            ),
        )
        _, counter = count_syncs(_one_epoch, resident_batches, x, y, bs, g)
        expect(
            counter.count == 0,
            tr(
                "the iterator reads values on the host ({where}): on a GPU that is "
                "a sync per epoch or per batch. Index with the permutation tensor itself, not "
                ".tolist()."
            ).format(where=_where_syncs(counter)),
        )
        _probe_batch_sizes(resident_batches, x, y, g)

    return run_check(tr("Exercise 3: a resident-tensor batch iterator"), probes)


# Exercise 4 -------------------------------------------------------------------------------

_MiB = 2**20


def _rows(*specs: tuple[int, float, float]) -> list[dict[str, float]]:
    """(batch size, samples/s, MiB) -> sweep rows (chapter 2)."""
    return [{"batch size": b, "samples/s": s, "peak memory": m * _MiB} for b, s, m in specs]


def check_fastest_batch_size(fastest_batch_size: Callable[..., int]) -> CheckResult:
    """Exercise 4: the fastest batch size whose peak memory fits under a cap (chapter 2)."""

    def probes() -> None:
        rows = _rows((64, 1e5, 10), (256, 3e5, 30), (1024, 5e5, 100), (4096, 6e5, 400))
        snapshot = copy.deepcopy(rows)
        got = fastest_batch_size(rows, 128 * _MiB)
        expect(rows == snapshot, tr("do not change the rows you were given."))
        expect(
            isinstance(got, int) and not isinstance(got, bool),
            tr("return the batch size as an int, got {kind} {got!r}.").format(
                kind=type(got).__name__, got=got
            ),
        )
        expect(
            got == 1024,
            tr("under a 128 MiB cap the answer is 1024 (4096 needs 400 MiB), got {got}.").format(
                got=got
            ),
        )
        expect(
            fastest_batch_size(rows, 1e12) == 4096,
            tr("with room for everything, the fastest row (4096) wins."),
        )
        expect(
            fastest_batch_size(rows, 100 * _MiB) == 1024,
            tr("a batch whose peak equals the cap fits (peak <= cap)."),
        )
        dip = _rows((64, 1e5, 10), (256, 4e5, 30), (512, 2e5, 60), (1024, 6e5, 100))
        expect(
            fastest_batch_size(dip, 64 * _MiB) == 256,
            tr(
                "pick the *fastest* batch that fits, not the largest: here 512 fits but 256 is faster."
            ),
        )
        shuffled = _rows((256, 3e5, 30), (4096, 6e5, 400), (1024, 5e5, 100), (64, 1e5, 10))
        with probe(tr("rows not sorted by batch size")):
            got = fastest_batch_size(shuffled, 128 * _MiB)
        expect(
            got == 1024,
            tr(
                "with the rows in another order the answer is still 1024: do not rely on the rows "
                "being sorted."
            ),
        )
        tie = _rows((128, 2e5, 20), (64, 2e5, 10), (256, 1e5, 40))
        expect(
            fastest_batch_size(tie, 1e12) == 64,
            tr("on a tie in samples/s, prefer the smaller batch (less memory, more steps)."),
        )
        for bad_rows, cap, why in (
            (rows, 1 * _MiB, tr_mark("nothing fits")),
            ([], 1e12, tr_mark("no rows")),
        ):
            try:
                fastest_batch_size(bad_rows, cap)
            except ValueError:
                continue
            raise CheckFailed(
                tr("when {why}, raise ValueError with a message that says so.").format(why=tr(why))
            )

    return run_check(tr("Exercise 4: the fastest batch size under a memory cap"), probes)
