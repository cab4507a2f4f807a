"""Choosing, checking and describing a device (chapter 1)."""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field

import torch

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


# Dense (no sparsity) datasheet peaks in TFLOP/s. Sources: NVIDIA datasheets for H100/H200,
# A100, L40S, L4, A10, T4 and V100, and the NVIDIA Ampere GA102 and Ada AD102 architecture
# whitepapers for the RTX 3090 / 4090 (tensor-core fp16/bf16 with fp32 accumulate).
# Patterns are tried in order, so the more specific ones come first. Entries left out of a
# dictionary are not fast on that GPU (a T4 has no native bf16 or tf32).
_PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    (r"H100.*PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0}),
    (r"H100.*NVL", {"fp32": 60.0, "tf32": 418.0, "bf16": 835.0, "fp16": 835.0}),
    (r"\bG?H(100|200)\b", {"fp32": 67.0, "tf32": 494.0, "bf16": 989.0, "fp16": 989.0}),
    (r"\bA100\b", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (r"\bL40S\b", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0}),
    (r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
    (r"\bA10\b", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}),
    (r"\bT4\b", {"fp32": 8.1, "fp16": 65.0}),
    (r"V100.*PCIE", {"fp32": 14.0, "fp16": 112.0}),
    (r"\bV100\b", {"fp32": 15.7, "fp16": 125.0}),
    (r"RTX 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2}),
    (r"RTX 3090", {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0}),
]


def peak_flops(
    device_name: str, dtype: str | torch.dtype = torch.float32, tf32: bool = False
) -> float | None:
    """Datasheet dense peak FLOP/s of a known GPU for `dtype`, or None if unknown (chapter 1)."""
    key = dtype_name(parse_dtype(dtype))
    if key == "fp32" and tf32:
        key = "tf32"
    for pattern, peaks in _PEAK_TFLOPS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            tflops = peaks.get(key)
            return None if tflops is None else tflops * 1e12
    return None


def native_bf16(device: str | torch.device) -> bool:
    """Whether `device` computes bf16 in hardware, not by emulation (chapter 1)."""
    device = torch.device(device)
    if device.type == "cuda":
        if is_rocm():
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
        from helpers.memory import format_bytes

        peaks = ", ".join(f"{k} {v:g}" for k, v in self.peak_tflops.items()) or "unknown"
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
        peaks = {k: peak_flops(props.name, k) for k in ("fp32", "tf32", "bf16", "fp16")}
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
            peak_tflops={k: v / 1e12 for k, v in peaks.items() if v is not None},
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
