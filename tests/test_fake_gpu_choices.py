"""Every helper that decides by device, on every fake GPU: AMP choice, sweep sizes, peaks, backends.

Kernels cannot run on a fake GPU; these tests run the Python that decides, sizes and formats.
"""

from __future__ import annotations

import pytest
import torch
from fake_gpu import KINDS
from torch.profiler import ProfilerActivity

from helpers import amp_choice, amp_sweep, matmul, max_batch, memory_bill, mfu, profiling, sweeps
from helpers.devices import describe_device
from helpers.launch import LaunchError, check_backend, max_processes
from helpers.processes import gpu_count
from helpers.syncs import SyncCounter

# --------------------------------------------------------------------------- AMP choice (ch. 3)

#: kind -> (bf16 native, auto AMP dtype, GradScaler)
AMP = {
    "h100_sxm": (True, torch.bfloat16, False),
    "a100": (True, torch.bfloat16, False),
    "t4": (False, torch.float16, True),
    "rtx4090": (True, torch.bfloat16, False),
    "mi300x": (True, torch.bfloat16, False),
    "mps": (False, torch.float16, True),
}


@pytest.mark.parametrize("kind", KINDS)
def test_amp_choice_from_the_description(fake_gpu, kind: str) -> None:
    gpu = fake_gpu(kind)
    info = describe_device(gpu.device)
    native, dtype, scaler = AMP[kind]
    assert amp_choice.bf16_is_native(info) is native
    choice = amp_choice.choose_amp_dtype(info)
    assert choice.dtype == dtype and choice.use_scaler is scaler and choice.enabled
    assert str(choice)


def test_t4_refuses_bf16_unless_asked_to_be_slow(fake_gpu) -> None:
    fake_gpu("t4")
    info = describe_device("cuda")
    with pytest.raises(amp_choice.PrecisionError, match="no bf16 units.*fp16 with a GradScaler"):
        amp_choice.choose_amp_dtype(info, prefer="bf16")
    slow = amp_choice.choose_amp_dtype(info, prefer="bf16", allow_slow=True)
    assert slow.dtype == torch.bfloat16 and "emulated" in slow.reason
    fp16 = amp_choice.choose_amp_dtype(info, prefer="fp16")
    assert fp16.dtype == torch.float16 and fp16.use_scaler


def test_rocm_gpu_without_bf16_units_gets_fp16(fake_gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = fake_gpu("mi300x", name="AMD Radeon RX 6800 XT")
    real = gpu.properties

    def rdna2(device=None):  # noqa: ANN001, ANN202
        p = real(device)
        p.gcnArchName = "gfx1030"
        return p

    monkeypatch.setattr(torch.cuda, "get_device_properties", rdna2)
    info = describe_device("cuda")
    assert info.kind == "rocm" and info.bf16_reported is True and info.bf16_native is False
    choice = amp_choice.choose_amp_dtype(info)
    assert choice.dtype == torch.float16 and choice.use_scaler


@pytest.mark.parametrize("kind", KINDS)
def test_amp_for_device_decides_then_checks(
    fake_gpu, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The deciding part of amp_for_device; its kernel checks are stubbed (they need the GPU)."""
    gpu = fake_gpu(kind)
    checked = []
    monkeypatch.setattr(amp_choice, "check_autocast", lambda d, t: checked.append((d, t)) or t)
    monkeypatch.setattr(amp_choice, "grad_scaler_works", lambda d: True)
    _, dtype, scaler = AMP[kind]
    choice = amp_choice.amp_for_device(gpu.device)
    assert choice.dtype == dtype and choice.use_scaler is scaler
    assert checked == [(gpu.device, dtype)]
    if scaler:  # without a working GradScaler, fp16 falls back to fp32 (auto) or is refused
        monkeypatch.setattr(amp_choice, "grad_scaler_works", lambda d: False)
        assert amp_choice.amp_for_device(gpu.device).dtype == torch.float32
        with pytest.raises(amp_choice.PrecisionError, match="needs a GradScaler"):
            amp_choice.amp_for_device(gpu.device, prefer="fp16")


@pytest.mark.parametrize("kind", KINDS)
def test_chapter3_sizes_and_meter_grow_on_a_gpu(fake_gpu, kind: str) -> None:
    gpu = fake_gpu(kind)
    assert amp_sweep.default_width(gpu.device) == 4096
    assert amp_sweep.default_batch_sizes(gpu.device) == (256, 1024, 4096)
    meter = amp_sweep.memory_meter(gpu.device)
    assert ("exact" in meter) if kind != "mps" else ("approximate" in meter)
    assert amp_sweep.default_width("cpu") == 512


# --------------------------------------------------------------------------- matmul, MFU (ch. 1, 6)


@pytest.mark.parametrize("kind", KINDS)
def test_matmul_sweep_range_grows_on_a_gpu(fake_gpu, kind: str) -> None:
    gpu = fake_gpu(kind)
    expected = (128, 4096) if kind == "mps" else (256, 8192)
    assert matmul.default_size_range(gpu.device) == expected
    assert matmul.default_size_range() == expected  # None = the best device


@pytest.mark.parametrize(
    ("kind", "dtype", "expected"),
    [
        ("h100_sxm", "fp32", 67e12),
        ("h100_sxm", "bf16", 989e12),
        ("a100", "fp16", 312e12),
        ("t4", "fp16", 65e12),
        ("t4", "bf16", None),
        ("rtx4090", "bf16", 165.2e12),
        ("mi300x", "bf16", 1307.4e12),
        ("mps", "fp32", None),
    ],
)
def test_matmul_peak_flops_on_fake_gpus(fake_gpu, kind: str, dtype: str, expected) -> None:  # noqa: ANN001
    gpu = fake_gpu(kind)
    assert matmul.matmul_peak_flops(gpu.device, dtype) == pytest.approx(expected)


@pytest.mark.parametrize("precision_setting", ["highest", "high"])
def test_matmul_and_mfu_agree_on_tf32(fake_gpu, precision_setting: str) -> None:
    """Chapter 1's sweep and chapter 6's MFU must use the same peak for an fp32 matmul."""
    fake_gpu("a100")
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision(precision_setting)
        sweep_peak = matmul.matmul_peak_flops("cuda", "fp32")
        mfu_peak = mfu.reference_peak("cuda", torch.float32)
    finally:
        torch.set_float32_matmul_precision(before)
    expected = 19.5e12 if precision_setting == "highest" else 156e12
    assert sweep_peak == expected
    assert mfu_peak.flops == expected and not mfu_peak.measured


@pytest.mark.parametrize(
    ("kind", "dtype", "flops", "source"),
    [
        ("h100_sxm", torch.bfloat16, 989e12, "datasheet dense bf16 peak of NVIDIA H100 80GB HBM3"),
        ("t4", torch.float16, 65e12, "datasheet dense fp16 peak of Tesla T4"),
        ("mi300x", torch.bfloat16, 1307.4e12, "datasheet dense bf16 peak of AMD Instinct MI300X"),
    ],
)
def test_mfu_reference_peak_uses_the_table(
    fake_gpu,
    kind: str,
    dtype: torch.dtype,
    flops: float,
    source: str,  # noqa: ANN001
) -> None:
    fake_gpu(kind)
    peak = mfu.reference_peak("cuda", dtype)
    assert peak.flops == pytest.approx(flops) and peak.source == source and not peak.measured
    assert str(peak).startswith(f"{flops / 1e12:.3g} TFLOP/s")


def test_mfu_without_a_datasheet_peak_measures(fake_gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    """A T4 has no fast bf16: MFU falls back to a measured rate (stubbed: it needs the GPU)."""
    fake_gpu("t4")

    def search(dtype: torch.dtype, device: torch.device, shapes: list) -> matmul.MatmulSweep:
        rows = [{"m, k, n": s, "GFLOP/s": s[0]} for s in shapes]
        return matmul.MatmulSweep(param="m, k, n", rows=rows, dtype="bf16", device=str(device))

    monkeypatch.setattr(mfu, "achievable_rate", search)
    peak = mfu.reference_peak("cuda", torch.bfloat16, shapes=[(512,) * 3, (2048,) * 3])
    assert peak.measured and peak.flops == 2048e9 and "m=2048, k=2048, n=2048" in peak.source


@pytest.mark.parametrize(
    ("kind", "dtype"),
    [
        ("h100_sxm", torch.bfloat16),
        ("a100", torch.bfloat16),
        ("rtx4090", torch.bfloat16),
        ("mi300x", torch.bfloat16),
        ("t4", torch.float32),  # compute capability 7.5: bf16 only by emulation
        ("mps", torch.float32),  # no datasheet bf16 peak to compare with: fp32
    ],
)
def test_mfu_precision_is_bf16_on_gpus_with_native_bf16(
    fake_gpu,  # noqa: ANN001
    kind: str,
    dtype: torch.dtype,
) -> None:
    gpu = fake_gpu(kind)
    assert mfu.mfu_precision(gpu.device) == dtype
    assert mfu.mfu_precision("cpu") == torch.float32


def test_h100_mfu_references_are_the_bf16_peak_and_a_bf16_search(
    fake_gpu,  # noqa: ANN001
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Chapter 6's MFU cell on an H100: datasheet bf16 peak, and a bf16 MAMF search on CUDA shapes."""
    fake_gpu("h100_sxm")
    dtype = mfu.mfu_precision("cuda")
    peak = mfu.reference_peak("cuda", dtype)
    assert peak.flops == pytest.approx(989e12) and not peak.measured
    asked = {}

    def fake_search(dtype: torch.dtype, device: torch.device, shapes: None) -> matmul.MatmulSweep:
        asked.update(dtype=dtype, device=device)
        rows = [{"m, k, n": (4096, 4096, 4096), "GFLOP/s": 7.9e5}]
        rows.append({"m, k, n": (8192, 8192, 8192), "GFLOP/s": 8.05e5})
        return matmul.MatmulSweep(param="m, k, n", rows=rows, dtype="bf16", device=str(device))

    monkeypatch.setattr(mfu, "achievable_rate", fake_search)
    best = mfu.achievable_peak("cuda", dtype)
    assert asked["dtype"] == torch.bfloat16 and asked["device"].type == "cuda"
    assert best.flops == pytest.approx(805e12) and best.measured
    assert "m=8192, k=8192, n=8192" in best.source
    result = mfu.MfuResult(int(600e9), 1e-3, peak, best)
    assert result.mfu == pytest.approx(600 / 989)
    assert f"{600 / 805:.1%} of the achievable rate" in str(result)


def test_speedup_needs_an_accelerator(fake_gpu) -> None:
    fake_gpu("t4")
    with pytest.raises(matmul.DeviceError, match="needs a GPU device.*cuda:0, cpu"):
        matmul.run_speedup([64], device="cpu")


# --------------------------------------------------------------------------- memory (ch. 5)


@pytest.mark.parametrize("kind", KINDS)
def test_memory_bill_counts_the_cuda_context_on_cuda_only(fake_gpu, kind: str) -> None:
    gpu = fake_gpu(kind)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    bill = memory_bill.estimate_training_memory(
        model, 4, (8,), activation_bytes=0, device=gpu.device
    )
    expected = memory_bill.CUDA_CONTEXT_RANGE if kind != "mps" else None
    assert bill.context == expected


def test_max_batch_before_oom_on_a_fake_gpu(fake_gpu) -> None:
    """The search itself is Python: a step that raises CUDA's OOM above 1000 samples."""
    gpu = fake_gpu("t4")
    gpu.allocate(2**30)
    gpu.free(2**30)  # 1 GiB cached: each OOM must hand it back (empty_cache)

    def step(batch: int) -> None:
        if batch > 1000:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                "of 14.74 GiB of which 1.2 GiB is free."
            )

    result = max_batch.max_batch_before_oom(step, gpu.device, limit=4096)
    assert result.largest == 1000 and "real out-of-memory on cuda:0" in result.method
    assert gpu.reserved == 0


def test_max_batch_before_oom_refuses_the_cpu(fake_gpu) -> None:
    fake_gpu("a100")
    with pytest.raises(ValueError, match="OOM killer"):
        max_batch.max_batch_before_oom(lambda b: None, "cpu")


@pytest.mark.parametrize("kind", KINDS)
def test_free_cached_memory_empties_the_fake_cache(fake_gpu, kind: str) -> None:
    gpu = fake_gpu(kind)
    gpu.allocate(3 * 2**20)
    gpu.free(2 * 2**20)
    sweeps.free_cached_memory()
    assert gpu.reserved == gpu.allocated == 2**20


# --------------------------------------------------------------------------- processes (ch. 4)


@pytest.mark.parametrize(
    ("count", "nproc", "backend"), [(1, 1, "nccl"), (1, 2, "gloo"), (4, 4, "nccl")]
)
def test_backend_follows_the_gpu_count(fake_gpu, count: int, nproc: int, backend: str) -> None:
    fake_gpu("h100_sxm", count=count)
    assert gpu_count() == count
    assert check_backend(None, nproc) == backend
    assert max_processes("nccl") == count


def test_nccl_on_a_mac_is_refused(fake_gpu) -> None:
    fake_gpu("mps")
    assert gpu_count() == 0 and check_backend(None, 1) == "gloo"
    with pytest.raises(LaunchError):
        check_backend("nccl")


# --------------------------------------------------------------------------- profiling (ch. 2, 6)


@pytest.mark.parametrize("kind", KINDS)
def test_profiler_settings_follow_the_device(fake_gpu, kind: str) -> None:
    gpu = fake_gpu(kind)
    gpu_side = kind != "mps"
    activities = profiling.profiler_activities(gpu.device)
    assert activities == (
        [ProfilerActivity.CPU, ProfilerActivity.CUDA] if gpu_side else [ProfilerActivity.CPU]
    )
    key = "self_device_time_total" if gpu_side else "self_cpu_time_total"
    assert profiling.self_time_key(gpu.device) == key


@pytest.mark.parametrize("kind", KINDS)
def test_sync_counter_uses_cuda_debug_mode_on_cuda_only(fake_gpu, kind: str) -> None:
    fake_gpu(kind)
    assert SyncCounter().cuda_debug is (kind != "mps")
    if kind == "mps":
        with pytest.raises(RuntimeError, match="needs a CUDA"):
            SyncCounter(cuda_debug=True)


def test_profiler_adds_the_xpu_activity_for_an_intel_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 1)
    activities = profiling.profiler_activities("xpu:0")
    assert activities[0] == ProfilerActivity.CPU
    if hasattr(ProfilerActivity, "XPU"):
        assert activities == [ProfilerActivity.CPU, ProfilerActivity.XPU]
    assert profiling.self_time_key("xpu:0") == "self_device_time_total"


def test_sync_counter_keeps_torch_prototype_note_from_the_learner(
    fake_gpu, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    # The H200 run of 2026-11-28 printed torch's "Synchronization debug mode is a prototype
    # feature" warning under 7 cells: the counter handed it back with the other warnings.
    import warnings

    fake_gpu("h100_sxm")
    mode = {"now": 0}

    def set_mode(m: str | int) -> None:
        if m == "warn":
            warnings.warn(
                "Synchronization debug mode is a prototype feature and does not yet detect all "
                "synchronizing operations",
                UserWarning,
                stacklevel=2,
            )
            warnings.warn("an unrelated warning", UserWarning, stacklevel=2)
        mode["now"] = m

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode["now"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SyncCounter() as counter:
            pass
    texts = [str(w.message) for w in caught]
    assert counter.cuda_syncs == 0 and texts == ["an unrelated warning"], texts
