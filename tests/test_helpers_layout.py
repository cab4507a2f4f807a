"""The shape of helpers/: no import cycles, no hidden (function-level) imports between its
modules, and every public name defined in one module only.

Read statically (ast), so a lazy import inside a function counts as much as one at the top.
helpers/scripts/ is left out of the name check: each script is a standalone torchrun program
with its own main()."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

HELPERS = Path(__file__).resolve().parent.parent / "helpers"

#: Public names still defined in more than one module, and why. Remove an entry when it is
#: fixed; the test fails on any other duplicate.
KNOWN_DUPLICATES: dict[str, str] = {}


def modules() -> dict[str, Path]:
    """'helpers.x.y' -> its file, for every module of the package."""
    found = {}
    for path in HELPERS.rglob("*.py"):
        parts = path.relative_to(HELPERS.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(path: Path, known: set[str]) -> list[tuple[str, bool]]:
    """(imported helpers module, at the top level?) for every import in one file."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            if name in known:
                found.append((name, id(node) in top))
    return found


def graph() -> dict[str, set[str]]:
    """helpers module -> the helpers modules it imports (a package's __init__ left out)."""
    mods = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        for target, _ in imports(path, set(mods)):
            if target != name and not name.startswith(target + "."):
                edges[name].add(target)
    return edges


def cycle_from(start: str, edges: dict[str, set[str]]) -> list[str] | None:
    """A path start -> ... -> start through the import graph, if there is one."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(edges.get(node, ())):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_no_import_cycle_in_helpers() -> None:
    edges = graph()
    cycles = [c for name in sorted(modules()) if (c := cycle_from(name, edges))]
    assert not cycles, "import cycle: " + " -> ".join(cycles[0])


def test_no_hidden_import_between_helpers_modules() -> None:
    mods = modules()
    hidden = [
        f"{path.relative_to(HELPERS.parent)} imports {target} inside a function"
        for name, path in sorted(mods.items())
        for target, at_top in imports(path, set(mods))
        if not at_top and target != name
    ]
    assert not hidden, "\n".join(hidden)


def test_every_public_helper_name_is_defined_once() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for name, path in sorted(modules().items()):
        if name.startswith("helpers.scripts"):
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined = [node.name]
            elif isinstance(node, ast.Assign):
                defined = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                defined = [node.target.id]
            else:
                continue
            where.update({d: [*where[d], name] for d in defined if not d.startswith("_")})
    twice = {n: mods for n, mods in where.items() if len(mods) > 1}
    unexpected = {n: m for n, m in twice.items() if n not in KNOWN_DUPLICATES}
    assert not unexpected, f"defined in more than one module: {unexpected}"
    fixed = set(KNOWN_DUPLICATES) - set(twice)
    assert not fixed, f"{fixed} is defined once now: remove it from KNOWN_DUPLICATES"


#: helpers.i18n imports only the standard library (matplotlib inside use_cjk_font): the ground
#: floor may translate its messages.
GROUND_FLOOR = ("helpers.units", "helpers.validate", "helpers.models", "helpers.i18n")


def test_the_ground_floor_imports_nothing_from_the_course() -> None:
    mods = modules()
    for name in GROUND_FLOOR:
        above = {t for t, _ in imports(mods[name], set(mods))} - set(GROUND_FLOOR)
        assert not above, f"{name} may import only torch, the standard library and {GROUND_FLOOR}"
