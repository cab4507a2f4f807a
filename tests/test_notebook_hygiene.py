"""Every notebook is valid, stored clean, and follows the chapter template."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

import nbformat
import pytest

import nbfiles

ROOT = Path(__file__).resolve().parent.parent
COURSE = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["course"]  # set_repo.py
REPO_URL, BRANCH = COURSE["repository"], COURSE["branch"]
GITHUB_PATH = REPO_URL.removeprefix("https://github.com/")
TEMPLATE = ROOT / "templates" / "chapter_template.ipynb"
CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ALL = nbfiles.all_notebooks()


def ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT)) for p in paths]


def code_cells(nb: nbformat.NotebookNode) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def headings(nb: nbformat.NotebookNode) -> list[str]:
    found = []
    for c in nb.cells:
        if c.cell_type == "markdown":
            found += [line.strip() for line in c.source.splitlines() if line.startswith("## ")]
    return found


def setup_cell() -> str:
    return code_cells(nbfiles.read(TEMPLATE))[0]


def test_there_are_notebooks() -> None:
    assert TEMPLATE.exists()
    assert CHAPTERS, "no chapter notebooks in notebooks/"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_valid_and_stored_clean(path: Path) -> None:
    nb = nbfiles.read(path)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs, (
                f"{path.name}: outputs are stored; run tools/clean_notebooks.py"
            )
            assert cell.execution_count is None, f"{path.name}: execution counts are stored"
    text = path.read_text(encoding="utf-8")
    assert text == nbfiles.dumps(nbfiles.clean(nb)), (
        f"{path.name}: run python tools/clean_notebooks.py"
    )


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_title_and_badge_point_at_own_path(path: Path) -> None:
    nb = nbfiles.read(path)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), (
        "first cell must be the title"
    )
    rel = path.relative_to(ROOT).as_posix()
    badge = f"https://colab.research.google.com/github/{GITHUB_PATH}/blob/{BRANCH}/{rel}"
    assert badge in first.source, f"{path.name}: the Colab badge must link to {badge}"
    others = re.findall(r"colab\.research\.google\.com/github/[^)\s]+", first.source)
    assert all(o.endswith(rel) for o in others), f"{path.name}: a badge points elsewhere: {others}"


@pytest.mark.parametrize("path", ALL, ids=ids(ALL))
def test_setup_cell_is_the_template_one(path: Path) -> None:
    cells = code_cells(nbfiles.read(path))
    assert cells and cells[0] == setup_cell(), (
        f"{path.name}: the first code cell must be the template's setup cell"
    )
    assert f'COURSE_REPO = "{REPO_URL}"\nCOURSE_MIRROR = "' in setup_cell(), (
        "the setup cell's URL must be pyproject's [tool.course]"
    )
    assert f'\nCOURSE_BRANCH = "{BRANCH}"\n' in setup_cell(), (
        "the setup cell's URL and branch must be pyproject's [tool.course]"
    )


def test_setup_cell_installs_only_where_the_course_is_missing_and_only_the_course() -> None:
    cell = setup_cell()
    guard = 'if "google.colab" in sys.modules or importlib.util.find_spec("helpers") is None:'
    assert guard in cell, "install in Colab, or where the course package is not installed"
    pip_lines = [line for line in cell.splitlines() if "%pip" in line]
    assert len(pip_lines) == 1 and pip_lines[0].startswith("    "), "install only inside that guard"
    for pkg in ("torch", "numpy", "matplotlib", "ipywidgets"):
        assert pkg not in pip_lines[0], f"never reinstall {pkg} in Colab (it forces a restart)"
    assert "%matplotlib inline" in cell and "ipympl" not in cell and "widget" not in cell


@pytest.mark.parametrize("path", [TEMPLATE, *CHAPTERS], ids=ids([TEMPLATE, *CHAPTERS]))
def test_chapter_follows_template(path: Path) -> None:
    nb = nbfiles.read(path)
    heads = headings(nb)
    assert heads[:2] == ["## What you will learn", "## Prerequisites"], (
        f"{path.name}: opening is {heads[:2]}"
    )
    assert heads[-3:] == ["## Summary", "## Exercises", "## Further reading"], (
        f"{path.name}: closing is {heads[-3:]}"
    )
    config = code_cells(nb)[1]
    assert "pick_device(" in config and "manual_seed(" in config and "describe_device(" in config
    first_code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    assert all(c.cell_type == "markdown" for c in nb.cells[:first_code])


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_chapter_has_exercises_and_solutions(path: Path) -> None:
    stem = path.stem
    exercises = ROOT / "exercises" / f"{stem}_exercises.ipynb"
    solutions = ROOT / "solutions" / f"{stem}_solutions.ipynb"
    assert exercises.exists() and solutions.exists(), (
        f"{stem}: needs {exercises.name} and {solutions.name}"
    )
    text = "\n".join(c.source for c in nbfiles.read(path).cells if c.cell_type == "markdown")
    assert f"../exercises/{exercises.name}" in text, (
        f"{path.name}: the Exercises section must link the exercises"
    )
    assert f"../solutions/{solutions.name}" in text, (
        f"{path.name}: the Exercises section must link the solutions"
    )


#: One idea per cell: a chapter's median code cell has at most this many lines.
MAX_MEDIAN_CELL_LINES = 10


@pytest.mark.parametrize("path", CHAPTERS, ids=ids(CHAPTERS))
def test_chapter_cells_are_short(path: Path) -> None:
    lengths = sorted(len(src.strip().splitlines()) for src in code_cells(nbfiles.read(path)))
    median = statistics.median(lengths)
    assert median <= MAX_MEDIAN_CELL_LINES, (
        f"{path.name}: the median code cell has {median} lines (at most "
        f"{MAX_MEDIAN_CELL_LINES}); split long cells so that each shows one idea"
    )
