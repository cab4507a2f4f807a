"""exercises/ is generated from solutions/ and must not drift; the generator's rules hold."""

from __future__ import annotations

import pytest

import make_exercises


def test_exercises_do_not_drift() -> None:
    assert make_exercises.main(["--check"]) == 0, "run: python tools/make_exercises.py"


def test_solution_region_becomes_stub() -> None:
    src = "def f(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION\n"
    out = make_exercises.stub_code(src, "t")
    assert "return x + 1" not in out and "raise NotImplementedError" in out
    assert out.startswith("def f(x):\n    # YOUR CODE HERE")


def test_stub_region_replaces_default_stub() -> None:
    src = (
        "def f(t):\n    ### BEGIN SOLUTION\n    return t.cpu()\n    ### END SOLUTION\n"
        "    ### BEGIN STUB\n    # return t.numpy()\n    ### END STUB\n"
    )
    out = make_exercises.stub_code(src, "t")
    assert "    return t.numpy()" in out and "NotImplementedError" not in out and "cpu()" not in out


@pytest.mark.parametrize(
    "src",
    [
        "### BEGIN SOLUTION\nx = 1\n### END SOLUTION\n",  # not inside a function
        "def f():\n    ### BEGIN SOLUTION\n    return 1\n",  # unterminated
        "def f():\n    return 1\n    ### END SOLUTION\n",  # end without begin
    ],
)
def test_bad_markers_are_rejected(src: str) -> None:
    with pytest.raises(make_exercises.ExerciseError):
        make_exercises.stub_code(src, "t")


def test_markdown_answers_are_removed() -> None:
    text = "# Title<!-- BEGIN SOLUTION --> (solutions)<!-- END SOLUTION -->"
    assert make_exercises.MD_REGION.sub("", text) == "# Title"
