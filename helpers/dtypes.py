"""The names of floating dtypes: 'bf16' <-> torch.bfloat16 (chapter 1)."""

from __future__ import annotations

import torch

from helpers.i18n import tr
from helpers.validate import DeviceError

#: Each dtype's names, its short name first.
_DTYPE_ALIASES: dict[torch.dtype, tuple[str, ...]] = {
    torch.float32: ("fp32", "float32", "float"),
    torch.float16: ("fp16", "float16", "half"),
    torch.bfloat16: ("bf16", "bfloat16"),
    torch.float64: ("fp64", "float64", "double"),
}
_DTYPE_NAMES = {name: dtype for dtype, names in _DTYPE_ALIASES.items() for name in names}

#: Names of TF32: a way to compute fp32 matmuls, not a dtype.
TF32_NAMES = ("tf32", "tensorfloat32")


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'bf16', 'float16', torch.float32 ... -> torch.dtype, with a clear error otherwise (chapter 1)."""
    if isinstance(name, torch.dtype):
        return name
    key = str(name).strip().lower().removeprefix("torch.")
    if key in TF32_NAMES:
        raise DeviceError(
            tr(
                "{name!r} is not a dtype: TF32 is how a GPU may compute fp32 matmuls (tensors stay "
                "torch.float32). Use 'fp32' and torch.backends.cuda.matmul.allow_tf32, or ask "
                "peak_flops(name, 'tf32') for its datasheet peak."
            ).format(name=name)
        )
    if key not in _DTYPE_NAMES:
        raise DeviceError(
            tr("Unknown dtype {name!r}. Use one of: {names}.").format(
                name=name, names=", ".join(sorted(_DTYPE_NAMES))
            )
        )
    return _DTYPE_NAMES[key]


def dtype_name(dtype: torch.dtype) -> str:
    """Short name of a floating dtype: torch.bfloat16 -> 'bf16' (chapter 1)."""
    return _DTYPE_ALIASES.get(dtype, (str(dtype).removeprefix("torch."),))[0]
