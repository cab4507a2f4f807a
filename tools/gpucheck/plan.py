"""What gpu_check runs, how long each item should take, on which stream, and the schedule (gpu_check).

Two phases. The **correctness phase** runs the notebooks, the unit tests that run CUDA
branches for real and the NCCL launches in parallel streams that share the GPU, the CPU's
cores split between them (each stream's torch, OpenMP and MKL get usable cores / streams
threads): what it times is shared-GPU, shared-CPU time, and the report says so. The **timing
phase** then runs the headline benchmarks one at a time, alone on the machine.

`schedule()` plays a plan through with the expected times under the same rules the runner
follows (an item starts only if it can finish before the deadline; a call that stops leaves
the rest to the next call, `--resume`): `--plan` prints it, and tests hold it to the budget.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

from gpucheck.common import ROOT, label

PARTS = ("notebooks", "tests", "benchmarks", "nccl")
#: The stages, in the order they are planned (most informative first), and each one's --only part.
STAGES = {
    "chapters": "notebooks",
    "tests": "tests",
    "solutions and exercises": "notebooks",
    "nccl": "nccl",
    "benchmarks": "benchmarks",
}
#: The phase of each stage: the benchmarks are timed alone, after everything else.
PHASES = ("correctness", "timing")
PHASE_OF = {stage: ("timing" if stage == "benchmarks" else "correctness") for stage in STAGES}
#: Modules each part needs in this Python (import names); torch and helpers for all.
NEEDS = {
    "notebooks": ("torch", "helpers", "nbformat", "nbclient", "ipykernel", "psutil"),
    "tests": ("torch", "helpers", "pytest", "nbformat", "nbclient"),
    "benchmarks": ("torch", "helpers"),
    "nccl": ("torch", "helpers", "psutil"),
}
#: --quick: chapter 1 only, the device and timing tests, short benchmark settings.
QUICK_NOTEBOOKS = ("notebooks/01_devices.ipynb",)
QUICK_TESTS = ("tests/test_devices.py", "tests/test_timing.py", "tests/test_machine_state.py")
QUICK_BENCHMARK_ARGS: dict[str, list[str]] = {
    "ch01_matmul": ["--rounds", "1"],
    "ch02_training_loop": ["--rounds", "1", "--min-run-time", "0.1"],
    "ch03_amp": ["--min-run-time", "0.1"],
    "ch04_scaling": ["--max-procs", "2", "--repeats", "1", "--steps", "5"],
    "ch05_memory": ["--min-run-time", "0.1"],
    "ch06_case_study": ["--samples", "2048", "--min-run-time", "0.2"],
    "ch06_mfu": ["--min-run-time", "0.1"],
    "ch07_capstone": ["--headline", "--rounds", "1", "--min-run-time", "0.1"],
    "ch08_build_it": ["--min-run-time", "0.1", "--lengths", "2048", "--part", "attention"],
}
#: The timing phase's headline benchmarks, in the order they run (the least measured first),
#: with the settings that time just the headline. `--full-benchmarks` runs every
#: benchmarks/*.py in full instead.
HEADLINE_BENCHMARKS: dict[str, list[str]] = {
    # the capstone's final configuration against its baseline (and FP8 where the GPU has it)
    "ch07_capstone": ["--headline", "--rounds", "3"],
    # chapter 6's MFU step (a 4 x 4096 MLP in bf16 on a GPU) against the bf16 peak
    "ch06_mfu": [],
    # the Triton forward against the fastest SDPA kernel
    "ch08_build_it": ["--part", "attention", "--lengths", "2048", "8192"],
    # chapter 2's final loop against the sources' loop
    "ch02_training_loop": ["--rounds", "3"],
    # the matmul sweep: the helper's timings against torch.utils.benchmark's and CUDA events'
    "ch01_matmul": ["--rounds", "2"],
}
#: The tests gpu_check runs by default: those that run a CUDA branch for real (the `cuda`
#: marker, tests/conftest.py). The rest are CPU tests that CI runs; --all-tests runs them too.
CUDA_MARKER = "cuda"
#: The chapter 4 scripts the NCCL part runs, with small settings; "one_launch" runs these jobs
#: in one launch, as the chapter does (its jobs' results go to a folder each).
NCCL_SCRIPTS: dict[str, list[str]] = {
    "ddp_train": ["--samples", "512", "--epochs", "1"],
    "fsdp_vs_ddp": ["--steps", "3"],
    "one_launch": [],
}
#: The jobs of the "one_launch" run, with their options.
ONE_LAUNCH_JOBS: dict[str, list[str]] = {
    "manual_allreduce": ["--per-rank-batch", "16"],
    "ddp_train": NCCL_SCRIPTS["ddp_train"],
    "fsdp_vs_ddp": NCCL_SCRIPTS["fsdp_vs_ddp"],
}

#: Seconds each item takes on one H100 or H200 with 16 cores, for --deadline and --plan.
#: Measured on the course's H200 run of 2026-11-28 (one NVIDIA H200, 16 Xeon cores, torch
#: 2.11.0+cu130, commit f63d8e0; reference/nvidia-h200): the chapters, solutions, exercises,
#: the cuda-marked unit tests and the NCCL launches in the correctness phase's three streams
#: (shared GPU, 5 threads each), the headline benchmarks one at a time, alone. The full
#: benchmarks (--full-benchmarks) come from the H100 run of 2026-11-26 (commit b3177ab) or are
#: marked "assumed": a conservative guess, corrected by the pace of what runs first.
EXPECTED_S: dict[str, float] = {
    "notebooks/01_devices.ipynb": 49,
    "notebooks/02_training_loop.ipynb": 87,
    "notebooks/03_mixed_precision.ipynb": 29,
    "notebooks/04_multi_gpu.ipynb": 83,
    "notebooks/05_memory.ipynb": 33,
    "notebooks/06_profiling.ipynb": 39,
    "notebooks/07_capstone.ipynb": 188,
    "notebooks/08_build_it.ipynb": 66,
    "solutions/01_devices_solutions.ipynb": 13,
    "solutions/02_training_loop_solutions.ipynb": 18,
    "solutions/03_mixed_precision_solutions.ipynb": 9,
    "solutions/04_multi_gpu_solutions.ipynb": 49,
    "solutions/05_memory_solutions.ipynb": 13,
    "solutions/06_profiling_solutions.ipynb": 14,
    "solutions/07_capstone_solutions.ipynb": 12,
    "solutions/08_build_it_solutions.ipynb": 61,
    "exercises/01_devices_exercises.ipynb": 7,
    "exercises/02_training_loop_exercises.ipynb": 15,
    "exercises/03_mixed_precision_exercises.ipynb": 10,
    "exercises/04_multi_gpu_exercises.ipynb": 5,
    "exercises/05_memory_exercises.ipynb": 6,
    "exercises/06_profiling_exercises.ipynb": 13,
    "exercises/07_capstone_exercises.ipynb": 11,
    "exercises/08_build_it_exercises.ipynb": 8,
    # the full benchmarks (--full-benchmarks), each alone (the H100 run of 2026-11-26)
    "benchmarks/ch01_matmul.py": 20,
    "benchmarks/ch02_training_loop.py": 36,
    "benchmarks/ch03_amp.py": 60,  # assumed
    "benchmarks/ch04_scaling.py": 120,  # assumed: launches gloo ranks, several repeats
    "benchmarks/ch05_memory.py": 60,  # assumed
    "benchmarks/ch06_case_study.py": 21,
    "benchmarks/ch06_mfu.py": 13,
    "benchmarks/ch07_capstone.py": 450,  # assumed: 115 s before its ablation, 6-9 min expected
    "benchmarks/ch08_build_it.py": 150,  # assumed: Triton compiles and timings to T = 8192, NCCL
    # the headline benchmarks (the timing phase's default), alone (the H200 run)
    # 57 s without FP8 (torchao was not installed there); an FP8 row adds a cold compile and
    # its rounds: assumed 40 s more
    "headline/ch07_capstone": 100,
    "headline/ch06_mfu": 13,
    "headline/ch08_build_it": 24,  # the attention part at T = 2048 and 8192
    "headline/ch02_training_loop": 50,  # 3 rounds
    "headline/ch01_matmul": 53,  # 2 rounds, with the burst-vs-sweep idle gaps
    # every unit test, -n 10 beside the notebook streams (the H100 run of 2026-11-26)
    "tests": 377,
    # the tests marked cuda (tests/cuda_tests.txt), one stream of 5 workers (the H200 run)
    "tests/cuda": 85,
    "nccl/ddp_train": 16,
    "nccl/fsdp_vs_ddp": 17,
    "nccl/one_launch": 13,
}
#: The estimate of an item EXPECTED_S does not list (a new notebook, a --quick benchmark).
DEFAULT_S = {
    "chapters": 60,
    "benchmarks": 60,
    "solutions": 20,
    "exercises": 10,
    "tests": 377,
    "nccl": 15,
}
QUICK_S = {"benchmarks": 20, "tests": 60}
#: The pace so far counts as if this many seconds had also run exactly as EXPECTED_S says,
#: so that one early item cannot swing the estimates of all the others.
PACE_PRIOR_S = 30.0
#: Seconds a stopped command gets to write its report and stop its kernel (run_all needs
#: up to INTERRUPT_GRACE_S + SHUTDOWN_WAIT_S + 3 s), before everything it started is killed.
STOP_GRACE_S = 15.0
#: Seconds kept at the end of a --deadline for the last summary.
FINISH_RESERVE_S = 3.0
#: Seconds a call spends outside every item: the machine's probe and a state reading before
#: and after each phase (a fresh Python that imports torch and, on a GPU, initialises CUDA).
CALL_OVERHEAD_S = 20.0
#: Seconds an item costs beyond its own expected time: starting its command (run_all's Python
#: and a kernel, pytest's collection), about 2.5 s for a notebook on a 2-core CPU.
ITEM_OVERHEAD_S = 3.0
#: The machine the H100 estimates are for, and what --plan assumes unless told otherwise.
PLAN_GPUS, PLAN_CORES = 1, 16
#: A check of the whole course on one rented GPU: at most this many seconds of wall time in
#: all, in calls of at most CALL_S seconds each (a 15-minute lease, 10-minute commands).
BUDGET_S, CALL_S = 780.0, 540.0


@dataclass
class Item:
    """One thing to run (a notebook, a benchmark, the tests, an NCCL launch) and its result."""

    stage: str
    name: str
    estimate: float
    status: str = "pending"  # ok, FAILED, STOPPED, not run, skipped
    seconds: float = 0.0
    detail: str = ""  # why it failed, was stopped or was not run
    traceback: str = ""  # an error that was not a test's or a cell's
    markdown: str = ""  # what the summary shows of it (a benchmark's tables, test counts)
    earlier: str = ""  # the folder of the earlier run it was carried over from (--resume)
    path: str = ""  # the notebook or script to run (the NCCL script name)
    args: list[str] = field(default_factory=list)  # a benchmark's options
    stream: int = 0  # its stream when streams run side by side (1, 2, ...), else 0
    threads: int = 0  # the threads its stream gave torch, OpenMP and MKL (0: not set)
    problems: list[str] = field(default_factory=list)

    @property
    def part(self) -> str:
        return STAGES[self.stage]

    @property
    def phase(self) -> str:
        return PHASE_OF[self.stage]

    @property
    def finished(self) -> bool:
        """It ran to its end (passed or failed), so a resumed run need not run it again."""
        return self.status in ("ok", "FAILED")

    def result(self) -> str:
        """The result column of the summary's tables."""
        if self.status == "ok":
            text = "ok"
        elif self.status == "pending":
            text = "not run"
        else:
            text = f"{self.status}: {self.detail}" if self.detail else self.status
        return text + (f" (earlier run, `{self.earlier}`)" if self.earlier else "")


# -- what to run ------------------------------------------------------------------------------


def default_streams(cores: int, gpus: int) -> int:
    """Correctness streams: 3 on a GPU box with 12+ cores, 2 with 6+, else 1 (a laptop, a CPU)."""
    if not gpus:
        return 1  # on a CPU the streams would only share its cores
    return 3 if cores >= 12 else (2 if cores >= 6 else 1)


def stream_threads(cores: int, streams: int) -> int:
    """Threads each stream's torch, OpenMP and MKL get: the usable cores split between streams."""
    return max(1, cores // max(1, streams))


def notebook_stage(path: Path) -> str:
    """'solutions and exercises' for a notebook in solutions/ or exercises/, else 'chapters'."""
    return (
        "solutions and exercises" if path.parent.name in ("solutions", "exercises") else "chapters"
    )


def notebook_paths(args: argparse.Namespace) -> list[Path]:
    """The notebooks to run: those given, else (--quick) chapter 1, else every one."""
    if args.notebooks:
        return [Path(p).resolve() for p in args.notebooks]
    if args.quick:
        return [ROOT / p for p in QUICK_NOTEBOOKS]
    found = sorted(ROOT.glob("notebooks/[0-9][0-9]_*.ipynb"))
    return found + sorted(ROOT.glob("solutions/*.ipynb")) + sorted(ROOT.glob("exercises/*.ipynb"))


def benchmark_runs(args: argparse.Namespace) -> list[tuple[Path, list[str], str]]:
    """(script, options, EXPECTED_S key) of each benchmark to run.

    Those given, else every script in full (--full-benchmarks), else the headline ones; --quick
    shortens each with QUICK_BENCHMARK_ARGS.
    """
    if args.benchmarks or args.full_benchmarks:
        scripts = [Path(p).resolve() for p in args.benchmarks or []]
        scripts = scripts or sorted((ROOT / "benchmarks").glob("*.py"))
        runs = [(s, [], f"benchmarks/{s.name}") for s in scripts]
    else:
        runs = [
            (ROOT / "benchmarks" / f"{stem}.py", list(options), f"headline/{stem}")
            for stem, options in HEADLINE_BENCHMARKS.items()
        ]
    if args.quick:
        runs = [(s, QUICK_BENCHMARK_ARGS.get(s.stem, o), k) for s, o, k in runs]
    return runs


def nccl_world_sizes(gpu_count: int) -> list[int]:
    """World size 1 on one GPU, and 2 as well with two or more: one rank per GPU."""
    return [n for n in (1, 2) if n <= gpu_count]


def tests_key(args: argparse.Namespace) -> str:
    """The EXPECTED_S key of the tests: every one (--all-tests) or those marked cuda."""
    return "tests" if args.all_tests else "tests/cuda"


def estimate(stage: str, key: str, args: argparse.Namespace) -> float:
    """Expected seconds for one item: EXPECTED_S, else the stage's default."""
    if args.quick and stage in QUICK_S:
        return QUICK_S[stage]
    if stage == "tests" and args.tests:
        return QUICK_S["tests"]
    if key in EXPECTED_S:
        return EXPECTED_S[key]
    kind = key.split("/")[0] if stage == "solutions and exercises" else stage
    return DEFAULT_S.get(kind, DEFAULT_S["chapters"])


def plan(args: argparse.Namespace, machine: dict) -> list[Item]:
    """Every item of the chosen parts, in the order they are planned (STAGES)."""
    items: list[Item] = []
    for stage, part in STAGES.items():
        if part not in args.parts:
            continue
        if part == "notebooks":
            for path in notebook_paths(args):
                if notebook_stage(path) == stage:
                    name = label(path)
                    items.append(Item(stage, name, estimate(stage, name, args), path=str(path)))
        elif stage == "benchmarks":
            for script, options, key in benchmark_runs(args):
                est = estimate(stage, key, args)
                items.append(Item(stage, label(script), est, path=str(script), args=options))
        elif stage == "tests":
            marker = [] if args.all_tests or args.tests or args.quick else ["-m", CUDA_MARKER]
            items.append(Item(stage, "tests", estimate(stage, tests_key(args), args), args=marker))
        elif stage == "nccl":
            items += nccl_items(args, machine)
    return items


def nccl_items(args: argparse.Namespace, machine: dict) -> list[Item]:
    """The NCCL launches, one per script and world size, or one 'skipped' item without a GPU."""
    count = int(machine.get("gpu_count") or 0)
    if not count:
        why = (
            f"no GPU: torch {machine.get('torch', '?')} sees none here "
            f"(torch.cuda.is_available() is False), and NCCL needs one GPU per rank"
        )
        return [Item("nccl", "nccl", 0.0, status="skipped", detail=why)]
    items = []
    for script in NCCL_SCRIPTS:
        for world in nccl_world_sizes(count):
            est = estimate("nccl", f"nccl/{script}", args) * (1 + 0.5 * (world - 1))
            items.append(Item("nccl", f"{script} x{world}", est, path=script))
    return items


def assign_streams(items: list[Item], streams: int, threads: int) -> None:
    """Spread the pending correctness items over the streams, longest first onto the least loaded.

    Each stream then runs its items in plan order. Streams are numbered 1, 2, ... when there
    are several, 0 when there is one; the timing phase's items get 0 (alone) and every thread.
    """
    load = [0.0] * max(1, streams)
    pending = [i for i in items if i.status == "pending"]
    for item in sorted((i for i in pending if i.phase == "correctness"), key=lambda i: -i.estimate):
        k = min(range(len(load)), key=lambda s: (load[s], s))
        item.stream, item.threads = (k + 1 if streams > 1 else 0), threads
        load[k] += item.estimate
    for item in pending:
        if item.phase == "timing":
            item.stream, item.threads = 0, 0


def carry_over(items: list[Item], earlier: Path, gpus: str = "") -> str:
    """Mark the items an earlier run finished (its progress.json) as done; a note for the summary.

    Only an item that ran with the same options on the same GPUs is carried over; one the
    earlier run's deadline stopped is run again with its estimate raised to the time it had
    already taken; one that could not run (modules missing) is tried again.
    """
    source = earlier / "progress.json" if earlier.is_dir() else earlier
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(
            f"gpu_check: --resume {earlier}: cannot read {source} ({type(exc).__name__}: {exc}); "
            "give the --out folder of the earlier run, which holds its progress.json"
        ) from None
    folder = label(source.parent) if source.parent.is_relative_to(ROOT) else str(source.parent)
    if gpus and data.get("gpus") and data["gpus"] != gpus:
        return (
            f"Not resumed from `{folder}`: it ran on {data['gpus']}, this is {gpus}; "
            "everything runs here."
        )
    earlier_items = {(d["stage"], d["name"]): d for d in data.get("items", [])}
    carried, other = 0, 0
    for item in items:
        old = earlier_items.get((item.stage, item.name))
        if not old:
            continue
        if old.get("args", []) != item.args:
            other += 1  # another selection of tests, other benchmark options: run it here
            continue
        if old["status"] == "STOPPED" and "deadline" in old.get("detail", ""):
            item.estimate = max(item.estimate, float(old.get("seconds") or 0.0))
            continue
        if old["status"] == "FAILED" and old.get("detail", "").startswith("not run:"):
            continue
        if old["status"] in ("ok", "FAILED"):
            for key in ("status", "seconds", "detail", "traceback", "markdown", "problems"):
                setattr(item, key, old.get(key, getattr(item, key)))
            for key in ("stream", "threads"):
                setattr(item, key, old.get(key, getattr(item, key)))
            item.earlier = old.get("earlier") or folder
            carried += 1
    used = data.get("used_s")
    return (
        f"Resumed from `{folder}` (started {data.get('started', '?')}, commit "
        f"{data.get('commit') or '?'}, {data.get('gpus', '?')}"
        + (f", {used:.0f} s used" if used else "")
        + f'): {carried} item(s) it finished are carried over, marked "earlier run"; the rest '
        "ran here"
        + (f" ({other} ran there with other options, so they ran again)" if other else "")
        + "."
    )


# -- the schedule, played through with the expected times -------------------------------------


@dataclass
class Slot:
    """One item in a played-through schedule: its call, stream and expected start and end."""

    item: Item
    call: int
    stream: int  # as Item.stream; -1 in the timing phase
    start: float
    end: float


@dataclass
class Schedule:
    """A plan played through with the expected times, call by call (see schedule())."""

    streams: int
    threads: int
    deadline: float | None
    budget: float = BUDGET_S  # seconds for all calls together (the next call gets what is left)
    slots: list[Slot] = field(default_factory=list)
    call_ends: list[float] = field(default_factory=list)
    deadlines: list[float | None] = field(default_factory=list)  # each call's --deadline
    never: list[Item] = field(default_factory=list)  # fit in no call (longer than a call)

    @property
    def total(self) -> float:
        """Seconds of wall time over all calls."""
        return sum(self.call_ends)

    def fits(self, budget: float = BUDGET_S, calls: int = 2) -> bool:
        """Everything ran, in at most `calls` calls and `budget` seconds in all."""
        return not self.never and len(self.call_ends) <= calls and self.total <= budget


def usable_s(deadline: float | None) -> float:
    """Seconds an item may use of a call before its deadline (what Check.left() starts from)."""
    if not deadline:
        return float("inf")
    return deadline - FINISH_RESERVE_S - STOP_GRACE_S


def call_deadline(sched: Schedule) -> float | None:
    """The next call's --deadline: a call's at most, and no more than the budget has left."""
    if not sched.deadline:
        return None
    return min(sched.deadline, sched.budget - sched.total) if sched.call_ends else sched.deadline


def play_call(todo: list[Item], call: int, sched: Schedule) -> list[Item]:
    """One call of schedule(): the items it runs go into sched.slots; those it does not, returned."""
    left = usable_s(call_deadline(sched))
    start = CALL_OVERHEAD_S
    clocks = dict.fromkeys(range(sched.streams + 1), start)
    assign_streams(todo, sched.streams, sched.threads)
    skipped = []
    for item in todo:  # plan order within each stream, as the stream's thread runs them
        if item.phase != "correctness":
            continue
        t, need = clocks[item.stream], item.estimate + ITEM_OVERHEAD_S
        if t + need <= left:
            sched.slots.append(Slot(item, call, item.stream, t, t + need))
            clocks[item.stream] = t + need
        else:
            skipped.append(item)
    t = max(clocks.values())
    for item in todo:
        if item.phase != "timing":
            continue
        need = item.estimate + ITEM_OVERHEAD_S
        if t + need <= left:
            sched.slots.append(Slot(item, call, -1, t, t + need))
            t += need
        else:
            skipped.append(item)
    sched.call_ends.append(t + FINISH_RESERVE_S)
    return skipped


def schedule(
    items: list[Item],
    streams: int,
    threads: int,
    deadline: float | None,
    max_calls: int = 8,
    budget: float = BUDGET_S,
) -> Schedule:
    """Play the plan through at the expected times: call after call (--resume) until all ran.

    The runner's rules: the correctness items spread over the streams (assign_streams), each
    stream running its items in plan order and starting one only if it can end before the
    deadline; then the timing phase, one item at a time. What a call leaves goes to the next.
    """
    sched = Schedule(streams, threads, deadline, budget)
    todo = [
        Item(i.stage, i.name, i.estimate, path=i.path, args=list(i.args))
        for i in items
        if i.status == "pending"
    ]
    for call in range(1, max_calls + 1):
        if not todo:
            break
        if sched.deadline and call_deadline(sched) <= CALL_OVERHEAD_S + FINISH_RESERVE_S:
            sched.never = todo  # the budget is spent
            break
        sched.deadlines.append(call_deadline(sched))
        left = play_call(todo, call, sched)
        if len(left) == len(todo):  # nothing fitted in a whole call: it never will
            sched.never = left
            sched.call_ends.pop()
            sched.deadlines.pop()
            break
        todo = left
    else:
        sched.never = todo
    return sched


def schedule_text(sched: Schedule, machine: str) -> str:
    """The schedule as text: each call's streams and timing phase, the totals and the verdict."""
    lines = [
        f"Plan for {machine}: correctness phase in {sched.streams} stream(s) of {sched.threads} "
        f"thread(s) each (usable cores / streams), then the timing phase alone; expected times "
        f"from EXPECTED_S (tools/gpucheck/plan.py: the H100 runs, 'assumed' where not measured); "
        + (
            f"calls of at most {sched.deadline:g} s (--deadline)."
            if sched.deadline
            else "one call."
        )
    ]
    for call, end in enumerate(sched.call_ends, 1):
        slots = [s for s in sched.slots if s.call == call]
        limit = sched.deadlines[call - 1]
        lines += [
            "",
            f"call {call}"
            + (f" (--deadline {limit:g})" if limit else "")
            + f": {end:.0f} s (start-up and state readings {CALL_OVERHEAD_S:g} s, "
            f"{ITEM_OVERHEAD_S:g} s to start each item)",
        ]
        for k in range(sched.streams + 1):
            mine = [s for s in slots if s.stream == k]
            if mine:
                busy = sum(s.end - s.start for s in mine)
                lines.append(f"  stream {k or 1}: {busy:.0f} s, ends at {mine[-1].end:.0f} s")
                lines += [f"    {s.start:4.0f}-{s.end:4.0f} s  {slot_name(s)}" for s in mine]
        timing = [s for s in slots if s.stream < 0]
        if timing:
            lines.append(f"  timing phase, alone: {sum(s.end - s.start for s in timing):.0f} s")
            lines += [f"    {s.start:4.0f}-{s.end:4.0f} s  {slot_name(s)}" for s in timing]
    lines.append("")
    for item in sched.never:
        lines.append(f"never fits a call: {item.name} ({item.estimate:.0f} s expected)")
    verdict = "fits" if sched.fits() else "does NOT fit"
    lines.append(
        f"{len(sched.call_ends)} call(s), {sched.total:.0f} s in all: {verdict} the budget of "
        f"{BUDGET_S:g} s in at most 2 calls of {CALL_S:g} s (one GPU rental of 15 minutes)."
    )
    return "\n".join(lines) + "\n"


def slot_name(slot: Slot) -> str:
    """An item as the plan shows it: its name, a benchmark's options, the tests' selection."""
    item = slot.item
    return " ".join([item.name, *item.args]) + ("  [NCCL]" if item.stage == "nccl" else "")
