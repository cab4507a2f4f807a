"""Shared test fixtures. Exercise notebooks are read with nbfiles.exercise_namespace (tools/)."""

from __future__ import annotations

import os
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
def chinese() -> Iterator[None]:
    """Checks and verdicts print in Simplified Chinese during the test, English after (helpers/i18n.py)."""
    from helpers.i18n import set_language

    set_language("zh_CN")
    try:
        yield
    finally:
        set_language("en")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Log each failure as it happens for tools/gpu_check.py (tests/failures_log.py)."""
    from failures_log import log_failure

    log_failure(report)
