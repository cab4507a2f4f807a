"""Generate exercises/*.ipynb from solutions/*.ipynb (never edit exercises by hand).

    python tools/make_exercises.py          # write exercises/
    python tools/make_exercises.py --check  # exit 1 if exercises/ drifted from solutions/

Rules, applied to every solutions/NN_name_solutions.ipynb:

- In code cells, a region between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` becomes a
  stub at the same indentation: ``# YOUR CODE HERE`` and ``raise NotImplementedError(...)``.
  A region must sit inside a function body (indented), so that an untouched exercise
  notebook still runs top to bottom and its checks say "not done yet".
- A ``### BEGIN STUB`` ... ``### END STUB`` region, written as comments in the solution, is
  uncommented in the exercise and replaces the default stub (for "fix this code" exercises).
- In markdown cells, text between ``<!-- BEGIN SOLUTION -->`` and ``<!-- END SOLUTION -->``
  is removed (answers, the "solutions" in the title).
- Links and badges to ``solutions/NN_name_solutions.ipynb`` point at the exercise instead.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

import nbfiles as nbtools

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB_BEGIN, STUB_END = "### BEGIN STUB", "### END STUB"
MD_REGION = re.compile(r"<!-- BEGIN SOLUTION -->.*?<!-- END SOLUTION -->", flags=re.S)


class ExerciseError(ValueError):
    """A solutions notebook breaks the marker rules."""


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def stub_code(source: str, where: str) -> str:
    """Replace solution regions in one code cell's source with stubs."""
    out: list[str] = []
    lines = source.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == BEGIN:
            indent = _indent(line)
            if not indent:
                raise ExerciseError(
                    f"{where}: '{BEGIN}' must be inside a function body (indented)."
                )
            j = i + 1
            while j < len(lines) and lines[j].strip() != END:
                if lines[j].strip() in (BEGIN, STUB_BEGIN):
                    raise ExerciseError(f"{where}: nested marker at line {j + 1}.")
                j += 1
            if j == len(lines):
                raise ExerciseError(f"{where}: '{BEGIN}' at line {i + 1} has no '{END}'.")
            k = j + 1
            stub: list[str] | None = None
            if k < len(lines) and lines[k].strip() == STUB_BEGIN:
                m = k + 1
                stub = []
                while m < len(lines) and lines[m].strip() != STUB_END:
                    body = lines[m]
                    if body.strip() and not body.lstrip().startswith("#"):
                        raise ExerciseError(f"{where}: stub lines must be comments (line {m + 1}).")
                    stub.append(re.sub(r"^(\s*)# ?", r"\1", body, count=1))
                    m += 1
                if m == len(lines):
                    raise ExerciseError(f"{where}: '{STUB_BEGIN}' has no '{STUB_END}'.")
                k = m + 1
            out.append(f"{indent}# YOUR CODE HERE")
            if stub is None:
                out.append(f'{indent}raise NotImplementedError("Write your solution here.")')
            else:
                out.extend(stub)
            i = k
            continue
        if line.strip() in (END, STUB_BEGIN, STUB_END):
            raise ExerciseError(f"{where}: '{line.strip()}' at line {i + 1} without '{BEGIN}'.")
        out.append(line)
        i += 1
    return "\n".join(out)


def exercise_path(solution: Path) -> Path:
    """solutions/01_devices_solutions.ipynb -> exercises/01_devices_exercises.ipynb"""
    if not solution.name.endswith("_solutions.ipynb"):
        raise ExerciseError(
            f"{solution.name}: solutions notebooks are named NN_topic_solutions.ipynb."
        )
    return (
        nbtools.ROOT / "exercises" / solution.name.replace("_solutions.ipynb", "_exercises.ipynb")
    )


def make_exercise(solution: Path) -> nbformat.NotebookNode:
    """The exercise notebook generated from one solutions notebook."""
    nb = nbtools.read(solution)
    target = exercise_path(solution)
    old, new = f"solutions/{solution.name}", f"exercises/{target.name}"
    regions = 0
    for n, cell in enumerate(nb.cells):
        where = f"{solution.name} cell {n}"
        src = cell.source.replace(old, new)
        if cell.cell_type == "code":
            regions += src.count(BEGIN)
            src = stub_code(src, where)
        elif cell.cell_type == "markdown":
            src = MD_REGION.sub("", src)
            if "<!-- BEGIN SOLUTION -->" in src or "<!-- END SOLUTION -->" in src:
                raise ExerciseError(f"{where}: unbalanced markdown solution markers.")
        cell.source = src
    if regions == 0:
        raise ExerciseError(
            f"{solution.name}: no '{BEGIN}' region, so there is nothing to exercise."
        )
    return nbtools.clean(nb)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="fail if exercises/ differ from what would be generated",
    )
    args = parser.parse_args(argv)
    solutions = sorted((nbtools.ROOT / "solutions").glob("*_solutions.ipynb"))
    expected = {exercise_path(s): nbtools.dumps(make_exercise(s)) for s in solutions}
    problems = []
    for path, text in expected.items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            problems.append(
                f"{'drifted' if current else 'missing'}: {path.relative_to(nbtools.ROOT)}"
            )
            if not args.check:
                path.write_text(text, encoding="utf-8")
    for path in sorted((nbtools.ROOT / "exercises").glob("*.ipynb")):
        if path not in expected:
            problems.append(f"orphan (no solutions notebook): {path.relative_to(nbtools.ROOT)}")
    for p in problems:
        print(p if args.check else f"wrote {p}")
    if args.check and problems:
        print("Run `python tools/make_exercises.py` to regenerate exercises/ from solutions/.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
