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
The context of a message is its cell's id. Each string literal a learner reads (literals():
printed prose, plot and widget texts; not docstrings nor keys) is a message too, with context
"string" (one translation per literal per notebook) and the literal's source as its msgid; its
translation replaces the literal. Code is otherwise never translated: a Chinese notebook has the
English notebook's cells, ids and syntax tree, with only the comments, the shown strings and
the markdown replaced, and its Colab badge pointing at the Chinese copy.

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
import textwrap
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
#: Emphasis, code and quotation marks around the character at a line's end or start.
_MARKS = r"[*_`\"\u201c\u201d\u2018\u2019\u300c\u300d]*"
#: A {...} group without nested braces: what a translation keeps where str.format cannot parse.
BRACED = re.compile(r"\{[^{}]*\}")
CJK_END = re.compile(r"[\u2014\u2026\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]" + _MARKS + "$")
CJK_START = re.compile(r"\s*" + _MARKS + r"[\u2014\u2026\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
#: Full-width punctuation at a line's end: a break after it shows as a space before anything.
PUNCT_END = re.compile(r"[\u3001\u3002\uff01\uff09\uff0c\uff1a\uff1b\uff1f]" + _MARKS + "$")
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


#: The context of every string-literal message: one translation per literal per notebook, so a
#: literal that is a dictionary key where it is made and where it is shown reads the same in both.
STRING_CTX = "string"
#: A string literal a learner reads: two English words in a row (its {placeholders} left out),
#: or, with a space in it, two words of three letters or more (not parts of identifiers: a.b, f()).
SHOWN_WORDS = re.compile(r"[A-Za-z]{2,}[ ]+[A-Za-z]{2,}")
WORD = re.compile(r"(?<![\w.])[A-Za-z]{3,}(?![\w.(])")
#: Calls and keyword arguments whose string is shown even when it is one word (plot texts,
#: widget labels, progress bars).
SHOWN_CALLS = frozenset(
    {"set_title", "set_xlabel", "set_ylabel", "suptitle", "title", "xlabel", "ylabel", "print"}
)
SHOWN_KEYWORDS = frozenset(
    {"title", "xlabel", "ylabel", "label", "description", "desc", "caption", "tooltip"}
)
#: Calls whose string arguments are keys or patterns matched against other text.
LOOKUP_CALLS = frozenset(
    {"get", "pop", "setdefault", "getattr", "hasattr", "environ", "startswith", "endswith"}
    | {"find", "index", "rindex", "count", "split", "replace", "removeprefix", "removesuffix"}
    | {"match", "fullmatch", "search", "findall", "sub", "compile", "raises", "warns"}
)
MAGIC = re.compile(r"^(\s*)[%!]")
PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa%]")


@dataclass(frozen=True)
class Literal:
    """A string-literal message in a code cell: where it is and its source text."""

    start: int  # offset of its first character in the cell's source
    end: int  # offset just past its last
    text: str  # the literal as written, quotes and prefix included (f"...", "...")


def _python(source: str) -> str:
    """The cell with IPython magics and shell lines replaced by `pass`, so `ast` parses it."""
    return "\n".join(
        MAGIC.sub(r"\1pass  #", line, count=1) if MAGIC.match(line) else line
        for line in source.split("\n")
    )


def _is_string(node: ast.AST) -> bool:
    """A str literal or an f-string (not bytes)."""
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


def _words(node: ast.AST) -> str:
    """A string literal's text with each {placeholder} as a space."""
    if isinstance(node, ast.JoinedStr):
        return "".join(
            v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else " "
            for v in node.values
        )
    return node.value  # type: ignore[attr-defined,no-any-return]


def _outer_strings(tree: ast.AST) -> list[ast.AST]:
    """The string literals of a tree that are not inside another string literal."""
    out: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_string(node):
            out.append(node)
        else:
            stack.extend(reversed(list(ast.iter_child_nodes(node))))
    return out


def _roles(tree: ast.AST) -> tuple[set[int], set[int], list[ast.AST]]:
    """(docstrings, literals shown even as one word, lookups: subscripts, comparisons, .get keys)."""
    docs: set[int] = set()
    shown: set[int] = set()
    lookups: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and _is_string(body[0].value):
                docs.add(id(body[0].value))
        elif isinstance(node, ast.Subscript):
            lookups.append(node.slice)
        elif isinstance(node, ast.Compare):
            lookups += [node.left, *node.comparators]
        elif isinstance(node, ast.Call):
            name = (
                node.func.attr
                if isinstance(node.func, ast.Attribute)
                else getattr(node.func, "id", "")
            )
            if name in LOOKUP_CALLS:
                lookups += node.args[:2]
            if name in SHOWN_CALLS:
                shown.update(id(a) for a in node.args)
            shown.update(id(k.value) for k in node.keywords if k.arg in SHOWN_KEYWORDS)
        elif isinstance(node, ast.IfExp) and _is_string(node.body) and _is_string(node.orelse):
            shown.update((id(node.body), id(node.orelse)))  # "above" if gap > 0 else "below"
    return docs, shown, lookups


def _tree(source: str) -> tuple[str, ast.AST]:
    """The cell's code as `ast` reads it, and its syntax tree."""
    code = _python(source)
    try:
        return code, ast.parse(code)
    except SyntaxError as exc:
        raise ValueError(f"cannot read the strings of this cell ({exc}):\n{source}") from None


def looked_up(sources: list[str]) -> frozenset[str]:
    """The strings these cells use as keys (subscripts, comparisons, .get): a notebook's literals
    with one of these values stay English, or a key made in one cell would miss in another."""
    out = set()
    for source in sources:
        lookups = _roles(_tree(source)[1])[2]
        out.update(_words(s) for n in lookups for s in _outer_strings(n))
    return frozenset(out)


def literals(source: str, keys: frozenset[str] = frozenset()) -> list[Literal]:
    """The string literals of a code cell a learner reads, in order: not docstrings, not `keys`
    (looked_up() of the notebook's cells)."""
    code, tree = _tree(source)
    docs, shown, lookups = _roles(tree)
    keys = keys | {_words(s) for n in lookups for s in _outer_strings(n)}
    starts = [0]
    for line in code.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    lines = code.split("\n")

    def offset(row: int, col: int) -> int:  # ast's columns count UTF-8 bytes
        return starts[row - 1] + len(lines[row - 1].encode("utf-8")[:col].decode("utf-8"))

    out = []
    for node in _outer_strings(tree):
        text = ast.get_source_segment(code, node) or ""
        words = _words(node)
        wanted = reads_as_words(words) or (id(node) in shown and re.search(r"[A-Za-z]{3,}", words))
        if id(node) in docs or not wanted or words in keys or is_identifier(words):
            continue
        start = offset(node.lineno, node.col_offset)
        end = offset(node.end_lineno, node.end_col_offset)  # type: ignore[arg-type]
        out.append(Literal(start, end, text))
    return sorted(out, key=lambda lit: lit.start)


#: Names torch and the course pass on as values (a compile backend, a process-group backend,
#: a device type, an attention implementation): a translated one would break the code.
TORCH_NAMES = frozenset(
    {"inductor", "eager", "aot_eager", "cudagraphs", "nccl", "gloo", "mpi", "ucc", "xccl"}
    | {"cuda", "cpu", "mps", "xpu", "meta", "sdpa", "manual", "math", "flash", "efficient", "cudnn"}
)


def is_identifier(text: str) -> bool:
    """A literal that names something for the code, not the learner: snake_case or one of
    TORCH_NAMES (never translated, even as a branch of `a if c else b`)."""
    return bool(re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)+", text)) or text in TORCH_NAMES


def reads_as_words(text: str) -> bool:
    """Text a learner reads: two English words in a row, or, with a space, two words of three
    letters or more (not parts of identifiers); {placeholders} left out."""
    return bool(SHOWN_WORDS.search(text)) or (" " in text.strip() and len(WORD.findall(text)) >= 2)


#: The catalog of the notebooks' keys that helpers show (column names, row labels).
KEYS_MODULE = "helpers.notebook_keys"


def notebook_keys() -> list[str]:
    """The English notebooks' keys that read as words or are one lower-case word (a column
    named "threads"): their code keeps them, and a helper translates them where it shows them
    (format_table puts every column name through tr())."""
    found: list[str] = []
    for path in sources():
        cells = [c.source for c in nbfiles.read(path).cells if c.cell_type == "code"]
        for key in sorted(looked_up(cells)):
            wordy = reads_as_words(key) or re.fullmatch(r"[a-z]{4,}", key)
            if wordy and "\\" not in key and key not in found:
                found.append(key)
    return found


def translate_strings(
    source: str, table: dict[tuple[str, str], str], keys: frozenset[str] = frozenset()
) -> str:
    """The cell's code with each shown string literal replaced by its translation."""
    for lit in reversed(literals(source, keys)):
        source = source[: lit.start] + table[(STRING_CTX, lit.text)] + source[lit.end :]
    return source


class _ShownWords(ast.NodeTransformer):
    """Blanks the strings inside an f-string's {expression} that are words shown, not keys: the
    branches of `a if c else b`, the fallback of `x or "none"`, the separator of `", ".join()`."""

    def _blank(self, node: ast.AST) -> ast.AST:
        return ast.Constant("") if _is_string(node) else self.visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> ast.AST:
        node.test = self.visit(node.test)
        node.body, node.orelse = self._blank(node.body), self._blank(node.orelse)
        return node

    def visit_BoolOp(self, node: ast.BoolOp) -> ast.AST:
        node.values = [self._blank(v) for v in node.values]
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "join" and _is_string(func.value):
            func.value = ast.Constant("")
        return node


def _expressions(node: ast.AST) -> list[str]:
    """The {expressions} of an f-string (with conversion and format spec), as ast dumps; the
    words they show (_ShownWords) may be translated, everything else must stay."""
    return sorted(
        ast.dump(_ShownWords().visit(v))
        for v in getattr(node, "values", [])
        if isinstance(v, ast.FormattedValue)
    )


def script_of(text: str) -> str | None:
    """The syntax tree of a string that is a Python script (two statements or more, on lines
    of their own), or None: a script's translation may change its comments only."""
    if "\n" not in text.strip():
        return None
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return None
    return ast.dump(tree) if len(tree.body) >= 2 else None


def string_problem(english: str, chinese: str) -> str:
    """What is wrong with a string literal's translation (not the same kind of literal, a lost
    {placeholder} or %-specifier), or ''."""
    try:  # in parentheses: a literal continued on indented lines is one expression
        en = ast.parse(f"(\n{english.strip()}\n)", mode="eval").body
        zh = ast.parse(f"(\n{chinese.strip()}\n)", mode="eval").body
    except SyntaxError as exc:
        return f"the translation is not a Python string literal ({exc.msg}): keep the quotes and prefix"
    if not _is_string(zh) or isinstance(en, ast.JoinedStr) != isinstance(zh, ast.JoinedStr):
        return "the translation must be the same kind of literal (an f-string stays an f-string)"
    if _expressions(en) != _expressions(zh):
        return "the {expressions} differ: keep every {...} of the English as it is"
    if isinstance(en, ast.Constant):
        try:
            en_fields = fields(en.value)  # type: ignore[attr-defined]
        except ValueError:  # braces that are not str.format fields: every {...} stays as written
            same = sorted(BRACED.findall(en.value)) == sorted(BRACED.findall(zh.value))  # type: ignore[attr-defined]
        else:
            try:
                same = en_fields == fields(zh.value)  # type: ignore[attr-defined]
            except ValueError:  # the English formats, the translation would raise
                return "a brace the English does not have: str.format would raise (write {{ or }})"
        if not same:
            return "the str.format fields differ: keep every {...} of the English as it is"
        if script_of(en.value) is not None and script_of(en.value) != script_of(zh.value):  # type: ignore[attr-defined]
            return "this string is a Python script: translate its comments only, keep its code"
        if sorted(PERCENT_SPEC.findall(en.value)) != sorted(PERCENT_SPEC.findall(zh.value)):  # type: ignore[attr-defined]
            return "the %-specifiers differ: keep every %s, %d ... of the English"
    return ""


def code_shape(source: str) -> tuple[str, list[str], list[str]]:
    """(the cell's syntax tree with every string literal blanked, its literals, its magic lines):
    two cells with the same shape differ only in their strings and comments."""
    code = _python(source)
    tree = ast.parse(code)
    texts = []
    for node in _outer_strings(tree):
        texts.append(ast.get_source_segment(code, node) or "")
        if isinstance(node, ast.JoinedStr):
            node.values = []
        else:
            node.value = ""  # type: ignore[attr-defined]
    magics = [line.strip() for line in source.split("\n") if MAGIC.match(line)]
    return ast.dump(tree), texts, magics


def _text(cell: dict) -> str:
    """A cell's source as one string."""
    return cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])


def messages(nb: dict) -> list[Message]:
    """Every message of a notebook, in cell order."""
    out = []
    keys = looked_up([_text(c) for c in nb["cells"] if c["cell_type"] == "code"])
    for i, cell in enumerate(nb["cells"]):
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        if cell["cell_type"] == "markdown" and source.strip():
            out.append(Message(cell["id"], canonical(source), "markdown", i))
        elif cell["cell_type"] == "code":
            for c in comments(source):
                out.append(
                    Message(cell["id"], c.text, "trailing comment" if c.trailing else "comment", i)
                )
            for lit in literals(source, keys):
                out.append(Message(STRING_CTX, lit.text, "string literal", i))
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
            # the English a fuzzy translation was made for; once checked, it goes
            entry.previous_msgid = same.previous_msgid if "fuzzy" in same.flags else None
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
    keys = looked_up([c.source for c in nb.cells if c.cell_type == "code"])
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.strip():
            cell.source = _fix_links(actual(table[(cell.id, canonical(cell.source))]), notebook)
        elif cell.cell_type == "code":
            setup = cell.source.startswith(SETUP_MARK)
            cell.source = translate_strings(cell.source, table, keys)
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
        elif e.previous_msgid:
            out.append(f"{where}: a stale `#| msgid` line without the fuzzy flag: remove it")
        elif e.msgctxt is None and placeholder_problem(e):  # a helper's tr("... {x}") message
            out.append(f"{where}: {placeholder_problem(e)}")
        elif "\r" in e.msgstr:
            out.append(f"{where}: a carriage return (\\r) in the translation: remove it")
        elif e.msgctxt is None and EMPHASIS.search(e.msgstr):
            out.append(
                f"{where}: {EMPHASIS.search(e.msgstr).group(0)!r} prints its asterisks as they are "
                "(a runtime message is plain text): drop them or use quotation marks"
            )
        elif e.msgctxt is None and added_marker(e.msgid, e.msgstr):
            out.append(f"{where}: {added_marker(e.msgid, e.msgstr)}")
        elif e.comment == "string literal" and string_problem(e.msgid, e.msgstr):
            out.append(f"{where}: {string_problem(e.msgid, e.msgstr)}")
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


#: Markdown markers a runtime message prints as they are: code, underscores, asterisks.
RUNTIME_MARKERS = (
    re.compile(r"`[^`]+`"),
    re.compile(r"(?<![A-Za-z0-9_*])_[^_\s][^_]*_(?![A-Za-z0-9_])"),  # not snake_case
    re.compile(r"(?<![A-Za-z0-9_*])\*{1,2}[^*\s][^*]*\*{1,2}(?![A-Za-z0-9_*])"),
)


def added_marker(english: str, chinese: str) -> str:
    """A markdown marker a helper's translated message has more of than its English, or ''
    (a runtime message is plain text: the learner would read the marks)."""
    for pattern in RUNTIME_MARKERS:
        extra = len(pattern.findall(chinese)) - len(pattern.findall(english))
        if extra > 0:
            return (
                f"{pattern.findall(chinese)[0]!r}: a marker the English does not have prints as it "
                "is (a runtime message is plain text): drop it or use quotation marks"
            )
    return ""


def hard_breaks(markdown: str) -> list[str]:
    """Line breaks inside a Chinese paragraph, after or before a Chinese character (each renders
    as a space: between two characters a stray one, next to a Latin word one the line did not
    choose)."""
    found, fence, lines = [], False, markdown.split("\n")
    for a, b in zip(lines, lines[1:]):
        fence ^= a.lstrip().startswith("```")
        if fence or STRUCTURAL.match(b) or NOT_TEXT.match(a) or a.endswith("  "):
            continue
        if CJK_END.search(a) or CJK_START.match(b) or PUNCT_END.search(a):  # either side Chinese
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
    where = (
        "notebooks/*.ipynb (keys)" if module == KEYS_MODULE else module.replace(".", "/") + ".py"
    )
    return update(old, msgs, where, known)


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
    all_modules = {**helper_messages(), KEYS_MODULE: notebook_keys()}
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
