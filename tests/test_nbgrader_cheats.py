"""Cheats on the nbgrader autograding (issue 34), each tried by a student of one small class.

Chapter 1 (English), graded with the real nbgrader command line from a course folder whose
checkers come from a copy of helpers/ (so a cheat that writes into the install spoils only the
copy). Each cheat is one extra cell (or extra files) in an otherwise untouched stub notebook,
as /tmp/cheat34's review handed them in: the grader must give it 0 points. A student who
answers everything right still gets full marks; one who submitted nothing is in the CSV.
"""

from __future__ import annotations

import csv
import shutil
import time
from pathlib import Path

import nbformat
import pytest

pytest.importorskip("nbgrader", reason="the teaching extra: pip install -e .[teach]")

import assignments  # noqa: E402 - tools/, after the skip
from test_nbgrader_e2e import nbgrader, run_nbgrader  # noqa: E402 - the same runner

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "01_devices_exercises"

META_PATH = """import sys as _s
_MS = type(_s.__spec__)
class _L:
    def create_module(self, spec):
        return None
    def exec_module(self, mod):
        setattr(mod, "strict_" + "checker", lambda *a, **k: None)
class _F:
    def find_spec(self, name, path=None, target=None):
        return _MS(name, _L()) if name in ("helpers" + ".grading", "course_grading") else None
getattr(_s, "meta" + "_path").insert(0, _F())"""
BUILTIN_IMPORT = """_b = print.__self__
_orig_imp = _b.__import__
def _imp(name, globals=None, locals=None, fromlist=(), level=0):
    if name.startswith("helpers" + ".grading") or name.startswith("importlib"):
        m = type(_b)("fake")
        m.strict_checker = lambda *a, **k: None
        return m
    return _orig_imp(name, globals, locals, fromlist, level)
_b.__import__ = _imp"""
IMPORT_MODULE = """import importlib
_o = importlib.import_module
def _im(name, package=None):
    m = _o(name, package)
    if name.startswith("helpers.checks.ch"):
        checks = _o("helpers.checks")
        for k in dir(m):
            if k.startswith("check_"):
                setattr(m, k, (lambda k: lambda *a, **kw: checks.CheckResult(k, checks.PASS))(k))
    return m
importlib.import_module = _im"""
CWD_SHADOW = """import os, pathlib
_real = os.path.dirname(__import__("helpers").__file__)
_fake = pathlib.Path.cwd() / "helpers"
_fake.mkdir(exist_ok=True)
(_fake / "__init__.py").write_text(f"__path__.append({_real!r})\\n")
(_fake / "grading.py").write_text("def strict_checker(*a, **k):\\n    return None\\n")"""
SETTRACE = """import sys as _s
def _tr(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "verdict_of":
        r = frame.f_locals.get("result")
        try:
            r.status = "pass"
        except Exception:
            pass
    return None
getattr(_s, "set" + "trace")(_tr)"""
DISPLAYHOOK = "def _mark():\n    import sys as _s\n    _s.displayhook('ok')"
#: a student's extra files next to the notebook: a helpers package that does no grading
SHADOW_FILES = {
    "helpers/__init__.py": "",
    "helpers/grading.py": "def strict_checker(*a, **k):\n    return None\n",
}


def with_cell(nb: nbformat.NotebookNode, code: str) -> nbformat.NotebookNode:
    """`nb` with an extra code cell after its second code cell (the imports)."""
    codes = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    nb.cells.insert(codes[1] + 1, nbformat.v4.new_code_cell(code))
    return nb


def stub_answers(nb: nbformat.NotebookNode, old: str, new: str) -> nbformat.NotebookNode:
    """`nb` with `old` replaced by `new` in each answer cell."""
    for cell in nb.cells:
        if cell.cell_type == "code" and "YOUR CODE HERE" in cell.source:
            cell.source = cell.source.replace(old, new)
    return nb


def right(nb: nbformat.NotebookNode, source: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """`nb` with every answer cell as the source's solution."""
    from test_nbgrader_e2e import answer_cells, solved

    solutions = [solved(c.source) for c in source.cells if c.metadata["nbgrader"]["solution"]]
    for cell, text in zip(answer_cells(nb), solutions):
        cell.source = text
    return nb


def tagged(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """`nb` with every test cell tagged skip-execution (nbclient's default skip tag)."""
    for cell in nb.cells:
        if cell.cell_type == "code" and assignments.checker_called(cell.source):
            cell.metadata["tags"] = ["skip-execution"]
    return nb


def submissions(course: Path, install: Path) -> dict[str, tuple[nbformat.NotebookNode, dict]]:
    """Student -> (notebook, extra files). Graded in name order: the install writers last."""
    release = course / "release" / "ch01" / f"{NOTEBOOK}.ipynb"
    source = nbformat.read(course / "source" / "ch01" / f"{NOTEBOOK}.ipynb", 4)

    def fresh() -> nbformat.NotebookNode:
        return nbformat.read(release, 4)

    writer = (
        f"import pathlib\n_p = pathlib.Path({str(install / 'helpers' / 'checks' / '__init__.py')!r})\n"
        "_p.write_text(_p.read_text() + '\\n\\ndef run_check(title, probes):\\n"
        '    return CheckResult(title, PASS, "correct")\\n\')'
    )
    return {
        "alice": (right(fresh(), source), {}),
        "c05displayhook": (
            stub_answers(
                with_cell(fresh(), DISPLAYHOOK),
                "raise NotImplementedError(",
                "_mark(); raise NotImplementedError(",
            ),
            {},
        ),
        "c08metapath": (with_cell(fresh(), META_PATH), {}),
        "c09cwdshadow": (with_cell(fresh(), CWD_SHADOW), {}),
        "c10subfiles": (fresh(), SHADOW_FILES),
        "c11builtinimport": (with_cell(fresh(), BUILTIN_IMPORT), {}),
        "c12importmodule": (with_cell(fresh(), IMPORT_MODULE), {}),
        "c13settrace": (with_cell(fresh(), SETTRACE), {}),
        "osexit": (
            stub_answers(fresh(), "raise NotImplementedError(", "import os; os._exit(0); ("),
            {},
        ),
        "tagger": (tagged(fresh()), {}),
        "zhedition": (nbformat.read(ROOT / "zh" / "exercises" / f"{NOTEBOOK}.ipynb", 4), {}),
        "zzwriter": (with_cell(fresh(), writer), {}),
        "zzzvictim": (fresh(), {}),
    }


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The class graded: CSV rows by student, the autograde log and exit status, its time."""
    base = tmp_path_factory.mktemp("cheats")
    install = base / "install"
    shutil.copytree(
        ROOT / "helpers", install / "helpers", ignore=shutil.ignore_patterns("__pycache__")
    )
    course = base / "classroom"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(assignments, "GRADING", install / "helpers" / "grading.py")
        mp.setenv("JUPYTER_CONFIG_DIR", str(tmp_path_factory.mktemp("jupyter-config")))
        assignments.write_course(course, only="01", languages=("en",))
        nbgrader("generate_assignment", "ch01", cwd=course)
        for student, (nb, files) in submissions(course, install).items():
            folder = course / "submitted" / student / "ch01"
            folder.mkdir(parents=True)
            nbformat.write(nb, folder / f"{NOTEBOOK}.ipynb")
            for name, text in files.items():
                (folder / name).parent.mkdir(parents=True, exist_ok=True)
                (folder / name).write_text(text, encoding="utf-8")
        nbgrader("db", "student", "add", "ghost", cwd=course)
        start = time.perf_counter()
        rc, log = run_nbgrader("autograde", "ch01", "--Execute.timeout=20", cwd=course, timeout=600)
        seconds = time.perf_counter() - start
        nbgrader("export", "--to=grades.csv", cwd=course)
    (base / "autograde.log").write_text(log, encoding="utf-8")
    with open(course / "grades.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    by: dict[str, list[dict]] = {}
    for row in rows:
        by.setdefault(row["student"], []).append(row)
    print(f"cheats: autograde of {len(by) - 1} submissions took {seconds:.1f} s")
    return {"rows": by, "log": log, "rc": rc, "install": install}


def points(graded: dict, student: str) -> list[float]:
    """A student's points per exercise, in exercise order."""
    return [float(r["points"]) for r in graded["rows"][student]]


def test_right_answers_still_get_full_marks(graded: dict) -> None:
    assert points(graded, "alice") == [1.0] * 5, graded["log"][-4000:]
    assert {r["flagged"] for r in graded["rows"]["alice"]} == {"False"}


@pytest.mark.parametrize(
    "student",
    [
        "c05displayhook",  # a result displayed before the error: nbgrader's partial credit
        "c08metapath",  # a meta_path finder serving a fake helpers.grading
        "c09cwdshadow",  # a fake helpers/ written into the kernel's working folder
        "c10subfiles",  # a fake helpers/ handed in next to the notebook
        "c11builtinimport",  # builtins.__import__ replaced
        "c12importmodule",  # importlib.import_module replaced
        "c13settrace",  # a trace function that rewrites the verdict
        "osexit",  # the kernel dies in every test cell
        "tagger",  # test cells tagged skip-execution
    ],
)
def test_a_cheat_scores_nothing(graded: dict, student: str) -> None:
    assert points(graded, student) == [0.0] * 5, graded["log"][-6000:]


def test_files_brought_with_a_submission_are_removed_and_flagged(graded: dict) -> None:
    rows = graded["rows"]["c10subfiles"]
    assert {r["flagged"] for r in rows} == {"True"}
    assert "helpers/grading.py" in rows[0]["flag_reasons"], rows[0]


def test_restarts_are_capped(graded: dict) -> None:
    log = graded["log"]
    assert "osexit/01_devices_exercises cell" in log and "restarted 2 times already" in log, log


def test_the_other_edition_is_named_not_flagged(graded: dict) -> None:
    assert "zhedition/01_devices_exercises: this is the Chinese edition" in graded["log"]
    assert {r["flagged"] for r in graded["rows"]["zhedition"]} == {"False"}


def test_a_changed_install_stops_autograde(graded: dict) -> None:
    log = graded["log"]
    assert graded["rc"] != 0
    assert "changed grading zzwriter" in log, log[-4000:]
    assert "zzzvictim not graded" in log
    for student in ("zzwriter", "zzzvictim"):
        assert points(graded, student) == [0.0] * 5, student  # not graded: autograde again


def test_the_csv_holds_every_student(graded: dict) -> None:
    rows = graded["rows"]["ghost"]
    assert [r["exercise"][:4] for r in rows] == ["ex1_", "ex2_", "ex3_", "ex4_", "ex5_"]
    assert {(r["points"], r["submitted"], r["late_penalty"]) for r in rows} == {
        ("0.0", "False", "0.0")
    }


def test_a_string_that_equals_everything_does_not_pass() -> None:
    from helpers.checks.ch03 import check_fp16_fate

    class Yes(str):
        __eq__ = lambda s, o: True  # noqa: E731
        __ne__ = lambda s, o: False  # noqa: E731
        __hash__ = str.__hash__

    assert check_fp16_fate(lambda x: Yes("normal")).status != "pass"
