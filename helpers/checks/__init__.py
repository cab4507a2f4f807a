"""The exercise-check framework (chapter 1).

Every exercise notebook calls one checker per exercise, e.g.
``check_pick_device(pick_device)``. A checker runs a few probes through :func:`run_check`,
which prints one line:

- ✅ when every probe passes;
- ❌ with a hint when a probe fails or the learner's code raises: the hint names the probe
  (``[probe: ...]``), what was expected, what came back and the likely mistake; an error
  raised inside torch is reported at the learner's line, not at a line of torch's code;
- ⏳ "not done yet" when the learner's function still raises ``NotImplementedError``
  (the untouched stub), so an untouched exercise notebook runs top to bottom. Only a
  ``NotImplementedError`` raised by the learner's own code counts: one raised inside torch
  (e.g. "Cannot copy out of meta tensor") is an error like any other.

While probes run, ``FutureWarning`` is an error: a deprecated API fails the check.

Chapter checkers live in ``helpers.checks.ch01`` ... ``helpers.checks.ch08``.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from helpers.i18n import tr

if TYPE_CHECKING:
    import torch
    from torch import nn

PASS, FAIL, TODO = "pass", "fail", "todo"

#: Folders whose frames are never "the learner's line": this package, the standard library
#: and every installed package (torch, numpy, ...).
_LIBRARY_DIRS = tuple(
    os.path.normcase(os.path.realpath(p)) + os.sep
    for p in {
        os.path.dirname(os.path.abspath(__file__)),
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        *(sysconfig.get_paths().get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")),
    }
    if p
)


#: Words in the NotImplementedErrors that torch raises (meta tensors, missing kernels).
_TORCH_NOT_IMPLEMENTED = ("meta", "no data", "Could not run", "not implemented for")


class CheckFailed(AssertionError):
    """A probe found a wrong answer; the message is the hint shown to the learner (chapter 1)."""


class NotDoneYet(NotImplementedError):
    """Raised by a checker that recognised an untouched stub without running it (chapter 1)."""


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


def _is_library(filename: str) -> bool:
    """True for a frame in helpers/, the standard library or an installed package (chapter 1)."""
    path = os.path.normcase(os.path.realpath(filename)) if os.path.isabs(filename) else filename
    return path.startswith(_LIBRARY_DIRS) or "/helpers/" in filename.replace("\\", "/")


def _learner_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The deepest traceback frame in the learner's code (not helpers, not torch) (chapter 1)."""
    frames = traceback.extract_tb(exc.__traceback__)
    learner = [f for f in frames if not _is_library(f.filename)]
    return learner[-1] if learner else None


def _where(exc: BaseException) -> str:
    """' (at line N: source)' for the learner's line an exception came from, if any (chapter 1)."""
    f = _learner_frame(exc)
    if f is None or not f.line:
        return ""
    return tr(" (at line {lineno}: {line})").format(lineno=f.lineno, line=f.line)


def is_stub_error(exc: BaseException) -> bool:
    """True for the untouched stub's NotImplementedError, raised by the learner's own code (chapter 1)."""
    if isinstance(exc, NotDoneYet):
        return True
    if not isinstance(exc, NotImplementedError):
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames or _is_library(frames[-1].filename):
        return False
    line = (frames[-1].line or "").strip()
    if line:  # an error raised by torch's C++ code shows the calling line, not a `raise`
        return line.startswith("raise")
    return not any(m in str(exc) for m in _TORCH_NOT_IMPLEMENTED)


def describe_error(exc: BaseException) -> str:
    """'RuntimeError: first line of the message (at line N: source)' (chapter 1)."""
    lines = str(exc).strip().splitlines()
    first = lines[0] if lines else ""
    if isinstance(exc, FutureWarning):
        return tr(
            "FutureWarning (it calls a deprecated API): {first}{where}. Use the modern API the "
            "chapter shows"
        ).format(first=first, where=_where(exc))
    return f"{type(exc).__name__}: {first}{_where(exc)}"


@contextmanager
def probe(name: str) -> Iterator[None]:
    """Name the probe in the block: a failed expect or an error raised in it says which (chapter 1)."""
    try:
        yield
    except CheckFailed as exc:
        text = str(exc)
        raise CheckFailed(
            text
            if text.startswith("[")
            else tr("[probe: {name}] {text}").format(name=name, text=text)
        ) from None
    except Exception as exc:  # the learner's code raised: say where and in which probe
        if is_stub_error(exc):
            raise
        raise CheckFailed(
            tr("[probe: {name}] your code raised {error}.").format(
                name=name, error=describe_error(exc)
            )
        ) from None


def run_check(title: str, probes: Callable[[], None]) -> CheckResult:
    """Run `probes`; print ✅, ❌ + hint, or ⏳ not done yet; never raise, but under `nbgrader validate` (chapter 1)."""
    result = _checked(title, probes)
    if result.status == PASS:
        line = tr("✅ {title}: {why}.").format(title=title, why=result.message)
    elif result.status == FAIL:
        line = tr("❌ {title}: {why}").format(title=title, why=result.message)
    else:
        line = tr("⏳ {title}: {why}.").format(title=title, why=result.message)
    print(line)
    if result.status != PASS and os.environ.get("NBGRADER_EXECUTION") == "validate":
        raise CheckFailed(line)  # nbgrader's Validate button reports a check that is not ✅
    return result


def _checked(title: str, probes: Callable[[], None]) -> CheckResult:
    """Run `probes` and say how it went: ✅, ❌ with the hint, or ⏳ for a stub (chapter 1)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            probes()
    except CheckFailed as exc:
        return CheckResult(title, FAIL, str(exc))
    except Exception as exc:
        if is_stub_error(exc):
            return CheckResult(
                title, TODO, tr("not done yet: replace `raise NotImplementedError` with your code")
            )
        return CheckResult(
            title, FAIL, tr("your code raised {error}").format(error=describe_error(exc))
        )
    return CheckResult(title, PASS, tr("correct"))


@contextmanager
def work_order(module: nn.Module, first_weight: torch.Tensor) -> Iterator[list[str]]:
    """Record 'forward' per call of `module`, 'backward' per gradient of `first_weight` (chapter 5)."""
    events: list[str] = []
    hooks = [
        module.register_forward_pre_hook(lambda m, a: events.append("forward")),
        first_weight.register_hook(lambda g: events.append("backward")),
    ]
    try:
        yield events
    finally:
        for h in hooks:
            h.remove()


def forwards_at_once(events: list[str]) -> int:
    """The most forwards that ran back to back with no backward between them (chapter 5)."""
    runs = "".join("f" if e == "forward" else "b" for e in events).split("b")
    return max((len(run) for run in runs), default=0)


def one_backward_per_forward_hint(together: int) -> str:
    """The hint for accumulation that ran several forwards before one backward (chapter 5)."""
    return tr(
        "you ran {together} forwards before a backward (expected forward, backward, forward, "
        "backward, ...): every micro-batch's activations were alive at once, which is what "
        "accumulation avoids. Call backward() on each micro-batch's loss before the next "
        "forward, not once on the summed loss."
    ).format(together=together)


def torchrun_environment(rank: int, world_size: int, master_port: int = 29500) -> dict[str, str]:
    """The variables torchrun sets for `rank` of a one-machine job of `world_size` ranks (chapter 4).

    An in-process probe of torchrun-style code sets them (with ``mock.patch.dict(os.environ,
    ...)``), so that an answer that reads ``RANK`` or ``WORLD_SIZE`` as a script would works.
    """
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world_size),
        "ROLE_NAME": "default",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
    }


def names_used(fn: Callable[..., object]) -> set[str]:
    """Global and attribute names a function's code (nested functions included) uses (chapter 7)."""
    names: set[str] = set()
    stack = [getattr(fn, "__code__", None)]
    while stack:
        code = stack.pop()
        if code is not None:
            names.update(code.co_names)
            stack += [c for c in code.co_consts if hasattr(c, "co_names")]
    return names
