"""Point the course at a repository and branch: every Colab badge, setup cell and link.

    make set-repo REPO=https://github.com/ORG/NAME BRANCH=main
    make set-repo MIRROR=https://gitee.com/ORG/NAME       # a copy reachable where GitHub is not
    python tools/set_repo.py https://github.com/ORG/NAME --branch fall-2027
    python tools/set_repo.py --mirror ""                  # no mirror
    python tools/set_repo.py --check     # exit 1, with the list, if a reference disagrees
    python tools/set_repo.py --list      # every reference, where it is

The one source is `[tool.course]` in pyproject.toml (`repository`, `branch`, and an optional
`mirror`: the same repository on another git host, e.g. Gitee, for learners who cannot reach
GitHub). From it come:

- each notebook's Colab badge: `https://colab.research.google.com/github/ORG/NAME/blob/BRANCH/`
  followed by the notebook's own path (every *.ipynb of the repository: notebooks/, solutions/,
  exercises/, templates/ and any folder added later, a translation's zh/ tree included);
- each notebook's setup cell: `COURSE_REPO = "https://github.com/ORG/NAME"`, `COURSE_MIRROR`
  and `COURSE_BRANCH = "BRANCH"`: where the course is not installed (Colab, any hosted
  JupyterLab), the cell installs `git+COURSE_MIRROR@COURSE_BRANCH`, or `COURSE_REPO` without a
  mirror;
- the README's badges, `pip install "git+https://github.com/ORG/NAME@BRANCH"` lines (slurm/),
  GitHub links to the course's repository (`.../blob/BRANCH/...` ones get the branch too);
- pyproject.toml's `[project.urls] Repository`.

Rewriting touches nothing else: a notebook is rewritten only where a reference changes, in the
exact format the course stores notebooks in. It needs only the standard library.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Folders never scanned: git's, virtual environments, caches and generated output
#: (git-ignored), and reference/ (recorded GPU runs: what ran, not links to fix).
SKIP_DIRS = {
    ".git",
    "executed",
    "gpu-check",
    "artifacts",
    "build",
    "dist",
    "runs",
    "reference",
    "node_modules",
    "__pycache__",
}
#: Files whose text can hold a reference to the course's repository.
TEXT_SUFFIXES = {".md", ".toml", ".sbatch", ".sh", ".yml", ".yaml", ".cfg", ".txt", ".py"}
#: Files that hold example URLs on purpose: this tool and its tests.
NOT_SCANNED = {"tools/set_repo.py", "tests/test_set_repo.py"}
#: The placeholder the documentation writes for a fork (README, Makefile, pyproject.toml).
PLACEHOLDER = "ORG/NAME"

REPO_URL = re.compile(r"https://github\.com/([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)(?:\.git)?/?$")
BRANCH_NAME = re.compile(r"(?!/|.*(?:\.\.|//|@\{|\.lock$|/$|\.$))[A-Za-z0-9._/-]+")
#: A Colab link to a notebook on GitHub: colab.research.google.com/github/O/N/blob/REST
COLAB = re.compile(
    r"https://colab\.research\.google\.com/github/([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)/blob/"
    r"([^\s)\"'<>]+)"
)
SETUP_REPO = re.compile(r'^(COURSE_REPO = ")([^"]*)(")$', re.M)
SETUP_BRANCH = re.compile(r'^(COURSE_BRANCH = ")([^"]*)(")$', re.M)
SETUP_MIRROR = re.compile(r'^(COURSE_MIRROR = ")([^"]*)(")', re.M)  # a comment may follow
#: A mirror: an https URL of a git repository on any host ('' for none).
MIRROR_URL = re.compile(r"https://[A-Za-z0-9.-]+(:\d+)?(/[A-Za-z0-9_.~-]+)+/?")
PIP = re.compile(
    r"git\+https://github\.com/([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)(?:\.git)?"
    r"(?:@([A-Za-z0-9._/-]+))?(?=[\s\"'#)]|$)"
)
GITHUB = re.compile(
    r"(?<![+/])https://github\.com/([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+?)(?:\.git)?"
    r"(?:/(blob|tree|raw)/([^\s)\"'<>]+))?(?=[\s)\"'<>.,;:]|$)"
)
PROJECT_URL = re.compile(r'^(Repository = ")([^"]*)(")$', re.M)
TOOL_TABLE = re.compile(r"^\[tool\.course\]\s*$(.*?)(?=^\[|\Z)", re.M | re.S)


class RepoError(ValueError):
    """A repository URL or branch name this tool cannot use, with what to give instead."""


@dataclass
class Source:
    """The course's repository ('ORG/NAME' on GitHub), branch and mirror (a URL, or '')."""

    repo: str
    branch: str
    mirror: str = ""

    @property
    def url(self) -> str:
        return f"https://github.com/{self.repo}"


@dataclass
class Reference:
    """One place that names the repository: where, what kind, and what it says."""

    file: str
    line: int
    kind: str
    repo: str
    branch: str | None = None
    path: str | None = None  # a Colab link's notebook path

    def __str__(self) -> str:
        what = self.repo + (f"@{self.branch}" if self.branch is not None else "")
        return f"{self.file}:{self.line}: {self.kind}: {what}" + (
            f" -> {self.path}" if self.path else ""
        )


def parse_repo(url: str) -> str:
    """'https://github.com/ORG/NAME' (a trailing .git or / allowed) -> 'ORG/NAME'."""
    match = REPO_URL.fullmatch(url.strip())
    if not match:
        raise RepoError(
            f"{url!r} is not a GitHub repository URL. Give it as https://github.com/ORG/NAME: "
            "Colab opens notebooks from GitHub, and pip installs the course from that URL."
        )
    return match[1]


def check_mirror(url: str) -> str:
    """'' or an https URL of a git repository on any host (Gitee, GitCode, a GitLab), else a RepoError."""
    url = url.strip()
    if url and not MIRROR_URL.fullmatch(url):
        raise RepoError(
            f"{url!r} is not a mirror URL pip can install from: give it as "
            'https://HOST/ORG/NAME (e.g. https://gitee.com/ORG/NAME), or "" for no mirror.'
        )
    return url.rstrip("/")


def check_branch(branch: str) -> str:
    """A branch name git and a URL path both accept, else a RepoError."""
    if not BRANCH_NAME.fullmatch(branch or ""):
        raise RepoError(
            f"{branch!r} is not a usable branch name: use letters, digits, '.', '_', '-' and "
            "'/' (not at the start or end, no '..'), e.g. main or fall-2027."
        )
    return branch


def read_source(root: Path = ROOT) -> Source:
    """[tool.course] repository and branch from pyproject.toml."""
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    table = TOOL_TABLE.search(text)
    values = dict(re.findall(r'^(\w+)\s*=\s*"([^"]*)"', table[1], re.M)) if table else {}
    if "repository" not in values or "branch" not in values:
        raise RepoError(
            'pyproject.toml has no [tool.course] table with repository = "..." and '
            'branch = "..." (the one source of the course\'s repository and branch).'
        )
    return Source(
        parse_repo(values["repository"]),
        check_branch(values["branch"]),
        check_mirror(values.get("mirror", "")),
    )


def scanned_files(root: Path = ROOT) -> Iterator[Path]:
    """Every notebook and text file of the repository that may hold a reference."""
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if any(p in SKIP_DIRS or p.startswith(".") for p in rel.parts[:-1]):
            continue
        if rel.as_posix() in NOT_SCANNED or not path.is_file():
            continue
        if path.suffix == ".ipynb" or path.suffix in TEXT_SUFFIXES or path.name == "Makefile":
            yield path


def split_blob(rest: str, root: Path, own: str | None) -> tuple[str, str]:
    """'BRANCH/PATH' of a /blob/ link -> (branch, path); the path is the notebook's own, or
    the longest tail that exists in the repository (a branch name may hold '/')."""
    if own and rest.endswith("/" + own):
        return rest[: -len(own) - 1], own
    cuts = [i for i, c in enumerate(rest) if c == "/"]
    for i in cuts:
        if (root / rest[i + 1 :]).exists():
            return rest[:i], rest[i + 1 :]
    i = cuts[0] if cuts else len(rest)
    return rest[:i], rest[i + 1 :]


def cell_sources(path: Path) -> list[tuple[int, str]]:
    """(cell index, source) of every cell of a notebook."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [(i, "".join(c.get("source", ""))) for i, c in enumerate(nb.get("cells", []))]


def find_in_text(text: str, file: str, root: Path, own: str | None = None) -> list[Reference]:
    """Every reference in one text (a file, or a notebook cell's source)."""
    found = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in COLAB.finditer(line):
            branch, rel = split_blob(m[2], root, own)
            found.append(Reference(file, n, "Colab link", m[1], branch, rel))
        for m in SETUP_REPO.finditer(line):
            found.append(Reference(file, n, "setup cell COURSE_REPO", _repo_or_raw(m[2])))
        for m in SETUP_BRANCH.finditer(line):
            found.append(Reference(file, n, "setup cell COURSE_BRANCH", "", m[2]))
        for m in SETUP_MIRROR.finditer(line):
            found.append(Reference(file, n, "setup cell COURSE_MIRROR", m[2]))
        for m in PIP.finditer(line):
            found.append(Reference(file, n, "pip install URL", m[1], m[2] or ""))
        for m in PROJECT_URL.finditer(line) if file.endswith("pyproject.toml") else ():
            found.append(Reference(file, n, "[project.urls] Repository", _repo_or_raw(m[2])))
        for m in GITHUB.finditer(line) if not found or found[-1].line != n else ():
            branch = None
            if m[2]:
                branch, rel = split_blob(m[3], root, None)
            found.append(Reference(file, n, "GitHub link", m[1], branch))
    return found


def _repo_or_raw(url: str) -> str:
    try:
        return parse_repo(url)
    except RepoError:
        return url


def references(root: Path = ROOT) -> list[Reference]:
    """Every reference to a repository in the course, GitHub links to other projects included."""
    found = []
    for path in scanned_files(root):
        rel = path.relative_to(root).as_posix()
        if path.suffix == ".ipynb":
            for i, source in cell_sources(path):
                found += find_in_text(source, f"{rel} cell {i}", root, own=rel)
        else:
            found += find_in_text(path.read_text(encoding="utf-8", errors="replace"), rel, root)
    return [r for r in found if r.repo != PLACEHOLDER]


def problems(root: Path = ROOT) -> list[str]:
    """Every reference that disagrees with [tool.course], every Colab link to a file that does
    not exist, and every notebook without a badge to itself in its first cell or without
    COURSE_REPO and COURSE_BRANCH in its setup cell."""
    source = read_source(root)
    refs = references(root)
    # a plain GitHub link is the course's if it names a repository that the course's own
    # references name (after a hand edit, the old one too); links to other projects are not
    course = {source.repo} | {r.repo for r in refs if r.kind != "GitHub link"}
    wrong = []
    for r in refs:
        where = f"{r.file}:{r.line}"
        if r.kind == "setup cell COURSE_BRANCH":
            if r.branch != source.branch:
                wrong.append(f"{where}: COURSE_BRANCH is {r.branch!r}, not {source.branch!r}")
        elif r.kind == "setup cell COURSE_MIRROR":
            if r.repo != source.mirror:
                wrong.append(f"{where}: COURSE_MIRROR is {r.repo!r}, not {source.mirror!r}")
        elif r.repo not in course:
            continue  # a link to another project (pytorch, nbval, ...)
        elif r.repo != source.repo:
            wrong.append(f"{where}: the {r.kind} names {r.repo}, not {source.repo}")
        elif r.branch is not None and r.branch != source.branch:
            wrong.append(f"{where}: the {r.kind} names branch {r.branch!r}, not {source.branch!r}")
        if r.kind == "Colab link" and r.path is not None and not (root / r.path).is_file():
            wrong.append(f"{where}: the Colab link opens {r.path}, which does not exist")
    for path in (p for p in scanned_files(root) if p.suffix == ".ipynb"):
        rel = path.relative_to(root).as_posix()
        mine = [r for r in refs if r.file.startswith(f"{rel} cell ")]
        if not any(
            r.kind == "Colab link" and r.path == rel and r.file == f"{rel} cell 0" for r in mine
        ):
            wrong.append(f"{rel}: its first cell has no Colab badge that opens the notebook itself")
        for kind in (
            "setup cell COURSE_REPO",
            "setup cell COURSE_MIRROR",
            "setup cell COURSE_BRANCH",
        ):
            if not any(r.kind == kind for r in mine):
                wrong.append(f'{rel}: the setup cell has no {kind.split()[-1]} = "..." line')
    return wrong


def rewrite_text(text: str, source: Source, root: Path, own: str | None, course: set[str]) -> str:
    """The text with every reference to a course repository pointed at `source`."""

    def colab(m: re.Match) -> str:
        if m[1] not in course:
            return m[0]
        _, rel = split_blob(m[2], root, own)
        return f"https://colab.research.google.com/github/{source.repo}/blob/{source.branch}/{rel}"

    def github(m: re.Match) -> str:
        if m[1] not in course:
            return m[0]
        if not m[2]:
            return source.url
        _, rel = split_blob(m[3], root, None)
        return f"{source.url}/{m[2]}/{source.branch}/{rel}"

    def pip(m: re.Match) -> str:
        return f"git+{source.url}@{source.branch}" if m[1] in course else m[0]

    text = COLAB.sub(colab, text)
    text = PIP.sub(pip, text)
    text = GITHUB.sub(github, text)
    text = SETUP_REPO.sub(lambda m: f"{m[1]}{source.url}{m[3]}", text)
    text = SETUP_MIRROR.sub(lambda m: f"{m[1]}{source.mirror}{m[3]}", text)
    return SETUP_BRANCH.sub(lambda m: f"{m[1]}{source.branch}{m[3]}", text)


def notebook_text(nb: dict) -> str:
    """A notebook in the course's stored format (what nbformat.writes gives, plus a newline)."""
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def set_source(root: Path, source: Source) -> bool:
    """Write [tool.course] (and [project.urls] Repository) in pyproject.toml; True if changed."""
    path = root / "pyproject.toml"
    text = path.read_text(encoding="utf-8")
    table = TOOL_TABLE.search(text)
    if table is None:
        raise RepoError("pyproject.toml has no [tool.course] table to write to.")
    body = re.sub(
        r'^(repository\s*=\s*")[^"]*(")', rf"\g<1>{source.url}\g<2>", table[1], flags=re.M
    )
    body = re.sub(r'^(branch\s*=\s*")[^"]*(")', rf"\g<1>{source.branch}\g<2>", body, flags=re.M)
    if re.search(r"^mirror\s*=", body, re.M):
        body = re.sub(r'^(mirror\s*=\s*")[^"]*(")', rf"\g<1>{source.mirror}\g<2>", body, flags=re.M)
    else:
        body = re.sub(r"^(branch\s*=.*\n)", rf'\g<1>mirror = "{source.mirror}"\n', body, flags=re.M)
    after = text[: table.start(1)] + body + text[table.end(1) :]
    after = PROJECT_URL.sub(lambda m: f"{m[1]}{source.url}{m[3]}", after)
    if after == text:
        return False
    path.write_text(after, encoding="utf-8")
    return True


def rewrite(root: Path, source: Source) -> list[str]:
    """Point every reference at `source`; the files changed."""
    old = read_source(root)
    course = {old.repo, source.repo} | {r.repo for r in references(root) if r.kind != "GitHub link"}
    changed = ["pyproject.toml"] if set_source(root, source) else []
    for path in scanned_files(root):
        rel = path.relative_to(root).as_posix()
        if rel == "pyproject.toml":
            continue
        if path.suffix == ".ipynb":
            nb = json.loads(path.read_text(encoding="utf-8"))
            touched = False
            for cell in nb.get("cells", []):
                before = "".join(cell.get("source", ""))
                after = rewrite_text(before, source, root, rel, course)
                if after != before:
                    lines = after.splitlines(keepends=True)
                    cell["source"] = lines if isinstance(cell.get("source"), list) else after
                    touched = True
            if touched:
                path.write_text(notebook_text(nb), encoding="utf-8")
                changed.append(rel)
        else:
            text = path.read_text(encoding="utf-8")
            after = rewrite_text(text, source, root, None, course)
            if after != text:
                path.write_text(after, encoding="utf-8")
                changed.append(rel)
    return changed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("repo", nargs="?", help="https://github.com/ORG/NAME of the fork")
    p.add_argument("--branch", help="the branch Colab and pip use (default: keep the current)")
    p.add_argument(
        "--mirror",
        help="a copy of the repository on another git host (Gitee...), which the setup cell "
        'installs from where GitHub is out of reach; "" for none (default: keep the current)',
    )
    p.add_argument("--check", action="store_true", help="only check that every reference agrees")
    p.add_argument("--list", action="store_true", help="print every reference")
    p.add_argument("--root", default=str(ROOT), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    root = Path(args.root).resolve()
    try:
        if args.list:
            for r in references(root):
                print(r)
            return 0
        if args.repo or args.branch or args.mirror is not None:
            current = read_source(root)
            repo = parse_repo(args.repo) if args.repo else current.repo
            source = Source(
                repo,
                check_branch(args.branch) if args.branch else current.branch,
                check_mirror(args.mirror) if args.mirror is not None else current.mirror,
            )
            changed = rewrite(root, source)
            mirror = f" (where it is out of reach: {source.mirror})" if source.mirror else ""
            print(f"the course now installs from {source.url}@{source.branch}{mirror}; changed:")
            print("\n".join(f"  {c}" for c in changed) or "  nothing: it did already")
        elif not args.check:
            p.error("give the fork's URL (and --branch, --mirror), or --check, or --list")
        wrong = problems(root)
    except RepoError as exc:
        print(f"set_repo: {exc}", file=sys.stderr)
        return 2
    source = read_source(root)
    if wrong:
        print(
            f"{len(wrong)} reference(s) disagree with pyproject.toml's [tool.course] "
            f"({source.url}, branch {source.branch}):"
        )
        print("\n".join(f"  {w}" for w in wrong))
        if any("the setup cell has no" in w for w in wrong):
            print(
                "fix: copy the setup cell of templates/chapter_template.ipynb into those "
                "notebooks, then:"
            )
        print("fix: python tools/set_repo.py " + source.url + f" --branch {source.branch}")
        return 1
    print(f"every badge, setup cell and link points at {source.url}, branch {source.branch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
