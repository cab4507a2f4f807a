"""Chapter 4 figures: start-up, training throughput and scaling of torchrun jobs on this machine.

    python benchmarks/ch04_scaling.py                  # gloo CPU ranks (or NCCL with 2+ GPUs)
    python benchmarks/ch04_scaling.py --max-procs 4 --repeats 3 --width 1024

Prints three tables:

1. start-up: ``import torch`` in a fresh interpreter, and a torchrun launch from its start to
   the process group being ready (torchrun imports torch, then every rank does and connects);
2. a dead rank: how long torchrun takes to notice, stop the other ranks and exit non-zero;
3. weak scaling: step time, samples/s and scaling efficiency for 1..max-procs ranks, one
   thread per rank on CPU (medians over --repeats launches; each launch measures every
   process count, the first k ranks in a process group of their own).

Timings, not tests: expect noise on a shared machine. Version 2 (version 1 launched once per
process count).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from helpers.launch import check_backend, launch, max_processes, new_run_dir
from helpers.processes import cpu_cores, gpu_count
from helpers.scaling_sweep import measure_scaling
from helpers.tables import print_table


def import_torch_seconds(repeats: int) -> float:
    """Median wall time of `python -c 'import torch'` in a fresh process."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def startup_rows(nprocs: list[int], backend: str, repeats: int) -> list[dict]:
    """Launch-to-ready and total launch time of the smallest script, per process count."""
    rows = []
    for n in nprocs:
        ready, total = [], []
        for _ in range(repeats):
            out = new_run_dir("bench_startup")
            res = launch(
                "manual_allreduce", n, ["--out", out], backend=backend, echo=False, threads=1
            )
            ready.append(res.seconds_until() or float("nan"))
            total.append(res.seconds)
        rows.append(
            {
                "processes": n,
                "launch -> group ready s": statistics.median(ready),
                "whole launch s": statistics.median(total),
            }
        )
    return rows


def dead_rank_row(backend: str, repeats: int) -> dict:
    """Seconds until torchrun exits after rank 1 crashes at step 2."""
    seconds, codes = [], set()
    for _ in range(repeats):
        out = new_run_dir("bench_dead")
        args = ["--out", out, "--die-rank", 1, "--die-at-step", 2]
        res = launch("elastic_train", 2, args, backend=backend, echo=False, check=False)
        seconds.append(res.seconds)
        codes.add(res.returncode)
    return {"launch with a dead rank, s": statistics.median(seconds), "exit codes": sorted(codes)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-procs", type=int, default=None, help="default: min(4, allowed)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--per-rank-batch", type=int, default=256)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    backend = check_backend(None)  # nccl with a GPU for each rank, else gloo
    top = args.max_procs or min(4, max_processes(backend))
    nprocs = list(range(1, top + 1))
    print(f"{cpu_cores()} CPU core(s), {gpu_count()} GPU(s); backend {backend}; ranks {nprocs}\n")

    print("1. Start-up (medians)")
    print(f"import torch: {import_torch_seconds(args.repeats):.2f} s")
    print_table(startup_rows(nprocs, backend, args.repeats))

    print("\n2. A rank that dies (median)")
    print_table([dead_rank_row(backend, args.repeats)])

    print("\n3. Weak scaling (median over launches of the per-launch median step)")
    runs = [
        measure_scaling(
            nprocs,
            backend=backend,
            per_rank_batch=args.per_rank_batch,
            width=args.width,
            steps=args.steps,
        )
        for _ in range(args.repeats)
    ]
    rows = []
    for i, n in enumerate(nprocs):
        pick = [run.rows[i] for run in runs]
        rows.append(
            {
                "processes": n,
                "threads/rank": pick[0]["threads/rank"],
                "global batch": pick[0]["global batch"],
                "step ms": statistics.median(r["step ms"] for r in pick),
                "samples/s": statistics.median(r["samples/s"] for r in pick),
                "speed-up": statistics.median(r["speed-up"] for r in pick),
                "efficiency": statistics.median(r["efficiency"] for r in pick),
            }
        )
    print_table(rows)


if __name__ == "__main__":
    main()
