"""Instructor mode: run every chapter on this machine, keep the outputs, export HTML.

    make instructor                               # the chapters, on the best device here
    make instructor RUN_ALL_ARGS="--all"          # chapters, solutions and exercises
    python tools/run_all.py --device cuda:1 notebooks/03_mixed_precision.ipynb

Each notebook runs top to bottom in a fresh kernel of this Python, in its own folder (as in
JupyterLab). The executed copy (with outputs), an HTML export and the kernel's log go under
`executed/` (git-ignored), mirroring the repository's layout, with `executed/index.html`
linking them all. A table of per-notebook run times and failures is printed and saved as
`executed/summary.md` (and as `executed/results.json` for other tools). The exit status is 1 if any notebook failed; a failed notebook is
still written, up to and including the failing cell, so you can see where it broke. A notebook
in `solutions/` also fails if one of its checks printed ❌: a solution must pass its checks.

An error that is not a cell's (the kernel died, nbclient or this runner broke) is reported with
its full traceback, in the log and in the summary. A runner that is told to stop (SIGTERM from a
deadline or a timeout, SIGINT from Ctrl-C, SIGHUP) interrupts the running cell, shuts the kernel
down, says "stopped by SIGTERM (deadline/timeout)" for that notebook and "not run" for the
rest, writes its summary and exits with 128 + the signal's number.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import html
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import nbformat
import psutil
from jupyter_core.utils import ensure_async
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = "notebooks/[0-9][0-9]_*.ipynb"
EXTRA = {"solutions": "solutions/*.ipynb", "exercises": "exercises/*.ipynb"}
DESCRIBE = (
    "from helpers.devices import describe_device, pick_device\n"
    "import torch\n"
    "print(f'torch {torch.__version__}')\n"
    "print(describe_device(pick_device()))\n"
)


#: The signals that stop a run, and what usually sends them.
STOP_SIGNALS = {
    name: why
    for name, why in (
        ("SIGTERM", "deadline/timeout"),
        ("SIGINT", "Ctrl-C"),
        ("SIGHUP", "terminal closed"),
    )
    if hasattr(signal, name)
}
#: Seconds a stopped notebook's running cell gets to end after the kernel is interrupted,
#: before the runner gives up on it and shuts the kernel down anyway.
INTERRUPT_GRACE_S = 5.0
#: Seconds a kernel gets to exit after a shutdown request, before it is killed.
SHUTDOWN_WAIT_S = 3.0


@dataclass
class Outcome:
    """What happened to one notebook: 'ok', 'failed', 'stopped' or 'not run'."""

    path: Path
    seconds: float
    error: str = ""
    html: Path | None = None
    status: str = ""
    traceback: str = ""
    #: Something worth knowing that did not fail the notebook (processes the kernel left).
    note: str = ""

    def __post_init__(self) -> None:
        self.status = self.status or ("failed" if self.error else "ok")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def result(self) -> str:
        """The result column: 'ok', 'FAILED: why', 'STOPPED: why' or 'not run: why'."""
        if self.ok:
            return f"ok; {self.note}" if self.note else "ok"
        head = {"failed": "FAILED", "stopped": "STOPPED"}.get(self.status, self.status)
        return f"{head}: {self.error}"


class Stop:
    """The first stop signal this process received, if any."""

    signum: int | None = None

    @classmethod
    def reason(cls) -> str:
        """'stopped by SIGTERM (deadline/timeout)', or '' while none came."""
        if cls.signum is None:
            return ""
        name = signal.Signals(cls.signum).name
        why = STOP_SIGNALS.get(name)
        return f"stopped by {name}" + (f" ({why})" if why else "")


def note_stop(signum: int, frame: object = None) -> None:
    """Signal handler between notebooks: remember the first stop; the main loop acts on it."""
    if Stop.signum is None:
        Stop.signum = signum


def catch_stop_signals() -> dict[int, object]:
    """Route every stop signal to note_stop (SIGTERM's default would kill us mid-write).

    Returns the handlers it replaced, for restore_signals(); outside the main thread, where
    Python cannot set handlers, it changes nothing.
    """
    previous = {}
    with contextlib.suppress(ValueError):
        for name in STOP_SIGNALS:
            sig = getattr(signal, name)
            previous[sig] = signal.signal(sig, note_stop)
    return previous


def restore_signals(previous: dict[int, object]) -> None:
    """Put back the handlers catch_stop_signals() replaced."""
    for sig, handler in previous.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


class StopAwareLoop(asyncio.SelectorEventLoop):
    """An event loop on which nbclient's own SIGINT/SIGTERM handlers are replaced by ours.

    nbclient (async_setup_kernel) answers a signal by shutting the kernel down and carrying on,
    so its next `assert self.kc is not None` fails with a bare AssertionError that looks like
    the notebook's failure (the H100 run of 2026-11-26, exercise 6). Here a stop signal
    interrupts the running cell, then the client stops; removing a handler puts note_stop back.
    """

    def __init__(self, on_stop: object) -> None:
        super().__init__()
        self.on_stop = on_stop

    def add_signal_handler(self, sig: int, callback: object, *args: object) -> None:
        if signal.Signals(sig).name in STOP_SIGNALS:
            callback, args = self.on_stop, (sig,)
        # Windows: Ctrl-C raises, as usual; outside the main thread: the caller's handlers stay
        with contextlib.suppress(NotImplementedError, ValueError, RuntimeError):
            super().add_signal_handler(sig, callback, *args)

    def remove_signal_handler(self, sig: int) -> bool:
        removed = False
        with contextlib.suppress(NotImplementedError, ValueError, RuntimeError):
            removed = super().remove_signal_handler(sig)
        main = threading.current_thread() is threading.main_thread()
        if main and signal.Signals(sig).name in STOP_SIGNALS:
            signal.signal(sig, note_stop)
        return removed


class CourseClient(NotebookClient):
    """nbclient's client that stops cleanly on a signal and leaves no process behind."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.cell_index: int | None = None
        self.task: asyncio.Task | None = None
        self.family: dict[int, psutil.Process] = {}

    def remember_family(self) -> None:
        """Note the kernel's process and its descendants, to stop any that outlive it."""
        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        with contextlib.suppress(psutil.Error, TypeError, ValueError):
            kernel = psutil.Process(pid)
            for p in (kernel, *kernel.children(recursive=True)):
                self.family.setdefault(p.pid, p)

    def stop_leftovers(self) -> list[int]:
        """Terminate, then kill, every remembered process still running; their pids."""
        alive = []
        for p in self.family.values():
            with contextlib.suppress(psutil.Error):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, still = psutil.wait_procs(alive, timeout=3.0)
        for p in still:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(still, timeout=3.0)
        return sorted(p.pid for p in alive)

    def create_kernel_manager(self):  # noqa: ANN201 - jupyter_client's KernelManager
        km = super().create_kernel_manager()
        km.shutdown_wait_time = SHUTDOWN_WAIT_S
        return km

    async def async_start_new_kernel(self, **kwargs: object) -> None:
        await super().async_start_new_kernel(**kwargs)
        self.remember_family()

    @contextlib.asynccontextmanager
    async def async_setup_kernel(self, **kwargs: object):  # noqa: ANN201 - a context manager
        async with super().async_setup_kernel(**kwargs):
            try:
                yield
            finally:
                self.remember_family()  # what the notebook started, before the kernel goes

    async def async_execute_cell(self, cell, cell_index, *args, **kwargs):  # noqa: ANN001, ANN201
        if Stop.signum is not None:
            raise asyncio.CancelledError(Stop.reason())
        self.cell_index = cell_index
        return await super().async_execute_cell(cell, cell_index, *args, **kwargs)

    def on_signal(self, signum: int) -> None:
        """The loop's handler for a stop signal: note it, then stop the notebook."""
        first = Stop.signum is None
        note_stop(signum)
        if first and self.task is not None:
            self.task.get_loop().create_task(self.stop())

    async def stop(self) -> None:
        """Interrupt the running cell; if it has not ended after a grace period, cancel."""
        self.remember_family()
        with contextlib.suppress(Exception):
            if self.km is not None and await ensure_async(self.km.is_alive()):
                await ensure_async(self.km.interrupt_kernel())
        if self.task is not None:
            done, _ = await asyncio.wait({self.task}, timeout=INTERRUPT_GRACE_S)
            if not done:
                self.task.cancel()

    def run(self, stderr: object) -> None:
        """Execute the notebook on a StopAwareLoop (what NotebookClient.execute does).

        Where an event loop already runs in this thread (run_all called from async code, or
        from a test process that used playwright's sync API), the notebook runs on its own
        loop in a thread of its own, and stop signals stay the caller's to handle.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # the usual case: no loop runs here
            return self.run_on_new_loop(stderr)
        failed: list[BaseException] = []

        def target() -> None:
            try:
                self.run_on_new_loop(stderr)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                failed.append(exc)

        worker = threading.Thread(target=target, name="run_all-notebook")
        worker.start()
        worker.join()
        if failed:
            raise failed[0]

    def run_on_new_loop(self, stderr: object) -> None:
        """Execute the notebook on a new StopAwareLoop in this thread."""
        loop = StopAwareLoop(self.on_signal)
        try:
            asyncio.set_event_loop(loop)
            self.task = loop.create_task(self.async_execute(stderr=stderr))
            loop.run_until_complete(self.task)
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            asyncio.set_event_loop(None)
            loop.close()


def label(path: Path) -> str:
    """The notebook's path relative to the repository, or as given if it lies outside."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.name


def select(paths: list[str], extra: list[str]) -> list[Path]:
    """The notebooks to run: the paths given, else the chapters plus the extra folders."""
    if paths:
        chosen = [Path(p) for p in paths]
        missing = [str(p) for p in chosen if not p.is_file() or p.suffix != ".ipynb"]
        if missing:
            raise SystemExit(f"run_all: not a notebook: {', '.join(missing)}")
        return chosen
    chosen = sorted(ROOT.glob(CHAPTERS))
    for name in extra:
        chosen += sorted(ROOT.glob(EXTRA[name]))
    if not chosen:
        raise SystemExit(f"run_all: no notebooks found under {ROOT / 'notebooks'}")
    return chosen


def describe_machine() -> str:
    """torch's version and the device the notebooks will pick, from a separate process.

    A separate process, so that this one never holds a GPU context while the kernels run.
    """
    done = subprocess.run(
        [sys.executable, "-c", DESCRIBE], capture_output=True, text=True, timeout=300
    )
    return (done.stdout or done.stderr).strip()


def first_error(nb: nbformat.NotebookNode) -> str:
    """'cell N: Name: value' for the first error output in an executed notebook."""
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "error":
                return f"cell {i}: {out.get('ename')}: {out.get('evalue')}"
    return ""


def failed_check(nb: nbformat.NotebookNode) -> str:
    """'cell N: <the line>' for the first ❌ a solutions notebook printed: its checks must pass."""
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain", "")
            line = next((ln for ln in str(text).splitlines() if "❌" in ln), None)
            if line:
                return f"cell {i}: a check of the solution failed: {line.strip()[:300]}"
    return ""


def log_tail(path: Path, lines: int = 15) -> str:
    """The last lines of a kernel's log, or '' if it has none."""
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def execute(path: Path, out_dir: Path, timeout: int, html_export: bool) -> Outcome:
    """Run one notebook in a fresh kernel; write the executed copy and its HTML export."""
    nb = nbformat.read(path, as_version=4)
    client = CourseClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.resolve().parent)}},
        record_timing=True,
        shutdown_kernel="graceful",  # the kernel's atexit handlers run (temp folders removed)
    )
    target = out_dir / label(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    kernel_log = target.with_suffix(".kernel.log")  # the kernel's own stderr (warnings, crashes)
    start = time.perf_counter()
    error, trace = "", ""
    with kernel_log.open("w") as log:
        try:
            client.run(stderr=log)
        except CellExecutionError:
            error = first_error(nb) or "a cell raised an error"
        except (Exception, asyncio.CancelledError) as exc:  # not a cell's error: say where
            trace = traceback.format_exc()
            if isinstance(exc, CellTimeoutError):
                error = f"a cell ran longer than {timeout} s: {str(exc).splitlines()[0]}"
            elif isinstance(exc, DeadKernelError):
                error = f"the kernel died (out of memory?), see {kernel_log.name}: {exc}"
            else:
                where = "nbclient or the kernel" if "nbclient" in trace else "the runner"
                error = f"{type(exc).__name__} in {where}, not in a cell: {exc}".rstrip(": ")
    seconds = time.perf_counter() - start
    leftovers = client.stop_leftovers()
    status = "failed" if error else "ok"
    if Stop.signum is not None:  # whatever the cell said, the notebook was stopped
        where = f" in cell {client.cell_index}" if client.cell_index is not None else ""
        error, status, trace = f"{Stop.reason()}{where}", "stopped", ""
    if trace and (tail := log_tail(kernel_log)):
        trace += f"\nThe kernel's log ({kernel_log.name}) ends:\n{tail}\n"
    note = ""
    if leftovers:  # in the report either way: a failure's detail, or a passing run's note
        note = f"stopped {len(leftovers)} process(es) the kernel left running: {leftovers}"
        error = f"{error}; {note}" if error else ""
        print(f"    [run_all] {note}", flush=True)
    if not error and path.resolve().parent.name == "solutions":
        error = failed_check(nb)
        status = "failed" if error else status
    nbformat.write(nb, target)
    outcome = Outcome(path, seconds, error, status=status, traceback=trace, note=note)
    if html_export and status != "stopped":
        from nbconvert import HTMLExporter  # only here: --no-html runs without nbconvert

        body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
        outcome.html = target.with_suffix(".html")
        outcome.html.write_text(body, encoding="utf-8")
    return outcome


def summary_table(outcomes: list[Outcome], machine: str) -> str:
    """A Markdown report: the machine, one row per notebook, then any runner tracebacks."""
    lines = ["# Instructor run", ""] + (["```", machine, "```", ""] if machine else [])
    lines += ["| notebook | result | seconds |", "|---|---|---:|"]
    for o in outcomes:
        result = o.result().replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {label(o.path)} | {result} | {o.seconds:.1f} |")
    lines += ["", count_line(outcomes) + "."]
    for o in outcomes:
        if o.traceback:
            fence = "````"
            while fence in o.traceback:
                fence += "`"
            lines += ["", f"Traceback of {label(o.path)} (not a cell's error):", "", fence]
            lines += [o.traceback.rstrip("\n"), fence]
    return "\n".join(lines) + "\n"


def count_line(outcomes: list[Outcome]) -> str:
    """'3 notebooks, 1 failed, 1 not run, 80 s in all; stopped by SIGTERM (deadline/timeout)'."""
    counts = {s: sum(o.status == s for o in outcomes) for s in ("failed", "stopped", "not run")}
    total = sum(o.seconds for o in outcomes)
    text = f"{len(outcomes)} notebooks, {counts['failed']} failed"
    text += "".join(f", {n} {s}" for s, n in counts.items() if n and s != "failed")
    return text + f", {total:.0f} s in all" + (f"; {Stop.reason()}" if Stop.reason() else "")


def results(outcomes: list[Outcome], machine: str) -> dict:
    """The run as JSON-ready data: the machine, then one entry per notebook."""
    return {
        "machine": machine,
        "stopped": Stop.reason(),
        "notebooks": [
            {
                "path": label(o.path),
                "ok": o.ok,
                "status": o.status,
                "seconds": round(o.seconds, 2),
                "error": o.error,
                "note": o.note,
                "traceback": o.traceback,
            }
            for o in outcomes
        ],
    }


def closing_line(outcomes: list[Outcome]) -> str:
    """'notebooks: N passed, M failed': the plain count line CI logs are read for."""
    failed = sum(o.status in ("failed", "stopped") for o in outcomes)
    skipped = sum(o.status == "not run" for o in outcomes)
    line = f"notebooks: {len(outcomes) - failed - skipped} passed, {failed} failed"
    return line + (f", {skipped} not run ({Stop.reason()})" if Stop.reason() else "")


def index_page(outcomes: list[Outcome], out_dir: Path, machine: str) -> str:
    """executed/index.html: the machine and a link to every HTML export."""
    rows = []
    for o in outcomes:
        link = o.html.relative_to(out_dir).as_posix() if o.html else ""
        name = f'<a href="{html.escape(link)}">{html.escape(label(o.path))}</a>' if link else ""
        result = html.escape(o.result())
        rows.append(f"<tr><td>{name}</td><td>{result}</td><td>{o.seconds:.1f}</td></tr>")
    return (
        "<!doctype html><meta charset='utf-8'><title>Instructor run</title>"
        f"<h1>Instructor run</h1><pre>{html.escape(machine)}</pre>"
        "<table border=1 cellpadding=4><tr><th>notebook</th><th>result</th><th>seconds</th></tr>"
        + "".join(rows)
        + "</table>\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="notebooks to run (default: every chapter)")
    parser.add_argument("--all", action="store_true", help="also solutions/ and exercises/")
    parser.add_argument("--solutions", action="store_true", help="also solutions/")
    parser.add_argument("--exercises", action="store_true", help="also exercises/")
    parser.add_argument("--out", default=str(ROOT / "executed"), help="output folder")
    parser.add_argument("--device", help="force a device, e.g. cpu, cuda:1, mps ($COURSE_DEVICE)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    parser.add_argument("--no-html", action="store_true", help="skip the HTML export")
    parser.add_argument("--fail-fast", action="store_true", help="stop at the first failure")
    parser.add_argument(
        "--results",
        help="write only the results JSON, to this file (a caller that reports, as gpu_check)",
    )
    parser.add_argument(
        "--no-describe",
        action="store_true",
        help="skip describing torch and the device (a caller that did it already)",
    )
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    extra = [n for n in EXTRA if args.all or getattr(args, n)]
    notebooks = select(args.paths, extra)
    if args.device:
        os.environ["COURSE_DEVICE"] = args.device
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    Stop.signum = None
    previous = catch_stop_signals()
    try:
        return run(notebooks, out_dir, args)
    finally:
        restore_signals(previous)


def run(notebooks: list[Path], out_dir: Path, args: argparse.Namespace) -> int:
    """Run the notebooks one by one, then write the reports; the exit status."""
    machine = "" if args.no_describe else describe_machine()
    print(machine, flush=True)
    print(f"running {len(notebooks)} notebook(s); outputs go to {out_dir}", flush=True)
    outcomes = []
    for path in notebooks:
        if Stop.signum is not None:
            why = f"not run: the run was {Stop.reason()}"
            outcomes.append(Outcome(path, 0.0, why.removeprefix("not run: "), status="not run"))
            continue
        print(f"  {label(path)} ...", end=" ", flush=True)
        try:
            outcome = execute(path, out_dir, args.timeout, not args.no_html)
        except Exception as exc:  # noqa: BLE001 - the runner broke: report it, go on
            trace = traceback.format_exc()
            error = f"{type(exc).__name__} in the runner, not in a cell: {exc}"
            outcome = Outcome(path, 0.0, error, traceback=trace)
        outcomes.append(outcome)
        print(f"{outcome.status.upper()} in {outcome.seconds:.1f} s", flush=True)
        if not outcome.ok:
            print(f"    {outcome.error}", flush=True)
            if outcome.traceback:
                print("    " + outcome.traceback.rstrip("\n").replace("\n", "\n    "), flush=True)
            if args.fail_fast:
                break
    report = summary_table(outcomes, machine)
    data = json.dumps(results(outcomes, machine), indent=1)
    if args.results:  # the caller reports: no summary or index of its own beside the others'
        Path(args.results).write_text(data + "\n", encoding="utf-8")
        print()
        print(report)
    else:
        (out_dir / "summary.md").write_text(report, encoding="utf-8")
        (out_dir / "index.html").write_text(
            index_page(outcomes, out_dir, machine), encoding="utf-8"
        )
        (out_dir / "results.json").write_text(data + "\n", encoding="utf-8")
        print()
        print(report)
        print(f"open {out_dir / 'index.html'} to browse the executed notebooks")
    print(closing_line(outcomes), flush=True)
    if Stop.signum is not None:
        return 128 + Stop.signum
    return 1 if any(not o.ok for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
