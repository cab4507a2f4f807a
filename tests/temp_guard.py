"""The test suite leaves nothing in the system temp folder (issue 24 item 7); a pytest plugin.

conftest.py loads it. In the controller process (xdist's workers inherit its environment), it
makes a private temp folder and points TMPDIR, TMP, TEMP and `tempfile.tempdir` at it, so that
every process the suite starts writes its temp files there: notebook kernels, torchrun and its
ranks, benchmarks. pytest's own `tmp_path` folders stay where pytest keeps them
(PYTEST_DEBUG_TEMPROOT), since pytest manages those by design (it keeps the last three runs).

At the end of the session anything left in the private folder, except torch's compile cache
(`torchinductor_<user>`: a cache meant to outlive a run, see tests/test_temp_files.py), fails
the session with the list of what was left (and the test after which each first appeared);
then the folder is removed, so the system temp folder is left as it was found.

nbval kills each notebook's kernel with SIGKILL (`shutdown_kernel(now=True)`), so a kernel's
atexit handlers never run there, as they do when JupyterLab or tools/run_all.py shut a kernel
down (chapter 4's run folders are removed at exit). Here nbval shuts kernels down as
JupyterLab does: a shutdown request, then a kill after a few seconds if the kernel hangs.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

#: What may stay: torch's persistent compile cache (tests/test_temp_files.py says why).
ALLOWED = re.compile(r"torchinductor_[\w.-]+")
_VARS = ("TMPDIR", "TMP", "TEMP", "PYTEST_DEBUG_TEMPROOT")
_KEY = pytest.StashKey[dict]()


def leftovers(folder: Path) -> list[str]:
    """Entries of `folder` (top level) other than the allowed compile cache."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if not ALLOWED.fullmatch(p.name))


def _stop_gracefully(self) -> None:  # noqa: ANN001 - nbval.kernel.RunningKernel.stop
    """Shut the kernel down as JupyterLab does, so that its atexit handlers run."""
    self.kc.stop_channels()
    self.km.shutdown_kernel(now=False)
    del self.km


def pytest_configure(config: pytest.Config) -> None:
    try:
        from nbval.kernel import RunningKernel
    except ImportError:  # no nbval: no notebooks in this session
        pass
    else:
        RunningKernel.stop = _stop_gracefully
    if hasattr(config, "workerinput"):  # an xdist worker: the controller set the folder up
        return
    system = tempfile.gettempdir()
    private = Path(tempfile.mkdtemp(prefix="course-tests-tmp-"))
    config.stash[_KEY] = {
        "private": private,
        "saved": {v: os.environ.get(v) for v in _VARS},
        "tempdir": tempfile.tempdir,
        "left": [],
        "seen": set(),
        "by_test": {},  # entry -> the test after which it first appeared (without xdist)
    }
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", system)  # tmp_path where pytest keeps it
    for var in ("TMPDIR", "TMP", "TEMP"):
        os.environ[var] = str(private)
    tempfile.tempdir = str(private)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item):  # noqa: ANN201 - a hook wrapper
    """Note which test an entry appeared after (tests run in this process: no xdist)."""
    yield
    state = item.config.stash.get(_KEY, None)
    if state is not None:
        for name in set(leftovers(state["private"])) - state["seen"]:
            state["by_test"][name] = item.nodeid
            state["seen"].add(name)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(_KEY, None)
    if state is None:
        return
    state["left"] = leftovers(state["private"])
    if state["left"] and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:  # noqa: ANN001
    state = config.stash.get(_KEY, None)
    if state and state["left"]:
        terminalreporter.section("left in the temp folder", red=True)
        found = [
            name
            + (f" (first seen after {state['by_test'][name]})" if name in state["by_test"] else "")
            for name in state["left"]
        ]
        terminalreporter.line(
            f"The suite left {len(found)} thing(s) in its temp folder (TMPDIR): "
            f"{'; '.join(found)}. Whatever made them must remove them "
            "(tests/test_temp_files.py shows how the course's launcher does it)."
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_KEY, None)
    if state is None:
        return
    for var, value in state["saved"].items():
        if value is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = value
    tempfile.tempdir = state["tempdir"]
    shutil.rmtree(state["private"], ignore_errors=True)
