"""Choosing, checking and describing a device (chapter 1)."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
import torch

from helpers.dtypes import dtype_name, parse_dtype
from helpers.i18n import tr, tr_mark
from helpers.peaks import PEAK_PRECISIONS, UNKNOWN_PEAK, peak_row
from helpers.tables import padded, screen_width
from helpers.units import Printed, format_bytes
from helpers.validate import DeviceError, first_line

#: Environment variable that forces a device, e.g. ``COURSE_DEVICE=cpu``.
DEVICE_ENV = "COURSE_DEVICE"

#: NVIDIA compute capability from which bf16 is native and TF32 exists (Ampere and newer).
BF16_CAPABILITY = TF32_CAPABILITY = (8, 0)

#: How describe_device words its booleans (printed through tr()).
_BOOLEANS = (tr_mark("True"), tr_mark("False"))

#: gcnArchName prefixes of ROCm GPUs with bf16 matrix instructions: MI100 to MI350, RX 7000+.
_ROCM_BF16_ARCHS: tuple[str, ...] = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def is_rocm() -> bool:
    """True when torch.cuda is backed by AMD ROCm (HIP) rather than NVIDIA CUDA (chapter 1)."""
    return getattr(torch.version, "hip", None) is not None


def available_devices() -> list[str]:
    """Every device string that works on this machine, best first, CPU last (chapter 1)."""
    found: list[str] = []
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        found.append("mps")
    if torch.xpu.is_available():
        found += [f"xpu:{i}" for i in range(torch.xpu.device_count())]
    return found + ["cpu"]


def accelerator_type() -> str | None:
    """The accelerator kind torch sees ('cuda', 'mps', 'xpu'), or None (chapter 1)."""
    kind = torch.device(available_devices()[0]).type
    return None if kind == "cpu" else kind


def resolve_device(spec: str | torch.device | None) -> torch.device:
    """Turn 'cuda:1', 'mps', a torch.device or None (best) into a device that exists (chapter 1)."""
    if spec is None:
        return pick_device()
    if not isinstance(spec, (str, torch.device)):
        raise DeviceError(
            tr(
                "A device must be a string such as 'cpu' or 'cuda:0', or a torch.device; "
                "got {type} {spec!r}."
            ).format(type=type(spec).__name__, spec=spec)
        )
    found = available_devices()
    here = ", ".join(found)
    try:
        device = torch.device(spec.strip().lower() if isinstance(spec, str) else spec)
    except RuntimeError as exc:
        raise DeviceError(
            tr(
                "{spec!r} is not a device name torch understands ({error}). "
                "Devices on this machine: {here}."
            ).format(spec=spec, error=exc, here=here)
        ) from None
    count = [torch.device(d).type for d in [*found, "meta"]].count(device.type)
    if count == 0:
        hint = {
            "cuda": tr(
                "No CUDA/ROCm GPU is visible: check `nvidia-smi` (or `rocm-smi`) and that "
                "you installed a GPU build of torch (torch.version.cuda is {cuda!r})."
            ).format(cuda=torch.version.cuda),
            "mps": tr("MPS needs an Apple-silicon Mac with macOS 12.3 or newer."),
            "xpu": tr("No Intel GPU is visible to this torch build."),
        }.get(device.type, tr("torch has no such device on this machine."))
        raise DeviceError(
            tr("Device {device!r} is not available. {hint} Devices here: {here}.").format(
                device=str(device), hint=hint, here=here
            )
        )
    if device.index is not None and device.index >= count:
        raise DeviceError(
            tr(
                "Device {device!r} does not exist: this machine has {count} {kind} device(s), "
                "numbered 0 to {last}. Devices here: {here}."
            ).format(device=str(device), count=count, kind=device.type, last=count - 1, here=here)
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
            raise DeviceError(
                tr("${name}={value!r}: {error} Unset it or fix it.").format(
                    name=DEVICE_ENV, value=forced, error=exc
                )
            ) from None
    return torch.device(available_devices()[0])


def synchronize(device: str | torch.device) -> None:
    """Wait until all queued work on `device` has finished; a no-op on CPU (chapter 1)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


def check_dtype(device: str | torch.device, dtype: str | torch.dtype) -> torch.dtype:
    """Raise a clear DeviceError if `device` cannot do a matmul in `dtype`; return the dtype (chapter 1)."""
    device, dtype = resolve_device(device), parse_dtype(dtype)
    try:
        a = torch.ones(2, 2, device=device, dtype=dtype)
        (a @ a).sum().item()
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(
            tr(
                "{device} cannot compute in {dtype} here ({error}). "
                "Choose another dtype (fp32 works everywhere) or another device."
            ).format(device=device, dtype=dtype_name(dtype), error=first_line(exc))
        ) from None
    return dtype


def native_bf16(device: str | torch.device) -> bool:
    """Whether `device` computes bf16 in hardware, not by emulation (chapter 1)."""
    device = torch.device(device)
    if device.type == "cuda" and is_rocm():
        # torch.cuda.is_bf16_supported() is True on every ROCm GPU: the architecture tells.
        arch = getattr(torch.cuda.get_device_properties(device), "gcnArchName", "")
        return arch.startswith(_ROCM_BF16_ARCHS) if arch else torch.cuda.is_bf16_supported()
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device) >= BF16_CAPABILITY
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


def cpu_name() -> str:
    """The CPU's model name, as well as the OS tells it (chapter 1)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or tr("unknown CPU")


@dataclass
class DeviceInfo(Printed):
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
        """The description as (field, value) pairs, in English: code looks fields up by name (chapter 1)."""
        return self._rows(str)

    def _rows(self, say: Callable[[str], str]) -> list[tuple[str, str]]:
        """rows(), each field name and worded value passed through `say` (tr() when printed) (chapter 1)."""
        peaks = ", ".join(f"{k} {v:g}" for k, v in self.peak_tflops.items()) or say(UNKNOWN_PEAK)
        missing = [p for p in PEAK_PRECISIONS if self.peak_tflops and p not in self.peak_tflops]
        if missing:
            peaks += say(tr_mark(" (no fast {precisions})")).format(precisions=", ".join(missing))
        memory, cc, sms = self.total_memory, self.compute_capability, self.sm_count
        bf16, na = self.bf16_reported, say(tr_mark("n/a"))
        return [
            (say(tr_mark("device")), self.device),
            (say(tr_mark("kind")), self.kind),
            (say(tr_mark("name")), self.name),
            (
                say(self.memory_label),
                say(tr_mark("unknown")) if memory is None else format_bytes(memory),
            ),
            (say(tr_mark("compute capability")), na if cc is None else f"{cc[0]}.{cc[1]}"),
            (say(tr_mark("SMs / compute units")), na if sms is None else str(sms)),
            (say(tr_mark("bf16 reported by torch")), na if bf16 is None else say(str(bf16))),
            (say(tr_mark("bf16 in hardware")), say(str(self.bf16_native))),
            (say(tr_mark("datasheet peak TFLOP/s")), peaks),
        ]

    def __str__(self) -> str:
        rows = self._rows(lambda text: tr(text) if text else text)
        width = max(screen_width(k) for k, _ in rows)
        return "\n".join(f"{padded(k, width, left=True)}  {v}" for k, v in rows)


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
            memory_label=tr_mark("GPU memory"),
            compute_capability=(props.major, props.minor),
            sm_count=props.multi_processor_count,
            bf16_reported=torch.cuda.is_bf16_supported(),
            bf16_native=native_bf16(device),
            peak_tflops={} if row is None else dict(row.tflops),
        )
    if device.type == "mps":
        return DeviceInfo(
            device="mps",
            kind="mps",
            name=tr("Apple GPU (MPS) on {machine}").format(machine=platform.machine()),
            total_memory=torch.mps.recommended_max_memory(),
            memory_label=tr_mark("recommended max memory (shared with the CPU)"),
            bf16_native=native_bf16(device),
        )
    if device.type == "xpu":
        props = torch.xpu.get_device_properties(device)
        return DeviceInfo(str(device), "xpu", props.name, props.total_memory, tr_mark("GPU memory"))
    cpu = device.type == "cpu"
    return DeviceInfo(
        device=str(device),
        kind=device.type,
        name=cpu_name() if cpu else device.type,
        total_memory=psutil.virtual_memory().total if cpu else None,
        memory_label=tr_mark("system RAM (shared with everything else)"),
        sm_count=os.cpu_count() if cpu else None,
        bf16_native=cpu and native_bf16(device),
    )
