"""One NVML snapshot of every NVIDIA GPU through nvidia-ml-py; never raises (chapter 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from helpers.units import format_bytes


@dataclass
class GpuSample:
    """One GPU as NVML sees it at one moment (chapter 1)."""

    index: int
    name: str
    utilization_pct: int | None
    memory_used: int | None
    memory_total: int | None
    temperature_c: int | None
    power_w: float | None


@dataclass
class NvmlUnavailable:
    """Why NVML could not be read here (chapter 1)."""

    reason: str

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"unavailable: {self.reason}"


def _try(read, default=None):  # noqa: ANN001, ANN202 - tiny internal adapter
    """Call one NVML getter; None where the GPU does not support that reading (chapter 1)."""
    try:
        return read()
    except Exception:  # NVMLError_NotSupported and friends
        return default


def nvml_handle(pynvml: Any, device: torch.device) -> Any:
    """NVML's handle of torch's CUDA `device`, by UUID: NVML ignores CUDA_VISIBLE_DEVICES (chapter 1)."""
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid[:4] in ("GPU-", "MIG-") else f"GPU-{uuid}")


def nvml_snapshot() -> list[GpuSample] | NvmlUnavailable:
    """Utilisation, memory, temperature and power of each NVIDIA GPU, or why not (chapter 1)."""
    try:
        import pynvml
    except ImportError:
        return NvmlUnavailable(
            "the nvidia-ml-py package is not installed (pip install nvidia-ml-py)"
        )
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        return NvmlUnavailable(f"no NVIDIA driver could be loaded ({type(exc).__name__}: {exc})")
    try:
        samples = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = _try(lambda h=h: pynvml.nvmlDeviceGetMemoryInfo(h))
            util = _try(lambda h=h: pynvml.nvmlDeviceGetUtilizationRates(h))
            temp = _try(lambda h=h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
            power_mw = _try(lambda h=h: pynvml.nvmlDeviceGetPowerUsage(h))
            samples.append(
                GpuSample(
                    index=i,
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    utilization_pct=None if util is None else int(util.gpu),
                    memory_used=None if mem is None else int(mem.used),
                    memory_total=None if mem is None else int(mem.total),
                    temperature_c=None if temp is None else int(temp),
                    power_w=None if power_mw is None else power_mw / 1000.0,
                )
            )
        return samples
    except Exception as exc:
        return NvmlUnavailable(f"NVML failed while reading the GPUs ({type(exc).__name__}: {exc})")
    finally:
        _try(pynvml.nvmlShutdown)


def format_snapshot(snapshot: list[GpuSample] | NvmlUnavailable) -> str:
    """A small text table of an nvml_snapshot(), or its 'unavailable: ...' line (chapter 1)."""
    if isinstance(snapshot, NvmlUnavailable):
        return f"NVML {snapshot}"
    if not snapshot:
        return "NVML works but reports no GPUs."

    def show(value, fmt):  # noqa: ANN001, ANN202
        return "n/a" if value is None else fmt(value)

    lines = ["GPU  name                          util   memory used / total     temp   power"]
    for s in snapshot:
        mem = f"{show(s.memory_used, format_bytes)} / {show(s.memory_total, format_bytes)}"
        lines.append(
            f"{s.index:<4} {s.name[:29]:<29} {show(s.utilization_pct, lambda v: f'{v}%'):>5}   "
            f"{mem:<22} {show(s.temperature_c, lambda v: f'{v} C'):>6} {show(s.power_w, lambda v: f'{v:.0f} W'):>6}"
        )
    return "\n".join(lines)
