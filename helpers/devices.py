"""Choosing, checking and describing a device (chapter 1)."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field

import torch

from helpers.units import format_bytes

#: Environment variable that forces a device, e.g. ``COURSE_DEVICE=cpu``.
DEVICE_ENV = "COURSE_DEVICE"


class DeviceError(ValueError):
    """A device that does not exist here, or cannot do what was asked (chapter 1)."""


def _accelerator_module():
    """torch.accelerator where this torch has it (2.6+), else None (chapter 1)."""
    acc = getattr(torch, "accelerator", None)
    return acc if acc is not None and hasattr(acc, "current_accelerator") else None


def accelerator_type() -> str | None:
    """The accelerator kind torch sees ('cuda', 'mps', 'xpu', ...), or None (chapter 1)."""
    acc = _accelerator_module()
    if acc is not None:
        try:
            if acc.is_available():
                return acc.current_accelerator().type
        except RuntimeError:
            return None
        return None
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    return None


def is_rocm() -> bool:
    """True when torch.cuda is backed by AMD ROCm (HIP) rather than NVIDIA CUDA (chapter 1)."""
    return getattr(torch.version, "hip", None) is not None


def available_devices() -> list[str]:
    """Every device string that works on this machine, CPU last (chapter 1)."""
    found: list[str] = []
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        found.append("mps")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        found += [f"xpu:{i}" for i in range(torch.xpu.device_count())]
    return found + ["cpu"]


def _device_count(kind: str) -> int:
    """How many devices of one kind exist here (chapter 1)."""
    if kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    if kind == "mps":
        return 1 if torch.backends.mps.is_available() else 0
    if kind == "xpu":
        return torch.xpu.device_count() if hasattr(torch, "xpu") and torch.xpu.is_available() else 0
    return 1 if kind in ("cpu", "meta") else 0


def resolve_device(spec: str | torch.device | None) -> torch.device:
    """Turn 'cuda:1', 'mps', a torch.device or None (best) into a device that exists (chapter 1)."""
    if spec is None:
        return pick_device()
    if not isinstance(spec, (str, torch.device)):
        raise DeviceError(
            f"A device must be a string such as 'cpu' or 'cuda:0', or a torch.device; "
            f"got {type(spec).__name__} {spec!r}."
        )
    try:
        device = torch.device(spec.strip().lower() if isinstance(spec, str) else spec)
    except RuntimeError as exc:
        raise DeviceError(
            f"{spec!r} is not a device name torch understands ({exc}). "
            f"Devices on this machine: {', '.join(available_devices())}."
        ) from None
    count = _device_count(device.type)
    here = ", ".join(available_devices())
    if count == 0:
        hint = {
            "cuda": "No CUDA/ROCm GPU is visible: check `nvidia-smi` (or `rocm-smi`) and that "
            "you installed a GPU build of torch (torch.version.cuda is "
            f"{torch.version.cuda!r}).",
            "mps": "MPS needs an Apple-silicon Mac with macOS 12.3 or newer.",
            "xpu": "No Intel GPU is visible to this torch build.",
        }.get(device.type, "torch has no such device on this machine.")
        raise DeviceError(f"Device {str(device)!r} is not available. {hint} Devices here: {here}.")
    if device.index is not None and device.index >= count:
        raise DeviceError(
            f"Device {str(device)!r} does not exist: this machine has {count} "
            f"{device.type} device(s), numbered 0 to {count - 1}. Devices here: {here}."
        )
    return device


def pick_device(prefer: str | torch.device | None = None) -> torch.device:
    """The device to use: `prefer`, else $COURSE_DEVICE, else the best accelerator, else CPU (chapter 1)."""
    if prefer is not None:
        return resolve_device(prefer)
    forced = os.environ.get(DEVICE_ENV, "").strip()
    if forced:
        try:
            return resolve_device(forced)
        except DeviceError as exc:
            raise DeviceError(f"${DEVICE_ENV}={forced!r}: {exc} Unset it or fix it.") from None
    kind = accelerator_type()
    if kind in ("cuda", "xpu"):
        return torch.device(kind, 0)
    if kind == "mps":
        return torch.device("mps")
    return torch.device("cpu")


def synchronize(device: str | torch.device) -> None:
    """Wait until all queued work on `device` has finished; a no-op on CPU (chapter 1)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


_DTYPE_NAMES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp64": torch.float64,
    "float64": torch.float64,
    "double": torch.float64,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """'bf16', 'float16', torch.float32 ... -> torch.dtype, with a clear error otherwise (chapter 1)."""
    if isinstance(name, torch.dtype):
        return name
    key = str(name).strip().lower().removeprefix("torch.")
    if key in ("tf32", "tensorfloat32"):
        raise DeviceError(
            f"{name!r} is not a dtype: TF32 is how a GPU may compute fp32 matmuls (tensors stay "
            f"torch.float32). Use 'fp32' and torch.backends.cuda.matmul.allow_tf32, or ask "
            f"peak_flops(name, 'tf32') for its datasheet peak."
        )
    if key not in _DTYPE_NAMES:
        raise DeviceError(
            f"Unknown dtype {name!r}. Use one of: {', '.join(sorted(set(_DTYPE_NAMES)))}."
        )
    return _DTYPE_NAMES[key]


def dtype_name(dtype: torch.dtype) -> str:
    """Short name of a floating dtype: torch.bfloat16 -> 'bf16' (chapter 1)."""
    short = {
        torch.float32: "fp32",
        torch.float16: "fp16",
        torch.bfloat16: "bf16",
        torch.float64: "fp64",
    }
    return short.get(dtype, str(dtype).removeprefix("torch."))


def check_dtype(device: str | torch.device, dtype: str | torch.dtype) -> torch.dtype:
    """Raise a clear DeviceError if `device` cannot do a matmul in `dtype`; return the dtype (chapter 1)."""
    device, dtype = resolve_device(device), parse_dtype(dtype)
    try:
        a = torch.ones(2, 2, device=device, dtype=dtype)
        (a @ a).sum().item()
    except (RuntimeError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DeviceError(
            f"{device} cannot compute in {dtype_name(dtype)} here ({first}). "
            f"Choose another dtype (fp32 works everywhere) or another device."
        ) from None
    return dtype


def cpu_name() -> str:
    """The CPU's model name, as well as the OS tells it (chapter 1)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


#: The precisions the peak table knows: three dtypes, and tf32 (fp32 matmuls on tensor cores).
PEAK_PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16")

#: What describe_device prints where no datasheet peak is known.
UNKNOWN_PEAK = "unknown: measure the achievable rate (chapter 1)"


@dataclass(frozen=True)
class PeakRow:
    """One GPU model: the name pattern it matches, its dense peaks in TFLOP/s, their source (chapter 1)."""

    pattern: str
    tflops: dict[str, float]
    source: str


def _row(
    pattern: str,
    fp32: float,
    tf32: float | None,
    bf16: float | None,
    fp16: float | None,
    source: str,
) -> PeakRow:
    """A PeakRow; None marks a precision this GPU has no fast path for (chapter 1)."""
    peaks = {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16}
    return PeakRow(pattern, {k: v for k, v in peaks.items() if v is not None}, source)


# Dense (no 2:4 sparsity) peaks in TFLOP/s from each vendor's datasheet or whitepaper; where a
# datasheet gives only "with sparsity" tensor figures, they are halved. "fp32" is the plain
# (non-tensor) rate; "tf32" / "bf16" / "fp16" are tensor-core matmuls. For GeForce cards the
# fp16/bf16 figures are the "with FP32 accumulate" ones (what torch's matmuls use; NVIDIA's
# headline "FP16 accumulate" figures are twice these); data-center and pro cards run both at
# full rate. A GPU whose name matches no row gets None (never a neighbour's figures), and a
# precision left out of a row (T4 bf16, tf32 before Ampere) gets None: it has no fast path.
# Names are matched as torch.cuda.get_device_name() prints them, whitespace collapsed; every
# pattern is written to match its own model only (tests/test_fake_gpu_peaks.py checks that
# no real name matches two rows).
_PEAK_TABLE: tuple[PeakRow, ...] = (
    # NVIDIA Blackwell
    _row(r"\bB200\b", 75.0, 1100.0, 2250.0, 2250.0, "NVIDIA HGX B200 datasheet, per GPU"),
    _row(r"\bGB200\b", 80.0, 1250.0, 2500.0, 2500.0, "NVIDIA GB200 NVL72 datasheet, per GPU"),
    _row(
        r"GeForce RTX 5090$",
        104.8,
        104.8,
        209.5,
        209.5,
        "NVIDIA RTX Blackwell GPU architecture whitepaper, RTX 5090 (FP32 accumulate)",
    ),
    # NVIDIA Hopper
    _row(r"\bH100\b(?!.*\b(PCIe|NVL)\b)", 67.0, 494.0, 989.0, 989.0, "NVIDIA H100 datasheet, SXM"),
    _row(r"\bH100\b.*\bPCIe\b", 51.0, 378.0, 756.0, 756.0, "NVIDIA H100 datasheet, PCIe"),
    _row(r"\bH100 NVL\b", 60.0, 418.0, 835.0, 835.0, "NVIDIA H100 NVL datasheet"),
    _row(r"\bH200\b(?!.*\bNVL\b)", 67.0, 494.0, 989.0, 989.0, "NVIDIA H200 datasheet, SXM"),
    _row(r"\bH200 NVL\b", 60.0, 418.0, 835.0, 835.0, "NVIDIA H200 datasheet, NVL"),
    _row(r"\bGH200\b", 67.0, 494.0, 989.0, 989.0, "NVIDIA GH200 Grace Hopper datasheet"),
    _row(
        r"\bH800\b(?!.*\bPCIe\b)",
        67.0,
        494.0,
        989.0,
        989.0,
        "NVIDIA H800 datasheet, SXM (H100 SXM's tensor and fp32 rates; fp64 and NVLink cut)",
    ),
    _row(r"\bH800\b.*\bPCIe\b", 51.0, 378.0, 756.0, 756.0, "NVIDIA H800 datasheet, PCIe"),
    _row(r"\bH20\b", 44.0, 74.0, 148.0, 148.0, "NVIDIA H20 product brief (dense figures)"),
    # NVIDIA Ampere
    _row(r"\bA100\b", 19.5, 156.0, 312.0, 312.0, "NVIDIA A100 datasheet (SXM4 and PCIe)"),
    _row(
        r"\bA800\b",
        19.5,
        156.0,
        312.0,
        312.0,
        "NVIDIA A800 datasheet (A100's compute; NVLink cut to 400 GB/s)",
    ),
    _row(r"\bA30\b", 10.3, 82.0, 165.0, 165.0, "NVIDIA A30 datasheet"),
    # "NVIDIA A10G" (AWS) has no NVIDIA datasheet and other tensor rates than the A10: no row.
    _row(r"\bA10\b", 31.2, 62.5, 125.0, 125.0, "NVIDIA A10 datasheet"),
    _row(r"\bA40\b", 37.4, 74.8, 149.7, 149.7, "NVIDIA A40 datasheet"),
    _row(
        r"\bRTX A6000\b",
        38.7,
        77.4,
        154.8,
        154.8,
        "NVIDIA Ampere GA102 whitepaper, RTX A6000 (the datasheet's 309.7 is with sparsity)",
    ),
    _row(
        r"GeForce RTX 3090$",
        35.6,
        35.6,
        71.0,
        71.0,
        "NVIDIA Ampere GA102 whitepaper, RTX 3090 (FP32 accumulate)",
    ),
    _row(
        r"GeForce RTX 3090 Ti$",
        40.0,
        40.0,
        80.0,
        80.0,
        "NVIDIA RTX 3090 Ti specifications: 40 shader TFLOPS, 320 tensor TFLOPS (FP16 "
        "accumulate, sparse) = 80 dense with FP32 accumulate",
    ),
    _row(
        r"GeForce RTX 3080$",
        29.8,
        29.8,
        59.5,
        59.5,
        "NVIDIA Ampere GA102 whitepaper, RTX 3080 10 GB (FP32 accumulate; the 12 GB model, "
        "same name, has 70 SMs instead of 68: 3% more)",
    ),
    # NVIDIA Ada Lovelace
    _row(r"\bL40S\b", 91.6, 183.0, 362.0, 362.0, "NVIDIA L40S datasheet"),
    _row(r"\bL40\b", 90.5, 90.5, 181.0, 181.0, "NVIDIA L40 datasheet"),
    _row(r"\bL4\b", 30.3, 60.0, 121.0, 121.0, "NVIDIA L4 datasheet"),
    _row(
        r"\bRTX 6000 Ada\b",
        91.1,
        182.1,
        364.2,
        364.2,
        "NVIDIA Ada Lovelace whitepaper, RTX 6000 Ada",
    ),
    _row(
        r"GeForce RTX 4090$",
        82.6,
        82.6,
        165.2,
        165.2,
        "NVIDIA Ada Lovelace whitepaper, RTX 4090 (FP32 accumulate; 330.3 with FP16 accumulate)",
    ),
    _row(
        r"GeForce RTX 4090 D$",
        73.5,
        73.5,
        147.1,
        147.1,
        "NVIDIA RTX 4090 D specifications: 114 of the 4090's 128 SMs at the same clock "
        "(73 shader TFLOPS, 1177 vs 1321 AI TOPS), so the 4090's figures x 114/128",
    ),
    _row(
        r"GeForce RTX 4080$",
        48.7,
        48.7,
        97.5,
        97.5,
        "NVIDIA Ada Lovelace whitepaper, RTX 4080 16 GB (FP32 accumulate)",
    ),
    _row(
        r"GeForce RTX 4070$",
        29.1,
        29.1,
        58.3,
        58.3,
        "NVIDIA RTX 4070 specifications: 29 shader TFLOPS, 466 AI TOPS (FP8, sparse) = 58.3 "
        "fp16 dense with FP32 accumulate (46 SMs x 512 FLOP/clock x 2.475 GHz)",
    ),
    # NVIDIA Turing and Volta: no bf16, no tf32
    _row(r"\bT4\b", 8.1, None, None, 65.0, "NVIDIA T4 datasheet"),
    _row(r"\bV100-SXM2\b", 15.7, None, None, 125.0, "NVIDIA V100 datasheet, SXM2"),
    _row(r"\bV100-PCIE\b", 14.0, None, None, 112.0, "NVIDIA V100 datasheet, PCIe"),
    _row(r"\bV100S-PCIE\b", 16.4, None, None, 130.0, "NVIDIA V100S datasheet"),
    # AMD Instinct, under ROCm (torch.cuda)
    _row(
        r"\bMI300X\b",
        163.4,
        653.7,
        1307.4,
        1307.4,
        "AMD Instinct MI300X datasheet (dense; one torch device in the default SPX mode)",
    ),
    _row(
        r"\bMI250X\b",
        47.9,
        None,
        191.5,
        191.5,
        "AMD Instinct MI250X datasheet, halved: torch sees each of its two GCDs as one device "
        "(fp32 is the matrix rate, 95.7 per module)",
    ),
)


def peak_row(device_name: str) -> PeakRow | None:
    """The peak-table row of a GPU name as torch prints it, or None if the table does not know it (chapter 1)."""
    name = " ".join(str(device_name).split())
    for row in _PEAK_TABLE:
        if re.search(row.pattern, name, flags=re.IGNORECASE):
            return row
    return None


def _peak_precision(dtype: str | torch.dtype, tf32: bool) -> str:
    """'fp32', 'tf32', 'bf16', 'fp16' (or another dtype's short name) for the peak table (chapter 1)."""
    if isinstance(dtype, str) and dtype.strip().lower() in ("tf32", "tensorfloat32"):
        return "tf32"
    key = dtype_name(parse_dtype(dtype))
    return "tf32" if key == "fp32" and tf32 else key


def peak_flops(
    device_name: str, dtype: str | torch.dtype = torch.float32, tf32: bool = False
) -> float | None:
    """Datasheet dense peak FLOP/s of a known GPU for a dtype or 'tf32'; None if unknown or not fast (chapter 1)."""
    key = _peak_precision(dtype, tf32)
    row = peak_row(device_name)
    if row is None or key not in row.tflops:
        return None
    return row.tflops[key] * 1e12


#: ROCm architectures (gcnArchName prefixes) with bf16 matrix instructions: MI100, MI200,
#: MI300, MI350, Radeon RX 7000 and 9000.
_ROCM_BF16_ARCHS: tuple[str, ...] = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def native_bf16(device: str | torch.device) -> bool:
    """Whether `device` computes bf16 in hardware, not by emulation (chapter 1)."""
    device = torch.device(device)
    if device.type == "cuda":
        if is_rocm():
            # torch.cuda.is_bf16_supported() is True on every ROCm GPU; the architecture says
            # whether bf16 matrix instructions exist (MI100 and newer, RDNA3 and newer).
            arch = getattr(torch.cuda.get_device_properties(device), "gcnArchName", "") or ""
            if arch:
                return arch.startswith(_ROCM_BF16_ARCHS)
            return torch.cuda.is_bf16_supported()
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type == "cpu":
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(torch.cpu, p, lambda: False)() for p in probes)
    if device.type == "mps":
        try:
            torch.ones(1, device=device, dtype=torch.bfloat16)
            return True
        except (RuntimeError, TypeError):
            return False
    return False


@dataclass
class DeviceInfo:
    """What the course needs to know about one device (chapter 1)."""

    device: str
    kind: str
    name: str
    total_memory: int | None
    memory_label: str
    compute_capability: tuple[int, int] | None = None
    sm_count: int | None = None
    bf16_reported: bool | None = None
    bf16_native: bool = False
    peak_tflops: dict[str, float] = field(default_factory=dict)

    def rows(self) -> list[tuple[str, str]]:
        """The description as (field, value) pairs for printing (chapter 1)."""
        peaks = ", ".join(f"{k} {v:g}" for k, v in self.peak_tflops.items()) or UNKNOWN_PEAK
        missing = [p for p in PEAK_PRECISIONS if self.peak_tflops and p not in self.peak_tflops]
        if missing:
            peaks += f" (no fast {', '.join(missing)})"
        return [
            ("device", self.device),
            ("kind", self.kind),
            ("name", self.name),
            (
                self.memory_label,
                "unknown" if self.total_memory is None else format_bytes(self.total_memory),
            ),
            (
                "compute capability",
                "n/a"
                if self.compute_capability is None
                else "{}.{}".format(*self.compute_capability),
            ),
            ("SMs / compute units", "n/a" if self.sm_count is None else str(self.sm_count)),
            (
                "bf16 reported by torch",
                "n/a" if self.bf16_reported is None else str(self.bf16_reported),
            ),
            ("bf16 in hardware", str(self.bf16_native)),
            ("datasheet peak TFLOP/s", peaks),
        ]

    def __str__(self) -> str:
        width = max(len(k) for k, _ in self.rows())
        return "\n".join(f"{k:<{width}}  {v}" for k, v in self.rows())

    def _repr_pretty_(self, p, cycle) -> None:  # noqa: ANN001 - IPython's printer protocol
        p.text(str(self))


def describe_device(device: str | torch.device | None = None) -> DeviceInfo:
    """Name, kind, memory, capability, SM count, bf16 and peak FLOP/s of a device (chapter 1)."""
    device = resolve_device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        row = peak_row(props.name)
        return DeviceInfo(
            device=f"cuda:{index}",
            kind="rocm" if is_rocm() else "cuda",
            name=props.name,
            total_memory=props.total_memory,
            memory_label="GPU memory",
            compute_capability=(props.major, props.minor),
            sm_count=props.multi_processor_count,
            bf16_reported=torch.cuda.is_bf16_supported(),
            bf16_native=native_bf16(device),
            peak_tflops={} if row is None else dict(row.tflops),
        )
    if device.type == "mps":
        total = (
            torch.mps.recommended_max_memory()
            if hasattr(torch.mps, "recommended_max_memory")
            else None
        )
        return DeviceInfo(
            device="mps",
            kind="mps",
            name=f"Apple GPU (MPS) on {platform.machine()}",
            total_memory=total,
            memory_label="recommended max memory (shared with the CPU)",
            bf16_native=native_bf16(device),
        )
    if device.type == "xpu":
        props = torch.xpu.get_device_properties(device)
        return DeviceInfo(
            device=str(device),
            kind="xpu",
            name=props.name,
            total_memory=props.total_memory,
            memory_label="GPU memory",
        )
    import psutil

    return DeviceInfo(
        device=str(device),
        kind=device.type,
        name=cpu_name() if device.type == "cpu" else device.type,
        total_memory=psutil.virtual_memory().total if device.type == "cpu" else None,
        memory_label="system RAM (shared with everything else)",
        sm_count=os.cpu_count() if device.type == "cpu" else None,
        bf16_native=native_bf16(device) if device.type == "cpu" else False,
    )
