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
"""

from __future__ import annotations

import argparse
import html
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
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


@dataclass
class Outcome:
    """What happened to one notebook."""

    path: Path
    seconds: float
    error: str = ""
    html: Path | None = None

    @property
    def ok(self) -> bool:
        return not self.error


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


def execute(path: Path, out_dir: Path, timeout: int, html_export: bool) -> Outcome:
    """Run one notebook in a fresh kernel; write the executed copy and its HTML export."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.resolve().parent)}},
        record_timing=True,
    )
    target = out_dir / label(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    kernel_log = target.with_suffix(".kernel.log")  # the kernel's own stderr (warnings, crashes)
    start = time.perf_counter()
    error = ""
    with kernel_log.open("w") as log:
        try:
            client.execute(stderr=log)
        except CellTimeoutError as exc:
            error = f"a cell ran longer than {timeout} s: {str(exc).splitlines()[0]}"
        except DeadKernelError as exc:
            error = f"the kernel died (out of memory?), see {kernel_log.name}: {exc}"
        except CellExecutionError:
            error = first_error(nb) or "a cell raised an error"
        except Exception as exc:  # a broken kernel or notebook: report it, go on with the next
            error = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    if not error and path.resolve().parent.name == "solutions":
        error = failed_check(nb)
    nbformat.write(nb, target)
    outcome = Outcome(path, seconds, error)
    if html_export:
        from nbconvert import HTMLExporter  # only here: --no-html runs without nbconvert

        body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
        outcome.html = target.with_suffix(".html")
        outcome.html.write_text(body, encoding="utf-8")
    return outcome


def summary_table(outcomes: list[Outcome], machine: str) -> str:
    """A Markdown report: the machine, then one row per notebook."""
    lines = ["# Instructor run", "", "```", machine, "```", ""]
    lines += ["| notebook | result | seconds |", "|---|---|---:|"]
    for o in outcomes:
        result = "ok" if o.ok else f"FAILED: {o.error}".replace("|", "\\|")
        lines.append(f"| {label(o.path)} | {result} | {o.seconds:.1f} |")
    total = sum(o.seconds for o in outcomes)
    failed = sum(not o.ok for o in outcomes)
    lines += ["", f"{len(outcomes)} notebooks, {failed} failed, {total:.0f} s in all."]
    return "\n".join(lines) + "\n"


def results(outcomes: list[Outcome], machine: str) -> dict:
    """The run as JSON-ready data: the machine, then one entry per notebook."""
    return {
        "machine": machine,
        "notebooks": [
            {"path": label(o.path), "ok": o.ok, "seconds": round(o.seconds, 2), "error": o.error}
            for o in outcomes
        ],
    }


def closing_line(outcomes: list[Outcome]) -> str:
    """'notebooks: N passed, M failed': the plain count line CI logs are read for."""
    failed = sum(not o.ok for o in outcomes)
    return f"notebooks: {len(outcomes) - failed} passed, {failed} failed"


def index_page(outcomes: list[Outcome], out_dir: Path, machine: str) -> str:
    """executed/index.html: the machine and a link to every HTML export."""
    rows = []
    for o in outcomes:
        link = o.html.relative_to(out_dir).as_posix() if o.html else ""
        name = f'<a href="{html.escape(link)}">{html.escape(label(o.path))}</a>' if link else ""
        result = "ok" if o.ok else "FAILED: " + html.escape(o.error)
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
    args = parser.parse_args(argv)
    if args.timeout <= 0:
        parser.error("--timeout must be a positive number of seconds")
    extra = [n for n in EXTRA if args.all or getattr(args, n)]
    notebooks = select(args.paths, extra)
    if args.device:
        os.environ["COURSE_DEVICE"] = args.device
    out_dir = Path(args.out).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    machine = describe_machine()
    print(machine, flush=True)
    print(f"running {len(notebooks)} notebook(s); outputs go to {out_dir}", flush=True)
    outcomes = []
    for path in notebooks:
        print(f"  {label(path)} ...", end=" ", flush=True)
        outcome = execute(path, out_dir, args.timeout, not args.no_html)
        outcomes.append(outcome)
        print(f"{'ok' if outcome.ok else 'FAILED'} in {outcome.seconds:.1f} s", flush=True)
        if not outcome.ok:
            print(f"    {outcome.error}", flush=True)
            if args.fail_fast:
                break
    report = summary_table(outcomes, machine)
    (out_dir / "summary.md").write_text(report, encoding="utf-8")
    (out_dir / "index.html").write_text(index_page(outcomes, out_dir, machine), encoding="utf-8")
    data = json.dumps(results(outcomes, machine), indent=1)
    (out_dir / "results.json").write_text(data + "\n", encoding="utf-8")
    print()
    print(report)
    print(f"open {out_dir / 'index.html'} to browse the executed notebooks")
    print(closing_line(outcomes), flush=True)
    return 1 if any(not o.ok for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
