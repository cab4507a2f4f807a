"""Helpers stay small and visible: every public function and class says which chapter introduces it."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

import helpers

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(helpers.__path__, "helpers.") if ".scripts" not in m.name
)
CHAPTER = re.compile(r"\(chapters? \d( and \d)?\)")


def public_objects() -> list[tuple[str, object]]:
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isfunction(obj) or inspect.isclass(obj):
                found.append((f"{name}.{attr}", obj))
    return found


OBJECTS = public_objects()


@pytest.mark.parametrize(("qualname", "obj"), OBJECTS, ids=[q for q, _ in OBJECTS])
def test_docstring_names_the_chapter(qualname: str, obj: object) -> None:
    doc = inspect.getdoc(obj) or ""
    first = doc.splitlines()[0] if doc else ""
    assert first, f"{qualname} has no docstring"
    assert CHAPTER.search(doc), (
        f"{qualname}: the docstring must name the chapter that introduces it, e.g. '(chapter 2)'"
    )


@pytest.mark.parametrize(("qualname", "obj"), OBJECTS, ids=[q for q, _ in OBJECTS])
def test_functions_are_short_and_typed(qualname: str, obj: object) -> None:
    if not inspect.isfunction(obj):
        return
    lines = len(inspect.getsource(obj).splitlines())
    assert lines <= 80, f"{qualname} is {lines} lines long: split it"
    sig = inspect.signature(obj)
    assert sig.return_annotation is not inspect.Signature.empty, f"{qualname} needs a return type"
