"""The learner's function travels to the ranks with what it names: itself and its helpers (chapters 4 and 8).

A second grader (issue 31) found a correct ZeRO-1 step that kept its buffers as attributes of
the function refused with "your function uses 'zero1_step' from the notebook".
"""

from __future__ import annotations

import pytest

from helpers.checks import CheckFailed
from helpers.checks.ch04 import payload
from helpers.scripts.exercise_check import rebuild


def _scale(x):  # noqa: ANN001, ANN202 - a helper defined next to the learner's function
    return 2 * x


def counted(x):  # noqa: ANN001, ANN201
    counted.calls = getattr(counted, "calls", 0) + 1  # state kept on the function itself
    return _scale(x) + counted.calls


def countdown(n):  # noqa: ANN001, ANN201
    return 0 if n == 0 else 1 + countdown(n - 1)  # recursion by its own name


UNSENDABLE = object()


def uses_an_object(x):  # noqa: ANN001, ANN201
    return UNSENDABLE, x


def test_a_function_naming_itself_and_a_helper_is_rebuilt() -> None:
    fn = rebuild(payload(counted))
    assert fn is not counted
    assert fn(1) == 3 and fn(1) == 4  # its own attribute, on the rebuilt function
    assert not hasattr(counted, "calls")  # the notebook's function was not called
    assert rebuild(payload(countdown))(5) == 5


def test_an_object_of_the_notebook_is_still_refused() -> None:
    with pytest.raises(CheckFailed, match="from the notebook"):
        payload(uses_an_object)
