"""What the machine is (its probe) and what it is doing (state readings) (gpu_check)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpucheck.common import SCRIPT, child_env, md_cell

#: Seconds a machine-state reading takes at most (a fresh Python that imports torch).
STATE_TIMEOUT_S = 60.0


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
            [python, str(SCRIPT), "--probe"],
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
    command = [sys.executable, str(SCRIPT), "--state"]
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
    """The machine before and after one phase, and the cores other processes kept busy."""

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
    """The machine's state table: one row per phase that ran."""
    if not states:
        return "No phase ran.\n"
    lines = [
        "| phase | before | after | other processes' CPU during it |",
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
        "Read with `helpers.machine_state` in a fresh process at each phase's ends (other "
        "compute processes on each GPU through NVML, the load average against the cores, "
        "torch's threads in a new process); the last column is the CPU time that processes "
        "other than this check used, per second of the phase. "
        + (
            "Timings of these phases ran on a busy machine: " + "; ".join(busy) + "."
            if busy
            else "No reading found another compute process on a GPU or a loaded CPU."
        ),
    ]
    return "\n".join(lines) + "\n"
