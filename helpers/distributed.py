"""Launching distributed scripts with torchrun from a notebook, safely (chapter 4).

Why a subprocess: ``mp.spawn`` from a notebook must pickle functions defined in
``__main__`` (it fails), and a process forked after CUDA was initialised cannot use CUDA.
Running ``torchrun`` (``python -m torch.distributed.run``) on a script file as a
subprocess avoids both: every rank is a fresh Python process.

:func:`launch` does it with the guard rails a class needs: it checks the arguments, lets the
ranks meet through files in a fresh temporary folder (so no rendezvous port listens on the
network), streams the ranks' output into the notebook line by line, stops at a
wall-clock timeout, and on timeout, error or interrupt kills torchrun *and* its workers
(torchrun starts each worker in its own session, so killing torchrun's process group is not
enough: the launcher tracks every descendant it has seen). It returns a
:class:`LaunchResult` with the exit code and the captured output.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import torch

from helpers.scripts.common import BACKEND_ENV, BACKENDS, PG_FILE_ENV, READY_MARKER
from helpers.sweeps import SweepResult
from helpers.validate import positive_int, positive_seconds

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: The folder of the scripts shipped with the course (inside the package).
SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
_NOT_SCRIPTS = {"__init__", "common"}
_POLL_S = 0.1
_TRACK_EVERY_S = 0.25
_TRACK_SOCKETS_EVERY_S = 0.05  # listening sockets can be short-lived: sample them more often


class LaunchError(RuntimeError):
    """A distributed run that failed, timed out or was asked for with bad arguments (chapter 4)."""


def available_scripts() -> list[str]:
    """Names of the scripts shipped in helpers/scripts (chapter 4)."""
    return sorted(p.stem for p in SCRIPTS_DIR.glob("*.py") if p.stem not in _NOT_SCRIPTS)


def script_path(name: str | Path) -> Path:
    """The file of a shipped script ('ddp_train') or of any existing .py path (chapter 4)."""
    text = str(name)
    candidates = [Path(text)] if text.endswith(".py") else []
    candidates.append(SCRIPTS_DIR / f"{Path(text).stem}.py")
    for path in candidates:
        if path.is_file() and path.stem not in _NOT_SCRIPTS:
            return path.resolve()
    raise FileNotFoundError(
        f"No script {text!r}. Give the path of an existing .py file, or one of the course's "
        f"scripts: {', '.join(available_scripts())}."
    )


def script_source(name: str | Path, function: str | None = None) -> str:
    """The source of a shipped script, or of one function in it, to show in a notebook (chapter 4)."""
    import ast

    text = script_path(name).read_text(encoding="utf-8")
    if function is None:
        return text
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == function:
            return ast.get_source_segment(text, node) or ""
    raise LaunchError(f"{script_path(name).name} has no function or class named {function!r}.")


def as_flags(options: dict[str, Any]) -> list[str]:
    """{'per_rank_batch': 32, 'hang': True} -> ['--per-rank-batch', '32', '--hang'] (chapter 4)."""
    flags: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not False and value is not None:
            flags += [flag, str(value)]
    return flags


def cpu_cores() -> int:
    """CPU cores this process may use (its affinity mask where the OS has one) (chapter 4)."""
    with contextlib.suppress(AttributeError, OSError):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def gpu_count() -> int:
    """CUDA (or ROCm) GPUs visible to torch; 0 without any (chapter 4)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_backend(nproc: int = 2) -> str:
    """NCCL when there is one GPU for each of `nproc` ranks, else gloo on CPU (chapter 4)."""
    return "nccl" if gpu_count() >= max(1, nproc) else "gloo"


def max_processes(backend: str) -> int:
    """The most ranks one machine may start: one per GPU on NCCL; max(2, cores) on gloo (chapter 4)."""
    backend = check_backend(backend)
    return gpu_count() if backend == "nccl" else max(2, cpu_cores())


def check_backend(backend: str | None, nproc: int = 2) -> str:
    """A valid backend name ('gloo' or 'nccl'); None picks default_backend(nproc) (chapter 4)."""
    if backend is None:
        return default_backend(nproc)
    name = str(backend).strip().lower()
    if name not in BACKENDS:
        raise LaunchError(
            f"Unknown backend {backend!r}. Use 'gloo' (CPU, works everywhere), 'nccl' "
            f"(NVIDIA/AMD GPUs, one per rank), or None to choose from the device."
        )
    if name == "nccl" and gpu_count() == 0:
        raise LaunchError(
            "The 'nccl' backend needs CUDA (or ROCm) GPUs, and torch sees none here. "
            "Use backend='gloo', which runs the same scripts on CPU processes."
        )
    return name


#: A tiny gloo job (an exercise check: ranks that mostly wait on each other) may start this many
#: ranks on any machine, so that an answer is probed at an odd world size even on 2 cores.
TINY_JOB_RANKS = 3


def check_nproc(nproc: Any, backend: str, tiny_job: bool = False) -> int:
    """`nproc` as an int between 1 and max_processes(backend) (TINY_JOB_RANKS for a tiny gloo job), else a LaunchError (chapter 4)."""
    try:
        n = positive_int(nproc, "nproc")
    except ValueError as exc:
        raise LaunchError(f"{exc} It is the number of processes (ranks) to start.") from None
    limit = max_processes(backend)
    if tiny_job and backend == "gloo":
        limit = max(limit, TINY_JOB_RANKS)
    if n > limit:
        why = (
            f"nccl needs one GPU per rank and torch sees {gpu_count()}"
            if backend == "nccl"
            else f"gloo runs one CPU process per rank and this machine has {cpu_cores()} core(s)"
        )
        raise LaunchError(
            f"nproc={n} is more than this machine allows ({limit}): {why}. Use nproc <= {limit}"
            + (", or backend='gloo'." if backend == "nccl" else ".")
        )
    return n


def loopback_interface() -> str | None:
    """The name of the network interface that holds 127.0.0.1 ('lo', 'lo0'), if any (chapter 4)."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addrs):
            return name
    return None


def torchrun_command(
    script: str | Path,
    nproc: int,
    args: Sequence[Any] = (),
    *,
    nnodes: str | int = 1,
    rdzv_endpoint: str | None = None,
    rdzv_dir: str | Path | None = None,
    rdzv_id: str | None = None,
    max_restarts: int = 0,
) -> list[str]:
    """The torchrun command: rendezvous at HOST:PORT (multi-node) or in a file in rdzv_dir (chapter 4)."""
    if (rdzv_endpoint is None) == (rdzv_dir is None):
        raise LaunchError(
            "Give exactly one of rdzv_endpoint='HOST:PORT' (a TCP rendezvous, needed across "
            "machines) or rdzv_dir=FOLDER (one machine: the rendezvous is a file, no port opens)."
        )
    if rdzv_dir is not None:
        rendezvous = [
            f"--rdzv-endpoint={Path(rdzv_dir) / 'rendezvous'}",
            "--rdzv-conf=store_type=file",
            "--local-addr=127.0.0.1",
        ]
    else:
        rendezvous = [f"--rdzv-endpoint={rdzv_endpoint}"]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={nproc}",
        "--rdzv-backend=c10d",
        *rendezvous,
        f"--rdzv-id={rdzv_id or uuid.uuid4().hex[:12]}",
        f"--max-restarts={max_restarts}",
        str(script),
        *[str(a) for a in args],
    ]


def worker_env(
    backend: str, nproc: int, threads: int | None = None, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment for torchrun and its ranks: backend, threads per rank, loopback only (chapter 4)."""
    env = dict(os.environ)
    env[BACKEND_ENV] = backend
    env["OMP_NUM_THREADS"] = str(threads or max(1, cpu_cores() // nproc))
    env["PYTHONUNBUFFERED"] = "1"
    if os.name == "nt":  # torch's Windows wheels have no libuv TCPStore
        env.setdefault("USE_LIBUV", "0")
    lo = loopback_interface()
    if lo is not None:  # keep gloo's and NCCL's own sockets on the loopback interface
        env.setdefault("GLOO_SOCKET_IFNAME", lo)
        env.setdefault("NCCL_SOCKET_IFNAME", lo)
    env.update(extra or {})
    return env


def file_rendezvous_env(rdzv_dir: str | Path) -> dict[str, str]:
    """Environment for one machine with no TCP store: the ranks meet in a file in rdzv_dir (chapter 4)."""
    return {
        PG_FILE_ENV: str(Path(rdzv_dir) / "process_group"),
        # without this, torchrun would host a TCPStore for the ranks, listening on every interface
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }


def _alive(pid: int) -> bool:
    """True if a process with this pid exists and is not a zombie (chapter 4)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def alive_pids(pids: Sequence[int]) -> list[int]:
    """The pids in `pids` that still run (chapter 4)."""
    return [p for p in pids if _alive(p)]


def listening_sockets(proc: psutil.Process | None = None) -> list[tuple[str, int]]:
    """The TCP (address, port) pairs a process (default: this one) listens on (chapter 4)."""
    proc = proc or psutil.Process()
    get = getattr(proc, "net_connections", None) or proc.connections
    try:
        conns = get(kind="tcp")
    except psutil.Error:
        return []
    return [(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN]


def kill_tree(
    root: psutil.Process | None, known: Sequence[psutil.Process] = (), grace: float = 3.0
) -> list[int]:
    """SIGTERM `root`, its descendants and `known`, then SIGKILL what is left; the pids hit (chapter 4)."""
    procs: dict[int, psutil.Process] = {p.pid: p for p in known}
    if root is not None:
        with contextlib.suppress(psutil.Error):
            procs.update({p.pid: p for p in root.children(recursive=True)})
        procs[root.pid] = root
        if hasattr(os, "killpg"):
            with contextlib.suppress(OSError):
                os.killpg(root.pid, signal.SIGTERM)  # the launcher made root a group leader
    for p in procs.values():
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=grace)
    return sorted(procs)


@dataclass
class LaunchResult:
    """What one torchrun launch did: exit code, output lines (with arrival times), processes (chapter 4)."""

    command: list[str]
    nproc: int
    backend: str
    returncode: int | None = None
    lines: list[str] = field(default_factory=list)
    line_times: list[float] = field(default_factory=list)
    seconds: float = 0.0
    timed_out: bool = False
    interrupted: bool = False
    child_pids: list[int] = field(default_factory=list)
    killed_pids: list[int] = field(default_factory=list)
    listening: list[tuple[int, str, int]] = field(default_factory=list)
    message: str = ""

    @property
    def ok(self) -> bool:
        """True when torchrun finished by itself with exit code 0 (chapter 4)."""
        return self.returncode == 0 and not self.timed_out and not self.interrupted

    @property
    def output(self) -> str:
        """All captured output as one string (chapter 4)."""
        return "\n".join(self.lines)

    def seconds_until(self, marker: str = READY_MARKER) -> float | None:
        """Seconds from the launch to the first line containing `marker`, or None (chapter 4)."""
        for line, t in zip(self.lines, self.line_times):
            if marker in line:
                return t
        return None

    def rank_lines(self, rank: int) -> list[str]:
        """The lines a script printed as '[rank N] ...' (chapter 4)."""
        return [ln for ln in self.lines if ln.startswith(f"[rank {rank}]")]

    def __str__(self) -> str:
        state = "ok" if self.ok else "FAILED"
        return (
            f"torchrun, {self.nproc} x {self.backend}: {state}, exit code {self.returncode}, "
            f"{self.seconds:.1f} s, {len(self.lines)} output lines"
            + (f"\n{self.message}" if self.message else "")
        )

    def _repr_pretty_(self, p, cycle) -> None:  # noqa: ANN001 - IPython's printer protocol
        p.text(str(self))


_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)")
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_EXC_LINE = re.compile(r"^(?:\[rank ?(\d+)\]:?\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Exit)\b.*)$")


def explain_failure(result: LaunchResult, timeout: float) -> str:
    """One clear paragraph on why a launch failed, read from torchrun's report (chapter 4)."""
    n = len(result.killed_pids)
    if result.interrupted:
        return f"Interrupted after {result.seconds:.1f} s: killed torchrun and its workers ({n} processes)."
    if result.timed_out:
        return (
            f"Stopped at the {timeout:g} s timeout: the job had not finished, so torchrun and its "
            f"workers ({n} processes) were killed. A rank may be waiting for a peer that is gone "
            f"or stuck; read the output above, or pass a larger timeout= if the job is just slow."
        )
    rank = exitcode = None
    if "Root Cause (first observed failure):" in result.output:
        tail = result.output.split("Root Cause (first observed failure):", 1)[1].splitlines()
        for line in tail:
            if rank is None and (m := _ROOT_RANK.match(line)):
                rank = int(m.group(1))
            if exitcode is None and (m := _ROOT_EXIT.match(line)):
                exitcode = int(m.group(1))
    found = [m.groups() for ln in result.lines if (m := _EXC_LINE.match(ln.strip()))]
    found = [(r, _short(e)) for r, e in found if "ChildFailedError" not in e]
    own = [e for r, e in found if rank is not None and r == str(rank)]
    others = [f"rank {r}: {e}" for r, e in found if r is not None and r != str(rank)]
    if rank is None:
        who = "a rank failed"
    elif own:
        who = f"rank {rank} failed first (exit code {exitcode}) with {own[-1]}"
    else:
        who = (
            f"rank {rank} failed first (exit code {exitcode}) without a Python traceback "
            f"(it crashed, was killed, or called os._exit)"
        )
    then = f" The others then lost their peer ({others[0]})." if others else ""
    return (
        f"torchrun exited with code {result.returncode} after {result.seconds:.1f} s: {who}.{then} "
        f"torchrun stopped the remaining ranks; the full report is above."
    )


def _short(text: str, limit: int = 160) -> str:
    """`text` cut to `limit` characters (chapter 4)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _HideLauncherTraceback:
    """Echo filter: drop torchrun's own Python traceback, keep the ranks' and its report (chapter 4)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say, self.held, self.hiding = say, None, False

    def __call__(self, line: str) -> None:
        if self.hiding:
            final = line.startswith("torch.distributed.elastic.multiprocessing.errors.")
            if final or line.startswith("====="):
                self.hiding = False
                self.say("(torchrun's own traceback is hidden; its report follows)")
                if not final:
                    self.say(line)
            return
        if self.held is not None:
            held, self.held = self.held, None
            if "<frozen runpy>" in line:  # torchrun runs as `python -m`; ranks never do
                self.hiding = True
                return
            self.say(held)
        if line.strip() == "Traceback (most recent call last):":
            self.held = line
            return
        self.say(line)


def _reader(stream: Any, lines: queue.Queue) -> None:
    """Move lines from a pipe into a queue, then a None at the end (chapter 4)."""
    try:
        for line in iter(stream.readline, ""):
            lines.put(line.rstrip("\n"))
    finally:
        lines.put(None)


def _check_limits(timeout: float, max_restarts: int) -> None:
    """Reject a launch timeout or restart count that cannot work (chapter 4)."""
    try:
        positive_seconds(timeout, "timeout")
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise LaunchError(f"max_restarts must be a whole number >= 0, got {max_restarts!r}.")


def _printer(echo: bool | Callable[[str], None]) -> Callable[[str], None]:
    """Where the workers' lines go: a callable, the notebook (torchrun's traceback hidden), or nowhere (chapter 4)."""
    if callable(echo):
        return echo
    if echo:
        return _HideLauncherTraceback(lambda s: print(s, flush=True))
    return lambda s: None


def _spawn(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start torchrun in its own session/process group, output piped line by line (chapter 4)."""
    popen_kw: dict[str, Any] = (
        {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}  # type: ignore[attr-defined]
        if os.name == "nt"
        else {"start_new_session": True}
    )
    return subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",  # gloo's messages carry emoji; never die on a locale
        bufsize=1,
        env=env,
        **popen_kw,
    )


class _Family:
    """torchrun and every worker it started, remembered even after they leave its tree (chapter 4)."""

    def __init__(self, pid: int, watch_sockets: bool) -> None:
        self.root = psutil.Process(pid)
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

    def stop(self, proc: subprocess.Popen, result: LaunchResult) -> None:
        """Kill whatever is left (all of it on timeout or interrupt), then fill in the result (chapter 4)."""
        if result.timed_out or result.interrupted or proc.poll() is None:
            self.track()
            result.killed_pids = kill_tree(self.root, list(self.seen.values()))
        else:  # torchrun has exited: any worker still running is an orphan, stop it
            leftovers = [p for p in self.seen.values() if _alive(p.pid)]
            if leftovers:
                _, still = psutil.wait_procs(leftovers, timeout=2.0)
                result.killed_pids = kill_tree(None, still) if still else []
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        # psutil may have reaped torchrun while killing it; then Popen reads 0 and psutil has the code
        reaped = getattr(self.root, "returncode", None)
        result.returncode = reaped if proc.returncode == 0 and reaped else proc.returncode
        result.child_pids = sorted(self.seen)
        result.listening = sorted(self.listening)


def _stream(
    proc: subprocess.Popen,
    family: _Family,
    result: LaunchResult,
    timeout: float,
    say: Callable[[str], None],
) -> None:
    """Echo and keep the output until torchrun exits or `timeout` passes (chapter 4)."""
    start = time.perf_counter()
    pipe: queue.Queue = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, pipe), daemon=True).start()
    last_track, eof = 0.0, False
    every = _TRACK_SOCKETS_EVERY_S if family.watch_sockets else _TRACK_EVERY_S
    while not (eof and proc.poll() is not None):
        now = time.perf_counter()
        if now - start > timeout:
            result.timed_out = True
            return
        if now - last_track > every:
            family.track()
            last_track = now
        if eof:
            time.sleep(min(_POLL_S, every))
            continue
        try:
            line = pipe.get(timeout=min(_POLL_S, every))
        except queue.Empty:
            continue
        if line is None:
            eof = True
            continue
        result.lines.append(line)
        result.line_times.append(time.perf_counter() - start)
        say(line)


def launch(
    script: str | Path,
    nproc: int = 2,
    args: Sequence[Any] = (),
    *,
    backend: str | None = None,
    timeout: float = 120.0,
    max_restarts: int = 0,
    threads: int | None = None,
    env: dict[str, str] | None = None,
    echo: bool | Callable[[str], None] = True,
    check: bool = True,
    watch_sockets: bool = False,
    tiny_job: bool = False,
) -> LaunchResult:
    """Run `script` under torchrun with `nproc` ranks as a subprocess: stream, time out, clean up (chapter 4)."""
    path = script_path(script)
    backend = check_backend(backend, nproc if isinstance(nproc, int) else 2)
    nproc = check_nproc(nproc, backend, tiny_job)
    _check_limits(timeout, max_restarts)
    say = _printer(echo)
    rdzv_dir = Path(tempfile.mkdtemp(prefix="course_ch04_rdzv_"))
    command = torchrun_command(path, nproc, args, rdzv_dir=rdzv_dir, max_restarts=max_restarts)
    result = LaunchResult(command=command, nproc=nproc, backend=backend)
    start = time.perf_counter()
    proc = _spawn(
        command,
        worker_env(backend, nproc, threads, {**file_rendezvous_env(rdzv_dir), **(env or {})}),
    )
    family = _Family(proc.pid, watch_sockets)
    try:
        _stream(proc, family, result, timeout, say)
    except KeyboardInterrupt:
        result.interrupted = True
        raise
    finally:
        result.seconds = time.perf_counter() - start
        family.stop(proc, result)
        shutil.rmtree(rdzv_dir, ignore_errors=True)
        if not result.ok:
            result.message = explain_failure(result, timeout)
            say(f"❌ {result.message}")
    if check and not result.ok:
        raise LaunchError(result.message)
    return result


def new_run_dir(name: str = "run") -> Path:
    """A fresh temporary folder for one launch's results (chapter 4)."""
    return Path(tempfile.mkdtemp(prefix=f"course_ch04_{name}_"))


def read_results(out: str | Path, world_size: int | None = None) -> list[dict[str, Any]]:
    """Load OUT/rank<r>.pt of every rank, in rank order, with weights_only=True (chapter 4)."""
    out = Path(out)
    files = sorted(out.glob("rank*.pt"), key=lambda p: int(p.stem.removeprefix("rank")))
    if not files:
        raise LaunchError(
            f"No results in {out}: the script did not get as far as writing them. "
            f"Read its output for the error."
        )
    if world_size is not None and len(files) != world_size:
        raise LaunchError(f"Expected {world_size} rank files in {out}, found {len(files)}.")
    return [torch.load(f, weights_only=True) for f in files]


# --- scaling: throughput against the number of processes -----------------------------------


@dataclass
class ScalingResult(SweepResult):
    """A scaling sweep's rows, and the one launch that measured them all (chapter 4)."""

    startup_s: float = float("nan")
    launch_s: float = float("nan")

    def __str__(self) -> str:
        return (
            f"{super().__str__()}\none launch of {max(self.column('processes'), default=0)} "
            f"rank(s): {self.startup_s:.1f} s of start-up in {self.launch_s:.1f} s"
        )


def _scaling_launch(
    sizes: Sequence[int], mode: str, backend: str | None, timeout: float, **size: Any
) -> tuple[LaunchResult, list[dict[str, Any]]]:
    """One launch of scaling.py that measures every process count in `sizes` (chapter 4)."""
    threads = size.pop("threads", 1)
    out = new_run_dir("scaling")
    args = ["--out", out, "--mode", mode, "--sizes", ",".join(str(k) for k in sizes)]
    args += [*as_flags(size), "--pg-timeout", timeout]  # ranks left out wait that long at most
    res = launch("scaling", max(sizes), args, backend=backend, threads=threads, timeout=timeout)
    runs = read_results(out)[0]["runs"]
    shutil.rmtree(out, ignore_errors=True)
    return res, runs


def _scaling_row(res: LaunchResult, run: dict[str, Any]) -> dict[str, Any]:
    """One table row of a scaling run (chapter 4)."""
    return {
        "processes": run["world_size"],
        "mode": run["mode"],
        "backend": res.backend,
        "threads/rank": run["threads"],
        "global batch": run["global_batch"],
        "step ms": run["step_median_s"] * 1e3,
        "step IQR ms": run["step_iqr_s"] * 1e3,
        "samples/s": run["samples_per_s"],
    }


def scaling_point(
    nproc: int,
    *,
    backend: str | None = None,
    per_rank_batch: int = 256,
    width: int = 256,
    steps: int = 20,
    threads: int = 1,
    mode: str = "ddp",
    timeout: float = 120.0,
) -> dict[str, Any]:
    """One launch of scaling.py: step time and throughput at `nproc` ranks, `threads` each (chapter 4)."""
    size = {"per_rank_batch": per_rank_batch, "width": width, "steps": steps}
    res, (run,) = _scaling_launch([nproc], mode, backend, timeout, threads=threads, **size)
    return {**_scaling_row(res, run), "start-up s": res.seconds_until() or float("nan")}


def measure_scaling(
    nprocs: Sequence[int] = (1, 2),
    *,
    backend: str | None = None,
    timeout: float = 120.0,
    **size: Any,
) -> ScalingResult:
    """Every process count in `nprocs` in one launch, plus speed-up and scaling efficiency (chapter 4)."""
    nprocs = list(nprocs)
    if not nprocs or not all(isinstance(n, int) and not isinstance(n, bool) for n in nprocs):
        raise ValueError(f"nprocs must be whole numbers of processes, e.g. (1, 2), got {nprocs!r}.")
    backend = check_backend(backend, max(nprocs))  # one backend for the whole sweep
    nprocs = [check_nproc(n, backend) for n in nprocs]
    res, runs = _scaling_launch(nprocs, "ddp", backend, timeout * len(nprocs), **size)
    rows = [_scaling_row(res, run) for run in runs]
    base_n, base = rows[0]["processes"], rows[0]["samples/s"]
    for row in rows:
        row["speed-up"] = row["samples/s"] / base
        row["efficiency"] = row["speed-up"] * base_n / row["processes"]
    startup = res.seconds_until() or float("nan")
    return ScalingResult("processes", rows, startup_s=startup, launch_s=res.seconds)


def plot_scaling(result: SweepResult) -> Figure:
    """Throughput (with the ideal line) and scaling efficiency against processes (chapter 4)."""
    import matplotlib.pyplot as plt

    n = result.column("processes")
    thr = result.column("samples/s")
    fig, (a, b) = plt.subplots(1, 2, figsize=(9.6, 3.6))
    a.plot(n, thr, marker="o", label="measured")
    a.plot(n, [thr[0] * k / n[0] for k in n], ls="--", color="gray", label="ideal (linear)")
    a.set(xlabel="processes (ranks)", ylabel="samples/s", title="Throughput")
    a.legend()
    b.plot(n, [100 * e for e in result.column("efficiency")], marker="o", color="C1")
    b.axhline(100, ls="--", color="gray")
    b.set(xlabel="processes (ranks)", ylabel="% of ideal", title="Scaling efficiency")
    b.set_ylim(bottom=0)
    for ax in (a, b):
        ax.set_xticks(n)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    return fig


def scaling_controls(max_nproc: int | None = None) -> dict[str, Any]:
    """ipywidgets controls for the scaling sweep: processes, batch per rank, width, steps (chapter 4)."""
    import ipywidgets as widgets

    top = max_nproc or min(4, max_processes(default_backend(2)))
    return {
        "max_processes": widgets.IntSlider(value=top, min=1, max=top, description="processes ≤"),
        "per_rank_batch": widgets.Dropdown(
            options=[32, 128, 256, 1024], value=256, description="batch/rank"
        ),
        "width": widgets.Dropdown(options=[64, 256, 1024], value=256, description="width"),
        "steps": widgets.IntSlider(value=20, min=5, max=100, step=5, description="steps"),
    }


def run_scaling(
    max_processes: int = 2,
    per_rank_batch: int = 256,
    width: int = 256,
    steps: int = 20,
    backend: str | None = None,
) -> SweepResult:
    """The widget's run function: measure_scaling over 1..max_processes ranks (chapter 4)."""
    top = positive_int(max_processes, "max_processes")
    return measure_scaling(
        range(1, top + 1),
        backend=backend,
        per_rank_batch=per_rank_batch,
        width=width,
        steps=steps,
    )
