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
  added stay where they were; a locked cell keeps the source's whole metadata (tags included).
  Signs of tampering flag the submission for a human look; the reasons are kept next to the
  autograded notebook (``course_flags.json``) for the export. Files a submission brings
  besides its notebook are removed from the autograded folder (and flag it). A notebook of the
  other edition (English / Chinese) is named in the log, not flagged for its read-only cells.
- ``CourseInstall``: where the installed course's helpers/ are; autograde stops when a
  submission changes them (their hash is taken before the first and after each submission).
- ``RecoveringExecute``: nbgrader's Execute, which gives up on the whole submission when a
  cell cannot be interrupted after its timeout (it ignores SIGINT, or is stuck in C code) or
  kills the kernel; here that cell fails, the kernel restarts, the cells before it run again
  (not the test cells, nor cells that timed out) and grading goes on with the next cell; at
  most ``max_restarts`` times and ``time_budget`` seconds per submission, after which the
  remaining cells are not run (0). A test cell scores only if the course's strict checker ran
  and passed in it: the grader gives each test cell a new token, which only that checker shows.
- ``GradeOnErrorsOnly``: in test cells, output on stderr (a warning, the profiler's log
  lines) is shown as ordinary output; only an error fails the cell, and a result displayed
  before the error (nbgrader's partial credit) no longer counts.
- ``ExerciseCsvExporter``: ``nbgrader export`` as one row per student, assignment and exercise,
  every student of the gradebook included (0 points, ``submitted`` False, when nothing came in).
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import os
import re
import secrets
import shutil
import time
import uuid
from pathlib import Path

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
from traitlets import Integer, List, Unicode
from traitlets.config import LoggingConfigurable

STUB_BEGIN, STUB_END = "### BEGIN STUB", "### END STUB"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
#: In a test cell's hidden prelude: replaced by a new token each time the cell is graded.
TOKEN_PLACEHOLDER = "@@GRADER_TOKEN@@"
#: The output helpers/grading.py shows when a graded check passed (it carries the token).
MARKER_MIME = "application/vnd.course-grading+json"
#: Next to each autograded notebook: why the submission was flagged (the export reads it).
FLAGS_FILE = "course_flags.json"
#: Files nbgrader itself puts in a submission folder.
NBGRADER_FILES = {"timestamp.txt", "submission_secret.txt", FLAGS_FILE}


class InstallChanged(RuntimeError):
    """The installed course's helpers/ changed during autograde: stop, restore, regrade."""


class CourseInstall(LoggingConfigurable):
    """The installed course that grades: its helpers/ folder (written by `make assignments`)."""

    helpers_dir = Unicode("", help="The installed course's helpers/ folder.").tag(config=True)

    #: helpers folder -> its digest when autograde started; and who changed it, once seen
    baseline: dict[str, str] = {}
    spoiled: dict[str, str] = {}

    def digest(self) -> str:
        """A hash of every .py file under helpers/ (names and contents)."""
        h = hashlib.sha256()
        for path in sorted(Path(self.helpers_dir).rglob("*.py")):
            h.update(str(path.relative_to(self.helpers_dir)).encode() + b"\0")
            h.update(path.read_bytes() + b"\0")
        return h.hexdigest()

    def verify(self, student: str, after: bool) -> None:
        """Raise InstallChanged if helpers/ is no longer what it was when autograde started."""
        if not self.helpers_dir:
            return
        if self.helpers_dir in self.spoiled:
            raise InstallChanged(
                f"{student} not graded: the course's checkers in {self.helpers_dir} were "
                f"changed while grading {self.spoiled[self.helpers_dir]}; restore the install "
                "(git checkout -- helpers, or reinstall the course) and regrade with "
                "`nbgrader autograde ASSIGNMENT --force`"
            )
        now = self.digest()
        first = self.baseline.setdefault(self.helpers_dir, now)
        if now != first:
            self.spoiled[self.helpers_dir] = student
            what = "grading" if after else "before grading"
            raise InstallChanged(
                f"the course's checkers in {self.helpers_dir} changed {what} {student}: "
                "this submission (or one before it) wrote into the installed course. Restore "
                "the install (git checkout -- helpers, or reinstall the course), then regrade "
                "everyone with `nbgrader autograde ASSIGNMENT --force`; later students are "
                "not graded by the modified checkers"
            )


def flags_path(parent: LoggingConfigurable, student: str, assignment: str) -> Path:
    """The autograded folder's FLAGS_FILE of one student's assignment."""
    coursedir = CourseDirectory(parent=parent)
    return (
        Path(coursedir.format_path(coursedir.autograded_directory, student, assignment))
        / FLAGS_FILE
    )


def read_flags(path: Path) -> dict[str, list[str]]:
    """Notebook -> the reasons it was flagged, from a FLAGS_FILE ({} if none)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def flag(info: dict) -> None:
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


def has_cjk(cells: list) -> bool:
    """Whether the markdown cells are written in Chinese (the zh_CN edition)."""
    text = "".join(c.source for c in cells if c.cell_type == "markdown")
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


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
        CourseInstall(parent=self).verify(info["student"], after=False)
        coursedir = CourseDirectory(parent=self)
        path = os.path.join(
            coursedir.format_path(coursedir.source_directory, ".", info["assignment"]),
            f"{info['notebook']}.ipynb",
        )
        source = nbformat.read(path, as_version=4)
        stub = self._stub(source)
        matched = self._match(source.cells, nb.cells, stub)
        findings = self._findings(source.cells, nb.cells, matched, stub)
        if has_cjk(source.cells) != has_cjk(nb.cells) and any(
            c.cell_type == "markdown" for c in nb.cells
        ):
            self.log.warning(
                "%s/%s: %s", info["student"], info["notebook"], self._edition(source, info)
            )
            read_only = {
                c.metadata.get("nbgrader", {}).get("grade_id", f"cell {i}")
                for i, c in enumerate(source.cells)
                if not utils.is_grade(c) and not utils.is_solution(c)
            }
            findings = [f for f in findings if not self._about(f, read_only)]
        findings += self._extra_files(info)
        nb.cells = self._rebuilt(source.cells, nb.cells, matched, stub)
        nb.metadata.pop("widgets", None)  # Colab's widget state: nothing to grade, often invalid
        nb.nbformat, nb.nbformat_minor = 4, max(5, nb.get("nbformat_minor", 0))
        for finding in findings:
            self.log.warning("%s/%s: %s", info["student"], info["notebook"], finding)
        flags = flags_path(self, info["student"], info["assignment"])
        saved = {k: v for k, v in read_flags(flags).items() if k != info["notebook"]}
        flags.parent.mkdir(parents=True, exist_ok=True)
        flags.write_text(json.dumps({**saved, info["notebook"]: findings}), encoding="utf-8")
        if findings:
            flag(info)
        resources.setdefault("course", {})["findings"] = findings
        return nb, resources

    @staticmethod
    def _about(finding: str, names: set[str]) -> bool:
        """Whether `finding` is an edit of one of the cells `names`."""
        return any(finding == f"cell {n} was edited (restored)" for n in names)

    @staticmethod
    def _edition(source: NotebookNode, info: dict) -> str:
        """The log line for a notebook of the other edition than the assignment's."""
        chinese = has_cjk(source.cells)
        mine, theirs = ("Chinese", "English") if chinese else ("English", "Chinese")
        aid = info["assignment"]
        other = aid.removesuffix("_zh") if chinese else f"{aid}_zh"
        return (
            f"this is the {theirs} edition of the notebook, collected into the {mine} "
            f"assignment {aid}: it is graded here (hints in {mine}); collect it into {other} "
            "to grade it in its own language. Its read-only cells are restored, not flagged"
        )

    def _extra_files(self, info: dict) -> list[str]:
        """Remove the files the submission brought besides notebooks; the finding, if any."""
        coursedir = CourseDirectory(parent=self)
        folder = Path(
            coursedir.format_path(
                coursedir.autograded_directory, info["student"], info["assignment"]
            )
        )
        extra = [
            p
            for p in sorted(folder.rglob("*"))
            if p.is_file()
            and p.suffix != ".ipynb"
            and p.relative_to(folder).as_posix() not in NBGRADER_FILES
        ]
        for path in extra:
            path.unlink()
        for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
            shutil.rmtree(sub, ignore_errors=True)
        if not extra:
            return []
        names = ", ".join(p.relative_to(folder).as_posix() for p in extra)
        return [f"the submission brought files besides its notebook (removed): {names}"]

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
            if utils.is_solution(original):
                for key in ("nbgrader", "deletable", "editable"):
                    if key in original.metadata:
                        cell.metadata[key] = copy.deepcopy(original.metadata[key])
            else:  # a locked cell: all its metadata (tags included) is the source's
                cell.metadata = copy.deepcopy(original.metadata)
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


def timed_out(cell: NotebookNode) -> bool:
    """Whether a cell's outputs say it ran out of time or lost its kernel."""
    names = {o.get("ename") for o in cell.get("outputs", []) if o.output_type == "error"}
    return bool(names & {"CellTimeoutError", "DeadKernelError"})


class RecoveringExecute(Execute):
    """Execute that grades on past a cell the kernel never comes back from, within limits,
    and scores a test cell only if the course's strict checker ran and passed in it."""

    max_restarts = Integer(
        2, help="Kernel restarts allowed per submission; after that, later cells are not run."
    ).tag(config=True)
    time_budget = Integer(
        900, help="Seconds one submission may take; after that, later cells are not run."
    ).tag(config=True)

    def preprocess(
        self, nb: NotebookNode, resources: ResourcesDict, km: object = None
    ) -> tuple[NotebookNode, ResourcesDict]:
        info = resources.get("nbgrader", {})
        self._who = f"{info.get('student', '?')}/{info.get('notebook', '?')}"
        self._restarts, self._stopped, self._start = 0, "", time.monotonic()
        self._findings: list[str] = []
        flags = flags_path(self, info["student"], info["assignment"]) if info else None
        before = read_flags(flags) if flags else {}
        try:
            return super().preprocess(nb, resources, km=km)
        finally:
            if flags:
                mine = before.get(info["notebook"], []) + self._findings
                flags.write_text(json.dumps({**before, info["notebook"]: mine}), encoding="utf-8")
                if self._findings:
                    flag(info)
                CourseInstall(parent=self).verify(info["student"], after=True)

    def preprocess_cell(
        self, cell: NotebookNode, resources: ResourcesDict, index: int
    ) -> tuple[NotebookNode, ResourcesDict]:
        if cell.cell_type != "code":
            return super().preprocess_cell(cell, resources, index)
        name = cell.metadata.get("nbgrader", {}).get("grade_id", "")
        where = f"{self._who} cell {index}{f' ({name})' if name else ''}"
        if not self._stopped and time.monotonic() - self._start > self.time_budget:
            self._stop(f"the submission used up its {self.time_budget} s", where)
        if not self._stopped:
            return self._graded(cell, resources, index, where)
        cell.outputs = [self._error("NotRun", f"not run: {self._stopped}")]
        return cell, resources

    def _graded(
        self, cell: NotebookNode, resources: ResourcesDict, index: int, where: str
    ) -> tuple[NotebookNode, ResourcesDict]:
        """Run one cell; in a test cell, with a new token the strict checker must show."""
        source, token = cell.source, secrets.token_hex(16)
        tokened = utils.is_grade(cell) and TOKEN_PLACEHOLDER in source
        cell.source = source.replace(TOKEN_PLACEHOLDER, token)
        try:
            cell, resources = self._recovering(cell, resources, index, where)
        finally:
            cell.source = source
        shown = [o for o in cell.outputs if MARKER_MIME in o.get("data", {})]
        cell.outputs = [o for o in cell.outputs if o not in shown]
        failed = any(o.output_type == "error" for o in cell.outputs)
        if (
            tokened
            and not failed
            and not any(o.data[MARKER_MIME] == {"token": token} for o in shown)
        ):
            why = "the course's checker did not run in this test cell (0 points)"
            self.log.warning("%s: %s", where, why)
            self._findings.append(f"cell {cell.metadata['nbgrader']['grade_id']}: {why}")
            cell.outputs.append(self._error("GradingNotRun", why))
        return cell, resources

    def _recovering(
        self, cell: NotebookNode, resources: ResourcesDict, index: int, where: str
    ) -> tuple[NotebookNode, ResourcesDict]:
        """Run one cell; if the kernel never comes back from it, restart and replay."""
        try:
            return super().preprocess_cell(cell, resources, index)
        except (CellTimeoutError, DeadKernelError) as exc:
            what = type(exc).__name__
            msg = f"{what}: the kernel did not come back from this cell; it was restarted"
            cell.outputs.append(self._error(what, msg))
            self._restarts += 1
            if self._restarts > self.max_restarts:
                self._stop(f"the kernel was restarted {self.max_restarts} times already", where)
                return cell, self.resources
            self.log.warning(
                "%s: %s; restarting the kernel (%d of at most %d), running earlier cells again",
                where,
                what,
                self._restarts,
                self.max_restarts,
            )
            self._restart_and_replay(index)
            return cell, self.resources

    def _stop(self, why: str, where: str) -> None:
        """Run no more cells of this submission."""
        self._stopped = f"{why}; the cells after this one were not run"
        self.log.warning("%s: %s", where, self._stopped)

    @staticmethod
    def _error(ename: str, text: str) -> NotebookNode:
        """An error output (it costs a test cell its points)."""
        return nbformat.v4.new_output(
            "error", ename=ename, evalue="", traceback=[f"{ename}: {text}"]
        )

    def _restart_and_replay(self, index: int) -> None:
        """A fresh kernel in the state the cells before `index` leave (test cells left out);
        a cell that hangs again is marked, and the replay stops there."""
        run_sync(self.km.restart_kernel)(now=True)
        run_sync(self.kc.wait_for_ready)(timeout=self.startup_timeout)
        for n, earlier in enumerate(self.nb.cells[:index]):
            if earlier.cell_type != "code" or utils.is_grade(earlier) or timed_out(earlier):
                continue
            try:
                self.execute_cell(copy.deepcopy(earlier), n, store_history=False)
            except (CellTimeoutError, DeadKernelError) as exc:
                what = type(exc).__name__
                self.log.warning(
                    "%s cell %s hangs again when replayed: replay stopped", self._who, n
                )
                earlier.outputs.append(
                    self._error(what, "hung again when replayed after a restart")
                )
                self._restarts += 1
                run_sync(self.km.restart_kernel)(now=True)
                run_sync(self.kc.wait_for_ready)(timeout=self.startup_timeout)
                if self._restarts > self.max_restarts:
                    self._stop(
                        f"the kernel was restarted {self.max_restarts} times already",
                        f"{self._who} cell {n}",
                    )
                return


class GradeOnErrorsOnly(NbGraderPreprocessor):
    """Test cells' stderr output becomes ordinary output: only an error costs the points; a
    test cell with an error scores 0 even if it displayed a result first."""

    def preprocess_cell(
        self, cell: NotebookNode, resources: ResourcesDict, index: int
    ) -> tuple[NotebookNode, ResourcesDict]:
        if utils.is_grade(cell) and cell.cell_type == "code":
            failed = any(o.output_type == "error" for o in cell.outputs)
            for output in cell.outputs:
                if output.output_type == "stream" and output.name == "stderr":
                    output.name = "stdout"
                if failed and output.output_type == "execute_result":
                    output.output_type = "display_data"  # nbgrader counts a result as credit
                    output.pop("execution_count", None)
        return cell, resources


def natural(name: str) -> list:
    """A sort key that puts ex2 before ex10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


class ExerciseCsvExporter(ExportPlugin):
    """``nbgrader export``: one CSV row per student of the gradebook, assignment and exercise."""

    to = Unicode("grades_by_exercise.csv", help="The CSV file to write.").tag(config=True)
    FIELDS = (
        "student",
        "assignment",
        "notebook",
        "exercise",
        "points",
        "max_points",
        "submitted",
        "late_penalty",
        "flagged",
        "flag_reasons",
    )

    def export(self, gradebook: Gradebook) -> None:
        with open(self.to or "grades_by_exercise.csv", "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=self.FIELDS)
            writer.writeheader()
            for row in self.rows(gradebook):
                writer.writerow(row)
        self.log.info("Wrote %s", self.to)

    def rows(self, gradebook: Gradebook) -> list[dict]:
        """The rows: every student, for the assignments asked for (all by default)."""
        out = []
        for assignment in sorted(gradebook.assignments, key=lambda a: natural(a.name)):
            if self.assignment and assignment.name not in self.assignment:
                continue
            for student in sorted(gradebook.students, key=lambda s: s.id):
                if self.student and student.id not in self.student:
                    continue
                out += self._student_rows(gradebook, assignment, student.id)
        return out

    def _student_rows(self, gradebook: Gradebook, assignment: object, student: str) -> list[dict]:
        """One student's rows of one assignment: 0 and not submitted when nothing came in."""
        reasons = read_flags(flags_path(self, student, assignment.name))
        out = []
        for notebook in sorted(assignment.notebooks, key=lambda n: natural(n.name)):
            try:
                sub = gradebook.find_submission_notebook(notebook.name, assignment.name, student)
            except MissingEntry:
                sub = None
            grades = {g.cell.name: g for g in sub.grades} if sub else {}
            for cell in sorted(notebook.grade_cells, key=lambda c: natural(c.name)):
                grade = grades.get(cell.name)
                out.append(
                    {
                        "student": student,
                        "assignment": assignment.name,
                        "notebook": notebook.name,
                        "exercise": cell.name,
                        "points": grade.score if grade else 0.0,
                        "max_points": cell.max_score,
                        "submitted": sub is not None,
                        "late_penalty": (sub.late_submission_penalty or 0.0) if sub else 0.0,
                        "flagged": bool(sub and sub.flagged),
                        "flag_reasons": "; ".join(reasons.get(notebook.name, [])) if sub else "",
                    }
                )
        return out
