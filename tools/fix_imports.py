"""Point every `from helpers.X import name` at the module that defines `name` now.

    python tools/fix_imports.py                 # every .py file and notebook of the repository
    python tools/fix_imports.py --check         # list what would change; exit 1 if anything
    python tools/fix_imports.py tests/test_x.py notebooks/02_training_loop.ipynb

For maintainers who move a helper from one module to another: the definitions are read from
helpers/ (top-level def, class and assignments), and each imported name whose module no longer
defines it is imported from the one module that does. A name defined in several modules, or in
none, is reported and left alone. Notebooks are rewritten cell by cell, nothing else changes.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HELPERS = ROOT / "helpers"
SKIP_DIRS = {".git", "executed", "gpu-check", "artifacts", "build", "dist"}


def module_name(path: Path) -> str:
    """helpers/checks/ch01.py -> 'helpers.checks.ch01'; a package's __init__ -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def definitions() -> tuple[dict[str, set[str]], set[str]]:
    """name -> the helpers modules that define it at top level; and every module's name."""
    defined: dict[str, set[str]] = defaultdict(set)
    modules = set()
    for path in sorted(HELPERS.rglob("*.py")):
        mod = module_name(path)
        modules.add(mod)
        for node in ast.parse(path.read_text()).body:
            names: list[str] = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    elts = t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]
                    names += [e.id for e in elts if isinstance(e, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names = [node.target.id]
            for name in names:
                defined[name].add(mod)
    return defined, modules


def _parseable(source: str) -> str:
    """Notebook source with IPython magics and shell lines blanked (same line numbers)."""
    return "\n".join(
        line[: len(line) - len(line.lstrip())] + "pass"
        if line.lstrip().startswith(("%", "!"))
        else line
        for line in source.split("\n")
    )


def _render(indent: str, mod: str, names: list[str]) -> str:
    """One import statement, wrapped in parentheses when it would pass 100 characters."""
    one = f"{indent}from {mod} import {', '.join(names)}"
    if len(one) <= 100:
        return one
    body = "".join(f"{indent}    {n},\n" for n in names)
    return f"{indent}from {mod} import (\n{body}{indent})"


def fix_source(
    source: str, own: str | None, defined: dict[str, set[str]], modules: set[str], where: str
) -> tuple[str, list[str]]:
    """The source with its helpers imports repointed, and warnings for what it could not fix."""
    try:
        tree = ast.parse(source if where.endswith(".py") else _parseable(source))
    except SyntaxError:
        return source, [f"{where}: not parseable, left alone"]
    lines = source.split("\n")
    warnings: list[str] = []
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
            continue
        if not (node.module == "helpers" or node.module.startswith("helpers.")):
            continue
        if node.module == "helpers":
            for a in node.names:
                if f"helpers.{a.name}" not in modules:
                    warnings.append(f"{where}:{node.lineno}: helpers.{a.name} does not exist")
            continue
        targets: dict[str, list[str]] = {}
        changed = False
        for a in node.names:
            shown = a.name if a.asname is None else f"{a.name} as {a.asname}"
            mod = node.module
            if f"{mod}.{a.name}" in modules:  # a submodule import, `from helpers import x`
                pass
            elif mod not in modules or mod not in defined.get(a.name, set()):
                homes = defined.get(a.name, set())
                if len(homes) == 1:
                    mod = next(iter(homes))
                    changed = True
                else:
                    where_from = ", ".join(sorted(homes)) or "no module"
                    warnings.append(f"{where}:{node.lineno}: {a.name} is defined in {where_from}")
            if mod == own:  # now defined in the importing module itself
                changed = True
                continue
            targets.setdefault(mod, []).append(shown)
        if not changed:
            continue
        first = lines[node.lineno - 1]
        indent = first[: len(first) - len(first.lstrip())]
        text = "\n".join(_render(indent, m, ns) for m, ns in targets.items())
        edits.append((node.lineno - 1, node.end_lineno or node.lineno, text))
    for start, end, text in sorted(edits, reverse=True):
        lines[start:end] = text.split("\n") if text else []
    return "\n".join(lines), warnings


def fix_file(path: Path, defined: dict, modules: set, write: bool) -> tuple[bool, list[str]]:
    """Fix one .py file or notebook; (changed?, warnings)."""
    where = str(path.relative_to(ROOT))
    if path.suffix == ".py":
        own = module_name(path) if HELPERS in path.parents else None
        old = path.read_text()
        new, warnings = fix_source(old, own, defined, modules, where)
        if new != old and write:
            path.write_text(new)
        return new != old, warnings
    nb = json.loads(path.read_text())
    changed, warnings = False, []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        old = "".join(cell["source"])
        new, w = fix_source(old, None, defined, modules, f"{where}[cell {i}]")
        warnings += w
        if new != old:
            changed = True
            cell["source"] = new.splitlines(keepends=True)
    if changed and write:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return changed, warnings


def all_files() -> list[Path]:
    """Every .py file and notebook of the repository, build and venv folders left out."""
    found = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT).parts
        if any(p in SKIP_DIRS or p.startswith(".") for p in rel):
            continue
        if path.suffix in (".py", ".ipynb") and path.is_file():
            found.append(path)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if needed")
    args = parser.parse_args(argv)
    defined, modules = definitions()
    paths = [p.resolve() for p in args.paths] or all_files()
    changed_any = False
    for path in paths:
        changed, warnings = fix_file(path, defined, modules, write=not args.check)
        for w in warnings:
            print(f"warning: {w}")
        if changed:
            changed_any = True
            print(f"{'would fix' if args.check else 'fixed'}: {path.relative_to(ROOT)}")
    return 1 if (args.check and changed_any) else 0


if __name__ == "__main__":
    sys.exit(main())
