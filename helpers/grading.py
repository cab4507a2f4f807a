"""Autograding with nbgrader: a checker that fails its cell unless the answer passes (chapter 1).

In a class graded with nbgrader (``make assignments``, tools/assignments.py), each exercise's
check cell carries a hidden prelude, which ``nbgrader generate_assignment`` removes from the
student's copy and ``nbgrader autograde`` puts back::

    import sys; [sys.modules.pop(m) for m in list(sys.modules) if m.split(".")[0] == "helpers"]
    from helpers.grading import strict_checker
    check_measure = strict_checker("helpers.checks.ch06", "check_measure", "en")

so the visible line, ``check_measure(measure)`` (or ``from helpers.checks.ch06 import
check_measure`` first), calls the course's checker read fresh from its file: a learner's
``check_measure = ...`` or ``helpers.checks.ch06.check_measure = ...`` in an earlier cell no
longer counts. The checker prints its ✅ / ❌ / ⏳ line as in class; on ❌ or ⏳ the cell then
raises AssertionError with the hint, which is how nbgrader scores a test cell 0.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from types import ModuleType

from helpers.i18n import ENV, tr, tr_mark

#: The lines run_check prints (helpers/checks/__init__.py), raised again as the cell's error.
FAILED = tr_mark("❌ {title}: {why}")
NOT_DONE = tr_mark("⏳ {title}: {why}.")


class ExerciseNotPassed(AssertionError):
    """A graded check said ❌ or ⏳: the message is its line, hint included (chapter 1)."""


def fresh_module(name: str) -> ModuleType:
    """`name` (a helpers module) imported again from its file, with every helpers module (chapter 1)."""
    for loaded in [m for m in sys.modules if m.split(".")[0] == "helpers"]:
        if loaded != __name__:
            del sys.modules[loaded]
    return importlib.import_module(name)


def verdict_of(result: object, checks: ModuleType) -> str:
    """'' when `result` is a passing CheckResult of `checks`, else the line to fail with (chapter 1)."""
    if isinstance(result, checks.CheckResult) and result.status == checks.PASS:
        return ""
    if isinstance(result, checks.CheckResult):
        line = NOT_DONE if result.status == checks.TODO else FAILED
        return tr(line).format(title=result.title, why=result.message)
    return f"❌ the checker returned {result!r}, not a CheckResult"


def strict_checker(module: str, name: str, language: str = "") -> Callable[..., None]:
    """The checker `module`.`name`, fresh from its file, raising ExerciseNotPassed unless ✅ (chapter 1).

    It also replaces the checker in the fresh module, so that ``from module import name`` in
    the check cell gets this one. `language` ('en', 'zh_CN'; '' leaves it) is the language
    of the assignment: its hints are printed, and raised, in that language.
    """
    if language:  # what set_language() sets, without its plot fonts
        os.environ[ENV] = language
    target = fresh_module(module)
    checks = importlib.import_module("helpers.checks")
    checker = getattr(target, name)

    def graded(*args: object, **kwargs: object) -> None:
        __tracebackhide__ = True  # noqa: F841 - IPython and pytest leave this frame out
        why = verdict_of(checker(*args, **kwargs), checks)
        if why:
            raise ExerciseNotPassed(why)

    graded.__name__ = graded.__qualname__ = name
    graded.__doc__ = checker.__doc__
    setattr(target, name, graded)
    return graded
