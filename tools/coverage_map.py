"""Which lines of helpers/ no CPU test runs, and whether each is listed with its reason (make coverage).

Reads the data of `coverage run` (the unit tests) and tests/gpu_only_lines.md, prints every line
of helpers/ that no test ran, grouped by function, with the reason the list gives, then the total.
It exits 1 when

- a line that no test runs is in a function the list does not name (test it: most device
  branches can run through the fake_gpu fixture in tests/fake_gpu.py; else list it, with why),
- a listed function has more unrun lines than the list allows (a new untested branch crept in),
- the total is under --min percent (95).

The list names functions, not line numbers, so that it survives edits elsewhere in a file:
``| helpers/timing.py | _cuda_measurement | 12 | CUDA events time the GPU's own clock |``
allows up to 12 unrun lines inside ``_cuda_measurement`` (its nested functions included; a
method is ``Class.method``; ``<module>`` is the module's top level). Entries whose function
is now fully run, or no longer exists, are reported as stale so the list stays honest.

    python tools/coverage_map.py [--data build/.coverage] [--list tests/gpu_only_lines.md] [--min 95]
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULE = "<module>"


@dataclass
class Entry:
    """One row of the list: a function of a module that may leave `allowed` lines unrun."""

    path: str
    function: str
    allowed: int
    reason: str
    unrun: list[int] = field(default_factory=list)

    def covers(self, path: str, qualname: str) -> bool:
        """Whether a line in `qualname` of `path` is this entry's (nested functions included)."""
        if path != self.path:
            return False
        return qualname == self.function or qualname.startswith(self.function + ".")


def read_list(path: Path) -> list[Entry]:
    """The table rows of gpu_only_lines.md: | module | function | lines | reason |."""
    entries = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip().strip("`") for c in raw.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("helpers/"):
            continue
        try:
            allowed = int(cells[2])
        except ValueError:
            raise SystemExit(f"{path}: the lines column must be a number: {raw!r}") from None
        entries.append(Entry(cells[0], cells[1], allowed, " | ".join(cells[3:])))
    return entries


def qualnames(source: str) -> dict[int, str]:
    """Line number -> the innermost function or class holding it ('A.f', 'f.inner'), else <module>."""
    names: dict[int, str] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}" if prefix else child.name
                start = min([child.lineno] + [d.lineno for d in child.decorator_list])
                for line in range(start, (child.end_lineno or child.lineno) + 1):
                    names[line] = name
                visit(child, name)
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return names


def ranges(lines: list[int]) -> str:
    """[3, 4, 5, 9] -> '3-5, 9'."""
    out, start, prev = [], None, None
    for n in sorted(lines):
        if start is None:
            start = prev = n
        elif n == prev + 1:
            prev = n
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = n
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)


def main(argv: list[str] | None = None) -> int:
    """Print the map of unrun lines; 0 if every one is listed and the total reaches --min."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT / "build" / ".coverage"))
    parser.add_argument("--list", default=str(ROOT / "tests" / "gpu_only_lines.md"))
    parser.add_argument("--min", type=float, default=95.0)
    args = parser.parse_args(argv)

    import coverage

    cov = coverage.Coverage(data_file=args.data)
    cov.load()
    entries = read_list(Path(args.list))
    files = sorted(
        f for f in cov.get_data().measured_files() if Path(f).resolve().is_relative_to(ROOT)
    )
    total_statements = total_unrun = 0
    problems: list[str] = []
    print(f"{'module':<34} {'lines':>6} {'unrun':>6} {'run':>7}")
    for filename in files:
        rel = Path(filename).resolve().relative_to(ROOT).as_posix()
        _, statements, _, missing, _ = cov.analysis2(filename)
        total_statements += len(statements)
        total_unrun += len(missing)
        share = 100.0 * (1 - len(missing) / len(statements)) if statements else 100.0
        print(f"{rel:<34} {len(statements):>6} {len(missing):>6} {share:>6.1f}%")
        if not missing:
            continue
        where = qualnames(Path(filename).read_text(encoding="utf-8"))
        by_function: dict[str, list[int]] = {}
        for line in missing:
            by_function.setdefault(where.get(line, MODULE), []).append(line)
        for qualname, lines in by_function.items():
            entry = next((e for e in entries if e.covers(rel, qualname)), None)
            if entry is None:
                problems.append(
                    f"{rel}:{ranges(lines)} ({qualname}) is run by no test and not listed in "
                    f"{Path(args.list).name}: test it (tests/fake_gpu.py) or list it with why."
                )
            else:
                entry.unrun += lines

    print("\nNot run by any CPU test, and why (tests/gpu_only_lines.md):")
    for entry in entries:
        if entry.unrun:
            print(f"  {entry.path}::{entry.function} lines {ranges(entry.unrun)}: {entry.reason}")
        if len(entry.unrun) > entry.allowed:
            problems.append(
                f"{entry.path}::{entry.function} has {len(entry.unrun)} unrun lines, the list "
                f"allows {entry.allowed}: a new branch no test runs. Test it, or raise the count "
                f"with a reason."
            )
    stale = [e for e in entries if not e.unrun]
    for entry in stale:
        print(f"  stale entry (now run by a test, or gone): {entry.path}::{entry.function}")

    share = 100.0 * (1 - total_unrun / total_statements) if total_statements else 0.0
    print(
        f"\nTOTAL helpers/: {total_statements} lines, {total_unrun} not run on the CPU, "
        f"{share:.1f}% run (minimum {args.min:g}%)"
    )
    if share < args.min:
        problems.append(f"only {share:.1f}% of helpers/ ran, under the {args.min:g}% minimum.")
    for problem in problems:
        print(f"FAIL: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
