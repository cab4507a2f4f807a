"""How much of what a Chinese notebook prints is still English (issue 32's measure).

    python tools/english_share.py executed/zh/notebooks/*.ipynb   # executed notebooks

A printed text line counts as English when it has a run of three English words and no Chinese
character. Left out: torch's and Python's own errors and warnings (a line naming an exception or
warning class, a traceback's lines, an error output, and a stderr output with a warning in it),
URLs, command-line options, paths and identifiers inside a line, the plain-text stand-in of a widget
(the front end draws the widget itself), and a printed listing of the course's own source
(`print(inspect.getsource(f))`: code, like a code cell; its comments stay the helpers' English). `tests/test_zh_output.py` executes Chinese chapters
and holds each to `TARGET`.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import textwrap
from pathlib import Path

#: At most this share of printed lines may be English (issue 32).
TARGET = 0.05
CJK = re.compile(r"[\u3400-\u9fff]")
ENGLISH_RUN = re.compile(r"\b[A-Za-z][a-z']+(?:[\s,;:()-]+[A-Za-z][a-z']+){2,}\b")
#: torch's or Python's own error or warning quoted in a line (they stay English), or a line
#: of a traceback (a rank's is relayed with a "[rank0]:" prefix).
FOREIGN_ERROR = re.compile(
    r"\b[A-Z]\w*(Error|Exception|Warning)\b|Traceback \(most recent call last\)"
    r"|^\s*(\[rank\d+\]:)?\s*File \""
    r"|^findfont: |^Matplotlib is building the font cache"  # matplotlib's own log lines
)
#: Not words: URLs, command-line options, paths and identifiers (a.b, a_b, f()).
NOT_WORDS = re.compile(r"\S+://\S+|(?<!\w)--?[\w-]+(=\S*)?|\S*[/\\]\S*|\w+([._]\w+)+(\(\))?")
WIDGET = "application/vnd.jupyter.widget-view+json"


def is_source_listing(text: str) -> bool:
    """An output that is Python source the cell printed (inspect.getsource, script_source):
    code, as a code cell is, whose comments and docstrings are the helpers' English."""
    code = textwrap.dedent(text)
    if not re.search(r"^\s*(def|class|async def|@)\b", code, re.M):
        return False
    try:
        ast.parse(code)
    except SyntaxError:
        return False
    return True


def printed_lines(nb: dict) -> list[str]:
    """The non-blank text lines a notebook's code cells printed or displayed, in order."""
    out: list[str] = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                text = o.get("text", "")
            elif "data" in o and WIDGET not in o["data"]:
                text = o["data"].get("text/plain", "")
            else:
                continue
            text = text if isinstance(text, str) else "".join(text)
            lines = [line for line in text.splitlines() if line.strip()]
            if o.get("name") == "stderr" and any(FOREIGN_ERROR.search(x) for x in lines):
                continue  # a warning or traceback torch or Python wrote, continuation lines too
            if not is_source_listing(text):
                out += _without_frames(lines)
    return out


def _without_frames(lines: list[str]) -> list[str]:
    """The lines without each traceback frame's source line (the line after 'File "...")."""
    out, after_frame = [], False
    for line in lines:
        if not after_frame:
            out.append(line)
        after_frame = bool(re.match(r'\s*(\[rank\d+\]:)?\s*File "', line))
    return out


def english(lines: list[str]) -> list[str]:
    """The lines that count as English (see the module's docstring)."""
    return [
        line
        for line in lines
        if ENGLISH_RUN.search(NOT_WORDS.sub(" ", line))
        and not CJK.search(line)
        and not FOREIGN_ERROR.search(line)
    ]


def share(nb: dict) -> tuple[int, int]:
    """(English lines, printed lines) of an executed notebook."""
    lines = printed_lines(nb)
    return len(english(lines)), len(lines)


def main(argv: list[str] | None = None) -> int:
    """Print each executed notebook's English share, and its English lines with --lines."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--lines", action="store_true", help="print the English lines too")
    args = parser.parse_args(argv)
    worst = 0.0
    for path in args.notebooks:
        nb = json.loads(path.read_text(encoding="utf-8"))
        n_en, n = share(nb)
        worst = max(worst, n_en / max(n, 1))
        print(f"{path}: {n_en}/{n} = {n_en / max(n, 1):.1%} English")
        if args.lines:
            for line in english(printed_lines(nb)):
                print(f"    {line[:150]}")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
