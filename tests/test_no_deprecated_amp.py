"""No file in the project uses the deprecated AMP namespaces, and the erratum about them is true.

The course teaches ``torch.autocast(device_type, ...)`` and ``torch.amp.GradScaler(device)``.
The forbidden spellings are built by concatenation so that this file does not contain them.
Prose may still name "the old torch.cuda.amp namespace": without a trailing dot or an
import it is a name, not a use.
"""

from __future__ import annotations

import os
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


def skipped(name: str) -> bool:
    """.git and every virtual environment (.venv, .venv-widgets7, ...) are not the project's files."""
    return name == ".git" or name.startswith(".venv")


def project_files() -> list[Path]:
    found = []
    for folder, dirs, files in os.walk(ROOT):
        if Path(folder) == ROOT:
            dirs[:] = [d for d in dirs if not skipped(d)]  # prune: never walk into a venv
        found += [Path(folder) / f for f in files if Path(f).suffix in SUFFIXES]
    return sorted(found)


def test_the_scan_sees_the_project() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in project_files()}
    assert "pyproject.toml" in names and "tests/test_no_deprecated_amp.py" in names
    assert any(n.startswith("notebooks/") and n.endswith(".ipynb") for n in names)
    assert not any(n.startswith(".venv") for n in names)


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
