"""helpers.nvml_snapshot never raises: it returns samples or says why NVML is unavailable."""

from __future__ import annotations

import builtins
import sys

import pytest

from helpers.nvml_snapshot import GpuSample, NvmlUnavailable, format_snapshot, nvml_snapshot


def test_snapshot_here_is_samples_or_a_reason() -> None:
    snap = nvml_snapshot()
    if isinstance(snap, NvmlUnavailable):
        assert str(snap).startswith("unavailable: ") and not snap
    else:
        assert all(isinstance(s, GpuSample) for s in snap)
    assert format_snapshot(snap)


def test_missing_package_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_pynvml(name: str, *args: object, **kwargs: object):  # noqa: ANN202
        if name == "pynvml":
            raise ImportError("no module named pynvml")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    snap = nvml_snapshot()
    assert isinstance(snap, NvmlUnavailable) and "nvidia-ml-py" in snap.reason


def test_failing_driver_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def boom() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", boom)
    snap = nvml_snapshot()
    assert isinstance(snap, NvmlUnavailable) and "driver" in snap.reason


def test_format_snapshot_of_samples() -> None:
    s = GpuSample(0, "NVIDIA H100 80GB HBM3", 97, 40 * 2**30, 80 * 2**30, 61, 512.3)
    text = format_snapshot([s])
    assert "H100" in text and "97%" in text and "40.00 GiB" in text and "512 W" in text
    partial = GpuSample(1, "Tesla T4", None, None, None, None, None)
    assert "n/a" in format_snapshot([partial])
