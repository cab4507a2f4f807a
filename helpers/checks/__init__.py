"""The exercise-check framework (chapter 1).

Every exercise notebook calls one checker per exercise, e.g.
``check_pick_device(pick_device)``. A checker runs a few probes through :func:`run_check`,
which prints one line:

- ✅ when every probe passes;
- ❌ with a hint when a probe fails or the learner's code raises;
- ⏳ "not done yet" when the learner's function still raises ``NotImplementedError``
  (the untouched stub), so an untouched exercise notebook runs top to bottom.

Chapter checkers live in ``helpers.checks.ch01`` ... ``helpers.checks.ch06``.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass

PASS, FAIL, TODO = "pass", "fail", "todo"


class CheckFailed(AssertionError):
    """A probe found a wrong answer; the message is the hint shown to the learner (chapter 1)."""


@dataclass
class CheckResult:
    """Outcome of one exercise check: status is 'pass', 'fail' or 'todo' (chapter 1)."""

    title: str
    status: str
    message: str = ""

    @property
    def passed(self) -> bool:
        """True only for ✅ (chapter 1)."""
        return self.status == PASS

    def __bool__(self) -> bool:
        return self.passed

    def _ipython_display_(self) -> None:
        """Show nothing more: run_check already printed the line (chapter 1)."""


def expect(condition: object, hint: str) -> None:
    """Fail the current check with `hint` unless `condition` is true (chapter 1)."""
    if not condition:
        raise CheckFailed(hint)


def _where(exc: BaseException) -> str:
    """The learner-side line an exception came from, if any (chapter 1)."""
    frames = traceback.extract_tb(exc.__traceback__)
    learner = [f for f in frames if "/helpers/" not in f.filename.replace("\\", "/")]
    if not learner:
        return ""
    f = learner[-1]
    return f" (at line {f.lineno}: {f.line})" if f.line else ""


def run_check(title: str, probes: Callable[[], None]) -> CheckResult:
    """Run `probes`; print ✅, ❌ + hint, or ⏳ not done yet; never raise (chapter 1)."""
    try:
        probes()
    except NotImplementedError:
        result = CheckResult(
            title, TODO, "not done yet: replace `raise NotImplementedError` with your code"
        )
        print(f"⏳ {title}: {result.message}.")
        return result
    except CheckFailed as exc:
        result = CheckResult(title, FAIL, str(exc))
        print(f"❌ {title}: {exc}")
        return result
    except Exception as exc:
        msg = f"your code raised {type(exc).__name__}: {exc}{_where(exc)}"
        result = CheckResult(title, FAIL, msg)
        print(f"❌ {title}: {msg}")
        return result
    result = CheckResult(title, PASS, "correct")
    print(f"✅ {title}: correct.")
    return result
