"""Instructor mode (tools/run_all.py): executed copies, HTML, a report, and a failing exit."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
import run_all

import nbfiles

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "templates" / "chapter_template.ipynb"


def broken_notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    }
    nb.cells = [
        nbformat.v4.new_code_cell("print('first cell runs')"),
        nbformat.v4.new_code_cell("raise ValueError('this notebook is broken on purpose')"),
        nbformat.v4.new_code_cell("print('never reached')"),
    ]
    path = folder / "broken.ipynb"
    nbformat.write(nb, path)
    return path


def test_executes_writes_html_and_reports_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "executed"
    broken = broken_notebook(tmp_path)
    status = run_all.main([str(TEMPLATE), str(broken), "--out", str(out), "--device", "cpu"])
    assert status == 1, "a failing notebook must make the command fail"
    executed = nbfiles.read(out / "templates" / "chapter_template.ipynb")
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "every cell of the template ran"
    assert any(c.outputs for c in code), "the executed copy keeps its outputs"
    page = (out / "templates" / "chapter_template.html").read_text()
    assert "<html" in page and "describe_device" in page
    failed = nbfiles.read(out / "broken.ipynb")
    assert failed.cells[0].outputs and failed.cells[1].outputs[0].output_type == "error"
    assert not failed.cells[2].outputs, "nothing runs after the failing cell"
    summary = (out / "summary.md").read_text()
    assert "| templates/chapter_template.ipynb | ok |" in summary
    assert "FAILED: cell 1: ValueError: this notebook is broken on purpose" in summary
    assert "2 notebooks, 1 failed" in summary
    assert "chapter_template.html" in (out / "index.html").read_text()
    data = json.loads((out / "results.json").read_text())
    assert [(n["path"].endswith("broken.ipynb"), n["ok"]) for n in data["notebooks"]] == [
        (False, True),
        (True, False),
    ]
    assert "ValueError" in data["notebooks"][1]["error"] and "torch" in data["machine"]
    printed = capsys.readouterr().out
    assert "device" in printed and "FAILED" in printed
    assert printed.rstrip().endswith("notebooks: 1 passed, 1 failed"), "the plain count line"


def test_default_selection_is_the_chapters() -> None:
    chosen = run_all.select([], [])
    assert chosen == sorted(ROOT.glob("notebooks/[0-9][0-9]_*.ipynb"))
    with_all = run_all.select([], ["solutions", "exercises"])
    assert set(chosen) < set(with_all) or not (ROOT / "solutions").glob("*.ipynb")


def test_bad_input_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not a notebook"):
        run_all.main([str(tmp_path / "missing.ipynb")])
    with pytest.raises(SystemExit) as exc:
        run_all.main(["--timeout", "0", str(TEMPLATE)])
    assert exc.value.code == 2


def test_a_solution_whose_check_fails_fails_the_run(tmp_path: Path) -> None:
    folder = tmp_path / "solutions"
    folder.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("print('✅ Exercise 1: correct.')"),
        nbformat.v4.new_code_cell("print('❌ Exercise 2: the 3-rank run failed.')"),
    ]
    nbformat.write(nb, folder / "99_demo_solutions.ipynb")
    nbformat.write(nb, tmp_path / "99_demo_exercises.ipynb")  # not a solution: ❌ is expected
    out = tmp_path / "executed"
    paths = [str(folder / "99_demo_solutions.ipynb"), str(tmp_path / "99_demo_exercises.ipynb")]
    assert run_all.main([*paths, "--out", str(out), "--no-html", "--device", "cpu"]) == 1
    data = json.loads((out / "results.json").read_text())
    solution, exercise = data["notebooks"]
    assert not solution["ok"] and exercise["ok"]
    assert "cell 1: a check of the solution failed: ❌ Exercise 2" in solution["error"]
