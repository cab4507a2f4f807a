"""No file in the project uses the deprecated AMP namespaces, and the erratum about them is true.

The course teaches ``torch.autocast(device_type, ...)`` and ``torch.amp.GradScaler(device)``.
The forbidden spellings are built by concatenation so that this file does not contain them.
Prose may still name "the old torch.cuda.amp namespace": without a trailing dot or an
import it is a name, not a use.
"""

from __future__ import annotations

import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = {".py", ".ipynb", ".md", ".yml", ".yaml", ".txt", ".toml"}
OLD = ("torch.cuda" + ".amp", "torch.cpu" + ".amp")
FORBIDDEN = [f"{old}." for old in OLD] + [
    f"{verb} {old}" for old in OLD for verb in ("from", "import")
]


#: Files that must spell the old API to test that it is rejected, with why. Nothing else may.
ON_PURPOSE = {
    "tests/test_exercises_ch03.py": "a wrong learner answer using the old autocast, which the "
    "chapter 3 checker must reject",
    "tests/test_checks_framework.py": "a fake FutureWarning text that the check framework must report",
}


def skipped(name: str) -> bool:
    """.git and every virtual environment (.venv, .venv-widgets7, ...) are not the project's files."""
    return name == ".git" or name.startswith(".venv")


def _walked_files() -> list[Path]:
    """Every file under ROOT with a scanned suffix, .git and venvs pruned (no git available)."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        if Path(folder) == ROOT:
            dirs[:] = [d for d in dirs if not skipped(d)]  # prune: never walk into a venv
        found += [Path(folder) / f for f in files if Path(f).suffix in SUFFIXES]
    return found


def _git_files() -> list[Path] | None:
    """The files git tracks or would track (ignored build output left out); None without git."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    names = {n for n in out.decode("utf-8", "replace").split("\0") if n}
    return [ROOT / n for n in names if Path(n).suffix in SUFFIXES and (ROOT / n).is_file()]


def recorded_output(path: Path) -> bool:
    """A GPU run's executed notebooks under reference/: what torch printed there, warnings included."""
    parts = path.relative_to(ROOT).parts
    return len(parts) > 3 and parts[0] == "reference" and parts[2] == "executed"


def project_files() -> list[Path]:
    """The project's own files: git's view (executed/, build/, venvs ignored), else a walk."""
    files = _git_files()
    if files is None:
        files = _walked_files()
    return sorted(
        f
        for f in files
        if not any(skipped(part) for part in f.relative_to(ROOT).parts) and not recorded_output(f)
    )


def test_the_scan_sees_the_project() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in project_files()}
    assert "pyproject.toml" in names and "tests/test_no_deprecated_amp.py" in names
    assert any(n.startswith("notebooks/") and n.endswith(".ipynb") for n in names)
    assert not any(n.startswith(".venv") for n in names)
    assert set(ON_PURPOSE) <= names, "an exempted file is gone: drop it from ON_PURPOSE"


def test_the_scan_leaves_out_what_git_ignores() -> None:
    """Output of `make instructor` (executed/), build/ and artifacts/ are not the project's files."""
    if _git_files() is None:
        pytest.skip("git is not available here: the scan walks the folder instead")
    tops = {p.relative_to(ROOT).parts[0] for p in project_files()}
    assert not tops & {"executed", "build", "artifacts", "gpu-check", "runs"}
    # the H200 run's notebooks print the deprecation warnings chapter 3 shows, as torch wrote them
    recorded = (
        ROOT / "reference" / "nvidia-h200" / "executed" / "notebooks" / "03_mixed_precision.ipynb"
    )
    assert recorded_output(recorded) and recorded not in project_files()
    assert not recorded_output(ROOT / "reference" / "nvidia-h200" / "README.md")


def test_the_scan_falls_back_to_a_walk_without_git(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_git(*args: object, **kwargs: object) -> None:
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert _git_files() is None
    names = {p.relative_to(ROOT).as_posix() for p in project_files()}
    assert "pyproject.toml" in names and "tests/test_no_deprecated_amp.py" in names
    assert not any(n.startswith((".venv", ".git/")) for n in names)


def test_forbidden_strings_are_the_deprecated_api() -> None:
    assert FORBIDDEN[0] == "torch.cuda" + ".amp."
    assert (
        "from torch.cuda" + ".amp import autocast"
        in "x = 1\nfrom torch.cuda" + ".amp import autocast"
    )
    assert not any(f in Path(__file__).read_text(encoding="utf-8") for f in FORBIDDEN)


def test_no_deprecated_amp_anywhere() -> None:
    hits = []
    for path in project_files():
        if path.relative_to(ROOT).as_posix() in ON_PURPOSE:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            for bad in FORBIDDEN:
                if bad in line:
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {bad!r}")
    assert not hits, (
        "deprecated AMP API found; use torch.autocast(device_type, dtype=...) and "
        "torch.amp.GradScaler(device):\n" + "\n".join(hits)
    )


@pytest.mark.parametrize("name", ["GradScaler", "autocast"])
def test_the_old_cuda_namespace_warns_and_names_the_replacement(name: str) -> None:
    old = getattr(getattr(torch, "cuda"), "amp")  # noqa: B009 - the name must not be written out
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        obj = getattr(old, name)()
        if name == "autocast":
            with obj:
                pass
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert future and "deprecated" in future[0] and f"torch.amp.{name}('cuda'" in future[0]


def test_the_replacement_works_on_cpu() -> None:
    scaler = torch.amp.GradScaler("cpu")
    layer = torch.nn.Linear(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16 and scaler.is_enabled()
