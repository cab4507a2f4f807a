"""helpers.amp_choice: the AMP dtype rule for described devices, and its probes on this machine."""

from __future__ import annotations

import pytest
import torch

from helpers.amp_choice import (
    AmpChoice,
    amp_for_device,
    check_autocast,
    choose_amp_dtype,
    demo_dtype,
    grad_scaler_works,
    local_cpu_flags,
)
from helpers.devices import DeviceInfo
from helpers.formats import PrecisionError
from helpers.validate import DeviceError

CPU_HAS_FP16 = "amx_fp16" in local_cpu_flags()


MACHINES = [
    ({"kind": "cuda", "compute_capability": (7, 5), "bf16_reported": True}, "fp16", True),
    ({"kind": "cuda", "compute_capability": (7, 0)}, "fp16", True),
    ({"kind": "cuda", "compute_capability": (8, 0)}, "bf16", False),
    ({"kind": "cuda", "compute_capability": [9, 0]}, "bf16", False),
    ({"kind": "cuda", "compute_capability": (6, 1), "bf16_reported": True}, "fp32", False),
    ({"kind": "cpu", "cpu_flags": ["avx512f", "avx512_bf16"]}, "bf16", False),
    ({"kind": "cpu", "cpu_flags": "avx2 amx_bf16 amx_tile"}, "bf16", False),
    ({"kind": "cpu", "cpu_flags": ["avx2", "avx512f"]}, "fp32", False),
    ({"kind": "cpu", "bf16_native": True}, "bf16", False),
    ({"kind": "cpu"}, "fp32", False),
    ({"kind": "rocm", "name": "AMD Instinct MI250X", "bf16_reported": True}, "bf16", False),
    ({"kind": "rocm", "bf16_native": False}, "fp16", True),
    ({"kind": "MPS"}, "fp16", True),
    ({"kind": "xpu"}, "bf16", False),
    ({"kind": "tpu"}, "fp32", False),
]


@pytest.mark.parametrize(("desc", "name", "scaler"), MACHINES)
def test_choose_amp_dtype(desc: dict, name: str, scaler: bool) -> None:
    choice = choose_amp_dtype(desc)
    assert (choice.name, choice.use_scaler) == (name, scaler)
    assert choice.enabled == (name != "fp32") and choice.reason
    assert str(choice).startswith(name)


def test_choose_amp_dtype_from_device_info() -> None:
    t4 = DeviceInfo(
        device="cuda:0",
        kind="cuda",
        name="Tesla T4",
        total_memory=16 * 2**30,
        memory_label="GPU memory",
        compute_capability=(7, 5),
        bf16_reported=True,
        bf16_native=False,
    )
    choice = choose_amp_dtype(t4)
    assert choice.name == "fp16" and choice.use_scaler and "emulate" in choice.reason
    cpu = DeviceInfo(
        device="cpu", kind="cpu", name="x", total_memory=None, memory_label="RAM", bf16_native=True
    )
    assert choose_amp_dtype(cpu).name == "bf16"


T4 = {"kind": "cuda", "name": "Tesla T4", "compute_capability": (7, 5), "bf16_reported": True}
OLD_CPU = {"kind": "cpu", "cpu_flags": ["avx2", "avx512f"]}


@pytest.mark.parametrize(
    ("desc", "prefer", "message"),
    [
        (
            T4,
            "bf16",
            "bf16 cannot run at a useful speed here.*emulated.*fp16 with a GradScaler.*allow_slow",
        ),
        (OLD_CPU, "fp16", "fp16 cannot run at a useful speed here.*slow fallback.*allow_slow=True"),
        (OLD_CPU, "bf16", "no bf16 units"),
        ({"kind": "meta"}, "fp16", "fp16 cannot run on a 'meta' device: torch has no autocast"),
        ({"kind": "mps"}, "bf16", "macOS 14"),
        (T4, "fp8", "Unknown precision 'fp8'"),
        (T4, "float64", "not a mixed-precision choice"),
        ({"name": "no kind"}, "auto", "needs a 'kind'"),
        ({"kind": "cuda"}, "auto", "needs compute_capability"),
        ({"kind": "cuda", "compute_capability": "8.0"}, "auto", r"\(major, minor\) pair"),
    ],
)
def test_choose_amp_dtype_errors(desc: dict, prefer: str, message: str) -> None:
    with pytest.raises(PrecisionError, match=message):
        choose_amp_dtype(desc, prefer=prefer)


def test_choose_amp_dtype_preferences() -> None:
    slow = choose_amp_dtype(T4, prefer="bf16", allow_slow=True)
    assert slow.name == "bf16" and not slow.use_scaler and "emulated" in slow.reason
    fp16 = choose_amp_dtype(OLD_CPU, prefer="fp16", allow_slow=True)
    assert fp16.use_scaler
    assert (
        choose_amp_dtype({"kind": "cpu", "cpu_flags": ["amx_fp16"]}, prefer="fp16").name == "fp16"
    )
    off = choose_amp_dtype(T4, prefer="fp32")
    assert off == AmpChoice(torch.float32, False, "fp32 requested: AMP off") and not off.enabled
    a100 = {"kind": "cuda", "compute_capability": (8, 0)}
    assert choose_amp_dtype(a100, prefer="float16").use_scaler  # fp16 runs fine on an A100
    assert choose_amp_dtype({"kind": "mps", "bf16_native": True}, prefer="bf16").name == "bf16"


# --- probes on this machine ---------------------------------------------------------------------


def test_check_autocast_on_cpu() -> None:
    assert check_autocast("cpu", "bf16") == torch.bfloat16
    assert check_autocast("cpu", torch.float16) == torch.float16
    assert check_autocast("cpu", "fp32") == torch.float32


@pytest.mark.parametrize(
    ("device", "dtype", "error", "message"),
    [
        ("meta", "fp16", PrecisionError, "no autocast for 'meta'"),
        ("cpu", "fp64", PrecisionError, "not a mixed-precision choice"),
        ("cpu", "fp9", PrecisionError, "Unknown precision"),
        ("gpu", "fp16", DeviceError, "not a device name"),
    ],
)
def test_check_autocast_rejects(device: str, dtype: str, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        check_autocast(device, dtype)


def test_grad_scaler_works_on_cpu() -> None:
    assert grad_scaler_works("cpu")


def test_amp_for_this_cpu() -> None:
    flags = local_cpu_flags()
    choice = amp_for_device("cpu")
    native = bool({"avx512_bf16", "amx_bf16"} & set(flags))
    assert choice.name == ("bf16" if native else "fp32") and not choice.use_scaler
    assert amp_for_device("cpu", prefer="fp32").name == "fp32"
    assert amp_for_device("cpu", prefer="fp16", allow_slow=True).name == "fp16"
    if not CPU_HAS_FP16:
        with pytest.raises(PrecisionError, match="fp16 cannot run at a useful speed"):
            amp_for_device("cpu", prefer="fp16")


def test_demo_dtype() -> None:
    bf16 = AmpChoice(torch.bfloat16, False, "x")
    off = AmpChoice(torch.float32, False, "AMP off")
    assert demo_dtype("cpu", bf16) == torch.bfloat16
    assert demo_dtype("cpu", off) == torch.bfloat16  # a CPU demo always uses bf16
    assert demo_dtype("cpu", AmpChoice(torch.float16, True, "x")) == torch.float16
