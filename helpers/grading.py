"""Autograding with nbgrader: a checker that fails its cell unless the answer passes (chapter 1).

In a class graded with nbgrader (``make assignments``, tools/assignments.py), each exercise's
check cell carries a hidden prelude, which ``nbgrader generate_assignment`` removes from the
student's copy and ``nbgrader autograde`` puts back. It loads this file by the absolute path of
the installed course (written there by ``make assignments``), not through ``sys.path``::

    import importlib.util as _u; _s = _u.spec_from_file_location("course_grading", "/.../helpers/grading.py"); ...
    check_measure = _g.strict_checker("helpers.checks.ch06", "check_measure", "en", "<token>")

Loaded that way, this module loads every ``helpers`` module again from the installed course's
files: the working folder ('' and the current directory) leaves ``sys.path``, and the student's
import hooks (``sys.meta_path``, ``sys.path_hooks``, a replaced ``__import__``) are set aside
while it loads. The visible line, ``check_measure(measure)`` (or ``from helpers.checks.ch06
import check_measure`` first), then calls the course's checker: a learner's ``check_measure =
...`` or ``helpers.checks.ch06.check_measure = ...`` in an earlier cell no longer counts. The
checker prints its ✅ / ❌ / ⏳ line as in class; on ❌ or ⏳ the cell then raises
ExerciseNotPassed (an AssertionError) with the hint, which is how nbgrader scores a test cell 0.
On ✅ it shows the grader's token (an output nbgrader's course preprocessor checks and removes),
so a cell where this wrapper did not run scores 0 too.
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import importlib.machinery as machinery
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

#: The installed course's helpers/ folder: the one this file is in.
HELPERS = Path(__file__).resolve().parent
#: The output a passing graded check shows for the grader (tools/course_nbgrader.py checks it).
MARKER_MIME = "application/vnd.course-grading+json"


def _inside(module: object) -> bool:
    """Whether `module` was loaded from a file of the installed course's helpers/ folder."""
    file = getattr(module, "__file__", None)
    return bool(file) and Path(file).resolve().is_relative_to(HELPERS)


def _default_path_hooks() -> list:
    """The standard library's path hook for source, bytecode and extension files."""
    return [
        machinery.FileFinder.path_hook(
            (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
            (machinery.SourceFileLoader, machinery.SOURCE_SUFFIXES),
            (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES),
        )
    ]


@contextlib.contextmanager
def clean_imports() -> Iterator[None]:
    """Imports as Python does them, whatever hooks the notebook installed (chapter 1)."""
    saved = (sys.meta_path[:], sys.path_hooks[:], sys.path_importer_cache, builtins.__import__)
    sys.meta_path[:] = [machinery.BuiltinImporter, machinery.FrozenImporter, machinery.PathFinder]
    sys.path_hooks[:] = _default_path_hooks()
    sys.path_importer_cache = {}
    builtins.__import__ = importlib.__import__
    try:
        yield
    finally:
        sys.meta_path[:], sys.path_hooks[:] = saved[0], saved[1]
        sys.path_importer_cache, builtins.__import__ = saved[2], saved[3]


def installed(name: str) -> ModuleType:
    """The helpers module `name`, loaded from the installed course's file (chapter 1)."""
    if name in sys.modules and _inside(sys.modules[name]):
        return sys.modules[name]
    parts = name.split(".")
    parent = installed(".".join(parts[:-1])) if len(parts) > 1 else None
    path = HELPERS.parent.joinpath(*parts)
    package = (path / "__init__.py").is_file()
    spec = importlib.util.spec_from_file_location(
        name,
        path / "__init__.py" if package else path.with_suffix(".py"),
        submodule_search_locations=[str(path)] if package else None,
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    if parent is not None:
        setattr(parent, parts[-1], module)
    return module


def fresh_module(name: str) -> ModuleType:
    """`name` (a helpers module) loaded again from the installed course, with every helpers module (chapter 1)."""
    for loaded in [m for m in sys.modules if m.split(".")[0] == "helpers"]:
        if sys.modules[loaded] is not sys.modules.get(__name__):
            del sys.modules[loaded]
    here = {"", ".", os.getcwd()}  # the working folder: a submission's files are there
    sys.path[:] = [p for p in sys.path if p not in here and os.path.abspath(p) != os.getcwd()]
    with clean_imports():
        module = installed(name)
    for loaded in ("helpers", name):
        if not _inside(sys.modules.get(loaded)):
            raise ImportError(f"{loaded} was not loaded from the installed course ({HELPERS})")
    return module


def untraced() -> None:
    """No trace or profile function left by the notebook (sys.settrace and friends) (chapter 1)."""
    sys.settrace(None)
    sys.setprofile(None)
    threading.settrace(None)
    threading.setprofile(None)


def verdict_of(result: object, checks: ModuleType) -> str:
    """'' when `result` is a passing CheckResult of `checks`, else the line to fail with (chapter 1)."""
    tr = checks.tr
    if isinstance(result, checks.CheckResult) and result.status == checks.PASS:
        return ""
    if isinstance(result, checks.CheckResult):
        line = NOT_DONE if result.status == checks.TODO else FAILED
        return tr(line).format(title=result.title, why=result.message)
    return f"❌ the checker returned {result!r}, not a CheckResult"


class ExerciseNotPassed(AssertionError):
    """A graded check said ❌ or ⏳: the message is its line, hint included (chapter 1)."""


def _show_token(token: str) -> None:
    """Show the grader's token: the output that says this wrapper ran and passed."""
    from IPython.display import display

    display({MARKER_MIME: {"token": token}}, raw=True)


def strict_checker(
    module: str, name: str, language: str = "", token: str = ""
) -> Callable[..., None]:
    """The checker `module`.`name`, fresh from its file, raising ExerciseNotPassed unless ✅ (chapter 1).

    It also replaces the checker in the fresh module, so that ``from module import name`` in
    the check cell gets this one. `language` ('en', 'zh_CN'; '' leaves it) is the language
    of the assignment: its hints are printed, and raised, in that language. `token` (given by
    the grader) is shown when the check passes.
    """
    untraced()
    target = fresh_module(module)
    checks = sys.modules["helpers.checks"]
    if language:  # what set_language() sets, without its plot fonts
        os.environ[sys.modules["helpers.i18n"].ENV] = language
    checker = getattr(target, name)

    def graded(*args: object, **kwargs: object) -> None:
        __tracebackhide__ = True  # noqa: F841 - pytest leaves this frame out (IPython shows it)
        untraced()
        result = checker(*args, **kwargs)
        traced = sys.gettrace() is not None or sys.getprofile() is not None
        untraced()
        why = checks.tr(TRACED).format(title=name) if traced else verdict_of(result, checks)
        if why:
            raise ExerciseNotPassed(why)
        if token:
            _show_token(token)

    graded.__name__ = graded.__qualname__ = name
    graded.__doc__ = checker.__doc__
    setattr(target, name, graded)
    return graded


with clean_imports():  # the installed course's, whatever hooks the notebook installed
    tr_mark = installed("helpers.i18n").tr_mark
#: The lines run_check prints (helpers/checks/__init__.py), raised again as the cell's error.
FAILED = tr_mark("❌ {title}: {why}")
NOT_DONE = tr_mark("⏳ {title}: {why}.")
TRACED = tr_mark(
    "❌ {title}: the code being checked set a trace or profile function (sys.settrace, "
    "sys.setprofile), which grading does not allow"
)
