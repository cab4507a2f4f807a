"""helpers.devices on every fake GPU: choosing, resolving, describing, bf16 (tests/fake_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from fake_gpu import KINDS, SPECS

from helpers import devices, peaks
from helpers.devices import describe_device
from helpers.validate import DeviceError

GPU_KINDS = [k for k in KINDS if SPECS[k].backend != "mps"]

#: What each fake GPU's description must say: (kind, memory, capability, SMs, bf16 reported,
#: bf16 in hardware, datasheet peak row).
EXPECTED_ROWS = {
    "h100_sxm": (
        "cuda",
        "79.18 GiB",
        "9.0",
        "132",
        "True",
        "True",
        "fp32 67, tf32 494, bf16 989, fp16 989",
    ),
    "a100": (
        "cuda",
        "79.15 GiB",
        "8.0",
        "108",
        "True",
        "True",
        "fp32 19.5, tf32 156, bf16 312, fp16 312",
    ),
    "t4": (
        "cuda",
        "14.74 GiB",
        "7.5",
        "40",
        "True",
        "False",
        "fp32 8.1, fp16 65 (no fast tf32, bf16)",
    ),
    "rtx4090": (
        "cuda",
        "23.64 GiB",
        "8.9",
        "128",
        "True",
        "True",
        "fp32 82.6, tf32 82.6, bf16 165.2, fp16 165.2",
    ),
    "mi300x": (
        "rocm",
        "191.98 GiB",
        "9.4",
        "304",
        "True",
        "True",
        "fp32 163.4, tf32 653.7, bf16 1307.4, fp16 1307.4",
    ),
}


@pytest.mark.parametrize("kind", GPU_KINDS)
def test_describe_device_on_every_fake_gpu(fake_gpu, kind: str) -> None:
    gpu = fake_gpu(kind)
    info = describe_device()  # the config cell's call: the best device, i.e. the fake GPU
    rows = dict(info.rows())
    cuda_kind, memory, cc, sms, reported, native, peaks = EXPECTED_ROWS[kind]
    assert info.device == "cuda:0" and info.kind == cuda_kind and info.name == gpu.spec.name
    assert rows["GPU memory"] == memory
    assert rows["compute capability"] == cc and rows["SMs / compute units"] == sms
    assert rows["bf16 reported by torch"] == reported and rows["bf16 in hardware"] == native
    assert rows["datasheet peak TFLOP/s"] == peaks
    text = str(info)
    assert text.splitlines()[0].startswith("device") and gpu.spec.name in text
    assert len(text.splitlines()) == len(info.rows())


def test_describe_device_on_fake_mps(fake_gpu) -> None:
    fake_gpu("mps")
    info = describe_device()
    rows = dict(info.rows())
    assert info.device == "mps" and info.kind == "mps"
    assert rows["recommended max memory (shared with the CPU)"] == "21.33 GiB"
    assert rows["compute capability"] == "n/a" and rows["bf16 reported by torch"] == "n/a"
    assert rows["datasheet peak TFLOP/s"] == peaks.UNKNOWN_PEAK
    # bf16 on MPS is probed by allocating a tensor there, which a fake cannot: it says False.
    assert rows["bf16 in hardware"] == "False"


def test_unknown_gpu_says_measure_it(fake_gpu) -> None:
    fake_gpu("a100", name="NVIDIA Quantum Z9000")
    info = describe_device("cuda:0")
    assert info.peak_tflops == {}
    assert dict(info.rows())["datasheet peak TFLOP/s"] == (
        "unknown: measure the achievable rate (chapter 1)"
    )


def test_describe_second_gpu_and_current_device(fake_gpu) -> None:
    gpu = fake_gpu("h100_sxm", count=2)
    assert describe_device("cuda:1").device == "cuda:1"
    torch.cuda.set_device(1)
    assert gpu.current == 1 and describe_device("cuda").device == "cuda:1"
    with pytest.raises(DeviceError, match="has 2 cuda device"):
        describe_device("cuda:2")


@pytest.mark.parametrize("kind", KINDS)
def test_pick_device_takes_the_fake_accelerator(fake_gpu, kind: str) -> None:
    fake_gpu(kind)
    expected = torch.device("mps") if kind == "mps" else torch.device("cuda", 0)
    assert devices.accelerator_type() == expected.type
    assert devices.pick_device() == expected
    assert devices.resolve_device(None) == expected


@pytest.mark.parametrize("kind", KINDS)
def test_pick_device_without_torch_accelerator(
    fake_gpu, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    fake_gpu(kind)
    monkeypatch.delattr(torch, "accelerator", raising=False)  # torch 2.5 has none
    assert devices.accelerator_type() == ("mps" if kind == "mps" else "cuda")
    assert devices.pick_device().type == ("mps" if kind == "mps" else "cuda")


@pytest.mark.parametrize(
    ("count", "listed"), [(1, ["cuda:0"]), (4, [f"cuda:{i}" for i in range(4)])]
)
def test_available_devices_lists_every_gpu(fake_gpu, count: int, listed: list[str]) -> None:
    fake_gpu("a100", count=count)
    assert devices.available_devices() == [*listed, "cpu"]
    assert devices.resolve_device(f"cuda:{count - 1}") == torch.device("cuda", count - 1)


def test_available_devices_on_mps(fake_gpu) -> None:
    fake_gpu("mps")
    assert devices.available_devices() == ["mps", "cpu"]
    assert devices.resolve_device("MPS") == torch.device("mps")


def test_resolve_device_errors_name_what_exists(fake_gpu) -> None:
    fake_gpu("t4")
    with pytest.raises(DeviceError, match=r"'cuda:1' does not exist.*1 cuda device.*cuda:0, cpu"):
        devices.resolve_device("cuda:1")
    with pytest.raises(DeviceError, match="MPS needs an Apple-silicon Mac"):
        devices.resolve_device("mps")
    with pytest.raises(DeviceError, match="No Intel GPU"):
        devices.resolve_device("xpu")


def test_resolve_cuda_on_a_mac_explains_the_build(fake_gpu) -> None:
    fake_gpu("mps")
    with pytest.raises(DeviceError, match=r"torch.version.cuda is None.*Devices here: mps, cpu"):
        devices.resolve_device("cuda")


def test_rocm_gpu_is_cuda_to_torch(fake_gpu) -> None:
    fake_gpu("mi300x", count=8)
    assert devices.is_rocm() and torch.version.cuda is None
    assert devices.pick_device() == torch.device("cuda", 0)
    assert len(devices.available_devices()) == 9


def test_environment_override_on_a_multi_gpu_box(fake_gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu("h100_sxm", count=2)
    monkeypatch.setenv(devices.DEVICE_ENV, "cuda:1")
    assert devices.pick_device() == torch.device("cuda", 1)
    monkeypatch.setenv(devices.DEVICE_ENV, "cpu")
    assert devices.pick_device() == torch.device("cpu")
    monkeypatch.setenv(devices.DEVICE_ENV, "cuda:2")
    with pytest.raises(DeviceError, match=r"\$COURSE_DEVICE='cuda:2'.*Unset it"):
        devices.pick_device()


@pytest.mark.parametrize(
    ("kind", "native", "reported", "reported_without_emulation"),
    [
        ("h100_sxm", True, True, True),
        ("a100", True, True, True),
        ("t4", False, True, False),  # emulated: torch reports it, the hardware lacks it
        ("rtx4090", True, True, True),
        ("mi300x", True, True, True),
    ],
)
def test_native_bf16_on_fake_gpus(
    fake_gpu, kind: str, native: bool, reported: bool, reported_without_emulation: bool
) -> None:
    fake_gpu(kind)
    assert devices.native_bf16("cuda") is native
    assert devices.native_bf16(torch.device("cuda", 0)) is native
    assert torch.cuda.is_bf16_supported() is reported
    assert torch.cuda.is_bf16_supported(including_emulation=False) is reported_without_emulation


@pytest.mark.parametrize(
    ("arch", "native"),
    [
        ("gfx942:sramecc+:xnack-", True),  # MI300X
        ("gfx90a:sramecc+:xnack-", True),  # MI250X
        ("gfx908:sramecc+:xnack-", True),  # MI100
        ("gfx1100", True),  # Radeon RX 7900
        ("gfx906:sramecc+:xnack-", False),  # MI50: no bf16 matrix instructions
        ("gfx1030", False),  # Radeon RX 6800
    ],
)
def test_native_bf16_on_rocm_follows_the_architecture(
    fake_gpu, monkeypatch: pytest.MonkeyPatch, arch: str, native: bool
) -> None:
    gpu = fake_gpu("mi300x")
    real = gpu.properties

    def props(device=None):  # noqa: ANN001, ANN202
        p = real(device)
        p.gcnArchName = arch
        return p

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    assert torch.cuda.is_bf16_supported()  # torch says True on every ROCm GPU
    assert devices.native_bf16("cuda") is native
    p = real()
    p.gcnArchName = ""
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: p)
    assert devices.native_bf16("cuda") is True  # no architecture: trust torch


def test_native_bf16_on_fake_mps_and_other_kinds(fake_gpu) -> None:
    fake_gpu("mps")
    assert devices.native_bf16("mps") is False  # the probe tensor cannot be made on a fake
    assert devices.native_bf16("meta") is False


@pytest.mark.parametrize("kind", KINDS)
def test_synchronize_reaches_the_right_backend(fake_gpu, kind: str) -> None:
    gpu = fake_gpu(kind)
    devices.synchronize(gpu.device)
    devices.synchronize("cpu")
    assert gpu.synchronize_calls == 1


def test_synchronize_xpu_is_routed(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(torch.xpu, "synchronize", lambda device=None: calls.append(device))
    devices.synchronize("xpu:0")
    assert calls == [torch.device("xpu", 0)]


def test_xpu_is_listed_and_described(monkeypatch: pytest.MonkeyPatch) -> None:
    """Intel GPUs: only the Python paths (no fixture kind: the course has no XPU figures)."""
    monkeypatch.delenv(devices.DEVICE_ENV, raising=False)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)

    class Props:
        name, total_memory = "Intel(R) Data Center GPU Max 1550", 64 * 2**30

    monkeypatch.setattr(torch.xpu, "get_device_properties", lambda device=None: Props())
    monkeypatch.delattr(torch, "accelerator", raising=False)
    assert devices.accelerator_type() == "xpu"
    assert devices.pick_device() == torch.device("xpu", 0)
    assert devices.available_devices() == ["xpu:0", "cpu"]
    info = describe_device("xpu:0")
    assert info.kind == "xpu" and info.name == Props.name and "64.00 GiB" in str(info)


def test_describe_meta_device() -> None:
    info = describe_device("meta")
    assert info.kind == "meta" and info.total_memory is None and info.bf16_native is False
    assert "unknown" in str(info)


def test_cpu_name_without_proc_cpuinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_open = builtins.open

    def no_proc(path, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if str(path) == "/proc/cpuinfo":
            raise OSError("not Linux")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc)
    monkeypatch.setattr(devices.platform, "processor", lambda: "arm")
    assert devices.cpu_name() == "arm"
    monkeypatch.setattr(devices.platform, "processor", lambda: "")
    monkeypatch.setattr(devices.platform, "machine", lambda: "")
    assert devices.cpu_name() == "unknown CPU"
