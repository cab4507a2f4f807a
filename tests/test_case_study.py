"""helpers.case_study: the fixes keep the math, the table and the widget's run/plot work."""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
import pytest
import torch

from helpers.case_study import (
    FIX_NAMES,
    VARIANTS,
    PreprocessingDataset,
    case_study_table,
    make_case_study,
    plot_case_study,
    plot_fixes,
    preprocess,
    run_fixes,
    same_result,
    time_variant,
    train,
)
from helpers.widgets import interactive_plot


@pytest.fixture(scope="module")
def cs():
    return make_case_study(n_samples=256, epochs=2)


@pytest.fixture(scope="module")
def slow(cs):
    return train(cs)


def test_python_preprocessing_equals_the_vectorised_one(cs) -> None:
    ds = PreprocessingDataset(cs.x, cs.y, cs.mean, cs.std)
    rows = torch.stack([ds[i][0] for i in range(len(ds))])
    assert torch.equal(rows, preprocess(cs.x, cs.mean, cs.std))
    assert rows.dtype == torch.float32 and rows.abs().max() <= 3.0


@pytest.mark.parametrize(("name", "fixes"), VARIANTS[1:-1], ids=[v[0] for v in VARIANTS[1:-1]])
def test_math_keeping_fixes_compute_the_same(cs, slow, name: str, fixes: dict) -> None:
    run = train(cs, **fixes)
    assert same_result(run, slow), name
    assert torch.equal(run.params, slow.params)  # on the CPU: bit for bit
    assert run.steps == slow.steps == 2 * 256 // 64


def test_bigger_batch_changes_the_math(cs, slow) -> None:
    run = train(cs, **VARIANTS[-1][1])
    assert not same_result(run, slow) and run.steps == 2  # one batch of 256 per epoch


def test_slow_loop_logs_every_step(cs, slow) -> None:
    log = io.StringIO()
    train(cs, log=log)
    lines = log.getvalue().splitlines()
    assert len(lines) == slow.steps + len(cs.perms)
    fixed_log = io.StringIO()
    train(cs, no_sync=True, log=fixed_log)
    assert len(fixed_log.getvalue().splitlines()) == len(cs.perms)


def test_on_step_is_called_once_per_step(cs) -> None:
    calls = []
    run = train(cs, resident=True, on_step=lambda: calls.append(1))
    assert len(calls) == run.steps


def test_same_result_notices_differences(cs, slow) -> None:
    other = train(make_case_study(n_samples=256, epochs=2, seed=1))
    assert not same_result(other, slow)
    shorter = train(make_case_study(n_samples=256, epochs=1))
    assert not same_result(shorter, slow)


def test_bad_settings_are_rejected(cs) -> None:
    with pytest.raises(ValueError, match="n_samples must be"):
        make_case_study(n_samples=0)
    with pytest.raises(ValueError, match="epochs must be"):
        make_case_study(epochs=-1)
    with pytest.raises(ValueError, match="Unknown fix"):
        time_variant(cs, "cpu", fast=True)


def test_table_and_plot() -> None:
    small = make_case_study(n_samples=128)
    rows = case_study_table(small, "cpu", min_run_time=0.01)
    assert [r["variant"] for r in rows] == [v[0] for v in VARIANTS]
    assert [r["same result as slow"] for r in rows[:-1]] == ["yes"] * (len(VARIANTS) - 1)
    assert rows[-1]["same result as slow"].startswith("different math")
    assert rows[0]["speed-up vs slow"] == 1.0 and all(r["ms per epoch"] > 0 for r in rows)
    fig = plot_case_study(rows)
    assert len(fig.axes[0].patches) == len(VARIANTS)
    plt.close(fig)
    with pytest.raises(ValueError, match="No case-study rows"):
        plot_case_study([])


def test_widget_run_plot_and_button() -> None:
    result = run_fixes(n_samples=256)
    assert result["same result"] is True and result["speed-up"] > 0
    assert result["chosen"] == [FIX_NAMES[k] for k in ("no_sync", "preprocess_once", "resident")]
    fig = plot_fixes(result)
    assert "same result" in fig.axes[0].get_title()
    plt.close(fig)
    big = run_fixes(
        no_sync=False, preprocess_once=False, resident=False, big_batch=True, n_samples=256
    )
    assert big["same result"] is None
    fig = plot_fixes(big)
    assert "changes the math" in fig.axes[0].get_title()
    plt.close(fig)

    import ipywidgets as widgets

    controls = {
        k: widgets.Checkbox(value=k == "no_sync", description=v) for k, v in FIX_NAMES.items()
    }
    controls["n_samples"] = widgets.IntSlider(value=256, min=256, max=1024, step=256)
    box = interactive_plot(run_fixes, plot_fixes, controls)
    box.run_button.click()
    assert box.last_result is not None and box.last_result["chosen"] == [FIX_NAMES["no_sync"]]
    assert box.last_result["same result"] is True
