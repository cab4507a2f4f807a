"""Shared test fixtures. Exercise notebooks are read with nbfiles.exercise_namespace (tools/)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
#: the suite leaves nothing in the system temp folder (tests/temp_guard.py)
pytest_plugins = ("temp_guard",)

# Chapter 8's Triton kernel: without a GPU, Triton can only run kernels in its interpreter,
# which must be chosen before anything imports triton (it wraps its own library functions
# then). Set here, before any test module is imported; notebooks started by nbval inherit it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201 - returns the factory below
    """A factory that makes torch report a GPU without one: fake_gpu("t4") (tests/fake_gpu.py)."""
    # torch._dynamo reads the device's properties when it is first imported (torch 2.15: through
    # torch._inductor.utils), and optimizers import it lazily: import it while torch is real.
    import torch._dynamo  # noqa: F401
    from fake_gpu import FakeGpu, install

    def make(kind: str = "h100_sxm", *, count: int = 1, name: str | None = None) -> FakeGpu:
        monkeypatch.delenv("COURSE_DEVICE", raising=False)
        return install(monkeypatch, kind, count=count, name=name)

    return make


@pytest.fixture
def one_rank_group(tmp_path: Path) -> Iterator[None]:
    """A one-rank gloo process group in this process, for the duration of a test (chapters 4 and 8)."""
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("this torch build has no torch.distributed")
    init = (tmp_path / "pg").resolve().as_uri()
    dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture
def chinese() -> Iterator[None]:
    """Checks and verdicts print in Simplified Chinese during the test, English after (helpers/i18n.py)."""
    from helpers.i18n import set_language

    set_language("zh_CN")
    try:
        yield
    finally:
        set_language("en")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Log each failure as it happens for tools/gpu_check.py (tests/failures_log.py); note skips."""
    from failures_log import log_failure

    log_failure(report)
    if report.skipped:
        _skipped.add(_test_id(report.nodeid))


# -- the tests that run a CUDA branch for real (the `cuda` marker) -----------------------------
#
# A test runs a CUDA branch for real on a machine with a GPU when the course's code (helpers,
# tests, benchmarks) asks the real torch.cuda.is_available() during it: pick_device(), the
# checkers' device probes, a GPU-only test. A test that uses the fake GPU (tests/fake_gpu.py)
# asks the fake; torch's own internal checks are not the course's branches; checking an
# explicit CPU device, or tidying up after an out-of-memory, runs on the CPU anywhere. On a CPU the
# answer is False, but the question was asked: that is what is recorded here. The tests found
# so are listed in tests/cuda_tests.txt and marked `cuda`; tools/gpu_check.py runs only those
# on a GPU (CI runs them all on the CPU). A run of the whole suite fails if the list is stale;
# COURSE_CUDA_TESTS=write rewrites it; COURSE_CUDA_TESTS=record:FILE writes what any run's
# tests asked to FILE (to update the list for a few test files without running them all).

CUDA_TESTS = ROOT / "tests" / "cuda_tests.txt"
_asked: set[str] = set()
_skipped: set[str] = set()  # skipped here: whether they ask is not known on this machine
_running: list[str] = [""]


def _test_id(nodeid: str) -> str:
    """'tests/test_x.py::test_y' for 'tests/test_x.py::test_y[param]' (the list's granularity)."""
    return nodeid.split("[", 1)[0]


def _ours(code) -> bool:  # noqa: ANN001 - a code object
    """Code of the course's (helpers, tests, benchmarks), not of an installed package."""
    return code.co_filename.startswith(str(ROOT)) and "site-packages" not in code.co_filename


def _decides_a_branch(frame) -> bool:  # noqa: ANN001 - a frame
    """Whether the answer can change what the course's code runs here.

    Not when resolve_device() checks an explicit CPU device against the devices there are (the
    test runs on the CPU on any machine), nor when free_cached_memory() tidies up.
    """
    while frame is not None:
        code = frame.f_code
        if _ours(code) and code.co_name == "free_cached_memory":
            return False
        if _ours(code) and code.co_name == "resolve_device":
            spec = frame.f_locals.get("spec")
            try:
                return spec is None or torch.device(spec).type != "cpu"
            except (RuntimeError, TypeError):
                return True
        frame = frame.f_back
    return True


def _record_cuda_question(real):  # noqa: ANN001, ANN202 - wraps torch.cuda.is_available
    def is_available() -> bool:
        caller = sys._getframe(1)
        if _running[0] and _ours(caller.f_code) and _decides_a_branch(caller):
            _asked.add(_running[0])
        return real()

    is_available.__wrapped__ = real
    return is_available


torch.cuda.is_available = _record_cuda_question(torch.cuda.is_available)


def listed_cuda_tests() -> set[str]:
    """The test ids in tests/cuda_tests.txt (comments and blank lines left out)."""
    if not CUDA_TESTS.exists():
        return set()
    lines = CUDA_TESTS.read_text(encoding="utf-8").splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def needs_a_gpu(item: pytest.Item) -> bool:
    """A test skipped where there is no GPU (a skipif whose reason names CUDA or a GPU)."""
    for mark in item.iter_markers("skipif"):
        reason = str(mark.kwargs.get("reason", ""))
        if "CUDA" in reason or "GPU" in reason:
            return True
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests listed in tests/cuda_tests.txt `cuda`: tools/gpu_check.py runs these on a GPU."""
    listed = listed_cuda_tests()
    for item in items:
        if needs_a_gpu(item):  # skipped here before it could ask: it asks on a GPU
            _asked.add(_test_id(item.nodeid))
        if _test_id(item.nodeid) in listed:
            item.add_marker(pytest.mark.cuda)


def pytest_runtest_setup(item: pytest.Item) -> None:
    _running[0] = _test_id(item.nodeid)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item):  # noqa: ANN201 - a hook wrapper
    yield  # fixtures' teardown may ask too
    _running[0] = ""


def whole_suite(session: pytest.Session) -> set[str]:
    """The test ids of this run if it ran every unit test file unfiltered, else an empty set."""
    option = session.config.option
    if getattr(option, "keyword", "") or getattr(option, "markexpr", ""):
        return set()
    ran = {_test_id(i.nodeid) for i in session.items if i.nodeid.startswith("tests/test_")}
    files = {f"tests/{f.name}" for f in (ROOT / "tests").glob("test_*.py")}
    return ran if files <= {t.split("::")[0] for t in ran} else set()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After a run of every unit test: tests/cuda_tests.txt must list exactly the tests that asked."""
    mode = os.environ.get("COURSE_CUDA_TESTS", "")
    if mode and session.config.pluginmanager.hasplugin("dsession"):  # the xdist controller
        print(
            f"\nCOURSE_CUDA_TESTS={mode} records nothing under pytest-xdist (the workers ask, "
            "the controller writes): run it without -n.",
            file=sys.stderr,
        )
        return
    if mode.startswith("record:") and not hasattr(session.config, "workerinput"):
        ran = {_test_id(i.nodeid) for i in session.items}  # a selection: what it asked
        Path(mode.removeprefix("record:")).write_text(
            "".join(f"{t}\n" for t in sorted(_asked & ran)), encoding="utf-8"
        )
    every = whole_suite(session)
    if not every or hasattr(session.config, "workerinput"):
        return  # a selection or an xdist worker: nothing to compare
    if os.environ.get("COURSE_CUDA_TESTS") == "write":
        header = "# The tests that run a CUDA branch for real (tests/conftest.py); one id a line.\n"
        CUDA_TESTS.write_text(
            header + "".join(f"{t}\n" for t in sorted(_asked & every)), encoding="utf-8"
        )
        return
    if session.testsfailed:
        return  # a failed test may have stopped before it asked: compare after a green run
    asked, listed = _asked & every, listed_cuda_tests() & every
    # a test skipped here (GPU-only, or CPU-only on a GPU box, or no Triton) proves nothing
    missing, stale = sorted(asked - listed), sorted(listed - asked - _skipped)
    if missing or stale:
        print(
            "\ntests/cuda_tests.txt is out of date: "
            + (
                f"these tests ask torch.cuda.is_available() but are not listed: {missing}; "
                if missing
                else ""
            )
            + (f"these are listed but no longer ask: {stale}; " if stale else "")
            + "rewrite it with: COURSE_CUDA_TESTS=write python -m pytest tests --ignore=tests/browser",
            file=sys.stderr,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
