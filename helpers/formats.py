"""Number formats: the torch.finfo table, what fp16 does to a value, precision names (chapter 3)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch

from helpers.dtypes import TF32_NAMES, dtype_name, parse_dtype
from helpers.i18n import tr, tr_mark
from helpers.validate import DeviceError

#: The precisions a training step can run in: plain fp32 (AMP off) or autocast to bf16 / fp16.
PRECISIONS = ("fp32", "bf16", "fp16")

#: TF32 is no storage dtype: tensor cores read fp32 and keep 8 exponent and 10 mantissa bits.
_TF32 = SimpleNamespace(
    bits=19, eps=2.0**-10, max=(2 - 2.0**-10) * 2.0**127, smallest_normal=2.0**-126
)


class PrecisionError(DeviceError):
    """A precision that is unknown, or that cannot run (usefully) on a device (chapter 3)."""


def format_bits(dtype: torch.dtype | Any) -> tuple[int, int]:
    """(exponent bits, explicitly stored mantissa bits) of a floating dtype or its finfo (chapter 3)."""
    info = torch.finfo(dtype) if isinstance(dtype, torch.dtype) else dtype
    mantissa = round(-math.log2(info.eps))
    return info.bits - 1 - mantissa, mantissa


def finfo_rows() -> list[dict[str, Any]]:
    """torch.finfo of fp32, tf32, fp16, bf16, fp8 e4m3fn and e5m2, as table rows (chapter 3)."""
    dtypes = [torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2]
    infos = [("fp32", torch.finfo(torch.float32)), (tr("tf32 (matmul only)"), _TF32)]
    infos += [(dtype_name(dt), torch.finfo(dt)) for dt in dtypes]
    # the keys are marked for the catalog: print_table shows them in the learner's language
    return [
        {
            tr_mark("format"): name,
            tr_mark("bits"): info.bits,
            tr_mark("exponent bits"): format_bits(info)[0],
            tr_mark("mantissa bits"): format_bits(info)[1],
            "eps": info.eps,
            tr_mark("max"): info.max,
            tr_mark("smallest normal"): info.smallest_normal,
            tr_mark("smallest subnormal"): info.smallest_normal * info.eps,
        }
        for name, info in infos
    ]


#: What fp16_fate returns. Code compares the English words; a table shows them translated
#: (print_table puts every string cell through tr()), so they are marked for the catalog.
FP16_FATES = (tr_mark("zero"), tr_mark("subnormal"), tr_mark("normal"), "inf")


def fp16_fate(value: float) -> str:
    """What casting `value` to fp16 does: 'zero', 'subnormal', 'normal' or 'inf' (chapter 3)."""
    x = torch.tensor(float(value), dtype=torch.float32).to(torch.float16).float().abs().item()
    if math.isinf(x):
        return "inf"
    if x == 0.0:
        return "zero"
    return "subnormal" if x < torch.finfo(torch.float16).smallest_normal else "normal"


def is_tf32(precision: str | torch.dtype) -> bool:
    """Whether a precision names TF32 ('tf32', 'tensorfloat32'): fp32 with TF32 matmuls (chapters 1 and 3)."""
    return isinstance(precision, str) and precision.strip().lower() in TF32_NAMES


def parse_precision(name: str | torch.dtype) -> torch.dtype:
    """'fp32' / 'bf16' / 'fp16' (or an alias, or a torch dtype) -> dtype, with a clear error (chapter 3)."""
    try:
        dtype = parse_dtype(name)
    except DeviceError:
        raise PrecisionError(
            tr(
                "Unknown precision {name!r}. Use one of {choices} "
                "(aliases such as 'float16', 'bfloat16' and torch dtypes work too)."
            ).format(name=name, choices=", ".join(PRECISIONS))
        ) from None
    if dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise PrecisionError(
            tr(
                "{dtype} is not a mixed-precision choice: autocast lowers to bf16 or "
                "fp16, and 'fp32' means AMP off. Use one of {choices}."
            ).format(dtype=dtype_name(dtype), choices=", ".join(PRECISIONS))
        )
    return dtype
