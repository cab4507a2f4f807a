"""The CJK font installed with the course (pylopdf-fonts-zh-cn: Noto Sans SC) draws the Chinese
edition's plots on a machine with no CJK font of its own (Colab, a container, a fresh Linux):
set_language("zh_CN") registers it with matplotlib, nothing is downloaded, no glyph is missing."""

from __future__ import annotations

import re
import socket
import warnings
from collections.abc import Iterator
from pathlib import Path

import matplotlib
import polib
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import font_manager  # noqa: E402
from matplotlib.ft2font import FT2Font  # noqa: E402

from helpers import i18n  # noqa: E402
from helpers.i18n import CJK_FONTS, course_cjk_font_file, set_language, use_cjk_font  # noqa: E402

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
#: Terms of the course's Chinese, and full-width punctuation, that a title may carry.
SAMPLE = (
    "显存不足，梯度累积，吞吐量，归约散播，张量核心，难分高下，无从判断（本底噪声）：轮；控件。"
)
CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]")
MISSING = re.compile(r"Glyph \d+ .*missing from font")


def gb2312_hanzi() -> str:
    """The 6,763 hanzi of GB2312 (levels 1 and 2): every character of everyday Simplified Chinese."""
    out = []
    for hi in range(0xB0, 0xF8):
        for lo in range(0xA1, 0xFF):
            try:
                out.append(bytes([hi, lo]).decode("gb2312"))
            except UnicodeDecodeError:
                pass
    return "".join(out)


def catalog_chinese() -> str:
    """Every CJK character and full-width sign the helpers' Chinese messages use."""
    text = "".join(
        e.msgstr
        for p in sorted((ROOT / "i18n/zh_CN/helpers").glob("*.po"))
        for e in polib.pofile(p)
    )
    return "".join(sorted(set(CJK.findall(text))))


def forget_font_lookups() -> None:
    """Empty matplotlib's cache of findfont() answers (kept across tests otherwise)."""
    cached = getattr(font_manager.fontManager, "_findfont_cached", None)
    if cached is not None:
        cached.cache_clear()


@pytest.fixture
def no_system_cjk_font(monkeypatch: pytest.MonkeyPatch) -> Iterator[list]:
    """matplotlib sees no system CJK font (as on Colab); rcParams, fonts and English come back after."""
    course = str(course_cjk_font_file())
    bare = [
        f for f in font_manager.fontManager.ttflist if f.name not in CJK_FONTS and f.fname != course
    ]
    monkeypatch.setattr(font_manager.fontManager, "ttflist", bare)
    forget_font_lookups()
    try:
        with matplotlib.rc_context():
            yield bare
    finally:
        set_language("en")
        monkeypatch.undo()
        forget_font_lookups()


def draw_chinese_figure() -> tuple[plt.Figure, list[str]]:
    """A figure with a Chinese title, labels, legend and negative ticks, drawn; the warnings."""
    fig, ax = plt.subplots()
    ax.plot([-2, -1, 0, 1], [-1.5, 0, 2, 3], label="吞吐量（tokens/s）")
    ax.set(title=SAMPLE, xlabel="批大小", ylabel="每步毫秒数")
    ax.legend()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.canvas.draw()
    return fig, [str(w.message) for w in caught]


def test_the_package_is_installed_and_covers_simplified_chinese() -> None:
    path = course_cjk_font_file()
    assert path is not None, "pip install -r requirements.txt (pylopdf-fonts-zh-cn) first"
    chars = set(FT2Font(str(path)).get_charmap())
    for what, text in (
        ("the sample", SAMPLE),
        ("GB2312's hanzi", gb2312_hanzi()),
        ("the helpers' Chinese messages", catalog_chinese()),
    ):
        missing = sorted({c for c in text if ord(c) not in chars})
        assert not missing, f"{path.name} lacks {len(missing)} characters of {what}: {missing[:20]}"


def test_the_package_is_a_runtime_dependency_in_every_file() -> None:
    name = i18n.CJK_FONT_PACKAGE.replace("_", "-")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith(name) for d in deps), f"pyproject.toml's dependencies lack {name}"
    assert re.search(rf"^{name}\b", (ROOT / "requirements.txt").read_text(), re.M)
    assert re.search(rf"^\s+- {name}\b", (ROOT / "environment.yml").read_text(), re.M)


def test_chinese_title_draws_with_the_course_font_and_no_missing_glyph(
    no_system_cjk_font: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("use_cjk_font() must never reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    set_language("zh_CN")
    assert matplotlib.rcParams["font.sans-serif"][0] == "Noto Sans SC"
    fig, caught = draw_chinese_figure()
    try:
        assert not [m for m in caught if MISSING.search(m)], caught
        title = fig.axes[0].title
        assert font_manager.findfont(title.get_fontproperties()) == str(course_cjk_font_file())
    finally:
        plt.close(fig)


def test_without_any_cjk_font_the_same_figure_misses_glyphs(
    no_system_cjk_font: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the check above would see the empty boxes if the course's font were missing."""
    monkeypatch.setattr(i18n, "CJK_FONT_PACKAGE", "no_such_font_package")
    assert use_cjk_font() is None
    fig, caught = draw_chinese_figure()
    plt.close(fig)
    assert [m for m in caught if MISSING.search(m)], "DejaVu Sans has no hanzi: expected warnings"


def test_a_system_cjk_font_still_comes_first(no_system_cjk_font: list) -> None:
    system = font_manager.FontEntry(fname="/usr/share/fonts/x.otf", name="Noto Sans CJK SC")
    no_system_cjk_font.append(system)
    assert use_cjk_font() == "Noto Sans CJK SC"
    assert not [f for f in no_system_cjk_font if f.fname == str(course_cjk_font_file())], (
        "the course's font is registered only where the machine has none"
    )


def test_the_course_font_is_registered_once(no_system_cjk_font: list) -> None:
    course = str(course_cjk_font_file())
    assert use_cjk_font() == "Noto Sans SC"
    entries = sum(f.fname == course for f in no_system_cjk_font)
    assert use_cjk_font() == "Noto Sans SC"
    assert entries >= 1 and sum(f.fname == course for f in no_system_cjk_font) == entries
    assert matplotlib.rcParams["font.sans-serif"].count("Noto Sans SC") == 1
