"""Teach it from your own fork (issue 24 item 9): one source, one command, every reference.

pyproject.toml's [tool.course] names the repository and branch; tools/set_repo.py points every
Colab badge, setup cell and link at them, and checks that they all agree.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import set_repo

ROOT = Path(__file__).resolve().parent.parent
FORK = "https://github.com/acme-university/gpu-class"
UPSTREAM = set_repo.read_source(ROOT)


def every_notebook(root: Path) -> list[Path]:
    """Every notebook of a tree, wherever it lies (a future zh/ tree, notebooks/08_*)."""
    return [p for p in set_repo.scanned_files(root) if p.suffix == ".ipynb"]


def test_every_reference_in_the_repository_agrees_with_the_source() -> None:
    wrong = set_repo.problems(ROOT)
    assert not wrong, "\n".join(wrong) + "\nfix: make set-repo REPO=... BRANCH=..."


def test_every_notebook_is_checked_wherever_it_lies() -> None:
    found = {p.relative_to(ROOT).as_posix() for p in every_notebook(ROOT)}
    on_disk = {
        p.relative_to(ROOT).as_posix()
        for p in ROOT.rglob("*.ipynb")
        if not any(
            part.startswith(".") or part in set_repo.SKIP_DIRS for part in p.relative_to(ROOT).parts
        )
    }
    assert found == on_disk and found >= {"templates/chapter_template.ipynb"}
    linked = {
        r.file.split(" cell ")[0] for r in set_repo.references(ROOT) if r.kind == "Colab link"
    }
    assert found <= linked, f"notebooks with no badge: {sorted(found - linked)}"


def course_copy(tmp_path: Path) -> Path:
    """A copy of the course's sources, plus a new chapter 8 and a zh/ translation of chapter 1."""
    root = tmp_path / "course"
    for name in ("notebooks", "solutions", "exercises", "templates", "slurm", "tools"):
        shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("README.md", "CONTRIBUTING.md", "pyproject.toml", "Makefile"):
        shutil.copy(ROOT / name, root / name)
    for new, rel in (
        ("notebooks/08_new.ipynb", "notebooks/08_new.ipynb"),
        ("zh/notebooks/01_devices.ipynb", "zh/notebooks/01_devices.ipynb"),
    ):
        text = (ROOT / "notebooks" / "01_devices.ipynb").read_text(encoding="utf-8")
        (root / new).parent.mkdir(parents=True, exist_ok=True)
        (root / new).write_text(text.replace("notebooks/01_devices.ipynb", rel), encoding="utf-8")
    return root


def test_set_repo_points_every_badge_setup_cell_and_link_at_the_fork(tmp_path: Path) -> None:
    root = course_copy(tmp_path)
    originals = {p: p.read_text(encoding="utf-8") for p in root.rglob("*") if p.is_file()}
    assert set_repo.problems(root) == []
    assert set_repo.main([FORK + ".git", "--branch", "fall-2027", "--root", str(root)]) == 0
    assert set_repo.problems(root) == []
    assert set_repo.read_source(root) == set_repo.Source("acme-university/gpu-class", "fall-2027")
    everything = "\n".join(
        p.read_text(encoding="utf-8") for p in root.rglob("*") if p.is_file() and p.suffix != ".pyc"
    )
    assert UPSTREAM.repo not in everything.replace("tools/set_repo.py", ""), (
        "an upstream link is left"
    )
    for nb in every_notebook(root):
        rel = nb.relative_to(root).as_posix()
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        badge = f"https://colab.research.google.com/github/acme-university/gpu-class/blob/fall-2027/{rel}"
        assert badge in "".join(cells[0]["source"]), rel
        setup = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
        assert f'COURSE_REPO = "{FORK}"\n' in setup and 'COURSE_BRANCH = "fall-2027"\n' in setup
        assert installs_from(setup, colab=True) == f"git+{FORK}@fall-2027", rel
    assert f'pip install "git+{FORK}@fall-2027"' in (root / "slurm" / "README.md").read_text()
    assert f'Repository = "{FORK}"' in (root / "pyproject.toml").read_text()
    readme = (root / "README.md").read_text()
    assert readme.count("/blob/fall-2027/") == (ROOT / "README.md").read_text().count("/blob/main/")
    # only references changed: back to upstream, every file is byte for byte what it was
    assert set_repo.main([UPSTREAM.url, "--branch", UPSTREAM.branch, "--root", str(root)]) == 0
    now = {p: p.read_text(encoding="utf-8") for p in root.rglob("*") if p.is_file()}
    assert [p for p in originals if now[p] != originals[p]] == []


def test_check_names_each_stale_reference(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = course_copy(tmp_path)
    set_repo.main([FORK, "--branch", "fall-2027", "--root", str(root)])
    capsys.readouterr()
    # a notebook added later, copied from upstream with upstream's badge and setup cell
    upstream_nb = (ROOT / "notebooks" / "01_devices.ipynb").read_text(encoding="utf-8")
    (root / "notebooks" / "09_later.ipynb").write_text(
        upstream_nb.replace("notebooks/01_devices.ipynb", "notebooks/09_later.ipynb"),
        encoding="utf-8",
    )
    slurm = root / "slurm" / "README.md"
    slurm.write_text(slurm.read_text().replace("@fall-2027", "@main"))
    assert set_repo.main(["--check", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"notebooks/09_later.ipynb cell 0:3: the Colab link names {UPSTREAM.repo}" in out
    assert "notebooks/09_later.ipynb cell 3:7: the setup cell COURSE_REPO names" in out
    assert "notebooks/09_later.ipynb cell 3:9: COURSE_BRANCH is 'main', not 'fall-2027'" in out
    assert "slurm/README.md:9: the pip install URL names branch 'main', not 'fall-2027'" in out
    assert "fix: python tools/set_repo.py " + FORK in out


def test_a_badge_to_a_missing_notebook_is_found(tmp_path: Path) -> None:
    root = course_copy(tmp_path)
    readme = root / "README.md"
    readme.write_text(
        readme.read_text().replace(
            "/blob/main/notebooks/07_capstone.ipynb)", "/blob/main/notebooks/07_capstone_old.ipynb)"
        )
    )
    assert any("07_capstone_old.ipynb, which does not exist" in w for w in set_repo.problems(root))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["git@github.com:acme/gpu-class.git"], "not a GitHub repository URL"),
        (["https://gitlab.com/acme/gpu-class"], "Colab opens notebooks from GitHub"),
        ([FORK, "--branch", "two words"], "not a usable branch name"),
        ([FORK, "--branch", "../main"], "not a usable branch name"),
        (["--mirror", "gitee.com/acme/gpu-class"], "not a mirror URL pip can install from"),
        (["--mirror", "https://gitee.com/acme/gpu class"], "not a mirror URL"),
    ],
)
def test_bad_input_says_what_to_give(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    root = course_copy(tmp_path)
    assert set_repo.main([*args, "--root", str(root)]) == 2
    assert message in capsys.readouterr().err
    assert set_repo.problems(root) == [] and set_repo.read_source(root) == UPSTREAM, (
        "nothing changed"
    )


def test_make_set_repo_runs_the_tool(tmp_path: Path) -> None:
    root = course_copy(tmp_path)
    done = subprocess.run(
        ["make", "-s", "set-repo", f"REPO={FORK}", "BRANCH=fall-2027", f"PYTHON={sys.executable}"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert set_repo.read_source(root).branch == "fall-2027" and set_repo.problems(root) == []
    usage = subprocess.run(
        ["make", "-s", "set-repo"], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert (
        usage.returncode != 0 and "REPO=https://github.com/ORG/NAME" in usage.stdout + usage.stderr
    )


MIRROR = "https://gitee.com/acme-university/gpu-class"


def test_a_mirror_reaches_every_setup_cell_and_comes_out_again(tmp_path: Path) -> None:
    """Issue 32: a copy of the repository on a host reachable from China, one command away."""
    root = course_copy(tmp_path)
    originals = {p: p.read_text(encoding="utf-8") for p in root.rglob("*") if p.is_file()}
    assert set_repo.main(["--mirror", MIRROR + "/", "--root", str(root)]) == 0
    assert set_repo.read_source(root) == set_repo.Source(UPSTREAM.repo, UPSTREAM.branch, MIRROR)
    assert set_repo.problems(root) == []
    for nb in every_notebook(root):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        setup = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
        assert f'COURSE_MIRROR = "{MIRROR}"' in setup, nb
        assert installs_from(setup, colab=True) == f"git+{MIRROR}@{UPSTREAM.branch}", nb
    assert f'mirror = "{MIRROR}"' in (root / "pyproject.toml").read_text()
    # a hand edit of one setup cell is found
    nb = root / "notebooks" / "01_devices.ipynb"
    nb.write_text(nb.read_text().replace(MIRROR, MIRROR + "-old"))
    assert any("COURSE_MIRROR is" in w for w in set_repo.problems(root))
    assert set_repo.main(["--mirror", "", "--root", str(root)]) == 0
    now = {p: p.read_text(encoding="utf-8") for p in root.rglob("*") if p.is_file()}
    assert [p for p in originals if now[p] != originals[p]] == []


def installs_from(setup: str, *, colab: bool, installed: bool = False) -> str | None:
    """What the setup cell would `%pip install` (None: nothing), its magics run as Python, in
    Colab or not, with the course package installed or not."""
    code = "\n".join(
        "    pip.append(f" + line.split("%pip install -q ", 1)[1] + ")"
        if line.strip().startswith("%pip install")
        else ("" if line.lstrip().startswith("%") else line)
        for line in setup.splitlines()
    ).split("\nfrom helpers")[0]  # what follows the install needs the course
    import importlib.util

    pip: list[str] = []
    real = importlib.util.find_spec
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            importlib.util,
            "find_spec",
            lambda name, *a: (
                (object() if installed else None) if name == "helpers" else real(name, *a)
            ),
        )
        if colab:
            mp.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
        else:
            mp.delitem(sys.modules, "google.colab", raising=False)
        exec(code, {"pip": pip})
    return pip[0] if pip else None


def test_the_setup_cell_installs_only_where_the_course_is_missing() -> None:
    cells = json.loads((ROOT / "notebooks" / "01_devices.ipynb").read_text())["cells"]
    setup = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
    upstream = f"git+{UPSTREAM.url}@{UPSTREAM.branch}"
    assert installs_from(setup, colab=True) == upstream  # Colab
    assert installs_from(setup, colab=False) == upstream  # any hosted JupyterLab without it
    assert installs_from(setup, colab=False, installed=True) is None  # make lab, a wheel


def test_make_set_repo_sets_and_clears_the_mirror(tmp_path: Path) -> None:
    root = course_copy(tmp_path)
    for given, want in ((f"MIRROR={MIRROR}", MIRROR), ("MIRROR=", "")):
        done = subprocess.run(
            ["make", "-s", "set-repo", given, f"PYTHON={sys.executable}"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert set_repo.read_source(root).mirror == want and set_repo.problems(root) == []
