"""Chinese chapters run, and what they print is Chinese (issue 32): each is executed in a fresh
kernel, as a learner runs it, and at most `english_share.TARGET` of its printed lines may be
English (tools/english_share.py says what counts). Its code differs from the English chapter's
in the strings it shows, so it is run here rather than trusted to the English run."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import english_share  # noqa: E402

#: The Chinese chapters `make test` runs in full (the fastest two on a 2-core CPU).
CHAPTERS = ["zh/notebooks/01_devices.ipynb", "zh/notebooks/03_mixed_precision.ipynb"]


#: Exercise notebooks run unsolved and with a wrong answer in each exercise.
EXERCISES = [
    "zh/exercises/01_devices_exercises.ipynb",
    "zh/exercises/03_mixed_precision_exercises.ipynb",
]
STUB = re.compile(r"^(\s*)raise NotImplementedError\((.*)\)$", re.M)


def execute(
    path: str, nb: nbformat.NotebookNode, allow_errors: bool = False
) -> nbformat.NotebookNode:
    """`nb` run top to bottom in a fresh kernel, in `path`'s folder; a failing cell raises
    unless `allow_errors` (a wrong answer may break the cells that use it)."""
    client = NotebookClient(
        nb,
        timeout=900,
        allow_errors=allow_errors,
        kernel_name="python3",
        resources={"metadata": {"path": str((ROOT / path).parent)}},
    )
    client.execute()  # raises CellExecutionError, naming the cell, if one fails
    return nb


def assert_chinese(path: str, nb: nbformat.NotebookNode) -> list[str]:
    """At most TARGET of what `nb` printed is English; the printed lines."""
    lines = english_share.printed_lines(nb)
    english = english_share.english(lines)
    assert len(english) <= english_share.TARGET * len(lines), (
        f"{path}: {len(english)} of {len(lines)} printed lines are English "
        f"(at most {english_share.TARGET:.0%}):\n" + "\n".join(english)
    )
    return lines


@pytest.mark.parametrize("path", CHAPTERS)
def test_chinese_chapter_runs_and_prints_chinese(
    path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as CI's other notebook runs
    assert_chinese(path, execute(path, nbformat.read(ROOT / path, as_version=4)))


@pytest.mark.parametrize("path", EXERCISES)
@pytest.mark.parametrize("answer", ["unsolved", "wrong"])
def test_chinese_exercises_print_chinese_unsolved_and_wrong(
    path: str, answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unsolved, each check prints ⏳; with a wrong answer (each stub returns None, or the
    buggy code it guards runs), ❌ and a hint: in Chinese either way."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    nb = nbformat.read(ROOT / path, as_version=4)
    if answer == "wrong":
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.source = STUB.sub(r"\1return None  # a wrong answer", cell.source)
    lines = assert_chinese(path, execute(path, nb, allow_errors=answer == "wrong"))
    mark = "⏳" if answer == "unsolved" else "❌"
    assert any(mark in line for line in lines), f"{path} ({answer}): no {mark} printed"


@pytest.mark.parametrize(
    ("line", "counts"),
    [
        ("peak memory used by the step", True),
        ("步骤用掉的峰值显存 (peak memory used)", False),  # Chinese with an English gloss
        ("RuntimeError: Tensor on device meta is not on the expected device cpu!", False),
        ("fp32 1.23 ms", False),  # numbers, units and a dtype are not English prose
        ("UserWarning: this overload of add_ is deprecated", False),
        ("findfont: Font family ['cmr10'] not found. Falling back to DejaVu Sans.", False),
    ],
)
def test_what_counts_as_an_english_line(line: str, counts: bool) -> None:
    assert english_share.english([line]) == ([line] if counts else [])


def test_widget_stand_ins_are_left_out() -> None:
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "outputs": [
                    {"output_type": "stream", "name": "stdout", "text": "one two three\n中文\n"},
                    {
                        "output_type": "display_data",
                        "data": {
                            "text/plain": "VBox(children=(IntSlider(description='batch size'),))",
                            english_share.WIDGET: {"model_id": "x"},
                        },
                    },
                ],
            }
        ]
    }
    assert english_share.share(nb) == (1, 2)
