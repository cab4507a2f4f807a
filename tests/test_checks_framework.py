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


def test_a_probe_names_itself_in_failures_and_errors() -> None:
    from helpers.checks import probe

    def failing() -> None:
        with probe("batch_size=0"):
            expect(False, "expected ValueError")

    def raising() -> None:
        with probe("batch_size=0"):
            return 1 // 0

    assert run_check("t", failing).message == "[probe: batch_size=0] expected ValueError"
    r = run_check("t", raising)
    assert r.status == FAIL and r.message.startswith("[probe: batch_size=0] your code raised")
    assert "ZeroDivisionError" in r.message and "return 1 // 0" in r.message


def test_an_error_inside_torch_is_reported_at_the_learners_line() -> None:
    import torch

    def learner() -> None:
        torch.ones(2, 3) @ torch.ones(2, 3)  # the learner's line

    r = run_check("t", learner)
    assert r.status == FAIL and "the learner's line" in r.message, r.message


def test_a_not_implemented_error_raised_by_torch_is_not_todo() -> None:
    import torch

    r = run_check("t", lambda: torch.ones(2, device="meta").cpu())
    assert r.status == FAIL and "Cannot copy out of meta tensor" in r.message


def test_future_warning_is_an_error_while_probing() -> None:
    import warnings

    def deprecated() -> None:
        warnings.warn("torch.cpu.amp.autocast(args...) is deprecated", FutureWarning, stacklevel=1)

    r = run_check("t", deprecated)
    assert r.status == FAIL and "deprecated API" in r.message and "warnings.warn" in r.message


def test_work_order_records_forwards_and_backwards_and_removes_its_hooks() -> None:
    import torch
    from torch import nn

    from helpers.checks import forwards_at_once, work_order

    model = nn.Sequential(nn.Linear(3, 2))
    xs = [torch.randn(4, 3) for _ in range(3)]
    with work_order(model, model[0].weight) as interleaved:
        for x in xs:
            model(x).sum().backward()
    with work_order(model, model[0].weight) as summed:
        sum(model(x).sum() for x in xs).backward()
    assert interleaved == ["forward", "backward"] * 3 and forwards_at_once(interleaved) == 1
    assert forwards_at_once(summed) == 3 and forwards_at_once([]) == 0
    assert not model._forward_pre_hooks


def test_under_nbgrader_validate_a_check_that_is_not_passed_raises(monkeypatch, capsys) -> None:  # noqa: ANN001
    """Issue 34 (an nbgrader expert's review): Validate runs the student's copy without the
    hidden tests, so a ❌ or ⏳ must raise there, or Validate calls every exercise fine."""
    from helpers.checks import CheckFailed, expect, run_check

    def wrong() -> None:
        expect(False, "the hint")

    def stub() -> None:
        raise NotImplementedError("Write your solution here.")

    assert run_check("ex", wrong).status == "fail"  # a learner's notebook: printed, never raised
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    for probes in (wrong, stub):
        with pytest.raises(CheckFailed):
            run_check("ex", probes)
    assert run_check("ex", lambda: None).status == "pass"
    out = capsys.readouterr().out
    assert "❌ ex: the hint" in out and "⏳ ex" in out and "✅ ex" in out
