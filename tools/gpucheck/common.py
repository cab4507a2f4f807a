"""The repository's root, the environment every command gets, and text helpers (gpu_check)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
#: The script that --probe and --state run in a fresh process.
SCRIPT = ROOT / "tools" / "gpu_check.py"
#: The variables that set the threads of torch, OpenMP, MKL and OpenBLAS in a child.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def child_env(threads: int | None = None) -> dict[str, str]:
    """The environment for a command: this checkout's helpers first, and its threads if given."""
    env = dict(os.environ)
    paths = [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MPLBACKEND", "Agg")
    if threads is not None:
        for name in THREAD_VARS:
            env[name] = str(max(1, threads))
    return env


def md_cell(text: object) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def log_text(path: Path) -> str:
    """A log's text without the '$ command' header line."""
    text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
    if text.startswith("$ "):
        text = text.split("\n", 2)[-1] if text.count("\n") >= 2 else ""
    return text.strip("\n")


def fenced(text: str) -> str:
    """Text as a Markdown code block that its own backticks cannot close."""
    fence = "````"
    while fence in text:
        fence += "`"
    return f"{fence}text\n{text}\n{fence}\n"


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log."""
    return "\n".join(log_text(path).splitlines()[-lines:])


def label(path: Path) -> str:
    """A path relative to the repository, or its name if it lies outside (as run_all says)."""
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.name


def write_file(path: Path, text: str) -> Path:
    """Write a file atomically, so that a reader never sees half of it."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
