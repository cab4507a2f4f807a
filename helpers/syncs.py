"""Counting host syncs, the calls that make the CPU wait for a tensor's value, on any device (chapter 2)."""

from __future__ import annotations

import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from helpers.i18n import tr, tr_mark
from helpers.units import Printed

_T = torch.Tensor

#: Calls that need a tensor's value on the host, with the name the counter reports (the names
#: in words are marked for the catalog: the counter's printouts show them translated).
VALUE_READS: dict[Callable[..., Any], str] = {
    _T.item: ".item()",
    _T.tolist: ".tolist()",
    _T.numpy: ".numpy()",
    _T.cpu: ".cpu()",
    _T.__array__: "numpy.asarray(t)",
    _T.__repr__: tr_mark("print / repr"),
    _T.__format__: tr_mark("f-string format"),
    _T.__bool__: "bool(t) / if t:",
    _T.__int__: "int(t)",
    _T.__float__: "float(t)",
    _T.__index__: tr_mark("t used as an index"),
    _T.__complex__: "complex(t)",
    **{getattr(torch, name): f"torch.{name}" for name in ("equal", "allclose", "is_nonzero")},
    **{getattr(_T, name): f"t.{name}" for name in ("equal", "allclose", "is_nonzero")},
}

#: Calls whose output shape depends on the values, so the host must read them.
DATA_DEPENDENT: dict[Callable[..., Any], str] = {
    getattr(owner, name): name
    for name in ("nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount")
    for owner in (torch, _T)
}

#: Calls that sync only with some arguments (checked in :func:`_conditional_sync`).
CONDITIONAL: dict[Callable[..., Any], str] = {
    torch.where: "torch.where(condition)",
    _T.__getitem__: tr_mark("boolean-mask indexing"),
    _T.__setitem__: tr_mark("boolean-mask assignment"),
    torch.repeat_interleave: "repeat_interleave(tensor repeats)",
    _T.repeat_interleave: "repeat_interleave(tensor repeats)",
    _T.to: tr_mark(".to('cpu') from a device"),
    _T.copy_: tr_mark("copy_ from a device to the host"),
}

#: Code whose reads of CPU tensors stay host-side bookkeeping in a GPU run too (PyTorch itself,
#: the course's sampler): recorded, not counted. Your code's tensors would live on the GPU.
_TORCH_DIR = Path(torch.__file__).parent
HOST_SIDE_CODE: tuple[str, ...] = (str(_TORCH_DIR), str(Path(__file__).parent / "batching.py"))
_THIS_FILE = str(Path(__file__))
# Frames that only forward the call to the mode: the override machinery and the Python
# wrappers of the calls above (Tensor methods, torch.unique's dispatch), and this module.
_WRAPPERS = "overrides.py _tensor.py _tensor_str.py functional.py _jit_internal.py utils/_device.py"
_PLUMBING = tuple(str(_TORCH_DIR / name) for name in _WRAPPERS.split())

#: The start of torch's warning that set_sync_debug_mode is a prototype (chapter 2): the
#: counter says what it counts, so this is not passed on to the learner.
PROTOTYPE_NOTE = "Synchronization debug mode is a prototype feature"


@dataclass
class SyncEvent:
    """One call that reads a tensor's value on the host (chapter 2)."""

    what: str
    device: str
    where: str
    counted: bool


def _tensors_in(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors among the call's arguments, one level into lists and tuples (chapter 2)."""
    flat = [
        x for a in (*args, *kwargs.values()) for x in (a if isinstance(a, (list, tuple)) else [a])
    ]
    return [t for t in flat if isinstance(t, torch.Tensor)]


def _target_is_host(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """True if a .to(...) call moves to the CPU (chapter 2)."""
    for a in (*args[1:], kwargs.get("device")):
        if isinstance(a, (str, torch.device)):
            return torch.device(a).type == "cpu"
        if isinstance(a, torch.Tensor):
            return a.device.type == "cpu"
    return False


def _conditional_sync(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict) -> bool:
    """Whether a call from CONDITIONAL syncs with these arguments (chapter 2)."""
    if func is torch.where:
        return len(args) + len(kwargs) == 1
    if func in (_T.__getitem__, _T.__setitem__):  # a bool or uint8 mask in the index
        index = args[1] if len(args) > 1 else ()
        parts = index if isinstance(index, (tuple, list)) else (index,)
        return any(
            isinstance(p, torch.Tensor) and p.dtype in (torch.bool, torch.uint8) for p in parts
        )
    if func in (torch.repeat_interleave, _T.repeat_interleave):
        # torch.repeat_interleave(repeats) alone is the one-argument form
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats", args[0] if args else None)
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    source = args[1] if func is _T.copy_ and len(args) > 1 else args[0] if args else None
    if not isinstance(source, torch.Tensor) or source.device.type == "cpu":
        return False  # a CPU-to-CPU .to()/copy_ is not a read-back; see HOST_SIDE_CODE
    if func is _T.copy_:
        return isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu"
    return _target_is_host(args, kwargs)


def _caller(host_code: tuple[str, ...]) -> tuple[str, bool]:
    """'file:line' of the code that made the call, and whether it is host-side code (chapter 2)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name != _THIS_FILE and not name.startswith(_PLUMBING):
            return f"{Path(name).name}:{frame.f_lineno}", name.startswith(host_code)
        frame = frame.f_back
    return "?", False


class SyncCounter(TorchFunctionMode, Printed):
    """Count host reads of tensor values (what forces a GPU sync) inside a `with` block, on any device (chapter 2)."""

    def __init__(
        self, cuda_debug: bool | None = None, host_code: tuple[str, ...] = HOST_SIDE_CODE
    ) -> None:
        super().__init__()
        self.host_code = tuple(host_code)
        self.events: list[SyncEvent] = []
        self.cuda_debug = torch.cuda.is_available() if cuda_debug is None else cuda_debug
        if self.cuda_debug and not torch.cuda.is_available():
            raise RuntimeError(
                tr(
                    "cuda_debug=True needs a CUDA (or ROCm) GPU; leave it as None to use it "
                    "only where one exists."
                )
            )
        self.cuda_syncs: int | None = None
        self._previous_mode = 0
        self._warnings: Any = None
        self._caught: list[warnings.WarningMessage] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        what = VALUE_READS.get(func) or DATA_DEPENDENT.get(func)
        if what is None and func in CONDITIONAL and _conditional_sync(func, args, kwargs):
            what = CONDITIONAL[func]
        if what is not None:
            tensors = _tensors_in(args, kwargs)
            on_host = all(t.device.type == "cpu" for t in tensors)
            where, host_side = _caller(self.host_code)
            devices = "/".join(sorted({t.device.type for t in tensors})) or "?"
            self.events.append(SyncEvent(what, devices, where, not (on_host and host_side)))
        return func(*args, **kwargs)

    def __enter__(self) -> SyncCounter:
        self.events.clear()
        self.cuda_syncs = None
        if self.cuda_debug:
            self._previous_mode = torch.cuda.get_sync_debug_mode()
            self._warnings = warnings.catch_warnings(record=True)
            self._caught = self._warnings.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        if self.cuda_debug:
            torch.cuda.set_sync_debug_mode(self._previous_mode)
            self._warnings.__exit__(*exc)
            syncs = [w for w in self._caught if "synchronizing CUDA operation" in str(w.message)]
            self.cuda_syncs = len(syncs)
            for w in self._caught:  # hand every other warning back to the user, except
                # torch's note that the debug mode is a prototype, about the counter itself
                if w not in syncs and PROTOTYPE_NOTE not in str(w.message):
                    warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)

    @property
    def count(self) -> int:
        """How many host reads were counted, host-side bookkeeping left out (chapter 2)."""
        return sum(e.counted for e in self.events)

    @property
    def ignored(self) -> int:
        """Reads of CPU tensors by host-side code (PyTorch, the course's sampler): not syncs (chapter 2)."""
        return sum(not e.counted for e in self.events)

    def by_kind(self) -> Counter[str]:
        """Counted reads grouped by what did them, e.g. {'.item()': 157}; names in words in the learner's language (chapter 2)."""
        return Counter(tr(e.what) for e in self.events if e.counted)

    def by_place(self) -> Counter[str]:
        """Counted reads grouped by 'what at file:line' (chapter 2)."""
        return Counter(
            tr("{what} at {where}").format(what=tr(e.what), where=e.where)
            for e in self.events
            if e.counted
        )

    def __str__(self) -> str:
        kinds = ", ".join(f"{k} x{v}" for k, v in self.by_kind().most_common()) or tr("none")
        text = tr("{count} host sync(s): {kinds}").format(count=self.count, kinds=kinds)
        if self.ignored:
            text += tr(" (not counted: {n} host-side bookkeeping read(s) by PyTorch)").format(
                n=self.ignored
            )
        if self.cuda_syncs is not None:
            text += tr("; CUDA sync debug mode reported {n}").format(n=self.cuda_syncs)
        return text


def count_syncs(
    fn: Callable[..., Any], *args: Any, cuda_debug: bool | None = None, **kwargs: Any
) -> tuple[Any, SyncCounter]:
    """Run fn(*args, **kwargs) under a SyncCounter; return (its result, the counter) (chapter 2)."""
    if not callable(fn):
        raise TypeError(
            tr("count_syncs() needs a function to call, got {type}.").format(type=type(fn).__name__)
        )
    with SyncCounter(cuda_debug=cuda_debug) as counter:
        result = fn(*args, **kwargs)
    return result, counter


def sync_kinds() -> Iterator[tuple[str, str]]:
    """(kind, call) for every call the counter knows, for a table in the notebook; in the learner's language (chapter 2)."""
    tables = (
        (tr("reads a value"), VALUE_READS),
        (tr("data-dependent shape"), DATA_DEPENDENT),
        (tr("depends on the arguments"), CONDITIONAL),
    )
    calls = {name: kind for kind, table in tables for name in table.values()}  # each name once
    yield from ((kind, tr(name)) for name, kind in calls.items())
