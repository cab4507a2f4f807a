"""Activation bytes: measured on any device (ActivationMeter), predicted from shapes, and what
checkpointing them costs in FLOPs and time against the bytes it saves (chapter 5)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import checkpoint

from helpers.i18n import tr, tr_mark
from helpers.machine_state import MachineState, merge_states
from helpers.tables import format_table
from helpers.timing import BenchResult
from helpers.units import MiB, Printed, format_bytes
from helpers.validate import positive_int
from helpers.verdicts import Verdict, compare_rows

#: The column headers of the tables this module returns and prints, for the catalog: the rows
#: keep the English keys (notebooks look them up); format_table prints them translated.
_COLUMNS = (
    tr_mark("shape"), tr_mark("MiB"), tr_mark("checkpointing"), tr_mark("saved MiB"),
    tr_mark("FLOPs vs plain"), tr_mark("median ms"), tr_mark("IQR ms"), tr_mark("time vs plain"),
    tr_mark("layer"), tr_mark("output shape"), tr_mark("keeps"), tr_mark("bytes"),
    tr_mark("weight-copy bytes"),
)  # fmt: skip


def _storage_key(t: torch.Tensor) -> tuple[int, StorageWeakRef | None, int]:
    """(identity, weak reference, bytes) of a tensor's storage (chapter 5)."""
    try:
        storage = t.untyped_storage()
        ref = StorageWeakRef(storage)
        return ref.cdata, ref, storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):  # tensors without a plain storage
        return id(t), None, t.numel() * t.element_size()


class ActivationMeter(saved_tensors_hooks):
    """Context manager: unique storage bytes autograd saves for backward, parameters excluded (chapter 5)."""

    def __init__(self, *exclude: nn.Module | torch.Tensor) -> None:
        super().__init__(self._pack, lambda t: t)
        self._excluded: set[int] = set()  # the storages of parameters and buffers
        for src in exclude:
            if not isinstance(src, (nn.Module, torch.Tensor)):
                raise TypeError(
                    tr(
                        "ActivationMeter excludes modules or tensors, got {type}: "
                        "pass the model (its parameters are not activations)."
                    ).format(type=type(src).__name__)
                )
            tensors = [*src.parameters(), *src.buffers()] if isinstance(src, nn.Module) else [src]
            self._excluded.update(_storage_key(t)[0] for t in tensors)
        # storage key -> (weak reference, bytes, shape, dtype) of each distinct saved storage
        self._seen: dict[int, tuple[StorageWeakRef | None, int, tuple[int, ...], torch.dtype]] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        """Record the storage behind `t` once; hand autograd a detached alias (chapter 5)."""
        key, ref, nbytes = _storage_key(t)
        old = self._seen.get(key)
        if key not in self._excluded and (old is None or (old[0] is not None and old[0].expired())):
            self._seen[key] = (ref, nbytes, tuple(t.shape), t.dtype)
        return t.detach()

    def __enter__(self) -> ActivationMeter:
        super().__enter__()
        return self

    @property
    def total_bytes(self) -> int:
        """Sum of the bytes of every distinct saved storage (chapter 5)."""
        return sum(nbytes for _, nbytes, _, _ in self._seen.values())

    def table(self) -> list[dict[str, Any]]:
        """The saved storages with at least one byte as table rows: shape, dtype, MiB (chapter 5)."""
        return [
            {"shape": shape, "dtype": _short(dtype), "MiB": nbytes / MiB}
            for _, nbytes, shape, dtype in self._seen.values()
            if nbytes > 0
        ]


def checkpointed_forward(model: nn.Sequential, x: torch.Tensor, every: int) -> torch.Tensor:
    """Run `model` in segments of `every` children, each under checkpoint(use_reentrant=False) (chapter 5)."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(
            tr("checkpointed_forward needs an nn.Sequential, got {type}.").format(
                type=type(model).__name__
            )
        )
    every = positive_int(every, "every")
    children = list(model)
    for start in range(0, len(children), every):
        segment = nn.Sequential(*children[start : start + every])
        x = checkpoint(segment, x, use_reentrant=False)
    return x


#: CheckpointCost's default name of the plain step, for the catalog: a variant's name prints
#: translated where the catalog has it (the notebook's own names print as given).
_NO_CHECKPOINTING = tr_mark("no checkpointing")


@dataclass(repr=False)
class CheckpointCost(Printed):
    """One training step under each checkpointing variant: bytes saved, FLOPs and time against the plain step (chapter 5)."""

    title: str
    timings: dict[str, BenchResult]  # by variant name, the plain step's included
    flops: dict[str, int]  # FLOPs of one step, recomputation included (FlopCounterMode)
    saved: dict[str, int]  # bytes saved for backward in one forward (ActivationMeter)
    base: str = _NO_CHECKPOINTING

    def __post_init__(self) -> None:
        names = set(self.timings)
        if self.base not in names or set(self.flops) != names or set(self.saved) != names:
            raise ValueError(
                tr(
                    "CheckpointCost needs timings, FLOPs and saved bytes for the same variants, "
                    "{base!r} among them; got {timings}, {flops}, {saved}."
                ).format(
                    base=self.base,
                    timings=sorted(self.timings),
                    flops=sorted(self.flops),
                    saved=sorted(self.saved),
                )
            )

    def rows(self) -> list[dict[str, Any]]:
        """The printed table: one row per variant, numbers kept as numbers, names translated where the catalog has them (chapter 5)."""
        base = self.timings[self.base]
        return [
            {
                "checkpointing": tr(name),
                "saved MiB": self.saved[name] / MiB,
                "FLOPs vs plain": f"{self.flops[name] / self.flops[self.base]:.2f}x",
                "median ms": r.median * 1e3,
                "IQR ms": r.iqr * 1e3,
                "time vs plain": f"{r.median / base.median:.2f}x",
            }
            for name, r in self.timings.items()
        ]

    @property
    def machine(self) -> MachineState | None:
        """The busiest state over every timing of the table (chapter 5)."""
        return merge_states([r.machine for r in self.timings.values() if r.machine is not None])

    def extra_flops(self, name: str) -> float:
        """Recomputation's share of the plain step's FLOPs: 1/3 recomputes a whole forward (chapter 5)."""
        return self.flops[name] / self.flops[self.base] - 1

    def verdict(self, name: str) -> Verdict:
        """Variant `name` against the plain step: compare_rows on the printed medians (chapter 5)."""
        states = [self.timings[n].machine for n in (name, self.base)]
        return compare_rows(
            self.rows(),
            "checkpointing",
            tr(name),
            tr(self.base),
            "median ms",
            iqr="IQR ms",
            higher_is_better=True,  # a longer step is "more": the verdict says which was slower
            better="slower",
            machine=[s for s in states if s is not None] or None,
        )

    def line(self, name: str) -> str:
        """What variant `name` saved and what it cost, read from the table's rows (chapter 5)."""
        verdict, base_bytes = self.verdict(name), self.saved[self.base]
        extra = self.extra_flops(name)
        if self.saved[name] < base_bytes:
            return tr(
                "{name}: saved {saved} of {total} for backward, {extra:+.0%} FLOPs; {verdict}"
            ).format(
                name=tr(name),
                saved=format_bytes(base_bytes - self.saved[name]),
                total=format_bytes(base_bytes),
                extra=extra,
                verdict=verdict,
            )
        if verdict.conclusive and verdict.ratio > 1:  # slower for nothing
            text = tr(
                "{name}: saved nothing ({kept} for backward, as without checkpointing), "
                "{extra:+.0%} FLOPs; a pure cost: {verdict}"
            )
        else:
            text = tr(
                "{name}: saved nothing ({kept} for backward, as without checkpointing), "
                "{extra:+.0%} FLOPs; {verdict}"
            )
        return text.format(
            name=tr(name), kept=format_bytes(self.saved[name]), extra=extra, verdict=verdict
        )

    def __str__(self) -> str:
        lines = [self.title, format_table(self.rows())]
        if self.machine is not None:
            lines.append(str(self.machine))
        return "\n".join(lines)


def autocast_context(
    device_type: str, dtype: torch.dtype | None
) -> torch.autocast | nullcontext[None]:
    """torch.autocast(device_type, dtype), or a context that does nothing for dtype None (chapter 5)."""
    return nullcontext() if dtype is None else torch.autocast(device_type, dtype=dtype)


def unique_storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors`: views and aliases count once (chapter 5)."""
    seen: dict[int, int] = {}
    for t in tensors:
        key, _, nbytes = _storage_key(t)
        seen[key] = nbytes
    return sum(seen.values())


def measure_activation_bytes(
    model: nn.Module,
    x: torch.Tensor,
    *,
    autocast_dtype: torch.dtype | None = None,
    checkpoint_every: int = 0,
) -> int:
    """Bytes saved for backward by one forward of `model` on `x`, measured with the meter (chapter 5)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            tr("x must be a tensor (a batch of inputs), got {type}.").format(type=type(x).__name__)
        )
    with ActivationMeter(model) as meter, autocast_context(x.device.type, autocast_dtype):
        out = checkpointed_forward(model, x, checkpoint_every) if checkpoint_every else model(x)
    del out  # the meter keeps the bytes it read
    return meter.total_bytes


_KEYS = itertools.count()  # storage identities of the analytic count


@dataclass
class _Value:
    """A tensor flowing through the model, as the analytic count sees it; a new key is a new storage (chapter 5)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool
    key: int = field(default_factory=lambda: next(_KEYS))


@dataclass
class _Step:
    """One layer's effect: its output, what it keeps, and the bytes that adds (chapter 5)."""

    out: _Value
    keeps: str
    added: int = 0
    copies: int = 0


def _save(saved: set[int], value: _Value) -> int:
    """Mark a storage as saved; return the bytes this adds (0 if already saved) (chapter 5)."""
    if value.key in saved:
        return 0
    saved.add(value.key)
    return math.prod(value.shape) * value.dtype.itemsize


def _short(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bfloat16' (chapter 5)."""
    return str(dtype).removeprefix("torch.")


def _leaves(model: nn.Module) -> list[nn.Module]:
    """The layers of a (nested) nn.Sequential in execution order (chapter 5)."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(
            tr(
                "The analytic count follows an nn.Sequential, got {type}. "
                "For other models, measure with ActivationMeter instead."
            ).format(type=type(model).__name__)
        )
    out: list[nn.Module] = []
    for child in model:
        out += _leaves(child) if isinstance(child, nn.Sequential) else [child]
    return out


def _out_shape(layer: nn.Module, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The output shape of `layer` for an input of `shape`, as torch computes it on the meta device (chapter 5)."""
    weights = {k: torch.empty_like(t, device="meta") for k, t in layer.state_dict().items()}
    dtype = next(iter(weights.values())).dtype if weights else torch.float32
    x = torch.empty(shape, dtype=dtype, device="meta")
    return tuple(torch.func.functional_call(layer, weights, (x,)).shape)


def _matmul_layer(
    layer: nn.Linear | nn.Conv2d, v: _Value, saved: set[int], amp: torch.dtype | None
) -> _Step:
    """Linear and Conv2d: the input (cast under autocast) and, if needed, a weight copy (chapter 5)."""
    conv = isinstance(layer, nn.Conv2d)
    if not conv and v.shape[-1] != layer.in_features:
        raise ValueError(
            tr("{layer} got inputs with {n} features.").format(layer=layer, n=v.shape[-1])
        )
    if conv and v.shape[-3] != layer.in_channels:
        raise ValueError(tr("{layer} got {n} input channels.").format(layer=layer, n=v.shape[-3]))
    shape = _out_shape(layer, v.shape)
    w = layer.weight
    out_rg = v.requires_grad or any(p.requires_grad for p in layer.parameters())
    compute = amp or v.dtype
    if not out_rg:
        return _Step(_Value(shape, compute, False), tr("nothing (no gradient needed)"))
    inp = v if v.dtype == compute else _Value(v.shape, compute, v.requires_grad)
    step = _Step(_Value(shape, compute, True), "")
    kept = []
    # A convolution keeps its input and weight. A matmul keeps its input only if the weight
    # needs a gradient, and the weight only if the input needs one.
    if conv or w.requires_grad:
        added = _save(saved, inp)
        step.added += added
        what = (
            tr("input ({dtype} copy)").format(dtype=_short(compute))
            if inp is not v
            else tr("input")
        )
        kept.append(what if added else tr("{what} (already counted)").format(what=what))
    if (conv or v.requires_grad) and w.dtype != compute:
        copy = _save(saved, _Value(tuple(w.shape), compute, False))
        step.added, step.copies = step.added + copy, copy
        kept.append(tr("weight ({dtype} copy)").format(dtype=_short(compute)))
    step.keeps = " + ".join(kept) or tr("nothing")
    return step


_SAVES_OUTPUT = (nn.ReLU, nn.Sigmoid, nn.Tanh)
_SAVES_INPUT = (nn.GELU, nn.SiLU, nn.MaxPool2d)
_VIEWS = {nn.Flatten: tr_mark("nothing (a view)"), nn.Identity: tr_mark("nothing")}


def _layer(layer: nn.Module, v: _Value, saved: set[int], amp: torch.dtype | None) -> _Step:
    """Apply one layer's saving rule (chapter 5)."""
    if isinstance(layer, (nn.Linear, nn.Conv2d)):
        return _matmul_layer(layer, v, saved, amp)
    if not isinstance(layer, (*_SAVES_OUTPUT, *_SAVES_INPUT, *_VIEWS)):
        raise TypeError(
            tr(
                "The analytic count does not know what {type} saves for backward. "
                "Supported layers: Linear, Conv2d, ReLU, Sigmoid, Tanh, GELU, SiLU, MaxPool2d, "
                "Flatten, Identity. Measure other models with ActivationMeter."
            ).format(type=type(layer).__name__)
        )
    if isinstance(layer, nn.MaxPool2d) and layer.return_indices:
        raise ValueError(tr("The analytic count does not support MaxPool2d(return_indices=True)."))
    shape = _out_shape(layer, v.shape)
    if type(layer) in _VIEWS:
        return _Step(_Value(shape, v.dtype, v.requires_grad, v.key), tr(_VIEWS[type(layer)]))
    out = v if getattr(layer, "inplace", False) else _Value(shape, v.dtype, v.requires_grad)
    if not v.requires_grad:
        return _Step(out, tr("nothing (no gradient needed)"))
    if isinstance(layer, _SAVES_OUTPUT):
        return _Step(out, tr("output"), _save(saved, out))
    added = _save(saved, v)
    what = tr("input") if added else tr("{what} (already counted)").format(what=tr("input"))
    if isinstance(layer, nn.MaxPool2d):
        indices = _save(saved, _Value(shape, torch.int64, False))
        return _Step(out, tr("{what} + int64 indices").format(what=what), added + indices)
    return _Step(out, what, added)


def activation_table(
    model: nn.Module,
    sample_shape: Sequence[int],
    batch_size: int,
    *,
    autocast_dtype: torch.dtype | None = None,
    checkpoint_every: int = 0,
) -> list[dict[str, Any]]:
    """Per layer: output shape, what CPU/CUDA autograd keeps and the bytes that adds, from shapes alone (chapter 5)."""
    batch_size = positive_int(batch_size, "batch_size")
    shape = tuple(positive_int(s, tr("each entry of sample_shape")) for s in sample_shape)
    layers = _leaves(model)  # checks that the model is an nn.Sequential
    every = positive_int(checkpoint_every, "checkpoint_every") if checkpoint_every else 1
    units = list(model) if checkpoint_every else layers
    groups = [units[i : i + every] for i in range(0, len(units), every)]
    params = list(model.parameters())
    v = _Value((batch_size, *shape), params[0].dtype if params else torch.float32, False)
    saved: set[int] = set()
    rows: list[dict[str, Any]] = []
    for group in groups:
        inner = [leaf for child in group for leaf in _leaves(nn.Sequential(child))]
        if checkpoint_every:
            out, scratch = v, set()  # the segment's own savings are dropped
            for layer in inner:
                out = _layer(layer, out, scratch, autocast_dtype).out
            names = "+".join(type(m).__name__ for m in inner)
            step = _Step(out, tr("segment input only"), _save(saved, v))
            label = f"checkpoint({names})"
        else:
            step = _layer(inner[0], v, saved, autocast_dtype)
            label = type(inner[0]).__name__
        rows.append(
            {
                "layer": label,
                "output shape": tuple(step.out.shape),
                "keeps": step.keeps,
                "MiB": step.added / MiB,
                "bytes": step.added,
                "weight-copy bytes": step.copies,
            }
        )
        v = step.out
    return rows


def analytic_activation_bytes(
    model: nn.Module,
    sample_shape: Sequence[int],
    batch_size: int,
    *,
    autocast_dtype: torch.dtype | None = None,
    checkpoint_every: int = 0,
) -> int:
    """Total bytes autograd keeps for one forward, predicted from layer types and shapes (chapter 5)."""
    options = {"autocast_dtype": autocast_dtype, "checkpoint_every": checkpoint_every}
    return sum(r["bytes"] for r in activation_table(model, sample_shape, batch_size, **options))
