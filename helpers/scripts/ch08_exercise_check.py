"""Runs a learner's function on every rank for the chapter 8 data-parallel exercise checks (chapter 8).

The checker (``helpers.checks.ch08_parallel``) sends the function as chapter 4's checker does
(its compiled code and the names it uses, ``--payload``); this script rebuilds it on each rank,
calls it in the exercise's situation and saves what happened (``--out``/rank<r>.pt): the values
the checker compares with one process's answer, and every collective the function called, in
order, with what it was given and whether its async work was waited for.

Tasks: ``overlap_hooks`` (all-reduce started from post-accumulate-grad hooks), ``zero1_step``
(a ZeRO-1 step from the rank's own gradients: reduce-scatter, Adam on the rank's piece,
all-gather). A flat collective given sizes that do not match (a flat gradient left unpadded)
raises a plain error in the rank before gloo's own check, which aborts the process on torch 2.5.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import itertools
import os
import pickle
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.variable import Variable
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.overrides import TorchFunctionMode

from helpers.checks import is_stub_error
from helpers.comm_overlap import shard_bounds
from helpers.data import make_classification_data
from helpers.i18n import tr, tr_mark
from helpers.models import make_mlp
from helpers.scripts.common import Context, exit_now, flat_params, grads, parser, setup, teardown
from helpers.scripts.exercise_check import rebuild

#: The MLP every task uses: 353 parameters, a multiple of neither 2 nor 3 (the shards are padded).
SIZES = (20, 16, 1)
PER_RANK_BATCH = 8
STEPS = 2
LR = 0.01
#: The collectives the recorder watches, by their name in torch.distributed: every name of
#: every torch from 2.5 on (torch 2.13 renamed all_gather_into_tensor to all_gather_single and
#: reduce_scatter_tensor to reduce_scatter_single); those the installed torch lacks are skipped.
WATCHED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
)


class RecordedWork:
    """An async collective's work, remembering whether anyone waited for it, and when (chapter 8)."""

    def __init__(self, work: Any, call: dict, state: dict) -> None:
        self.work, self.call, self.state = work, call, state

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        waited(self.call, self.state)
        return self.work.wait(*args, **kwargs)

    def get_future(self) -> Any:
        # waited for only when this future, or one chained from it, is waited for (WatchedFuture)
        return WatchedFuture(self.work.get_future(), [self.call], self.state)

    def is_completed(self) -> bool:
        done = self.work.is_completed()
        waited(self.call, self.state, done, poll=True)
        return done

    def __getattr__(self, name: str) -> Any:  # the rest of torch's Work: exception(), result() ...
        return getattr(self.work, name)


def waited(call: dict, state: dict, done: bool = True, poll: bool = False) -> None:
    """Note a wait on call's work: wait(), a future's wait(), or a poll that said done (chapter 8).

    A poll that said "not yet" and then "done" inside backward waited there (a busy wait in a
    hook); one that said "done" at once did not stop backward. A wait on an earlier step's work
    is noted in the state: a list finish() never cleared.
    """
    in_backward = state.get("in backward", False)
    if isinstance(call.get("step"), int) and call["step"] != state.get("step"):
        state["stale waits"] = True
    if not done:
        call["polled in backward"] = in_backward
        return
    call["waited"] = True
    blocked = not poll or call.get("polled in backward", False)
    call["waited in backward"] |= in_backward and blocked


#: Set while a learner's callback runs (.then, add_done_callback): its future is complete there,
#: so reading its value is no wait.
_IN_CALLBACK = threading.local()


def in_callback(callback: Any) -> Any:
    """callback, run with _IN_CALLBACK set (chapter 8)."""

    def run(fut: Any) -> Any:
        _IN_CALLBACK.on = True
        try:
            return callback(fut)
        finally:
            _IN_CALLBACK.on = False

    return run


class WatchedFuture(torch.futures.Future):
    """A collective's future, or one chained from it, noting when the learner waits on it (chapter 8).

    It completes with its source; wait() notes a wait on every collective it depends on,
    then() and add_done_callback() chain watched futures, done() True counts as a poll that
    said done. value() is no wait (torch's reads a future already complete and fails on one
    in flight): one before any wait is noted, and waited for here instead of failing, so that
    the check says so whatever the timing. torch.futures.wait_all and collect_all are watched
    in recording().
    """

    def __init__(self, source: Any, calls: list[dict], state: dict, links: list | None = None) -> None:  # fmt: skip
        super().__init__()
        self.calls, self.state = calls, state
        # the futures .then() returned that a wait on this one waits for: itself where it is one,
        # every one given to collect_all; each notes whether it was waited for, or chained on
        self.links: list[WatchedFuture] = [] if links is None else links
        self.waited_for, self.chained_on = False, False

        def settle(fut: Any) -> None:
            try:
                self.set_result(fut.value())
            except Exception as exc:  # noqa: BLE001 - the collective's own error, passed on
                self.set_exception(exc)

        source.add_done_callback(settle)

    def note(self, done: bool = True, poll: bool = False) -> None:
        """Note a wait on every collective this future depends on (chapter 8)."""
        if not getattr(_IN_CALLBACK, "on", False):
            for call in self.calls:
                waited(call, self.state, done, poll)

    def note_links(self) -> None:
        """Note a wait on the chained futures this one covers (chapter 8)."""
        if not getattr(_IN_CALLBACK, "on", False):
            for link in self.links:
                link.waited_for = True

    def wait(self) -> Any:
        self.note()
        self.note_links()
        return super().wait()

    def value(self) -> Any:
        early = [c for c in self.calls if not c["waited"]]
        if early and not getattr(_IN_CALLBACK, "on", False):
            for call in early:
                call["value before wait"] = True
            super().wait()  # torch's value() would fail on a future still in flight
        return super().value()

    def done(self) -> bool:
        done = super().done()
        self.note(done, poll=True)
        return done

    def then(self, callback: Any) -> Any:
        # a division chained here is done once the future .then() returns is: on NCCL the
        # callback runs on a side stream that work.wait() does not order the optimizer after,
        # and on gloo the source future's wait() may return before the callback has run
        self.chained_on = True
        chained = WatchedFuture(super().then(in_callback(callback)), self.calls, self.state)
        chained.links = [chained]
        for call in self.calls:
            call.setdefault("_chained", []).append(chained)
        return chained

    def add_done_callback(self, callback: Any) -> None:
        super().add_done_callback(in_callback(callback))


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a is all of b's elements, in place: b itself, b.data, b.detach(), or a view of
    all of it (b.view(-1), b.flatten() of a contiguous b) (chapter 8)."""
    return a is b or (
        a.numel() == b.numel()
        and a.data_ptr() == b.data_ptr()
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and (a.is_contiguous() and b.is_contiguous() or a.stride() == b.stride())
    )


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b share memory: one is a view of the other, or both of one tensor (chapter 8)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() != 0


#: The flat collectives: (output, input) tensors, the output world times the input (an all-gather)
#: or the input world times the output (a reduce-scatter).
FLAT = {
    "all_gather_into_tensor": "gather",
    "all_gather_single": "gather",
    "reduce_scatter_tensor": "scatter",
    "reduce_scatter_single": "scatter",
}
_UNEVEN = tr_mark(
    "{name} was given a flat tensor of {flat} elements and a piece of {piece}, on {world} "
    "rank(s): the flat one must hold exactly world x piece = {want} elements. Pad the flat "
    "vector with zeros to world x shard.numel() (F.pad(flat, (0, world * s - flat.numel()))), "
    "so that every rank's piece has the same size."
)


def same_sizes(name: str, output: Any, given: Any) -> None:
    """Raise a plain error here, before gloo's own check aborts the process (torch 2.5) (chapter 8)."""
    if name not in FLAT or not (torch.is_tensor(output) and torch.is_tensor(given)):
        return
    world = dist.get_world_size()
    flat, piece = (output, given) if FLAT[name] == "gather" else (given, output)
    if flat.numel() != world * piece.numel():
        raise ValueError(
            tr(_UNEVEN).format(
                name=f"dist.{name}",
                flat=flat.numel(),
                piece=piece.numel(),
                world=world,
                want=world * piece.numel(),
            )  # fmt: skip
        )


#: Numbers every recorded collective of this process, the same on every rank while they agree.
_SEQUENCE = itertools.count()
_MISMATCH = tr_mark(
    "the ranks called different collectives: this rank's collective number {n} is {mine}, "
    "rank {other}'s is {theirs}. Every rank must call the same collectives in the same order, "
    "or they pair with the wrong partner and wait for ever. A collective under `if "
    "dist.get_rank() == 0:` runs on one rank only: call dist.broadcast(t, src=0) on every rank "
    "(src says which one sends)."
)


def same_collective(name: str) -> None:
    """Raise when another rank's collective of the same number is another one (chapter 8).

    Through the group's store, not a collective: each rank notes its call, then reads the
    others' of that number; of two ranks, the later to note sees the earlier one's, so a
    mismatch is said at once, not after the group's timeout.
    """
    world = dist.get_world_size()
    if world == 1:
        return
    n, rank = next(_SEQUENCE), dist.get_rank()
    try:
        store = dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError):  # no store to compare through: gloo's timeout says it
        return
    store.set(f"course_ch08_collective/{n}/{rank}", name)
    for other in range(world):
        key = f"course_ch08_collective/{n}/{other}"
        if other != rank and store.check([key]):
            theirs = store.get(key).decode()
            if theirs != name:
                raise RuntimeError(
                    tr(_MISMATCH).format(
                        n=n + 1, mine=f"dist.{name}", other=other, theirs=f"dist.{theirs}"
                    )
                )


def watch_futures(state: dict) -> dict[str, Any]:
    """torch.futures.wait_all and collect_all, noting a wait on the watched futures given (chapter 8)."""
    real_wait_all, real_collect_all = torch.futures.wait_all, torch.futures.collect_all

    def wait_all(futures: list) -> list:
        for fut in futures:
            if isinstance(fut, WatchedFuture):
                fut.note()
                fut.note_links()
        return real_wait_all(futures)

    def collect_all(futures: list) -> Any:
        watched = [f for f in futures if isinstance(f, WatchedFuture)]
        calls = [c for f in watched for c in f.calls]
        links = [link for f in watched for link in f.links]
        return WatchedFuture(real_collect_all(futures), calls, state, links)

    return {"wait_all": wait_all, "collect_all": collect_all}


def tensors_in(value: Any) -> list[torch.Tensor]:
    """The tensors a collective was given as one argument: a tensor, or a list of them (chapter 8)."""
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for t in value if torch.is_tensor(t)]
    return []


def buffer_bytes(name: str, first: Any, second: Any) -> int:
    """Bytes of the whole buffer a collective moves: the flat (or listed) one of a gather or a
    scatter, the tensor of an all-reduce or a broadcast (chapter 8)."""
    scatters = name.startswith("reduce_scatter") or name == "scatter"
    whole = tensors_in(second if scatters else first)
    return sum(t.numel() * t.element_size() for t in whole)


#: The process group's own methods the recorder watches, under the dist name they count as
#: (pg.allreduce([t]) is the all-reduce dist.all_reduce(t) runs); always async, they return a work.
GROUP_METHODS = {
    "allreduce": "all_reduce",
    "_allgather_base": "all_gather_single",
    "_reduce_scatter_base": "reduce_scatter_single",
}

#: Set while a watched collective runs: a watched one it calls (a deprecated name calls the new
#: one, dist.all_reduce the group's allreduce) is the same collective, not another.
_INSIDE = threading.local()


def recorder(params: list[torch.Tensor], state: dict, calls: list[dict]) -> Any:
    """A function that records one collective's call and runs it: see recording() (chapter 8)."""

    def record(name: str, real: Any, first: Any, second: Any, async_op: bool) -> Any:
        _INSIDE.on = True  # the recorder's own reads of the gradients are no learner's
        try:
            return recorded(name, real, first, second, async_op)
        finally:
            _INSIDE.on = False

    def recorded(name: str, real: Any, first: Any, second: Any, async_op: bool) -> Any:
        tensor = next(iter(tensors_in(first) or tensors_in(second)), None)
        done = [p.grad for p in params if p.grad is not None]  # gradients accumulated so far
        grad_of = next(
            (
                i
                for i, p in enumerate(params)
                if p.grad is not None and tensor is not None and same_memory(tensor, p.grad)
            ),
            None,
        )
        record = {
            "op": name,
            "async": async_op,
            "in backward": state.get("in backward", False),
            "step": state.get("step"),  # exercise 3's steps: None at setup and in exercise 4
            "own thread": threading.get_ident() == state.get("thread", threading.get_ident()),
            "is a grad": grad_of is not None,
            # started in the hook of the gradient it reduces: the one accumulated last
            "own hook": grad_of is not None and grad_of == state.get("latest"),
            "grad of": grad_of,
            "a copy of a grad": tensor is not None
            and grad_of is None
            and any(tensor.shape == g.shape and torch.equal(tensor, g) for g in done),
            "a parameter": tensor is not None and any(same_storage(tensor, p) for p in params),
            "param shape": tensor is not None and any(tensor.shape == p.shape for p in params),
            "bytes": buffer_bytes(name, first, second),
            "waited": False,
            "waited in backward": False,
            "value before wait": False,
            "written in flight": False,
            "params written in flight": False,
            "read in flight": False,
            "pending at step": False,
            # for WriteWatch and the state count, dropped from the results (public())
            "_tensors": tensors_in(first) + tensors_in(second),
            "_outputs": tensors_in(first),  # the output, or the tensor reduced in place
            # what an all-gather sends, as it was when called (zero1_probe compares it with the
            # shard before and after optimizer.step())
            "_sent": [t.detach().clone() for t in tensors_in(second)]
            if name.startswith("all_gather")
            else [],
        }
        calls.append(record)
        same_collective(name)
        same_sizes(name, first, second)
        work = real()
        return RecordedWork(work, record, state) if work is not None else None

    return record


def span(t: torch.Tensor) -> tuple[int, int, int]:
    """(storage, first byte, one past the last byte) of the memory a tensor covers (chapter 8)."""
    if not t.numel():
        return 0, 0, 0
    extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return t.untyped_storage().data_ptr(), t.data_ptr(), t.data_ptr() + extent * t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether a and b cover some of the same memory (chapter 8)."""
    (sa, lo_a, hi_a), (sb, lo_b, hi_b) = span(a), span(b)
    return sa == sb != 0 and lo_a < hi_b and lo_b < hi_a


def written(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """The tensors a torch function writes in place: self of div_, /=, copy_, _foreach_div_ or
    t[i] = ..., out= of torch.div(..., out=) (chapter 8)."""
    name = getattr(func, "__name__", "")
    in_place = name == "__setitem__" or (
        name.endswith("_") and not name.startswith("__") and name not in _NO_WRITE
    )
    in_place |= name.startswith("__i") and name.endswith("__")  # __iadd__, __itruediv__ ...
    return (tensors_in(args[0]) if in_place and args else []) + tensors_in(kwargs.get("out"))


#: Names ending in "_" that write no tensor's values.
_NO_WRITE = {"requires_grad_", "share_memory_", "retain_grad_"}
#: Torch functions that read no tensor's values: its metadata, or a view of it.
_NO_READ = {
    "__get__", "__len__", "__getitem__", "numel", "size", "dim", "element_size", "data_ptr",
    "is_contiguous", "stride", "storage_offset", "untyped_storage", "view", "view_as",
    "reshape", "flatten", "unflatten", "split", "chunk", "narrow", "unbind", "detach",
    "is_floating_point", "is_complex", "get_device", "nelement", "ndimension", "is_pinned",
    "is_shared", "is_same_size", "is_inference", "is_signed", "empty_like", "zeros_like",
    "ones_like", "full_like", "rand_like", "randn_like", "randint_like", "new_empty",
    "new_zeros", "new_ones", "new_full",
}  # fmt: skip


def reads_values(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether a torch call reads its tensors' values, not only their shape, dtype or device (chapter 8).

    t.type() with no dtype names the type; t.type(torch.float64) converts, a read.
    """
    name = getattr(func, "__name__", "")
    return name not in _NO_READ and not (name == "type" and len(args) <= 1 and not kwargs)


def given_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Every tensor a torch function was given, alone or in a list (chapter 8)."""
    return [t for value in (*args, *kwargs.values()) for t in tensors_in(value)]


class WriteWatch(TorchFunctionMode):
    """Notes the learner's in-place writes, in its own thread, into an async collective's tensors
    (or, for an all-gather, into the parameters), and its reads of the collective's output,
    before its wait (chapter 8).

    Seen as torch functions (a mode, so only in the thread that runs the learner's code and its
    hooks: run_backward keeps it on during backward): p.grad /= world in the hook while its
    all-reduce travels, the parameters copied from an all-gather's buffer before its wait, and
    p.grad / world or p.grad.clone() before the wait (an all-reduce's output is p.grad itself,
    reduced in place). The collective's own writes (in gloo's threads, or inside the call), the
    recorder's and the checker's own reads (unwatched()) and what a callback chained with
    .then() does (once the collective is complete) are no race; nor is a view of the output, a
    look at its size, or a read of another tensor (another parameter's gradient).
    """

    def __init__(self, calls: list[dict], params: list[torch.Tensor]) -> None:
        super().__init__()
        self.calls, self.params = calls, params

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:  # fmt: skip
        kwargs = kwargs or {}
        busy = getattr(_INSIDE, "on", False) or getattr(_IN_CALLBACK, "on", False)
        pending = [] if busy else [c for c in self.calls if c.get("async") and not c["waited"]]
        writes = written(func, args, kwargs) if pending else []
        reads = given_tensors(args, kwargs) if pending and reads_values(func, args, kwargs) else []  # fmt: skip
        for call in pending:
            if any(overlaps(w, t) for w in writes for t in call["_tensors"]):
                call["written in flight"] = True
            if call["op"].startswith("all_gather") and any(
                overlaps(w, p) for w in writes for p in self.params
            ):
                call["params written in flight"] = True
            if any(overlaps(r, t) for r in reads for t in call["_outputs"]):
                call["read in flight"] = True
        return func(*args, **kwargs)


@contextlib.contextmanager
def unwatched() -> Iterator[None]:
    """The checker's own torch calls inside recording(): no learner's read or write (chapter 8)."""
    before = getattr(_INSIDE, "on", False)
    _INSIDE.on = True
    try:
        yield
    finally:
        _INSIDE.on = before


def run_backward(loss: torch.Tensor) -> None:
    """loss.backward() through autograd's engine itself, so that a torch-function mode stays on
    in the hooks (loss.backward() would take it off for the whole backward) (chapter 8)."""
    Variable._execution_engine.run_backward(
        (loss,), (torch.ones_like(loss),), False, False, (), True, True
    )  # tensors, grads, keep_graph, create_graph, inputs, allow_unreachable, accumulate_grad


def public(call: dict) -> dict:
    """A recorded call without its tensors and counters, as the results keep it (chapter 8).

    "then not waited": a future chained on its work with .then(), at the end of its chain,
    that nobody waited for.
    """
    chained = call.get("_chained", [])
    return {k: v for k, v in call.items() if not k.startswith("_")} | {
        "then not waited": any(not f.waited_for and not f.chained_on for f in chained)
    }


@contextlib.contextmanager
def recording(params: list[torch.Tensor], state: dict, spaces: tuple[dict, ...] = ()) -> Iterator[list[dict]]:  # fmt: skip
    """Record every watched collective called inside: name, async, in backward, grad or not (chapter 8).

    Patched in torch.distributed, in distributed_c10d (where torch defines them), under any name
    in `spaces` (the learner's globals: `from torch.distributed import all_reduce` ran before
    the patch), and as the process group's own methods (GROUP_METHODS). Arguments by position
    or by keyword, as each collective's signature names them. A watched collective that calls
    another (torch 2.13's deprecated names call the new ones) counts once, under the name the
    learner called.
    """
    calls: list[dict] = []
    record = recorder(params, state, calls)
    real = {name: getattr(dist, name) for name in WATCHED if hasattr(dist, name)}

    def watch(name: str) -> Any:
        signature = inspect.signature(real[name])
        first, second = (list(signature.parameters) + [""])[:2]

        def call(*args: Any, **kwargs: Any) -> Any:
            def run() -> Any:
                return real[name](*args, **kwargs)

            if getattr(_INSIDE, "on", False):
                return run()
            try:
                given = signature.bind(*args, **kwargs).arguments
            except TypeError:
                return run()  # torch's own error for arguments that fit no signature
            async_op = bool(given.get("async_op", False))
            return record(name, run, given.get(first), given.get(second), async_op)

        return call

    def watch_method(method: str) -> Any:
        real_method = getattr(dist.ProcessGroup, method)

        def call(group: Any, *args: Any, **kwargs: Any) -> Any:
            def run() -> Any:
                return real_method(group, *args, **kwargs)

            if getattr(_INSIDE, "on", False):
                return run()
            first, second = (list(args) + [None, None])[:2]
            return record(GROUP_METHODS[method], run, first, second, True)

        return call

    watched = {name: watch(name) for name in real}
    futures = watch_futures(state)
    by_object = {id(real[n]): f for n, f in watched.items()}
    by_object.update({id(getattr(torch.futures, n)): f for n, f in futures.items()})
    patches = [
        (owner, n, f)
        for n, f in watched.items()
        for owner in (dist, dist.distributed_c10d)
        if n in vars(owner)
    ]  # fmt: skip
    patches += [(torch.futures, n, f) for n, f in futures.items()]
    patches += [
        (dist.ProcessGroup, m, watch_method(m))
        for m in GROUP_METHODS
        if m in vars(dist.ProcessGroup)
    ]  # fmt: skip
    undo = []
    try:
        for owner, name, fn in patches:
            # the class's own entry, not getattr's: a method of a compiled class read through
            # the class is no longer bound to its instances once set back
            undo.append((owner, name, vars(owner)[name]))
            setattr(owner, name, fn)
        for space in spaces:
            for name, value in list(space.items()):
                if id(value) in by_object:
                    undo.append((space, name, value))
                    space[name] = by_object[id(value)]
        with WriteWatch(calls, params):
            yield calls
    finally:
        for owner, name, fn in reversed(undo):
            if isinstance(owner, dict):
                owner[name] = fn
            else:
                setattr(owner, name, fn)


def rank_batch(ctx: Context, step: int, dtype: torch.dtype = torch.float32) -> tuple:
    """This rank's slice of step `step`'s global batch (chapter 8)."""
    x, y = make_classification_data(PER_RANK_BATCH * ctx.world_size, seed=20 + step)
    rows = slice(ctx.rank * PER_RANK_BATCH, (ctx.rank + 1) * PER_RANK_BATCH)
    return x[rows].to(dtype), y[rows].to(dtype)


def local_grads(ctx: Context, step: int) -> list[torch.Tensor]:
    """This rank's own gradients of step `step`, before any all-reduce: a plain backward of a twin (chapter 8)."""
    twin, (x, y) = make_mlp(SIZES, seed=3), rank_batch(ctx, step)
    nn.functional.binary_cross_entropy_with_logits(twin(x), y).backward()
    return grads(twin)


def task_overlap_hooks(ctx: Context, fn: Any) -> dict[str, Any]:
    """The learner's hooks on a fresh model, then two steps of backward + finish() (chapter 8).

    Each step also records this rank's own gradients, from a twin model without hooks (the same
    weights, batch and operations on the same rank: bit for bit what the learner's model had in
    .grad before any all-reduce), from which the checker computes the exact mean over the ranks.
    """
    model = make_mlp(SIZES, seed=3)
    params, weights = list(model.parameters()), flat_params(model)
    state: dict[str, Any] = {"thread": threading.get_ident()}  # where backward runs the hooks
    steps = []
    for i, p in enumerate(params):  # registered first, so it runs before the learner's hook
        p.register_post_accumulate_grad_hook(lambda p, i=i: state.update(latest=i))
    with recording(params, state, (getattr(fn, "__globals__", {}),)) as calls:
        finish = fn(model)
        setup = [public(c) for c in calls]
        for step in range(STEPS):
            model.zero_grad(set_to_none=True)
            x, y = rank_batch(ctx, step)
            loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
            start, state["in backward"], state["latest"] = len(calls), True, None
            state["step"], state["stale waits"] = step, False
            run_backward(loss)
            state["in backward"], state["latest"] = False, None
            if callable(finish):
                finish()
            with unwatched():  # reading p.grad here is the checker's, even of a work never waited
                missing = [p for p in params if p.grad is None]
                got = None if missing else grads(model)
                steps.append(
                    {
                        "grads": got,
                        "local grads": local_grads(ctx, step),
                        "calls": [public(c) for c in calls[start:]],
                        "stale waits": state["stale waits"],
                    }
                )
        for record, call in zip(setup, calls):
            record["waited"] = call["waited"]  # a setup work waited for later, in a step
    return {
        "finish callable": callable(finish),
        "setup calls": setup,
        "steps": steps,
        "moved": not flat_params(model).equal(weights),
        "params": len(params),
    }


def flat_grad(params: list[torch.Tensor], padded: int) -> torch.Tensor:
    """This rank's own gradients as one flat CPU vector, zero-padded to `padded` elements (chapter 8)."""
    flat = torch.cat([p.grad.detach().reshape(-1).cpu() for p in params])
    return nn.functional.pad(flat, (0, padded - flat.numel()))


def state_bytes(optimizers: list[torch.optim.Optimizer]) -> int:
    """Bytes of the optimizers' state tensors, Adam's moments (scalar step counters left out) (chapter 8)."""
    return sum(
        t.numel() * t.element_size()
        for o in optimizers
        for s in o.state.values()
        for t in s.values()
        if torch.is_tensor(t) and t.dim()
    )


#: Objects whose attributes hold no state of the learner's: walked past by reachable_tensors.
_OPAQUE = (
    type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType,
    functools.partial, str, bytes, int, float, complex, bool, type(None),
)  # fmt: skip


def reachable_tensors(roots: list[Any], limit: int = 20_000) -> list[torch.Tensor]:
    """Every tensor reachable from `roots` through containers and objects' attributes (chapter 8).

    What an optimizer object holds between steps: its state and param_groups, and whatever the
    learner hung on it (optimizer.full_state = {...}, optimizer.buffers = [...]).
    """
    found, seen, todo = [], set(), list(roots)
    while todo and len(seen) < limit:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        if torch.is_tensor(obj):
            found.append(obj)
        elif isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            todo += list(obj)
        else:
            with contextlib.suppress(TypeError):  # an object without a __dict__
                todo += list(vars(obj).values())
    return found


def held_bytes(roots: list[Any], exclude: list[torch.Tensor]) -> int:
    """Bytes of the storages of the tensors reachable from `roots`, each once, those of `exclude` left out (chapter 8)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    total, counted = 0, set()
    for t in reachable_tensors(roots):
        if not t.dim() or not t.numel():
            continue  # a step counter, or nothing
        storage = t.untyped_storage()
        if storage.data_ptr() not in skip | counted:
            counted.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def recorded_step(
    real_step: Any, shard: torch.Tensor, calls: list[dict], seen: dict, *args: Any, **kwargs: Any
) -> Any:
    """optimizer.step(), noting the call, the async collectives not yet waited for and the
    shard's gradient at that moment (chapter 8)."""
    for call in calls:
        if call.get("async") and not call["waited"]:
            call["pending at step"] = True  # the step reads what it may still be writing
    calls.append({"op": "step"})
    grad = shard.grad
    seen["grad"] = None if grad is None else grad.detach().cpu().clone()
    seen["grad storage"] = None if grad is None else grad.untyped_storage().nbytes()
    return real_step(*args, **kwargs)


def adam_state(opt: torch.optim.Optimizer, shard: torch.Tensor) -> dict[str, Any] | None:
    """The state the given Adam holds for the shard: its moments and step count (chapter 8)."""
    state = opt.state.get(shard) if isinstance(opt.state, dict) else None
    if not state:
        return None
    return {
        k: (v.detach().cpu().clone() if v.dim() else float(v)) if torch.is_tensor(v) else v
        for k, v in state.items()
        if k in ("exp_avg", "exp_avg_sq", "step")
    }


def zero1_probe(ctx: Context, fn: Any, dtype: torch.dtype) -> list[dict[str, Any]]:
    """Two ZeRO-1 steps of the learner's from this rank's own gradients, with what they did (chapter 8).

    Each step records this rank's own flat padded gradient (before any collective), the
    shard's gradient when the learner called optimizer.step() (the averaged piece it must be)
    and the size of the memory it keeps alive, the parameters before and after, the optimizer
    state held (Adam's state for the shard, and every tensor kept on the optimizer object or
    in the optimizers stepped), every collective called and whether an all-gather sent this
    rank's piece as it was before optimizer.step(); the checker computes the exact mean over
    the ranks and full Adam's parameters from them.
    """
    model = make_mlp(SIZES, seed=3).to(dtype)
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    start, stop, size = shard_bounds(numel, ctx.world_size, ctx.rank)
    flat = nn.functional.pad(flat_params(model), (0, ctx.world_size * size - numel))
    shard = flat[start:stop].clone()
    opt = torch.optim.Adam([shard], lr=LR, foreach=False)
    out, state, real_step = [], {}, opt.step
    for step in range(STEPS):
        model.zero_grad(set_to_none=True)
        x, y = rank_batch(ctx, step, dtype)
        nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
        local = flat_grad(params, ctx.world_size * size)  # this rank's own, not averaged
        before, shard_before = flat_params(model), shard.detach().clone()
        storage, seen = [p.data_ptr() for p in params], {}
        stepped: dict[int, torch.optim.Optimizer] = {}
        counted = register_optimizer_step_post_hook(
            lambda o, args, kwargs, _seen=stepped: _seen.setdefault(id(o), o)
        )  # every optimizer the learner steps, the one given or another

        try:
            with recording(params, state, (getattr(fn, "__globals__", {}),)) as calls:
                opt.step = functools.partial(recorded_step, real_step, shard, calls, seen)
                fn(params, shard, opt)
        finally:
            opt.step = real_step
            counted.remove()
        # the collectives' own buffers (a flat gradient kept for the next step) are no state
        buffers = [t for c in calls for t in c.get("_tensors", [])]
        stepped_shard = shard.detach()
        sent = [torch.cat([t.reshape(-1) for t in c["_sent"]]) for c in calls if c.get("_sent")]
        out.append(
            {
                "before": before,
                "after": flat_params(model),
                "local grad": local,
                "shard grad": seen.get("grad"),
                "shard grad storage": seen.get("grad storage"),
                "shard moved": not torch.equal(stepped_shard, shard_before),
                # an all-gather sent the gradient piece (shard.grad's values at the step), not
                # the parameters. Not compared with a reduce-scatter's output: a right answer
                # may receive into its slot of the gather buffer and copy the stepped shard there
                "sent gradient": any(
                    grad is not None
                    and piece.shape == grad.shape
                    and torch.equal(piece.to(grad.dtype), grad)
                    for grad in [seen.get("grad")]
                    for piece in sent
                ),
                # an all-gather sent this rank's piece as it was before optimizer.step(): copied
                # into the gather buffer, or cloned, before the step stepped the shard
                "sent old piece": any(
                    piece.shape == shard_before.shape
                    and torch.equal(piece.to(shard.dtype), shard_before)
                    and not torch.equal(piece.to(shard.dtype), stepped_shard)
                    for piece in sent
                ),
                # the optimizer state this rank holds: every optimizer stepped, its tensors
                "state bytes": state_bytes(list(stepped.values()) or [opt]),
                "held bytes": held_bytes(
                    [opt, *stepped.values()], [*params, shard, *buffers, *tensors_in(shard.grad)]
                ),
                "adam state": adam_state(opt, shard),
                "other optimizers": len([k for k in stepped if k != id(opt)]),
                "shard bytes": shard.numel() * shard.element_size(),
                "replaced": [
                    i for i, (p, ptr) in enumerate(zip(params, storage)) if p.data_ptr() != ptr
                ],  # fmt: skip
                "calls": [public(c) for c in calls],
                "dtype": str(dtype),
                "shard": (start, stop),
            }
        )
    return out


def task_zero1_step(ctx: Context, fn: Any) -> dict[str, Any]:
    """The learner's ZeRO-1 step in float32, then in float64 (chapter 8)."""
    return {
        "float32": zero1_probe(ctx, fn, torch.float32),
        "float64": zero1_probe(ctx, fn, torch.float64),
    }


def run_task(task: str, ctx: Context, fn: Any) -> dict[str, Any]:
    """Run one task on this rank (or in the checker's own one-rank group) (chapter 8)."""
    if task == "overlap_hooks":
        return task_overlap_hooks(ctx, fn)
    return task_zero1_step(ctx, fn)


def error(exc: BaseException) -> dict[str, str]:
    """The learner's error as the checker reports it (chapter 8)."""
    return {"status": "error", "error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--payload", required=True, type=Path)
    p.add_argument("--task", required=True, choices=["overlap_hooks", "zero1_step"])
    args = p.parse_args()
    ctx = setup(args.pg_timeout)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.payload, "rb") as f:
        payload = pickle.load(f)
    result: dict[str, Any] = {"status": "ok"}
    try:
        result.update(run_task(args.task, ctx, rebuild(payload)))
    except NotImplementedError as exc:  # the learner's own raise is the stub; torch's is an error
        result = {"status": "todo"} if is_stub_error(exc) else error(exc)
    except Exception as exc:  # report the learner's error instead of crashing the job
        result = error(exc)
    torch.save(result, args.out / f"rank{ctx.rank}.pt")
    if result["status"] != "ok":
        # leave at once: the other ranks may be waiting in a collective this rank never joins
        # (teardown's barrier would wait for them until the group's timeout, and their
        # timeouts would bury this rank's own error); torchrun then stops them
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    teardown()


if __name__ == "__main__":
    main()
    exit_now()  # skip the slow interpreter shutdown: see common.exit_now
