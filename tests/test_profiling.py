"""helpers.profiling: profile summaries, the diagnosis rules, the sync counter, the toy device."""

from __future__ import annotations

import threading
import time

import matplotlib.pyplot as plt
import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, record_function

from helpers.profiling import (
    COMPUTE,
    INPUT,
    LAUNCH,
    SYNC,
    ProfileSummary,
    ToyAsyncDevice,
    count_top_level_ops,
    diagnose,
    plot_timing_methods,
    profile_steps,
    profiler_activities,
    self_time_key,
    summarize_profile,
    time_first_call,
)


def test_activities_and_sort_key_on_cpu() -> None:
    assert profiler_activities("cpu") == [ProfilerActivity.CPU]
    assert self_time_key("cpu") == "self_cpu_time_total"


def labelled_step() -> None:
    with record_function("data"):
        time.sleep(0.004)
        x = torch.randn(32, 64)
    with record_function("forward"):
        y = nn.functional.relu(x @ x.T)
    with record_function("logging"):
        y.sum().item()


def test_profile_steps_and_summary() -> None:
    prof = profile_steps(labelled_step, "cpu", wait=1, warmup=1, active=4)
    steps = [r for r in prof.key_averages() if r.key.startswith("ProfilerStep")]
    assert steps and steps[0].count == 4
    summary = summarize_profile(prof, labels=("data", "forward", "logging"))
    assert summary.steps == 4 and summary.device_busy_s is None
    assert summary.labels_s["data"] >= 0.004 and summary.step_s >= summary.labels_s["data"]
    assert summary.syncs == 1  # the .item()
    assert summary.ops >= 4  # randn, matmul, relu, sum, item ...


def test_optimizer_step_counters_are_not_syncs() -> None:
    model = nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(8, 4)

    def step() -> None:
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()  # Adam reads its CPU-side step counters with .item()

    summary = summarize_profile(profile_steps(step, "cpu", wait=0, warmup=1, active=3))
    assert summary.syncs == 0


def test_summary_needs_a_scheduled_profile() -> None:
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.randn(4) + 1
    with pytest.raises(ValueError, match="prof.step"):
        summarize_profile(prof)


@pytest.mark.parametrize(
    ("wait", "warmup", "active"), [(-1, 1, 1), (0, 0, 1), (0, 1, 0), (0, 1, 1.5)]
)
def test_profile_steps_rejects_bad_schedules(wait, warmup, active) -> None:
    with pytest.raises(ValueError, match="must be a whole number"):
        profile_steps(lambda: None, "cpu", wait=wait, warmup=warmup, active=active)


def summary(**kw) -> ProfileSummary:
    base = {"steps": 10, "step_s": 0.01, "labels_s": {}, "sync_s": 0.0, "syncs": 0.0, "ops": 100.0}
    return ProfileSummary(**{**base, **kw})


@pytest.mark.parametrize(
    ("kw", "flops", "verdict"),
    [
        ({"labels_s": {"data": 0.005}}, None, INPUT),
        ({"sync_s": 0.004}, None, SYNC),
        ({"sync_s": 0.004, "device_busy_s": 0.009}, None, COMPUTE),  # waiting on a busy GPU
        ({"device_busy_s": 0.008}, None, COMPUTE),
        ({"device_busy_s": 0.002}, None, LAUNCH),
        ({}, 5e8, COMPUTE),  # 5e8 FLOP at 1e11 FLOP/s = 5 ms of a 10 ms step
        ({}, 1e6, LAUNCH),
        ({}, None, LAUNCH),
    ],
)
def test_diagnosis_rules(kw: dict, flops, verdict: str) -> None:
    d = diagnose(summary(**kw), flops, 1e11 if flops else None)
    assert d.verdict == verdict, d
    assert verdict in str(d)


def test_launch_bound_reports_time_per_op_and_idle_share() -> None:
    d = diagnose(summary(device_busy_s=0.002))
    assert d.ratios["µs per op"] == pytest.approx(100.0)
    assert "100.0 µs per op" in d.reason and "idles 80%" in d.reason


def test_diagnosis_of_an_empty_profile_explains() -> None:
    with pytest.raises(ValueError, match="no time"):
        diagnose(summary(step_s=0.0))


def test_toy_device_is_asynchronous_and_closes() -> None:
    with ToyAsyncDevice() as toy:
        start = time.perf_counter()
        toy.kernel(0.05)
        queued = time.perf_counter() - start
        toy.synchronize()
        done = time.perf_counter() - start
    assert queued < 0.05 <= done
    assert not [t for t in threading.enumerate() if t.name.startswith("toy-device")]
    toy.close()  # twice is safe
    with pytest.raises(RuntimeError, match="closed"):
        toy.kernel(0.01)


def test_time_first_call_and_op_count() -> None:
    assert time_first_call(time.sleep, 0.01) >= 0.01

    def three_ops(x: torch.Tensor) -> torch.Tensor:
        return (x + 1).relu() * 2

    assert count_top_level_ops(three_ops, torch.randn(8)) == 3


def test_plot_timing_methods() -> None:
    fig = plot_timing_methods({"a": [0.001, 0.002], "b": [0.01]}, title="t")
    assert fig.axes[0].get_title() == "t"
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["a", "b"]
    plt.close(fig)
    with pytest.raises(ValueError, match="at least one reading"):
        plot_timing_methods({"a": []})


def test_summary_of_a_gpu_profile_from_synthetic_events() -> None:
    """The CUDA branch, without a GPU: kernels count as busy, mirrored labels do not."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    def event(name: str, start: float, end: float, device=DeviceType.CPU, parent=None, **kw):
        e = FunctionEvent(0, name, 1, start, end, device_type=device, **kw)
        e.cpu_parent = parent
        return e

    gpu = DeviceType.CUDA
    step1, step2 = event("ProfilerStep*", 0, 100), event("ProfilerStep*", 100, 200)
    item = event("aten::_local_scalar_dense", 150, 190, parent=step2)
    events = [
        step1,
        step2,
        event("data", 0, 40, parent=step1),
        event("data", 0, 40, device=gpu, is_user_annotation=True),  # the label, mirrored
        event("ProfilerStep*", 0, 100, device=gpu, is_user_annotation=True),
        event("aten::addmm", 40, 60, parent=step1),
        item,
        event("cudaStreamSynchronize", 160, 189, parent=item),  # inside .item(): counted once
        event("cudaStreamSynchronize", 192, 195, parent=step2),  # a .cpu() copy's wait
        event("gemm_kernel", 50, 90, device=gpu),
        event("elementwise_kernel", 80, 110, device=gpu),  # overlaps: counted once
    ]

    class FakeProfile:
        activities = {ProfilerActivity.CPU, ProfilerActivity.CUDA}

        def events(self):
            return events

    s = summarize_profile(FakeProfile())
    assert s.steps == 2 and s.step_s == pytest.approx(100e-6)
    assert s.labels_s == {"data": pytest.approx(20e-6)}
    assert s.syncs == 1.0 and s.sync_s == pytest.approx((40 + 3) / 2 * 1e-6)
    assert s.device_busy_s == pytest.approx(60 / 2 * 1e-6)
    assert s.ops == 1.0
    assert diagnose(s).verdict == LAUNCH  # device busy 30%, sync 21.5%, input 20%


def test_matmul_share() -> None:
    from helpers.profiling import matmul_share

    a = torch.randn(128, 128)
    only_matmul = profile_steps(lambda: a @ a, "cpu", wait=0, warmup=1, active=3)
    assert 0 < matmul_share(only_matmul, "cpu") <= 1
    no_matmul = profile_steps(lambda: a.relu(), "cpu", wait=0, warmup=1, active=3)
    assert matmul_share(no_matmul, "cpu") == 0


def test_matmul_share_counts_fused_attention_when_asked() -> None:
    """Chapter 7: SDPA's fused kernel does matrix products that no aten::mm row shows."""
    from helpers.profiling import matmul_share

    q = torch.randn(2, 4, 128, 16)
    sdpa = profile_steps(
        lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True),
        "cpu", wait=0, warmup=1, active=3,
    )  # fmt: skip
    alone = matmul_share(sdpa, "cpu")
    assert matmul_share(sdpa, "cpu", also=("attention",)) > max(alone, 0.5)


def fake_averages(*rows: tuple) -> object:
    """A profile whose key_averages() are the given (key, device, self time µs, annotation?) rows."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    made = []
    for key, device, us, *flag in rows:
        row = SimpleNamespace(key=key, device_type=device)
        on_cpu = device == DeviceType.CPU
        row.self_cpu_time_total, row.self_device_time_total = (us, 0) if on_cpu else (0, us)
        if flag:  # torch before 2.4 has no is_user_annotation on the averages
            row.is_user_annotation = flag[0]
        made.append(row)
    return SimpleNamespace(key_averages=lambda: made)


def test_matmul_share_leaves_annotation_rows_out_on_a_gpu(fake_gpu) -> None:
    """Capstone finding 3: `Optimizer.step#AdamW.step` and labels are spans, not kernels.

    Kernels: 600 µs of gemm, 400 µs of elementwise work, so the share is 60%. The spans of
    the optimizer step and the `forward` label count those kernels again; the old code left
    out only ProfilerStep* and added the spans to the denominator (600 / 2214 = 27%)."""
    from torch.autograd import DeviceType

    from helpers.profiling import matmul_share

    fake_gpu("h100_sxm")
    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    prof = fake_averages(
        ("ProfilerStep*", cpu, 2500, True),
        ("forward", cpu, 40, True),
        ("Optimizer.step#AdamW.step", cpu, 300, True),
        ("aten::mm", cpu, 120),
        ("aten::add_", cpu, 80),
        ("ProfilerStep*", gpu, 1700, True),
        ("forward", gpu, 900),  # a label's span, from a torch without is_user_annotation
        ("Optimizer.step#AdamW.step", gpu, 314, True),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", gpu, 500),
        ("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NTN", gpu, 100),
        ("void at::native::vectorized_elementwise_kernel<4, ...>", gpu, 400),
    )
    assert matmul_share(prof, "cuda") == pytest.approx(0.6)
    # On a CPU every self-time microsecond is counted once: only ProfilerStep* is left out.
    assert matmul_share(prof, "cpu") == pytest.approx(120 / (40 + 300 + 120 + 80))
    only_spans = fake_averages(("forward", cpu, 40, True), ("forward", gpu, 900, True))
    with pytest.raises(ValueError, match="recorded no time on this device"):
        matmul_share(only_spans, "cuda")  # spans alone are no kernel time


def test_labels_whose_kernels_another_thread_launched() -> None:
    """Finding 18: on CUDA the backward's kernels come from autograd's thread, not the label's."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    from helpers.profiling import labels_launched_elsewhere

    def op(name: str, thread: int, start: float, end: float, kernel_us: float = 0.0):
        e = FunctionEvent(0, name, thread, start, end, device_type=DeviceType.CPU)
        if kernel_us:
            e.append_kernel(f"{name} kernel", 0, kernel_us)
        return e

    main, autograd = 1, 2
    events = [
        op("forward", main, 0, 100),
        op("aten::addmm", main, 10, 20, kernel_us=40),
        op("backward", main, 100, 200),
        op("aten::fill_", main, 101, 102, kernel_us=1),  # the loss's gradient seed
        op("aten::mm", autograd, 110, 120, kernel_us=50),
        op("aten::mm", autograd, 121, 130, kernel_us=50),
        op("optimizer", main, 200, 260),
        op("aten::_foreach_add_", main, 210, 220, kernel_us=30),
        op("aten::mm", autograd, 300, 310, kernel_us=50),  # outside every label
    ]
    prof = type("FakeProfile", (), {"events": lambda self: events})()
    labels = ("data", "forward", "backward", "optimizer")
    assert labels_launched_elsewhere(prof, labels) == {"backward"}
    real = profile_steps(labelled_step, "cpu", wait=0, warmup=1, active=2)
    assert labels_launched_elsewhere(real, labels) == set()  # no kernels on a CPU


def test_a_diagnosis_on_a_busy_machine_says_so() -> None:
    """Issue 24 item 5: a verdict measured on a shared GPU or a loaded CPU does not conclude."""
    from helpers.machine_state import GpuTenants, MachineState

    summary = ProfileSummary(steps=2, step_s=1e-3, labels_s={"data": 0.6e-3}, ops=10)
    quiet = MachineState("cpu", 2, 2, 2, 0.5, GpuTenants(None, note="not read on cpu"), 0.0, 1.0)
    loaded = MachineState("cpu", 2, 2, 2, 6.0, GpuTenants(None, note="not read on cpu"), 1.8, 1.0)
    assert str(diagnose(summary, machine=quiet)).startswith("input-bound: 60%")
    busy = diagnose(summary, machine=loaded)
    assert busy.verdict == INPUT and busy.machine is loaded
    assert str(busy).startswith("inconclusive, CPU loaded (other processes kept 1.8 cores busy")
    assert str(busy).endswith("measured: input-bound: 60% of each step is spent getting the batch")
