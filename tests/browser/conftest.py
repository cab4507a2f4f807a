"""Fixtures for the browser tests: a private JupyterLab server and Debian's Chromium.

JupyterLab runs from the environment that runs pytest (the installed course), on 127.0.0.1,
a free port and a random token, with its own settings, workspaces and runtime folders. It
serves a temporary copy of the course's notebooks, so running them in the browser never
writes outputs into the repository. Chromium is Debian's (/usr/bin/chromium, or $CHROMIUM),
driven headless by Playwright; it is never downloaded. Every request that is not addressed to
127.0.0.1 is blocked. Screenshots, the executed notebooks and the server log go to
artifacts/browser/ (git-ignored).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    LAB_SETTINGS,
    Lab,
    free_port,
    make_lab_root,
)


@pytest.fixture(scope="session")
def chromium() -> Path:
    if not CHROMIUM.exists():
        pytest.skip(
            f"browser tests skipped: no Chromium at {CHROMIUM}. Install Debian's Chromium "
            "(`sudo apt-get install -y chromium`, or `bash tools/ensure_chromium.sh`, which "
            "`make test` runs), or set CHROMIUM=/path/to/chromium."
        )
    return CHROMIUM


@pytest.fixture(scope="session")
def lab(chromium: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    base = tmp_path_factory.mktemp("jupyterlab")
    root, settings = base / "root", base / "settings"
    root.mkdir()
    make_lab_root(root)
    for name, value in LAB_SETTINGS.items():
        (settings / name).parent.mkdir(parents=True, exist_ok=True)
        (settings / name).write_text(json.dumps(value), encoding="utf-8")
    shutil.rmtree(ARTIFACTS, ignore_errors=True)  # the artefacts of this run only
    ARTIFACTS.mkdir(parents=True)
    log = ARTIFACTS / "jupyterlab.log"
    token, port = secrets.token_hex(16), free_port()
    env = {
        **os.environ,
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(base / "workspaces"),
        "JUPYTER_CONFIG_DIR": str(base / "config"),
        "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
        "COURSE_DEVICE": os.environ.get("COURSE_DEVICE", "cpu"),
        "PYTHONUNBUFFERED": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
        "--ServerApp.open_browser=False",
    ]
    if hasattr(os, "getuid") and os.getuid() == 0:
        cmd.append("--allow-root")
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=root)
    server = Lab(f"http://127.0.0.1:{port}", token, root, proc, log)
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            pytest.fail(f"JupyterLab exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            server.api("GET", "/api/status")
            break
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"JupyterLab did not answer in 120 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.3)
    yield server
    try:
        server.shutdown_kernels()
        server.api("POST", "/api/shutdown")  # quicker than SIGTERM, which waits ~30 s
        proc.wait(timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
    (ARTIFACTS / "blocked_requests.txt").write_text("\n".join(server.blocked) + "\n")


@pytest.fixture(scope="session")
def browser(chromium: Path) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: object, lab: Lab) -> Iterator[object]:
    """A fresh browser page that can only reach the JupyterLab server."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    allowed = ("http://127.0.0.1:", "ws://127.0.0.1:")

    def guard(route: object) -> None:
        url = route.request.url
        if url.startswith(allowed) or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            lab.blocked.append(url)
            route.abort()

    context.route("**/*", guard)
    pg = context.new_page()
    pg.set_default_timeout(60_000)
    yield pg
    context.close()
    lab.shutdown_kernels()
