"""helpers.widgets / helpers.plots: the Run button calls the plain functions and redraws."""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib

matplotlib.use("Agg")

from helpers.plots import plot_sweep  # noqa: E402
from helpers.sweeps import run_sweep  # noqa: E402
from helpers.widgets import interactive_plot  # noqa: E402


def run(n: int, scale: float) -> object:
    return run_sweep(lambda k: {"y": k * scale}, range(1, n + 1), param="k", progress=False)


def plot(result: object) -> object:
    return plot_sweep(result, "y", title="test")


def test_plot_functions_return_figures() -> None:
    fig = plot(run(3, 2.0))
    assert fig.axes[0].get_title() == "test" and len(fig.axes[0].lines) == 1
    two = run_sweep(lambda k: {"a": k, "b": k + 1}, [1, 2], param="k", progress=False)
    ax = plot_sweep(two, ["a", "b"], logx=True, logy=True).axes[0]
    assert ax.get_legend() is not None and ax.get_xscale() == ax.get_yscale() == "log"


def test_control_values_are_rounded() -> None:
    c = {
        "a": widgets.FloatSlider(value=1.9999999999999998),
        "r": widgets.IntRangeSlider(value=(2, 5)),
    }
    box = interactive_plot(lambda **values: values, lambda values: plot(run(2, 1.0)), c)
    box.run_button.click()
    assert box.last_result == {"a": 2.0, "r": (2, 5)}


def test_button_runs_and_plots() -> None:
    controls = {
        "n": widgets.IntSlider(value=3, min=1, max=10),
        "scale": widgets.FloatSlider(value=1.0),
    }
    box = interactive_plot(run, plot, controls)
    controls["n"].value = 5
    box.run_button.click()
    assert box.last_result is not None and len(box.last_result) == 5
    assert not box.run_button.disabled


def test_errors_in_the_callback_keep_the_widget_alive() -> None:
    def broken(n: int) -> object:
        raise ValueError("n must be even")

    box = interactive_plot(broken, plot, {"n": widgets.IntSlider(value=3)})
    box.run_button.click()  # must not raise
    assert box.last_result is None and not box.run_button.disabled
