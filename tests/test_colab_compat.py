"""Colab compatibility: the course opens from its badges, installs without a restart, and uses
only matplotlib-inline and the ipywidgets API that 7.7.1 (Colab's) and 8.x share.

tests/test_notebook_hygiene.py already checks that every notebook's badge points at its own
path and that its setup cell is the template's. This file adds what Colab needs beyond that.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import ipywidgets
import pytest
from packaging.requirements import Requirement

import nbfiles

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
REPO_URL = PYPROJECT["tool"]["course"]["repository"]  # the one source (tools/set_repo.py)
BRANCH = PYPROJECT["tool"]["course"]["branch"]
GITHUB_PATH = REPO_URL.removeprefix("https://github.com/")
NOTEBOOKS = nbfiles.all_notebooks()
HELPERS = sorted((ROOT / "helpers").rglob("*.py"))

# What Google Colab's runtime ships (2025): installing the course must keep every one of these,
# or Colab replaces a package that is already imported and asks for a runtime restart.
COLAB_PREINSTALLED = {
    "torch": ["2.6.0", "2.8.0"],
    "numpy": ["1.26.4", "2.0.2"],
    "matplotlib": ["3.10.0"],
    "ipywidgets": ["7.7.1"],
}
# Every public widget class and function of ipywidgets 7.7.1 (read off an installed 7.7.1);
# ipywidgets 8 has them all too. Anything else (Stack, TagsInput, Datetime, ...) is 8-only.
IPYWIDGETS_7_NAMES = {
    *"Accordion AppLayout Audio BoundedFloatText BoundedIntText Box Button ButtonStyle Checkbox "
    "ColorPicker Combobox Controller CoreWidget DOMWidget DatePicker Dropdown FileUpload "
    "FloatLogSlider FloatProgress FloatRangeSlider FloatSlider FloatText GridBox "
    "GridspecLayout HBox HTML HTMLMath Image IntProgress IntRangeSlider IntSlider IntText Label "
    "Layout Output Password Play RadioButtons Select SelectMultiple SelectionRangeSlider "
    "SelectionSlider SliderStyle Style Tab Text Textarea ToggleButton ToggleButtons "
    "ToggleButtonsStyle TwoByTwoLayout VBox Valid ValueWidget Video Widget interactive "
    "interact interact_manual fixed jslink jsdlink link dlink register widget_serialization "
    "CallbackDispatcher".split()
}
# Keyword arguments that only ipywidgets 8 understands (7.7.1 ignores or rejects them).
IPYWIDGETS_8_ONLY_KWARGS = {"tooltip", "description_tooltip", "description_allow_html", "tabbable"}
# Tab/Accordion(titles=...) is 8-only; 7 uses set_title().
IPYWIDGETS_8_ONLY_CONTAINER_KWARGS = {"titles"}


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def code_cells(path: Path) -> list[str]:
    return [c.source for c in nbfiles.read(path).cells if c.cell_type == "code"]


def python_of(source: str) -> str:
    """A code cell as plain Python: IPython magics and shell lines commented out."""
    return "\n".join(
        "#" + line if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    )


def sources() -> list[tuple[str, str]]:
    """(label, Python source) for every notebook code cell and every helpers module."""
    found = []
    for path in NOTEBOOKS:
        for i, cell in enumerate(code_cells(path)):
            found.append((f"{path.relative_to(ROOT)} code cell {i}", python_of(cell)))
    for path in HELPERS:
        found.append((str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")))
    return found


def widget_aliases(tree: ast.AST) -> tuple[set[str], dict[str, str]]:
    """Names bound to the ipywidgets module, and names imported from it (alias -> name)."""
    modules, names = {"widgets", "ipywidgets"}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "ipywidgets":
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ipywidgets"):
            for a in node.names:
                names[a.asname or a.name] = a.name
    return modules, names


def ipywidgets_problems(label: str, source: str) -> list[str]:
    """Uses of ipywidgets API that 7.7.1 does not share with 8.x."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []  # not Python (hygiene and ruff report that); nothing to check here
    modules, imported = widget_aliases(tree)
    problems = []
    for name in imported.values():
        if name != "*" and name not in IPYWIDGETS_7_NAMES:
            problems.append(f"{label}: `from ipywidgets import {name}` is not in ipywidgets 7.7.1")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in modules:
            widget = f.attr
        elif isinstance(f, ast.Name) and f.id in imported:
            widget = imported[f.id]
        else:
            continue
        if widget not in IPYWIDGETS_7_NAMES:
            problems.append(f"{label}: ipywidgets.{widget} does not exist in ipywidgets 7.7.1")
        for kw in node.keywords:
            if kw.arg in IPYWIDGETS_8_ONLY_KWARGS | IPYWIDGETS_8_ONLY_CONTAINER_KWARGS:
                problems.append(f"{label}: {widget}({kw.arg}=...) is ipywidgets-8-only")
            if kw.arg == "options" and (
                isinstance(kw.value, ast.Dict | ast.DictComp)
                or (isinstance(kw.value, ast.Call) and getattr(kw.value.func, "id", "") == "dict")
            ):
                problems.append(
                    f"{label}: {widget}(options=<dict>) was removed in ipywidgets 8;"
                    " use a list of (label, value) pairs"
                )
    return problems


def test_the_version_list_matches_an_installed_ipywidgets() -> None:
    missing = {n for n in IPYWIDGETS_7_NAMES if not hasattr(ipywidgets, n)}
    assert not missing, f"ipywidgets {ipywidgets.__version__} lacks {sorted(missing)}"


@pytest.mark.parametrize("package", sorted(COLAB_PREINSTALLED))
def test_installing_the_course_keeps_colabs_packages(package: str) -> None:
    """pip keeps an installed package that satisfies the course's requirement: no restart."""
    reqs = {
        Requirement(r).name.lower(): Requirement(r) for r in PYPROJECT["project"]["dependencies"]
    }
    assert package in reqs, f"pyproject.toml does not list {package}"
    for version in COLAB_PREINSTALLED[package]:
        assert reqs[package].specifier.contains(version, prereleases=True), (
            f"pyproject.toml asks for {reqs[package]}, so installing the course in Colab would "
            f"replace Colab's {package} {version} and force a runtime restart"
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_only_the_setup_cell_installs_anything(path: Path) -> None:
    installs = re.compile(r"^\s*[%!]\s*(pip|conda|mamba|uv|apt|apt-get)\b|pip install", re.M)
    cells = code_cells(path)
    late = [i for i, cell in enumerate(cells) if i > 0 and installs.search(cell)]
    assert not late, f"{path.name}: code cells {late} install packages; only the setup cell may"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids(NOTEBOOKS))
def test_matplotlib_inline_only(path: Path) -> None:
    for i, cell in enumerate(code_cells(path)):
        for line in cell.splitlines():
            magic = re.match(r"\s*%matplotlib\s*(\S*)", line)
            assert not magic or magic.group(1) == "inline", (
                f"{path.name} code cell {i}: `{line.strip()}`; only `%matplotlib inline` works"
                " everywhere (Colab has no ipympl)"
            )
        assert "ipympl" not in cell, f"{path.name} code cell {i} uses ipympl"
        assert not re.search(r"matplotlib\.use\(|plt\.switch_backend\(", cell), (
            f"{path.name} code cell {i} switches the matplotlib backend; inline plots would vanish"
        )


def test_no_ipympl_or_backend_switch_in_helpers_or_requirements() -> None:
    for path in [*HELPERS, ROOT / "requirements.txt", ROOT / "environment.yml"]:
        text = path.read_text(encoding="utf-8")
        assert "ipympl" not in text, f"{path.relative_to(ROOT)} mentions ipympl"
        if path.suffix == ".py":
            assert not re.search(r"matplotlib\.use\(|plt\.switch_backend\(", text), (
                f"{path.relative_to(ROOT)} switches the matplotlib backend"
            )


def test_only_ipywidgets_api_common_to_7_and_8() -> None:
    problems = [p for label, source in sources() for p in ipywidgets_problems(label, source)]
    assert not problems, "\n".join(problems)


def test_the_api_check_catches_8_only_code() -> None:
    bad = (
        "import ipywidgets as w\nfrom ipywidgets import Stack\n"
        "w.IntSlider(value=1, description_tooltip='x')\nw.Button(tooltip='go')\n"
        "w.Dropdown(options={'a': 1})\nw.Tab(children=[], titles=['a'])\nw.TagsInput()\n"
    )
    found = ipywidgets_problems("bad", bad)
    assert len(found) == 6, found
    good = "import ipywidgets as w\nw.Dropdown(options=[('a', 1)], value=1)\n"
    assert ipywidgets_problems("good", good) == []


def readme_rows() -> list[tuple[str, str]]:
    """(linked notebook path, Colab badge path) for every badge in README.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    pattern = re.compile(
        r"\[[^\]]*\]\(((?:notebooks|exercises|solutions)/[^)]+\.ipynb)\)\s*"
        r"\[!\[Open In Colab\]\([^)]+\)\]\(https://colab\.research\.google\.com/github/"
        r"([^)]+)\)"
    )
    return pattern.findall(text)


def test_readme_badges_point_at_the_notebook_next_to_them() -> None:
    rows = readme_rows()
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(rows) == text.count("colab-badge.svg"), "a README badge is not next to its link"
    for link, badge in rows:
        assert badge == f"{GITHUB_PATH}/blob/{BRANCH}/{link}", (
            f"README: the badge next to {link} points at {badge}"
        )
        assert (ROOT / link).exists(), f"README links {link}, which does not exist"


def test_readme_links_every_chapter_and_its_exercises() -> None:
    linked = {link for link, _ in readme_rows()}
    for chapter in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        rel = chapter.relative_to(ROOT).as_posix()
        assert rel in linked, f"README has no Colab badge for {rel}"
        exercises = f"exercises/{chapter.stem}_exercises.ipynb"
        assert exercises in linked, f"README has no Colab badge for {exercises}"
