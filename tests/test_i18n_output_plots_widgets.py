"""helpers.plots and helpers.widgets speak Simplified Chinese after set_language("zh_CN") (the Run
button, its status line, a sweep's stopped-early title), English byte for byte after
set_language("en"); wrap_title wraps Chinese titles, which textwrap leaves on one line."""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator

import ipywidgets as widgets
import matplotlib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from english_share import ENGLISH_RUN  # the measure of an English line

from helpers.i18n import set_language  # noqa: E402
from helpers.plots import plot_sweep, wrap_title  # noqa: E402
from helpers.sweeps import SweepResult, run_sweep  # noqa: E402
from helpers.tables import screen_width  # noqa: E402
from helpers.widgets import interactive_plot  # noqa: E402

CJK = re.compile(r"[\u4e00-\u9fff]")
TITLE = (
    "bf16 的速度是 fp32 的 1.33 倍（难分高下：差距在种子间波动之内），显存不足时用梯度累积，"
    "吞吐量只有 1/2；张量核心（tensor core）上的归约散播无从判断。"
)


@pytest.fixture
def rc() -> Iterator[None]:
    """matplotlib's settings as they were, and English, after the test (set_language changes fonts)."""
    with matplotlib.rc_context():
        try:
            yield
        finally:
            set_language("en")
            plt.close("all")


def assert_chinese(text: str) -> None:
    assert CJK.search(text), f"no Chinese in {text!r}"
    assert not ENGLISH_RUN.search(text), f"English left in {text!r}: {ENGLISH_RUN.search(text)}"


def sweep(n: int, scale: float) -> SweepResult:
    return run_sweep(lambda k: {"y": k * scale}, range(1, n + 1), param="k", progress=False)


def stopped_sweep() -> SweepResult:
    def measure(k: int) -> dict:
        if k > 2:
            raise MemoryError("no room")
        return {"y": k}

    return run_sweep(measure, range(1, 5), param="k", progress=False)


def box_states(lang: str) -> list[str]:
    """The Run button and the status line, as made, after a run, after a failed run."""
    set_language(lang)
    made = interactive_plot(
        lambda n, scale: sweep(n, scale),
        lambda r: plot_sweep(r, "y"),
        {"n": widgets.IntSlider(value=3, min=1, max=5), "scale": widgets.FloatSlider(value=1.0)},
    )
    button, status = made.children[-2].children
    states = [button.description, status.value]
    made.run_button.click()
    states.append(status.value)

    def broken(n: int) -> object:
        raise ValueError("n must be even")

    failed = interactive_plot(broken, lambda r: plot_sweep(r, "y"), {"n": widgets.IntSlider()})
    failed.run_button.click()
    states.append(failed.children[-2].children[1].value)
    return states


def test_widget_texts_are_chinese(rc: None) -> None:
    button, ready, done, failed = box_states("zh_CN")
    for text in (button, ready, done, failed):
        assert_chinese(text)
    assert f"<b>{button}</b>" in ready, "the status names the button as the button shows it"
    assert "n=3, scale=1.0" in done, "the settings stay as the code names them"
    assert failed.startswith("❌")


def test_widget_texts_stay_english_byte_for_byte(rc: None) -> None:
    set_language("zh_CN")
    assert box_states("en") == [
        "Run",
        "Set the controls, then press <b>Run</b>.",
        "done: n=3, scale=1.0",
        "❌ failed, see below",
    ]


def test_a_stopped_sweeps_title_is_chinese_and_english_unchanged(rc: None) -> None:
    result = stopped_sweep()
    assert result.stopped and len(result) == 2
    set_language("zh_CN")
    for title in ("", "MFU"):
        text = plot_sweep(result, "y", title=title).axes[0].get_title()
        assert_chinese(text.removeprefix("MFU"))
        assert text.startswith(title) and "（" in text
    set_language("en")
    assert plot_sweep(result, "y", title="MFU").axes[0].get_title() == (
        "MFU (stopped early: out of memory)"
    )
    ax = plot_sweep(sweep(3, 1.0), "y", title="test").axes[0]
    assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("test", "k", "y")


def test_english_titles_wrap_exactly_as_textwrap_does() -> None:
    for text in (
        "Case study: each fix added to the previous ones, measured on cuda:0 with bf16 autocast",
        "short",
        "a" * 90 + " word",
        "",
    ):
        for width in (20, 70):
            assert wrap_title(text, width) == textwrap.fill(text, width)


@pytest.mark.parametrize("width", [12, 20, 31, 70])
def test_chinese_titles_wrap_between_characters(width: int) -> None:
    old = textwrap.fill(TITLE, width).split("\n")
    assert any(screen_width(line) > width for line in old), (
        "textwrap counts characters, not columns"
    )
    lines = wrap_title(TITLE, width).split("\n")
    assert len(lines) >= screen_width(TITLE) // width
    assert all(screen_width(line) <= width for line in lines), lines
    assert all(line == line.strip() for line in lines)
    assert [w for line in lines for w in re.findall(r"[A-Za-z0-9./]+", line)] == re.findall(
        r"[A-Za-z0-9./]+", TITLE
    ), "English words, numbers and dtypes stay whole"
    assert all(line[0] not in "，。：；）" for line in lines), lines
    assert all(line[-1] != "（" for line in lines), lines
    joined = "".join(lines)
    assert joined.replace(" ", "") == TITLE.replace(" ", ""), "nothing lost or added"


def test_wrapping_keeps_line_breaks_and_a_space_only_between_words() -> None:
    assert wrap_title("第一行\n第二行", 70) == "第一行\n第二行"
    assert wrap_title("显存不足 fp32 吞吐量", 8) == "显存不足\nfp32 吞\n吐量"
    assert wrap_title("张量核心 tensor core", 14) == "张量核心\ntensor core"
