"""Sharded training measured: live tensor bytes per rank, ZeRO's memory formulas, bytes on the wire (chapter 8).

- ``LiveBytes(device)``: the bytes of the tensors alive now, and the most alive at once since
  ``reset_peak()``. On CUDA it reads the caching allocator; elsewhere a ``TorchDispatchMode``
  records the storage of every tensor an operation returns while the meter is entered, and
  a weak reference tells when that storage is freed: what a laptop's CPU can measure.
- ``zero_formulas(numel, world, ...)``: each rank's bytes of parameters, gradients and
  optimizer state under DDP and ZeRO stages 1-3 (Rajbhandari et al. 2020, section 5).
- ``wire_bytes(op, nbytes, world, backend)``: the bytes one rank sends in a ring collective
  (what NCCL runs), or as the backend runs it: gloo runs a reduce-scatter as an all-reduce of a
  copy (pytorch/pytorch PR #118911), twice a ring reduce-scatter's traffic.
- ``bytes_written()``: what this process has written so far, sockets included (Linux's
  ``/proc/self/io``): gloo's real traffic on CPU processes, counted.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers.i18n import tr, tr_mark

#: The collectives ``wire_bytes`` knows, and the share of the buffer each rank sends in a ring,
#: in units of (world - 1) / world: an all-reduce is a reduce-scatter followed by an all-gather.
RING_SHARE = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1}
#: Collectives a backend runs as another one: gloo has no reduce-scatter of its own and runs it
#: as an all-reduce of a copy of the input, keeping this rank's piece (pytorch PR #118911).
EMULATED = {"gloo": {"reduce_scatter": "all_reduce"}}
#: What LiveBytes names the bytes a storage from before the step grew by in place (resize_);
#: kept in English in the results, translated where it is printed (helpers.dp_by_hand.peak_parts).
RESIZED = tr_mark("regrown in place")


def _tensors(out: Any) -> Iterable[torch.Tensor]:
    """The tensors in an operation's result: a tensor, or nested tuples and lists of them (chapter 8)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for item in out:
            yield from _tensors(item)


class _StorageWatch(TorchDispatchMode):
    """Hands every tensor an operation returns to a LiveBytes meter (chapter 8)."""

    def __init__(self, meter: LiveBytes) -> None:
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.meter.track(*_tensors(out), op=str(getattr(func, "overloadpacket", func)))
        return out


class LiveBytes:
    """Bytes of live tensors made while metering, now and at the peak: allocator on CUDA, storages elsewhere (chapter 8)."""

    def __init__(self, device: str | torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.how = (
            tr("the CUDA caching allocator")
            if self.cuda
            else tr("live tensor storages (a dispatch mode)")
        )
        self._live: dict[int, weakref.ref] = {}  # id of a storage -> a weak reference to it
        self._made_by: dict[int, str] = {}  # id of a storage -> the operation that returned it
        self._base: dict[int, weakref.ref] = {}  # the storages alive at reset_peak
        self._base_bytes: dict[int, int] = {}  # and their sizes then
        self._at_peak: dict[str, Any] | None = None
        self._mode = None if self.cuda else _StorageWatch(self)
        self.base = torch.cuda.memory_allocated(self.device) if self.cuda else 0
        self._peak = 0

    def __enter__(self) -> LiveBytes:
        if self._mode is not None:
            self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc)

    def track(self, *tensors: torch.Tensor, op: str = "") -> None:
        """Count the storages of `tensors` until they are freed (views share one); `op` made them (chapter 8)."""
        for t in tensors:
            t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's piece
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError):  # a wrapper without storage of its own
                continue
            # torch keeps a storage's Python object alive while the storage lives, so its id is
            # stable and the weak reference dies exactly when the memory is freed
            if id(storage) not in self._live:
                self._live[id(storage)] = weakref.ref(storage, self._forget(id(storage)))
                self._made_by[id(storage)] = op
        self._new_peak(op)

    def _forget(self, key: int) -> Any:
        """A weakref callback that drops `key` once its storage is freed (chapter 8)."""

        def drop(_ref: weakref.ref) -> None:
            self._live.pop(key, None)
            self._made_by.pop(key, None)

        return drop

    def _new_peak(self, op: str) -> None:
        """If more bytes are alive than ever since reset_peak, note them and what holds them (chapter 8)."""
        now = self.now()
        if now <= self._peak and self._at_peak is not None:
            return
        self._peak = now
        before, made = 0, []
        for key, ref in list(self._live.items()):
            s = ref()
            if s is None:
                continue
            if self._base.get(key) is ref:  # from before; what it grew by since is the step's
                grown = s.nbytes() - self._base_bytes.get(key, 0)
                before += s.nbytes() - max(grown, 0)
                if grown > 0:  # FSDP2 regrows its freed (size 0) gathered weights in place
                    made.append((RESIZED, grown))
            elif s.nbytes():
                made.append((self._made_by.get(key, ""), s.nbytes()))
        made.sort(key=lambda m: -m[1])
        self._at_peak = {"op": op, "from before": before, "made in the step": made}

    def at_peak(self) -> dict[str, Any] | None:
        """What was alive at the peak: the op that reached it, bytes alive since reset_peak, (op, bytes) of each newer storage; None on CUDA (chapter 8)."""
        if self.cuda:
            return None
        self._new_peak("")  # a storage resized since the last operation
        return self._at_peak

    def now(self) -> int:
        """Bytes alive now (chapter 8)."""
        if self.cuda:
            return torch.cuda.memory_allocated(self.device) - self.base
        # read the size now: a storage resized in place (FSDP2 frees its gathered weights so)
        return sum(s.nbytes() for s in (r() for r in list(self._live.values())) if s is not None)

    def settled(self) -> int:
        """Bytes alive once other threads have let go of what they still hold (chapter 8).

        A collective's worker thread (gloo's) drops its hold on the op's tensors just after the
        op returns, and on a tensor Python has seen that needs the interpreter lock: sleeping
        a millisecond lets it run. Read until two reads agree (50 ms at most).
        """
        now = self.now()
        for _ in range(50):
            time.sleep(0.001)
            now, before = self.now(), now
            if now == before:
                break
        return now

    def reset_peak(self) -> None:
        """Start a new peak from the bytes alive now (chapter 8)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        self._base = dict(self._live)
        self._base_bytes = {
            key: s.nbytes() for key, r in self._base.items() if (s := r()) is not None
        }
        self._peak, self._at_peak = 0, None
        self._new_peak("")

    def peak(self) -> int:
        """The most bytes alive at once since reset_peak (chapter 8)."""
        if self.cuda:
            return torch.cuda.max_memory_allocated(self.device) - self.base
        self._new_peak("")
        return self._peak


def wire_bytes(op: str, nbytes: int, world: int, backend: str = "nccl") -> float:
    """Bytes one rank sends for a ring collective on a buffer of `nbytes` (the full one), as `backend` runs it (chapter 8)."""
    if op not in RING_SHARE:
        raise ValueError(
            tr("Unknown collective {op!r}; known: {known}.").format(
                op=op, known=", ".join(RING_SHARE)
            )
        )
    op = EMULATED.get(backend, {}).get(op, op)
    return nbytes * RING_SHARE[op] * (world - 1) / world


def bytes_written() -> int | None:
    """Bytes this process has written so far, sockets included (Linux /proc/self/io); None elsewhere (chapter 8).

    gloo on CPU processes sends through sockets, so the difference around a step is what the
    step put on the wire, plus gloo's small header per message (288 B on torch 2.13, measured 2026-11-28).
    NCCL moves data over NVLink, PCIe or the network without writing to a socket: not seen.
    """
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def sent_since(backend: str, since: int | None = None) -> int | None:
    """On gloo: bytes_written(), or the bytes written since `since`; None on other backends or off Linux (chapter 8)."""
    now = bytes_written() if backend == "gloo" else None
    return None if now is None else now - (since or 0)


def zero_formulas(
    numel: int, world: int, param: int = 4, grad: int = 4, state: int = 8
) -> dict[str, int]:
    """Each rank's bytes of parameters + gradients + optimizer state, DDP and ZeRO-1/2/3 (chapter 8).

    `param`, `grad` and `state` are bytes per parameter (the paper's mixed-precision Adam:
    2, 2 and K = 12; fp32 Adam stepping the parameters themselves: 4, 4 and 8). A sharded
    part is a piece of ceil(numel / world) elements; a full part of the padded vector is
    world pieces (what the chapter's flat buffers hold), numel itself for DDP.
    """
    piece = -(-numel // world)
    padded = world * piece
    return {
        "DDP": (param + grad + state) * numel,
        "ZeRO-1": (param + grad) * padded + state * piece,
        "ZeRO-2": param * padded + (grad + state) * piece,
        "ZeRO-3 / FSDP": (param + grad + state) * piece,
    }


#: The formulas of zero_formulas in the ZeRO paper's notation: Ψ parameters, N ranks, K bytes of
#: optimizer state per parameter, p and g bytes per parameter and gradient (the paper's mixed
#: precision: p = g = 2, K = 12, its "2Ψ + 2Ψ + KΨ/N"; the chapter's fp32 Adam: 4, 4 and 8).
ZERO_FORMULAS = {
    "DDP": "(p + g + K)Ψ",
    "ZeRO-1": "(p + g)Ψ + KΨ/N",
    "ZeRO-2": "pΨ + (g + K)Ψ/N",
    "ZeRO-3 / FSDP": "(p + g + K)Ψ/N",
}


def metered_step(
    meter: LiveBytes,
    loss_fn: Callable[[], torch.Tensor],
    zero_grad: Callable[[], None],
    step: Callable[[], None],
    between: Callable[[], None] | None = None,
) -> dict[str, float]:
    """One training step under `meter`: bytes alive before it, at its peak, after it, and the loss (chapter 8).

    `between` runs after backward, unmetered (a comparison's own tensors), before `step`.
    """
    with meter:
        zero_grad()
        before = meter.settled()
        meter.reset_peak()
        loss = loss_fn()
        loss.backward()
        value = loss.item()
        del loss  # nothing of the forward is left for the step to hold
    if between is not None:
        between()
    with meter:
        step()
        peak, at_peak = meter.peak(), meter.at_peak()
        return {
            "before": before,
            "peak": peak,
            "at peak": at_peak,
            "after": meter.settled(),
            "loss": value,
        }


def free_now(t: torch.Tensor) -> None:
    """Free a tensor's memory now, though a finished collective's worker thread may still refer to it (chapter 8).

    gloo's worker thread lets go of a collective's tensors a moment after the collective has
    returned; until then their memory stays allocated. Resizing the storage to 0 bytes frees
    it at once (FSDP2 frees its gathered parameters the same way); `t` must not be read again.
    """
    t.untyped_storage().resize_(0)
