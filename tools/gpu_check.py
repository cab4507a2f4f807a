"""GPU check: every notebook, the unit tests, the benchmarks and NCCL on this machine, one report.

    make gpu-check                                   # python3's environment (PYTHON=... another)
    python tools/gpu_check.py                        # the same, with the Python you run it with
    python tools/gpu_check.py --quick                # a taste in a few minutes, CPU included
    python tools/gpu_check.py --only tests,nccl      # parts: notebooks,tests,benchmarks,nccl

It uses the torch and the packages already installed in this Python: it creates no venv and
downloads nothing, so it runs on a cloud image with no network (any torch that
requirements.txt allows; see the README, "GPU check", for carrying the few wheels such an
image lacks). The parts:

- notebooks: every chapter, solution and exercise notebook, through tools/run_all.py --all;
- tests: `pytest tests --ignore=tests/browser` (with `-n auto` where pytest-xdist is installed);
- benchmarks: every benchmarks/*.py, each with a timeout, its printed tables kept verbatim;
- nccl: on a machine with GPUs, the chapter 4 DDP and FSDP scripts under torchrun with the
  NCCL backend at world size 1 (and 2 with two or more GPUs), each alone and then, as the
  chapter runs them, in one launch with the hand-made all-reduce (one_launch.py); skipped,
  with the reason, without.

It writes `gpu-check/summary.md` (the machine, then each part's results) and the raw logs
beside it, rewriting the summary after each part so a run that is stopped still has one. The
exit status is 1 if anything failed, 0 otherwise.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the course's helpers, from this checkout, for the NCCL part
    sys.path.insert(0, str(ROOT))

PARTS = ("notebooks", "tests", "benchmarks", "nccl")
#: Modules each part needs in this Python (import names); torch and helpers for all.
NEEDS = {
    "notebooks": ("torch", "helpers", "nbformat", "nbclient", "ipykernel"),
    "tests": ("torch", "helpers", "pytest", "nbformat", "nbclient"),
    "benchmarks": ("torch", "helpers"),
    "nccl": ("torch", "helpers", "psutil"),
}
#: --quick: chapter 1 only, the device and timing tests, short benchmark settings.
QUICK_NOTEBOOKS = ("notebooks/01_devices.ipynb",)
QUICK_TESTS = ("tests/test_devices.py", "tests/test_timing.py", "tests/test_gpu_check.py")
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
class Part:
    """One part's outcome: its Markdown section, and whether it passed, failed or was skipped."""

    name: str
    status: str  # "ok", "FAILED" or "skipped"
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


# -- running commands -------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment for every command: this checkout's helpers first on PYTHONPATH."""
    env = dict(os.environ)
    paths = [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MPLBACKEND", "Agg")
    return env


def stop_tree(proc: subprocess.Popen) -> None:
    """Stop a command and everything it started (torchrun's workers leave its process group)."""
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
    for child in family:
        with contextlib.suppress(Exception):
            child.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    for child in family:
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
) -> Step:
    """Run a command in the repository root, its output into `log` (and `echo`), with a timeout."""
    log.parent.mkdir(parents=True, exist_ok=True)
    step = Step(command, log)
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
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
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            step.timed_out = True
            stop_tree(proc)
        except KeyboardInterrupt:
            stop_tree(proc)
            raise
        reader.join(timeout=10)
        if step.timed_out:
            out.write(f"\n[gpu_check] stopped after the {timeout:g} s timeout\n")
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


# -- the parts --------------------------------------------------------------------------------


def run_notebooks(out: Path, args: argparse.Namespace) -> Part:
    """Every notebook through tools/run_all.py, in fresh kernels; one row per notebook."""
    folder = out / "notebooks"
    command = [sys.executable, str(ROOT / "tools" / "run_all.py")]
    command += (
        list(args.notebooks)
        if args.notebooks
        else (list(QUICK_NOTEBOOKS) if args.quick else ["--all"])
    )
    command += ["--out", str(folder), "--timeout", str(args.cell_timeout)]
    if not args.html:
        command.append("--no-html")
    (folder / "results.json").unlink(missing_ok=True)  # never report an earlier run's rows
    step = run_command(
        command, out / "notebooks.log", args.notebooks_timeout, echo=lambda s: print(s, flush=True)
    )
    rows: list[dict] = []
    with contextlib.suppress(OSError, ValueError):
        rows = json.loads((folder / "results.json").read_text())["notebooks"]
    problems = [f"{r['path']}: {r['error']}" for r in rows if not r["ok"]]
    if not step.ok and not problems:
        problems.append(f"tools/run_all.py {step.verdict(args.notebooks_timeout)}")
    lines = ["| notebook | result | seconds |", "|---|---|---:|"]
    for r in rows:
        result = "ok" if r["ok"] else f"FAILED: {r['error']}"
        lines.append(f"| {r['path']} | {md_cell(result)} | {r['seconds']:.1f} |")
    failed = sum(not r["ok"] for r in rows)
    total = sum(r["seconds"] for r in rows)
    lines += [
        "",
        f"{len(rows)} notebooks, {failed} failed, {total:.0f} s in all "
        f"(`{shlex.join(command[1:])}`; executed copies in `{folder.name}/`).",
    ]
    if not rows:
        lines = [f"No notebook results: tools/run_all.py {step.verdict(args.notebooks_timeout)}."]
        lines.append(f"Its log, `{step.log.name}`, ends with:\n\n" + fenced(tail(step.log)))
    status = "FAILED" if problems or not step.ok else "ok"
    return Part("notebooks", status, "\n".join(lines) + "\n", step.seconds, problems)


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log."""
    return "\n".join(log_text(path).splitlines()[-lines:])


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


def run_tests(out: Path, args: argparse.Namespace) -> Part:
    """The unit tests; counts from the JUnit report, failing test ids from pytest's summary."""
    junit = out / "tests.xml"
    junit.unlink(missing_ok=True)
    command = pytest_command(args, junit)
    print(f"  {shlex.join(command[1:])}", flush=True)
    step = run_command(command, out / "tests.log", args.tests_timeout)
    try:
        counts = test_counts(junit)
    except Exception:  # noqa: BLE001 - no report: pytest crashed or timed out
        counts = None
    ids = failing_ids(step.log, junit)
    cmd = shlex.join(["python", *command[1:]]).replace(str(out) + os.sep, "")
    if counts is None:
        text = f"No test report: pytest {step.verdict(args.tests_timeout)}. `{step.log.name}` ends:\n\n"
        text += fenced(tail(step.log))
        return Part("tests", "FAILED", text, step.seconds, ["pytest: no report"])
    ran = sum(counts.values())
    line = ", ".join(f"{n} {k}" for k, n in counts.items())
    text = f"{line} in {step.seconds:.0f} s (`{cmd}`).\n"
    problems = list(ids)
    if step.timed_out:
        problems.append(f"pytest {step.verdict(args.tests_timeout)}")
    elif ran == 0:
        problems.append("pytest ran no test")
    elif (counts["failed"] or counts["errors"] or not step.ok) and not ids:
        problems.append(f"pytest {step.verdict(args.tests_timeout)}")
    if ids:
        text += "\nFailing:\n\n" + "\n".join(f"- {md_cell(i)}" for i in ids) + "\n"
    print(f"  {line}", flush=True)
    return Part("tests", "FAILED" if problems else "ok", text, step.seconds, problems)


def benchmark_scripts(args: argparse.Namespace) -> list[Path]:
    """The benchmark scripts to run: those given, else every benchmarks/*.py."""
    if args.benchmarks:
        return [Path(p).resolve() for p in args.benchmarks]
    return sorted((ROOT / "benchmarks").glob("*.py"))


def run_benchmarks(out: Path, args: argparse.Namespace) -> Part:
    """Every benchmark script with a timeout; its printed tables verbatim."""
    sections, problems, seconds = [], [], 0.0
    timeout = args.benchmark_timeout or (300 if args.quick else 1200)
    for script in benchmark_scripts(args):
        extra = QUICK_BENCHMARK_ARGS.get(script.stem, []) if args.quick else []
        command = [sys.executable, str(script), *extra]
        print(f"  {script.name} ...", end=" ", flush=True)
        step = run_command(command, out / "benchmarks" / f"{script.stem}.log", timeout)
        seconds += step.seconds
        verdict = step.verdict(timeout)
        print(f"{verdict} in {step.seconds:.0f} s", flush=True)
        if not step.ok:
            problems.append(f"{script.name}: {verdict}")
        shown = " ".join([script.name, *extra])
        sections.append(
            f"### {script.name}: {verdict}, {step.seconds:.0f} s\n\n`python {shown}`\n\n"
            + fenced(log_text(step.log) or "(no output)")
        )
    if not sections:
        return Part("benchmarks", "skipped", "No benchmark scripts found.\n")
    status = "FAILED" if problems else "ok"
    return Part("benchmarks", status, "\n".join(sections), seconds, problems)


def nccl_world_sizes(gpu_count: int) -> list[int]:
    """World size 1 on one GPU, and 2 as well with two or more: one rank per GPU."""
    return [n for n in (1, 2) if n <= gpu_count]


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


def run_nccl(out: Path, args: argparse.Namespace, machine: dict) -> Part:
    """The chapter 4 DDP and FSDP scripts under torchrun with NCCL, one rank per GPU."""
    count = int(machine.get("gpu_count") or 0)
    if count == 0:
        why = (
            f"no GPU: torch {machine.get('torch', '?')} sees none here "
            f"(torch.cuda.is_available() is False), and NCCL needs one GPU per rank"
        )
        print(f"  skipped: {why}", flush=True)
        return Part("nccl", "skipped", f"Skipped: {why}.\n")
    from helpers import launch as torchrun

    rows, problems, seconds = [], [], 0.0
    folder = out / "nccl"
    for script, options in NCCL_SCRIPTS.items():
        for world in nccl_world_sizes(count):
            name = f"{script}-nccl-x{world}"
            results = folder / name
            results.mkdir(parents=True, exist_ok=True)
            log = folder / f"{name}.log"
            print(f"  {script} on {world} GPU(s), NCCL ...", end=" ", flush=True)
            with log.open("w", encoding="utf-8") as f:

                def echo(line: str, f=f) -> None:  # noqa: ANN001 - the log file
                    f.write(line + "\n")
                    f.flush()

                flags = nccl_flags(script, options, results)
                try:
                    result = torchrun.launch(
                        script,
                        nproc=world,
                        args=flags,
                        backend="nccl",
                        timeout=args.nccl_timeout,
                        echo=echo,
                        check=False,
                        env={"PYTHONPATH": child_env()["PYTHONPATH"]},  # ranks import helpers
                    )
                    ok, took = result.ok, result.seconds
                    why = result.message if not result.ok else ""
                except Exception as exc:  # noqa: BLE001 - a launcher error is a failed run
                    ok, took, why = False, 0.0, f"{type(exc).__name__}: {exc}"
                if ok:
                    try:
                        wrong = nccl_problems(script, results, world)
                    except Exception as exc:  # noqa: BLE001 - unreadable results are wrong too
                        wrong = [f"{type(exc).__name__}: {exc}"]
                    ok, why = not wrong, "; ".join(wrong)
                f.write(f"\n[gpu_check] {'ok' if ok else 'FAILED: ' + why}\n")
            seconds += took
            verdict = "ok" if ok else f"FAILED: {why}"
            print(verdict.splitlines()[0], flush=True)
            rows.append(f"| {script} | {world} | {md_cell(verdict)} | {took:.1f} |")
            if not ok:
                problems.append(f"{script} x{world}: {why}")
    text = "| script | GPUs (ranks) | result | seconds |\n|---|---:|---|---:|\n"
    text += "\n".join(rows) + "\n\nBackend nccl, one rank per GPU, through "
    text += "`helpers.launch.launch` (torchrun); logs in `nccl/`.\n"
    return Part("nccl", "FAILED" if problems else "ok", text, seconds, problems)


# -- the report -------------------------------------------------------------------------------


def git_commit() -> str:
    """The checkout's commit, with '+ local changes' when the tree is dirty ('' without git)."""
    sha = command_output(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    if not sha:
        return ""
    dirty = command_output(
        ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"]
    )
    return sha + (" + local changes" if dirty else "")


def summary(
    machine: dict,
    parts: list[Part],
    argv: Sequence[str],
    started: str,
    running: str = "",
    logs: Sequence[str] = (),
) -> str:
    """The whole report as Markdown."""
    failed = [p for p in parts if p.status == "FAILED"]
    if running:
        state = f"still running ({running})"
    else:
        state = "FAILED" if failed else "passed"
    commit = git_commit()
    command = shlex.join(["python", "tools/gpu_check.py", *argv])
    lines = [
        f"# GPU check: {gpu_summary(machine)}",
        "",
        f"Started {started}" + (f", commit {commit}" if commit else "") + f": `{command}`",
        "",
        f"**Result: {state}.** "
        + "; ".join(f"{p.name}: {p.status} ({p.seconds:.0f} s)" for p in parts),
        "",
    ]
    for p in failed:
        lines += [f"- {p.name}: {md_cell(x)}" for x in p.problems] or [f"- {p.name} failed"]
    if failed:
        lines.append("")
    lines += ["## Machine", "", machine_markdown(machine)]
    for p in parts:
        lines += [f"## {p.name.capitalize() if p.name != 'nccl' else 'NCCL'}", "", p.markdown]
    if logs:
        lines += ["## Logs", "", "Beside this file: " + ", ".join(f"`{x}`" for x in logs) + ".", ""]
    return "\n".join(lines)


def log_names(out: Path) -> list[str]:
    """The logs and folders a run left in `out` (the summary lists them)."""
    names = ["machine.json", "notebooks.log", "notebooks/", "tests.log", "tests.xml"]
    names += ["benchmarks/", "nccl/"]
    return [n for n in names if (out / n.rstrip("/")).exists()]


def write_summary(out: Path, text: str) -> Path:
    """Write summary.md (atomically, so a reader never sees half of it)."""
    path = out / "summary.md"
    tmp = path.with_suffix(".md.tmp")
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
    args = p.parse_args(argv)
    args.parts = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown or not args.parts:
        p.error(f"--only takes a comma-separated list of {', '.join(PARTS)}; got {args.only!r}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.probe:
        print(json.dumps(probe_machine()))
        return 0
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    machine = machine_info()
    (out / "machine.json").write_text(json.dumps(machine, indent=1) + "\n", encoding="utf-8")
    print(f"gpu-check: {gpu_summary(machine)}; torch {machine.get('torch', '?')}; report in {out}")
    runners = {
        "notebooks": lambda: run_notebooks(out, args),
        "tests": lambda: run_tests(out, args),
        "benchmarks": lambda: run_benchmarks(out, args),
        "nccl": lambda: run_nccl(out, args, machine),
    }
    parts: list[Part] = []
    chosen = [name for name in PARTS if name in args.parts]
    try:
        for name in chosen:
            write_summary(out, summary(machine, parts, argv, started, running=name))
            print(f"\n== {name}", flush=True)
            missing = missing_modules(name)
            if missing:
                why = (
                    f"this Python ({sys.executable}) cannot import {', '.join(missing)}: install "
                    f"them (on a box with no network, carry the wheels: README, 'GPU check')"
                )
                print(f"  FAILED: {why}", flush=True)
                parts.append(Part(name, "FAILED", f"Not run: {why}.\n", 0.0, [why]))
                continue
            parts.append(runners[name]())
    except KeyboardInterrupt:
        parts.append(Part("interrupted", "FAILED", "Stopped by Ctrl-C.\n", 0.0, ["interrupted"]))
    finally:
        path = write_summary(out, summary(machine, parts, argv, started, logs=log_names(out)))
    failed = [p.name for p in parts if p.status == "FAILED"]
    print(f"\n{'FAILED: ' + ', '.join(failed) if failed else 'all passed'}; report: {path}")
    if machine.get("gpus"):
        print(
            f"to keep it as this GPU's reference: mkdir -p reference/{slug(machine)} && "
            f"cp {path} reference/{slug(machine)}/summary.md"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
