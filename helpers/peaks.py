"""Datasheet peak FLOP/s of known GPUs, per precision (chapter 1)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from helpers.dtypes import TF32_NAMES, dtype_name, parse_dtype
from helpers.i18n import tr_mark

#: The precisions the peak table knows: three dtypes, and tf32 (fp32 matmuls on tensor cores).
PEAK_PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")

#: What describe_device prints where no datasheet peak is known (through tr() when printed).
UNKNOWN_PEAK = tr_mark("unknown: measure the achievable rate (chapter 1)")


#: Precisions whose datasheet figure is a tensor-core (matrix) rate; the others (fp32, fp64)
#: assume the clock of the FP32/FP64 units where a datasheet gives two clocks.
TENSOR_PRECISIONS: tuple[str, ...] = ("tf32", "bf16", "fp16")


@dataclass(frozen=True)
class PeakRow:
    """One GPU model: the name pattern it matches, its dense peaks in TFLOP/s, their source (chapter 1)."""

    pattern: str
    tflops: dict[str, float]
    source: str
    #: The fp64 matmul rate: FP64 tensor cores where the GPU has them (A100, H100), else its
    #: plain FP64 rate; None where the table does not give it.
    fp64: float | None = None
    #: The clocks (MHz) the figures assume: (FP32/FP64 units, tensor cores); None if unknown.
    boost_mhz: tuple[float, float] | None = None


def _row(
    pattern: str,
    tflops: tuple[float | None, ...],
    source: str,
    *,
    fp64: float | None = None,
    boost_mhz: float | tuple[float, float] | None = None,
) -> PeakRow:
    """A PeakRow from (fp32, tf32, bf16, fp16) TFLOP/s; None marks no fast path (chapter 1)."""
    peaks = {p: v for p, v in zip(PEAK_PRECISIONS, tflops, strict=True) if v is not None}
    clocks = (boost_mhz, boost_mhz) if isinstance(boost_mhz, (int, float)) else boost_mhz
    return PeakRow(pattern, peaks, source, fp64, clocks)


# Dense (no 2:4 sparsity) peaks in TFLOP/s from each vendor's datasheet or whitepaper; where a
# datasheet gives only "with sparsity" tensor figures, they are halved. "fp32" is the plain
# (non-tensor) rate; "tf32" / "bf16" / "fp16" are tensor-core matmuls. For GeForce cards the
# fp16/bf16 figures are the "with FP32 accumulate" ones (what torch's matmuls use; NVIDIA's
# headline "FP16 accumulate" figures are twice these); data-center and pro cards run both at
# full rate. A GPU whose name matches no row gets None (never a neighbour's figures), and a
# precision left out of a row (T4 bf16, tf32 before Ampere) gets None: it has no fast path.
# "fp64" is the rate an fp64 matmul can reach: the FP64 tensor-core figure where the datasheet
# gives one (A100, A30, H100, H200), else the plain FP64 figure (V100); left out where the
# datasheet gives none. "boost_mhz" is the clock the figures assume, where a vendor document
# gives it: (FP32/FP64 units, tensor cores). Peak / clock / SMs is a whole power of two FLOPs
# per clock per SM for each (tests/test_fake_gpu_peaks.py), which checks the pair. The H100
# SXM's tensor figures assume 1830 MHz and its FP32/FP64 figures 1980 MHz (NVIDIA H100
# whitepaper's peak table: 989.4 = 132 SMs x 4096 x 1.83 GHz, 66.9 = 132 x 256 x 1.98 GHz).
# Names are matched as torch.cuda.get_device_name() prints them, whitespace collapsed; every
# pattern is written to match its own model only (tests/test_fake_gpu_peaks.py checks that
# no real name matches two rows).
_PEAK_TABLE: tuple[PeakRow, ...] = (
    # NVIDIA Blackwell
    _row(r"\bB200\b", (75.0, 1100.0, 2250.0, 2250.0), "NVIDIA HGX B200 datasheet, per GPU"),
    _row(r"\bGB200\b", (80.0, 1250.0, 2500.0, 2500.0), "NVIDIA GB200 NVL72 datasheet, per GPU"),
    _row(
        r"GeForce RTX 5090$",
        (104.8, 104.8, 209.5, 209.5),
        "NVIDIA RTX Blackwell GPU architecture whitepaper, RTX 5090 (FP32 accumulate)",
    ),
    # NVIDIA Hopper
    _row(
        r"\bH100\b(?!.*\b(PCIe|NVL)\b)",
        (67.0, 494.0, 989.0, 989.0),
        "NVIDIA H100 datasheet, SXM (FP64 tensor core 67); clocks: H100 whitepaper",
        fp64=67.0,
        boost_mhz=(1980.0, 1830.0),
    ),
    _row(
        r"\bH100\b.*\bPCIe\b",
        (51.0, 378.0, 756.0, 756.0),
        "NVIDIA H100 datasheet, PCIe (FP64 tensor core 51)",
        fp64=51.0,
    ),
    _row(
        r"\bH100 NVL\b",
        (60.0, 418.0, 835.0, 835.0),
        "NVIDIA H100 NVL datasheet (FP64 tensor core 60)",
        fp64=60.0,
    ),
    _row(
        r"\bH200\b(?!.*\bNVL\b)",
        (67.0, 494.0, 989.0, 989.0),
        "NVIDIA H200 datasheet, SXM (FP64 tensor core 67); the H100 SXM's SMs and figures, so "
        "its clocks",
        fp64=67.0,
        boost_mhz=(1980.0, 1830.0),
    ),
    _row(
        r"\bH200 NVL\b",
        (60.0, 418.0, 835.0, 835.0),
        "NVIDIA H200 datasheet, NVL (FP64 tensor core 60)",
        fp64=60.0,
    ),
    _row(
        r"\bGH200\b",
        (67.0, 494.0, 989.0, 989.0),
        "NVIDIA GH200 Grace Hopper datasheet (FP64 tensor core 67)",
        fp64=67.0,
    ),
    _row(
        r"\bH800\b(?!.*\bPCIe\b)",
        (67.0, 494.0, 989.0, 989.0),
        "NVIDIA H800 datasheet, SXM (H100 SXM's tensor and fp32 rates; fp64 and NVLink cut)",
    ),
    _row(r"\bH800\b.*\bPCIe\b", (51.0, 378.0, 756.0, 756.0), "NVIDIA H800 datasheet, PCIe"),
    _row(r"\bH20\b", (44.0, 74.0, 148.0, 148.0), "NVIDIA H20 product brief (dense figures)"),
    # NVIDIA Ampere
    _row(
        r"\bA100\b",
        (19.5, 156.0, 312.0, 312.0),
        "NVIDIA A100 datasheet, SXM4 and PCIe (FP64 tensor core 19.5); clock: Ampere GA100 "
        "whitepaper, 1410 MHz boost",
        fp64=19.5,
        boost_mhz=1410.0,
    ),
    _row(
        r"\bA800\b",
        (19.5, 156.0, 312.0, 312.0),
        "NVIDIA A800 datasheet (A100's compute; NVLink cut to 400 GB/s)",
    ),
    _row(
        r"\bA30\b",
        (10.3, 82.0, 165.0, 165.0),
        "NVIDIA A30 datasheet (FP64 tensor core 10.3)",
        fp64=10.3,
    ),
    # "NVIDIA A10G" (AWS) has no NVIDIA datasheet and other tensor rates than the A10: no row.
    _row(r"\bA10\b", (31.2, 62.5, 125.0, 125.0), "NVIDIA A10 datasheet"),
    _row(r"\bA40\b", (37.4, 74.8, 149.7, 149.7), "NVIDIA A40 datasheet"),
    _row(
        r"\bRTX A6000\b",
        (38.7, 77.4, 154.8, 154.8),
        "NVIDIA Ampere GA102 whitepaper, RTX A6000 (the datasheet's 309.7 is with sparsity)",
    ),
    _row(
        r"GeForce RTX 3090$",
        (35.6, 35.6, 71.0, 71.0),
        "NVIDIA Ampere GA102 whitepaper, RTX 3090 (FP32 accumulate)",
    ),
    _row(
        r"GeForce RTX 3090 Ti$",
        (40.0, 40.0, 80.0, 80.0),
        "NVIDIA RTX 3090 Ti specifications: 40 shader TFLOPS, 320 tensor TFLOPS (FP16 "
        "accumulate, sparse) = 80 dense with FP32 accumulate",
    ),
    _row(
        r"GeForce RTX 3080$",
        (29.8, 29.8, 59.5, 59.5),
        "NVIDIA Ampere GA102 whitepaper, RTX 3080 10 GB (FP32 accumulate; the 12 GB model, "
        "same name, has 70 SMs instead of 68: 3% more)",
    ),
    # NVIDIA Ada Lovelace
    _row(r"\bL40S\b", (91.6, 183.0, 362.0, 362.0), "NVIDIA L40S datasheet"),
    _row(r"\bL40\b", (90.5, 90.5, 181.0, 181.0), "NVIDIA L40 datasheet"),
    _row(r"\bL4\b", (30.3, 60.0, 121.0, 121.0), "NVIDIA L4 datasheet"),
    _row(
        r"\bRTX 6000 Ada\b",
        (91.1, 182.1, 364.2, 364.2),
        "NVIDIA Ada Lovelace whitepaper, RTX 6000 Ada",
    ),
    _row(
        r"GeForce RTX 4090$",
        (82.6, 82.6, 165.2, 165.2),
        "NVIDIA Ada Lovelace whitepaper, RTX 4090 (FP32 accumulate; 330.3 with FP16 "
        "accumulate; 2520 MHz boost)",
        boost_mhz=2520.0,
    ),
    _row(
        r"GeForce RTX 4090 D$",
        (73.5, 73.5, 147.1, 147.1),
        "NVIDIA RTX 4090 D specifications: 114 of the 4090's 128 SMs at the same clock "
        "(73 shader TFLOPS, 1177 vs 1321 AI TOPS), so the 4090's figures x 114/128",
    ),
    _row(
        r"GeForce RTX 4080$",
        (48.7, 48.7, 97.5, 97.5),
        "NVIDIA Ada Lovelace whitepaper, RTX 4080 16 GB (FP32 accumulate)",
    ),
    _row(
        r"GeForce RTX 4070$",
        (29.1, 29.1, 58.3, 58.3),
        "NVIDIA RTX 4070 specifications: 29 shader TFLOPS, 466 AI TOPS (FP8, sparse) = 58.3 "
        "fp16 dense with FP32 accumulate (46 SMs x 512 FLOP/clock x 2.475 GHz)",
    ),
    # NVIDIA Turing and Volta: no bf16, no tf32
    _row(
        r"\bT4\b",
        (8.1, None, None, 65.0),
        "NVIDIA T4 datasheet; clock: Turing whitepaper, 1590 MHz boost",
        boost_mhz=1590.0,
    ),
    _row(
        r"\bV100-SXM2\b",
        (15.7, None, None, 125.0),
        "NVIDIA V100 datasheet, SXM2 (FP64 7.8, no FP64 tensor cores); clock: Volta "
        "whitepaper, 1530 MHz boost",
        fp64=7.8,
        boost_mhz=1530.0,
    ),
    _row(
        r"\bV100-PCIE\b",
        (14.0, None, None, 112.0),
        "NVIDIA V100 datasheet, PCIe (FP64 7); clock: 1380 MHz boost",
        fp64=7.0,
        boost_mhz=1380.0,
    ),
    _row(
        r"\bV100S-PCIE\b", (16.4, None, None, 130.0), "NVIDIA V100S datasheet (FP64 8.2)", fp64=8.2
    ),
    # AMD Instinct, under ROCm (torch.cuda)
    _row(
        r"\bMI300X\b",
        (163.4, 653.7, 1307.4, 1307.4),
        "AMD Instinct MI300X datasheet (dense; one torch device in the default SPX mode; FP64 "
        "matrix 163.4)",
        fp64=163.4,
    ),
    _row(
        r"\bMI250X\b",
        (47.9, None, 191.5, 191.5),
        "AMD Instinct MI250X datasheet, halved: torch sees each of its two GCDs as one device "
        "(fp32 and fp64 are the matrix rates, 95.7 per module)",
        fp64=47.9,
    ),
)


def peak_row(device_name: str) -> PeakRow | None:
    """The peak-table row of a GPU name as torch prints it, or None if the table does not know it (chapter 1)."""
    name = " ".join(str(device_name).split())
    return next((r for r in _PEAK_TABLE if re.search(r.pattern, name, re.IGNORECASE)), None)


def peak_flops(
    device_name: str, dtype: str | torch.dtype = torch.float32, tf32: bool = False
) -> float | None:
    """Datasheet dense peak FLOP/s of a known GPU for a dtype or 'tf32'; None if unknown or not fast (chapter 1)."""
    key, row = _precision(dtype, tf32), peak_row(device_name)
    if row is None:
        return None
    tflops = row.fp64 if key == "fp64" else row.tflops.get(key)
    return None if tflops is None else tflops * 1e12


def _precision(dtype: str | torch.dtype, tf32: bool) -> str:
    """The table's name of a dtype or 'tf32': fp32, tf32, bf16, fp16, fp64 (chapter 1)."""
    if isinstance(dtype, str) and dtype.strip().lower() in TF32_NAMES:
        return "tf32"
    key = dtype_name(parse_dtype(dtype))
    return "tf32" if key == "fp32" and tf32 else key


def datasheet_clock_mhz(
    device_name: str, dtype: str | torch.dtype = torch.float32, tf32: bool = False
) -> float | None:
    """The clock (MHz) a GPU's datasheet peak for `dtype` assumes, None where unknown (chapter 1)."""
    key, row = _precision(dtype, tf32), peak_row(device_name)
    if row is None or row.boost_mhz is None or peak_flops(device_name, key) is None:
        return None
    return row.boost_mhz[1] if key in TENSOR_PRECISIONS else row.boost_mhz[0]


def clock_adjusted_peak(
    device_name: str, dtype: str | torch.dtype, clock_mhz: float | None, tf32: bool = False
) -> float | None:
    """The datasheet peak FLOP/s rescaled to `clock_mhz`: FLOPs per clock x the clock (chapter 1)."""
    peak, boost = (
        peak_flops(device_name, dtype, tf32),
        datasheet_clock_mhz(device_name, dtype, tf32),
    )
    if peak is None or boost is None or clock_mhz is None or not clock_mhz > 0:
        return None
    return peak / (boost * 1e6) * clock_mhz * 1e6
