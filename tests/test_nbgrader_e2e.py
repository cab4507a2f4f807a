"""A class graded end to end with the real nbgrader command line (issue 34).

One English chapter (6, profiling) and one Chinese (1, devices), whose checks run in seconds
on a CPU: `make assignments` (tools/assignments.py), `nbgrader generate_assignment`,
`release_assignment`, four students who `fetch_assignment` and `submit` through an exchange
folder on this machine, one more route in through `zip_collect` (a notebook saved by Colab,
from the repository's exercise notebook, in an LMS download), `collect`, `autograde`,
`generate_feedback` and `export` (tools/course_nbgrader.py's per-exercise CSV).

The students: alice answers everything right; bob (via Colab and the LMS) gets some wrong and
leaves one untouched; carol edits test cells, redefines a checker and monkeypatches the
checkers' modules; dave's code never returns in one exercise (in chapter 6 inside his function,
so the check cell is interrupted; in chapter 1 at his answer cell's top level, deaf to the
interrupt, so the kernel must be restarted). The CSV must hold the points each one's answers
deserve, and the feedback the failed checks' hints, in the assignment's language. The two
chapters run side by side, each in its own course folder, in a temporary folder; nothing
listens on the network.
"""

from __future__ import annotations

import csv
import html
import json
import os
import re
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("nbgrader", reason="the teaching extra: pip install -e .[teach]")

import assignments  # noqa: E402 - tools/, after the skip

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
#: A cell that runs longer is interrupted (the course folder says 60 s; its checks take < 5 s).
TEST_CELL_TIMEOUT = 20
#: Each chapter's autograde of its four students must take less than this, hang included.
AUTOGRADE_BUDGET_S = 120


@dataclass
class Chapter:
    """One assignment and what its four students hand in (exercise number -> answer body)."""

    assignment: str
    notebook: str
    exercises: str  # the repository's exercise notebook, what a Colab student starts from
    language: str
    bob: dict[int, str]  # wrong answers; exercises not listed are right, None: untouched
    carol_right: int  # the one exercise carol really solves
    dave_hang: int  # the exercise whose code never returns
    dave_hang_in_answer_cell: bool  # and deaf to interrupts: the kernel must be restarted
    expected: dict[str, list[float]] = field(default_factory=dict)
    flagged: set[str] = field(default_factory=set)


CH06 = Chapter(
    assignment="ch06",
    notebook="06_profiling_exercises",
    exercises="exercises/06_profiling_exercises.ipynb",
    language="en",
    bob={
        1: "    start = time.perf_counter()\n    fn()\n    sync()\n    return time.perf_counter() - start",
        2: "    return max(prof.key_averages(), key=lambda row: row.cpu_time_total).key",
        4: "",  # untouched: ⏳
    },
    carol_right=3,
    dave_hang=1,  # in the function: the check cell hangs
    dave_hang_in_answer_cell=False,
    expected={
        "alice": [1, 1, 1, 1],
        "bob": [0, 0, 1, 0],
        "carol": [0, 0, 1, 0],
        "dave": [0, 1, 1, 1],
    },
    flagged={"carol"},
)
CH01_ZH = Chapter(
    assignment="ch01_zh",
    notebook="01_devices_exercises",
    exercises="zh/exercises/01_devices_exercises.ipynb",
    language="zh_CN",
    bob={
        2: "    return t.to(device)",
        4: "    return m * k * n / result.median / 1e9",
    },
    carol_right=1,
    dave_hang=5,  # at the answer cell's top level, SIGINT ignored: the answer cell hangs
    dave_hang_in_answer_cell=True,
    expected={
        "alice": [1, 1, 1, 1, 1],
        "bob": [1, 0, 1, 0, 1],
        "carol": [1, 0, 0, 0, 0],
        "dave": [1, 1, 1, 1, 0],
    },
    flagged={"carol", "dave"},  # dave's cell handles SIGINT: worth a human look too
)
CHAPTERS = (CH06, CH01_ZH)


def env() -> dict[str, str]:
    """The environment of every nbgrader command: this venv first (nbgrader runs `alembic`)."""
    out = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    out["PATH"] = f"{BIN}{os.pathsep}{out.get('PATH', '')}"
    out.pop("PYTHONPATH", None)  # the README's setup: the course comes from the venv
    return out


def run_nbgrader(*args: str, cwd: Path, timeout: float = 300) -> tuple[int, str]:
    """Run `nbgrader ARGS` in `cwd`: its exit status and log (nbgrader logs to stderr)."""
    run = subprocess.run(
        [str(BIN / "nbgrader"), *args],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return run.returncode, run.stdout + run.stderr


def nbgrader(*args: str, cwd: Path, timeout: float = 300) -> str:
    """Run `nbgrader ARGS` in `cwd`; its log. Fails on a non-zero exit."""
    returncode, log = run_nbgrader(*args, cwd=cwd, timeout=timeout)
    assert returncode == 0, f"nbgrader {' '.join(args)} failed:\n{log[-6000:]}"
    return log


def answer_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    """The cells a student writes in, in order (the `# YOUR CODE HERE` stubs)."""
    return [c for c in nb.cells if c.cell_type == "code" and "YOUR CODE HERE" in c.source]


def solved(source: str) -> str:
    """An answer cell of the source assignment as a student who solved it writes it."""
    out, skip = [], False
    for line in source.split("\n"):
        mark = line.strip()
        if mark == "### BEGIN STUB":
            skip = True
        elif mark == "### END STUB":
            skip = False
        elif not skip and mark not in ("### BEGIN SOLUTION", "### END SOLUTION"):
            out.append(line)
    return "\n".join(out)


def filled(stub: str, body: str) -> str:
    """An answer cell with its stub (the YOUR CODE HERE line and the next) replaced by `body`."""
    lines = stub.split("\n")
    at = next(i for i, line in enumerate(lines) if "YOUR CODE HERE" in line)
    return "\n".join(lines[:at] + body.split("\n") + lines[at + 2 :])


def answers_of(chapter: Chapter, student: str, solutions: list[str], stubs: list[str]) -> list[str]:
    """What `student` writes in each answer cell."""
    out = []
    for n, (right, stub) in enumerate(zip(solutions, stubs), start=1):
        if student == "alice":
            out.append(right)
        elif student == "bob":
            body = chapter.bob.get(n)
            out.append(right if body is None else (stub if body == "" else filled(stub, body)))
        elif student == "carol":
            out.append(right if n == chapter.carol_right else stub)
        elif n != chapter.dave_hang:
            out.append(right)
        elif chapter.dave_hang_in_answer_cell:
            out.append(
                "import signal\n\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                "while True:  # never returns, not even when interrupted\n    pass\n\n" + right
            )
        else:
            out.append(filled(stub, "    while True:  # never returns\n        pass"))
    return out


def carol_tampers(nb: nbformat.NotebookNode, chapter: Chapter) -> None:
    """Edit every test cell to print a tick, redefine and monkeypatch the checkers."""
    tests = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
    module = f"helpers.checks.ch{chapter.assignment[2:4]}"
    names = [assignments.checker_called(cell.source) for cell in tests]
    for cell, name in zip(tests, names):
        cell.source = f'print("✅ {name}: correct.")'
    first = answer_cells(nb)[0]
    first.source += "\n\n" + "\n".join(f"{name} = lambda *a: None" for name in names)
    extra = nbformat.v4.new_code_cell(
        f"import {module} as mine\nimport helpers.checks as framework\n\n"
        "for name in dir(mine):\n"
        "    if name.startswith('check_'):\n"
        "        setattr(mine, name, lambda *a, **k: framework.CheckResult(name, 'pass'))\n"
        "framework.run_check = lambda title, probes: framework.CheckResult(title, 'pass')"
    )
    nb.cells.insert(nb.cells.index(first) + 1, extra)


def saved_by_jupyterlab(nb: nbformat.NotebookNode) -> str:
    """The notebook as JupyterLab 4 saves it after a run: ids, outputs, full language_info."""
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
        "name": "python3",
    }
    nb.metadata["language_info"] = {
        "codemirror_mode": {"name": "ipython", "version": 3},
        "file_extension": ".py",
        "mimetype": "text/x-python",
        "name": "python",
        "nbconvert_exporter": "python",
        "pygments_lexer": "ipython3",
        "version": "3.11.7",
    }
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            count += 1
            cell.execution_count = count
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="ran\n")]
            cell.metadata["tags"] = []
        else:
            cell.metadata["jp-MarkdownHeadingCollapsed"] = False
    nb.nbformat_minor = 5
    return nbformat.writes(nb)


def saved_by_colab(nb: nbformat.NotebookNode) -> str:
    """The notebook as Colab's File > Download .ipynb writes it (nbformat 4.0, no cell ids,
    Colab's cell metadata and outputs, widget state without the 'state' key nbformat wants)."""
    cells = []
    for n, cell in enumerate(nb.cells):
        out = {
            "cell_type": cell.cell_type,
            "metadata": {"id": f"c{n:02d}Xq9LmPzT"},
            "source": cell.source.splitlines(keepends=True),
        }
        if cell.cell_type == "code":
            out["metadata"]["colab"] = {"base_uri": "https://localhost:8080/"}
            out["metadata"]["outputId"] = f"{n:04d}-ab12-cd34"
            out["execution_count"] = n
            out["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["ran\n"]}]
            if n == 2:
                out["outputs"].append(
                    {
                        "output_type": "display_data",
                        "metadata": {},
                        "data": {
                            "text/plain": ["FloatProgress(value=0.0)"],
                            "application/vnd.jupyter.widget-view+json": {
                                "model_id": "5f0e8c2a41b94f0a9d6e3c1b2a4d6e8f",
                                "version_major": 2,
                                "version_minor": 0,
                            },
                        },
                    }
                )
        cells.append(out)
    doc = {
        "nbformat": 4,
        "nbformat_minor": 0,
        "metadata": {
            "colab": {"provenance": [], "gpuType": "T4", "name": "exercises.ipynb"},
            "kernelspec": {"name": "python3", "display_name": "Python 3"},
            "language_info": {"name": "python"},
            "accelerator": "GPU",
            "widgets": {
                "application/vnd.jupyter.widget-state+json": {
                    "5f0e8c2a41b94f0a9d6e3c1b2a4d6e8f": {
                        "model_module": "@jupyter-widgets/controls",
                        "model_name": "FloatProgressModel",
                        "model_module_version": "1.5.0",
                        "state": {"value": 0.0, "max": 1.0},
                    }
                }
            },
        },
        "cells": cells,
    }
    return json.dumps(doc, ensure_ascii=False, indent=2)


def hand_in(chapter: Chapter, course: Path, base: Path, common: list[str]) -> None:
    """Release the assignment; alice, carol and dave fetch and submit it through the exchange
    (saved by JupyterLab 4), bob's Colab notebook arrives in an LMS download; collect both."""
    source = nbformat.read(course / "source" / chapter.assignment / f"{chapter.notebook}.ipynb", 4)
    solutions = [solved(c.source) for c in source.cells if c.metadata["nbgrader"]["solution"]]
    nbgrader("release_assignment", chapter.assignment, *common, cwd=course)
    for student in ("alice", "carol", "dave"):
        home = base / "students" / student
        home.mkdir(parents=True, exist_ok=True)
        nbgrader("fetch_assignment", chapter.assignment, *common, cwd=home)
        path = home / chapter.assignment / f"{chapter.notebook}.ipynb"
        nb = nbformat.read(path, 4)
        cells = answer_cells(nb)
        for cell, text in zip(
            cells, answers_of(chapter, student, solutions, [c.source for c in cells])
        ):
            cell.source = text
        if student == "carol":
            carol_tampers(nb, chapter)
        path.write_text(saved_by_jupyterlab(nb), encoding="utf-8")
        nbgrader("submit", chapter.assignment, f"--student={student}", *common, cwd=home)
    nbgrader("collect", chapter.assignment, *common, cwd=course)
    colab = nbformat.read(ROOT / chapter.exercises, 4)  # bob: the repository's notebook in Colab
    cells = answer_cells(colab)
    for cell, text in zip(cells, answers_of(chapter, "bob", solutions, [c.source for c in cells])):
        cell.source = text
    archive = course / "downloaded" / chapter.assignment / "archive"
    archive.mkdir(parents=True)
    with zipfile.ZipFile(archive / "submissions.zip", "w") as zf:
        zf.writestr(f"bob_Copy of {chapter.notebook}.ipynb", saved_by_colab(colab))
    nbgrader("zip_collect", chapter.assignment, cwd=course)


def run_class(chapter: Chapter, base: Path) -> dict:
    """One chapter's class from an empty folder to its CSV; the rows and the autograde time."""
    course, exchange = base / "classroom", base / "exchange"
    assignments.write_course(course, only=chapter.notebook[:2], languages=(chapter.language,))
    common = [
        f"--Exchange.root={exchange}",
        f"--Exchange.cache={base / 'exchange-cache'}",  # not ~/.local/share/jupyter
        "--CourseDirectory.course_id=pytorch-gpu-course",
    ]
    nbgrader("generate_assignment", chapter.assignment, cwd=course)
    hand_in(chapter, course, base, common)
    start = time.perf_counter()
    log = nbgrader(
        "autograde",
        chapter.assignment,
        f"--Execute.timeout={TEST_CELL_TIMEOUT}",
        cwd=course,
        timeout=600,
    )
    seconds = time.perf_counter() - start
    print(f"{chapter.assignment}: autograde of 4 students took {seconds:.1f} s")
    (base / "autograde.log").write_text(log, encoding="utf-8")
    nbgrader("generate_feedback", chapter.assignment, cwd=course)
    nbgrader("export", "--to=grades.csv", cwd=course)
    with open(course / "grades.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    return {"course": course, "rows": rows, "seconds": seconds, "log": log}


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Both chapters' classes, side by side (one core each), each in its own course folder."""
    bases = {c.assignment: tmp_path_factory.mktemp(c.assignment) for c in CHAPTERS}
    config = tmp_path_factory.mktemp("jupyter-config")  # an instructor's ~/.jupyter stays out
    with pytest.MonkeyPatch.context() as mp, ThreadPoolExecutor(len(CHAPTERS)) as pool:
        mp.setenv("JUPYTER_CONFIG_DIR", str(config))
        futures = {c.assignment: pool.submit(run_class, c, bases[c.assignment]) for c in CHAPTERS}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.assignment for c in CHAPTERS])
def test_the_csv_holds_the_points_each_student_deserves(graded: dict, chapter: Chapter) -> None:
    result = graded[chapter.assignment]
    rows = [r for r in result["rows"] if r["assignment"] == chapter.assignment]
    got: dict[str, list[float]] = {}
    for row in rows:
        assert row["notebook"] == chapter.notebook and float(row["max_points"]) == 1.0, row
        got.setdefault(row["student"], []).append(float(row["points"]))
    assert got == chapter.expected, (
        f"{chapter.assignment}: points per exercise, by student (alice right, bob partly wrong "
        f"via Colab, carol tampering, dave hanging); autograde log:\n{result['log'][-4000:]}"
    )


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.assignment for c in CHAPTERS])
def test_tampering_is_flagged_and_undone(graded: dict, chapter: Chapter) -> None:
    rows = graded[chapter.assignment]["rows"]
    flagged = {r["student"] for r in rows if r["flagged"] == "True"}
    assert flagged == chapter.flagged, flagged
    log = graded[chapter.assignment]["log"]
    tests = len(chapter.expected["alice"])
    for n in range(1, tests + 1):
        assert re.search(rf"carol/{chapter.notebook}: cell ex{n}_\w+ was edited \(restored\)", log)
    # nbgrader's own checksums restore the edited test cells: carol's, and no one else's
    assert log.count("Attribute 'checksum' for cell") == tests, log[-4000:]


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.assignment for c in CHAPTERS])
def test_each_chapter_autogrades_within_its_budget(graded: dict, chapter: Chapter) -> None:
    seconds = graded[chapter.assignment]["seconds"]
    assert seconds < AUTOGRADE_BUDGET_S, f"{chapter.assignment}: autograde took {seconds:.0f} s"


def feedback(graded: dict, chapter: Chapter, student: str) -> str:
    """The text of a student's feedback page (HTML entities decoded)."""
    page = (
        graded[chapter.assignment]["course"]
        / "feedback"
        / student
        / chapter.assignment
        / f"{chapter.notebook}.html"
    )
    return html.unescape(page.read_text(encoding="utf-8"))


def hint_of(chapter: Chapter, exercise: int, source: str) -> str:
    """The hint the chapter's checker gives for `source`, computed here, in the chapter's language."""
    from helpers.i18n import language, set_language

    namespace: dict = {}
    exec(compile(source, f"<answer {exercise}>", "exec"), namespace)
    nb = nbformat.read(ROOT / chapter.exercises, 4)
    tests = [
        c.source for c in nb.cells if c.cell_type == "code" and assignments.checker_called(c.source)
    ]
    checker = assignments.checker_called(tests[exercise - 1])
    module = assignments.checker_modules(nb)[checker]
    before = language()
    set_language(chapter.language)
    try:
        import importlib

        result = getattr(importlib.import_module(module), checker)(
            *[namespace[a.id] for a in assignments.parsed(tests[exercise - 1]).body[-1].value.args]
        )
    finally:
        set_language(before)
    return result.message


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.assignment for c in CHAPTERS])
def test_feedback_shows_each_failed_checks_hint(graded: dict, chapter: Chapter) -> None:
    colab = nbformat.read(ROOT / chapter.exercises, 4)
    stubs = [c.source for c in answer_cells(colab)]
    page = feedback(graded, chapter, "bob")
    for exercise, body in chapter.bob.items():
        if body:
            hint = hint_of(chapter, exercise, filled(stubs[exercise - 1], body))
            assert hint and hint in page, f"exercise {exercise}: {hint!r} not in bob's feedback"
    if chapter.language == "zh_CN":
        assert "❌ 练习" in page and "[探针：" in page
    else:
        assert "⏳ Exercise 4" in page
    dave = feedback(graded, chapter, "dave")
    assert "CellTimeoutError" in dave
    restarted = "restarting the kernel" in graded[chapter.assignment]["log"]
    assert restarted == chapter.dave_hang_in_answer_cell, (
        "only a cell deaf to SIGINT needs a restart"
    )
