"""Notebook plumbing shared by the tools and the tests: reading, cleaning, writing.

Notebooks are stored without outputs or execution counts, with one standard metadata block
(Python 3 kernel; Colab opens chapters on a GPU runtime).
"""

from __future__ import annotations

import ast
import json
import linecache
from pathlib import Path
from typing import Any

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIRS = ("notebooks", "solutions", "exercises", "templates")

STANDARD_METADATA = {
    "accelerator": "GPU",
    "colab": {"provenance": [], "gpuType": "T4"},
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


def all_notebooks() -> list[Path]:
    """Every course notebook, in a stable order."""
    return sorted(p for d in NOTEBOOK_DIRS for p in (ROOT / d).glob("*.ipynb"))


def read(path: Path) -> nbformat.NotebookNode:
    """Read a notebook as nbformat v4."""
    return nbformat.read(str(path), as_version=4)


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop outputs, execution counts and per-cell noise; set the standard metadata."""
    for cell in nb.cells:
        cell.metadata = {k: v for k, v in cell.metadata.items() if k == "tags"}
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
    nb.metadata = json.loads(json.dumps(STANDARD_METADATA))
    nb.nbformat, nb.nbformat_minor = 4, 5
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:03d}"
    return nb


def dumps(nb: nbformat.NotebookNode) -> str:
    """The exact text a clean notebook is stored as."""
    return nbformat.writes(nb) + "\n"


def exercise_namespace(path: Path | str) -> dict[str, Any]:
    """Execute the code cells of an exercise/solutions notebook that hold a solution region.

    Such cells must be self-contained (their own imports, no magics), so tests can get the
    learner-facing functions without running the whole notebook. In a solutions notebook this
    gives the solutions; in the generated exercise notebook, the untouched stubs.
    """
    path = ROOT / path
    nb = read(path)
    namespace: dict[str, Any] = {"__name__": f"exercise_{path.stem}"}
    marker = "### BEGIN SOLUTION" if "solutions" in path.parts else "# YOUR CODE HERE"
    cells = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
    if not cells:
        raise AssertionError(f"{path.name}: no exercise cells found")
    for n, cell in enumerate(cells):
        ast.parse(cell.source)  # magics are not allowed in exercise cells
        # Each cell's source goes into linecache, as IPython does, so that code which reads its
        # own source (inspect.getsource, triton.jit) works on the functions defined here.
        filename = f"<{path.name} cell {n}>"
        linecache.cache[filename] = (len(cell.source), None, cell.source.splitlines(True), filename)
        exec(compile(cell.source, filename, "exec"), namespace)
    return namespace
