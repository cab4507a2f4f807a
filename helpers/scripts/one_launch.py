"""Several course scripts in one torchrun launch: the ranks join once and run them in turn (chapter 4).

A launch costs seconds before any training starts: torchrun imports torch, every rank
imports torch again, then the ranks meet. A notebook that runs three short jobs pays that
three times. This script pays it once: the ranks join the process group, run each script's
``run(ctx, args)`` one after another in that group (a barrier between two jobs), and leave.
Each script is still a program of its own, and runs alone under torchrun as before.

Jobs are separated by ``--then``; each is a script's name followed by that script's options:

    torchrun --standalone --nproc-per-node=2 one_launch.py \
        manual_allreduce --out /tmp/manual --then ddp_train --out /tmp/ddp
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import torch.distributed as dist

from helpers.i18n import tr
from helpers.scripts.common import JOB_MARKER, exit_now, setup, teardown

#: The word between two jobs on the command line.
SEPARATOR = "--then"
#: Scripts that can share a launch: each has build_parser() and run(ctx, args). The others
#: cannot: elastic_train fails and restarts on purpose, scaling makes groups of its own.
JOINABLE = (
    "manual_allreduce",
    "ddp_train",
    "fsdp_vs_ddp",
    "dp_by_hand",
    "zero1_by_hand",
    "fsdp_by_hand",
)
USAGE = f"one_launch.py SCRIPT [OPTIONS] {SEPARATOR} SCRIPT [OPTIONS] ..."


def split_jobs(argv: list[str]) -> list[tuple[str, list[str]]]:
    """['a', '--x', '1', '--then', 'b'] -> [('a', ['--x', '1']), ('b', [])], checked (chapter 4)."""
    jobs: list[tuple[str, list[str]]] = []
    current: list[str] = []
    for word in [*argv, SEPARATOR]:
        if word != SEPARATOR:
            current.append(word)
            continue
        if not current:
            raise SystemExit(
                tr(
                    "one_launch.py: an empty job (a script name must come first and after each "
                    "{separator}). Usage: {usage}"
                ).format(separator=SEPARATOR, usage=USAGE)
            )
        name, *options = current
        if name not in JOINABLE:
            raise SystemExit(
                tr(
                    "one_launch.py: {name!r} cannot share a launch. Use one of {joinable}, "
                    "or launch it on its own. Usage: {usage}"
                ).format(name=name, joinable=", ".join(JOINABLE), usage=USAGE)
            )
        jobs.append((name, options))
        current = []
    return jobs


def parse_jobs(jobs: list[tuple[str, list[str]]]) -> list[tuple[ModuleType, object]]:
    """Each job's module and parsed options; bad options stop the launch before any rank joins (chapter 4)."""
    parsed = []
    for name, options in jobs:
        module = importlib.import_module(f"helpers.scripts.{name}")
        p = module.build_parser()
        p.prog = f"one_launch.py ... {name}"  # argparse's errors name the job, not this file
        parsed.append((module, p.parse_args(options)))
    return parsed


def main(argv: list[str] | None = None) -> None:
    jobs = split_jobs(sys.argv[1:] if argv is None else argv)
    parsed = parse_jobs(jobs)
    ctx = setup(max(args.pg_timeout for _, args in parsed))
    for (name, _), (module, args) in zip(jobs, parsed):
        if ctx.is_main:
            print(f"{JOB_MARKER} {name}", flush=True)
        module.run(ctx, args)
        dist.barrier()  # no rank starts the next job while another is still in this one
    teardown()


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
