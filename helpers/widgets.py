"""ipywidgets controls and a Run button in front of a `run(**settings)` function, redrawing
`plot(result)` on each click (chapter 1). Only API common to ipywidgets 7 (Colab) and 8."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
from matplotlib.figure import Figure

from helpers.i18n import tr, tr_mark
from helpers.plots import show

#: The Run button's label (translated where the button is made).
RUN = tr_mark("Run")


def _clean(value: Any) -> Any:
    """Round slider floats (they can arrive as 1.9999999999999998); tuples element-wise (chapter 1)."""
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, tuple):
        return tuple(_clean(v) for v in value)
    return value


def interactive_plot(
    run: Callable[..., Any],
    plot: Callable[[Any], Figure],
    controls: dict[str, widgets.Widget],
    *,
    run_label: str = RUN,
) -> widgets.VBox:
    """Controls + a Run button + an Output: on click, run(**values), plot(result) into the Output (chapter 1)."""
    label = tr(run_label)
    button = widgets.Button(description=label, button_style="primary", icon="play")
    status = widgets.HTML(
        value=tr("Set the controls, then press <b>{label}</b>.").format(label=label)
    )
    output = widgets.Output()
    box = widgets.VBox([*controls.values(), widgets.HBox([button, status]), output])
    box.run_button, box.output, box.controls = button, output, controls
    box.last_result = None

    def on_click(_: widgets.Button) -> None:
        values = {name: _clean(w.value) for name, w in controls.items()}
        button.disabled = True
        status.value = tr("running…")
        with output:
            output.clear_output(wait=True)
            try:
                box.last_result = run(**values)
                show(plot(box.last_result))
                settings = ", ".join(f"{k}={v}" for k, v in values.items())
                status.value = tr("done: {settings}").format(settings=settings)
            except Exception as exc:  # keep the kernel and the widget alive, say what went wrong
                status.value = tr("❌ failed, see below")
                print(f"❌ {type(exc).__name__}: {exc}")
            finally:
                button.disabled = False

    button.on_click(on_click)
    return box
