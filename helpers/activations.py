"""Activation bytes: measured with saved_tensors_hooks, and counted layer by layer (chapter 5).

Autograd keeps some tensors from the forward pass so that backward can use them (a Linear
keeps its input, a ReLU its output, ...). Those saved tensors are the "activations" line of
the memory bill. :class:`ActivationMeter` measures them on any device, CPU included: every
tensor autograd saves passes through a pack hook, and the meter adds up the bytes of each
distinct storage once, leaving out the model's own parameters and buffers.
:func:`activation_table` predicts the same number from the layer types and shapes alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import checkpoint

from helpers.units import MiB
from helpers.validate import positive_int


@dataclass(frozen=True)
class SavedTensor:
    """One distinct storage that autograd saved for backward (chapter 5)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int


def _storage_key(t: torch.Tensor) -> tuple[int, StorageWeakRef | None, int]:
    """(identity, weak reference, bytes) of a tensor's storage (chapter 5)."""
    try:
        storage = t.untyped_storage()
        ref = StorageWeakRef(storage)
        return ref.cdata, ref, storage.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):  # tensors without a plain storage
        return id(t), None, t.numel() * t.element_size()


def _excluded_keys(sources: Sequence[nn.Module | torch.Tensor]) -> set[int]:
    """Storage identities of the parameters and buffers of `sources` (chapter 5)."""
    keys: set[int] = set()
    for src in sources:
        if isinstance(src, nn.Module):
            tensors: Iterator[torch.Tensor] = iter([*src.parameters(), *src.buffers()])
        elif isinstance(src, torch.Tensor):
            tensors = iter([src])
        else:
            raise TypeError(
                f"ActivationMeter excludes modules or tensors, got {type(src).__name__}: "
                "pass the model (its parameters are not activations)."
            )
        keys.update(_storage_key(t)[0] for t in tensors)
    return keys


class ActivationMeter:
    """Context manager: unique storage bytes autograd saves for backward, parameters excluded (chapter 5).

    Use one meter per forward pass and keep the output alive until you read the meter,
    because the saved tensors live exactly as long as the graph does.
    """

    def __init__(self, *exclude: nn.Module | torch.Tensor) -> None:
        self._excluded = _excluded_keys(exclude)
        self._seen: dict[int, tuple[StorageWeakRef | None, SavedTensor]] = {}
        self._hooks: saved_tensors_hooks | None = None
        self.pack_calls = 0

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        """Record the storage behind `t` once; hand autograd a detached alias (chapter 5)."""
        self.pack_calls += 1
        key, ref, nbytes = _storage_key(t)
        if key not in self._excluded:
            old = self._seen.get(key)
            if old is None or (old[0] is not None and old[0].expired()):
                self._seen[key] = (ref, SavedTensor(tuple(t.shape), t.dtype, nbytes))
        return t.detach()

    def __enter__(self) -> ActivationMeter:
        self._hooks = saved_tensors_hooks(self._pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(*exc)
            self._hooks = None

    @property
    def records(self) -> list[SavedTensor]:
        """The distinct saved storages with at least one byte, in the order they were saved (chapter 5)."""
        return [rec for _, rec in self._seen.values() if rec.nbytes > 0]

    @property
    def total_bytes(self) -> int:
        """Sum of the bytes of every distinct saved storage (chapter 5)."""
        return sum(rec.nbytes for rec in self.records)

    def table(self) -> list[dict[str, Any]]:
        """The saved storages as table rows: shape, dtype, MiB (chapter 5)."""
        return [
            {
                "shape": tuple(r.shape),
                "dtype": str(r.dtype).removeprefix("torch."),
                "MiB": r.nbytes / MiB,
            }
            for r in self.records
        ]


def checkpointed_forward(model: nn.Sequential, x: torch.Tensor, every: int) -> torch.Tensor:
    """Run `model` in segments of `every` children, each under checkpoint(use_reentrant=False) (chapter 5)."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"checkpointed_forward needs an nn.Sequential, got {type(model).__name__}.")
    every = positive_int(every, "every")
    children = list(model)
    for start in range(0, len(children), every):
        segment = nn.Sequential(*children[start : start + every])
        x = checkpoint(segment, x, use_reentrant=False)
    return x


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
        raise TypeError(f"x must be a tensor (a batch of inputs), got {type(x).__name__}.")
    with ActivationMeter(model) as meter, autocast_context(x.device.type, autocast_dtype):
        out = checkpointed_forward(model, x, checkpoint_every) if checkpoint_every else model(x)
    total = meter.total_bytes
    del out
    return total


# ---------------------------------------------------------------------------------------------
# The analytic count: what each layer type keeps, from shapes alone.


@dataclass
class _Value:
    """A tensor flowing through the model, as the analytic count sees it (chapter 5)."""

    key: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool


@dataclass
class _Step:
    """One layer's effect: its output, what it keeps, and the bytes that adds (chapter 5)."""

    out: _Value
    keeps: str
    added: int = 0
    copies: int = 0


@dataclass
class _Ledger:
    """Which storages are saved so far, and how big each storage is (chapter 5)."""

    sizes: dict[int, int] = field(default_factory=dict)
    saved: set[int] = field(default_factory=set)

    def new(self, shape: tuple[int, ...], dtype: torch.dtype, requires_grad: bool) -> _Value:
        """A fresh storage holding `shape` elements of `dtype` (chapter 5)."""
        key = len(self.sizes)
        self.sizes[key] = math.prod(shape) * _itemsize(dtype)
        return _Value(key, shape, dtype, requires_grad)

    def save(self, value: _Value) -> int:
        """Mark a storage as saved; return the bytes this adds (0 if already saved) (chapter 5)."""
        if value.key in self.saved:
            return 0
        self.saved.add(value.key)
        return self.sizes[value.key]


def _itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of `dtype` (chapter 5)."""
    return torch.empty((), dtype=dtype).element_size()


def _short(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> 'bfloat16' (chapter 5)."""
    return str(dtype).removeprefix("torch.")


def _pair(v: int | tuple[int, ...]) -> tuple[int, int]:
    """An int or a 2-tuple as a 2-tuple (chapter 5)."""
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _leaves(model: nn.Module) -> list[nn.Module]:
    """The layers of a (nested) nn.Sequential in execution order (chapter 5)."""
    if not isinstance(model, nn.Sequential):
        raise TypeError(
            f"The analytic count follows an nn.Sequential, got {type(model).__name__}. "
            "For other models, measure with ActivationMeter instead."
        )
    out: list[nn.Module] = []
    for child in model:
        out += _leaves(child) if isinstance(child, nn.Sequential) else [child]
    return out


def _conv_shape(layer: nn.Conv2d, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Output shape of a Conv2d for an input of `shape` (chapter 5)."""
    if shape[-3] != layer.in_channels:
        raise ValueError(f"{layer} got {shape[-3]} input channels.")
    hw = []
    for i, (size, k, s, d) in enumerate(
        zip(shape[-2:], layer.kernel_size, layer.stride, layer.dilation)
    ):
        if layer.padding == "same":
            hw.append(size)
            continue
        p = 0 if layer.padding == "valid" else _pair(layer.padding)[i]
        hw.append((size + 2 * p - d * (k - 1) - 1) // s + 1)
    return (*shape[:-3], layer.out_channels, *hw)


def _pool_shape(layer: nn.MaxPool2d, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Output shape of a MaxPool2d, with PyTorch's ceil_mode rule (chapter 5)."""
    k, s, p, d = (
        _pair(a)
        for a in (
            layer.kernel_size,
            layer.stride or layer.kernel_size,
            layer.padding,
            layer.dilation,
        )
    )
    hw = []
    for i, size in enumerate(shape[-2:]):
        n = size + 2 * p[i] - d[i] * (k[i] - 1) - 1
        length = (-(-n // s[i]) if layer.ceil_mode else n // s[i]) + 1
        if layer.ceil_mode and (length - 1) * s[i] >= size + p[i]:
            length -= 1
        hw.append(length)
    return (*shape[:-2], *hw)


def _matmul_layer(
    layer: nn.Linear | nn.Conv2d, v: _Value, ledger: _Ledger, amp: torch.dtype | None
) -> _Step:
    """Linear and Conv2d: the input (cast under autocast) and, if needed, a weight copy (chapter 5)."""
    conv = isinstance(layer, nn.Conv2d)
    if not conv and v.shape[-1] != layer.in_features:
        raise ValueError(f"{layer} got inputs with {v.shape[-1]} features.")
    shape = _conv_shape(layer, v.shape) if conv else (*v.shape[:-1], layer.out_features)
    w = layer.weight
    out_rg = v.requires_grad or any(p.requires_grad for p in layer.parameters())
    compute = amp or v.dtype
    if not out_rg:
        return _Step(ledger.new(shape, compute, False), "nothing (no gradient needed)")
    inp = v if v.dtype == compute else ledger.new(v.shape, compute, v.requires_grad)
    step = _Step(ledger.new(shape, compute, True), "")
    kept = []
    # A convolution keeps its input and weight. A matmul keeps its input only if the weight
    # needs a gradient, and the weight only if the input needs one.
    if conv or w.requires_grad:
        added = ledger.save(inp)
        step.added += added
        kept.append("input" + (f" ({_short(compute)} copy)" if inp is not v else ""))
        kept[-1] += "" if added else " (already counted)"
    if (conv or v.requires_grad) and w.dtype != compute:
        copy = ledger.save(ledger.new(tuple(w.shape), compute, False))
        step.added, step.copies = step.added + copy, copy
        kept.append(f"weight ({_short(compute)} copy)")
    step.keeps = " + ".join(kept) or "nothing"
    return step


_SAVES_OUTPUT = (nn.ReLU, nn.Sigmoid, nn.Tanh)
_SAVES_INPUT = (nn.GELU, nn.SiLU)
_SUPPORTED = "Linear, Conv2d, ReLU, Sigmoid, Tanh, GELU, SiLU, MaxPool2d, Flatten, Identity"


def _layer(layer: nn.Module, v: _Value, ledger: _Ledger, amp: torch.dtype | None) -> _Step:
    """Apply one layer's saving rule (chapter 5)."""
    if isinstance(layer, (nn.Linear, nn.Conv2d)):
        return _matmul_layer(layer, v, ledger, amp)
    if isinstance(layer, _SAVES_OUTPUT + _SAVES_INPUT):
        inplace = getattr(layer, "inplace", False)
        out = v if inplace else ledger.new(v.shape, v.dtype, v.requires_grad)
        if not v.requires_grad:
            return _Step(out, "nothing (no gradient needed)")
        if isinstance(layer, _SAVES_OUTPUT):
            return _Step(out, "output", ledger.save(out))
        added = ledger.save(v)
        return _Step(out, "input" if added else "input (already counted)", added)
    if isinstance(layer, nn.MaxPool2d):
        if layer.return_indices:
            raise ValueError("The analytic count does not support MaxPool2d(return_indices=True).")
        shape = _pool_shape(layer, v.shape)
        out = ledger.new(shape, v.dtype, v.requires_grad)
        if not v.requires_grad:
            return _Step(out, "nothing (no gradient needed)")
        kept_input = ledger.save(v)
        added = kept_input + ledger.save(ledger.new(shape, torch.int64, False))
        what = "input" if kept_input else "input (already counted)"
        return _Step(out, f"{what} + int64 indices", added)
    if isinstance(layer, nn.Flatten):
        dims = len(v.shape)
        start, end = layer.start_dim % dims, layer.end_dim % dims
        shape = (*v.shape[:start], math.prod(v.shape[start : end + 1]), *v.shape[end + 1 :])
        return _Step(_Value(v.key, shape, v.dtype, v.requires_grad), "nothing (a view)")
    if isinstance(layer, nn.Identity):
        return _Step(v, "nothing")
    raise TypeError(
        f"The analytic count does not know what {type(layer).__name__} saves for backward. "
        f"Supported layers: {_SUPPORTED}. Measure other models with ActivationMeter."
    )


def activation_table(
    model: nn.Module,
    sample_shape: Sequence[int],
    batch_size: int,
    *,
    autocast_dtype: torch.dtype | None = None,
    checkpoint_every: int = 0,
) -> list[dict[str, Any]]:
    """Per layer: output shape, what autograd keeps and the bytes that adds, from shapes alone (chapter 5).

    The rules are those of CPU and CUDA autograd. With ``checkpoint_every=k`` the top-level
    children run in checkpointed segments of k (as :func:`checkpointed_forward` does): each
    segment keeps only its input, nothing inside it.
    """
    batch_size = positive_int(batch_size, "batch_size")
    shape = tuple(positive_int(s, "each entry of sample_shape") for s in sample_shape)
    layers = _leaves(model)
    if checkpoint_every:
        every = positive_int(checkpoint_every, "checkpoint_every")
        children = list(model)
        groups = [children[i : i + every] for i in range(0, len(children), every)]
    else:
        groups = [[layer] for layer in layers]
    params = list(model.parameters())
    ledger = _Ledger()
    v = ledger.new((batch_size, *shape), params[0].dtype if params else torch.float32, False)
    rows: list[dict[str, Any]] = []
    for group in groups:
        inner = [leaf for child in group for leaf in _leaves(nn.Sequential(child))]
        if checkpoint_every:
            scratch = _Ledger(sizes=dict(ledger.sizes))  # the segment's own savings are dropped
            out = v
            for layer in inner:
                out = _layer(layer, out, scratch, autocast_dtype).out
            ledger.sizes.update(scratch.sizes)
            names = "+".join(type(m).__name__ for m in inner)
            step = _Step(out, "segment input only", ledger.save(v))
            label = f"checkpoint({names})"
        else:
            step = _layer(inner[0], v, ledger, autocast_dtype)
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
    rows = activation_table(
        model,
        sample_shape,
        batch_size,
        autocast_dtype=autocast_dtype,
        checkpoint_every=checkpoint_every,
    )
    return sum(r["bytes"] for r in rows)
