"""Chapter 8 benchmark: the pieces built by hand against the library they replace.

    python benchmarks/ch08_build_it.py                      # the device pick_device() chooses
    python benchmarks/ch08_build_it.py --device cpu --min-run-time 0.1
    python benchmarks/ch08_build_it.py --lengths 2048 4096  # a shorter GPU sweep
    python benchmarks/ch08_build_it.py --threads 1          # a shared CPU: 2 threads can stall

Attention part (attention_part):

1. Saved bytes: one causal forward of the written-out attention (helpers.gpt.manual_attention)
   and of the PyTorch tiles (helpers.flash_attention.flash_attention), one head of width 64,
   T = 1024, 2048, 4096 on the CPU, measured with chapter 5's meter (q, k, v excluded).
2. Correctness, then time: on the device, every method of helpers.attention_timing.sweep_plan
   (SDPA's kernels one by one and its default pick, the PyTorch tiles, the written-out
   attention, and the Triton kernel where it compiles) is first checked against float64 at
   T = 200 by helpers.attention_errors' rule (its largest output error at most the allowed
   factor times that of the attention written out in the same dtype:
   helpers.attention_timing.check_methods), then timed with
   helpers.timing.benchmark (causal forward, no grad): T = 512..8192, batch 4 x 16 heads x 64
   in bf16 on a GPU (fp16 without native bf16); T = 128..512, 1 x 4 x 64 in fp32 on a CPU.
   Peak memory per forward (on top of its inputs) from torch.cuda.max_memory_allocated.
2b. Training (issue 31): the chapter's Triton backward (helpers.attention_triton, three
   kernels) first checked against float64 by helpers.attention_errors' rule at T = 72 (causal
   and not; float32 and 16-bit), then, on a CUDA GPU only, Triton's forward+backward against
   each SDPA kernel (torch.autograd.grad, q, k, v requiring grad) at head_dim 64 in bf16, T =
   2048 and 8192, through helpers.timing.benchmark; the table keeps Triton's row and SDPA's
   fastest kernel's. ``--training-table`` times CS336's table instead: forward, backward and
   forward+backward, head_dim 16, 32, 64, 128, T = 512..8192 (or --lengths), bf16 and fp32
   (several minutes on an H100). On a CPU the check runs in Triton's interpreter (NumPy, small
   tiles) and nothing is timed: the interpreter's speed says nothing of the kernels.

Targets (issues 26 and 31), printed, never asserted: CPU, the tiles' saved bytes at T = 4096 at
most 1/8 of the written-out attention's; GPU (H100 class), at T >= 2048, the Triton forward
within 1.25x of SDPA's fastest kernel (d = 64, bf16) and faster than the PyTorch tiles, and
Triton's forward+backward within 2x of SDPA's fastest: "meets" or "MISSES" on a quiet
machine, "inconclusive" on a shared GPU or a loaded CPU, as the verdicts say. The rate column is TFLOP/s on a GPU, GFLOP/s elsewhere. The exit status is 1 only when a
correctness check failed.

Parallel part (parallel_part), sections 3-6: one launch (``one_launch.py``) runs
``dp_by_hand``, ``zero1_by_hand`` and ``fsdp_by_hand`` (NCCL, one rank per GPU, with 2 or more GPUs; else 2 gloo
ranks, at the chapter's sizes for each), then prints:

3. the five ways of averaging gradients: step time (median of blocks, slowest rank), IQR,
   each way's saving against (b), one flat all-reduce after backward, how much its backward
   stretched against (b)'s, all-reduce calls, MiB handed to all-reduce and MiB each rank puts
   on the wire (a ring: 2(W-1)/W of the buffer); the machine's state over the launch; then the
   all-reduce times at several sizes with the alpha-beta fit t(n) = alpha + n beta and whether
   the line passes within every size's spread (a prediction wherever alpha >= 0 and beta > 0,
   called a rough guide where the line misses), the bucket-size sweep with each cap's measured
   wait after backward beside the model's, the bucket size the model derives (whichever of
   G sqrt(alpha / B) and, when beta G < B, G alpha / (B - beta G) leaves the smaller wait)
   against the best measured, the best against the runner-up and the model's nearest cap
   against the best as compare_rows verdicts, and DDP's buckets before and after its rebuild,
   and at the default cap;
4. the targets, each a verdict from two rows of that table (``compare_rows``): on a CPU with
   2 gloo ranks, the bucketed overlapped way within 1.1x of DDP's step time and faster than
   the per-parameter way; then each overlapped way's saving against (b) and its stretch;
5. ZeRO-1: Adam's moment bytes per rank against every rank's full Adam; the target is exactly
   1/world (the script's default model has 4,200 parameters, a multiple of 840 = lcm(1..8), so
   every world size from 1 to 8 divides it).
6. bytes on the wire per step of DDP, ZeRO-1 (reduce-scatter + all-gather: DDP's in a ring)
   and the naive ZeRO-1 (all-reduce + all-gather), and of DDP and FSDP by hand: a ring's (NCCL),
   as the backend runs them (gloo emulates reduce-scatter with an all-reduce) and, on gloo,
   the bytes each rank wrote to its sockets; memory per rank measured before, at the peak of and
   after a step (the CUDA allocator, else live tensor storages: helpers.sharding.LiveBytes) for
   DDP, ZeRO-1 and FSDP by hand (and FSDP2), next to the ZeRO paper's formulas.

``--part attention`` or ``--part parallel`` runs one part only.

Version 6 (5: the bottleneck bucket was sqrt(G alpha / beta), all-reduce times from blocks of
5 calls x 5, no prediction wherever the line missed a size's spread, the best cap named without
a verdict against the runner-up; 4: the attention part timed forwards only, Triton's target 2x of SDPA's; ZeRO-1's bytes on the wire from the ring formula alone, whatever the backend;
an alpha-beta "prediction" printed even where the line missed the times, picked among the
swept caps; 3: "hidden %" instead of the saving against (b), no alpha-beta fit or bucket sweep;
2: the GPU target lines said meets/MISSES on a busy machine, a CPU's rate was in
TFLOP/s; 1: the attention part alone). When changing how this script measures, bump the version.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
from functools import partial
from typing import Any

import torch

# Without a GPU the Triton backward's check runs in Triton's interpreter, which must be chosen
# before anything imports triton (helpers.attention_triton's docstring).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from helpers.attention_tiles import saved_bytes_sweep
from helpers.attention_timing import (
    TIMING_COLUMNS,
    attention_timing_sweep,
    backward_check,
    check_methods,
    fastest_sdpa,
    fastest_sdpa_rows,
    sweep_machine,
    sweep_plan,
    training_plan,
    training_timing,
    training_verdicts,
    triton_verdicts,
    within,
)
from helpers.devices import cpu_name, describe_device, pick_device
from helpers.dp_by_hand import (
    WAY_NAMES,
    allreduce_fit,
    bucket_rows,
    ddp_bucket_line,
    fit_line,
    model_bucket,
    predicted_vs_best,
    timing_rows,
)
from helpers.flash_attention import flash_attention
from helpers.gpt import manual_attention
from helpers.launch import as_flags, launch, new_run_dir, one_launch_args, read_results
from helpers.machine_state import MachineWatch
from helpers.processes import cpu_cores, gpu_count
from helpers.tables import print_table
from helpers.verdicts import compare_rows

VERSION = 6
SAVED_LENGTHS = (1024, 2048, 4096)
TARGET_SAVED = 1 / 8  # tiles' saved bytes / written-out's at T = 4096, at most
TARGET_TRITON = 1.25  # Triton's forward time / SDPA's fastest kernel's at T >= 2048, at most
#: Triton's time / SDPA's fastest kernel's at T >= 2048, at most, per pass timed for training.
TARGET_TRAINING = {"forward": TARGET_TRITON, "forward+backward": 2.0}
#: The training table's columns, in order.
TRAINING_COLUMNS = ("row", "ms", "IQR ms", "TFLOP/s", "note")


def saved_bytes_part() -> list[str]:
    """Saved bytes table and the CPU target line; returns the lines of failures (none here)."""
    attentions = {
        "written out": manual_attention,
        "tiles": partial(flash_attention, causal=True, block_q=256, block_k=256),
    }
    rows = saved_bytes_sweep(attentions, SAVED_LENGTHS, head_dim=64)
    for row in rows:
        row["tiles / written out"] = row["tiles MiB"] / row["written out MiB"]
    print("\nsaved for backward by one causal forward, 1 head x 64, q, k, v excluded (CPU)\n")
    print_table(rows)
    last = rows[-1]
    ratio = last["tiles / written out"]
    verdict = "meets" if ratio <= TARGET_SAVED else "MISSES"
    print(f"CPU target: tiles at T = {last['T']} at most 1/8 of the written-out attention's bytes; {ratio:.2%} {verdict} it")  # fmt: skip
    return []


def timing_part(device: torch.device, lengths: list[int] | None, min_run_time: float) -> list[str]:
    """Correctness check and timing table on the device, the verdicts and the GPU target lines."""
    plan = sweep_plan(device, lengths)
    print(f"\ncausal attention forward on {plan}\n")
    checked = check_methods(plan)
    print("correctness first: each output's largest error against float64, over the factor allowed times that of the attention written out in the same dtype, at T = 200 (at most 1 passes)")  # fmt: skip
    print_table(checked)
    failed = [c["method"] for c in checked if not c["note"] and not c["worst / allowed"] <= 1]
    rows = attention_timing_sweep(plan, min_run_time=min_run_time)
    columns = [c for c in TIMING_COLUMNS if any(c in r for r in rows)]
    print(f"\n{min_run_time:g} s of timing per row (helpers.timing.benchmark, no grad)\n")
    print_table(rows, columns)
    print(sweep_machine(rows) or "machine: no row was timed")
    for verdict in triton_verdicts(rows):
        print(verdict)
    triton_targets(rows, plan.lengths)
    return [
        f"{name}'s error against float64 exceeds the allowed factor times the written-out attention's"
        for name in failed
    ]


def than_the_tiles(ratio: float) -> str:
    """Triton's time over the PyTorch tiles' as words: "0.000980x the time of the PyTorch tiles"."""
    if not math.isfinite(ratio):
        return "the PyTorch tiles were not timed"
    if ratio >= 1:
        return f"{ratio:.2f}x the time of the PyTorch tiles"
    # on an H100 about 0.001 (2026-11-27): three significant digits, as "1.50x" has
    return f"{ratio:#.3g}x the time of the PyTorch tiles"


def triton_targets(rows: list[dict], lengths: tuple[int, ...]) -> None:
    """The GPU target lines: Triton's forward within TARGET_TRITON (1.25x) of SDPA's fastest kernel's
    time, and faster than the tiles; inconclusive on a shared GPU or a loaded CPU, as the verdicts are."""
    timed = {r["row"] for r in rows if "ms" in r}
    long = [t for t in lengths if t >= 2048 and f"triton @ {t}" in timed]
    if not long:
        print(
            "GPU target: n/a here, no compiled Triton kernel was timed at T >= 2048 (needs a GPU)"
        )
        return
    state = sweep_machine(rows)
    # a target met or missed on a busy machine says nothing of the kernel: as the verdicts do
    busy = "" if state is None or state.quiet else f"; the machine was busy ({state.caveat()})"

    def said(ok: bool) -> str:
        return "inconclusive" if busy else ("meets" if ok else "MISSES")

    for t in long:
        best = fastest_sdpa(rows, t)
        ratio = within(rows, f"triton @ {t}", best) if best else math.inf
        tiles = f"pytorch tiles @ {t}"
        vs_tiles = within(rows, f"triton @ {t}", tiles) if tiles in timed else math.inf
        print(f"GPU target at T = {t}: triton {ratio:.2f}x the time of {best} ({said(ratio <= TARGET_TRITON)}: <= {TARGET_TRITON:g}x), {than_the_tiles(vs_tiles)} ({said(vs_tiles < 1)}: faster){busy}")  # fmt: skip


def busy_words(rows: list[dict]) -> str:
    """'' on a quiet machine, else '; the machine was busy (...)': a target line's caveat."""
    state = sweep_machine(rows)
    return "" if state is None or state.quiet else f"; the machine was busy ({state.caveat()})"


def training_targets(rows: list[dict]) -> None:
    """The training target lines: per pass with a target, Triton against SDPA's fastest kernel at T >= 2048."""
    busy = busy_words(rows)
    said = lambda ok: "inconclusive" if busy else ("meets" if ok else "MISSES")  # noqa: E731
    lines = 0
    for r in rows:
        target = TARGET_TRAINING.get(r["pass"])
        if r["method"] != "triton" or "ms" not in r or r["T"] < 2048 or target is None:
            continue
        same = (r["dtype"], r["head_dim"], r["T"], r["pass"])
        sdpa = [s for s in rows if s["method"].startswith("sdpa") and "ms" in s and (s["dtype"], s["head_dim"], s["T"], s["pass"]) == same]  # fmt: skip
        if sdpa:
            best = min(sdpa, key=lambda s: s["ms"])
            ratio = within(rows, r["row"], best["row"])
            print(f"GPU target at T = {r['T']}, {r['pass']} (head_dim {r['head_dim']}, {r['dtype']}): triton {ratio:.2f}x the time of {best['row']} ({said(ratio <= target)}: <= {target:g}x){busy}")  # fmt: skip
            lines += 1
    if not lines:
        print("GPU target, training: n/a here, Triton and SDPA were not both timed at T >= 2048 (needs a CUDA GPU)")  # fmt: skip


def training_part(device: torch.device, lengths: list[int] | None, min_run_time: float, full: bool) -> list[str]:  # fmt: skip
    """Section 2b: the Triton backward's check, then (CUDA) training timing against SDPA; the failures."""
    print("\ntraining: the chapter's Triton backward (helpers.attention_triton) against float64, then timed with its forward against SDPA's kernels\n")  # fmt: skip
    checked = backward_check(device)
    if checked:
        print("correctness first: the worst of dq, dk, dv against float64, in times the error of attention written out in the same dtype (at most 'allowed' passes)")  # fmt: skip
        print_table(checked)
    else:
        print("no backward check: Triton cannot run here")
    failed = [f"the Triton backward ({c['dtype']}, causal={c['causal']}) misses the float64 rule" for c in checked if not c["passes"]]  # fmt: skip
    plan = training_plan(device, lengths, full)
    print(plan)
    if not plan.shapes:
        print("training timing: n/a here; on a CUDA GPU this part times Triton's forward+backward against each SDPA kernel (--training-table: CS336's table)")  # fmt: skip
        training_targets([])
        return failed
    rows = training_timing(plan, min_run_time)
    print(f"\n{min_run_time:g} s of timing per row (helpers.timing.benchmark); TFLOP/s counts the backward as 2.5 forwards\n")  # fmt: skip
    print_table(fastest_sdpa_rows(rows), list(TRAINING_COLUMNS))
    print(sweep_machine(rows) or "machine: no row was timed")
    for verdict in training_verdicts(rows):
        print(verdict)
    training_targets(rows)
    return failed


def attention_part(args: argparse.Namespace) -> list[str]:
    """Sections 1-2 of chapter 8: saved bytes, then correctness and timing; the failures."""
    failures = saved_bytes_part()
    failures += timing_part(args.device, args.lengths, args.min_run_time)
    return failures + training_part(args.device, args.lengths, args.min_run_time, args.training_table)  # fmt: skip


#: The bucketed overlapped way's target: at most this many times DDP's step time (CPU, 2 ranks).
DDP_RATIO_TARGET = 1.1


def add_parallel_options(p: argparse.ArgumentParser) -> None:
    """The options of the data-parallel part; sizes default to the chapter's for the backend."""
    p.add_argument("--nproc", type=int, default=None, help="default: the GPUs with 2+ GPUs, else 2")
    p.add_argument("--width", type=int, default=None, help="default: 512 on gloo, 4096 on NCCL")
    p.add_argument("--depth", type=int, default=None, help="default: 6 on gloo, 8 on NCCL")
    p.add_argument("--per-rank-batch", type=int, default=None, help="default: 64, 256 on NCCL")
    p.add_argument("--bucket-mb", type=float, default=None, help="default: 1 on gloo, 25 on NCCL")
    p.add_argument("--blocks", type=int, default=7)
    p.add_argument("--steps", type=int, default=4)


#: The chapter's sizes (notebooks/08_build_it.ipynb, section 3) for each backend.
PARALLEL_SIZES = {
    "gloo": {"width": 512, "depth": 6, "per_rank_batch": 64, "bucket_mb": 1.0},
    "nccl": {"width": 4096, "depth": 8, "per_rank_batch": 256, "bucket_mb": 25.0},
}


def launch_parts(
    args: argparse.Namespace, backend: str, nproc: int
) -> tuple[dict, list[dict], dict]:
    """One launch of dp_by_hand, zero1_by_hand and fsdp_by_hand; rank 0's results (every rank's for ZeRO-1) (chapter 8)."""
    dp_dir, zero_dir, fsdp_dir = (
        new_run_dir("bench_dp"),
        new_run_dir("bench_zero1"),
        new_run_dir("bench_fsdp"),
    )
    size = {k: v if getattr(args, k) is None else getattr(args, k) for k, v in PARALLEL_SIZES[backend].items()}  # fmt: skip
    size |= {"blocks": args.blocks, "steps": args.steps}
    jobs = [
        ("dp_by_hand", ["--out", dp_dir, *as_flags(size)]),
        ("zero1_by_hand", ["--out", zero_dir]),
        ("fsdp_by_hand", ["--out", fsdp_dir]),
    ]
    try:
        launch("one_launch", nproc, one_launch_args(jobs), backend=backend, echo=False, timeout=900)
        return (
            read_results(dp_dir, nproc)[0],
            read_results(zero_dir, nproc),
            read_results(fsdp_dir, nproc)[0],
        )
    finally:  # results read: leave nothing in the temp folder
        for folder in (dp_dir, zero_dir, fsdp_dir):
            shutil.rmtree(folder, ignore_errors=True)


def target_lines(rows: list[dict], state: Any, nproc: int, backend: str) -> list[str]:
    """The targets, each a verdict on two named rows of the timing table."""
    bucketed, ddp, per_param = WAY_NAMES["bucketed"], WAY_NAMES["ddp"], WAY_NAMES["per_param"]
    by = {r["way"]: r for r in rows}
    ratio = by[bucketed]["step ms"] / by[ddp]["step ms"]
    where = f"{nproc} {backend} rank(s)"
    judged = "met" if ratio <= DDP_RATIO_TARGET else "not met"
    if not state.quiet:  # a busy machine's timings judge nothing
        judged = f"not judged, {state.caveat()}"
    lines = [
        f"bucketed overlapped / DDP step time: {ratio:.2f}x (target <= {DDP_RATIO_TARGET}x on "
        f"2 gloo ranks; {where}: {judged})",
        "  " + compare_rows(rows, "way", bucketed, ddp, "step ms", iqr="IQR ms", machine=state),
        "  "
        + compare_rows(rows, "way", bucketed, per_param, "step ms", iqr="IQR ms", machine=state),
    ]
    flat = WAY_NAMES["flat"]
    for way in ("overlap", "bucketed", "ddp"):
        r = by[WAY_NAMES[way]]
        saved = r["saving vs (b) ms"]
        gained = f"saved {saved:.2f} ms a step" if saved >= 0 else f"lost {-saved:.2f} ms a step"
        lines.append(
            f"{WAY_NAMES[way]}: {gained} against (b); its backward stretched {r['stretch ms']:.2f} ms"
        )
        verdict = compare_rows(rows, "way", WAY_NAMES[way], flat, "step ms", iqr="IQR ms", machine=state)  # fmt: skip
        lines.append("  " + verdict)
    return lines


def comm_model_part(dp: dict, state: Any = None) -> None:
    """The alpha-beta fit, the bucket-size sweep, the cap it predicts against the best, DDP's buckets."""
    rows, fit = allreduce_fit(dp)
    print(f"\nall-reduce time against size, {dp['world_size']} rank(s), slowest rank")
    print_table(rows)
    print(fit_line(fit, dp["world_size"]))
    sweep = bucket_rows(dp, fit)
    print("\nbucket-size sweep, (d) buckets, overlapped")
    print_table(sweep)
    print(predicted_vs_best(sweep, model_bucket(dp, fit), machine=state))
    print(ddp_bucket_line(dp))


def zero1_rows(ranks: list[dict]) -> list[dict]:
    """Per rank: Adam's moment bytes, full against ZeRO-1, and whether it is exactly 1/world."""
    rows = []
    for r, res in enumerate(ranks):
        full, mine = res["full Adam bytes"]["moments"], res["ZeRO-1 bytes"]["moments"]
        rows.append(
            {
                "rank": r,
                "parameters": res["parameters"],
                "full Adam moments B": full,
                "ZeRO-1 moments B": mine,
                "ratio": mine / full,
                "exactly 1/world": mine * res["world_size"] == full,
                "largest param diff": max(res["max param diff per step"]),
            }
        )
    return rows


def wire_rows(res: dict, fsdp: dict) -> list[dict]:
    """ZeRO-1, its naive first try, DDP and FSDP by hand: bytes handed, a ring's, as the backend runs them, written (chapter 8)."""
    as_run = res["wire bytes per step as the backend runs them"]
    return [
        {"way": way, "collectives": " + ".join(ops), "handed B": sum(ops.values()),
         "a ring (NCCL) B": round(sum(res["wire bytes per step"][way].values())),
         f"as {res['backend']} runs them B": round(sum(as_run[way].values())),
         "written B": res["bytes written per step"][way] or "not counted"}
        for way, ops in res["handed bytes per step"].items()
    ] + [
        {"way": way, "collectives": " + ".join(v["collectives"]), "handed B": sum(v["collectives"].values()),
         "a ring (NCCL) B": round(v["ring"]), f"as {res['backend']} runs them B": round(v["as run"]),
         "written B": v["written"] or "not counted"}
        for way, v in fsdp["wire per step"].items()
    ]  # fmt: skip


def memory_rows(zero: dict, fsdp: dict) -> list[dict]:
    """Rank 0's measured bytes of the last step of every run, next to its formula (chapter 8)."""
    rows = [{"run": f"{run} (Adam)", **{k: m[k] for k in ("before", "peak", "after", "formula")}} for run, m in zero["memory"].items()]  # fmt: skip
    for key, run in (
        ("ddp", "DDP (SGD)"),
        ("by hand", "FSDP by hand (SGD)"),
        ("fsdp2", "FSDP2 (SGD)"),
    ):
        if not fsdp[key].get("skipped"):
            last = fsdp[key]["steps"][-1]
            formula = fsdp["formulas"].get({"ddp": "DDP"}.get(key, key), "")
            rows.append(
                {
                    "run": run,
                    **{k: last[k] for k in ("before", "peak", "after")},
                    "formula": formula,
                }
            )
    return rows


def parallel_part(args: argparse.Namespace) -> None:
    """Run and print the data-parallel part of chapter 8's benchmark."""
    gpus = gpu_count()
    backend = "nccl" if gpus >= 2 else "gloo"  # NCCL needs a GPU per rank: 2 ranks, 2 GPUs
    nproc = args.nproc or (gpus if backend == "nccl" else 2)
    why = "" if backend == "nccl" else " (NCCL needs a GPU per rank: CPU processes instead)"
    print(f"{cpu_cores()} CPU core(s), {gpus} GPU(s): {nproc} rank(s) on {backend}{why}")
    with MachineWatch("cuda" if backend == "nccl" else "cpu") as watch:
        dp, zero, fsdp = launch_parts(args, backend, nproc)
    state = watch.state
    rows = timing_rows(dp)
    print(f"\n3. Averaging gradients five ways, {dp['parameters']:,} parameters")
    print_table(rows)
    print(f"{state} (over the launch); {dp['threads']} thread(s) per rank")
    comm_model_part(dp, state)
    print("\n4. Targets")
    print("\n".join(target_lines(rows, state, nproc, backend)))
    print("\n5. ZeRO-1: optimizer state per rank")
    zrows = zero1_rows(zero)
    print_table(zrows)
    exact = all(r["exactly 1/world"] for r in zrows)
    print(f"target: ZeRO-1 moments exactly 1/world of full Adam's on every rank: {exact}")
    print(
        "\n6. Bytes on the wire per step, and memory per rank measured before, at the peak of and after a step"
    )
    print_table(wire_rows(zero[0], fsdp))
    print_table(memory_rows(zero[0], fsdp))
    print(
        f"measured with {zero[0]['meter']}; formula: ZeRO paper's per-rank bytes, fp32 (ZeRO-1: Adam, K = 8; FSDP: SGD, K = 0)"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line; bad values exit with status 2 and a message."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: best)")
    parser.add_argument("--min-run-time", type=float, default=0.3, help="seconds of timing per row")  # fmt: skip
    parser.add_argument("--lengths", type=int, nargs="+", default=None, help="sequence lengths to time")  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="torch threads on the CPU")
    parser.add_argument("--part", choices=("all", "attention", "parallel"), default="all")
    parser.add_argument("--training-table", action="store_true", help="time CS336's table: forward, backward and both, head_dim 16-128, bf16 and fp32 (minutes on a GPU)")  # fmt: skip
    add_parallel_options(parser)
    args = parser.parse_args(argv)
    if not args.min_run_time > 0:
        parser.error("--min-run-time must be > 0 seconds")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.lengths is not None and min(args.lengths) < 1:
        parser.error("--lengths must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run every part; exit status 1 if a correctness check failed."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.device = pick_device(args.device)
    print(f"chapter 8 benchmark v{VERSION}: built by hand vs the library")
    print(f"torch {torch.__version__}; CPU {cpu_name()}; {torch.get_num_threads()} threads")
    print(describe_device(args.device))
    failures = attention_part(args) if args.part in ("all", "attention") else []
    if args.part in ("all", "parallel"):
        parallel_part(args)
    for failure in failures:
        print(f"CHECK FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
