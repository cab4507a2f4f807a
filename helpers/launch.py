"""Running torchrun scripts from a notebook: checked, loopback only, timed out, cleaned up (chapter 4)."""

from __future__ import annotations

import ast
import atexit
import contextlib
import os
import queue
import re
import shutil
import stat
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

from helpers.i18n import tr, tr_mark
from helpers.processes import ProcessFamily, cpu_cores, gpu_count
from helpers.scripts.common import BACKEND_ENV, BACKENDS, JOB_MARKER, PG_FILE_ENV, READY_MARKER
from helpers.units import Printed
from helpers.validate import positive_int, positive_seconds

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
_NOT_SCRIPTS = {"__init__", "common"}


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
        tr(
            "No script {name!r}. Give the path of an existing .py file, or one of the course's "
            "scripts: {scripts}."
        ).format(name=text, scripts=", ".join(available_scripts()))
    )


def script_source(name: str | Path, function: str | None = None) -> str:
    """The source of a shipped script, or of one function in it, to show in a notebook (chapter 4)."""
    text = script_path(name).read_text(encoding="utf-8")
    if function is None:
        return text
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == function:
            return ast.get_source_segment(text, node) or ""
    raise LaunchError(
        tr("{file} has no function or class named {function!r}.").format(
            file=script_path(name).name, function=function
        )
    )


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


def one_launch_args(jobs: Sequence[tuple[str, Sequence[Any]]]) -> list[str]:
    """[('ddp_train', ['--out', d]), ...] -> the arguments of one_launch.py: jobs joined by --then (chapter 4)."""
    if not jobs:
        raise LaunchError(
            tr("No jobs: give [(script name, [its options]), ...], one pair per job.")
        )
    words: list[str] = []
    for name, options in jobs:
        if isinstance(name, (list, tuple)) or isinstance(options, (str, bytes)):
            raise LaunchError(
                tr(
                    "Each job is a pair (script name, [its options]), e.g. ('ddp_train', ['--out', "
                    "folder]); got {job!r}."
                ).format(job=(name, options))
            )
        words += ["--then", str(name), *[str(o) for o in options]]
    return words[1:]


def max_processes(backend: str) -> int:
    """The most ranks one machine may start: one per GPU on NCCL; max(2, cores) on gloo (chapter 4)."""
    backend = check_backend(backend)
    return gpu_count() if backend == "nccl" else max(2, cpu_cores())


def check_backend(backend: str | None, nproc: int = 2) -> str:
    """A valid backend name ('gloo' or 'nccl'); None picks NCCL with one GPU per rank, else gloo (chapter 4)."""
    if backend is None:
        return "nccl" if gpu_count() >= max(1, nproc) else "gloo"
    name = str(backend).strip().lower()
    if name not in BACKENDS:
        raise LaunchError(
            tr(
                "Unknown backend {backend!r}. Use 'gloo' (CPU, works everywhere), 'nccl' "
                "(NVIDIA/AMD GPUs, one per rank), or None to choose from the device."
            ).format(backend=backend)
        )
    if name == "nccl" and gpu_count() == 0:
        raise LaunchError(
            tr(
                "The 'nccl' backend needs CUDA (or ROCm) GPUs, and torch sees none here. "
                "Use backend='gloo', which runs the same scripts on CPU processes."
            )
        )
    return name


#: Ranks a tiny gloo job (an exercise check) may start on any machine: an odd world size on 2 cores.
TINY_JOB_RANKS = 3


def check_nproc(nproc: Any, backend: str, tiny_job: bool = False) -> int:
    """`nproc` as an int between 1 and max_processes(backend) (TINY_JOB_RANKS for a tiny gloo job), else a LaunchError (chapter 4)."""
    try:
        n = positive_int(nproc, "nproc")
    except ValueError as exc:
        raise LaunchError(
            tr("{error} It is the number of processes (ranks) to start.").format(error=exc)
        ) from None
    limit = max_processes(backend)
    if tiny_job and backend == "gloo":
        limit = max(limit, TINY_JOB_RANKS)
    if n > limit:
        if backend == "nccl":
            text = tr(
                "nproc={n} is more than this machine allows ({limit}): nccl needs one GPU per "
                "rank and torch sees {gpus}. Use nproc <= {limit}, or backend='gloo'."
            )
        else:
            text = tr(
                "nproc={n} is more than this machine allows ({limit}): gloo runs one CPU process "
                "per rank and this machine has {cores} core(s). Use nproc <= {limit}."
            )
        raise LaunchError(text.format(n=n, limit=limit, gpus=gpu_count(), cores=cpu_cores()))
    return n


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
            tr(
                "Give exactly one of rdzv_endpoint='HOST:PORT' (a TCP rendezvous, needed across "
                "machines) or rdzv_dir=FOLDER (one machine: the rendezvous is a file, no port opens)."
            )
        )
    endpoint = rdzv_endpoint if rdzv_dir is None else Path(rdzv_dir) / "rendezvous"
    head = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}"]
    ranks = [f"--nproc-per-node={nproc}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}"]
    if rdzv_dir is not None:  # one machine: the store is a file, the agent binds to loopback
        ranks += ["--rdzv-conf=store_type=file", "--local-addr=127.0.0.1"]
        # torchrun's per-rank error files, which it would put in a torchelastic_* folder of
        # the system temp folder and leave there, go to the launch's own folder instead
        ranks += [f"--log-dir={Path(rdzv_dir) / 'torchrun_logs'}"]
    tail = [f"--rdzv-id={rdzv_id or uuid.uuid4().hex[:12]}", f"--max-restarts={max_restarts}"]
    return [*head, *ranks, *tail, str(script), *[str(a) for a in args]]


#: The variables that set a process's compute threads (OpenMP, MKL, OpenBLAS), chapter 4.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def worker_env(
    backend: str, nproc: int, threads: int | None = None, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The environment for torchrun and its ranks: backend, threads per rank, loopback only (chapter 4)."""
    env = {**os.environ, BACKEND_ENV: backend, "PYTHONUNBUFFERED": "1"}
    # every thread-count variable torch or its BLAS reads: torch takes MKL_NUM_THREADS over
    # OMP_NUM_THREADS, so an MKL_NUM_THREADS=5 left in the parent gave each rank 5 threads
    count = str(threads or max(1, cpu_cores() // nproc))
    env.update({var: count for var in THREAD_VARS})
    if os.name == "nt":  # torch's Windows wheels have no libuv TCPStore
        env.setdefault("USE_LIBUV", "0")
    # keep gloo's and NCCL's own sockets on the interface that holds 127.0.0.1 ('lo', 'lo0')
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == "127.0.0.1" for a in addrs):
            env.setdefault("GLOO_SOCKET_IFNAME", name)
            env.setdefault("NCCL_SOCKET_IFNAME", name)
            break
    env.update(extra or {})
    return env


def file_rendezvous_env(rdzv_dir: str | Path) -> dict[str, str]:
    """Environment for one machine with no TCP store: the ranks meet in a file in rdzv_dir (chapter 4)."""
    return {
        PG_FILE_ENV: str(Path(rdzv_dir) / "process_group"),
        # without this, torchrun would host a TCPStore for the ranks, listening on every interface
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
    }


@dataclass
class LaunchResult(Printed):
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

    def seconds_until(self, marker: str = READY_MARKER) -> float | None:
        """Seconds from the launch to the first line containing `marker`, or None (chapter 4)."""
        return next((t for line, t in zip(self.lines, self.line_times) if marker in line), None)

    def rank_lines(self, rank: int, job: str | None = None) -> list[str]:
        """The lines a script (or one job of a one_launch.py run) printed as '[rank N] ...' (chapter 4)."""
        lines = self.lines if job is None else self.job_lines(job)
        return [ln for ln in lines if ln.startswith(f"[rank {rank}]")]

    def failures(self) -> list[tuple[int, int]]:
        """(local rank, exit code) of each failure torchrun logged, in order, restarts included (chapter 4)."""
        return [(int(m[2]), int(m[1])) for ln in self.lines if (m := _FAILED.search(ln))]

    def job_lines(self, job: str) -> list[str]:
        """The lines printed during one job of a one_launch.py run, its marker excluded (chapter 4)."""
        marker = f"{JOB_MARKER} {job}"
        if marker not in self.lines:
            raise LaunchError(
                tr("No job {job!r} in this launch: its jobs were {jobs}.").format(
                    job=job, jobs=self.jobs()
                )
            )
        rest = self.lines[self.lines.index(marker) + 1 :]
        end = next((i for i, ln in enumerate(rest) if ln.startswith(JOB_MARKER)), len(rest))
        return rest[:end]

    def jobs(self) -> list[str]:
        """The jobs a one_launch.py run started, in order (chapter 4)."""
        return [
            ln.removeprefix(JOB_MARKER).strip() for ln in self.lines if ln.startswith(JOB_MARKER)
        ]

    def __str__(self) -> str:
        text = (
            tr(
                "torchrun, {nproc} x {backend}: ok, exit code {code}, {seconds:.1f} s, {n} output lines"
            )
            if self.ok
            else tr(
                "torchrun, {nproc} x {backend}: FAILED, exit code {code}, {seconds:.1f} s, "
                "{n} output lines"
            )
        )
        return text.format(
            nproc=self.nproc,
            backend=self.backend,
            code=self.returncode,
            seconds=self.seconds,
            n=len(self.lines),
        ) + (f"\n{self.message}" if self.message else "")


# torchrun's agent logs the first failure of each attempt as "failed (exitcode: 1) local_rank: 0 ..."
_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
_ROOT_CAUSE = "Root Cause (first observed failure):"
# each failure in torchrun's report: "rank : 1 (local_rank: 1)" then "exitcode : 3 (pid: 42)"
_REPORT_ENTRY = re.compile(
    r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", re.M
)
_EXC_LINE = re.compile(r"^(?:\[rank ?(\d+)\]:?\s*)?([A-Za-z_][\w.]*(?:Error|Exception|Exit)\b.*)$")
_STOPPED = (-15, -9)  # SIGTERM, SIGKILL: how torchrun stops the ranks still running
# what a rank says when it did not break but lost the one that did
_LOST_PEER = re.compile(
    r"closed by peer|reset by peer|broken pipe|timed out|timeout|aborted", re.IGNORECASE
)


def _report_failures(lines: list[str]) -> list[tuple[str, int]]:
    """(rank, exit code) of each failure in torchrun's final report, its root cause first (chapter 4)."""
    text = "\n".join(lines)
    if _ROOT_CAUSE not in text:
        return []
    before, _, root = text.rpartition(_ROOT_CAUSE)
    others = before.rpartition("Failures:")[2]
    found = [(m[1], int(m[2])) for part in (root, others) for m in _REPORT_ENTRY.finditer(part)]
    return list(dict.fromkeys(found))  # root cause first, each rank once


#: How a failure message names one rank's failure, by what is known of its order (_said).
_SAID = {
    "": tr_mark("rank {rank} (exit code {code}) {how}"),
    "failed": tr_mark("rank {rank} failed (exit code {code}) {how}"),
    "failed first": tr_mark("rank {rank} failed first (exit code {code}) {how}"),
    "most likely failed first": tr_mark(
        "rank {rank} most likely failed first (exit code {code}) {how}"
    ),
}


def _said(rank: str, code: int, errors: dict[str | None, str], verb: str = "") -> str:
    """'rank 1 VERB (exit code 3) with ITS ERROR' for a failure message, VERB a key of _SAID (chapter 4)."""
    why = errors.get(rank)
    how = (
        tr("with {error}").format(error=why)
        if why
        else tr("without a Python traceback (it crashed, was killed, or called os._exit)")
    )
    return tr(_SAID[verb]).format(rank=rank, code=code, how=how)


def explain_failure(result: LaunchResult, timeout: float) -> str:
    """One clear paragraph on why a launch failed, read from torchrun's report (chapter 4)."""
    n = len(result.killed_pids)
    if result.interrupted:
        return tr(
            "Interrupted after {seconds:.1f} s: killed torchrun and its workers ({n} processes)."
        ).format(seconds=result.seconds, n=n)
    if result.timed_out:
        return tr(
            "Stopped at the {timeout:g} s timeout: the job had not finished, so torchrun and its "
            "workers ({n} processes) were killed. A rank may be waiting for a peer that is gone "
            "or stuck; read the output above, or pass a larger timeout= if the job is just slow."
        ).format(timeout=timeout, n=n)
    head = tr("torchrun exited with code {code} after {seconds:.1f} s: ").format(
        code=result.returncode, seconds=result.seconds
    )
    tail = tr(" torchrun stopped the remaining ranks; the full report is above.")
    found = [m.groups() for ln in result.lines if (m := _EXC_LINE.match(ln.strip()))]
    errors: dict[str | None, str] = {
        r: e if len(e) <= 160 else e[:159] + "…" for r, e in found if "ChildFailedError" not in e
    }  # the last error each rank printed
    failed = _report_failures(result.lines)
    if not failed:
        return head + tr("a rank failed.") + tail

    # ranks that exited by themselves; torchrun's "first observed failure" is only the earliest
    # to the whole second, and a rank that lost its peer fails a moment after the one that broke
    own = [(r, c) for r, c in failed if c not in _STOPPED] or failed[:1]
    if len(own) == 1:
        rank, code = own[0]
        others = [f"rank {r}: {e}" for r, e in errors.items() if r is not None and r != rank]
        then = (
            tr(" The others then lost their peer ({first}).").format(first=others[0])
            if others
            else ""
        )
        said = tr("{failures}.").format(failures=_said(rank, code, errors, "failed first"))
        return head + said + then + tail
    broke = [(r, c) for r, c in own if not _LOST_PEER.search(errors.get(r, ""))]
    if len(broke) == 1:
        rank, code = broke[0]
        lost = tr("; ").join(_said(r, c, errors) for r, c in own if r != rank)
        who = tr("{first}; the others then lost their peer: {lost}.").format(
            first=_said(rank, code, errors, "most likely failed first"), lost=lost
        )
    else:
        who = tr("{failures}.").format(
            failures=tr("; ").join(_said(r, c, errors, "failed") for r, c in own)
        )
    names = tr("{some} and {last}").format(some=", ".join(r for r, _ in own[:-1]), last=own[-1][0])
    return (
        head
        + tr(
            "ranks {names} each failed before torchrun looked. {who} torchrun's report names "
            "rank {first} as the first observed failure, but it times failures to the whole "
            "second, so it cannot order the ones within a second."
        ).format(names=names, who=who, first=failed[0][0])
        + tail
    )


class _HideLauncherTraceback:
    """Echo filter: drop torchrun's own Python traceback, keep the ranks' and its report (chapter 4)."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say, self.held, self.hiding = say, None, False

    def __call__(self, line: str) -> None:
        held, self.held = self.held, None
        if self.hiding or (held and "<frozen runpy>" in line):  # only torchrun runs `-m`
            final = line.startswith("torch.distributed.elastic.multiprocessing.errors.")
            self.hiding = not (final or line.startswith("====="))  # until its report
            if not self.hiding:
                self.say(tr("(torchrun's own traceback is hidden; its report follows)"))
            if self.hiding or final:
                return
        elif held:
            self.say(held)
        if line.strip() == "Traceback (most recent call last):":
            self.held = line
        else:
            self.say(line)


def _stream(
    family: ProcessFamily, result: LaunchResult, timeout: float, say: Callable[[str], None]
) -> None:
    """Echo and keep the output until torchrun exits or `timeout` passes (chapter 4)."""
    start = time.perf_counter()
    pipe: queue.Queue = queue.Queue()

    def read() -> None:  # in a thread: torchrun's lines into the queue, then a None at the end
        try:
            for line in iter(family.proc.stdout.readline, ""):
                pipe.put(line.rstrip("\n"))
        finally:
            pipe.put(None)

    threading.Thread(target=read, daemon=True).start()
    every = 0.05 if family.watch_sockets else 0.25  # s between looks at the tree; sockets are brief
    last_track, eof = 0.0, False
    while not (eof and family.proc.poll() is not None):
        now = time.perf_counter()
        if now - start > timeout:
            result.timed_out = True
            return
        if now - last_track > every:
            family.track()
            last_track = now
        try:  # after the end of output, this only waits for torchrun to exit
            line = pipe.get(timeout=min(0.1, every))
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
    try:
        positive_seconds(timeout, "timeout")
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise LaunchError(
            tr("max_restarts must be a whole number >= 0, got {value!r}.").format(
                value=max_restarts
            )
        )
    if callable(echo):
        say = echo
    else:  # the notebook, with torchrun's own traceback hidden; or nowhere
        say = _HideLauncherTraceback((lambda s: print(s, flush=True)) if echo else (lambda s: None))
    rdzv_dir = Path(tempfile.mkdtemp(prefix="course_ch04_rdzv_"))
    command = torchrun_command(path, nproc, args, rdzv_dir=rdzv_dir, max_restarts=max_restarts)
    result = LaunchResult(command=command, nproc=nproc, backend=backend)
    start = time.perf_counter()
    extra = {**file_rendezvous_env(rdzv_dir), **(env or {})}
    family = ProcessFamily(command, worker_env(backend, nproc, threads, extra), watch_sockets)
    try:
        _stream(family, result, timeout, say)
    except KeyboardInterrupt:
        result.interrupted = True
        raise
    finally:
        result.seconds = time.perf_counter() - start
        result.returncode, result.killed_pids = family.stop(result.timed_out or result.interrupted)
        result.child_pids, result.listening = sorted(family.seen), sorted(family.listening)
        shutil.rmtree(rdzv_dir, ignore_errors=True)
        if not result.ok:
            result.message = explain_failure(result, timeout)
            say(f"❌ {result.message}")
    if check and not result.ok:
        raise LaunchError(result.message)
    return result


def new_run_dir(name: str = "run") -> Path:
    """A fresh temporary folder for a launch's results, removed at exit; also removes this user's run folders over a day old (chapter 4)."""
    # atexit misses killed kernels (nbval, a closed tab); a running launch's writes renew the mtime
    uid = os.getuid() if hasattr(os, "getuid") else None
    for old in Path(tempfile.gettempdir()).glob("course_ch04_*"):
        with contextlib.suppress(OSError):
            st = old.lstat()  # a symlink is not followed, nor removed
            if stat.S_ISDIR(st.st_mode) and uid in (None, st.st_uid):
                if time.time() - st.st_mtime > 24 * 3600:
                    shutil.rmtree(old)
    out = Path(tempfile.mkdtemp(prefix=f"course_ch04_{name}_"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    return out


def read_results(out: str | Path, world_size: int | None = None) -> list[dict[str, Any]]:
    """Load OUT/rank<r>.pt of every rank, in rank order, with weights_only=True (chapter 4)."""
    out = Path(out)
    files = sorted(out.glob("rank*.pt"), key=lambda p: int(p.stem.removeprefix("rank")))
    if not files:
        raise LaunchError(
            tr(
                "No results in {out}: the script did not get as far as writing them. "
                "Read its output for the error."
            ).format(out=out)
        )
    if world_size is not None and len(files) != world_size:
        raise LaunchError(
            tr("Expected {want} rank files in {out}, found {found}.").format(
                want=world_size, out=out, found=len(files)
            )
        )
    return [torch.load(f, weights_only=True) for f in files]
