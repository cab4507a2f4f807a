"""What every chapter 4 script shares: joining the process group, logging, results (chapter 4).

The scripts run under ``torchrun``, which starts one process per rank and describes the job
in environment variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``). :func:`setup` reads them, picks the backend (NCCL with one GPU per rank on
CUDA, gloo on CPU) and joins the group with a timeout, so a lost peer becomes an error
instead of a hang. On one machine the course's launcher passes a file instead of a port
(``$COURSE_PG_FILE``), so the ranks meet without opening a TCP store on the network.
Results go to ``--out DIR`` as ``torch.save`` files that the notebook reads back with
``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from helpers.i18n import tr

#: Environment variable the launcher uses to pass the backend to every rank.
BACKEND_ENV = "COURSE_DIST_BACKEND"
#: The backends the course uses.
BACKENDS = ("gloo", "nccl")
#: Set by the launcher on one machine: the ranks meet through this file instead of a TCP port.
PG_FILE_ENV = "COURSE_PG_FILE"
#: Rank 0 starts its line with this once the process group is up; the launcher times start-up
#: with it (a tag, not words: the rest of the line is in the learner's language).
READY_MARKER = "[course:ready]"
#: Rank 0 prints this and a script's name when one_launch.py starts that script's job.
JOB_MARKER = "[course:job]"
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass
class Context:
    """Who this process is in the job: rank, world size, local rank, backend, device (chapter 4)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        """True on rank 0, the one that logs and saves (chapter 4)."""
        return self.rank == 0


def choose_backend() -> str:
    """The backend from $COURSE_DIST_BACKEND, else NCCL when CUDA exists, else gloo (chapter 4)."""
    name = os.environ.get(BACKEND_ENV, "").strip().lower()
    if not name:
        name = "nccl" if torch.cuda.is_available() else "gloo"
    if name not in BACKENDS:
        raise SystemExit(
            tr("Unknown backend {name!r} in ${env}: use one of {backends}.").format(
                name=name, env=BACKEND_ENV, backends=BACKENDS
            )
        )
    if name == "nccl" and not torch.cuda.is_available():
        raise SystemExit(tr("The nccl backend needs CUDA GPUs, and torch sees none: use gloo."))
    return name


def init_method() -> str:
    """'file://...' when the launcher set $COURSE_PG_FILE (one machine), else 'env://' (chapter 4)."""
    path = os.environ.get(PG_FILE_ENV, "").strip()
    if not path:
        return "env://"  # rank 0 hosts a TCPStore at MASTER_ADDR:MASTER_PORT
    # a fresh file for each restart: a dead attempt can leave its file behind
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return Path(f"{path}-{attempt}").resolve().as_uri()


def setup(timeout_s: float = 60.0) -> Context:
    """Join the process group torchrun described in the environment, with a timeout (chapter 4)."""
    missing = [k for k in _TORCHRUN_VARS if k not in os.environ]
    if missing:
        script = Path(sys.argv[0]).name
        raise SystemExit(
            tr(
                "{script}: {missing} not set. Start it with torchrun, e.g. "
                "`torchrun --standalone --nproc-per-node=2 {script} --out /tmp/run`, or from a "
                "notebook with helpers.launch.launch('{name}')."
            ).format(script=script, missing=", ".join(missing), name=Path(script).stem)
        )
    backend = choose_backend()
    local_rank = int(os.environ["LOCAL_RANK"])
    join: dict[str, Any] = {
        "init_method": init_method(),
        "rank": int(os.environ["RANK"]),
        "world_size": int(os.environ["WORLD_SIZE"]),
        "timeout": datetime.timedelta(seconds=timeout_s),
    }
    if backend == "nccl":
        if local_rank >= torch.cuda.device_count():
            raise SystemExit(
                tr(
                    "LOCAL_RANK {local_rank} has no GPU: only {visible} visible. "
                    "Start at most one process per GPU."
                ).format(local_rank=local_rank, visible=torch.cuda.device_count())
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # exact comparisons with fp32 references
        torch.backends.cudnn.allow_tf32 = False
        dist.init_process_group(backend, device_id=device, **join)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend, **join)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():  # what the launcher gave each rank
        torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    ctx = Context(dist.get_rank(), dist.get_world_size(), local_rank, backend, device)
    dist.barrier()
    if ctx.is_main:
        print(ready_line(ctx.world_size, backend, device.type, torch.get_num_threads()), flush=True)
    return ctx


def ready_line(world_size: int, backend: str, device: str, threads: int) -> str:
    """What rank 0 prints once the group is up: READY_MARKER (kept, the launcher looks for it), then the job (chapter 4)."""
    return f"{READY_MARKER} " + tr(
        "process group ready: {world_size} rank(s), backend {backend}, device {device}, "
        "{threads} thread(s) per rank"
    ).format(world_size=world_size, backend=backend, device=device, threads=threads)


def teardown() -> None:
    """Leave the process group cleanly: wait for every rank, then destroy it (chapter 4)."""
    if dist.is_initialized():
        # Without this barrier a fast rank can close its gloo sockets while a slower one is
        # still talking to it; the slower one then dies with "Connection reset by peer" (abort).
        # The barrier's work is held until the group is gone: it keeps the earlier collectives'
        # tensors, and if a gloo thread dropped them while destroy_process_group holds the GIL
        # (torch < 2.8 does, pytorch/pytorch#154976) both would wait for ever.
        done = dist.barrier(async_op=True)
        done.wait()
        dist.destroy_process_group()
        del done


def exit_now() -> NoReturn:
    """End this rank at once, its output flushed, without Python's slow shutdown (chapter 4).

    Call it last, after teardown(). A rank that built a DDP model has imported torch._dynamo
    (about 800 modules); the interpreter's orderly shutdown of them took about a second per
    rank on the course's 2-core machine, and a chapter of many short launches paid it every
    time. Results are saved and closed by then, so nothing is lost by skipping it.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def log(ctx: Context, message: str) -> None:
    """Print on rank 0 only: one log line per job, not one per rank (chapter 4)."""
    if ctx.is_main:
        print(f"[rank 0] {message}", flush=True)


def say(ctx: Context, message: str) -> None:
    """Print from every rank, prefixed with its rank (chapter 4)."""
    print(f"[rank {ctx.rank}] {message}", flush=True)


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the options every script takes: --out, --seed, --pg-timeout (chapter 4)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", required=True, type=Path, help="folder for the results")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pg-timeout", type=float, default=60.0, help="process-group timeout, s")
    return p


def write_result(out: Path, ctx: Context, result: dict[str, Any]) -> Path:
    """Save this rank's results as OUT/rank<r>.pt for the notebook to load (chapter 4)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rank{ctx.rank}.pt"
    torch.save(result, path)
    return path


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters of a model as one CPU vector (chapter 4)."""
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def grads(model: nn.Module) -> list[torch.Tensor]:
    """A CPU copy of every parameter's gradient (chapter 4)."""
    return [p.grad.detach().cpu().clone() for p in model.parameters()]


def run_alone(
    parser: argparse.ArgumentParser,
    run: Callable[[Context, argparse.Namespace], None],
    argv: list[str] | None = None,
) -> None:
    """A script's main(): parse its options, join the group, run its job, leave (chapter 4).

    one_launch.py calls the same run(ctx, args) of several scripts in one group instead.
    """
    args = parser.parse_args(argv)
    ctx = setup(args.pg_timeout)
    run(ctx, args)
    teardown()
