"""A launched job's processes and sockets: who runs, who listens, and stopping them all (chapter 4)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Sequence

import psutil
import torch


def cpu_cores() -> int:
    """CPU cores this process may use (its affinity mask where the OS has one) (chapter 4)."""
    with contextlib.suppress(AttributeError, OSError):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def gpu_count() -> int:
    """CUDA (or ROCm) GPUs visible to torch; 0 without any (chapter 4)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def alive_pids(pids: Sequence[int]) -> list[int]:
    """The pids in `pids` that still run (a zombie does not) (chapter 4)."""
    alive = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
    return alive


def listening_sockets(proc: psutil.Process | None = None) -> list[tuple[str, int]]:
    """The TCP (address, port) pairs a process (default: this one) listens on (chapter 4)."""
    proc = proc or psutil.Process()
    get = getattr(proc, "net_connections", None) or proc.connections
    try:
        conns = get(kind="tcp")
    except psutil.Error:
        return []
    return [(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]


def kill_tree(root: psutil.Process | None, known: Sequence[psutil.Process] = ()) -> list[int]:
    """SIGTERM `root`, its descendants and `known`, then SIGKILL what is left; the pids hit (chapter 4)."""
    procs: dict[int, psutil.Process] = {p.pid: p for p in known}
    if root is not None:
        with contextlib.suppress(psutil.Error):
            procs.update({p.pid: p for p in root.children(recursive=True)})
        procs[root.pid] = root
        with contextlib.suppress(OSError, AttributeError):  # Windows has no os.killpg
            os.killpg(root.pid, signal.SIGTERM)  # ProcessFamily made root a group leader
    for p in procs.values():
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(list(procs.values()), timeout=3.0)  # 3 s of grace
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=3.0)
    return sorted(procs)


class ProcessFamily:
    """A command started in its own process group, and every descendant seen, kept after they leave its tree (torchrun's workers do) (chapter 4)."""

    def __init__(self, args: list[str], env: dict[str, str], watch_sockets: bool = False) -> None:
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,  # its output, line by line
            stderr=subprocess.STDOUT,
            encoding="utf-8",  # text mode
            errors="replace",  # gloo's messages carry emoji; never die on a locale
            env=env,
            start_new_session=True,  # POSIX; ignored on Windows, which gets the flag below
            creationflags=getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0),
        )
        self.root = psutil.Process(self.proc.pid)
        self.seen: dict[int, psutil.Process] = {}
        self.listening: set[tuple[int, str, int]] = set()
        self.watch_sockets = watch_sockets

    def track(self) -> None:
        """Remember new descendants (and their listening sockets, if asked) (chapter 4)."""
        with contextlib.suppress(psutil.Error):
            for child in self.root.children(recursive=True):
                self.seen.setdefault(child.pid, child)
        if self.watch_sockets:
            for p in (self.root, *self.seen.values()):
                self.listening.update((p.pid, ip, port) for ip, port in listening_sockets(p))

    def stop(self, everything: bool) -> tuple[int | None, list[int]]:
        """Kill all of it (or, once the root exited, its orphans): (exit code, pids killed) (chapter 4)."""
        if everything or self.proc.poll() is None:
            self.track()
            killed = kill_tree(self.root, list(self.seen.values()))
        else:  # the root has exited: any descendant still running after 2 s is an orphan, stop it
            leftovers = [self.seen[pid] for pid in alive_pids(list(self.seen))]
            killed = kill_tree(None, psutil.wait_procs(leftovers, timeout=2.0)[1])
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        # psutil may have reaped the root while killing it; then Popen reads 0 and psutil has the code
        reaped = getattr(self.root, "returncode", None)
        return (reaped if self.proc.returncode == 0 and reaped else self.proc.returncode), killed
