"""Shared by the browser tests and their fixtures: paths, settings, the Lab handle."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import ipywidgets
import nbformat

import nbfiles

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
WIDGETS_MAJOR = int(ipywidgets.__version__.split(".")[0])
ARTIFACTS = ROOT / "artifacts" / "browser" / f"ipywidgets{WIDGETS_MAJOR}"
SELFTEST = "browser_selftest/widget_selftest.ipynb"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    # Nothing but the loopback address resolves, whatever a page asks for.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
# JupyterLab settings for a quiet, deterministic page: no news or update toast over the
# notebook, no autosave, every cell attached to the page (no virtual scrolling).
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}
# The widget cell of the self-test notebook: the course's widget pattern on a tiny sweep, so the
# browser path is tested even where no chapter has a widget yet.
SELFTEST_CELL = """\
import ipywidgets as widgets

from helpers.plots import plot_sweep, show
from helpers.sweeps import run_sweep
from helpers.widgets import interactive_plot


def run(n: int = 4, scale: float = 1.0):
    return run_sweep(lambda k: {"y": scale * k**2}, range(1, n + 1), param="k", progress=False)


def plot(result):
    return plot_sweep(result, "y", title="widget self-test")


show(plot(run()))
controls = {
    "n": widgets.IntSlider(value=4, min=2, max=12, description="n"),
    "scale": widgets.FloatSlider(value=1.0, min=0.5, max=3.0, step=0.5, description="scale"),
}
interactive_plot(run, plot, controls)"""


def has_widget(path: Path) -> bool:
    """A notebook whose code calls helpers.widgets.interactive_plot."""
    nb = nbfiles.read(path)
    return any(c.cell_type == "code" and "interactive_plot(" in c.source for c in nb.cells)


def widget_notebooks() -> list[str]:
    """Every course notebook with a widget, as a path relative to the repository."""
    return [p.relative_to(ROOT).as_posix() for p in nbfiles.all_notebooks() if has_widget(p)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_lab_root(dest: Path) -> None:
    """Copy the notebook folders into dest and add the widget self-test notebook."""
    for name in (*nbfiles.NOTEBOOK_DIRS, "zh"):  # zh/: the Chinese edition
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, dest / name, ignore=shutil.ignore_patterns(".*", "runs", "__pycache__")
            )
    nb = nbfiles.read(ROOT / "templates" / "chapter_template.ipynb")
    at = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code") + 2
    nb.cells.insert(at, nbformat.v4.new_code_cell(SELFTEST_CELL))
    (dest / SELFTEST).parent.mkdir(parents=True, exist_ok=True)
    (dest / SELFTEST).write_text(nbfiles.dumps(nbfiles.clean(nb)), encoding="utf-8")


@dataclass
class Lab:
    """A running JupyterLab: where it serves, its token, the folder it serves."""

    url: str
    token: str
    root: Path
    process: subprocess.Popen
    log: Path
    blocked: list[str] = field(default_factory=list)

    def api(self, method: str, path: str) -> object:
        """Call the server's REST API with the token; the decoded JSON answer."""
        req = urllib.request.Request(
            f"{self.url}{path}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """Stop every kernel, so the next notebook has the CPU to itself."""
        for session in self.api("GET", "/api/sessions") or []:
            self.api("DELETE", f"/api/sessions/{session['id']}")
