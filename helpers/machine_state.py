"""What else the machine was doing while a timing ran: GPU co-tenants, CPU load, threads (chapter 1).

A co-tenant on the same GPU can halve a rate while the spread of the timing stays near 0%
(the course's H100 run of 2026-11-26: fp32 at 40% of peak with an IQR of 0.1%, 76% alone), so
a small spread does not mean a quiet machine. These readings say what the spread cannot:

- ``machine_state(device)``: one reading now (other compute processes on the GPU through
  NVML, the load average against the cores, torch's threads);
- ``MachineWatch``: the same over a window, with the CPU time other processes used in it;
  ``helpers.timing.benchmark`` runs one around every timing (``BenchResult.machine``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any

import psutil
import torch

from helpers.i18n import tr
from helpers.nvml_snapshot import nvml_handle
from helpers.processes import cpu_cores
from helpers.units import Printed, format_bytes

#: Other processes busy on average with more than this share of the machine's cores, or half
#: a core (whichever is more), make a CPU "loaded": they take cores the timed work could use.
LOADED_SHARE = 0.25
#: A window shorter than this cannot tell the other processes' CPU use (10 ms clock ticks).
MIN_WINDOW_S = 0.1


@dataclass(repr=False)
class GpuTenants:
    """Other compute processes on one GPU, as NVML lists them, or why unknown (chapter 1)."""

    count: int | None
    memory: int | None = None
    note: str = ""

    def __str__(self) -> str:
        if self.count is None:
            return tr("other GPU processes: unknown ({note})").format(note=self.note)
        note = tr(" ({note})").format(note=self.note) if self.note else ""
        if not self.count:
            return tr("no other process on this GPU{note}").format(note=note)
        if self.memory:
            return tr(
                "GPU shared with {count} other compute process(es), holding {memory}{note}"
            ).format(count=self.count, memory=format_bytes(self.memory), note=note)
        return tr("GPU shared with {count} other compute process(es){note}").format(
            count=self.count, note=note
        )


def _own_pids() -> set[int]:
    """This process and its children: the pids a GPU may list as 'ours' (chapter 1)."""
    me = psutil.Process()
    pids = {me.pid}
    with contextlib.suppress(psutil.Error):
        pids |= {c.pid for c in me.children(recursive=True)}
    return pids


def gpu_tenants(device: str | torch.device) -> GpuTenants:
    """Compute processes other than this one on the CUDA GPU `device`; never raises (chapter 1)."""
    device = torch.device(device)
    if device.type != "cuda":
        return GpuTenants(None, note=tr("not read on {kind}").format(kind=device.type))
    if getattr(torch.version, "hip", None):
        return GpuTenants(
            None, note=tr("NVML does not see AMD GPUs; rocm-smi lists their processes")
        )
    mine = _holds_context(device)  # before nvml_handle, whose device query initialises CUDA
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no nvidia-ml-py, or no driver library
        return GpuTenants(
            None, note=tr("NVML unavailable: {error}").format(error=type(exc).__name__)
        )
    try:
        listed = pynvml.nvmlDeviceGetComputeRunningProcesses(nvml_handle(pynvml, device))
    except Exception as exc:  # NotSupported (MIG, some vGPUs), NoPermission, ...
        return GpuTenants(
            None, note=tr("NVML could not list processes: {error}").format(error=type(exc).__name__)
        )
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return _others(listed, _own_pids(), mine)


def _holds_context(device: torch.device) -> bool:
    """Whether this process has a CUDA context on `device`, so NVML lists it too (chapter 1)."""
    if not torch.cuda.is_initialized():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    has_context = getattr(torch._C, "_cuda_hasPrimaryContext", None)  # CUDA builds of torch
    if has_context is not None:
        with contextlib.suppress(Exception):
            return bool(has_context(index))
    return torch.cuda.memory_reserved(index) > 0


def _others(listed: list[Any], own: set[int], have_context: bool) -> GpuTenants:
    """The tenants in NVML's list that are not this process (chapter 1)."""
    others = [p for p in listed if p.pid not in own]
    note = ""
    if have_context and len(others) == len(listed) and others:
        # In a container NVML lists the host's pids: one of them is this process.
        others = others[1:]
        note = tr("pids from another namespace: one of the listed processes counted as this one")
    used = [getattr(p, "usedGpuMemory", None) for p in others]
    memory = sum(u for u in used if isinstance(u, int)) or None
    return GpuTenants(len(others), memory, note)


def _busy_seconds() -> float:
    """CPU seconds all processes of the machine spent busy so far, summed over cores (chapter 1)."""
    t = psutil.cpu_times()
    return sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))


def _own_seconds() -> float:
    """CPU seconds this process (every thread) and its children, running or finished, have used (chapter 1).

    A watch around a launch (chapter 4's torchrun ranks) or a DataLoader with workers counts
    their work as this job's, not as another process's load: running children by their own
    times, finished ones once waited for (the times of a reaped child move into its parent's).
    """
    me = psutil.Process()
    t = me.cpu_times()
    live = 0.0  # children still running (DataLoader workers, ranks): their time so far
    with contextlib.suppress(psutil.Error):
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                c = child.cpu_times()
                live += c.user + c.system
    return t.user + t.system + t.children_user + t.children_system + live


@dataclass(repr=False)
class MachineState(Printed):
    """The conditions a timing ran under: co-tenants, CPU use by others, threads (chapter 1)."""

    device: str
    torch_threads: int
    usable_cores: int
    system_cores: int
    load_1min: float | None
    gpu: GpuTenants
    others_cores: float | None = None  # cores other processes kept busy on average, in a window
    window_s: float | None = None

    @property
    def gpu_shared(self) -> bool:
        """Another compute process was on the timed GPU (chapter 1)."""
        return bool(self.gpu.count)

    @property
    def cpu_loaded(self) -> bool:
        """Other processes took CPU the timed work could have used (chapter 1)."""
        limit = max(0.5, LOADED_SHARE * self.system_cores)
        if self.others_cores is not None:
            return self.others_cores > limit
        # No window: the load average counts this process too, so only a clear excess counts.
        return self.load_1min is not None and self.load_1min > self.system_cores + limit

    @property
    def quiet(self) -> bool:
        """Neither a shared GPU nor a loaded CPU: a timing here can support a verdict (chapter 1)."""
        return not (self.gpu_shared or self.cpu_loaded)

    def caveat(self) -> str:
        """Why timings taken in this state are not representative, or '' (chapter 1)."""
        why = []
        if self.gpu_shared:
            why.append(str(self.gpu))
        if self.cpu_loaded:
            why.append(tr("CPU loaded ({cpu})").format(cpu=self._cpu_text()))
        return "; ".join(why)

    def _cpu_text(self) -> str:
        parts = []
        if self.others_cores is not None:
            parts.append(
                tr("other processes kept {cores:.1f} cores busy").format(cores=self.others_cores)
            )
        if self.load_1min is not None:
            parts.append(tr("load {load:.1f}").format(load=self.load_1min))
        parts.append(
            tr("{system} cores, {usable} usable").format(
                system=self.system_cores, usable=self.usable_cores
            )
        )
        return tr(", ").join(parts)

    def __str__(self) -> str:
        if self.gpu.count is None and self.device.startswith("cpu"):  # no GPU to speak of
            if self.quiet:
                line = tr("machine: quiet ({cpu}; torch {threads} thread(s))")
            else:
                line = tr("machine: BUSY ({cpu}; torch {threads} thread(s))")
        elif self.quiet:
            line = tr("machine: quiet ({cpu}; torch {threads} thread(s); {gpu})")
        else:
            line = tr("machine: BUSY ({cpu}; torch {threads} thread(s); {gpu})")
        return line.format(cpu=self._cpu_text(), threads=self.torch_threads, gpu=self.gpu)


def _load_1min() -> float | None:
    """The 1-minute load average, or None where the OS has none (chapter 1)."""
    with contextlib.suppress(AttributeError, OSError):
        return os.getloadavg()[0]
    return None


def machine_state(device: str | torch.device = "cpu") -> MachineState:
    """One reading of what else this machine is doing now (chapter 1)."""
    device = torch.device(device)
    return MachineState(
        device=str(device),
        torch_threads=torch.get_num_threads(),
        usable_cores=cpu_cores(),
        system_cores=psutil.cpu_count() or 1,
        load_1min=_load_1min(),
        gpu=gpu_tenants(device),
    )


def merge_states(states: list[MachineState]) -> MachineState | None:
    """One state for several timings: the busiest reading of each kind (chapter 1)."""
    states = [s for s in states if s is not None]
    if not states:
        return None
    gpu = max((s.gpu for s in states), key=lambda g: -1 if g.count is None else g.count)
    windows = [s.others_cores for s in states if s.others_cores is not None]
    loads = [s.load_1min for s in states if s.load_1min is not None]
    first = states[0]
    return MachineState(
        first.device,
        first.torch_threads,
        first.usable_cores,
        first.system_cores,
        max(loads) if loads else None,
        gpu,
        max(windows) if windows else None,
        sum(s.window_s or 0.0 for s in states) or None,
    )


class MachineWatch:
    """The machine's state over a window: co-tenants at both ends, others' CPU use (chapter 1).

    with MachineWatch(device) as watch:
        ...                       # the timed work
    watch.state                   # a MachineState
    """

    def __init__(self, device: str | torch.device = "cpu", threads: int | None = None) -> None:
        self.device, self.threads = torch.device(device), threads
        self.state: MachineState | None = None

    def __enter__(self) -> MachineWatch:
        self._before = machine_state(self.device)
        self._t0, self._busy0, self._own0 = time.perf_counter(), _busy_seconds(), _own_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        window = time.perf_counter() - self._t0
        others = _busy_seconds() - self._busy0 - (_own_seconds() - self._own0)
        after = machine_state(self.device)
        state = merge_states([self._before, after]) or after
        state.torch_threads = self.threads or state.torch_threads
        if window >= MIN_WINDOW_S:
            state.others_cores, state.window_s = max(0.0, others / window), window
        self.state = state
