"""GPU check: every notebook, the CUDA unit tests, the headline benchmarks and NCCL, one report.

    make gpu-check                                   # python3's environment (PYTHON=... another)
    python tools/gpu_check.py --plan                 # the schedule and its expected times; runs nothing
    python tools/gpu_check.py                        # the same, with the Python you run it with
    python tools/gpu_check.py --quick                # a taste in a few minutes, CPU included
    python tools/gpu_check.py --only tests,nccl      # parts: notebooks,tests,benchmarks,nccl
    python tools/gpu_check.py --deadline 540 --out gpu-check/a    # fit a 10-minute call
    python tools/gpu_check.py --deadline 540 --resume gpu-check/a --out gpu-check/b  # the rest

It uses the torch and the packages already installed in this Python: it creates no venv and
downloads nothing, so it runs on a cloud image with no network (any torch that
requirements.txt allows; see the README, "GPU check", for carrying the few wheels such an
image lacks). It runs in two phases:

1. the correctness phase, in parallel streams that share the GPU (3 on a GPU box with 12 or
   more cores, 1 on a CPU; --streams), each stream's torch, OpenMP and MKL given usable cores /
   streams threads: every notebooks/NN_*.ipynb, solutions/ and exercises/ notebook, each in a
   fresh kernel (tools/run_all.py); the unit tests that run a CUDA branch for real (marked
   `cuda` by tests/conftest.py; --all-tests runs every one); and, on a machine with GPUs, the
   chapter 4 DDP and FSDP scripts under torchrun with NCCL at world size 1 (and 2 with two
   GPUs), each alone and then in one launch with the hand-made all-reduce (one_launch.py).
   Its timings are shared-GPU timings, and the report says so;
2. the timing phase, alone on the machine: the headline benchmarks (HEADLINE_BENCHMARKS in
   tools/gpucheck/plan.py: the capstone's final configuration against its baseline, chapter
   6's MFU, chapter 8's attention, chapter 2's final loop, the matmul sweep's agreement);
   --full-benchmarks runs every benchmarks/*.py in full instead.

With `--deadline SECONDS` it starts nothing that cannot finish by then: each item's time is
estimated from EXPECTED_S (measured on the course's H100 runs), scaled by the pace of the
items run so far, and an item that does not fit is listed as not run, with why. `--resume
EARLIER_OUT` carries over what an earlier run finished (its progress.json) and runs only the
rest. `--plan` prints the schedule, call by call, with the expected time of every stream and
phase, without running anything (on a CPU too: it plans for one H100 and 16 cores unless
told --for-gpus/--for-cores).

It writes `gpu-check/summary.md` (the machine, its state before and after each phase, then
each part's results, and what was not run and why), `progress.json` and the raw logs beside
it, rewriting them after every item, so a run that is stopped still has its report. An error
that is not a test's or a cell's comes with its full traceback. The exit status is 0 if
everything ran and passed, 1 if anything failed or gpu_check itself was stopped, 3 if nothing
failed but the deadline stopped an item or left some not run.

The work is split by job in tools/gpucheck/: plan (what, how long, which stream, the
schedule), run (commands, items, the scheduler), report (the summary), machine (probe, state).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tools"):  # the course's helpers for the NCCL part; gpucheck
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from gpucheck import machine as machine_mod  # noqa: E402
from gpucheck import plan as plan_mod  # noqa: E402
from gpucheck.common import fenced, write_file  # noqa: E402
from gpucheck.plan import BUDGET_S, CALL_S, PARTS  # noqa: E402
from gpucheck.report import parts_of  # noqa: E402
from gpucheck.run import Check, Stopped  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--only", default=",".join(PARTS), help=f"comma-separated parts: {','.join(PARTS)}"
    )
    p.add_argument("--quick", action="store_true", help="chapter 1, a few tests, short benchmarks")
    p.add_argument(
        "--plan",
        action="store_true",
        help=f"print the schedule and expected times (does it fit {BUDGET_S:g} s in 2 calls?); run nothing",
    )
    p.add_argument("--for-gpus", type=int, default=plan_mod.PLAN_GPUS, help="--plan: GPUs")
    p.add_argument("--for-cores", type=int, default=plan_mod.PLAN_CORES, help="--plan: cores")
    p.add_argument(
        "--streams",
        type=int,
        default=0,
        help="correctness streams side by side (default: 3 on a GPU box with 12+ cores, 1 on a CPU)",
    )
    p.add_argument(
        "--all-tests", action="store_true", help="every unit test, not only the cuda ones"
    )
    p.add_argument(
        "--full-benchmarks",
        action="store_true",
        help="every benchmarks/*.py in full, not only the headline ones",
    )
    p.add_argument("--out", default=str(ROOT / "gpu-check"), help="report folder (git-ignored)")
    p.add_argument(
        "--deadline",
        type=float,
        default=0,
        help="seconds for the whole check: start nothing that cannot finish by then",
    )
    p.add_argument(
        "--resume",
        metavar="EARLIER_OUT",
        help="the --out folder of an earlier run: keep what it finished, run the rest",
    )
    p.add_argument("--notebooks", nargs="+", help="these notebooks instead of all of them")
    p.add_argument("--tests", nargs="+", help="these test paths instead of tests/")
    p.add_argument("--pytest-args", default="", help="more pytest options, one string")
    p.add_argument("--benchmarks", nargs="+", help="these benchmark scripts, in full, instead")
    p.add_argument("--html", action="store_true", help="also export each notebook to HTML")
    p.add_argument("--cell-timeout", type=int, default=1800, help="seconds per notebook cell")
    p.add_argument(
        "--notebooks-timeout", type=float, default=4 * 3600, help="seconds, all notebooks"
    )
    p.add_argument("--tests-timeout", type=float, default=2 * 3600, help="seconds for pytest")
    p.add_argument(
        "--benchmark-timeout",
        type=float,
        default=0,
        help="seconds per script (default 1200, 300 with --quick)",
    )
    p.add_argument("--nccl-timeout", type=float, default=300, help="seconds per torchrun launch")
    p.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--state", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(argv or [])
    args.parts = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown or not args.parts:
        p.error(f"--only takes a comma-separated list of {', '.join(PARTS)}; got {args.only!r}")
    if args.deadline < 0:
        p.error("--deadline takes a number of seconds > 0")
    if args.streams < 0 or args.for_gpus < 0 or args.for_cores < 1:
        p.error("--streams and --for-gpus take a number >= 0, --for-cores a number >= 1")
    return args


def print_plan(args: argparse.Namespace) -> int:
    """--plan: the schedule played through with the expected times; 0 if it fits the budget."""
    machine = {
        "gpu_count": args.for_gpus,
        "usable_cores": args.for_cores,
        "torch": "(not probed: --plan)",
    }
    items = plan_mod.plan(args, machine)
    streams = args.streams or plan_mod.default_streams(args.for_cores, args.for_gpus)
    threads = plan_mod.stream_threads(args.for_cores, streams)
    deadline = args.deadline or CALL_S
    sched = plan_mod.schedule(items, streams, threads, deadline)
    gpus = f"{args.for_gpus} GPU(s)" if args.for_gpus else "no GPU"
    print(plan_mod.schedule_text(sched, f"{gpus} and {args.for_cores} usable cores"), end="")
    skipped = [i for i in items if i.status == "skipped"]
    for item in skipped:
        print(f"skipped: {item.stage}: {item.detail}")
    extra = [a for a in args.argv if a not in ("--plan",)]
    extra = " ".join(plan_arg_free(extra))
    first = sched.call_ends[0] if sched.call_ends else 0
    second = f"{sched.deadlines[1]:g}" if len(sched.deadlines) > 1 else "(what is left)"
    print(
        f"To run it: call 1: python tools/gpu_check.py {extra + ' ' if extra else ''}--deadline "
        f"{deadline:g} --out gpu-check/a; call 2 (if call 1 says 'incomplete'): the same with "
        f"--deadline {second} --resume gpu-check/a --out gpu-check/b (the {BUDGET_S:g} s budget "
        f"less call 1's expected {first:.0f} s; give it {BUDGET_S:g} s less what call 1 really "
        "used: its summary says). On a box whose files do not persist, carry "
        "gpu-check/a/progress.json to the next call (README, 'GPU check')."
    )
    return 0 if sched.fits() else 1


def plan_arg_free(argv: list[str]) -> list[str]:
    """The command line without the options that only --plan reads (--for-gpus, --for-cores, --deadline)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--for-gpus", "--for-cores", "--deadline", "--out", "--resume"):
            skip = True
            continue
        if a.split("=", 1)[0] in ("--for-gpus", "--for-cores", "--deadline", "--out", "--resume"):
            continue
        out.append(a)
    return out


def on_stop_signal(signum: int, frame: object) -> None:
    """SIGTERM/SIGHUP: unwind to main (which stops what runs and writes the report), once."""
    for name in ("SIGTERM", "SIGHUP"):
        with contextlib.suppress(AttributeError, ValueError):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    raise Stopped(signum)


def main(argv: Sequence[str] | None = None) -> int:
    started_at = time.monotonic()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.probe:
        print(json.dumps(machine_mod.probe_machine()))
        return 0
    if args.state is not None:
        print(json.dumps(machine_mod.state_reading(args.state or ["cpu"])))
        return 0
    if args.plan:
        return print_plan(args)
    if (
        args.resume
        and not (Path(args.resume) / "progress.json").exists()
        and not (Path(args.resume).is_file())
    ):
        raise SystemExit(
            f"gpu_check: --resume {args.resume}: no progress.json there; give the --out folder "
            "of the earlier run, which holds its progress.json"
        )
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    previous = {}
    with contextlib.suppress(ValueError):  # not the main thread: leave the handlers alone
        for name in ("SIGTERM", "SIGHUP"):
            if hasattr(signal, name):
                previous[name] = signal.signal(getattr(signal, name), on_stop_signal)
    try:
        return check_machine(args, argv, out, started_at)
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


def check_machine(args: argparse.Namespace, argv: list[str], out: Path, started_at: float) -> int:
    """The check itself, once the command line is read: the exit status."""
    try:
        machine = machine_mod.machine_info()
    except Stopped as exc:  # stopped before anything ran: say so in a report all the same
        name = signal.Signals(exc.signum).name
        text = f"# GPU check: stopped\n\n**Result: stopped by {name} during the machine probe**; nothing ran.\n"
        path = write_file(out / "summary.md", text)
        print(f"\nstopped by {name} during the machine probe; report: {path}")
        return 1
    write_file(out / "machine.json", json.dumps(machine, indent=1) + "\n")
    check = Check(args, out, machine, argv)
    print(
        f"gpu-check: {machine_mod.gpu_summary(machine)}; torch {machine.get('torch', '?')}; "
        f"{check.streams} stream(s) x {check.threads} thread(s); report in {out}"
    )
    check.set_clock(started_at)
    check.items = plan_mod.plan(args, machine)
    if args.resume:
        gpus = machine_mod.gpu_summary(machine)
        check.notes.append(plan_mod.carry_over(check.items, Path(args.resume).resolve(), gpus))
    broke = ""
    try:
        check.run()
    except Exception:  # noqa: BLE001 - gpu_check itself broke: the report says where
        broke = traceback.format_exc()
        print(broke, file=sys.stderr, flush=True)
        check.notes += ["**gpu_check itself failed** (not a notebook, test or benchmark):", ""]
        check.notes += [fenced(broke.rstrip("\n"))]
    finally:
        path = check.save()
    bad = [p.name for p in parts_of(check) if p.status == "FAILED"] + (
        ["gpu_check"] if broke else []
    )
    unfinished = [i for i in check.items if i.status in ("not run", "STOPPED")]
    verdict = "FAILED: " + ", ".join(bad) if bad else "all passed"
    if not bad and unfinished:
        verdict = f"incomplete: {len(unfinished)} item(s) stopped or not run (see the summary)"
    print(f"\n{verdict}; report: {path}")
    if machine.get("gpus"):
        folder = f"reference/{machine_mod.slug(machine)}"
        print(
            f"to make it this GPU's reference (it replaces the older one): git rm -rq --ignore-unmatch "
            f"{folder} && mkdir -p {folder} && cp {path} {folder}/summary.md"
        )
    if bad or check.stopped or broke:
        return 1
    return 3 if unfinished else 0


if __name__ == "__main__":
    sys.exit(main())
