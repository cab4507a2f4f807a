"""Runs a learner's function on every rank for the chapter 4 exercise checks (chapter 4).

The checker (``helpers.checks.ch04``) sends the function as its compiled code plus the
modules and imported names it uses (``--payload``, a pickle the checker wrote); this script
rebuilds it on each rank, calls it in the situation the exercise describes, and saves what
happened (``--out``/rank<r>.pt). The checker compares that with one process's answer.

Tasks: ``average_gradients``, ``accumulate`` (no_sync), ``train_ddp`` (a DDP-ready loop).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import io
import marshal
import pickle
import time
import types
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset

from helpers.checks import forwards_at_once, work_order
from helpers.data import make_classification_data
from helpers.models import make_mlp
from helpers.scripts.common import (
    Context,
    exit_now,
    flat_params,
    grads,
    parser,
    setup,
    teardown,
)

#: Sizes every task uses; the checker imports them to build its single-process reference.
SIZES = (20, 16, 1)
PER_RANK_BATCH = 8
ACCUM_STEPS = 3
DATASET_SIZE = 64
EPOCHS = 2
LR = 0.1
#: How long rank 0's torch.save takes in train_ddp, so that a missing barrier shows.
SLOW_SAVE_S = 0.5


def rebuild(payload: dict[str, Any]) -> types.FunctionType:
    """The learner's function, from its code and the globals it names (chapter 4)."""
    env: dict[str, Any] = {"__builtins__": builtins, "__name__": "learner"}
    env.update({n: importlib.import_module(m) for n, m in payload["modules"].items()})
    for name, (module, qualname) in payload["objects"].items():
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        env[name] = obj
    env.update(payload["values"])
    env.update({n: rebuild(p) for n, p in payload.get("functions", {}).items()})
    code = marshal.loads(payload["code"])
    fn = types.FunctionType(code, env, payload["name"], payload["defaults"])
    env.update(dict.fromkeys(payload.get("itself", []), fn))  # its own name: the function itself
    return fn


def counting_hook(calls, bucket):  # noqa: ANN001, ANN201 - DDP checks these annotations
    """DDP's all-reduce hook, counting its calls (chapter 4)."""
    calls[0] += 1
    return default_hooks.allreduce_hook(None, bucket)


def task_average_gradients(ctx: Context, fn: types.FunctionType) -> dict[str, Any]:
    """Backward on this rank's shard, then the learner's averaging (chapter 4)."""
    b = PER_RANK_BATCH
    x, y = make_classification_data(b * ctx.world_size, seed=7)
    model = make_mlp(SIZES, seed=3)
    rows = slice(ctx.rank * b, (ctx.rank + 1) * b)
    nn.functional.binary_cross_entropy_with_logits(model(x[rows]), y[rows]).backward()
    before, weights = grads(model), flat_params(model)
    fn(model)
    return {"before": before, "after": grads(model), "moved": not flat_params(model).equal(weights)}


def micro_batches(ctx: Context, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """This rank's `steps` micro-batches of one global batch (chapter 4)."""
    b, w = PER_RANK_BATCH, ctx.world_size
    x, y = make_classification_data(steps * b * w, seed=11)
    rows = [slice((i * w + ctx.rank) * b, (i * w + ctx.rank + 1) * b) for i in range(steps)]
    return [(x[r], y[r]) for r in rows]


def task_accumulate(ctx: Context, fn: types.FunctionType, steps: int) -> dict[str, Any]:
    """The learner's accumulation on a DDP model: gradients, all-reduces, work order (chapter 4)."""
    probe = DDP(make_mlp(SIZES, seed=3))
    per_sync = [0]
    probe.register_comm_hook(state=per_sync, hook=counting_hook)
    x, y = micro_batches(ctx, steps)[0]
    nn.functional.binary_cross_entropy_with_logits(probe(x), y).backward()
    model = DDP(make_mlp(SIZES, seed=3))
    calls = [0]
    model.register_comm_hook(state=calls, hook=counting_hook)
    weights = flat_params(model)
    with work_order(model.module, model.module[0].weight) as events:
        fn(model, micro_batches(ctx, steps), nn.BCEWithLogitsLoss())
    return {
        "grads": grads(model.module),
        "calls": calls[0],
        "calls_per_sync": per_sync[0],
        "together": forwards_at_once(events),
        "moved": not flat_params(model).equal(weights),
    }


class RecordingDataset(Dataset):
    """The exercise's dataset; it remembers which indices this rank read, in order (chapter 4)."""

    def __init__(self) -> None:
        self.x, self.y = make_classification_data(DATASET_SIZE, seed=5)
        self.read: list[int] = []

    def __len__(self) -> int:
        return DATASET_SIZE

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        self.read.append(int(i))
        return self.x[i], self.y[i]


def task_train_ddp(ctx: Context, fn: types.FunctionType, out: Path) -> dict[str, Any]:
    """The learner's DDP-ready loop: what each rank read, printed, saved and ended with (chapter 4)."""
    data = RecordingDataset()
    model = make_mlp(SIZES, seed=3)
    saves: list[dict[str, Any]] = []
    real_save = torch.save

    def recording_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        keys = list(obj.keys()) if isinstance(obj, dict) else None
        saves.append({"type": type(obj).__name__, "keys": keys, "path": str(f)})
        time.sleep(SLOW_SAVE_S)  # a slow disk: a rank that does not wait returns first
        real_save(obj, f, *args, **kwargs)

    printed = io.StringIO()
    torch.save = recording_save
    try:
        with contextlib.redirect_stdout(printed):
            fn(
                model,
                data,
                epochs=EPOCHS,
                batch_size=PER_RANK_BATCH,
                lr=LR,
                checkpoint_path=str(out / "checkpoint.pt"),
            )
    finally:
        torch.save = real_save
    written_on_return = (out / "checkpoint.pt").exists()  # before the harness's own barrier
    dist.barrier()
    return {
        "written_on_return": written_on_return,
        "read": data.read,
        "saves": saves,
        "checkpoint": read_back(saves[0]["path"]) if saves else None,
        "printed": printed.getvalue(),
        "params": flat_params(model),
    }


def read_back(path: str) -> dict[str, Any] | str:
    """What torch.load(path, weights_only=True) gives, or why it failed (chapter 4)."""
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # the learner's file, whatever went wrong with it
        return f"{type(exc).__name__}: {exc}"


def run_task(
    task: str, ctx: Context, fn: types.FunctionType, out: Path, steps: int = ACCUM_STEPS
) -> dict[str, Any]:
    """Run one task on this rank (or in the checker's own one-rank group) (chapter 4)."""
    if task == "average_gradients":
        return task_average_gradients(ctx, fn)
    if task == "accumulate":
        return task_accumulate(ctx, fn, steps)
    return task_train_ddp(ctx, fn, out)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--payload", required=True, type=Path)
    p.add_argument(
        "--task", required=True, choices=["average_gradients", "accumulate", "train_ddp"]
    )
    p.add_argument("--accum-steps", type=int, default=ACCUM_STEPS)
    args = p.parse_args()
    ctx = setup(args.pg_timeout)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.payload, "rb") as f:
        payload = pickle.load(f)
    result: dict[str, Any] = {"status": "ok"}
    try:
        fn = rebuild(payload)
        result.update(run_task(args.task, ctx, fn, args.out, args.accum_steps))
    except NotImplementedError:
        result = {"status": "todo"}
    except Exception as exc:  # report the learner's error instead of crashing the job
        result = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
    torch.save(result, args.out / f"rank{ctx.rank}.pt")
    teardown()


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
