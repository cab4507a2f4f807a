"""helpers.step_profile: a profiled step in buckets, and what would cut the largest left (chapter 7).

The CPU branch runs a real profile of a tiny GPT step; the GPU branch reads a synthetic
profile (kernel rows, annotation spans) as a CUDA profile lists them, including the H100
run's kernel names (ch07 cell 66 of 2026-11-26).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity

from helpers.capstone import Levers, Trainer
from helpers.gpt import GPTConfig, text_bytes
from helpers.profiling import profile_steps
from helpers.step_profile import (
    COPIES,
    FUSED,
    IDLE_CPU,
    IDLE_GPU,
    MATMUL,
    OPTIMIZER,
    OTHER,
    StepProfile,
    advice,
    bucket_of,
    cut_advice,
    step_profile,
)

#: Kernel names of the H100 run's final profile (ch07 cell 66) and what they are.
GPU_NAMES = {
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT": MATMUL,
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wg": MATMUL,
    "triton_per_fused__to_copy_add_native_layer_norm_backward_7": FUSED,
    "triton_poi_fused_gelu_gelu_backward_view_8": FUSED,
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": OPTIMIZER,
    "Memcpy HtoD (Pageable -> Device)": COPIES,
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>": OTHER,
    "ampere_sgemm_128x64_tn": MATMUL,
}
CPU_NAMES = {
    "aten::mm": MATMUL,
    "aten::addmm": MATMUL,
    "aten::_scaled_dot_product_flash_attention_for_cpu": MATMUL,
    "aten::_fused_adamw_": OPTIMIZER,
    "aten::_foreach_mul_": OPTIMIZER,
    "Optimizer.step#AdamW.step": OPTIMIZER,
    "aten::copy_": COPIES,
    "aten::gelu": OTHER,
    "cpp_fused_add_native_layer_norm_0": FUSED,
}


@pytest.mark.parametrize(("name", "bucket"), list(GPU_NAMES.items()))
def test_gpu_kernel_buckets(name: str, bucket: str) -> None:
    assert bucket_of(name, on_gpu=True) == bucket


@pytest.mark.parametrize(("name", "bucket"), list(CPU_NAMES.items()))
def test_cpu_op_buckets(name: str, bucket: str) -> None:
    assert bucket_of(name, on_gpu=False) == bucket


def test_a_real_cpu_profile_adds_up_to_the_step() -> None:
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=32, seq_len=32)
    trainer = Trainer(cfg, Levers(resident=True), text_bytes()[:5000], device="cpu", batch_size=4)
    prof = profile_steps(trainer.run, "cpu", wait=0, warmup=1, active=2)
    costs = step_profile(prof, "cpu", steps_per_call=trainer.interval)
    assert not costs.on_gpu and costs.step_s > 0
    assert sum(costs.buckets.values()) == pytest.approx(costs.step_s, rel=1e-6)
    assert costs.buckets[MATMUL] > 0 and costs.buckets[OPTIMIZER] > 0
    assert IDLE_CPU in costs.buckets and IDLE_GPU not in costs.buckets
    assert MATMUL not in costs.largest_left(10)
    assert costs.examples[MATMUL] in ("aten::mm", "aten::addmm", "aten::bmm")
    text = str(costs)
    assert (
        text.startswith("one step: ") and "split by CPU ops" in text and "share of the step" in text
    )


@dataclass
class Row:
    """What step_profile reads of a key_averages() row."""

    key: str
    device_type: DeviceType
    self_device_time_total: float = 0.0
    self_cpu_time_total: float = 0.0
    is_user_annotation: bool = False


def gpu_profile() -> object:
    """Two profiled calls of 100 µs each, in the shape of the H100 run's final profile."""
    gpu, cpu = DeviceType.CUDA, DeviceType.CPU
    rows = [
        Row("ProfilerStep*", gpu, 200.0, is_user_annotation=True),
        Row("Optimizer.step#AdamW.step", gpu, 30.0, is_user_annotation=True),  # a span
        Row("aten::mm", cpu, 80.0, 5.0),  # the same kernels, counted on the op: left out
        Row("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", gpu, 80.0),
        Row("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wg", gpu, 20.0),
        Row("multi_tensor_apply_kernel<AdamW>", gpu, 30.0),
        Row("triton_poi_fused_gelu_gelu_backward_view_8", gpu, 40.0),
        Row("void at::native::unrolled_elementwise_kernel<zero>", gpu, 0.0),  # listed, no time
    ]

    def event(
        name: str, start: float, end: float, device: DeviceType = cpu, **kw: object
    ) -> FunctionEvent:
        e = FunctionEvent(0, name, 1, start, end, device_type=device, **kw)
        e.cpu_parent = None
        return e

    events = [
        event("ProfilerStep*", 0, 100),
        event("ProfilerStep*", 100, 200),
        event("k1", 0, 85, device=gpu),
        event("k2", 100, 185, device=gpu),
    ]

    class FakeProfile:
        activities = {ProfilerActivity.CPU, ProfilerActivity.CUDA}

        def events(self) -> list[FunctionEvent]:
            return events

        def key_averages(self) -> list[Row]:
            return rows

    return FakeProfile()


def test_a_gpu_profile_leaves_annotations_out_and_shows_the_idle_gap(fake_gpu) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm")
    costs = step_profile(gpu_profile(), gpu.device)
    assert costs.on_gpu and costs.step_s == pytest.approx(100e-6)
    assert costs.buckets[MATMUL] == pytest.approx(50e-6)  # (80 + 20) / 2 calls
    assert costs.buckets[OPTIMIZER] == pytest.approx(15e-6)  # the kernels, not the span
    assert costs.buckets[FUSED] == pytest.approx(20e-6)
    assert costs.buckets[IDLE_GPU] == pytest.approx(15e-6)  # 100 - 85 µs per step
    assert costs.largest_left(2) == [FUSED, OPTIMIZER]
    per_step = step_profile(gpu_profile(), gpu.device, steps_per_call=4)
    assert per_step.step_s == pytest.approx(25e-6)


ALL = {"resident", "sdpa", "fused_adamw", "amp", "tf32", "compile", "graphs"}


@pytest.mark.parametrize(
    ("bucket", "on", "available", "gpu", "starts"),
    [
        (OPTIMIZER, set(), ALL, True, "fused AdamW"),
        (OPTIMIZER, {"fused_adamw"}, ALL, True, "CUDA graphs take its launches"),
        (OPTIMIZER, {"fused_adamw", "graphs"}, ALL, True, "it reads and writes every weight"),
        (IDLE_GPU, {"compile"}, ALL, True, "CUDA graphs"),
        (IDLE_GPU, {"compile", "graphs"}, ALL, True, "the CUDA graphs hold forward and backward"),
        (IDLE_GPU, {"compile"}, {"compile"}, True, "more work per launch"),
        (IDLE_CPU, set(), ALL - {"graphs"}, False, "resident data takes the DataLoader's share"),
        (IDLE_CPU, {"resident"}, ALL - {"graphs"}, False, "the rest is Python and dispatch"),
        (FUSED, {"compile"}, ALL, True, "already fused by torch.compile"),
        (COPIES, set(), ALL, True, "resident data"),
        (COPIES, {"resident"}, ALL, True, "casts and layout copies"),
        (OTHER, set(), ALL, True, "torch.compile fuses"),
        (OTHER, {"compile"}, ALL, True, "ops no lever here fuses"),
    ],
)
def test_cut_advice(bucket: str, on: set[str], available: set[str], gpu: bool, starts: str) -> None:
    text = cut_advice(bucket, on, available, gpu)
    assert text.startswith(starts)
    assert "precision" not in text and "bf16" not in text  # finding 3: no precision advice


def test_advice_names_the_largest_non_matmul_buckets() -> None:
    costs = StepProfile("cuda:0", 1.0, {MATMUL: 0.5, OPTIMIZER: 0.1, IDLE_GPU: 0.3, FUSED: 0.0}, {})
    lines = advice(costs, ["sdpa", "amp", "compile"], sorted(ALL))
    assert lines == [
        "GPU idle (waiting for launches): 30% of the step; CUDA graphs (the GPU replays the step "
        "without waiting for launches)",
        "optimizer and clipping: 10% of the step; fused AdamW: one kernel per parameter group "
        "instead of chains of foreach ops",
    ]
    assert costs.rows()[0]["where the step goes"] == MATMUL
    assert [r["share of the step"] for r in costs.rows()] == ["50%", "30%", "10%", "0%"]
