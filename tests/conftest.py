"""Shared test fixtures: the repository layout and the solution/stub functions of exercises."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import nbfiles

ROOT = Path(__file__).resolve().parent.parent


def exercise_namespace(path: Path | str) -> dict[str, Any]:
    """Execute the code cells of an exercise/solutions notebook that hold a solution region.

    Such cells must be self-contained (their own imports, no magics), so tests can get the
    learner-facing functions without running the whole notebook. In a solutions notebook this
    gives the solutions; in the generated exercise notebook, the untouched stubs.
    """
    path = ROOT / path
    nb = nbfiles.read(path)
    namespace: dict[str, Any] = {"__name__": f"exercise_{path.stem}"}
    marker = "### BEGIN SOLUTION" if "solutions" in path.parts else "# YOUR CODE HERE"
    cells = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
    if not cells:
        raise AssertionError(f"{path.name}: no exercise cells found")
    for cell in cells:
        ast.parse(cell.source)  # magics are not allowed in exercise cells
        exec(compile(cell.source, f"{path.name}", "exec"), namespace)
    return namespace


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
