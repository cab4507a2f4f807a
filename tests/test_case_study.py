"""helpers.case_study: the fixes keep the math, the table and the widget's run/plot work.

AUDIT finding 8 (H100 run of 2026-11-26): the table timed each variant in one block after the
other and printed a speed-up of 0.78x with no spread and no verdict. The table is now timed in
interleaved rounds, each row carries its IQR, and each row's verdict is read from the rows by
helpers.verdicts.compare_rows, so the ratio it prints is the table's "speed-up vs previous".
"""

from __future__ import annotations

import io
import re

import matplotlib.pyplot as plt
import pytest
import torch

from helpers.case_study import (
    FIX_NAMES,
    VARIANTS,
    CaseStudyTable,
    PreprocessingDataset,
    case_study_table,
    fix_title,
    make_case_study,
    plot_case_study,
    plot_fixes,
    preprocess,
    run_fixes,
    same_result,
    time_interleaved,
    train,
)
from helpers.machine_state import GpuTenants, MachineState
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
        time_interleaved(cs, "cpu", [("fast", {"fast": True})])
    with pytest.raises(ValueError, match="rounds must be"):
        time_interleaved(cs, "cpu", VARIANTS[:1], rounds=0)


def test_item_fix_comes_after_the_per_step_copies_are_gone() -> None:
    """Finding 8: until the resident fix, every step copies its batch with a blocking .to()."""
    order = list(FIX_NAMES)
    assert order.index("resident") < order.index("no_sync") < order.index("big_batch")
    no_sync_row = next(fixes for name, fixes in VARIANTS if name.endswith(FIX_NAMES["no_sync"]))
    assert no_sync_row["resident"] and not no_sync_row.get("big_batch")


def test_rounds_are_interleaved_and_rotate(cs, monkeypatch) -> None:
    import helpers.case_study as case_study

    order: list[tuple] = []
    real = case_study.benchmark

    def spy(fn, *args, **kw):
        order.append(tuple(sorted(k for k in FIX_NAMES if kw.get(k))))
        return real(fn, *args, **kw)

    monkeypatch.setattr(case_study, "benchmark", spy)
    variants = [("a", {}), ("b", {"preprocess_once": True}), ("c", {"resident": True})]
    timings = time_interleaved(cs, "cpu", variants, rounds=3, min_run_time=0.001)
    a, b, c = ((),), (("preprocess_once",),), (("resident",),)
    assert order == list(a + b + c + b + c + a + c + a + b)  # each round starts one further
    assert [len(t.seconds) for t in timings] == [3, 3, 3]
    assert all(t.machine is not None and t.iqr >= 0 for t in timings)


def fake_table(ms: list[float], iqr: list[float], states=None) -> CaseStudyTable:
    rows = [
        {
            "variant": name,
            "ms per epoch": m,
            "IQR (ms)": q,
            "speed-up vs previous": (ms[max(i - 1, 0)]) / m,
        }
        for i, ((name, _), m, q) in enumerate(zip(VARIANTS, ms, iqr))
    ]
    return CaseStudyTable(rows, states or [None] * len(rows), rounds=5)


def printed_ratio(text: str) -> float:
    found = re.findall(r"(\d+\.\d+)x", text)
    assert len(found) == 1, text
    return float(found[0])


def test_each_verdict_states_the_tables_ratio() -> None:
    """The H100 bench's figures: each verdict's ratio is its row's 'speed-up vs previous'."""
    table = fake_table([377.4, 272.5, 212.3, 483.4, 16.59], [5.0, 4.0, 3.0, 6.0, 0.2])
    verdicts = table.verdicts()
    assert len(verdicts) == len(VARIANTS) - 1
    for i, verdict in enumerate(verdicts, start=1):
        row, previous = table.rows[i], table.rows[i - 1]
        assert verdict.a == row["variant"] and verdict.b == previous["variant"]
        assert verdict.ratio == pytest.approx(row["speed-up vs previous"])
        shown = verdict.ratio if verdict.ratio >= 1 else 1 / verdict.ratio
        assert printed_ratio(verdict) == pytest.approx(shown, abs=0.006)
    assert "was 2.28x faster than + no per-step .item() + print" in verdicts[2]


def test_verdicts_within_the_spread_or_on_a_busy_machine_do_not_conclude() -> None:
    close = fake_table([100.0, 98.0, 97.0, 96.0, 10.0], [8.0, 8.0, 8.0, 8.0, 1.0])
    assert "ahead by 1.02x; spreads add up to" in close.verdicts()[0]
    shared = MachineState("cuda:0", 6, 6, 16, 2.0, GpuTenants(2, 2**30))
    busy = fake_table([377.4, 272.5, 212.3, 200.0, 16.59], [1.0] * 5, [shared] * 5)
    assert all(v.startswith("inconclusive, GPU shared") for v in busy.verdicts())
    assert all(not v.conclusive for v in busy.verdicts())
    assert "GPU shared with 2 other compute process(es)" in str(busy)


def test_table_and_plot() -> None:
    small = make_case_study(n_samples=128)
    table = case_study_table(small, "cpu", rounds=2, min_run_time=0.001)
    rows = table.rows
    assert [r["variant"] for r in rows] == [v[0] for v in VARIANTS]
    assert [r["same result as slow"] for r in rows[:-1]] == ["yes"] * (len(VARIANTS) - 1)
    assert rows[-1]["same result as slow"].startswith("different math")
    assert rows[0]["speed-up vs slow"] == 1.0 and all(r["ms per epoch"] > 0 for r in rows)
    assert all(r["IQR (ms)"] >= 0 for r in rows) and table.rounds == 2
    text = str(table)
    assert "IQR (ms)" in text and "2 interleaved rounds; machine: " in text
    for verdict, row in zip(table.verdicts(), rows[1:]):
        assert verdict.ratio == pytest.approx(row["speed-up vs previous"])
    fig = plot_case_study(rows)
    assert len(fig.axes[0].patches) == len(VARIANTS)
    plt.close(fig)
    with pytest.raises(ValueError, match="No case-study rows"):
        plot_case_study([])


def test_widget_run_plot_and_button() -> None:
    result = run_fixes(n_samples=256, rounds=2)
    assert result["same result"] is True and result["speed-up"] > 0
    assert result["chosen"] == [FIX_NAMES[k] for k in ("preprocess_once", "resident", "no_sync")]
    assert "chosen fixes" in result["verdict"] and "slow loop" in result["verdict"]
    assert result["verdict"].ratio == pytest.approx(result["speed-up"])
    fig = plot_fixes(result)
    assert "same result" in fig.axes[0].get_title()
    plt.close(fig)
    big = run_fixes(
        no_sync=False, preprocess_once=False, resident=False, big_batch=True, n_samples=256,
        rounds=1,
    )  # fmt: skip
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


def test_a_fix_is_titled_in_the_learners_language_and_keyed_in_english() -> None:
    """The widget's checkboxes read fix_title(key); FIX_NAMES keeps the English (learner 32)."""
    from helpers.i18n import set_language

    assert fix_title("resident") == FIX_NAMES["resident"] == "resident tensors, no DataLoader"
    set_language("zh_CN")
    try:
        titles = [fix_title(key) for key in FIX_NAMES]
        assert titles[1] == "常驻张量（不用 DataLoader）", titles
        assert all(re.search(r"[\u4e00-\u9fff]", t) for t in titles), titles
        assert FIX_NAMES["resident"] == "resident tensors, no DataLoader"
    finally:
        set_language("en")
