"""helpers.formats: the finfo table, fp16's fate of a value, precision names."""

from __future__ import annotations

import pytest
import torch

from helpers.formats import (
    FP16_FATES,
    PrecisionError,
    finfo_rows,
    format_bits,
    fp16_fate,
    is_tf32,
    parse_precision,
)
from helpers.i18n import set_language, tr
from helpers.validate import DeviceError


def test_format_bits() -> None:
    assert format_bits(torch.float32) == (8, 23)
    assert format_bits(torch.float16) == (5, 10)
    assert format_bits(torch.bfloat16) == (8, 7)


def test_finfo_rows() -> None:
    rows = {r["format"]: r for r in finfo_rows()}
    assert rows["fp16"]["max"] == 65504 and rows["fp16"]["smallest subnormal"] == 2.0**-24
    assert rows["bf16"]["smallest normal"] == rows["fp32"]["smallest normal"] == 2.0**-126
    assert rows["tf32 (matmul only)"]["mantissa bits"] == 10
    assert rows["tf32 (matmul only)"]["exponent bits"] == 8
    fp8 = ["float8_e4m3fn", "float8_e5m2"]
    assert list(rows) == ["fp32", "tf32 (matmul only)", "fp16", "bf16", *fp8]


@pytest.mark.parametrize(
    ("value", "fate"),
    [
        (1.0, "normal"),
        (0.0, "zero"),
        (1e-4, "normal"),
        (1e-6, "subnormal"),
        (4e-8, "subnormal"),
        (2e-8, "zero"),
        (-1e-9, "zero"),
        (65510.0, "normal"),
        (65520.0, "inf"),
        (-7e4, "inf"),
    ],
)
def test_fp16_fate(value: float, fate: str) -> None:
    assert fp16_fate(value) == fate


def test_the_fates_a_table_shows_are_in_the_catalog() -> None:
    """Chapter 3 prints fp16_fate's words in a table (every string cell goes through tr())."""
    assert {fp16_fate(v) for v in (1.0, 1e-6, 0.0, 7e4)} == set(FP16_FATES)
    set_language("zh_CN")
    try:
        shown = [tr(fate) for fate in FP16_FATES]
    finally:
        set_language("en")
    assert shown == ["零", "次正规数", "正规数", "inf"]


# --- parsing and choosing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("fp32", torch.float32),
        ("bf16", torch.bfloat16),
        ("Float16", torch.float16),
        ("torch.bfloat16", torch.bfloat16),
        (torch.float16, torch.float16),
    ],
)
def test_parse_precision(name: object, dtype: torch.dtype) -> None:
    assert parse_precision(name) == dtype


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("fp8", "Unknown precision 'fp8'. Use one of fp32, bf16, fp16"),
        ("half-ish", "Unknown precision"),
        ("fp64", "fp64 is not a mixed-precision choice"),
        (torch.int8, "not a mixed-precision choice"),
    ],
)
def test_parse_precision_rejects(name: object, message: str) -> None:
    with pytest.raises(PrecisionError, match=message):
        parse_precision(name)
    assert issubclass(PrecisionError, DeviceError) and issubclass(PrecisionError, ValueError)


def test_is_tf32_names() -> None:
    assert is_tf32("tf32") and is_tf32(" TensorFloat32 ")
    assert not is_tf32("fp32") and not is_tf32(torch.float32) and not is_tf32("bf16")
