"""helpers.checks: ✅ / ❌ with a hint / ⏳ not done yet, and never an exception."""

from __future__ import annotations

import pytest

from helpers.checks import FAIL, PASS, TODO, CheckResult, expect, run_check


def test_pass(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_check("Exercise 1", lambda: expect(True, "never shown"))
    assert r.status == PASS and r and "✅ Exercise 1" in capsys.readouterr().out


def test_fail_shows_the_hint(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_check("Exercise 2", lambda: expect(1 == 2, "Did you divide by the world size?"))
    assert r.status == FAIL and not r
    assert "❌ Exercise 2: Did you divide by the world size?" in capsys.readouterr().out


def test_stub_is_not_done_yet(capsys: pytest.CaptureFixture[str]) -> None:
    def stub() -> None:
        raise NotImplementedError("Write your solution here.")

    r = run_check("Exercise 3", stub)
    assert r.status == TODO and "⏳" in capsys.readouterr().out


def test_learner_exception_is_reported_not_raised(capsys: pytest.CaptureFixture[str]) -> None:
    def broken() -> None:
        return [][1]

    r = run_check("Exercise 4", broken)
    out = capsys.readouterr().out
    assert r.status == FAIL and "IndexError" in out and "❌" in out


def test_result_displays_nothing_more() -> None:
    assert CheckResult("t", PASS)._ipython_display_() is None
