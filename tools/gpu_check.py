"""GPU check: every notebook, the unit tests, the benchmarks and NCCL on this machine, one report.

    make gpu-check                                   # python3's environment (PYTHON=... another)
    python tools/gpu_check.py                        # the same, with the Python you run it with
    python tools/gpu_check.py --quick                # a taste in a few minutes, CPU included
    python tools/gpu_check.py --only tests,nccl      # parts: notebooks,tests,benchmarks,nccl
    python tools/gpu_check.py --deadline 540 --out gpu-check/a    # fit a 10-minute call
    python tools/gpu_check.py --deadline 540 --resume gpu-check/a --out gpu-check/b  # the rest

It uses the torch and the packages already installed in this Python: it creates no venv and
downloads nothing, so it runs on a cloud image with no network (any torch that
requirements.txt allows; see the README, "GPU check", for carrying the few wheels such an
image lacks). It runs one thing at a time, the most informative first:

1. chapters: every notebooks/NN_*.ipynb, each in a fresh kernel (tools/run_all.py);
2. benchmarks: every benchmarks/*.py, each with a timeout, its printed tables kept verbatim;
3. solutions and exercises: every solutions/ and exercises/ notebook;
4. tests: `pytest tests --ignore=tests/browser` (with `-n auto` where pytest-xdist is installed);
5. nccl: on a machine with GPUs, the chapter 4 DDP and FSDP scripts under torchrun with the
   NCCL backend at world size 1 (and 2 with two or more GPUs), each alone and then, as the
   chapter runs them, in one launch with the hand-made all-reduce (one_launch.py); skipped,
   with the reason, without.

`--only` picks parts (notebooks = chapters + solutions and exercises). With `--deadline
SECONDS` it starts nothing that cannot finish by then: each item's time is estimated from
EXPECTED_S (measured on the course's H100 run), scaled by the pace of the items run so far,
and an item that does not fit is listed as not run, with why. `--resume EARLIER_OUT` carries
over what an earlier run finished (its progress.json) and runs only the rest.

It writes `gpu-check/summary.md` (the machine, its state before and after each stage, then
each part's results, and what was not run and why), `progress.json` and the raw logs beside
it, rewriting them after every item, so a run that is stopped still has its report. An error
that is not a test's or a cell's comes with its full traceback. The exit status is 0 if
everything ran and passed, 1 if anything failed or gpu_check itself was stopped, 3 if nothing
failed but the deadline stopped an item or left some not run.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the course's helpers, from this checkout, for the NCCL part
    sys.path.insert(0, str(ROOT))

PARTS = ("notebooks", "tests", "benchmarks", "nccl")
#: The order things run in, most informative first, and the --only part each belongs to.
STAGES = {
    "chapters": "notebooks",
    "benchmarks": "benchmarks",
    "solutions and exercises": "notebooks",
    "tests": "tests",
    "nccl": "nccl",
}
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
    "ch07_capstone": ["--rounds", "1", "--min-run-time", "0.1"],
    "ch08_build_it": ["--min-run-time", "0.1", "--lengths", "2048"],
}
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

#: Seconds each item takes, for --deadline. Measured on the course's H100 run of 2026-11-26
#: (one H100 80GB HBM3, 16 cores, torch 2.11, commit b3177ab; shared/gpu-runs/h100-2026-11-26):
#: the chapters and solutions ran in three notebook streams at once beside the unit tests
#: (summary-chA/chB/sol.md; ch02 stopped at cell 133 of about 140, so its full run is a little
#: longer), the benchmarks one at a time (timeline.txt), NCCL alone (summary-nccl.md), the
#: tests with -n 10. The exercises were timed together only: 01-05 and part of 06 in the 57 s
#: their stream had, about 10 s each. Entries marked "assumed" were not run there: a
#: conservative guess, corrected by the pace of what runs first.
EXPECTED_S: dict[str, float] = {
    "notebooks/01_devices.ipynb": 34,
    "notebooks/02_training_loop.ipynb": 100,
    "notebooks/03_mixed_precision.ipynb": 29,
    "notebooks/04_multi_gpu.ipynb": 83,
    "notebooks/05_memory.ipynb": 38,
    "notebooks/06_profiling.ipynb": 43,
    "notebooks/07_capstone.ipynb": 420,  # assumed: 171 s before its ablation (issue 25), 5-8 min expected
    "notebooks/08_build_it.ipynb": 120,  # assumed: 63 s on a loaded 2-core CPU; GPU sweeps to T = 8192
    "solutions/01_devices_solutions.ipynb": 14,
    "solutions/02_training_loop_solutions.ipynb": 19,
    "solutions/03_mixed_precision_solutions.ipynb": 12,
    "solutions/04_multi_gpu_solutions.ipynb": 53,
    "solutions/05_memory_solutions.ipynb": 13,
    "solutions/06_profiling_solutions.ipynb": 12,
    "solutions/07_capstone_solutions.ipynb": 21,
    "solutions/08_build_it_solutions.ipynb": 40,  # assumed: 48 s on a loaded 2-core CPU
    "benchmarks/ch01_matmul.py": 20,
    "benchmarks/ch02_training_loop.py": 36,
    "benchmarks/ch03_amp.py": 60,  # assumed
    "benchmarks/ch04_scaling.py": 120,  # assumed: launches gloo ranks, several repeats
    "benchmarks/ch05_memory.py": 60,  # assumed
    "benchmarks/ch06_case_study.py": 21,
    "benchmarks/ch07_capstone.py": 450,  # assumed: 115 s before its ablation, 6-9 min expected
    "benchmarks/ch08_build_it.py": 150,  # assumed: Triton compiles and timings to T = 8192, NCCL
    "tests": 377,
    "nccl/ddp_train": 15,
    "nccl/fsdp_vs_ddp": 14,
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
#: Seconds a machine-state reading takes at most (a fresh Python that imports torch).
STATE_TIMEOUT_S = 60.0


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
    problems: list[str] = field(default_factory=list)

    @property
    def part(self) -> str:
        return STAGES[self.stage]

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


@dataclass
class Part:
    """One part's outcome: its Markdown section, and whether it passed, failed or was skipped."""

    name: str
    status: str  # "ok", "FAILED", "skipped", "not run" or "incomplete"
    markdown: str
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


# -- the machine ------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what platform reports."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """The cores this process may use (its affinity mask where the OS has one)."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def package_versions(names: Sequence[str]) -> dict[str, str]:
    """Installed versions of these distributions ('-' where absent)."""
    from importlib import metadata

    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "-"
    return out


def command_output(command: list[str]) -> str:
    """A short command's stdout, or '' if it is missing or fails."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def driver_version(hip: str | None) -> str:
    """The GPU driver's version: NVML (NVIDIA), else nvidia-smi, else rocm-smi; '' if none."""
    if not hip:
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                version = pynvml.nvmlSystemGetDriverVersion()
            finally:
                pynvml.nvmlShutdown()
            return version.decode() if isinstance(version, bytes) else str(version)
        except Exception:  # noqa: BLE001 - no NVML here: try the command-line tools
            pass
        smi = command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        if smi:
            return smi.splitlines()[0].strip()
    text = command_output(["rocm-smi", "--showdriverversion"])
    match = re.search(r"[Dd]river version:\s*(\S+)", text)
    return match.group(1) if match else ""


def probe_machine() -> dict:
    """What this machine is: CPU, memory, Python, torch and its GPUs (calls torch.cuda)."""
    import torch

    info: dict = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cores": os.cpu_count() or 1,
        "usable_cores": usable_cores(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "gpu_count": 0,
        "gpus": [],
        "driver": "",
        "cudnn": None,
        "nccl": None,
        "mps": bool(torch.backends.mps.is_available()),
    }
    with contextlib.suppress(ImportError):
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    if torch.cuda.is_available():
        info["gpu_count"] = torch.cuda.device_count()
        for i in range(info["gpu_count"]):
            props = torch.cuda.get_device_properties(i)
            info["gpus"].append(
                {
                    "name": props.name,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}",
                }
            )
        info["driver"] = driver_version(info["hip"])
        with contextlib.suppress(Exception):
            info["cudnn"] = torch.backends.cudnn.version()
        with contextlib.suppress(Exception):
            version = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else version
    info["packages"] = package_versions(
        ["numpy", "matplotlib", "ipywidgets", "nbclient", "pytest", "pytest-xdist", "nvidia-ml-py"]
    )
    return info


def machine_info(python: str = sys.executable) -> dict:
    """probe_machine() in a separate process, so that this one never holds a GPU context."""
    try:
        done = subprocess.run(
            [python, str(Path(__file__).resolve()), "--probe"],
            capture_output=True,
            text=True,
            timeout=300,
            env=child_env(),
        )
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        detail = locals().get("done")
        tail = (detail.stderr.strip().splitlines() or [""])[-1] if detail else ""
        return {"error": f"{type(exc).__name__}: {exc} {tail}".strip(), "gpu_count": 0, "gpus": []}


def gpu_summary(machine: dict) -> str:
    """'2 x NVIDIA H100 80GB HBM3 (79.2 GiB)', or 'no GPU'."""
    gpus = machine.get("gpus") or []
    if not gpus:
        return "no GPU" + (" (Apple MPS available)" if machine.get("mps") else "")
    names: dict[str, int] = {}
    for g in gpus:
        key = f"{g['name']} ({g['memory_gib']} GiB, compute capability {g['capability']})"
        names[key] = names.get(key, 0) + 1
    return ", ".join(f"{n} x {key}" for key, n in names.items())


def slug(machine: dict) -> str:
    """A folder name for reference/ from the first GPU's name: 'nvidia-h100-80gb-hbm3', or 'cpu'."""
    gpus = machine.get("gpus") or []
    name = gpus[0]["name"] if gpus else ("mps" if machine.get("mps") else "cpu")
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def machine_markdown(machine: dict) -> str:
    """The machine as a Markdown table."""
    if "error" in machine and "torch" not in machine:
        return f"Could not describe the machine: {machine['error']}\n"
    if machine.get("hip"):
        toolkit = f"ROCm (HIP {machine['hip']}), torch's build"
    elif machine.get("cuda"):
        toolkit = f"CUDA {machine['cuda']}, torch's build"
    else:
        toolkit = "none: a CPU-only build of torch" if not machine.get("mps") else "MPS (Apple)"
    libs = ", ".join(
        f"{k} {machine[k]}" for k in ("cudnn", "nccl") if machine.get(k) not in (None, "")
    )
    packages = ", ".join(f"{k} {v}" for k, v in (machine.get("packages") or {}).items())
    rows = [
        ("GPU(s)", gpu_summary(machine)),
        ("driver", machine.get("driver") or "-"),
        ("CUDA / ROCm", toolkit + (f" ({libs})" if libs else "")),
        (
            "CPU",
            f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores "
            f"({machine.get('usable_cores', '?')} usable)",
        ),
        ("memory", f"{machine.get('memory_gib', '?')} GiB"),
        ("OS", machine.get("platform", "?")),
        ("Python", machine.get("python", "?")),
        ("torch", machine.get("torch", "?")),
        ("packages", packages or "-"),
    ]
    lines = ["| | |", "|---|---|"] + [f"| {k} | {md_cell(v)} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def state_reading(devices: Sequence[str]) -> dict:
    """helpers.machine_state on each device, now: co-tenants, load against cores, threads."""
    from helpers.machine_state import machine_state

    states = [machine_state(d) for d in devices]
    return {
        "text": "; ".join(
            (f"{d}: " if len(devices) > 1 else "") + str(s) for d, s in zip(devices, states)
        ),
        "quiet": all(s.quiet for s in states),
        "caveat": "; ".join(c for s in states if (c := s.caveat())),
    }


def state_devices(machine: dict) -> list[str]:
    """The devices whose state is read: every CUDA GPU, else MPS, else the CPU."""
    count = int(machine.get("gpu_count") or 0)
    if count:
        return [f"cuda:{i}" for i in range(count)]
    return ["mps" if machine.get("mps") else "cpu"]


def read_state(machine: dict, timeout: float = STATE_TIMEOUT_S) -> dict:
    """state_reading() in a fresh process, so that this one never holds a GPU context.

    A context here would show as a co-tenant in every notebook's own readings.
    """
    command = [sys.executable, str(Path(__file__).resolve()), "--state"]
    command += state_devices(machine)
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=child_env()
        )
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return {"text": f"unknown ({type(exc).__name__}: {exc})", "quiet": None, "caveat": ""}


def _cpu_seconds() -> tuple[float, float]:
    """(CPU seconds the whole machine spent busy, seconds this process and its reaped
    descendants used): their difference over a window is what other processes used."""
    import psutil

    t = psutil.cpu_times()
    busy = sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
    own = psutil.Process().cpu_times()
    return busy, own.user + own.system + own.children_user + own.children_system


@dataclass
class StageState:
    """The machine before and after one stage, and the cores other processes kept busy."""

    stage: str
    before: dict
    after: dict | None = None
    others_cores: float | None = None
    seconds: float = 0.0
    _start: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def begin(self) -> StageState:
        with contextlib.suppress(ImportError):
            self._start = (time.perf_counter(), *_cpu_seconds())
        return self

    def end(self, after: dict) -> None:
        self.after = after
        with contextlib.suppress(ImportError):
            t0, busy0, own0 = self._start
            busy, own = _cpu_seconds()
            self.seconds = time.perf_counter() - t0
            if t0 and self.seconds > 1:
                self.others_cores = max(0.0, (busy - busy0) - (own - own0)) / self.seconds


def states_markdown(states: list[StageState], cores: int) -> str:
    """The machine's state table: one row per stage that ran."""
    if not states:
        return "No stage ran.\n"
    lines = [
        "| stage | before | after | other processes' CPU during it |",
        "|---|---|---|---|",
    ]
    for s in states:
        after = s.after["text"] if s.after else "-"
        cpu = "-"
        if s.others_cores is not None:
            cpu = f"{s.others_cores:.1f} of {cores} cores, over {s.seconds:.0f} s"
        lines.append(f"| {s.stage} | {md_cell(s.before['text'])} | {md_cell(after)} | {cpu} |")
    busy = [
        f"{s.stage} ({next(c for c in (s.before.get('caveat'), (s.after or {}).get('caveat')) if c)})"
        for s in states
        if s.before.get("caveat") or (s.after or {}).get("caveat")
    ]
    lines += [
        "",
        "Read with `helpers.machine_state` in a fresh process at each stage's ends (other "
        "compute processes on each GPU through NVML, the load average against the cores, "
        "torch's threads in a new process); the last column is the CPU time that processes "
        "other than this check used, per second of the stage. "
        + (
            "Timings of these stages ran on a busy machine: " + "; ".join(busy) + "."
            if busy
            else "No reading found another compute process on a GPU or a loaded CPU."
        ),
    ]
    return "\n".join(lines) + "\n"


# -- running commands -------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment for every command: this checkout's helpers first on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MPLBACKEND", "Agg")
    return env


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


def run_command(
    command: list[str],
    log: Path,
    timeout: float,
    echo: Callable[[str], None] | None = None,
    append: bool = False,
) -> Step:
    """Run a command in the repository root, its output into `log` (and `echo`), with a timeout."""
    log.parent.mkdir(parents=True, exist_ok=True)
    step = Step(command, log)
    start = time.perf_counter()
    with log.open("a" if append else "w", encoding="utf-8") as out:
        out.write(f"$ {shlex.join(command)}\n\n")
        out.flush()
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            encoding="utf-8",
            errors="replace",
            start_new_session=os.name != "nt",
        )

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


def md_cell(text: object) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def log_text(path: Path) -> str:
    """A log's text without the '$ command' header line."""
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    if text.startswith("$ "):
        text = text.split("\n", 2)[-1] if text.count("\n") >= 2 else ""
    return text.strip("\n")


def fenced(text: str) -> str:
    """Text as a Markdown code block that its own backticks cannot close."""
    fence = "````"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}\n"


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log."""
    return "\n".join(log_text(path).splitlines()[-lines:])


# -- what to run ------------------------------------------------------------------------------


def label(path: Path) -> str:
    """A path relative to the repository, or its name if it lies outside (as run_all says)."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.name


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


def benchmark_scripts(args: argparse.Namespace) -> list[Path]:
    """The benchmark scripts to run: those given, else every benchmarks/*.py."""
    if args.benchmarks:
        return [Path(p).resolve() for p in args.benchmarks]
    return sorted((ROOT / "benchmarks").glob("*.py"))


def nccl_world_sizes(gpu_count: int) -> list[int]:
    """World size 1 on one GPU, and 2 as well with two or more: one rank per GPU."""
    return [n for n in (1, 2) if n <= gpu_count]


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
    """Every item of the chosen parts, in the order they run (STAGES)."""
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
            for script in benchmark_scripts(args):
                name = label(script)
                items.append(
                    Item(
                        stage,
                        name,
                        estimate(stage, f"benchmarks/{script.name}", args),
                        path=str(script),
                    )
                )
        elif stage == "tests":
            items.append(Item(stage, "tests", estimate(stage, "tests", args)))
        elif stage == "nccl":
            count = int(machine.get("gpu_count") or 0)
            if not count:
                why = (
                    f"no GPU: torch {machine.get('torch', '?')} sees none here "
                    f"(torch.cuda.is_available() is False), and NCCL needs one GPU per rank"
                )
                items.append(Item(stage, "nccl", 0.0, status="skipped", detail=why))
            for script in NCCL_SCRIPTS if count else ():
                for world in nccl_world_sizes(count):
                    est = estimate(stage, f"nccl/{script}", args) * (1 + 0.5 * (world - 1))
                    items.append(Item(stage, f"{script} x{world}", est, path=script))
    return items


def carry_over(items: list[Item], earlier: Path) -> str:
    """Mark the items an earlier run finished (its progress.json) as done; a note for the summary."""
    source = earlier / "progress.json" if earlier.is_dir() else earlier
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(
            f"gpu_check: --resume {earlier}: cannot read {source} ({type(exc).__name__}: {exc}); "
            "give the --out folder of the earlier run, which holds its progress.json"
        ) from None
    done = {
        (d["stage"], d["name"]): d for d in data.get("items", []) if d["status"] in ("ok", "FAILED")
    }
    folder = label(source.parent) if source.parent.is_relative_to(ROOT) else str(source.parent)
    carried = 0
    for item in items:
        old = done.get((item.stage, item.name))
        if old:
            for key in ("status", "seconds", "detail", "traceback", "markdown", "problems"):
                setattr(item, key, old.get(key, getattr(item, key)))
            item.earlier = old.get("earlier") or folder
            carried += 1
    return (
        f"Resumed from `{folder}` (started {data.get('started', '?')}, commit "
        f"{data.get('commit') or '?'}, {data.get('gpus', '?')}): {carried} item(s) it finished "
        'are carried over, marked "earlier run"; the rest ran here.'
    )


# -- running one item -------------------------------------------------------------------------

RUN_ALL_STATUS = {"ok": "ok", "failed": "FAILED", "stopped": "STOPPED", "not run": "not run"}


def run_notebook(item: Item, out: Path, args: argparse.Namespace, limit: Limit) -> None:
    """One notebook through tools/run_all.py in a fresh kernel; its row of results.json."""
    folder = out / "notebooks"
    command = [sys.executable, str(ROOT / "tools" / "run_all.py"), item.path]
    command += ["--out", str(folder), "--timeout", str(args.cell_timeout), "--no-describe"]
    if not args.html:
        command.append("--no-html")
    results = folder / "results.json"
    results.unlink(missing_ok=True)  # never report an earlier run's row
    log = out / "notebooks.log"
    step = Step(command, log)
    try:
        step = run_command(
            command, log, limit.seconds, echo=lambda s: print(s, flush=True), append=True
        )
    finally:  # stopped or not: run_all's own report says what happened in the notebook
        rows: list[dict] = []
        with contextlib.suppress(OSError, ValueError, KeyError):
            rows = json.loads(results.read_text())["notebooks"]
        for name in ("results.json", "summary.md", "index.html"):  # this summary is the report
            (folder / name).unlink(missing_ok=True)
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
    extra = QUICK_BENCHMARK_ARGS.get(script.stem, []) if args.quick else []
    print(f"  {script.name} ...", end=" ", flush=True)
    step = run_command(
        [sys.executable, str(script), *extra],
        out / "benchmarks" / f"{script.stem}.log",
        limit.seconds,
    )
    item.seconds = step.seconds
    verdict = step.verdict(limit.seconds)
    if step.timed_out and limit.deadline:
        item.status, item.detail = "STOPPED", f"stopped after {limit.seconds:.0f} s ({limit.why})"
        verdict = f"STOPPED ({item.detail})"
    elif step.ok:
        item.status = "ok"
    else:
        item.status, item.detail = "FAILED", verdict.removeprefix("FAILED ").strip("()")
        item.problems = [f"{script.name}: {verdict}"]
    print(f"{verdict} in {step.seconds:.0f} s", flush=True)
    shown = " ".join([script.name, *extra])
    item.markdown = (
        f"### {script.name}: {verdict}, {step.seconds:.0f} s\n\n`python {shown}`\n\n"
        + fenced(log_text(step.log) or "(no output)")
    )


def pytest_command(args: argparse.Namespace, junit: Path) -> list[str]:
    """pytest on the unit tests (never the browser tests), in parallel where xdist exists."""
    paths = list(args.tests) if args.tests else (list(QUICK_TESTS) if args.quick else ["tests"])
    paths = [p for p in paths if (ROOT / p).exists() or Path(p).is_absolute()]
    command = [sys.executable, "-m", "pytest", *paths, "--ignore=tests/browser"]
    command += ["-p", "no:cacheprovider", "-q", "-rfE", f"--junitxml={junit}"]
    if importlib.util.find_spec("xdist") is not None:
        command += ["-n", "auto"]
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
    command = pytest_command(args, junit)
    print(f"  {shlex.join(command[1:])}", flush=True)
    failures = out / "failures.txt"  # written by tests/conftest.py as tests fail
    failures.unlink(missing_ok=True)
    os.environ["COURSE_FAILURES_LOG"] = str(failures)
    try:
        step = run_command(command, out / "tests.log", limit.seconds)
    finally:
        os.environ.pop("COURSE_FAILURES_LOG", None)
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
    problems = list(ids)
    if step.timed_out:
        problems.append(f"pytest {verdict}")
    elif ran == 0:
        problems.append("pytest ran no test")
    elif (counts["failed"] or counts["errors"] or not step.ok) and not ids:
        problems.append(f"pytest {verdict}")
    if ids:
        text += "\nFailing:\n\n" + "\n".join(f"- {md_cell(i)}" for i in ids) + "\n"
    print(f"  {line}", flush=True)
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
    print(f"  {script} on {world} GPU(s), NCCL ...", end=" ", flush=True)
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
    print(item.result().splitlines()[0], flush=True)


RUNNERS = {
    "chapters": run_notebook,
    "solutions and exercises": run_notebook,
    "benchmarks": run_benchmark,
    "tests": run_tests,
    "nccl": run_nccl,
}


# -- the schedule -----------------------------------------------------------------------------


@dataclass
class Limit:
    """How long one item may run, and what sets that limit."""

    seconds: float
    deadline: bool = False  # the --deadline, not the part's own timeout
    why: str = ""


class Check:
    """One gpu_check run: the items, the clock, the machine's states, the report."""

    def __init__(self, args: argparse.Namespace, out: Path, machine: dict, argv: list[str]) -> None:
        self.args, self.out, self.machine, self.argv = args, out, machine, argv
        self.started_at = time.monotonic()
        self.started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
        self.items: list[Item] = []
        self.states: list[StageState] = []
        self.notes: list[str] = []
        self.running = ""
        self.stopped = ""
        self.notebook_seconds = 0.0
        self.last_state: tuple[int, dict | None] = (-1, None)  # (items run, reading)

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
        ran = [i for i in self.items if i.status == "ok" and not i.earlier and i.estimate]
        measured = sum(i.seconds for i in ran)
        return (measured + PACE_PRIOR_S) / (sum(i.estimate for i in ran) + PACE_PRIOR_S)

    def limit(self, item: Item) -> Limit:
        """The item's own timeout, or what the deadline leaves, whichever is shorter."""
        a = self.args
        if item.part == "notebooks":
            own = Limit(a.notebooks_timeout - self.notebook_seconds, why="--notebooks-timeout")
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
        need = item.estimate * pace
        if need <= left:
            return ""
        return (
            f"needs about {need:.0f} s ({item.estimate:.0f} s expected x {pace:.2f}, the pace "
            f"so far), and {max(left, 0):.0f} s were left for it before the {self.args.deadline:g} s "
            "deadline"
        )

    def save(self) -> Path:
        """Rewrite summary.md and progress.json (atomically)."""
        write_file(self.out / "progress.json", json.dumps(self.progress(), indent=1) + "\n")
        return write_file(self.out / "summary.md", summary(self))

    def progress(self) -> dict:
        """What --resume reads: every item and its result."""
        return {
            "started": self.started,
            "commit": git_commit(),
            "gpus": gpu_summary(self.machine),
            "deadline": self.args.deadline,
            "stopped": self.stopped,
            "items": [asdict(i) for i in self.items],
        }

    def read_state(self) -> dict:
        """The machine's state now, unless the deadline leaves no time for it.

        A stage's "after" is the next stage's "before" when nothing ran in between.
        """
        left = self.left()
        if left is not None and left < 5:  # a reading takes 1-3 s; never past the deadline
            return {"text": "not read (too little time left before the deadline)", "quiet": None}
        ran = sum(
            i.status not in ("pending", "not run", "skipped") and not i.earlier for i in self.items
        )
        if self.last_state[1] is not None and self.last_state[0] == ran:
            return self.last_state[1]
        timeout = STATE_TIMEOUT_S if left is None else min(STATE_TIMEOUT_S, left)
        self.last_state = (ran, read_state(self.machine, timeout))
        return self.last_state[1]

    def run_stage(self, stage: str, items: list[Item]) -> None:
        """The stage's items, one at a time, the summary rewritten after each."""
        missing = missing_modules(STAGES[stage])
        if missing:
            why = (
                f"this Python ({sys.executable}) cannot import {', '.join(missing)}: install "
                f"them (on a box with no network, carry the wheels: README, 'GPU check')"
            )
            print(f"  FAILED: {why}", flush=True)
            for item in items:
                item.status, item.detail, item.problems = "FAILED", f"not run: {why}", [why]
            return
        state: StageState | None = None
        for item in items:
            why_not = self.fits(item)
            if why_not:
                item.status, item.detail = "not run", why_not
                print(f"  {item.name}: not run: {why_not}", flush=True)
                self.save()
                continue
            if state is None:
                state = StageState(stage, self.read_state()).begin()
                self.states.append(state)
            self.running = f"{stage}: {item.name}"
            self.save()
            self.run_item(item)
            self.running = ""
            self.save()
        if state is not None:
            state.end(self.read_state())

    def run_item(self, item: Item) -> None:
        """One item, with its limit; an error of this tool becomes the item's, with a traceback."""
        limit = self.limit(item)
        start = time.perf_counter()
        try:
            RUNNERS[item.stage](item, self.out, self.args, limit)
        except KeyboardInterrupt:
            item.seconds = item.seconds or time.perf_counter() - start
            if item.status in ("pending", "ok"):
                item.status = "STOPPED"
            raise
        except Exception as exc:  # noqa: BLE001 - gpu_check broke on this item: say where
            item.status, item.seconds = "FAILED", time.perf_counter() - start
            item.detail = f"{type(exc).__name__} in gpu_check, not in the {item.part}: {exc}"
            item.traceback = traceback.format_exc()
            item.problems = [item.detail]
            print(f"  FAILED: {item.detail}\n{item.traceback}", flush=True)
        finally:
            if item.part == "notebooks":
                self.notebook_seconds += item.seconds

    def run(self) -> None:
        """Every stage in order; on a stop, the rest is marked not run."""
        try:
            for stage in STAGES:
                todo = [i for i in self.items if i.stage == stage and i.status == "pending"]
                if todo:
                    print(f"\n== {stage}", flush=True)
                    self.run_stage(stage, todo)
                for item in (i for i in self.items if i.stage == stage and i.status == "skipped"):
                    print(f"\n== {stage}\n  skipped: {item.detail}", flush=True)
        except KeyboardInterrupt as exc:
            name = signal.Signals(exc.signum).name if isinstance(exc, Stopped) else "SIGINT"
            why = {
                "SIGTERM": "an outer time limit?",
                "SIGINT": "Ctrl-C",
                "SIGHUP": "terminal closed",
            }
            self.stopped = f"gpu_check was stopped by {name} ({why.get(name, '')})"
            for item in self.items:
                if item.status == "STOPPED" and not item.detail:
                    item.detail = self.stopped
                elif item.status == "pending":
                    item.status, item.detail = "not run", self.stopped
        finally:
            self.running = ""


# -- the report -------------------------------------------------------------------------------


def git_commit() -> str:
    """'abc1234 (tree def5678)', with '+ local changes' when the tree is dirty ('' without git).

    The tree's hash depends only on the files: a copy of the checkout committed elsewhere (as
    the device tool's copy on a lent GPU machine) has another commit but the same tree, and
    `git rev-parse COMMIT^{tree}` here finds which commit that was.
    """
    sha = command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    if not sha:
        return ""
    tree = command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD^{tree}"])
    dirty = command_output(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]
    )
    return sha + (f" (tree {tree})" if tree else "") + (" + local changes" if dirty else "")


def part_status(items: list[Item]) -> str:
    """ok, FAILED, skipped, not run or incomplete, from the part's items."""
    if any(i.status == "FAILED" for i in items):
        return "FAILED"
    if all(i.status == "skipped" for i in items):
        return "skipped"
    if all(i.status in ("not run", "pending") for i in items):
        return "not run"
    if any(i.status in ("not run", "pending", "STOPPED") for i in items):
        return "incomplete"  # stopped by a deadline or a signal: neither passed nor failed
    return "ok"


def tracebacks(items: list[Item]) -> str:
    """The tracebacks of errors that were not a test's or a cell's, one block each."""
    blocks = [
        f"Traceback of {i.name} (not a cell's or a test's error):\n\n"
        + fenced(i.traceback.rstrip("\n"))
        for i in items
        if i.traceback
    ]
    return "\n" + "\n".join(blocks) if blocks else ""


def notebooks_markdown(items: list[Item], out: Path) -> str:
    lines = ["| notebook | result | seconds |", "|---|---|---:|"]
    lines += [f"| {i.name} | {md_cell(i.result())} | {i.seconds:.1f} |" for i in items]
    ran = [i for i in items if i.status not in ("not run", "pending")]
    failed = sum(i.status in ("FAILED", "STOPPED") for i in ran)
    lines += [
        "",
        f"{len(ran)} notebooks, {failed} failed, {sum(i.seconds for i in ran):.0f} s in all "
        f"(each through `tools/run_all.py NOTEBOOK --no-describe`, one at a time; executed copies "
        f"and kernel logs in `notebooks/`)."
        + (f" {len(items) - len(ran)} not run." if len(ran) < len(items) else ""),
    ]
    return "\n".join(lines) + "\n" + tracebacks(items)


def benchmarks_markdown(items: list[Item]) -> str:
    ran = [i.markdown for i in items if i.markdown]
    rest = [f"- {i.name}: {i.result()}" for i in items if not i.markdown]
    text = "\n".join(ran) or "No benchmark ran.\n"
    return text + ("\n" + "\n".join(rest) + "\n" if rest else "") + tracebacks(items)


def tests_markdown(items: list[Item]) -> str:
    (item,) = items
    return (item.markdown or f"Not run: {item.detail}.\n") + tracebacks(items)


def nccl_markdown(items: list[Item]) -> str:
    if len(items) == 1 and items[0].status == "skipped":
        return f"Skipped: {items[0].detail}.\n"
    rows = []
    for i in items:
        script, world = i.name.rsplit(" x", 1)
        rows.append(f"| {script} | {world} | {md_cell(i.result())} | {i.seconds:.1f} |")
    text = "| script | GPUs (ranks) | result | seconds |\n|---|---:|---|---:|\n"
    text += "\n".join(rows) + "\n\nBackend nccl, one rank per GPU, through "
    text += "`helpers.launch.launch` (torchrun); logs in `nccl/`.\n"
    return text + tracebacks(items)


def parts_of(check: Check) -> list[Part]:
    """One Part per --only part that has items, in PARTS order."""
    show = {
        "notebooks": lambda items: notebooks_markdown(items, check.out),
        "tests": tests_markdown,
        "benchmarks": benchmarks_markdown,
        "nccl": nccl_markdown,
    }
    parts = []
    for name in dict.fromkeys(STAGES.values()):  # in the order they run
        items = [i for i in check.items if i.part == name]
        if not items:
            continue
        problems = []
        for i in items:
            if i.status in ("FAILED", "STOPPED"):
                problems += i.problems or [f"{i.name}: {i.result()}"]
        seconds = sum(i.seconds for i in items)
        parts.append(Part(name, part_status(items), show[name](items), seconds, problems))
    return parts


def summary(check: Check) -> str:
    """The whole report as Markdown."""
    parts = parts_of(check)
    failed = [p for p in parts if p.status == "FAILED"]
    stopped = [i for i in check.items if i.status == "STOPPED"]
    not_run = [i for i in check.items if i.status in ("not run", "pending")]
    if check.running:
        state = f"still running ({check.running})"
    elif failed or any("gpu_check itself failed" in n for n in check.notes):
        state = "FAILED"
    elif stopped or not_run or check.stopped:
        state = f"incomplete, {len(stopped)} item(s) stopped, {len(not_run)} not run"
    else:
        state = "passed"
    commit = git_commit()
    command = shlex.join(["python", "tools/gpu_check.py", *check.argv])
    deadline = (
        f"; deadline {check.args.deadline:g} s, {check.elapsed():.0f} s used"
        if check.args.deadline
        else ""
    )
    lines = [
        f"# GPU check: {gpu_summary(check.machine)}",
        "",
        f"Started {check.started}"
        + (f", commit {commit}" if commit else "")
        + f": `{command}`{deadline}",
        "",
        f"**Result: {state}.** "
        + "; ".join(f"{p.name}: {p.status} ({p.seconds:.0f} s)" for p in parts),
        "",
    ]
    if check.stopped:
        lines += [f"- {check.stopped}"]
    for p in parts:
        if p.status in ("FAILED", "incomplete"):
            lines += [f"- {p.name}: {md_cell(x)}" for x in p.problems]
    if failed or stopped or check.stopped:
        lines.append("")
    lines += check.notes + ([""] if check.notes else [])
    lines += ["## Machine", "", machine_markdown(check.machine)]
    cores = int(check.machine.get("cores") or 1)
    lines += ["## Machine state", "", states_markdown(check.states, cores)]
    for p in parts:
        lines += [f"## {p.name.capitalize() if p.name != 'nccl' else 'NCCL'}", "", p.markdown]
    if not_run:
        lines += ["## Not run", ""]
        lines += [f"- {i.stage}: {i.name}: {i.detail or 'not reached'}" for i in not_run]
        lines += [
            "",
            "To run them, call again with `--resume` and this run's folder (README, 'GPU check').",
            "",
        ]
    logs = log_names(check.out)
    if logs:
        lines += ["## Logs", "", "Beside this file: " + ", ".join(f"`{x}`" for x in logs) + ".", ""]
    return "\n".join(lines)


def log_names(out: Path) -> list[str]:
    """The logs and folders a run left in `out` (the summary lists them)."""
    names = ["machine.json", "progress.json", "notebooks.log", "notebooks/", "tests.log"]
    names += ["tests.xml", "benchmarks/", "nccl/"]
    return [n for n in names if (out / n.rstrip("/")).exists()]


def write_file(path: Path, text: str) -> Path:
    """Write a file atomically, so that a reader never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--only", default=",".join(PARTS), help=f"comma-separated parts: {','.join(PARTS)}"
    )
    p.add_argument("--quick", action="store_true", help="chapter 1, a few tests, short benchmarks")
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
    p.add_argument("--benchmarks", nargs="+", help="these benchmark scripts instead of all")
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
    args.parts = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown or not args.parts:
        p.error(f"--only takes a comma-separated list of {', '.join(PARTS)}; got {args.only!r}")
    if args.deadline < 0:
        p.error("--deadline takes a number of seconds > 0")
    return args


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
        print(json.dumps(probe_machine()))
        return 0
    if args.state is not None:
        print(json.dumps(state_reading(args.state or ["cpu"])))
        return 0
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
    machine = machine_info()
    write_file(out / "machine.json", json.dumps(machine, indent=1) + "\n")
    print(f"gpu-check: {gpu_summary(machine)}; torch {machine.get('torch', '?')}; report in {out}")
    check = Check(args, out, machine, argv)
    check.set_clock(started_at)
    check.items = plan(args, machine)
    if args.resume:
        check.notes.append(carry_over(check.items, Path(args.resume).resolve()))
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
        folder = f"reference/{slug(machine)}"
        print(
            f"to make it this GPU's reference (it replaces the older one): git rm -rq --ignore-unmatch "
            f"{folder} && mkdir -p {folder} && cp {path} {folder}/summary.md"
        )
    if bad or check.stopped or broke:
        return 1
    return 3 if unfinished else 0


if __name__ == "__main__":
    sys.exit(main())
