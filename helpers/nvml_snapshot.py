"""One NVML snapshot of every NVIDIA GPU through nvidia-ml-py; never raises (chapter 1)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from helpers.i18n import tr
from helpers.tables import padded, screen_width
from helpers.units import format_bytes

#: The screen column where each word of format_snapshot's header after "GPU" starts.
_HEADER_AT = (5, 35, 42, 66, 73)


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
        return tr("unavailable: {reason}").format(reason=self.reason)


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
            tr("the nvidia-ml-py package is not installed (pip install nvidia-ml-py)")
        )
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        return NvmlUnavailable(
            tr("no NVIDIA driver could be loaded ({error})").format(
                error=f"{type(exc).__name__}: {exc}"
            )
        )
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
        return NvmlUnavailable(
            tr("NVML failed while reading the GPUs ({error})").format(
                error=f"{type(exc).__name__}: {exc}"
            )
        )
    finally:
        _try(pynvml.nvmlShutdown)


def format_snapshot(snapshot: list[GpuSample] | NvmlUnavailable) -> str:
    """A small text table of an nvml_snapshot(), or its 'unavailable: ...' line (chapter 1)."""
    if isinstance(snapshot, NvmlUnavailable):
        return f"NVML {snapshot}"
    if not snapshot:
        return tr("NVML works but reports no GPUs.")
    na = tr("n/a")

    def show(value, fmt):  # noqa: ANN001, ANN202
        return na if value is None else fmt(value)

    def line(index: str, name: str, util: str, mem: str, temp: str, power: str) -> str:
        # padded by screen width: a translated "n/a" is wider than its characters
        return " ".join(
            [padded(index, 4, left=True), padded(name, 29, left=True), padded(util, 5) + "  ",
             padded(mem, 22, left=True), padded(temp, 6), padded(power, 6)]
        )  # fmt: skip

    words = ("GPU", tr("name"), tr("util"), tr("memory used / total"), tr("temp"), tr("power"))
    head = words[0]
    for word, at in zip(words[1:], _HEADER_AT):  # each header word at its column, 1 apart at least
        head = (padded(head, at, left=True) if screen_width(head) < at else head + " ") + word
    lines = [head]
    for s in snapshot:
        mem = f"{show(s.memory_used, format_bytes)} / {show(s.memory_total, format_bytes)}"
        lines.append(
            line(
                str(s.index),
                s.name[:29],
                show(s.utilization_pct, lambda v: f"{v}%"),
                mem,
                show(s.temperature_c, lambda v: f"{v} C"),
                show(s.power_w, lambda v: f"{v:.0f} W"),
            )
        )
    return "\n".join(lines)
