"""Chapters 2 and 4 in Chinese: what learner 32 saw in zh/ (a verdict naming rows the table did
not show, English headers, the Slurm script not found from zh/notebooks/).

The Chinese notebooks' own functions run here with stubbed timings (tests/notebook_code.py),
as tests/test_ch02_verdicts.py runs the English ones: every name a verdict prints is a name the
table above it printed, and neither names a row in English. The Slurm cell runs from both
layouts of a clone (notebooks/ and zh/notebooks/) and from a folder outside any clone.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from notebook_code import cell_containing
from test_ch02_verdicts import chapter2_functions, result

ROOT = Path(__file__).resolve().parents[1]
ZH02 = ROOT / "zh" / "notebooks" / "02_training_loop.ipynb"
EN04 = ROOT / "notebooks" / "04_multi_gpu.ipynb"
ZH04 = ROOT / "zh" / "notebooks" / "04_multi_gpu.ipynb"
FUNCTIONS = [
    "machine",
    "timing_rows",
    "faster",
    "sync_cost_table",
    "deliverable_table",
    "floor_line",
]


@pytest.fixture
def zh02(chinese) -> SimpleNamespace:  # noqa: ANN001
    """zh/'s chapter 2 functions, printing in Chinese; print_table records the rows it prints."""
    found = chapter2_functions(ZH02, FUNCTIONS)
    assert sorted(found.found) == sorted(FUNCTIONS), found.found
    return found


def table_and_verdict(out: str) -> tuple[str, str]:
    """The printed table (header to last row) and the verdict line under it."""
    lines = out.splitlines()
    verdict = next(i for i, line in enumerate(lines) if "倍" in line or "难分高下" in line)
    return "\n".join(lines[:verdict]), lines[verdict]


def test_sync_cost_rows_are_named_in_chinese_in_the_table_and_the_verdict(zh02, capsys) -> None:  # noqa: ANN001
    medians = {1: 0.3997, 10: 0.2858, 0: 0.2561}

    def count_syncs(fn, *args):  # noqa: ANN001, ANN202
        steps, every = len(args[1]), args[-1]
        return None, SimpleNamespace(count=math.ceil(steps / every) if every else 0)

    zh02.ns.update(
        count_syncs=count_syncs,
        benchmark=lambda fn, *args, **kw: result(medians[args[-1]]),
        epoch_reading_every=object(),
        bce_logits=None,
    )
    zh02.ns["sync_cost_table"](None, list(range(157)), None, (1, 10, 0))
    table, verdict = table_and_verdict(capsys.readouterr().out)
    for shown in ("每 1 步", "每 10 步", "从不", "读取 loss.item() 的频率", "每次同步额外耗时"):
        assert shown in table, (shown, table)
    assert "从不" in verdict and "每 1 步" in verdict, verdict
    for english in ("never", "step(s)", "loss.item() every", "extra"):
        assert english not in table + verdict, (english, table, verdict)


def test_deliverable_verdict_names_the_rows_as_the_table_shows_them(zh02, capsys) -> None:  # noqa: ANN001
    timings = {
        "sources' loop": result(345.5e-3),
        "源教程的循环，1 个线程": result(150e-3),  # the threaded row's name, made in zh's code
        "final loop": result(18.5e-3),
    }
    zh02.ns["deliverable_table"](timings, 157, {"sources' loop": 157, "final loop": 1})
    table, verdict = table_and_verdict(capsys.readouterr().out)
    assert "源教程的循环" in table and "最终循环" in table
    assert "最终循环" in verdict and "源教程的循环" in verdict and "loop" not in verdict, verdict
    assert [r["host syncs/epoch"] for r in zh02.tables[-1]] == [157, 157, 1]


def test_deliverable_table_heads_its_syncs_column_in_chinese(zh02, capsys) -> None:  # noqa: ANN001
    """The column's name is a key ("host syncs/epoch"): helpers.notebook_keys.po translates it."""
    timings = {"sources' loop": result(345.5e-3), "final loop": result(18.5e-3)}
    zh02.ns["deliverable_table"](timings, 157, {"sources' loop": 157, "final loop": 1})
    header = capsys.readouterr().out.splitlines()[0]
    assert "syncs" not in header and "同步次数" in header, header


@pytest.mark.parametrize(
    ("final_us", "floor_us", "says"),
    [(484.0, 195.0, "并没有接近下限"), (250.0, 195.0, "处在下限上"), (100.0, 400.0, "不到下限的")],
)
def test_floor_line_says_in_chinese_whether_the_step_is_near_the_floor(
    zh02, final_us, floor_us, says
) -> None:  # noqa: ANN001
    line = zh02.ns["floor_line"](final_us, floor_us, 64, False)
    assert f"是下限的 {final_us / floor_us:.2f} 倍" in line and says in line, line
    assert not any(w in line for w in ("floor", "above", "below", "near", "busier")), line


# --------------------------------------------------------------- chapter 4: the Slurm script


def run_slurm_cell(notebook: Path, cwd: Path) -> str:
    """What the chapter's Slurm cell prints when its kernel runs in `cwd`."""
    code = cell_containing(notebook, "torchrun_multinode.sbatch")
    out = io.StringIO()
    here = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out):
            exec(code, {"COURSE_REPO": "https://github.com/example/course"})  # noqa: S102
    finally:
        os.chdir(here)
    return out.getvalue()


@pytest.mark.parametrize("notebook", [EN04, ZH04], ids=["en", "zh"])
@pytest.mark.parametrize("folder", ["notebooks", "zh/notebooks"])
def test_slurm_cell_shows_the_clones_script_from_either_layout(notebook: Path, folder: str) -> None:
    """Learner 32: from zh/notebooks/ the cell looked for zh/slurm/ and printed only a link."""
    printed = run_slurm_cell(notebook, ROOT / folder)
    script = (ROOT / "slurm" / "torchrun_multinode.sbatch").read_text()
    assert printed.startswith("srun --") and printed.strip() in script, printed


@pytest.mark.parametrize("notebook", [EN04, ZH04], ids=["en", "zh"])
def test_slurm_cell_outside_a_clone_links_to_the_script(notebook: Path, tmp_path: Path) -> None:
    printed = run_slurm_cell(notebook, tmp_path)
    assert "srun --" not in printed
    assert "https://github.com/example/course/blob/main/slurm/torchrun_multinode.sbatch" in printed


# ------------------------------------------------------------- chapter 2: same_but_for's names


def test_same_but_for_names_the_parameters_in_chinese(chinese) -> None:  # noqa: ANN001
    """The chapter passes what="parameters" (one word: the Chinese notebook keeps it English)."""
    from helpers.loops import same_but_for

    shown = str(same_but_for([1.0, 2.0], [1.0, 2.0], what="parameters"))
    assert shown.startswith("参数：2 个值"), shown
    assert str(same_but_for([1.0], [1.0], what="图重放对比 eager 步")).startswith(
        "图重放对比 eager 步："
    )


def test_same_but_for_names_stay_as_given_in_english() -> None:
    from helpers.loops import same_but_for

    assert str(same_but_for([1.0, 2.0], [1.0, 2.0], what="parameters")).startswith(
        "parameters: 2 values"
    )
