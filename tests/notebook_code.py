"""Read code out of a chapter notebook for tests: its functions by name, or one cell by a marker.

Tests run a notebook's own table-and-verdict functions with stubbed timings (so a verdict can be
checked against the table it prints) without running the notebook. Cells with IPython magics
are skipped: they are setup cells, which define no function.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import nbformat


def code_cells(path: Path) -> list[str]:
    """The source of every code cell of the notebook at `path`, in order."""
    nb = nbformat.read(str(path), as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def notebook_functions(path: Path, names: list[str], namespace: dict[str, Any]) -> list[str]:
    """Define, in `namespace`, the notebook's top-level functions named in `names`; returns those found."""
    found = []
    for source in code_cells(path):
        try:
            tree = ast.parse(source)
        except SyntaxError:  # a cell with magics
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                module = ast.Module(body=[node], type_ignores=[])
                exec(compile(module, f"{path.name}:{node.name}", "exec"), namespace)
                found.append(node.name)
    return found


def cell_containing(path: Path, marker: str) -> str:
    """The source of the one code cell that contains `marker`."""
    cells = [s for s in code_cells(path) if marker in s]
    if len(cells) != 1:
        raise LookupError(f"{path.name}: {len(cells)} code cells contain {marker!r}, expected 1")
    return cells[0]
