"""Running gpu_check's items: commands with timeouts, each kind of item, and the scheduler (gpu_check).

The scheduler runs the correctness phase in parallel streams (one thread each, every item a
command of its own, with the stream's share of the CPU's threads), then the timing phase's
items one at a time, alone. SIGTERM, SIGHUP or Ctrl-C stops every command that runs, and what
was not started is listed as not run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from gpucheck import machine as machine_mod
from gpucheck import report
from gpucheck.common import ROOT, child_env, fenced, label, log_text, md_cell, tail, write_file
from gpucheck.plan import (
    CUDA_MARKER,
    FINISH_RESERVE_S,
    ITEM_OVERHEAD_S,
    NCCL_SCRIPTS,
    NEEDS,
    ONE_LAUNCH_JOBS,
    PACE_PRIOR_S,
    PHASES,
    QUICK_TESTS,
    STAGES,
    STOP_GRACE_S,
    Item,
    assign_streams,
)


class Stopped(KeyboardInterrupt):
    """gpu_check itself got SIGTERM or SIGHUP: stop what runs, report, exit."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@dataclass
class Step:
    """One command gpu_check ran: its log, exit code, time, and whether it timed out."""

    command: list[str]
    log: Path
    returncode: int | None = None
    seconds: float = 0.0
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    def verdict(self, timeout: float) -> str:
        """'ok', 'FAILED (exit code N)' or 'FAILED (timed out after N s)'."""
        if self.timed_out:
            return f"FAILED (timed out after {timeout:g} s)"
        return "ok" if self.ok else f"FAILED (exit code {self.returncode})"


@dataclass
class Limit:
    """How long one item may run, and what sets that limit."""

    seconds: float
    deadline: bool = False  # the --deadline, not the part's own timeout
    why: str = ""


# -- running commands -------------------------------------------------------------------------

#: The commands running now, in any stream: a stop signal stops them all.
LIVE: set[subprocess.Popen] = set()
LIVE_LOCK = threading.Lock()
#: Set when gpu_check itself is stopped: a command that ends then was stopped, not failed.
STOPPING = threading.Event()


def stop_tree(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """Stop a command and everything it started.

    SIGTERM goes to the command's process group first, and the command gets `grace` seconds
    to stop by itself: run_all then interrupts its cell, shuts its kernel down and writes its
    report. Whatever is left after that (a kernel in its own session, torchrun's workers,
    which leave the group) is terminated, then killed.
    """
    try:
        import psutil

        family = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - no psutil, or the command is gone already
        family = []
    with contextlib.suppress(OSError):
        if hasattr(os, "killpg"):
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)
    alive = []
    for child in family:
        with contextlib.suppress(Exception):
            if child.is_running() and child.status() != "zombie":
                child.terminate()
                alive.append(child)
    if alive:
        import psutil

        _, alive = psutil.wait_procs(alive, timeout=3)
    for child in alive:
        with contextlib.suppress(Exception):
            child.kill()
    with contextlib.suppress(OSError):
        proc.kill()
    proc.wait()


def stop_all_live() -> None:
    """Stop every command that runs now (a stop signal reached gpu_check), all at once."""
    with LIVE_LOCK:
        procs = list(LIVE)
    stoppers = [threading.Thread(target=stop_tree, args=(p,), daemon=True) for p in procs]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join(timeout=STOP_GRACE_S + 10)


def run_command(
    command: list[str],
    log: Path,
    timeout: float,
    echo: Callable[[str], None] | None = None,
    append: bool = False,
    threads: int | None = None,
    env: dict[str, str] | None = None,
) -> Step:
    """Run a command in the repository root, its output into `log` (and `echo`), with a timeout.

    `threads` sets its torch, OpenMP and MKL threads (a stream's share of the cores).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    step = Step(command, log)
    start = time.perf_counter()
    with log.open("a" if append else "w", encoding="utf-8") as out:
        out.write(f"$ {shlex.join(command)}\n\n")
        out.flush()
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**child_env(threads), **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=os.name != "nt",
        )
        with LIVE_LOCK:
            LIVE.add(proc)

        def pump() -> None:
            for line in proc.stdout:
                out.write(line)
                out.flush()
                if echo:
                    echo(line.rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            step.timed_out = True
            stop_tree(proc)
        except KeyboardInterrupt:
            stop_tree(proc)
            raise
        finally:
            with LIVE_LOCK:
                LIVE.discard(proc)
            reader.join(timeout=10)
            if step.timed_out:
                out.write(f"\n[gpu_check] stopped after the {timeout:.0f} s timeout\n")
            out.write("\n")
    step.returncode = proc.returncode
    step.seconds = time.perf_counter() - start
    return step


def missing_modules(part: str) -> list[str]:
    """The modules `part` needs that this Python cannot import."""
    return [m for m in NEEDS[part] if importlib.util.find_spec(m) is None]


def say(item: Item, text: str) -> None:
    """A line of progress, prefixed by the item's stream when streams run side by side."""
    prefix = f"[s{item.stream}] " if item.stream else ""
    print(prefix + text, flush=True)


# -- running one item -------------------------------------------------------------------------

RUN_ALL_STATUS = {"ok": "ok", "failed": "FAILED", "stopped": "STOPPED", "not run": "not run"}


def run_notebook(item: Item, out: Path, args: argparse.Namespace, limit: Limit) -> None:
    """One notebook through tools/run_all.py in a fresh kernel; its row of results."""
    folder = out / "notebooks"
    results = folder / f".results-{item.stream}.json"  # one per stream: streams run side by side
    command = [sys.executable, str(ROOT / "tools" / "run_all.py"), item.path]
    command += ["--out", str(folder), "--timeout", str(args.cell_timeout), "--no-describe"]
    command += ["--results", str(results)]
    if not args.html:
        command.append("--no-html")
    folder.mkdir(parents=True, exist_ok=True)
    results.unlink(missing_ok=True)  # never report an earlier run's row
    log = out / (f"notebooks-stream{item.stream}.log" if item.stream else "notebooks.log")
    step = Step(command, log)
    try:
        step = run_command(
            command,
            log,
            limit.seconds,
            echo=lambda s: say(item, s),
            append=True,
            threads=item.threads or None,
        )
    finally:  # stopped or not: run_all's own report says what happened in the notebook
        rows: list[dict] = []
        with contextlib.suppress(OSError, ValueError, KeyError):
            rows = json.loads(results.read_text())["notebooks"]
        results.unlink(missing_ok=True)
        if rows:
            row = rows[0]
            item.status = RUN_ALL_STATUS.get(
                row.get("status") or ("ok" if row["ok"] else "failed"), "FAILED"
            )
            item.detail, item.traceback = row["error"], row.get("traceback", "")
            item.seconds = row["seconds"]
        else:
            item.status, item.seconds = "FAILED", step.seconds
            item.detail = f"tools/run_all.py {step.verdict(limit.seconds)}, and wrote no result"
            item.traceback = f"{log.name} ends:\n{tail(log)}"
        if step.timed_out or item.status == "STOPPED":
            item.status = "STOPPED"
            item.detail = f"{item.detail or 'stopped'} ({limit.why})"


def run_benchmark(item: Item, out: Path, args: argparse.Namespace, limit: Limit) -> None:
    """One benchmark script with a timeout; its printed tables verbatim."""
    script = Path(item.path)
    say(item, f"  {' '.join([script.name, *item.args])} ...")
    step = run_command(
        [sys.executable, str(script), *item.args],
        out / "benchmarks" / f"{script.stem}.log",
        limit.seconds,
        threads=item.threads or None,
    )
    item.seconds = step.seconds
    verdict = step.verdict(limit.seconds)
    if step.timed_out and limit.deadline:
        item.status, item.detail = "STOPPED", f"stopped after {limit.seconds:.0f} s ({limit.why})"
        verdict = f"STOPPED ({item.detail})"
    elif STOPPING.is_set() and not step.ok:
        item.status, verdict = "STOPPED", "STOPPED (gpu_check was stopped)"
    elif step.ok:
        item.status = "ok"
    else:
        item.status, item.detail = "FAILED", verdict.removeprefix("FAILED ").strip("()")
        item.problems = [f"{script.name}: {verdict}"]
    say(item, f"  {script.name}: {verdict} in {step.seconds:.0f} s")
    shown = " ".join([label(script), *item.args])
    item.markdown = (
        f"### {script.name}: {verdict}, {step.seconds:.0f} s\n\n`python {shown}`\n\n"
        + fenced(log_text(step.log) or "(no output)")
    )


def xdist_workers(threads: int) -> int:
    """pytest-xdist workers for a stream of `threads` threads: one each (unit tests are small)."""
    return max(1, threads)


def cuda_test_files() -> list[str]:
    """The test files that hold a test tests/cuda_tests.txt lists (GPU check, chapters 1-8).

    Only these are collected for `-m cuda`: a module with no such test is not imported, so a
    package it alone needs (polib, for the translation tests) cannot fail the GPU's run.
    """
    listed = ROOT / "tests" / "cuda_tests.txt"
    if not listed.is_file():
        return []
    lines = listed.read_text(encoding="utf-8").splitlines()
    files = {line.split("::", 1)[0].strip() for line in lines if "::" in line}
    return sorted(f for f in files if not f.startswith("#") and (ROOT / f).is_file())


def pytest_command(args: argparse.Namespace, junit: Path, item: Item | None = None) -> list[str]:
    """pytest on the unit tests (never the browser tests), in parallel where xdist exists.

    Only the tests marked cuda unless --all-tests or --tests: the rest are CPU tests that CI
    runs. In a stream, xdist gets one worker per thread of the stream, each with one thread.
    """
    paths = list(args.tests) if args.tests else (list(QUICK_TESTS) if args.quick else ["tests"])
    if paths == ["tests"] and item is not None and CUDA_MARKER in item.args:
        paths = cuda_test_files() or paths
    paths = [p for p in paths if (ROOT / p).exists() or Path(p).is_absolute()]
    command = [sys.executable, "-m", "pytest", *paths, "--ignore=tests/browser"]
    command += ["-p", "no:cacheprovider", "-q", "-rfE", f"--junitxml={junit}"]
    if item is not None:
        command += item.args  # ["-m", "cuda"] by default
    if importlib.util.find_spec("xdist") is not None:
        threads = item.threads if item is not None else 0
        command += ["-n", str(xdist_workers(threads)) if threads else "auto"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        command += ["--timeout=900"]
    return command + shlex.split(args.pytest_args)


def test_counts(junit: Path) -> dict[str, int]:
    """passed / failed / errors / skipped from pytest's JUnit XML report."""
    import xml.etree.ElementTree as ET

    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    root = ET.parse(junit).getroot()
    for suite in root.iter("testsuite"):
        tests, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
        failed, errors = int(suite.get("failures", 0)), int(suite.get("errors", 0))
        counts["failed"] += failed
        counts["errors"] += errors
        counts["skipped"] += skipped
        counts["passed"] += tests - failed - errors - skipped
    return counts


def failure_messages(junit: Path) -> dict[str, str]:
    """Test name -> the first line of its failure or error message, from the JUnit report."""
    import xml.etree.ElementTree as ET

    found = {}
    with contextlib.suppress(OSError, ET.ParseError):
        for case in ET.parse(junit).getroot().iter("testcase"):
            for bad in (*case.findall("failure"), *case.findall("error")):
                text = (bad.get("message") or bad.text or "").strip()
                found[case.get("name", "")] = text.splitlines()[0] if text else ""
    return found


def failing_ids(log: Path, junit: Path) -> list[str]:
    """'tests/x.py::test_y: message' for each FAILED/ERROR line of pytest's short summary."""
    messages = failure_messages(junit)
    ids = []
    for line in log_text(log).splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            kind, _, rest = line.strip().partition(" ")
            test_id = rest.split(" - ", 1)[0]
            message = messages.get(test_id.rsplit("::", 1)[-1], "")
            ids.append(
                f"{test_id}"
                + (f" ({kind.lower()}): {message}" if message else f" ({kind.lower()})")
            )
    return ids


def failed_before_stop(failures: Path) -> list[str]:
    """The test ids tests/conftest.py logged as they failed, once each, in order."""
    if not failures.exists():
        return []
    return list(
        dict.fromkeys(line.strip() for line in log_text(failures).splitlines() if line.strip())
    )


def run_tests(item: Item, out: Path, args: argparse.Namespace, limit: Limit) -> None:
    """The unit tests; counts from the JUnit report, failing test ids from pytest's summary."""
    junit = out / "tests.xml"
    junit.unlink(missing_ok=True)
    command = pytest_command(args, junit, item)
    say(item, f"  {shlex.join(command[1:])}")
    failures = out / "failures.txt"  # written by tests/conftest.py as tests fail
    failures.unlink(missing_ok=True)
    xdist = importlib.util.find_spec("xdist") is not None
    per_process = (item.threads // xdist_workers(item.threads) if xdist else item.threads) or None
    step = run_command(
        command,
        out / "tests.log",
        limit.seconds,
        threads=per_process,  # one thread per worker; without xdist, one process gets them all
        env={"COURSE_FAILURES_LOG": str(failures)},
    )
    item.seconds = step.seconds
    try:
        counts = test_counts(junit)
    except Exception:  # noqa: BLE001 - no report: pytest crashed or timed out
        counts = None
    ids = failing_ids(step.log, junit)
    cmd = shlex.join(["python", *command[1:]]).replace(str(out) + os.sep, "")
    stopped = step.timed_out and limit.deadline
    verdict = (
        f"stopped after {limit.seconds:.0f} s ({limit.why})"
        if stopped
        else step.verdict(limit.seconds)
    )
    if counts is None:
        text = f"No test report: pytest {verdict}. `{step.log.name}` ends:\n\n" + fenced(
            tail(step.log)
        )
        early = failed_before_stop(failures)
        if early:
            text += "\nFailed before pytest stopped (`failures.txt`):\n\n"
            text += "\n".join(f"- {md_cell(i)}" for i in early) + "\n"
        item.status = "STOPPED" if stopped else "FAILED"
        item.detail, item.markdown, item.problems = (
            f"pytest {verdict}, no report" + (f", {len(early)} failed before" if early else ""),
            text,
            ["pytest: no report", *early],
        )
        return
    ran = sum(counts.values())
    line = ", ".join(f"{n} {k}" for k, n in counts.items())
    text = f"{line} in {step.seconds:.0f} s (`{cmd}`).\n"
    if not xdist:
        text += (
            "\npytest-xdist is not installed in this Python: the tests ran in one process, "
            "not one worker per thread, so they took longer than the plan expects "
            "(requirements.txt installs it).\n"
        )
    problems = list(ids)
    if step.timed_out:
        problems.append(f"pytest {verdict}")
    elif ran == 0:
        problems.append("pytest ran no test")
    elif (counts["failed"] or counts["errors"] or not step.ok) and not ids:
        problems.append(f"pytest {verdict}")
    if ids:
        text += "\nFailing:\n\n" + "\n".join(f"- {md_cell(i)}" for i in ids) + "\n"
    say(item, f"  tests: {line}")
    item.markdown, item.problems = text, problems
    item.status = "STOPPED" if stopped else ("FAILED" if problems else "ok")
    item.detail = (
        "; ".join(problems[-1:])
        if stopped
        else (f"{counts['failed']} failed, {counts['errors']} errors" if problems else "")
    )


def close(a: object, b: object, rtol: float = 1e-4, atol: float = 1e-5) -> bool:
    """Two tensors, or lists of them / of numbers, equal within a tolerance."""
    import torch

    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(close(x, y, rtol, atol) for x, y in zip(a, b))
    return torch.allclose(torch.as_tensor(a).float(), torch.as_tensor(b).float(), rtol, atol)


def nccl_flags(script: str, options: list[str], results: Path) -> list[str]:
    """The script's arguments: its options, the results folder, a process-group timeout."""
    if script != "one_launch":
        return [*options, "--out", str(results), "--pg-timeout", "120"]
    from helpers.launch import one_launch_args

    jobs = [(job, nccl_flags(job, opts, results / job)) for job, opts in ONE_LAUNCH_JOBS.items()]
    return one_launch_args(jobs)


def nccl_problems(script: str, results: Path, world: int) -> list[str]:
    """What is wrong in the results of one NCCL run (of every job, for one_launch)."""
    from helpers.launch import read_results

    if script != "one_launch":
        return check_results(script, read_results(results, world))
    wrong = []
    for job in ONE_LAUNCH_JOBS:
        wrong += [f"{job}: {w}" for w in check_results(job, read_results(results / job, world))]
    return wrong


def check_results(script: str, ranks: list[dict]) -> list[str]:
    """What is wrong in a chapter 4 script's per-rank results (an empty list if nothing)."""
    wrong = []
    if script == "manual_allreduce":
        for i, r in enumerate(ranks):
            if not close(r["averaged"], ranks[0]["averaged"]):
                wrong.append(f"rank {i}: averaged gradients differ from rank 0's")
            doubled = [len(ranks) * g for g in r["averaged"]]
            if not close(r["no_division"], doubled):
                wrong.append(f"rank {i}: the sum is not world size x the average")
    elif script == "ddp_train":
        if not all(r["identical"] for r in ranks):
            wrong.append("parameters differ between ranks after DDP training")
        for i, r in enumerate(ranks):
            acc = r["accumulation"]
            if not close(acc["no_sync"]["grads"], acc["every_step"]["grads"]):
                wrong.append(f"rank {i}: no_sync gradients differ from every-step gradients")
    elif script == "fsdp_vs_ddp":
        for i, r in enumerate(ranks):
            if not close(r["ddp"]["losses"], r["fsdp"]["losses"]):
                wrong.append(f"rank {i}: FSDP2 losses differ from DDP's")
    return wrong


def run_nccl(item: Item, out: Path, args: argparse.Namespace, limit: Limit) -> None:
    """One chapter 4 script under torchrun with NCCL, one rank per GPU; its results checked."""
    from helpers import launch as torchrun

    script, world = item.path, int(item.name.rsplit("x", 1)[1])
    name = f"{script}-nccl-x{world}"
    results = out / "nccl" / name
    results.mkdir(parents=True, exist_ok=True)
    log = out / "nccl" / f"{name}.log"
    say(item, f"  {script} on {world} GPU(s), NCCL ...")
    with log.open("w", encoding="utf-8") as f:

        def echo(line: str) -> None:
            f.write(line + "\n")
            f.flush()

        try:
            result = torchrun.launch(
                script,
                nproc=world,
                args=nccl_flags(script, NCCL_SCRIPTS[script], results),
                backend="nccl",
                timeout=max(1.0, limit.seconds),
                echo=echo,
                check=False,
                env={"PYTHONPATH": child_env()["PYTHONPATH"]},  # ranks import helpers
                threads=max(1, item.threads // world) if item.threads else None,  # the stream's
            )
            ok, took = result.ok, result.seconds
            why = result.message if not result.ok else ""
            stopped = result.timed_out and limit.deadline
        except Exception as exc:  # noqa: BLE001 - a launcher error is a failed run: say where
            ok, took, stopped = False, 0.0, False
            why = f"{type(exc).__name__} in the launcher: {exc}"
            item.traceback = traceback.format_exc()
            f.write(item.traceback)
        if ok:
            try:
                wrong = nccl_problems(script, results, world)
            except Exception as exc:  # noqa: BLE001 - unreadable results are wrong too
                wrong = [f"{type(exc).__name__}: {exc}"]
                item.traceback = traceback.format_exc()
            ok, why = not wrong, "; ".join(wrong)
        f.write(f"\n[gpu_check] {'ok' if ok else 'FAILED: ' + why}\n")
    item.seconds = took
    if stopped:
        item.status, item.detail = "STOPPED", f"stopped after {limit.seconds:.0f} s ({limit.why})"
    else:
        item.status, item.detail = ("ok", "") if ok else ("FAILED", why)
    if not ok:
        item.problems = [f"{script} x{world}: {why}"]
    say(item, f"  {script} x{world}: {item.result().splitlines()[0]}")


RUNNERS = {
    "chapters": run_notebook,
    "solutions and exercises": run_notebook,
    "benchmarks": run_benchmark,
    "tests": run_tests,
    "nccl": run_nccl,
}


# -- the schedule -----------------------------------------------------------------------------


def stop_descendants(grace: float = 3.0) -> None:
    """Terminate, then kill, whatever this process started that is still running (no orphans)."""
    try:
        import psutil

        family = psutil.Process().children(recursive=True)
    except Exception:  # noqa: BLE001 - no psutil: the LIVE commands were stopped already
        return
    for child in family:
        with contextlib.suppress(Exception):
            child.terminate()
    _, alive = psutil.wait_procs(family, timeout=grace)
    for child in alive:
        with contextlib.suppress(Exception):
            child.kill()


# -- the scheduler ----------------------------------------------------------------------------


class Check:
    """One gpu_check run: the items, the clock, the streams, the machine's states, the report."""

    def __init__(self, args: argparse.Namespace, out: Path, machine: dict, argv: list[str]) -> None:
        self.args, self.out, self.machine, self.argv = args, out, machine, argv
        self.started_at = time.monotonic()
        self.started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
        self.items: list[Item] = []
        self.states: list[machine_mod.StageState] = []
        self.notes: list[str] = []
        self.running: dict[str, str] = {}  # thread name -> "stage: item"
        self.stopped = ""
        self.stopping = STOPPING
        STOPPING.clear()
        self.lock = threading.RLock()
        self.phase_started: dict[str, float] = {}
        self.last_state: tuple[int, dict | None] = (-1, None)  # (items run, reading)
        cores = int(machine.get("usable_cores") or machine.get("cores") or os.cpu_count() or 1)
        gpus = int(machine.get("gpu_count") or 0)
        from gpucheck.plan import default_streams, stream_threads

        self.streams = max(1, args.streams or default_streams(cores, gpus))
        self.threads = stream_threads(cores, self.streams)

    def set_clock(self, started_at: float) -> None:
        """Count the deadline from this moment (main's start, before the machine probe)."""
        self.started_at = started_at

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def left(self) -> float | None:
        """Seconds an item may still use before the deadline (None without one)."""
        if not self.args.deadline:
            return None
        return self.args.deadline - self.elapsed() - FINISH_RESERVE_S - STOP_GRACE_S

    def pace(self) -> float:
        """Measured over expected seconds of the items that passed here, damped by a prior."""
        with self.lock:
            ran = [i for i in self.items if i.status == "ok" and not i.earlier and i.estimate]
        measured = sum(i.seconds for i in ran)
        return (measured + PACE_PRIOR_S) / (sum(i.estimate for i in ran) + PACE_PRIOR_S)

    def limit(self, item: Item) -> Limit:
        """The item's own timeout, or what the deadline leaves, whichever is shorter."""
        a = self.args
        if item.part == "notebooks":  # wall time since the phase began: streams run side by side
            used = self.elapsed() - self.phase_started.get(item.phase, self.elapsed())
            own = Limit(a.notebooks_timeout - used, why="--notebooks-timeout")
        elif item.part == "benchmarks":
            own = Limit(
                a.benchmark_timeout or (300 if a.quick else 1200), why="--benchmark-timeout"
            )
        elif item.part == "tests":
            own = Limit(a.tests_timeout, why="--tests-timeout")
        else:
            own = Limit(a.nccl_timeout, why="--nccl-timeout")
        left = self.left()
        if left is not None and left < own.seconds:
            return Limit(left, True, f"the --deadline of {a.deadline:g} s")
        return own

    def fits(self, item: Item) -> str:
        """'' if the item can finish before the deadline, else why it is not started."""
        own = self.limit(item)
        if not own.deadline and own.seconds < 1:
            return f"{own.why} is used up"
        left = self.left()
        if left is None:
            return ""
        pace = self.pace()
        need = item.estimate * pace + ITEM_OVERHEAD_S
        if need <= left:
            return ""
        return (
            f"needs about {need:.0f} s ({item.estimate:.0f} s expected x {pace:.2f}, the pace "
            f"so far, + {ITEM_OVERHEAD_S:g} s to start it), and {max(left, 0):.0f} s were left "
            f"for it before the {self.args.deadline:g} s deadline"
        )

    def save(self) -> Path:
        """Rewrite summary.md and progress.json (atomically)."""
        with self.lock:
            write_file(self.out / "progress.json", json.dumps(self.progress(), indent=1) + "\n")
            return write_file(self.out / "summary.md", report.summary(self))

    def progress(self) -> dict:
        """What --resume reads: every item and its result."""
        return {
            "started": self.started,
            "commit": report.git_commit(),
            "gpus": machine_mod.gpu_summary(self.machine),
            "deadline": self.args.deadline,
            "used_s": round(self.elapsed(), 1),
            "streams": self.streams,
            "threads": self.threads,
            "stopped": self.stopped,
            "items": [asdict(i) for i in self.items],
        }

    def read_state(self) -> dict:
        """The machine's state now, unless the deadline leaves no time for it.

        A phase's "after" is the next phase's "before" when nothing ran in between.
        """
        left = self.left()
        if left is not None and left < 5:  # a reading takes 1-3 s; never past the deadline
            return {"text": "not read (too little time left before the deadline)", "quiet": None}
        ran = sum(
            i.status not in ("pending", "not run", "skipped") and not i.earlier for i in self.items
        )
        if self.last_state[1] is not None and self.last_state[0] == ran:
            return self.last_state[1]
        timeout = (
            machine_mod.STATE_TIMEOUT_S if left is None else min(machine_mod.STATE_TIMEOUT_S, left)
        )
        self.last_state = (ran, machine_mod.read_state(self.machine, timeout))
        return self.last_state[1]

    def refuse_missing(self, items: list[Item]) -> list[Item]:
        """Fail the items whose part this Python cannot run (modules missing); the rest."""
        runnable = []
        for stage in dict.fromkeys(i.stage for i in items):
            missing = missing_modules(STAGES[stage])
            mine = [i for i in items if i.stage == stage]
            if not missing:
                runnable += mine
                continue
            why = (
                f"this Python ({sys.executable}) cannot import {', '.join(missing)}: install "
                f"them (on a box with no network, carry the wheels: README, 'GPU check')"
            )
            print(f"  {stage}: FAILED: {why}", flush=True)
            for item in mine:
                item.status, item.detail, item.problems = "FAILED", f"not run: {why}", [why]
        return [i for i in items if i in runnable]

    def run_phase(self, phase: str, items: list[Item]) -> None:
        """The phase's items: the correctness phase in streams side by side, the timing phase alone."""
        items = self.refuse_missing(items)
        if not items:
            return
        streams = sorted({i.stream for i in items})
        label = (
            f"{phase} phase, {self.streams} stream(s) x {self.threads} thread(s)"
            if phase == "correctness"
            else f"{phase} phase, alone"
        )
        print(f"\n== {label}", flush=True)
        state = machine_mod.StageState(label, self.read_state()).begin()
        self.states.append(state)
        self.phase_started[phase] = self.elapsed()
        # Each stream says when it is done with an Event: Thread.join() interrupted by a signal
        # can leave the thread marked as ended while it still runs (CPython before 3.13).
        done = {k: threading.Event() for k in streams}
        workers = [
            threading.Thread(
                target=self.run_stream,
                args=([i for i in items if i.stream == k], done[k]),
                name=f"{phase}-{k}",
                daemon=True,
            )
            for k in streams
        ]
        for w in workers:
            w.start()
        try:
            while not all(d.is_set() for d in done.values()):
                for d in done.values():
                    d.wait(timeout=0.2)
        except KeyboardInterrupt:
            self.stopping.set()
            stop_all_live()
            for d in done.values():
                d.wait(timeout=STOP_GRACE_S + 15)
            stop_descendants()
            raise
        state.end(self.read_state())

    def run_stream(self, items: list[Item], done: threading.Event) -> None:
        """One stream's items, in order, the summary rewritten after each; `done` set at the end."""
        try:
            self.run_items(items)
        finally:
            done.set()

    def run_items(self, items: list[Item]) -> None:
        """The items of one stream, one after the other, unless gpu_check is being stopped."""
        me = threading.current_thread().name
        for item in items:
            if self.stopping.is_set():
                return
            why_not = self.fits(item)
            if why_not:
                with self.lock:
                    item.status, item.detail = "not run", why_not
                say(item, f"  {item.name}: not run: {why_not}")
                self.save()
                continue
            with self.lock:
                self.running[me] = f"{item.stage}: {item.name}"
            self.save()
            self.run_item(item)
            with self.lock:
                self.running.pop(me, None)
            self.save()

    def run_item(self, item: Item) -> None:
        """One item, with its limit; an error of this tool becomes the item's, with a traceback."""
        limit = self.limit(item)
        start = time.perf_counter()
        try:
            RUNNERS[item.stage](item, self.out, self.args, limit)
        except Exception as exc:  # noqa: BLE001 - gpu_check broke on this item: say where
            item.status, item.seconds = "FAILED", time.perf_counter() - start
            item.detail = f"{type(exc).__name__} in gpu_check, not in the {item.part}: {exc}"
            item.traceback = traceback.format_exc()
            item.problems = [item.detail]
            say(item, f"  FAILED: {item.detail}\n{item.traceback}")
        if self.stopping.is_set() and item.status not in ("ok", "not run", "skipped"):
            item.seconds = item.seconds or time.perf_counter() - start
            where = item.detail if item.status == "STOPPED" and " in cell " in item.detail else ""
            item.status, item.detail, item.traceback, item.problems = "STOPPED", where, "", []

    def run(self) -> None:
        """The correctness phase, then the timing phase; on a stop, the rest is marked not run."""
        assign_streams(self.items, self.streams, self.threads)
        for item in (i for i in self.items if i.status == "skipped"):
            print(f"\n== {item.stage}\n  skipped: {item.detail}", flush=True)
        try:
            for phase in PHASES:
                todo = [i for i in self.items if i.phase == phase and i.status == "pending"]
                if todo:
                    self.run_phase(phase, todo)
        except KeyboardInterrupt as exc:
            name = signal.Signals(exc.signum).name if isinstance(exc, Stopped) else "SIGINT"
            why = {
                "SIGTERM": "an outer time limit?",
                "SIGINT": "Ctrl-C",
                "SIGHUP": "terminal closed",
            }
            self.stopped = f"gpu_check was stopped by {name} ({why.get(name, '')})"
            with self.lock:
                for item in self.items:
                    if item.status == "STOPPED" and not item.detail:
                        item.detail = self.stopped
                    elif item.status == "pending":
                        item.status, item.detail = "not run", self.stopped
        finally:
            self.running = {}
