"""The language the checkers and the helpers' verdicts print in: English, or Simplified Chinese
from a gettext catalog (chapter 1).

English is the source text. A Chinese notebook's setup cell calls ``set_language("zh_CN")``;
from then on every message written as ``tr("...")`` comes from
``helpers/locale/zh_CN/LC_MESSAGES/helpers.mo``, compiled by ``tools/translate.py`` from the
catalogs in ``i18n/zh_CN/helpers/``. A message with placeholders is translated first and
formatted after: ``tr("expected {want}, got {got}").format(want=..., got=...)``. The choice is
also put in ``COURSE_LANG``, so processes the notebook starts (torchrun's ranks) speak it too.
"""

from __future__ import annotations

import gettext
import importlib
import os
import re
from pathlib import Path
from types import ModuleType

LOCALE_DIR = Path(__file__).resolve().parent / "locale"
DOMAIN = "helpers"
LANGUAGES = ("en", "zh_CN")
ENV = "COURSE_LANG"
_active: dict[str, object] = {}


def set_language(lang: str) -> str:
    """Print checks and verdicts in `lang` ('en' or 'zh_CN') from now on; returns it (chapter 1)."""
    if lang not in LANGUAGES:
        raise ValueError(
            f"set_language({lang!r}): the course speaks {', '.join(map(repr, LANGUAGES))}. "
            "Use 'zh_CN' for Simplified Chinese, 'en' for English."
        )
    os.environ[ENV] = lang
    _active.clear()
    if lang != "en":  # plot titles may carry a translated verdict: draw it with a CJK font
        use_cjk_font()
    return lang


def language() -> str:
    """The language checks and verdicts print in: COURSE_LANG, else English (chapter 1)."""
    lang = os.environ.get(ENV, "en")
    return lang if lang in LANGUAGES else "en"


def _catalog() -> gettext.NullTranslations:
    """The compiled catalog of the current language, loaded once per language (chapter 1)."""
    lang = language()
    if _active.get("lang") != lang:
        _active["lang"] = lang
        _active["catalog"] = (
            gettext.NullTranslations()
            if lang == "en"
            else gettext.translation(DOMAIN, LOCALE_DIR, languages=[lang])
        )
    return _active["catalog"]  # type: ignore[return-value]


def tr(message: str) -> str:
    """`message` in the current language: the English itself, or its translation (chapter 1)."""
    return _catalog().gettext(message) if message else message  # gettext("") is the header


def tight_cjk(text: str) -> str:
    """`text` without the spaces a template put between two Chinese words (a Chinese row name
    filled in where an English one needs them: 「最终循环 的速度」 -> 「最终循环的速度」) (chapter 1)."""
    return re.sub(r"(?<=[\u4e00-\u9fff）」])[ ]+(?=[\u4e00-\u9fff（「])", "", text)


def tr_mark(message: str) -> str:
    """Mark `message` for the catalog without translating it now (tr() it where it is printed) (chapter 1)."""
    return message


#: Fonts with Chinese glyphs, in order of preference (Linux, macOS, Windows).
CJK_FONTS = (
    "Noto Sans CJK SC", "Noto Sans SC", "Source Han Sans SC", "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei", "PingFang SC", "Heiti SC", "Hiragino Sans GB", "Microsoft YaHei", "SimHei",
    # last: Debian's fonts-noto-cjk is one .ttc whose first font is the Japanese one, the only
    # one matplotlib before 3.11 reads; it has every Chinese character, in Japanese shapes
    "Noto Sans CJK JP",
)  # fmt: skip
#: The package that installs a CJK font with the course (requirements.txt, pyproject.toml): Noto
#: Sans SC Regular (SIL Open Font License 1.1; every GB2312 and GBK hanzi), a data-only wheel.
CJK_FONT_PACKAGE = "pylopdf_fonts_zh_cn"


def course_cjk_font_file() -> Path | None:
    """The CJK font file installed with the course (Noto Sans SC), or None without its package (chapter 1)."""
    try:
        package = importlib.import_module(CJK_FONT_PACKAGE)
    except ImportError:
        return None
    path = Path(package.__file__).with_name("NotoSansSC-Regular.otf")
    return path if path.is_file() else None


def _course_font_name(font_manager: ModuleType) -> str | None:
    """Register the course's CJK font with matplotlib (once; never downloads); its family name."""
    path = course_cjk_font_file()
    if path is None:
        return None
    entries = font_manager.fontManager.ttflist
    if not any(f.fname == str(path) for f in entries):
        font_manager.fontManager.addfont(str(path))
    return next(f.name for f in entries if f.fname == str(path))


def use_cjk_font() -> str | None:
    """Let plots draw Chinese: a CJK font goes first in matplotlib's sans-serif list (chapter 1).

    An installed system font of CJK_FONTS with Chinese shapes first, in that order; else the Noto
    Sans SC file the course installs (pylopdf-fonts-zh-cn), registered with matplotlib from its
    package (nothing is downloaded); else Noto Sans CJK JP (Japanese shapes). Returns the font's name, or None when there is neither (Chinese in a plot
    title then shows as empty boxes: `pip install pylopdf-fonts-zh-cn`, or install a system
    font, e.g. Debian's fonts-noto-cjk).
    """
    from matplotlib import font_manager, rcParams

    installed = {f.name for f in font_manager.fontManager.ttflist}
    chinese_shapes, japanese_shapes = CJK_FONTS[:-1], CJK_FONTS[-1]
    found = next((name for name in chinese_shapes if name in installed), None)
    if found is None:  # the course's Noto Sans SC before a font with Japanese shapes
        found = _course_font_name(font_manager)
    if found is None and japanese_shapes in installed:
        found = japanese_shapes
    if found is not None:
        rcParams["font.sans-serif"] = [
            found,
            *[f for f in rcParams["font.sans-serif"] if f != found],
        ]
        rcParams["font.family"] = "sans-serif"
    return found
