"""The Chinese edition from one source: gettext catalogs of the English notebooks, and the
Chinese notebooks written from them.

    python tools/translate.py             # update i18n/zh_CN/*.po from the notebooks, write zh/
    python tools/translate.py --check     # exit 1 if a message is untranslated or fuzzy, a
                                          # catalog is behind its notebook, or zh/ drifted
    python tools/translate.py --stats     # translated / fuzzy / untranslated, per catalog
    python tools/translate.py --only 03   # the notebooks whose name contains 03

One catalog per notebook, `i18n/zh_CN/<folder>/<notebook>.po` (gettext, as sphinx-intl and
Jupyter Book keep them; edit them in Poedit, Weblate or any text editor). Each markdown cell is
a message, and so is each code comment (a run of comment lines at one indentation is one
message; its translation may have any number of lines; a comment after code stays one line).
The context of a message is its cell's id. Code is never translated: a Chinese notebook has the
English notebook's cells, ids and code, byte for byte, with only the comments and the markdown
replaced, and its Colab badge pointing at the Chinese copy.

Updating works like gettext's msgmerge: a message whose English text is unchanged keeps its
translation (wherever its cell moved); a changed text gets the old translation marked *fuzzy*
(with the previous English kept as `#| msgid`), for a translator to check; a new text starts
untranslated. `--check` fails on any fuzzy or untranslated message, so an English change cannot
leave the Chinese edition silently behind.

The checkers and the helpers' verdicts speak the notebook's language too: every message the
helpers print is written `tr("...")` (`helpers/i18n.py`); those messages are gathered per module
into `i18n/zh_CN/helpers/<module>.po` (same rules: fuzzy when the English changes), and compiled
into `helpers/locale/zh_CN/LC_MESSAGES/helpers.mo`, which `--check` compares with what it writes.
A Chinese notebook's setup cell ends with `set_language("zh_CN")`: the only code a Chinese
notebook adds.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import io
import os
import re
import string
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import polib

sys.path.insert(0, str(Path(__file__).resolve().parent))
import set_repo  # noqa: E402

import nbfiles  # noqa: E402

ROOT = nbfiles.ROOT
LANG = "zh_CN"
CATALOGS = ROOT / "i18n" / LANG
OUT = ROOT / "zh"
SOURCE_DIRS = ("notebooks", "exercises", "solutions")
#: Comments that are instructions to a tool, not prose: left as they are.
PRAGMA = re.compile(r"^#+\s*(noqa\b|fmt:|type:|pragma\b|pylint:|ruff:|(BEGIN|END) SOLUTION\b)")
#: A fuzzy match needs this much similarity with the old English text (difflib's ratio).
FUZZY_RATIO = 0.5
CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
LINK_TARGET = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+\$", re.DOTALL)
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
#: Markdown emphasis around Chinese words (*最快*), which a printed message shows literally.
EMPHASIS = re.compile(
    r"(?<![A-Za-z0-9_*])\*{1,2}[^\s*][^*]*?[\u4e00-\u9fff][^*]*?\*{1,2}(?![A-Za-z0-9_*])"
)
#: Chinese characters and full-width punctuation, at a line's end or start (hard_breaks).
CJK_END = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]$")
CJK_START = re.compile(r"\s*[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
#: A markdown line that is not paragraph text: blank, list item, heading, quote, table, fence,
#: HTML, display math, indented code.
STRUCTURAL = re.compile(r"\s*$|\s*([-*+#>]\s|\d+\.\s|```|\$\$|<|\|)| {4}")
#: A line whose end is not paragraph text (a heading, table row, HTML, math or a fence).
NOT_TEXT = re.compile(r"\s*$|\s*(#|\||<|\$\$|```)")
HELPERS = ROOT / "helpers"
HELPER_CATALOGS = CATALOGS / "helpers"
MO_PATH = HELPERS / "locale" / LANG / "LC_MESSAGES" / "helpers.mo"
#: What a Chinese notebook's setup cell gains at its end (the only code the translation adds).
SET_LANGUAGE = (
    "\nfrom helpers.i18n import set_language\n\n"
    'set_language("zh_CN")  # 练习检查的结果与提示、各个结论都用中文输出\n'
)
SETUP_MARK = "# Setup, the same in every notebook."
#: How the catalogs write the course's repository and branch, so that `make set-repo` (a fork)
#: changes no message: links are stored with these and filled in when zh/ is written.
REPO_TOKEN, BRANCH_TOKEN = "COURSE_REPO", "COURSE_BRANCH"


def _relink(text: str, old: tuple[str, str], new: tuple[str, str]) -> str:
    """GitHub and Colab links to repository/branch `old` rewritten to `new` (both (repo, branch))."""
    for host in ("github.com/", "colab.research.google.com/github/"):
        text = text.replace(f"{host}{old[0]}/blob/{old[1]}/", f"{host}{new[0]}/blob/{new[1]}/")
        text = text.replace(f"{host}{old[0]}", f"{host}{new[0]}")
    return text


def canonical(text: str) -> str:
    """Text with the course's repository and branch (GitHub and Colab links) replaced by tokens."""
    src = set_repo.read_source(ROOT)
    return _relink(text, (src.repo, src.branch), (REPO_TOKEN, BRANCH_TOKEN))


def actual(text: str) -> str:
    """The tokens of canonical() replaced by the repository and branch of pyproject.toml."""
    src = set_repo.read_source(ROOT)
    return _relink(text, (REPO_TOKEN, BRANCH_TOKEN), (src.repo, src.branch))


@dataclass(frozen=True)
class Comment:
    """A comment message in a code cell: a block of full-line comments, or one trailing comment."""

    first: int  # 0-based line of the first comment line
    last: int  # 0-based line of the last
    col: int  # column of the '#'
    text: str  # the English, '# ' removed, lines joined by '\n'
    trailing: bool  # after code on its line
    prefix: str = "# "  # how the comment starts: '# ', '#: ', '## ' ...


@dataclass(frozen=True)
class Message:
    """One message of a notebook: its cell id, English text and kind."""

    ctx: str
    msgid: str
    kind: str  # "markdown", "comment" or "trailing comment"
    cell: int | None  # the cell's index; None for a helper module's message


def _masked(source: str) -> str:
    """The cell with IPython magics and shell lines blanked, so Python's tokenizer reads it."""
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n")
    )


def comments(source: str) -> list[Comment]:
    """The comment messages of a code cell, in order (pragmas and solution markers left out)."""
    found: list[tuple[int, int, str, bool, str]] = []
    lines = source.split("\n")
    stub, in_stub = set(), False  # make_exercises' stub regions: commented-out code, not prose
    for row, line in enumerate(lines):
        if line.strip() == "### BEGIN STUB":
            in_stub = True
        if in_stub:
            stub.add(row)
        if line.strip() == "### END STUB":
            in_stub = False
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(_masked(source)).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError) as exc:
        raise ValueError(f"cannot read the comments of this cell ({exc}):\n{source}") from None
    for tok in tokens:
        if tok.type != tokenize.COMMENT or PRAGMA.match(tok.string) or tok.start[0] - 1 in stub:
            continue
        row, col = tok.start[0] - 1, tok.start[1]
        trailing = bool(lines[row][:col].strip())
        prefix = re.match(r"^#+:? ?", tok.string).group(0)
        found.append(
            (
                row,
                col,
                tok.string[len(prefix) :],
                trailing,
                prefix if prefix.endswith(" ") else prefix + " ",
            )
        )
    out: list[Comment] = []
    for row, col, text, trailing, prefix in found:
        prev = out[-1] if out else None
        if (
            prev is not None and not trailing and not prev.trailing
            and prev.col == col and prev.last == row - 1
        ):  # fmt: skip
            out[-1] = Comment(prev.first, row, col, prev.text + "\n" + text, False, prev.prefix)
        else:
            out.append(Comment(row, row, col, text, trailing, prefix))
    return out


def messages(nb: dict) -> list[Message]:
    """Every message of a notebook, in cell order."""
    out = []
    for i, cell in enumerate(nb["cells"]):
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        if cell["cell_type"] == "markdown" and source.strip():
            out.append(Message(cell["id"], canonical(source), "markdown", i))
        elif cell["cell_type"] == "code":
            for c in comments(source):
                out.append(
                    Message(cell["id"], c.text, "trailing comment" if c.trailing else "comment", i)
                )
    return out


def sources() -> list[Path]:
    """The English notebooks that have a Chinese edition."""
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).glob("*.ipynb"))


def catalog_path(notebook: Path) -> Path:
    """i18n/zh_CN/<folder>/<name>.po for notebooks/<name>.ipynb and the like."""
    rel = notebook.relative_to(ROOT)
    return CATALOGS / rel.parent / (rel.stem + ".po")


def output_path(notebook: Path) -> Path:
    """zh/<folder>/<name>.ipynb."""
    return OUT / notebook.relative_to(ROOT)


def new_catalog(notebook: Path) -> polib.POFile:
    """An empty catalog with the standard header."""
    po = polib.POFile(wrapwidth=100)
    po.metadata = {
        "Project-Id-Version": f"pytorch-gpu-course {notebook.relative_to(ROOT)}",
        "Language": LANG,
        "MIME-Version": "1.0",
        "Content-Type": "text/plain; charset=UTF-8",
        "Content-Transfer-Encoding": "8bit",
    }
    return po


def load_catalog(notebook: Path) -> polib.POFile:
    """The notebook's catalog, or an empty one."""
    path = catalog_path(notebook)
    return polib.pofile(str(path), wrapwidth=100) if path.exists() else new_catalog(notebook)


def memory(catalogs: list[polib.POFile]) -> dict[str, str]:
    """English -> Chinese for every translated, non-fuzzy message of these catalogs."""
    return {
        e.msgid: e.msgstr
        for po in catalogs
        for e in po
        if e.msgstr and not e.fuzzy and not e.obsolete
    }


def closest(entries: list[polib.POEntry], msgid: str) -> polib.POEntry | None:
    """The entry whose English is most like `msgid`, if alike enough to keep as a fuzzy guess."""
    scored = [
        (difflib.SequenceMatcher(None, e.msgid, msgid).ratio(), i) for i, e in enumerate(entries)
    ]
    ratio, i = max(scored, default=(0.0, -1))
    return entries[i] if ratio >= FUZZY_RATIO else None


def update(po: polib.POFile, msgs: list[Message], path: str, known: dict[str, str]) -> polib.POFile:
    """The catalog for these messages: same text keeps its translation, changed text turns fuzzy."""
    old = [e for e in po if not e.obsolete]
    exact = {(e.msgctxt, e.msgid): e for e in old}
    wanted = {m.msgid for m in msgs}
    unused = [e for e in old if e.msgid not in wanted and e.msgstr]
    out = polib.POFile(wrapwidth=100)
    out.metadata = po.metadata or new_catalog(ROOT / path).metadata
    seen: set[tuple[str, str]] = set()
    for m in msgs:
        if (m.ctx, m.msgid) in seen:
            continue
        seen.add((m.ctx, m.msgid))
        entry = polib.POEntry(msgctxt=m.ctx, msgid=m.msgid, msgstr="", comment=m.kind)
        entry.occurrences = [(path, "" if m.cell is None else str(m.cell))]
        same = exact.get((m.ctx, m.msgid))
        if same is not None and (same.msgstr or m.msgid not in known):
            entry.msgstr, entry.flags = same.msgstr, list(same.flags)
            entry.previous_msgid = same.previous_msgid
        elif m.msgid in known:
            entry.msgstr = known[m.msgid]
        else:
            near = [e for e in unused if e.msgctxt == m.ctx] or unused
            best = closest(near, m.msgid)
            if best is not None:
                entry.msgstr, entry.flags, entry.previous_msgid = best.msgstr, ["fuzzy"], best.msgid
        out.append(entry)
    return out


def _fix_links(text: str, notebook: Path) -> str:
    """Colab badges point at the Chinese copy; relative links out of the notebook tree go one level up."""
    text = re.sub(
        r"(colab\.research\.google\.com/github/[^)\s\"]+?/blob/[^/)\s\"]+/)(?=(notebooks|exercises|solutions)/)",
        r"\1zh/",
        text,
    )

    def relative(m: re.Match) -> str:
        target = m.group(1)
        if target.startswith("../") and not target.startswith(
            tuple(f"../{d}/" for d in SOURCE_DIRS)
        ):
            return m.group(0).replace(target, "../" + target, 1)
        return m.group(0)

    return LINK_TARGET.sub(relative, text)


def translate_code(source: str, table: dict[tuple[str, str], str], ctx: str) -> str:
    """The cell's code with each comment replaced by its translation (same code, same lines between)."""
    lines = source.split("\n")
    for c in reversed(comments(source)):
        zh = table[(ctx, c.text)]
        if c.trailing:
            line = lines[c.first]
            lines[c.first] = line[: c.col] + c.prefix + zh
        else:
            indent = lines[c.first][: c.col]
            lines[c.first : c.last + 1] = [
                f"{indent}{c.prefix}{t}".rstrip() for t in zh.split("\n")
            ]
    return "\n".join(lines)


def build(notebook: Path, po: polib.POFile) -> str:
    """The Chinese notebook's exact text, from the English notebook and a complete catalog."""
    nb = nbfiles.read(notebook)
    table = {(e.msgctxt, e.msgid): e.msgstr for e in po if not e.obsolete}
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.strip():
            cell.source = _fix_links(actual(table[(cell.id, canonical(cell.source))]), notebook)
        elif cell.cell_type == "code":
            setup = cell.source.startswith(SETUP_MARK)
            cell.source = translate_code(cell.source, table, cell.id)
            if setup:
                cell.source = cell.source.rstrip("\n") + "\n" + SET_LANGUAGE.rstrip("\n")
    return nbfiles.dumps(nb)


def problems(po: polib.POFile, path: str) -> list[str]:
    """Untranslated, fuzzy or damaged messages of one catalog, one line each."""
    out = []
    for e in po:
        if e.obsolete:
            continue
        where = (
            f"{path} [{e.msgctxt}] {e.msgid[:60]!r}" if e.msgctxt else f"{path} {e.msgid[:60]!r}"
        )
        if "fuzzy" in e.flags:
            out.append(
                f"{where}: fuzzy (the English changed): check the translation, remove the flag"
            )
        elif not e.msgstr.strip():
            out.append(f"{where}: untranslated")
        elif e.msgctxt is None and placeholder_problem(e):  # a helper's tr("... {x}") message
            out.append(f"{where}: {placeholder_problem(e)}")
        elif e.msgctxt is None and EMPHASIS.search(e.msgstr):
            out.append(
                f"{where}: {EMPHASIS.search(e.msgstr).group(0)!r} prints its asterisks as they are "
                "(a runtime message is plain text): drop them or use quotation marks"
            )
        elif e.comment == "trailing comment" and "\n" in e.msgstr:
            out.append(f"{where}: a comment after code must stay on one line")
        elif e.comment == "markdown":
            for name, pattern in (
                ("code span", CODE_SPAN),
                ("link target", LINK_TARGET),
                ("formula", MATH),
                ("marker", HTML_COMMENT),
            ):
                kept = [m.group(0) for m in pattern.finditer(e.msgstr)]
                lost = [m.group(0) for m in pattern.finditer(e.msgid) if m.group(0) not in kept]
                if lost:
                    out.append(
                        f"{where}: {name} {lost[0][:50]!r} is not in the translation (keep it as it is)"
                    )
                    break
            else:
                out += [f"{where}: {b}" for b in hard_breaks(e.msgstr)[:1]]
    return out


def hard_breaks(markdown: str) -> list[str]:
    """Line breaks between two Chinese characters inside a paragraph (they render as a space)."""
    found, fence, lines = [], False, markdown.split("\n")
    for a, b in zip(lines, lines[1:]):
        fence ^= a.lstrip().startswith("```")
        if fence or STRUCTURAL.match(b) or NOT_TEXT.match(a) or a.endswith("  "):
            continue
        if CJK_END.search(a) and CJK_START.match(b):
            found.append(
                f"a line break inside a Chinese paragraph ({a[-8:]!r} / {b.lstrip()[:8]!r}) "
                "shows as a stray space: join the two lines"
            )
    return found


def helper_messages() -> dict[str, list[str]]:
    """Module name -> the English of its tr("...") and tr_mark("...") calls, in source order."""
    out: dict[str, list[str]] = {}
    for path in sorted(HELPERS.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("tr", "tr_mark") and node.args
            ):  # fmt: skip
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.append(arg.value)
                elif node.func.id == "tr_mark":
                    raise ValueError(
                        f"{path.relative_to(ROOT)}:{node.lineno}: tr_mark() takes a string literal"
                    )
                # tr(variable): the variable's possible values are marked with tr_mark("...")
        if found:
            out[module] = sorted(set(found), key=found.index)
    return out


def helper_catalog_path(module: str) -> Path:
    """i18n/zh_CN/helpers/<module>.po."""
    return HELPER_CATALOGS / f"{module}.po"


def update_helper_catalog(module: str, msgids: list[str], known: dict[str, str]) -> polib.POFile:
    """The module's catalog for these messages (update(), with no context: gettext() looks them up)."""
    path = helper_catalog_path(module)
    old = polib.pofile(str(path), wrapwidth=100) if path.exists() else polib.POFile(wrapwidth=100)
    if not old.metadata:
        old.metadata = {
            **new_catalog(ROOT / "README.md").metadata,
            "Project-Id-Version": f"pytorch-gpu-course {module}",
        }
    msgs = [Message(None, msgid, "", None) for msgid in msgids]  # type: ignore[arg-type]
    return update(old, msgs, module.replace(".", "/") + ".py", known)


def fields(text: str) -> list[str]:
    """The str.format fields of a message, e.g. ['{want!r}', '{ratio:.2f}']."""
    out = []
    for _, name, spec, conv in string.Formatter().parse(text):
        if name is not None:
            out.append(
                "{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            )
    return sorted(out)


def placeholder_problem(e: polib.POEntry) -> str:
    """What is wrong with a helper message's str.format placeholders in its translation, or ''."""
    try:
        if fields(e.msgstr) == fields(e.msgid):
            return ""
        why = ""
    except ValueError as exc:
        why = f" ({exc})"
    return f"the placeholders differ{why}: keep every {{...}} of the English as it is"


def compiled(catalogs: list[polib.POFile]) -> bytes:
    """The .mo file of all helper catalogs together, as polib writes it."""
    merged = polib.POFile()
    merged.metadata = {"Content-Type": "text/plain; charset=UTF-8", "Language": LANG}
    seen: dict[str, str] = {}
    for po in catalogs:
        for e in po:
            if e.msgstr and not e.fuzzy and e.msgid not in seen:
                seen[e.msgid] = e.msgstr
                merged.append(polib.POEntry(msgid=e.msgid, msgstr=e.msgstr))
    tmp = MO_PATH.with_suffix(f".mo.tmp{os.getpid()}")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    merged.save_as_mofile(str(tmp))
    data = tmp.read_bytes()
    tmp.unlink()
    return data


def run_helpers(check: bool, stats: bool, prefix: str = "helpers") -> list[str]:
    """Update or check the helpers' catalogs (the modules under `prefix`) and the compiled .mo; what is wrong."""
    bad: list[str] = []
    all_modules = helper_messages()
    messages_by_module = {
        m: ids for m, ids in all_modules.items() if m == prefix or m.startswith(prefix + ".")
    }
    existing = [polib.pofile(str(p)) for p in sorted(HELPER_CATALOGS.glob("*.po"))]
    known = memory(existing)
    catalogs = []
    for module, msgids in messages_by_module.items():
        po = update_helper_catalog(module, msgids, known)
        catalogs.append(po)
        path = helper_catalog_path(module)
        rel = str(path.relative_to(ROOT))
        if stats:
            done = sum(1 for e in po if e.msgstr and not e.fuzzy)
            print(f"{rel}: {done}/{len(po)} translated, {sum(1 for e in po if e.fuzzy)} fuzzy")
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != str(po):
                bad.append(f"{rel}: behind {module}: run `make translate`")
            bad += problems(po, rel)
        elif not stats:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(str(po), encoding="utf-8")
    stale = {p.stem for p in HELPER_CATALOGS.glob("*.po") if p.stem.startswith(prefix)} - set(
        all_modules
    )
    for module in sorted(stale):
        if check:
            bad.append(
                f"{helper_catalog_path(module).relative_to(ROOT)}: {module} has no tr() message left: run `make translate`"
            )
        elif not stats:
            helper_catalog_path(module).unlink()
    on_disk = [
        polib.pofile(str(helper_catalog_path(m)))
        for m in all_modules
        if m not in messages_by_module and helper_catalog_path(m).exists()
    ]
    mo = compiled(catalogs + on_disk)
    if check and (not MO_PATH.exists() or MO_PATH.read_bytes() != mo):
        bad.append(f"{MO_PATH.relative_to(ROOT)}: differs from the catalogs: run `make translate`")
    elif not check and not stats:
        tmp = MO_PATH.with_suffix(f".mo.{os.getpid()}")
        tmp.write_bytes(mo)
        tmp.replace(MO_PATH)  # atomic: a process reading the catalog never sees half a file
    return bad


def run(only: str | None, check: bool, stats: bool) -> int:
    """Update or check every catalog and Chinese notebook; print what is wrong."""
    notebooks = [
        p for p in sources() if only is None or (only in p.name and not only.startswith("helpers"))
    ]
    catalogs = {p: load_catalog(p) for p in sources()}
    known = memory(list(catalogs.values()))
    bad: list[str] = []
    for nb_path in notebooks:
        rel = str(nb_path.relative_to(ROOT))
        try:
            msgs = messages(nbfiles.read(nb_path))
        except ValueError as exc:
            bad.append(f"{rel}: {exc}")
            continue
        po = update(catalogs[nb_path], msgs, rel, known)
        text = str(po)
        po_path = catalog_path(nb_path)
        wrong = problems(po, str(po_path.relative_to(ROOT)))
        if stats:
            done = sum(1 for e in po if e.msgstr and not e.fuzzy)
            fuzzy = sum(1 for e in po if e.fuzzy)
            print(
                f"{po_path.relative_to(ROOT)}: {done}/{len(po)} translated, {fuzzy} fuzzy, {len(po) - done - fuzzy} untranslated"
            )
        if check:
            if not po_path.exists() or po_path.read_text(encoding="utf-8") != text:
                bad.append(f"{po_path.relative_to(ROOT)}: behind {rel}: run `make translate`")
            bad += wrong
        elif not stats:
            po_path.parent.mkdir(parents=True, exist_ok=True)
            po_path.write_text(text, encoding="utf-8")
        if wrong:
            continue  # a notebook is written only from a complete catalog
        out = output_path(nb_path)
        zh = build(nb_path, po)
        if check and (not out.exists() or out.read_text(encoding="utf-8") != zh):
            bad.append(
                f"{out.relative_to(ROOT)}: differs from what tools/translate.py writes: run `make translate`"
            )
        elif not check and not stats:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(zh, encoding="utf-8")
    if only is None or only.startswith("helpers"):
        bad += run_helpers(check, stats, only or "helpers")
    if check or (not stats and bad):
        for line in bad:
            print(line)
    if check:
        print(
            f"{len(notebooks)} notebook(s): "
            + (f"{len(bad)} problem(s)" if bad else "every message translated, zh/ up to date")
        )
        return 1 if bad else 0
    return 0


def main(argv: list[str] | None = None) -> int:
    """Command line: update (default), --check or --stats."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 on any untranslated or fuzzy message or drift"
    )
    parser.add_argument("--stats", action="store_true", help="counts per catalog")
    parser.add_argument(
        "--only",
        help="only the notebooks whose file name contains this ('helpers': the helpers' catalogs)",
    )
    args = parser.parse_args(argv)
    return run(args.only, args.check, args.stats)


if __name__ == "__main__":
    raise SystemExit(main())
