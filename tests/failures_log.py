"""Each failing test's id, appended to $COURSE_FAILURES_LOG as it fails (tools/gpu_check.py).

pytest names its failures in the summary at the end; a run stopped by a deadline has none.
With this log, the GPU check still says which tests failed before it stopped. tests/conftest.py
calls it from its pytest_runtest_logreport hook.
"""

from __future__ import annotations

import os

import pytest

ENV = "COURSE_FAILURES_LOG"


def log_failure(report: pytest.TestReport) -> None:
    """Append the report's test id and phase to $COURSE_FAILURES_LOG if the test failed."""
    path = os.environ.get(ENV)
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as log:
            log.write(f"{report.nodeid} ({report.when})\n")
