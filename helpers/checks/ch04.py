"""Checkers for the chapter 4 exercises (chapter 4).

Three of them run the learner's function on 2 gloo ranks: the function travels to the ranks
as its compiled code plus the modules and imported names it uses (so it must be
self-contained: imports inside the exercise cell, no helper functions from other cells),
``helpers/scripts/exercise_check.py`` calls it on each rank, and the checker compares what
the ranks did with one process's answer. An untouched stub is recognised without launching.
"""

from __future__ import annotations

import importlib
import marshal
import pickle
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from helpers.checks import CheckFailed, CheckResult, expect, run_check
from helpers.data import make_classification_data
from helpers.scripts import exercise_check as task

WORLD = 2
_SIMPLE = (bool, int, float, str, bytes, type(None))


def _names(code: types.CodeType) -> set[str]:
    """Every global name a code object (and the code nested in it) may look up (chapter 4)."""
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _names(const)
    return found


def _importable(obj: Any) -> tuple[str, str] | None:
    """(module, qualname) if `obj` can be imported back by that name, else None (chapter 4)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return (module, qualname) if found is obj else None


def is_stub(fn: Callable) -> bool:
    """True while the function still raises the exercise's NotImplementedError (chapter 4)."""
    return "NotImplementedError" in _names(fn.__code__)


def payload(fn: Callable) -> dict[str, Any]:
    """What the ranks need to rebuild `fn`: its code and the globals it names (chapter 4)."""
    if not isinstance(fn, types.FunctionType):
        raise CheckFailed(f"pass your function itself, not {type(fn).__name__}.")
    if fn.__closure__:
        raise CheckFailed("define the function at the top level of the cell, not inside another.")
    modules, objects, values = {}, {}, {}
    for name in sorted(_names(fn.__code__)):
        if name not in fn.__globals__:
            continue  # a builtin, an attribute name, or a name that is simply not used
        value = fn.__globals__[name]
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
        elif isinstance(value, _SIMPLE):
            values[name] = value
        elif (where := _importable(value)) is not None:
            objects[name] = where
        else:
            raise CheckFailed(
                f"your function uses {name!r} from the notebook, and the ranks cannot see the "
                f"notebook. Import or define what it needs inside the exercise cell (imports "
                f"are fine), or inside the function."
            )
    return {
        "code": marshal.dumps(fn.__code__),
        "name": fn.__name__,
        "defaults": fn.__defaults__,
        "modules": modules,
        "objects": objects,
        "values": values,
    }


def run_on_ranks(fn: Callable, name: str) -> list[dict[str, Any]]:
    """Run `fn` as task `name` on 2 gloo ranks; each rank's result (chapter 4)."""
    from helpers.distributed import launch, new_run_dir, read_results

    if is_stub(fn):
        raise NotImplementedError
    data = payload(fn)
    out = new_run_dir(f"exercise_{name}")
    with open(out / "payload.pkl", "wb") as f:
        pickle.dump(data, f)
    args = ["--payload", out / "payload.pkl", "--task", name, "--out", out, "--pg-timeout", 20]
    res = launch(
        "exercise_check", WORLD, args, backend="gloo", timeout=120, echo=False, check=False
    )
    if not res.ok:
        tail = "\n".join(res.lines[-15:])
        raise CheckFailed(f"the 2-rank run failed. {res.message}\nLast lines:\n{tail}")
    results = read_results(out, WORLD)
    if any(r["status"] == "todo" for r in results):
        raise NotImplementedError
    errors = [r["error"] for r in results if r["status"] == "error"]
    if errors:
        raise CheckFailed(f"your function raised on the ranks: {errors[0]}")
    return results


def _close(a: list[torch.Tensor], b: list[torch.Tensor], scale: float = 1.0) -> bool:
    """Whether two lists of gradients match, b scaled by `scale` (chapter 4)."""
    return all(torch.allclose(x, y * scale, rtol=1e-4, atol=1e-6) for x, y in zip(a, b))


def _grads(model: nn.Module) -> list[torch.Tensor]:
    """A copy of every gradient of `model` (chapter 4)."""
    return [p.grad.detach().clone() for p in model.parameters()]


def reference_average_gradients() -> list[torch.Tensor]:
    """One process's gradients on the whole global batch of the average_gradients task (chapter 4)."""
    x, y = make_classification_data(task.PER_RANK_BATCH * WORLD, seed=7)
    model = task.make_mlp(task.SIZES, seed=3)
    nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
    return _grads(model)


def check_average_gradients(average_gradients: Callable[[nn.Module], None]) -> CheckResult:
    """Exercise 2: all-reduce the gradients and divide by the world size (chapter 4)."""

    def probes() -> None:
        ranks = run_on_ranks(average_gradients, "average_gradients")
        ref = reference_average_gradients()
        for r, res in enumerate(ranks):
            after, before = res["after"], res["before"]
            expect(
                not _close(after, before) or _close(after, ref),
                f"rank {r}'s gradients did not change: call dist.all_reduce on every p.grad.",
            )
            expect(
                not _close(after, ref, WORLD),
                f"rank {r}'s gradients are {WORLD}x too large: all_reduce sums, so divide by "
                f"dist.get_world_size() afterwards.",
            )
            expect(
                not _close(after, ref, 1 / WORLD),
                f"rank {r}'s gradients are {WORLD}x too small: divide once, after the sum.",
            )
            expect(
                _close(after, ref),
                f"rank {r}'s gradients differ from one process's gradient on the whole batch. "
                f"Sum them with dist.all_reduce(p.grad) and divide by the world size.",
            )

    return run_check("Exercise 2, average the gradients", probes)


def reference_accumulate() -> list[torch.Tensor]:
    """One process's gradients on the accumulate task's whole global batch (chapter 4)."""
    n = task.ACCUM_STEPS * task.PER_RANK_BATCH * WORLD
    x, y = make_classification_data(n, seed=11)
    model = task.make_mlp(task.SIZES, seed=3)
    nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
    return _grads(model)


def check_accumulate(accumulate: Callable[..., None]) -> CheckResult:
    """Exercise 3: gradient accumulation with no_sync, equal to the big batch (chapter 4)."""

    def probes() -> None:
        ranks = run_on_ranks(accumulate, "accumulate")
        ref = reference_accumulate()
        k = task.ACCUM_STEPS
        for r, res in enumerate(ranks):
            g, calls, per_sync = res["grads"], res["calls"], res["calls_per_sync"]
            expect(
                calls > 0,
                "DDP never all-reduced: the last micro-batch's backward must run outside "
                "no_sync(), so that the accumulated gradients are averaged once.",
            )
            expect(
                not _close(g, ref, k),
                f"the gradients are {k}x too large: divide each micro-batch's loss by the "
                f"number of micro-batches before backward.",
            )
            expect(
                _close(g, ref),
                f"rank {r}'s gradients differ from the big batch's. Backward on every "
                f"micro-batch with loss / len(micro_batches), inside model.no_sync() for all "
                f"but the last.",
            )
            expect(
                calls == per_sync,
                f"DDP all-reduced {calls // max(per_sync, 1)} times instead of once: wrap "
                f"every backward except the last in `with model.no_sync():`.",
            )

    return run_check("Exercise 3, accumulate with no_sync", probes)


def reference_train(reads: list[list[int]]) -> torch.Tensor:
    """One process training on the global batches the ranks read, as a flat vector (chapter 4)."""
    x, y = make_classification_data(task.DATASET_SIZE, seed=5)
    model = task.make_mlp(task.SIZES, seed=3)
    opt = torch.optim.SGD(model.parameters(), lr=task.LR)
    b = task.PER_RANK_BATCH
    steps = len(reads[0]) // b
    for s in range(steps):
        idx = torch.tensor([i for read in reads for i in read[s * b : (s + 1) * b]])
        opt.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(model(x[idx]), y[idx]).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def check_train_ddp(train_ddp: Callable[..., None]) -> CheckResult:
    """Exercise 4: a DDP-ready loop, with sampler, set_epoch, DDP and rank-0 saving (chapter 4)."""

    def probes() -> None:
        ranks = run_on_ranks(train_ddp, "train_ddp")
        n, w, epochs = task.DATASET_SIZE, WORLD, task.EPOCHS
        per_epoch = n // w
        for r, res in enumerate(ranks):
            expect(
                len(res["read"]) == per_epoch * epochs,
                f"rank {r} read {len(res['read'])} samples in {epochs} epochs instead of "
                f"{per_epoch * epochs}: give the DataLoader a DistributedSampler (and no "
                f"shuffle=True of its own), so that each rank reads only its share.",
            )
        firsts = [set(res["read"][:per_epoch]) for res in ranks]
        expect(
            not (firsts[0] & firsts[1]) and len(firsts[0] | firsts[1]) == n,
            "the ranks' shares overlap: build DistributedSampler(dataset) inside the ranks.",
        )
        r0 = ranks[0]["read"]
        expect(
            r0[:per_epoch] != r0[per_epoch : 2 * per_epoch],
            "every epoch read the data in the same order: call sampler.set_epoch(epoch) at "
            "the start of each epoch.",
        )
        expect(
            torch.equal(ranks[0]["params"], ranks[1]["params"]),
            "the ranks ended with different weights: wrap the model in DistributedDataParallel "
            "so that every backward averages the gradients.",
        )
        expect(
            not ranks[1]["saves"],
            "rank 1 saved a checkpoint too: save only where dist.get_rank() == 0.",
        )
        saves = ranks[0]["saves"]
        expect(len(saves) == 1, f"rank 0 saved {len(saves)} times; save once, after training.")
        keys = saves[0]["keys"] or []
        expect(
            keys and not any(k.startswith("module.") for k in keys),
            "save the plain model's weights, model.module.state_dict() (a state_dict, "
            "without the 'module.' prefix that DDP adds), not the DDP wrapper's.",
        )
        expect(
            not ranks[1]["printed"].strip(),
            "rank 1 printed too: log only on rank 0, or every line appears once per rank.",
        )
        state = torch.load(saves[0]["path"], weights_only=True)
        plain = task.make_mlp(task.SIZES)
        plain.load_state_dict(state)
        saved = torch.cat([p.detach().reshape(-1) for p in plain.parameters()])
        expect(torch.equal(saved, ranks[0]["params"]), "the checkpoint is not the trained model.")
        ref = reference_train([res["read"] for res in ranks])
        expect(
            torch.allclose(saved, ref, rtol=1e-4, atol=1e-5),
            "the weights differ from one process training on the same global batches: keep "
            "SGD(lr=lr), BCEWithLogitsLoss and one step per batch.",
        )

    return run_check("Exercise 4, a DDP-ready training loop", probes)


def check_scaled_lr(scaled_lr: Callable[..., tuple[int, float]]) -> CheckResult:
    """Exercise 1: effective batch size and the linear learning-rate scaling rule (chapter 4)."""

    cases = [  # base_lr, base_batch, per_rank_batch, world_size, accum_steps
        (0.1, 256, 32, 8, 1),
        (0.1, 256, 32, 8, 4),
        (3e-4, 64, 16, 2, 2),
        (0.05, 128, 128, 1, 1),
    ]

    def probes() -> None:
        for base_lr, base_batch, per_rank, world, accum in cases:
            got = scaled_lr(base_lr, base_batch, per_rank, world, accum)
            expect(
                isinstance(got, tuple) and len(got) == 2,
                "return a pair: (effective_batch, learning_rate).",
            )
            batch, lr = got
            want = per_rank * world * accum
            if accum > 1:
                expect(
                    batch != per_rank * world,
                    "the effective batch ignores accumulation: each optimizer step sees "
                    "per_rank_batch x world_size x accum_steps samples.",
                )
            expect(
                batch == want,
                f"with {per_rank} per rank, {world} ranks and {accum} accumulation steps the "
                f"effective batch is {want}, not {batch}.",
            )
            expect(
                abs(lr - base_lr * want / base_batch) <= 1e-12 + 1e-9 * abs(lr),
                "scale the learning rate linearly: base_lr x effective_batch / base_batch.",
            )

    return run_check("Exercise 1, effective batch and learning rate", probes)
