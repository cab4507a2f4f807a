"""helpers.throughput: the batch-size sweep, its plot and its widget."""

from __future__ import annotations

import pytest

from helpers.data import make_classification_data
from helpers.sweeps import SweepResult
from helpers.throughput import (
    measure_batch_size,
    plot_throughput,
    run_throughput,
    throughput_controls,
)
from helpers.widgets import interactive_plot


@pytest.fixture(scope="module")
def small_sweep() -> SweepResult:
    return run_throughput((5, 7), device="cpu", n_samples=512, threads=1, min_run_time=0.01)


def test_run_throughput_rows(small_sweep: SweepResult) -> None:
    assert small_sweep.column("batch size") == [32, 64, 128]
    assert small_sweep.column("steps/epoch") == [16, 8, 4]
    for row in small_sweep.rows:
        assert row["samples/s"] > 0 and row["µs/step"] > 0 and row["ms/epoch"] > 0
        assert 0 < row["loss after 1 epoch"] < 1
    assert small_sweep.device == "cpu" and small_sweep.feeding == "resident"
    state = small_sweep.machine  # what else the machine did during the sweep (issue 24 item 5)
    assert state.device == "cpu" and state.torch_threads == 1 and state.window_s > 0
    assert str(state).startswith("machine: ")


def test_plot_throughput(small_sweep: SweepResult) -> None:
    fig = plot_throughput(small_sweep)
    assert len(fig.axes) == 3
    assert [ax.get_xlabel() for ax in fig.axes] == ["batch size"] * 3
    assert [len(ax.lines[0].get_xdata()) for ax in fig.axes] == [3, 3, 3]


def test_dataloader_feeding_and_sizes_capped_by_dataset() -> None:
    result = run_throughput((6, 12), "DataLoader", device="cpu", n_samples=200, min_run_time=0.01)
    assert result.column("batch size") == [64, 128]  # 256 and up exceed the 200 samples
    assert result.feeding == "DataLoader"


def test_measure_batch_size_bad_input() -> None:
    x, y = make_classification_data(100)
    with pytest.raises(ValueError, match="larger than the dataset"):
        measure_batch_size(101, x=x, y=y)
    with pytest.raises(ValueError, match="feeding"):
        measure_batch_size(10, x=x, y=y, feeding="carrier pigeon")


@pytest.mark.parametrize(
    ("log2_batch", "match"),
    [((5, 3), "low <= high"), ((-1, 3), "low <= high"), ((3, 25), "high <= 20"), ("ab", "pair")],
)
def test_bad_ranges(log2_batch, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        run_throughput(log2_batch, device="cpu", n_samples=100)


def test_run_throughput_bad_input() -> None:
    with pytest.raises(ValueError, match="larger than"):
        run_throughput((10, 11), device="cpu", n_samples=100)
    with pytest.raises(ValueError, match="feeding"):
        run_throughput((3, 4), "pigeon", device="cpu", n_samples=100)
    with pytest.raises(ValueError, match="n_samples"):
        run_throughput((3, 4), device="cpu", n_samples=0)


def test_plot_empty_sweep() -> None:
    with pytest.raises(ValueError, match="no rows"):
        plot_throughput(SweepResult(param="batch size"))


def test_widget_button_runs_and_plots() -> None:
    def run(log2_batch=(5, 6), feeding="resident"):
        return run_throughput(
            log2_batch, feeding, device="cpu", n_samples=256, threads=1, min_run_time=0.01
        )

    controls = throughput_controls((5, 6), max_log2=8)
    assert controls["log2_batch"].value == (5, 6) and controls["feeding"].value == "resident"
    box = interactive_plot(run, plot_throughput, controls)
    controls["feeding"].value = "DataLoader"
    box.run_button.click()
    assert isinstance(box.last_result, SweepResult)
    assert box.last_result.feeding == "DataLoader" and len(box.last_result) == 2


def test_measure_batch_size_with_flat_adam_same_loss() -> None:
    x, y = make_classification_data(256, 20)
    plain = measure_batch_size(32, x=x, y=y, min_run_time=0.01)
    flat = measure_batch_size(32, x=x, y=y, min_run_time=0.01, flat_adam=True)
    assert flat["steps/epoch"] == plain["steps/epoch"] == 8 and flat["µs/step"] > 0
    assert flat["loss after 1 epoch"] == pytest.approx(plain["loss after 1 epoch"], rel=1e-4)
