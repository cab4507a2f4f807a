"""The course as a learner meets it: JupyterLab in a real (headless) Chromium.

For the template and for every notebook whose code calls ``interactive_plot(`` (plus a
self-test notebook made from the template, so the widget path is covered even before any
chapter has a widget): open it, run all cells from the Run menu, wait for the kernel to go
idle, and assert that every code cell ran without an error output. For widget notebooks:
assert the controls rendered as controls (not as text), press Run, change one control (a
slider where there is one), press Run again, and assert that the status line and the plot
image changed and the kernel went idle again. Chapter 1 runs in its Chinese edition (the same
code), which must also show Chinese text and Chinese output. A screenshot of each notebook, and the
notebook as executed in the browser, are saved under artifacts/browser/.

Set BROWSER_RUN_ALL_TIMEOUT / BROWSER_WIDGET_TIMEOUT (seconds) on a slow machine.
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any

import pytest
from browser_support import ARTIFACTS, SELFTEST, Lab, widget_notebooks

RUN_ALL_TIMEOUT = float(os.environ.get("BROWSER_RUN_ALL_TIMEOUT", "900"))
WIDGET_TIMEOUT = float(os.environ.get("BROWSER_WIDGET_TIMEOUT", "300"))
TEMPLATE = "templates/chapter_template.ipynb"
ZH_CHAPTER = "zh/notebooks/01_devices.ipynb"  # the Chinese chapter the browser runs
CJK = re.compile(r"[\u4e00-\u9fff]")
# The Chinese chapter stands in for its English twin: the same code, byte for byte
# (tests/test_translate.py), so the browser checks its widgets and its language in one run.
WIDGET_NOTEBOOKS = [
    SELFTEST,
    *(ZH_CHAPTER if rel == ZH_CHAPTER.removeprefix("zh/") else rel for rel in widget_notebooks()),
]
# What an ipywidget looks like when no widget renderer is installed: its text repr.
WIDGET_AS_TEXT = re.compile(
    r"^(VBox|HBox|Box|GridBox|Tab|Accordion|Output|Button|HTML|Label|Checkbox|Dropdown|"
    r"IntSlider|FloatSlider|FloatLogSlider|IntRangeSlider|FloatRangeSlider|SelectionSlider|"
    r"ToggleButtons|RadioButtons|IntProgress|FloatProgress|IntText|FloatText)\(",
    re.M,
)

JS_STATE = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  if (!w || !w.content || !w.content.model || !w.sessionContext) return null;
  const s = w.sessionContext.session;
  const k = s && s.kernel;
  const prompts = [...w.node.querySelectorAll('.jp-InputPrompt')].map(e => e.textContent);
  return {kernel: k ? k.status : 'none', busy: prompts.filter(t => t.includes('*')).length};
}"""
JS_CELLS = """() => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  const cells = [];
  for (let i = 0; i < nb.model.cells.length; i++) {
    const c = nb.model.cells.get(i);
    if (c.type !== 'code') continue;
    const outs = c.outputs.toJSON();
    cells.push({
      index: i,
      count: c.executionCount,
      source: c.sharedModel.getSource().split('\\n').slice(0, 3).join('\\n'),
      errors: outs.filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
      widgets: outs.filter(o => o.data && o.data['application/vnd.jupyter.widget-view+json']).length,
    });
  }
  return cells;
}"""
JS_NOTEBOOK_JSON = "() => window.jupyterapp.shell.currentWidget.content.model.toJSON()"
JS_TAG_BOXES = """() => {
  // interactive_plot's layout: VBox([*controls, HBox([button, status]), Output])
  const boxes = [...document.querySelectorAll('.jp-Notebook .widget-vbox')].filter(b => {
    const kids = [...b.children];
    return kids.some(k => k.classList.contains('widget-output')) &&
      kids.some(k => k.classList.contains('widget-hbox') && k.querySelector('.widget-button'));
  });
  boxes.forEach((b, i) => b.setAttribute('data-course-widget', String(i)));
  return boxes.length;
}"""
JS_BOX_STATE = """(i) => {
  const b = document.querySelector(`[data-course-widget="${i}"]`);
  const row = [...b.children].find(k => k.classList.contains('widget-hbox'));
  const out = [...b.children].find(k => k.classList.contains('widget-output'));
  const button = row.querySelector('.widget-button');
  const status = row.querySelector('.widget-html-content, .widget-html');
  return {
    disabled: button.disabled,
    label: button.textContent.trim(),
    status: status ? status.textContent.trim() : '',
    images: [...out.querySelectorAll('img')].map(im => im.src),
    text: out.innerText.trim(),
  };
}"""


def wait_for(page: Any, what: str, check: Any, timeout: float, poll: float = 0.5) -> Any:
    """Poll check() until it returns a truthy value; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        page.wait_for_timeout(poll * 1000)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (last state: {last})")


def kernel_idle(page: Any, timeout: float) -> None:
    """Wait until the kernel is idle with no cell queued or running, twice in a row."""
    seen = {"n": 0}

    def idle() -> bool:
        s = page.evaluate(JS_STATE)
        ok = bool(s) and s["kernel"] == "idle" and s["busy"] == 0
        seen["n"] = seen["n"] + 1 if ok else 0
        return seen["n"] >= 2

    wait_for(page, "the kernel to go idle", idle, timeout)


def accept_kernel_dialog(page: Any) -> None:
    """Answer JupyterLab's "Select Kernel" dialog with its default (Python 3), as a learner would.

    JupyterLab asks when the kernel list was not loaded yet as the notebook opened, which
    happens on a busy machine.
    """
    dialog = page.locator(".jp-Dialog")
    if dialog.count() and "Select Kernel" in dialog.first.inner_text():
        dialog.first.locator(".jp-mod-accept").first.click()


def open_notebook(page: Any, lab: Lab, rel: str) -> None:
    """Open a notebook in a fresh workspace and wait for its kernel."""
    page.goto(f"{lab.url}/lab/tree/{rel}?reset&token={lab.token}")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)

    def kernel_started() -> bool:
        accept_kernel_dialog(page)
        state = page.evaluate(JS_STATE)
        return bool(state) and state["kernel"] not in ("none", "unknown", "starting")

    wait_for(page, "the notebook's kernel to start", kernel_started, 180)
    kernel_idle(page, 120)
    page.evaluate(
        "() => { const s = window.jupyterapp.shell;"
        " if (!s.leftCollapsed) window.jupyterapp.commands.execute('application:toggle-left-area'); }"
    )


def run_all(page: Any) -> None:
    """Run > Run All Cells, as a learner would, then wait for the kernel."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    page.wait_for_timeout(1000)
    kernel_idle(page, RUN_ALL_TIMEOUT)


def assert_ran_cleanly(page: Any, rel: str) -> list[dict]:
    cells = page.evaluate(JS_CELLS)
    errors = [f"cell {c['index']} ({c['source']!r}): {e}" for c in cells for e in c["errors"]]
    assert not errors, f"{rel}: error outputs in JupyterLab:\n" + "\n".join(errors)
    not_run = [c["index"] for c in cells if c["count"] is None]
    assert not not_run, f"{rel}: code cells that did not run: {not_run}"
    shown_as_text = [
        t
        for t in page.locator(".jp-OutputArea-output .jp-RenderedText").all_inner_texts()
        if WIDGET_AS_TEXT.search(t)
    ]
    assert not shown_as_text, (
        f"{rel}: widgets are shown as text (no widget renderer in JupyterLab?): {shown_as_text[:2]}"
    )
    for sign in ("Error displaying widget", "Click to show javascript error"):
        assert page.locator(".jp-OutputArea-output", has_text=sign).count() == 0, (
            f"{rel}: JupyterLab shows '{sign}': the widget front end does not match the kernel's"
            " ipywidgets (ipywidgets 8 needs jupyterlab_widgets 3, ipywidgets 7 needs 1.x)"
        )
    return cells


def save_artifacts(page: Any, rel: str) -> None:
    """A screenshot and the notebook as executed in the browser, under artifacts/browser/."""
    stem = rel.replace("/", "__").removesuffix(".ipynb")
    try:
        page.screenshot(path=str(ARTIFACTS / f"{stem}.png"))
        nb = page.evaluate(JS_NOTEBOOK_JSON)
        (ARTIFACTS / f"{stem}.executed.ipynb").write_text(json.dumps(nb, indent=1))
    except Exception as exc:  # after a failure the page may be gone: keep the test's own error
        print(f"could not save the artefacts of {rel}: {exc}")


def change_one_control(box: Any) -> str:
    """Change one control of an interactive_plot box; return a description of the change."""
    sliders = box.locator(":scope > .widget-slider")
    for i in range(sliders.count()):
        slider = sliders.nth(i)
        handle = slider.locator(".noUi-handle, .ui-slider-handle").first
        readout = slider.locator(".widget-readout").first
        before = readout.inner_text().strip()
        for key in ("ArrowRight", "ArrowLeft", "ArrowLeft"):
            handle.focus()
            handle.press(key)
            box.page.wait_for_timeout(300)
            after = readout.inner_text().strip()
            if after != before:
                handle.blur()
                return f"slider {i}: {before} -> {after}"
    dropdowns = box.locator(":scope > .widget-dropdown select")
    for i in range(dropdowns.count()):
        select = dropdowns.nth(i)
        options = select.locator("option").all_inner_texts()
        if len(options) > 1:
            current = select.evaluate("s => s.selectedIndex")
            select.select_option(index=(current + 1) % len(options))
            return f"dropdown {i}: {options[current]} -> {options[(current + 1) % len(options)]}"
    multiples = box.locator(":scope > .widget-select-multiple select")
    for i in range(multiples.count()):
        select = multiples.nth(i)
        chosen = select.evaluate("s => [...s.options].map(o => o.selected)")
        if len(chosen) > 1:
            # add the first unselected option, or drop one if all are selected
            flip = chosen.index(False) if False in chosen else 0
            chosen[flip] = not chosen[flip]
            select.select_option(index=[j for j, on in enumerate(chosen) if on])
            return f"multiple selection {i}: option {flip} toggled"
    toggles = box.locator(":scope > .widget-toggle-buttons .widget-toggle-button:not(.mod-active)")
    if toggles.count():
        label = toggles.first.inner_text()
        toggles.first.click()
        return f"toggle button -> {label}"
    radios = box.locator(":scope > .widget-radio input[type=radio]:not(:checked)")
    if radios.count():
        radios.first.check()
        return "radio button"
    checkboxes = box.locator(":scope > .widget-checkbox input[type=checkbox]")
    if checkboxes.count():
        checkboxes.first.click()
        return "checkbox"
    numbers = box.locator(":scope > .widget-text input[type=number]")
    if numbers.count():
        value = float(numbers.first.input_value() or 0)
        numbers.first.fill(str(int(value + 1) if value.is_integer() else value * 1.5))
        numbers.first.press("Enter")
        return "number box"
    pytest.fail("the widget has no slider, dropdown, selection, toggle, checkbox or number control")


def press_run(page: Any, box: Any, index: int, previous: dict) -> dict:
    """Press the box's Run button; wait until it finished and the kernel is idle again."""
    box.locator(":scope > .widget-hbox .widget-button").first.click()
    seen_busy = {"yes": False}

    def finished() -> dict | None:
        s = page.evaluate(JS_BOX_STATE, index)
        busy = s["disabled"] or s["status"].startswith("running")
        seen_busy["yes"] = seen_busy["yes"] or busy
        changed = s["status"] != previous["status"] or s["images"] != previous["images"]
        return s if (not busy and (changed or seen_busy["yes"])) else None

    state = wait_for(page, "the Run button's result", finished, WIDGET_TIMEOUT)
    kernel_idle(page, WIDGET_TIMEOUT)
    state = page.evaluate(JS_BOX_STATE, index)
    assert "❌" not in state["status"], f"the widget's run failed: {state['text'][:2000]}"
    assert state["images"], f"no plot in the widget's output after Run: {state['text'][:500]!r}"
    return state


@pytest.mark.timeout(RUN_ALL_TIMEOUT + 300)
def test_template_runs_in_jupyterlab(page: Any, lab: Lab) -> None:
    try:
        open_notebook(page, lab, TEMPLATE)
        run_all(page)
        assert_ran_cleanly(page, TEMPLATE)
        assert page.locator(".jp-OutputArea-output").count() > 0, "no outputs rendered"
    finally:
        save_artifacts(page, TEMPLATE)


@pytest.mark.timeout(RUN_ALL_TIMEOUT + 4 * WIDGET_TIMEOUT)
@pytest.mark.parametrize("rel", WIDGET_NOTEBOOKS)
def test_widget_notebook_in_jupyterlab(page: Any, lab: Lab, rel: str) -> None:
    run_widget_notebook(page, lab, rel)


def run_widget_notebook(page: Any, lab: Lab, rel: str) -> None:
    """Open `rel`, run it all, press every widget's Run, change a control, press Run again."""
    try:
        open_notebook(page, lab, rel)
        run_all(page)
        cells = assert_ran_cleanly(page, rel)
        assert sum(c["widgets"] for c in cells) > 0, f"{rel}: no widget was displayed"
        n_boxes = page.evaluate(JS_TAG_BOXES)
        assert n_boxes > 0, f"{rel}: no interactive_plot widget rendered in JupyterLab"
        for i in range(n_boxes):
            box = page.locator(f'[data-course-widget="{i}"]')
            box.scroll_into_view_if_needed()
            controls = box.locator(
                ":scope > .jupyter-widgets:not(.widget-hbox):not(.widget-output)"
            )
            assert controls.count() > 0, f"{rel}: widget {i} has no controls"
            assert all(controls.nth(j).is_visible() for j in range(controls.count())), (
                f"{rel}: widget {i} has hidden controls"
            )
            state = page.evaluate(JS_BOX_STATE, i)
            assert not state["disabled"], f"{rel}: widget {i}'s Run button is disabled"
            first = press_run(page, box, i, state)
            change = change_one_control(box)
            second = press_run(page, box, i, first)
            assert second["status"] != first["status"], (
                f"{rel}: widget {i}: after '{change}' the status still says {first['status']!r}:"
                " the change did not reach the kernel"
            )
            assert second["images"] != first["images"], (
                f"{rel}: widget {i}: after '{change}' and Run the plot image did not change"
            )
            page.evaluate(
                '(i) => document.querySelector(`[data-course-widget="${i}"]`)'
                ".scrollIntoView({block: 'center'})",
                i,
            )
        assert_ran_cleanly(page, rel)
        if rel.startswith("zh/"):
            assert_chinese(page, rel)
    finally:
        save_artifacts(page, rel)


def assert_chinese(page: Any, rel: str) -> None:
    """The notebook's text and what its helpers printed are in Chinese."""
    prose = page.locator(".jp-MarkdownOutput").all_inner_texts()
    chinese = [t for t in prose if CJK.search(t)]
    assert prose and len(chinese) >= 0.8 * len(prose), (
        f"{rel}: only {len(chinese)} of {len(prose)} markdown cells show Chinese"
    )
    outputs = " ".join(page.locator(".jp-OutputArea-output").all_inner_texts())
    assert CJK.search(outputs), f"{rel}: no output in Chinese (did set_language run?)"


def test_only_127_0_0_1_is_reachable(page: Any, lab: Lab) -> None:
    page.goto(f"{lab.url}/lab?reset&token={lab.token}")  # reset: reopen no notebook
    page.wait_for_selector(".lm-MenuBar", timeout=120_000)
    before = len(lab.blocked)
    outcome = page.evaluate(
        "() => fetch('https://example.org/').then(() => 'reached', () => 'blocked')"
    )
    assert outcome == "blocked"
    assert "https://example.org/" in lab.blocked[before:]
