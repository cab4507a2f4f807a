"""helpers.devices on this machine (CPU) and with CUDA faked away or forced by the environment."""

from __future__ import annotations

import pytest
import torch

from helpers import devices, dtypes, peaks
from helpers.validate import DeviceError


def test_pick_device_defaults_to_an_available_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(devices.DEVICE_ENV, raising=False)
    d = devices.pick_device()
    assert str(d) in devices.available_devices() or f"{d.type}:0" in devices.available_devices()


def test_environment_override_forces_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(devices.DEVICE_ENV, "cpu")
    assert devices.pick_device() == torch.device("cpu")


def test_bad_environment_override_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(devices.DEVICE_ENV, "cuda:7")
    with pytest.raises(DeviceError, match=devices.DEVICE_ENV):
        devices.pick_device()


def test_prefer_beats_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(devices.DEVICE_ENV, "cuda:7")
    assert devices.pick_device("cpu") == torch.device("cpu")


def test_cpu_is_always_available() -> None:
    assert devices.available_devices()[-1] == "cpu"
    assert devices.resolve_device(" CPU ") == torch.device("cpu")
    assert devices.resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_meta_device_resolves() -> None:
    assert devices.resolve_device("meta").type == "meta"


def test_accelerator_type_matches_torch() -> None:
    kind = devices.accelerator_type()
    assert kind is None or kind in ("cuda", "mps", "xpu", "mtia", "hpu")
    if not torch.cuda.is_available() and not torch.backends.mps.is_available():
        assert kind in (None, "xpu")


def test_fallback_without_torch_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch, "accelerator", raising=False)
    expected = (
        "cuda"
        if torch.cuda.is_available()
        else ("mps" if torch.backends.mps.is_available() else None)
    )
    assert devices.accelerator_type() in (expected, "xpu")


def test_synchronize_on_cpu_is_a_no_op() -> None:
    devices.synchronize("cpu")
    devices.synchronize(torch.device("cpu"))


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("bf16", torch.bfloat16),
        ("float16", torch.float16),
        ("FP32", torch.float32),
        ("torch.float64", torch.float64),
    ],
)
def test_parse_dtype(name: str, dtype: torch.dtype) -> None:
    assert dtypes.parse_dtype(name) is dtype
    assert dtypes.parse_dtype(dtype) is dtype


def test_check_dtype_fp32_on_cpu() -> None:
    assert devices.check_dtype("cpu", "fp32") is torch.float32


def test_describe_cpu() -> None:
    info = devices.describe_device("cpu")
    assert info.kind == "cpu" and info.total_memory and info.total_memory > 0
    assert info.compute_capability is None and info.peak_tflops == {}
    text = str(info)
    assert "system RAM" in text and "unknown" in text  # peak FLOP/s unknown for CPUs


@pytest.mark.parametrize(
    ("name", "dtype", "tf32", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", False, 989e12),
        ("NVIDIA H100 PCIe", "fp32", False, 51e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", True, 156e12),
        ("NVIDIA A100-PCIE-40GB", "bf16", False, 312e12),
        ("Tesla T4", "fp16", False, 65e12),
        ("Tesla T4", "bf16", False, None),  # emulated, not a real peak
        ("NVIDIA A10", "fp32", False, 31.2e12),
        ("NVIDIA L4", "bf16", False, 121e12),
        ("NVIDIA L40S", "bf16", False, 362e12),
        ("Some Future GPU", "fp32", False, None),
    ],
)
def test_peak_flops_table(name: str, dtype: str, tf32: bool, expected: float | None) -> None:
    assert peaks.peak_flops(name, dtype, tf32=tf32) == expected


def test_native_bf16_on_cpu_is_a_bool() -> None:
    assert isinstance(devices.native_bf16("cpu"), bool)


def test_dtype_name() -> None:
    assert dtypes.dtype_name(torch.bfloat16) == "bf16"
    assert dtypes.dtype_name(torch.int8) == "int8"


def test_device_info_pretty_prints_as_its_table() -> None:
    info = devices.describe_device("cpu")

    class Printer:
        text_parts: list[str] = []

        def text(self, s: str) -> None:
            self.text_parts.append(s)

    p = Printer()
    info._repr_pretty_(p, False)
    assert p.text_parts == [str(info)]


def test_check_dtype_explains_a_device_that_cannot_compute() -> None:
    # the meta device holds no data, so .item() fails the way a missing kernel does on a GPU
    with pytest.raises(
        DeviceError, match=r"meta cannot compute in fp32 here \(.*\)\. Choose another"
    ):
        devices.check_dtype("meta", "fp32")
