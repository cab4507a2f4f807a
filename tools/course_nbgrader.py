"""What the course adds to nbgrader (issue 34): plug-ins that the course folder's
nbgrader_config.py loads. tools/assignments.py copies this file into the folder it writes.

- ``CourseClearSolutions``: nbgrader's ClearSolutions, plus the course's "fix this code"
  stubs: a ``### BEGIN STUB`` ... ``### END STUB`` block of comment lines right after a
  solution region is that region's stub (uncommented), instead of ``ClearSolutions.code_stub``.
- ``AlignSubmission`` (first step of ``nbgrader autograde``): lays a submission onto the
  assignment's cells, whatever saved it: the nbgrader copy from the exchange, the course's
  exercise notebook from the repository or Colab (no nbgrader metadata, Colab's own cell ids
  and widget state). Cells are matched by nbgrader id, then cell id, then content; a
  deleted cell comes back from the source (a solution cell as its stub); cells the student
  added stay where they were. Signs of tampering flag the submission for a human look.
- ``RecoveringExecute``: nbgrader's Execute, which gives up on the whole submission when a
  cell cannot be interrupted after its timeout (it ignores SIGINT, or is stuck in C code) or
  kills the kernel; here that cell fails, the kernel restarts, the cells before it run again
  (not the test cells, nor cells that timed out) and grading goes on with the next cell.
- ``GradeOnErrorsOnly``: in test cells, output on stderr (a warning, the profiler's log
  lines) is shown as ordinary output; only an error fails the cell.
- ``ExerciseCsvExporter``: ``nbgrader export`` as one row per student, assignment and exercise.
"""

from __future__ import annotations

import copy
import csv
import os
import re
import uuid

import nbformat
from jupyter_core.utils import run_sync
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.coursedir import CourseDirectory
from nbgrader.plugins import ExportPlugin
from nbgrader.preprocessors import ClearSolutions, Execute, NbGraderPreprocessor
from traitlets import List, Unicode

STUB_BEGIN, STUB_END = "### BEGIN STUB", "### END STUB"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def comment_stub(lines: list[str], indent: str) -> list[str]:
    """Stub lines as the comment block that CourseClearSolutions turns back into them."""
    out = []
    for line in lines:
        if not line.strip():
            out.append(f"{indent}#")
        elif line.startswith(indent):
            out.append(f"{indent}# {line[len(indent) :]}")
        else:
            out.append(f"# {line}")
    return out


def uncomment_stub(line: str) -> str:
    """One line of a STUB block as the stub line it stands for."""
    return "" if line.strip() == "#" else re.sub(r"^(\s*)# ?", r"\1", line, count=1)


def clear_solutions(source: str, begin: str, end: str, default_stub: list[str]) -> tuple[str, bool]:
    """`source` with each solution region replaced by its STUB block or the default stub."""
    lines, out, i, replaced = source.split("\n"), [], 0, False
    while i < len(lines):
        line = lines[i]
        if begin not in line:
            out.append(line)
            i += 1
            continue
        j = next((k for k in range(i + 1, len(lines)) if end in lines[k]), None)
        if j is None or any(begin in x for x in lines[i + 1 : j]):
            raise RuntimeError(f"unbalanced or nested solution region in:\n{source}")
        replaced, indent = True, re.match(r"\s*", line).group(0)
        if j + 1 < len(lines) and lines[j + 1].strip() == STUB_BEGIN:
            m = next((k for k in range(j + 2, len(lines)) if lines[k].strip() == STUB_END), None)
            if m is None:
                raise RuntimeError(f"'{STUB_BEGIN}' without '{STUB_END}' in:\n{source}")
            out += [uncomment_stub(x) for x in lines[j + 2 : m]]
            i = m + 1
        else:
            out += [indent + x for x in default_stub]
            i = j + 1
    return "\n".join(out), replaced


def without_hidden_tests(source: str) -> str:
    """A test cell's source as the student sees it (nbgrader's ClearHiddenTests)."""
    out, hidden = [], False
    for line in source.split("\n"):
        if HIDDEN_BEGIN in line:
            hidden = True
        elif HIDDEN_END in line:
            hidden = False
        elif not hidden:
            out.append(line)
    return "\n".join(out)


class CourseClearSolutions(ClearSolutions):
    """ClearSolutions that also knows the course's ``### BEGIN STUB`` blocks."""

    def _replace_solution_region(self, cell: NotebookNode, language: str) -> bool:
        if cell.cell_type != "code":
            return super()._replace_solution_region(cell, language)
        cell.source, replaced = clear_solutions(
            cell.source,
            self.begin_solution_delimeter,
            self.end_solution_delimeter,
            self.code_stub[language].split("\n"),
        )
        return replaced


#: Code in a student's cell that deserves a human look: it reaches for the checkers, the
#: grading, the interpreter or the kernel rather than for the exercise.
SUSPICIOUS = {
    "assigns a checker's name": r"^\s*check_\w+\s*(=(?!=)|:[^=\n]*=)|\bdef\s+check_\w+|\bas\s+check_\w+",
    "touches the checkers or the grading": r"helpers\s*\.\s*(checks|grading)\b|\bstrict_checker\b",
    "changes loaded modules": r"\bsys\s*\.\s*(modules|path|meta_path|settrace|setprofile)\b|\bimportlib\b",
    "patches built-ins": r"\bbuiltins\b|__builtins__",
    "talks to the kernel": r"\bget_ipython\b|input_transformers|set_custom_exc",
    "handles signals or kills": r"\bsignal\s*\.\s*(signal|alarm|setitimer)\b|\bos\s*\.\s*(_exit|kill)\b",
}


def normalised(source: str) -> str:
    """A cell's text for comparison: no trailing spaces, no blank lines at either end."""
    return "\n".join(line.rstrip() for line in source.strip("\n").split("\n")).strip()


def defined_names(source: str) -> set[str]:
    """The functions a cell defines at its top level (read as text: the cell may not parse)."""
    return set(re.findall(r"^(?:async\s+)?def\s+(\w+)", source, flags=re.M))


class AlignSubmission(NbGraderPreprocessor):
    """Lay a submission onto the assignment's cells; flag signs of tampering (issue 34)."""

    suspicious = List(
        [*SUSPICIOUS],
        help="Which SUSPICIOUS patterns flag a submission for a human look.",
    ).tag(config=True)

    def preprocess(
        self, nb: NotebookNode, resources: ResourcesDict
    ) -> tuple[NotebookNode, ResourcesDict]:
        info = resources["nbgrader"]
        coursedir = CourseDirectory(parent=self)
        path = os.path.join(
            coursedir.format_path(coursedir.source_directory, ".", info["assignment"]),
            f"{info['notebook']}.ipynb",
        )
        source = nbformat.read(path, as_version=4)
        stub = self._stub(source)
        matched = self._match(source.cells, nb.cells, stub)
        findings = self._findings(source.cells, nb.cells, matched, stub)
        nb.cells = self._rebuilt(source.cells, nb.cells, matched, stub)
        nb.metadata.pop("widgets", None)  # Colab's widget state: nothing to grade, often invalid
        nb.nbformat, nb.nbformat_minor = 4, max(5, nb.get("nbformat_minor", 0))
        for finding in findings:
            self.log.warning("%s/%s: %s", info["student"], info["notebook"], finding)
        if findings:
            self._flag(info)
        resources.setdefault("course", {})["findings"] = findings
        return nb, resources

    def _stub(self, source: NotebookNode) -> dict[int, str]:
        """Source cell index -> the text the student was given in that cell."""
        clear = CourseClearSolutions(parent=self)
        language = source.metadata.get("kernelspec", {}).get("language", "python")
        out = {}
        for i, cell in enumerate(source.cells):
            text = without_hidden_tests(cell.source)
            if utils.is_solution(cell) and cell.cell_type == "code":
                text = clear_solutions(
                    cell.source,
                    clear.begin_solution_delimeter,
                    clear.end_solution_delimeter,
                    clear.code_stub[language].split("\n"),
                )[0]
            out[i] = text
        return out

    def _match(self, src: list, sub: list, stub: dict[int, str]) -> dict[int, int]:
        """Source cell index -> submission cell index."""
        matched: dict[int, int] = {}
        taken: set[int] = set()

        def take(i: int, j: int) -> None:
            matched[i] = j
            taken.add(j)

        ids = {c.metadata.get("nbgrader", {}).get("grade_id"): i for i, c in enumerate(src)}
        for j, cell in enumerate(sub):  # 1. nbgrader's own ids (the exchange, JupyterLab)
            i = ids.get(cell.metadata.get("nbgrader", {}).get("grade_id"))
            if i is not None and i not in matched and cell.cell_type == src[i].cell_type:
                take(i, j)
        cell_ids = {c.get("id"): i for i, c in enumerate(src) if c.get("id")}
        for j, cell in enumerate(sub):  # 2. nbformat cell ids (the repository's notebooks)
            i = cell_ids.get(cell.get("id"))
            if i is not None and i not in matched and j not in taken:
                if cell.cell_type == src[i].cell_type:
                    take(i, j)
        for i, cell in enumerate(src):  # 3. the same text, in order (Colab)
            if i in matched or utils.is_solution(cell):
                continue
            lo, hi = self._window(i, matched, len(sub))
            j = next(
                (
                    j
                    for j in range(lo, hi)
                    if j not in taken
                    and sub[j].cell_type == cell.cell_type
                    and normalised(sub[j].source) == normalised(stub[i])
                ),
                None,
            )
            if j is not None:
                take(i, j)
        for i, cell in enumerate(src):  # 4. answers: the cell that defines the same functions
            if i in matched or not utils.is_solution(cell):
                continue
            lo, hi = self._window(i, matched, len(sub))
            free = [
                j for j in range(lo, hi) if j not in taken and sub[j].cell_type == cell.cell_type
            ]
            want = defined_names(cell.source)
            best = [j for j in free if want and want <= defined_names(sub[j].source)]
            if best or len(free) == 1:
                take(i, (best or free)[-1])
        return matched

    @staticmethod
    def _window(i: int, matched: dict[int, int], n: int) -> tuple[int, int]:
        """The submission cells between the matches of source cell i's neighbours."""
        before = [j for k, j in matched.items() if k < i]
        after = [j for k, j in matched.items() if k > i]
        return (max(before) + 1 if before else 0), (min(after) if after else n)

    def _rebuilt(self, src: list, sub: list, matched: dict[int, int], stub: dict[int, str]) -> list:
        """The assignment's cells in order, each the student's where matched; extras kept in place."""
        at = {j: i for i, j in matched.items()}
        extras: dict[int, list] = {}
        last = -1
        for j, cell in enumerate(sub):
            if j in at:
                last = at[j]
            else:
                extra = copy.deepcopy(cell)
                extra.metadata.pop("nbgrader", None)
                extra.metadata.pop("deletable", None)
                extra.metadata.pop("editable", None)
                extras.setdefault(last, []).append(extra)
        out = list(extras.get(-1, []))
        for i, original in enumerate(src):
            if i in matched:
                cell = copy.deepcopy(sub[matched[i]])
                cell.cell_type = original.cell_type
                if not utils.is_solution(original) and normalised(cell.source) == normalised(
                    stub[i]
                ):
                    cell.source = original.source  # as handed out; a test cell gets its hidden part
            else:  # deleted or not found: the student's copy as it was handed out
                cell = copy.deepcopy(original)
                cell.source = stub[i] if utils.is_solution(original) else original.source
            for key in ("nbgrader", "deletable", "editable"):
                if key in original.metadata:
                    cell.metadata[key] = copy.deepcopy(original.metadata[key])
            cell["id"] = original.get("id") or uuid.uuid4().hex[:8]
            out.append(cell)
            out += extras.get(i, [])
        seen = set()
        for cell in out:
            if cell.get("id") in seen or not cell.get("id"):
                cell["id"] = uuid.uuid4().hex[:8]
            seen.add(cell["id"])
            if cell.cell_type == "code":
                cell.setdefault("outputs", [])
                cell.setdefault("execution_count", None)
            else:
                cell.pop("outputs", None)
                cell.pop("execution_count", None)
        return out

    def _findings(
        self, src: list, sub: list, matched: dict[int, int], stub: dict[int, str]
    ) -> list[str]:
        """What a human should look at: edited or deleted code cells, suspicious code."""
        found = []
        for i, cell in enumerate(src):
            name = cell.metadata.get("nbgrader", {}).get("grade_id", f"cell {i}")
            if utils.is_solution(cell) or cell.cell_type != "code":  # markdown: restored, harmless
                continue
            if i not in matched:
                found.append(f"cell {name} was deleted (put back)")
            elif normalised(sub[matched[i]].source) != normalised(stub[i]):
                found.append(f"cell {name} was edited (restored)")
        answers = {j for i, j in matched.items() if utils.is_solution(src[i])}
        mine = [j for j in range(len(sub)) if j in answers or j not in matched.values()]
        for j in mine:
            for what in self.suspicious:
                if re.search(SUSPICIOUS[what], sub[j].source, flags=re.M):
                    found.append(f"submitted cell {j} {what}")
        return found

    def _flag(self, info: dict) -> None:
        """Flag the submitted notebook in the gradebook (formgrader shows the flag)."""
        with Gradebook(info["db_url"]) as gb:
            try:
                notebook = gb.find_submission_notebook(
                    info["notebook"], info["assignment"], info["student"]
                )
            except MissingEntry:
                return
            notebook.flagged = True
            gb.db.commit()


def timed_out(cell: NotebookNode) -> bool:
    """Whether a cell's outputs say it ran out of time or lost its kernel."""
    names = {o.get("ename") for o in cell.get("outputs", []) if o.output_type == "error"}
    return bool(names & {"CellTimeoutError", "DeadKernelError"})


class RecoveringExecute(Execute):
    """Execute that grades on past a cell the kernel never comes back from."""

    def preprocess_cell(
        self, cell: NotebookNode, resources: ResourcesDict, index: int
    ) -> tuple[NotebookNode, ResourcesDict]:
        try:
            return super().preprocess_cell(cell, resources, index)
        except (CellTimeoutError, DeadKernelError) as exc:
            what = type(exc).__name__
            self.log.warning(
                "cell %s: %s; restarting the kernel, running earlier cells again", index, what
            )
            cell.outputs.append(
                nbformat.v4.new_output(
                    "error",
                    ename=what,
                    evalue="",
                    traceback=[
                        f"{what}: the kernel did not come back from this cell; it was restarted"
                    ],
                )
            )
            self._restart_and_replay(index)
            return cell, self.resources

    def _restart_and_replay(self, index: int) -> None:
        """A fresh kernel in the state the cells before `index` leave (test cells left out)."""
        run_sync(self.km.restart_kernel)(now=True)
        run_sync(self.kc.wait_for_ready)(timeout=self.startup_timeout)
        for n, earlier in enumerate(self.nb.cells[:index]):
            if earlier.cell_type != "code" or utils.is_grade(earlier) or timed_out(earlier):
                continue
            try:
                self.execute_cell(copy.deepcopy(earlier), n, store_history=False)
            except (CellTimeoutError, DeadKernelError):
                self.log.warning("cell %s hangs again when replayed: left out", n)
                run_sync(self.km.restart_kernel)(now=True)
                run_sync(self.kc.wait_for_ready)(timeout=self.startup_timeout)


class GradeOnErrorsOnly(NbGraderPreprocessor):
    """Test cells' stderr output becomes ordinary output: only an error costs the points."""

    def preprocess_cell(
        self, cell: NotebookNode, resources: ResourcesDict, index: int
    ) -> tuple[NotebookNode, ResourcesDict]:
        if utils.is_grade(cell) and cell.cell_type == "code":
            for output in cell.outputs:
                if output.output_type == "stream" and output.name == "stderr":
                    output.name = "stdout"
        return cell, resources


class ExerciseCsvExporter(ExportPlugin):
    """``nbgrader export``: one CSV row per student, assignment and exercise (test cell)."""

    to = Unicode("grades_by_exercise.csv", help="The CSV file to write.").tag(config=True)

    def export(self, gradebook: Gradebook) -> None:
        fields = [
            "student",
            "assignment",
            "notebook",
            "exercise",
            "points",
            "max_points",
            "flagged",
        ]
        with open(self.to or "grades_by_exercise.csv", "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            for row in self.rows(gradebook):
                writer.writerow(row)
        self.log.info("Wrote %s", self.to)

    def rows(self, gradebook: Gradebook) -> list[dict]:
        """The rows: students with a submission of the assignments asked for (all by default)."""
        out = []
        for assignment in gradebook.assignments:
            if self.assignment and assignment.name not in self.assignment:
                continue
            for submission in sorted(assignment.submissions, key=lambda s: s.student.id):
                if self.student and submission.student.id not in self.student:
                    continue
                for notebook in submission.notebooks:
                    for grade in sorted(notebook.grades, key=lambda g: g.cell.name):
                        out.append(
                            {
                                "student": submission.student.id,
                                "assignment": assignment.name,
                                "notebook": notebook.name,
                                "exercise": grade.cell.name,
                                "points": grade.score,
                                "max_points": grade.max_score,
                                "flagged": notebook.flagged,
                            }
                        )
        return out
