"""Write the nbgrader course folder for teaching a class (issue 34): one assignment per chapter
and language, made from the solutions and exercise notebooks.

    python tools/assignments.py                    # classroom/ (what `make assignments` runs)
    python tools/assignments.py --out DIR --only 06 --languages en zh_CN

In DIR: ``source/chNN/NN_topic_exercises.ipynb`` (English) and ``source/chNN_zh/...`` (简体中文),
``nbgrader_config.py`` and ``course_nbgrader.py`` (tools/course_nbgrader.py: what the course
adds to nbgrader). Each assignment notebook is the exercise notebook with its answers back in:

- a cell with an answer is an nbgrader solution cell: the solution between ``### BEGIN
  SOLUTION`` and ``### END SOLUTION``, and where the exercise's stub is not nbgrader's
  ``ClearSolutions.code_stub`` (a "fix this code" exercise, the Chinese stubs), the stub as a
  ``### BEGIN STUB`` comment block after it;
- a cell that calls a checker, ``check_x(...)``, is a locked, autograded test cell worth
  POINTS (1 unless said there); a hidden prelude (``### BEGIN HIDDEN TESTS``) makes it call the
  checker fresh from its file and fail on ❌ or ⏳ (helpers/grading.py);
- every other cell is read-only (locked).

``nbgrader generate_assignment chNN`` then writes exactly the exercise notebook, cell for cell
(tests/test_nbgrader_assignments.py), so a student may start from the repository, Colab or the
nbgrader exchange alike. The markdown answers of the solutions notebooks ("Why.") stay there.
"""

from __future__ import annotations

import argparse
import ast
import re
import secrets
import shutil
import sys
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import course_nbgrader  # noqa: E402

import nbfiles  # noqa: E402

ROOT = nbfiles.ROOT
COURSE_ID = "pytorch-gpu-course"
#: language -> (solutions folder, exercises folder, assignment suffix)
EDITIONS = {"en": ("solutions", "exercises", ""), "zh_CN": ("zh/solutions", "zh/exercises", "_zh")}
#: Points of an exercise, by the checker its test cell calls; any other exercise is worth 1.
POINTS: dict[str, float] = {}
DEFAULT_POINTS = 1.0
#: What nbgrader writes for a solution region (ClearSolutions.code_stub), as make_exercises does.
DEFAULT_STUB = ["# YOUR CODE HERE", 'raise NotImplementedError("Write your solution here.")']
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
#: Seconds one cell may run when autograding before it is interrupted (and scores 0).
CELL_TIMEOUT = 60
#: The installed course's checkers, which the hidden prelude loads by this absolute path.
GRADING = ROOT / "helpers" / "grading.py"


def lms_filename(notebooks: list[str]) -> str:
    """How files from an LMS download are named: STUDENT_NOTEBOOK.ipynb, NOTEBOOK one of
    `notebooks` exactly; any number of "Copy of " (Colab copies) before it and one " (1)" (a
    browser's second download) after it are allowed. STUDENT: letters, digits, '.', '@', '-'."""
    names = "|".join(re.escape(n) for n in sorted(notebooks, key=len, reverse=True))
    return (
        r".*[\\/](?P<student_id>[A-Za-z0-9.@-]+)_(?:Copy[ _]of[ _])*"
        rf"(?P<file_id>{names})(?:[ _-]*\(?\d+\)?)?\.ipynb$"
    )


#: The course's notebook names (the same in both editions), as zip_collect accepts them.
LMS_FILENAME = lms_filename(
    [p.stem for p in sorted((ROOT / "exercises").glob("*_exercises.ipynb"))]
)
#: What the grader puts in place of this in each test cell's prelude: a token, new each run.
TOKEN = course_nbgrader.TOKEN_PLACEHOLDER
PRELUDE = """\
### BEGIN HIDDEN TESTS
# Autograding: the installed course's checker, loaded by its path, fails this cell on ❌ or ⏳
import importlib.util as _u; _s = _u.spec_from_file_location("course_grading", {grading!r})
_g = _u.module_from_spec(_s); _s.loader.exec_module(_g)
{checker} = _g.strict_checker({module!r}, {checker!r}, {language!r}, {token!r})
### END HIDDEN TESTS"""


class AssignmentError(ValueError):
    """A solutions / exercise notebook pair that cannot be turned into an assignment."""


def assignment_id(solution: Path, language: str) -> str:
    """solutions/06_profiling_solutions.ipynb, 'zh_CN' -> 'ch06_zh'."""
    return f"ch{solution.name[:2]}{EDITIONS[language][2]}"


def parsed(source: str) -> ast.Module | None:
    """A code cell's syntax tree, its IPython magics and shell lines read as `pass`."""
    lines = [
        re.sub(r"^(\s*)[%!].*", r"\1pass", line) if line.lstrip()[:1] in "%!" else line
        for line in source.split("\n")
    ]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def checker_called(source: str) -> str | None:
    """The checker a check cell ends by calling (`check_x(...)`), else None."""
    tree = parsed(source)
    last = tree.body[-1] if tree and tree.body else None
    if (
        isinstance(last, ast.Expr)
        and isinstance(last.value, ast.Call)
        and isinstance(last.value.func, ast.Name)
        and last.value.func.id.startswith("check_")
    ):
        return last.value.func.id
    return None


def checker_modules(nb: nbformat.NotebookNode) -> dict[str, str]:
    """Checker name -> the helpers.checks module the notebook imports it from."""
    found = {}
    for cell in nb.cells:
        tree = parsed(cell.source) if cell.cell_type == "code" else None
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "helpers.checks."
            ):
                found.update({a.asname or a.name: node.module for a in node.names})
    return found


def _regions(lines: list[str], where: str) -> list[tuple[int, int, int]]:
    """(BEGIN line, END line, last line of its STUB block or END line) for each region."""
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() != BEGIN:
            i += 1
            continue
        end = next((k for k in range(i + 1, len(lines)) if lines[k].strip() == END), None)
        if end is None:
            raise AssignmentError(f"{where}: '{BEGIN}' without '{END}'")
        last = end
        if end + 1 < len(lines) and lines[end + 1].strip() == course_nbgrader.STUB_BEGIN:
            last = next(
                k
                for k in range(end + 2, len(lines))
                if lines[k].strip() == course_nbgrader.STUB_END
            )
        out.append((i, end, last))
        i = last + 1
    return out


def answer_cell(solution: str, exercise: str, where: str) -> str:
    """The exercise cell with each stub replaced by its solution region (and STUB block).

    The stubs are found in the exercise cell by their ``YOUR CODE HERE`` comment, so the
    Chinese exercise's text (its comments, its stub's message) is kept as it is.
    """
    sol, ex = solution.split("\n"), exercise.split("\n")
    regions = _regions(sol, where)
    marks = [
        k for k, line in enumerate(ex) if line.lstrip().startswith("#") and "YOUR CODE HERE" in line
    ]
    if len(marks) != len(regions):
        raise AssignmentError(f"{where}: {len(regions)} solution regions, {len(marks)} stubs")
    out, e = [], 0
    for (begin, end, last), mark in zip(regions, marks):
        indent = sol[begin][: len(sol[begin]) - len(sol[begin].lstrip())]
        length = 2 if last == end else 1 + (last - end - 2)
        stub = ex[mark : mark + length]
        out += ex[e:mark] + sol[begin : end + 1]
        if stub != [indent + line for line in DEFAULT_STUB]:
            out += [indent + course_nbgrader.STUB_BEGIN]
            out += course_nbgrader.comment_stub(stub, indent)
            out += [indent + course_nbgrader.STUB_END]
        e = mark + length
    if len(ex) - e != len(sol) - regions[-1][2] - 1:
        raise AssignmentError(f"{where}: the code after the last stub differs from the solution's")
    return "\n".join(out + ex[e:])


def _metadata(grade_id: str, *, solution: bool = False, points: float | None = None) -> dict:
    """nbgrader's cell metadata (schema 3) for a read-only, solution or test cell."""
    return {
        "grade": points is not None,
        "grade_id": grade_id,
        "locked": not solution,
        "schema_version": 3,
        "solution": solution,
        "task": False,
        **({"points": points} if points is not None else {}),
    }


def source_notebook(solution: Path, exercise: Path, language: str) -> nbformat.NotebookNode:
    """The nbgrader source notebook of one chapter in one language."""
    sol, nb = nbfiles.read(solution), nbfiles.read(exercise)
    if [(c.cell_type, c.get("id")) for c in sol.cells] != [
        (c.cell_type, c.get("id")) for c in nb.cells
    ]:
        raise AssignmentError(f"{exercise}: not the same cells as {solution}")
    modules = checker_modules(nb)
    number, answers = 0, []
    for i, (s, cell) in enumerate(zip(sol.cells, nb.cells)):
        where = f"{solution.relative_to(ROOT)} cell {i}"
        checker = checker_called(cell.source) if cell.cell_type == "code" else None
        if cell.cell_type == "code" and BEGIN in s.source:
            cell.source = answer_cell(s.source, cell.source, where)
            answers.append(cell)
        elif checker:
            if checker not in modules:
                raise AssignmentError(f"{where}: {checker} is not imported from helpers.checks")
            number += 1
            name = f"ex{number}_{checker.removeprefix('check_')}"
            prelude = PRELUDE.format(
                checker=checker,
                module=modules[checker],
                language=language,
                grading=str(GRADING),
                token=TOKEN,
            )
            cell.source = f"{prelude}\n{cell.source}"
            cell.metadata["nbgrader"] = _metadata(name, points=POINTS.get(checker, DEFAULT_POINTS))
            for answer in answers:
                answer.metadata["nbgrader"] = _metadata(f"ex{number}_answer", solution=True)
                if len(answers) > 1:
                    answer.metadata["nbgrader"]["grade_id"] += f"{answers.index(answer) + 1}"
            answers = []
        else:
            cell.metadata["nbgrader"] = _metadata(cell.get("id") or f"cell-{i:03d}")
    for answer in answers:  # an answer no check follows: still the student's to write
        answer.metadata["nbgrader"] = _metadata(f"answer_{answer.id}", solution=True)
    return nb


def config_text() -> str:
    """The course folder's nbgrader_config.py."""
    return f'''"""nbgrader's configuration for the course, written by tools/assignments.py (`make assignments`).

Run nbgrader from this folder. What course_nbgrader.py adds is said in its docstring.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader import preprocessors as nbg  # noqa: E402

import course_nbgrader as course  # noqa: E402

c = get_config()  # noqa: F821
c.CourseDirectory.course_id = {COURSE_ID!r}
# The student's copy: the course's exercise notebook, cell for cell.
c.ClearSolutions.code_stub = {{"python": {chr(10).join(DEFAULT_STUB)!r}}}
c.GenerateAssignment.preprocessors = [
    nbg.IncludeHeaderFooter, nbg.InstantiateTests, nbg.LockCells, course.CourseClearSolutions,
    nbg.ClearOutput, nbg.CheckCellMetadata, nbg.ComputeChecksums, nbg.SaveCells,
    nbg.ClearHiddenTests, nbg.ClearMarkScheme, nbg.ComputeChecksums, nbg.CheckCellMetadata,
]
# Autograding: any submission is laid onto the assignment's cells first (Colab, the repository).
c.Autograde.sanitize_preprocessors = [
    course.AlignSubmission, nbg.ClearOutput, nbg.DeduplicateIds, nbg.OverwriteKernelspec,
    nbg.OverwriteCells, nbg.CheckCellMetadata,
]
c.Autograde.autograde_preprocessors = [
    course.RecoveringExecute, course.GradeOnErrorsOnly, nbg.IgnorePattern, ClearMetadataPreprocessor,
    nbg.LimitOutput, nbg.SaveAutoGrades, nbg.AssignLatePenalties, nbg.CheckCellMetadata,
]
# A cell that runs longer is interrupted (or its kernel restarted): it scores 0, and the
# next cells still run.
c.Execute.timeout = {CELL_TIMEOUT}
c.Execute.interrupt_on_timeout = True
# At most this many kernel restarts, and seconds, per submission; the cells after: not run, 0.
c.RecoveringExecute.max_restarts = 2
c.RecoveringExecute.time_budget = 900
# No tag a student can add skips a cell (nbclient skips cells tagged "skip-execution").
c.Execute.skip_cells_with_tag = {"course-never-skips-" + secrets.token_hex(8)!r}
# The installed course whose checkers grade (the hidden preludes load them by path); autograde
# stops if a submission changes its helpers/ files.
c.CourseInstall.helpers_dir = {str(GRADING.parent)!r}
# Files from an LMS download (nbgrader zip_collect): STUDENT_NN_topic_exercises.ipynb
c.FileNameCollectorPlugin.named_regexp = {LMS_FILENAME!r}
# nbgrader export: one row per student, assignment and exercise
c.ExportApp.plugin_class = course.ExerciseCsvExporter
'''


def chapters(only: str | None) -> list[Path]:
    """The English solutions notebooks of the chapters asked for."""
    found = sorted((ROOT / "solutions").glob("*_solutions.ipynb"))
    return [p for p in found if not only or only in p.name]


def write_course(
    out: Path, only: str | None = None, languages: tuple[str, ...] = tuple(EDITIONS)
) -> list[str]:
    """Write the course folder `out`; the assignment ids written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for solution in chapters(only):
        for language in languages:
            sol_dir, ex_dir, _ = EDITIONS[language]
            exercise_name = solution.name.replace("_solutions.ipynb", "_exercises.ipynb")
            nb = source_notebook(
                ROOT / sol_dir / solution.name, ROOT / ex_dir / exercise_name, language
            )
            aid = assignment_id(solution, language)
            target = out / "source" / aid / exercise_name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
            written.append(aid)
    (out / "nbgrader_config.py").write_text(config_text(), encoding="utf-8")
    shutil.copyfile(Path(course_nbgrader.__file__), out / "course_nbgrader.py")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "classroom", help="the course folder")
    parser.add_argument("--only", help="chapters whose file name contains this, e.g. 06")
    parser.add_argument("--languages", nargs="+", choices=list(EDITIONS), default=list(EDITIONS))
    args = parser.parse_args(argv)
    written = write_course(args.out, args.only, tuple(args.languages))
    print(f"{args.out}: {len(written)} assignments ({', '.join(written)})")
    print(
        f"next: source .venv/bin/activate && cd {args.out} "
        f"&& nbgrader generate_assignment {written[0]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
