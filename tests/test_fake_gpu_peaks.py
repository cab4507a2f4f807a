"""The datasheet peak table against real torch.cuda.get_device_name() strings (issue 14, item 12)."""

from __future__ import annotations

import math
import re

import pytest
import torch

from helpers import devices, dtypes
from helpers.peaks import (
    _PEAK_TABLE,
    TENSOR_PRECISIONS,
    UNKNOWN_PEAK,
    clock_adjusted_peak,
    datasheet_clock_mhz,
    peak_flops,
    peak_row,
)
from helpers.validate import DeviceError

#: Real names as torch prints them -> dense TFLOP/s (fp32, tf32, bf16, fp16); None = no fast path.
KNOWN: dict[str, tuple[float, float | None, float | None, float | None]] = {
    "NVIDIA H100 80GB HBM3": (67, 494, 989, 989),
    "NVIDIA H100 PCIe": (51, 378, 756, 756),
    "NVIDIA H100 NVL": (60, 418, 835, 835),
    "NVIDIA H200": (67, 494, 989, 989),
    "NVIDIA H200 NVL": (60, 418, 835, 835),
    "NVIDIA GH200 480GB": (67, 494, 989, 989),
    "NVIDIA H800": (67, 494, 989, 989),
    "NVIDIA H800 PCIe": (51, 378, 756, 756),
    "NVIDIA H20": (44, 74, 148, 148),
    "NVIDIA A100-SXM4-80GB": (19.5, 156, 312, 312),
    "NVIDIA A100-SXM4-40GB": (19.5, 156, 312, 312),
    "NVIDIA A100-PCIE-40GB": (19.5, 156, 312, 312),
    "NVIDIA A100 80GB PCIe": (19.5, 156, 312, 312),
    "NVIDIA A800-SXM4-80GB": (19.5, 156, 312, 312),
    "NVIDIA A800 80GB PCIe": (19.5, 156, 312, 312),
    "NVIDIA A30": (10.3, 82, 165, 165),
    "NVIDIA A10": (31.2, 62.5, 125, 125),
    "NVIDIA A40": (37.4, 74.8, 149.7, 149.7),
    "NVIDIA RTX A6000": (38.7, 77.4, 154.8, 154.8),
    "NVIDIA RTX 6000 Ada Generation": (91.1, 182.1, 364.2, 364.2),
    "NVIDIA L4": (30.3, 60, 121, 121),
    "NVIDIA L40": (90.5, 90.5, 181, 181),
    "NVIDIA L40S": (91.6, 183, 362, 362),
    "Tesla T4": (8.1, None, None, 65),
    "Tesla V100-SXM2-16GB": (15.7, None, None, 125),
    "Tesla V100-SXM2-32GB": (15.7, None, None, 125),
    "Tesla V100-PCIE-16GB": (14, None, None, 112),
    "Tesla V100-PCIE-32GB": (14, None, None, 112),
    "Tesla V100S-PCIE-32GB": (16.4, None, None, 130),
    "NVIDIA GeForce RTX 4090": (82.6, 82.6, 165.2, 165.2),
    "NVIDIA GeForce RTX 4090 D": (73.5, 73.5, 147.1, 147.1),
    "NVIDIA GeForce RTX 4080": (48.7, 48.7, 97.5, 97.5),
    "NVIDIA GeForce RTX 4070": (29.1, 29.1, 58.3, 58.3),
    "NVIDIA GeForce RTX 3090": (35.6, 35.6, 71, 71),
    "NVIDIA GeForce RTX 3090 Ti": (40, 40, 80, 80),
    "NVIDIA GeForce RTX 3080": (29.8, 29.8, 59.5, 59.5),
    "NVIDIA GeForce RTX 5090": (104.8, 104.8, 209.5, 209.5),
    "NVIDIA B200": (75, 1100, 2250, 2250),
    "NVIDIA GB200": (80, 1250, 2500, 2500),
    "AMD Instinct MI300X": (163.4, 653.7, 1307.4, 1307.4),
    "AMD Instinct MI250X": (47.9, None, 191.5, 191.5),
}

#: Real names the table must NOT claim: a neighbour's figures would be wrong for each.
UNKNOWN = [
    "NVIDIA A10G",  # AWS's A10 variant: no NVIDIA datasheet, different tensor rates
    "NVIDIA A100X",
    "NVIDIA GeForce RTX 4090 Laptop GPU",  # an AD103, not the desktop AD102
    "NVIDIA GeForce RTX 4080 SUPER",
    "NVIDIA GeForce RTX 4070 Ti",
    "NVIDIA GeForce RTX 4070 SUPER",
    "NVIDIA GeForce RTX 3080 Ti",
    "NVIDIA GeForce RTX 3060",
    "NVIDIA GeForce RTX 5080",
    "NVIDIA GeForce GTX 1080 Ti",
    "Tesla P100-PCIE-16GB",
    "Tesla K80",
    "Tesla V100-FHHL-16GB",
    "Quadro RTX 6000",
    "NVIDIA RTX A5000",
    "NVIDIA L20",
    "NVIDIA B100",
    "NVIDIA B300",
    "AMD Instinct MI250",
    "AMD Instinct MI210",
    "AMD Radeon RX 7900 XTX",
    "Some Future GPU",
    "",
]

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def test_the_list_is_long_enough() -> None:
    assert len(KNOWN) >= 30 and len(KNOWN) + len(UNKNOWN) >= 60


@pytest.mark.parametrize("name", list(KNOWN))
def test_known_gpu_gets_its_own_figures(name: str) -> None:
    for precision, tflops in zip(PRECISIONS, KNOWN[name]):
        expected = None if tflops is None else tflops * 1e12
        assert peak_flops(name, precision) == pytest.approx(expected), (name, precision)
    assert peak_row(name) is not None and peak_row(name).source


@pytest.mark.parametrize("name", list(KNOWN) + UNKNOWN)
def test_no_name_matches_two_rows(name: str) -> None:
    rows = [r for r in _PEAK_TABLE if re.search(r.pattern, " ".join(name.split()), re.IGNORECASE)]
    assert len(rows) == (1 if name in KNOWN else 0), [r.pattern for r in rows]


@pytest.mark.parametrize("name", UNKNOWN)
def test_unknown_gpu_gets_none(name: str) -> None:
    assert peak_row(name) is None
    assert all(peak_flops(name, p) is None for p in PRECISIONS)


@pytest.mark.parametrize(
    ("name", "neighbour"),
    [
        ("NVIDIA H100 NVL", "NVIDIA H100 80GB HBM3"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3"),
        ("NVIDIA H200 NVL", "NVIDIA H200"),
        ("NVIDIA A10", "NVIDIA A100-SXM4-80GB"),
        ("NVIDIA L4", "NVIDIA L40"),
        ("NVIDIA L40", "NVIDIA L40S"),
        ("NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 4090"),
        ("NVIDIA GeForce RTX 3090 Ti", "NVIDIA GeForce RTX 3090"),
        ("Tesla V100S-PCIE-32GB", "Tesla V100-PCIE-32GB"),
        ("NVIDIA GB200", "NVIDIA B200"),
        ("NVIDIA H20", "NVIDIA H200"),
    ],
)
def test_look_alike_names_differ(name: str, neighbour: str) -> None:
    assert peak_row(name) is not peak_row(neighbour)
    assert peak_row(name).tflops != peak_row(neighbour).tflops


def test_tf32_is_a_precision_name_and_a_flag() -> None:
    name = "NVIDIA A100-SXM4-80GB"
    assert peak_flops(name, "tf32") == peak_flops(name, "fp32", tf32=True) == 156e12
    assert peak_flops(name, torch.float32, tf32=True) == 156e12
    assert peak_flops(name, " TF32 ") == 156e12
    assert peak_flops(name, "bf16", tf32=True) == 312e12  # the flag only changes fp32
    assert peak_flops("Tesla T4", "tf32") is None  # no tf32 before Ampere
    assert peak_flops(name, "fp64", tf32=True) == 19.5e12  # the flag only changes fp32
    assert peak_flops("NVIDIA GeForce RTX 4090", "fp64") is None  # no datasheet figure


def test_parse_dtype_still_rejects_tf32_and_garbage_clearly() -> None:
    with pytest.raises(DeviceError, match="not a dtype: TF32 is how a GPU"):
        dtypes.parse_dtype("tf32")
    with pytest.raises(DeviceError, match="Unknown dtype 'fp12'"):
        dtypes.parse_dtype("fp12")
    with pytest.raises(DeviceError, match="Unknown dtype"):
        peak_flops("NVIDIA H100 80GB HBM3", "fp12")


def test_names_are_matched_with_whitespace_collapsed() -> None:
    assert peak_flops("  NVIDIA  GeForce RTX 4090 ", "bf16") == pytest.approx(165.2e12)
    assert peak_flops("nvidia h100 pcie", "fp32") == 51e12


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("h100_sxm", "NVIDIA H100 80GB HBM3"),
        ("h100_sxm", "NVIDIA H100 NVL"),
        ("h100_sxm", "NVIDIA H200 NVL"),
        ("h100_sxm", "NVIDIA H800"),
        ("h100_sxm", "NVIDIA H20"),
        ("a100", "NVIDIA A100-PCIE-40GB"),
        ("a100", "NVIDIA A800-SXM4-80GB"),
        ("a100", "NVIDIA A10G"),
        ("t4", "Tesla T4"),
        ("t4", "Tesla V100S-PCIE-32GB"),
        ("rtx4090", "NVIDIA GeForce RTX 4090 D"),
        ("rtx4090", "NVIDIA GeForce RTX 3090 Ti"),
        ("rtx4090", "NVIDIA GeForce RTX 5090"),
        ("mi300x", "AMD Instinct MI300X"),
        ("mi300x", "AMD Instinct MI250X"),
    ],
)
def test_describe_device_shows_the_table_row(fake_gpu, kind: str, name: str) -> None:
    """Through the fixture: the name torch reports decides the peaks describe_device prints."""
    fake_gpu(kind, name=name)
    info = devices.describe_device("cuda:0")
    expected = {p: t for p, t in zip(PRECISIONS, KNOWN.get(name, ())) if t is not None}
    assert info.name == name and info.peak_tflops == pytest.approx(expected)
    shown = dict(info.rows())["datasheet peak TFLOP/s"]
    if not expected:
        assert shown == UNKNOWN_PEAK
    else:
        assert shown.startswith(f"fp32 {expected['fp32']:g}")
        missing = [p for p in PRECISIONS if p not in expected]
        assert shown.endswith(
            f"(no fast {', '.join(missing)})" if missing else f"{expected['fp16']:g}"
        )


#: AUDIT finding 19: fp64 beat fp32 on the H100 with no peak to compare. The fp64 matmul rate
#: from each datasheet: FP64 tensor core where the GPU has one, else plain FP64 (V100).
FP64: dict[str, float] = {
    "NVIDIA H100 80GB HBM3": 67,
    "NVIDIA H100 PCIe": 51,
    "NVIDIA H100 NVL": 60,
    "NVIDIA H200": 67,
    "NVIDIA H200 NVL": 60,
    "NVIDIA GH200 480GB": 67,
    "NVIDIA A100-SXM4-80GB": 19.5,
    "NVIDIA A100-SXM4-40GB": 19.5,
    "NVIDIA A100-PCIE-40GB": 19.5,
    "NVIDIA A100 80GB PCIe": 19.5,
    "NVIDIA A30": 10.3,
    "Tesla V100-SXM2-16GB": 7.8,
    "Tesla V100-SXM2-32GB": 7.8,
    "Tesla V100-PCIE-16GB": 7.0,
    "Tesla V100-PCIE-32GB": 7.0,
    "Tesla V100S-PCIE-32GB": 8.2,
    "AMD Instinct MI300X": 163.4,
    "AMD Instinct MI250X": 47.9,
}


@pytest.mark.parametrize("name", list(KNOWN))
def test_fp64_peak_where_the_datasheet_gives_one(name: str) -> None:
    expected = FP64.get(name)
    assert peak_flops(name, "fp64") == (
        None if expected is None else pytest.approx(expected * 1e12)
    )
    assert peak_flops(name, torch.float64) == peak_flops(name, "fp64")


#: Name -> SMs, for the GPUs whose table row gives the clock its figures assume.
SMS = {
    "NVIDIA H100 80GB HBM3": 132,
    "NVIDIA H200": 132,
    "NVIDIA A100-SXM4-80GB": 108,
    "Tesla T4": 40,
    "NVIDIA GeForce RTX 4090": 128,
    "Tesla V100-SXM2-32GB": 80,
    "Tesla V100-PCIE-16GB": 80,
}


@pytest.mark.parametrize("name", list(SMS))
def test_each_clock_gives_a_whole_number_of_flops_per_clock_per_sm(name: str) -> None:
    """peak = SMs x FLOP/clock/SM x clock, with FLOP/clock/SM a power of two: the pair is right.

    Datasheets round their figures (14 TFLOP/s for the V100 PCIe's 14.13), hence 1%."""
    for precision in (*PRECISIONS, "fp64"):
        peak, clock = peak_flops(name, precision), datasheet_clock_mhz(name, precision)
        if peak is None:
            assert clock is None
            continue
        per_sm = peak / (clock * 1e6) / SMS[name]
        assert per_sm == pytest.approx(2 ** round(math.log2(per_sm)), rel=0.01), (precision, per_sm)


def test_every_row_with_clocks_is_checked_above() -> None:
    checked = {id(peak_row(name)) for name in SMS}
    with_clocks = {id(r) for r in _PEAK_TABLE if r.boost_mhz is not None}
    assert with_clocks == checked


def test_the_h100_datasheet_clocks_and_the_audits_clock_adjusted_peaks() -> None:
    """AUDIT finding 6: 989 bf16 = 132 x 4096 x 1.83 GHz; at 1425 MHz the peak is 770."""
    name = "NVIDIA H100 80GB HBM3"
    assert {p: datasheet_clock_mhz(name, p) for p in (*PRECISIONS, "fp64")} == {
        "fp32": 1980,
        "tf32": 1830,
        "bf16": 1830,
        "fp16": 1830,
        "fp64": 1980,
    }
    assert set(TENSOR_PRECISIONS) == {"tf32", "bf16", "fp16"}
    assert clock_adjusted_peak(name, "bf16", 1425) / 1e12 == pytest.approx(770.1, abs=0.1)
    assert clock_adjusted_peak(name, "tf32", 1485) / 1e12 == pytest.approx(400.9, abs=0.1)
    assert clock_adjusted_peak(name, "fp32", 1980) == peak_flops(name, "fp32")
    assert clock_adjusted_peak(name, "fp32", 1485, tf32=True) == clock_adjusted_peak(
        name, "tf32", 1485
    )


def test_no_clock_adjusted_peak_without_a_clock() -> None:
    assert clock_adjusted_peak("NVIDIA H100 80GB HBM3", "bf16", None) is None
    assert clock_adjusted_peak("NVIDIA H100 80GB HBM3", "bf16", 0) is None
    assert clock_adjusted_peak("NVIDIA L4", "bf16", 1500) is None  # its clock is not in the table
    assert datasheet_clock_mhz("Tesla T4", "bf16") is None  # no bf16 figure, so no clock
    assert datasheet_clock_mhz("Some Future GPU", "fp32") is None


def test_fp64_shows_in_the_sweeps_peak_column(fake_gpu) -> None:  # noqa: ANN001
    from helpers.matmul import matmul_peak_flops

    fake_gpu("h100_sxm")
    assert matmul_peak_flops("cuda:0", "fp64") == 67e12
    assert matmul_peak_flops("cuda:0", torch.float64) == 67e12
    fake_gpu("t4")
    assert matmul_peak_flops("cuda:0", "fp64") is None
