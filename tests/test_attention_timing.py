"""helpers.attention_timing: the sweep's plan on every kind of device (fake GPUs), its rows, verdicts
and plot; the timing path's decisions run on a CPU (chapter 8)."""

from __future__ import annotations

import contextlib
import math

import matplotlib.pyplot as plt
import pytest
import torch

import helpers.attention_timing as tm
from helpers.attention_triton import TritonStatus
from helpers.units import GiB


def compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the plan believe Triton compiles for this (fake) GPU."""
    monkeypatch.setattr(tm, "triton_status", lambda device: TritonStatus(True, "compiled", "fake"))


@pytest.mark.parametrize(
    ("kind", "dtype", "skipped"),
    [
        ("h100_sxm", torch.bfloat16, []),
        ("a100", torch.bfloat16, []),
        ("rtx4090", torch.bfloat16, [8192]),
        ("t4", torch.float16, [8192]),
        ("mi300x", torch.bfloat16, []),
    ],
)
def test_gpu_plans(monkeypatch: pytest.MonkeyPatch, fake_gpu, kind, dtype, skipped) -> None:
    compiled(monkeypatch)
    gpu = fake_gpu(kind)
    plan = tm.sweep_plan(gpu.device)
    assert plan.dtype == dtype and plan.lengths == tm.GPU_LENGTHS
    assert (plan.batch, plan.heads, plan.head_dim) == (4, 16, 64)
    assert plan.methods[-3:] == ("pytorch tiles", "written out", "triton")
    assert {"sdpa flash", "sdpa efficient", "sdpa default"} <= set(plan.methods)
    assert sorted(t for (m, t) in plan.skips if m == "written out") == skipped
    memory = torch.cuda.get_device_properties(gpu.device).total_memory
    for t in skipped:
        assert tm.written_out_bytes(4, 16, t, dtype.itemsize) > 0.6 * memory
    text = str(plan)
    assert "causal" in text and ("skipped written out at T = 8192" in text) == bool(skipped)
    if dtype == torch.float16:
        assert "no native bf16" in plan.why_dtype


def test_gpu_plan_without_a_compiled_triton(monkeypatch: pytest.MonkeyPatch, fake_gpu) -> None:
    monkeypatch.setattr(
        tm, "triton_status", lambda d: TritonStatus(False, "unavailable", "no triton")
    )
    plan = tm.sweep_plan(fake_gpu("h100_sxm").device, lengths=[2048])
    assert "triton" not in plan.methods and plan.lengths == (2048,)
    assert any("triton not timed" in n and "no triton" in n for n in plan.notes)


def test_cpu_and_mps_plans(fake_gpu) -> None:
    plan = tm.sweep_plan("cpu")
    assert plan.dtype == torch.float32 and plan.lengths == tm.CPU_LENGTHS
    assert plan.methods == ("sdpa default", "pytorch tiles", "written out")
    assert any("no peak memory column" in n for n in plan.notes)
    assert not any("MPS" in n for n in plan.notes)
    mps = tm.sweep_plan(fake_gpu("mps").device)
    assert mps.device.type == "mps" and mps.dtype == torch.float16 and "mps" in mps.why_dtype
    assert mps.methods == plan.methods and mps.lengths == tm.CPU_LENGTHS
    assert any("Apple GPU (MPS)" in n and "not a peak" in n for n in mps.notes)
    assert not any("on a CPU" in n for n in mps.notes), mps.notes


def test_check_methods_and_the_cpu_timing_path(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = tm.sweep_plan("cpu", lengths=[32, 64])
    real = tm.method_function

    def lacking(name, device):
        if name == "written out":
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(name, device)

    monkeypatch.setattr(tm, "method_function", lacking)
    checked = tm.check_methods(plan, t=32)
    by = {c["method"]: c for c in checked}
    assert by["pytorch tiles"]["worst / allowed"] <= 1 and by["sdpa default"]["note"] == ""
    # issue 31: every row is judged against float64, none against itself
    assert by["sdpa default"]["worst / allowed"] <= 1 and "against" not in by["sdpa default"]
    assert math.isnan(by["written out"]["worst / allowed"]) and "No available kernel" in by["written out"]["note"]  # fmt: skip
    assert plan.skips[("written out", 64)] == "did not run in the check"
    rows = tm.attention_timing_sweep(plan, min_run_time=0.01)
    assert [r["row"] for r in rows] == [f"{m} @ {t}" for t in (32, 64) for m in plan.methods]
    timed = [r for r in rows if "ms" in r]
    assert len(timed) == 4 and all(r["ms"] > 0 and "peak MiB" not in r for r in timed)
    # a CPU's rate in GFLOP/s, a unit that fits it (issue 31: TFLOP/s printed 0.0001)
    assert all(r["GFLOP/s"] > 0 and "TFLOP/s" not in r for r in timed)
    assert all(r["note"] == "did not run in the check" for r in rows if r["method"] == "written out")  # fmt: skip
    assert tm.sweep_machine(rows) is not None
    assert tm.fastest_sdpa(rows, 64) == "sdpa default @ 64" and tm.fastest_sdpa(rows, 7) is None
    fig = tm.plot_attention_timing(rows)
    assert len(fig.axes) == 1
    plt.close(fig)


def test_a_failing_or_out_of_memory_method_becomes_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = tm.sweep_plan("cpu", lengths=[16])
    freed = []
    monkeypatch.setattr(tm, "free_cached_memory", lambda: freed.append(1))
    for message in ("CUDA out of memory. Tried to allocate 24.00 GiB", "no kernel for this dtype"):

        def broken(q, k, v, message=message):
            raise RuntimeError(message)

        monkeypatch.setattr(tm, "method_function", lambda name, device, f=broken: f)
        row = tm._time_one(plan, "pytorch tiles", 16, 0.01)
        assert row["note"].startswith("did not run: ") and message.split(".")[0] in row["note"]
        assert "ms" not in row
    assert freed == [1]


def test_gpu_timing_rows_carry_the_peak(monkeypatch: pytest.MonkeyPatch, fake_gpu) -> None:
    """On a (fake) GPU the row's peak comes from max_memory_allocated; the kernels run on the CPU."""
    compiled(monkeypatch)
    gpu = fake_gpu("h100_sxm")
    plan = tm.sweep_plan(gpu.device, lengths=[32])
    monkeypatch.setattr(tm, "sweep_inputs", lambda plan, t: [torch.randn(1, 1, t, 16) for _ in "qkv"])  # fmt: skip

    def allocating(q, k, v):
        gpu.allocate(3 * 2**20)
        gpu.free(3 * 2**20)
        return q

    monkeypatch.setattr(tm, "method_function", lambda name, device: allocating)
    row = tm._time_one(plan, "triton", 32, 0.01)
    assert row["peak MiB"] == pytest.approx(3.0) and row["ms"] > 0 and row["TFLOP/s"] > 0
    assert "GFLOP/s" not in row


@pytest.mark.parametrize(("kind", "unit"), [("cuda", "TFLOP/s"), ("cpu", "GFLOP/s"), ("mps", "GFLOP/s")])  # fmt: skip
def test_the_rate_unit_fits_the_device(kind: str, unit: str) -> None:
    name, per = tm.rate_unit(torch.device(kind))
    assert name == unit and per == {"TFLOP/s": 1e12, "GFLOP/s": 1e9}[unit]
    assert name in tm.TIMING_COLUMNS


def rows_for(ms: dict[str, float], t: int = 2048) -> list[dict]:
    return [{"row": f"{m} @ {t}", "T": t, "method": m, "ms": v, "IQR ms": 0.01 * v, "peak MiB": 1.0} for m, v in ms.items()]  # fmt: skip


def test_verdicts_compare_triton_with_the_fastest_sdpa_and_the_tiles() -> None:
    rows = rows_for({"sdpa flash": 1.0, "sdpa efficient": 1.5, "sdpa default": 1.1, "pytorch tiles": 30.0, "triton": 1.6})  # fmt: skip
    rows += rows_for({"sdpa default": 0.3, "triton": 0.5}, t=1024)  # below min_t: no verdict
    verdicts = tm.triton_verdicts(rows)
    assert [(v.a, v.b) for v in verdicts] == [("triton @ 2048", "sdpa flash @ 2048"), ("triton @ 2048", "pytorch tiles @ 2048")]  # fmt: skip
    assert "sdpa flash @ 2048 was 1.60x faster" in verdicts[0]
    assert "triton @ 2048 was 18.75x faster" in verdicts[1]
    assert tm.within(rows, "triton @ 2048", "sdpa flash @ 2048") == pytest.approx(1.6)
    assert tm.triton_verdicts(rows_for({"sdpa default": 1.0})) == []
    fig = tm.plot_attention_timing(rows)
    assert len(fig.axes) == 2
    plt.close(fig)


def test_helpers_of_the_sweep() -> None:
    assert tm.causal_forward_flops(1, 1, 4, 2) == 64
    assert tm.written_out_bytes(1, 1, 4, 2) == 3 * 16 * 2 + 16
    assert tm.written_out_bytes(4, 16, 8192, 2) > 24 * GiB
    with pytest.raises(ValueError, match="Unknown method 'flash3'"):
        tm.method_function("flash3", torch.device("cpu"))
    q = torch.randn(1, 1, 8, 16)
    for name in (
        "sdpa default",
        "sdpa flash",
        "pytorch tiles",
        "written out",
    ):  # flash: a CPU kernel too
        assert tm.method_function(name, torch.device("cpu"))(q, q, q).shape == q.shape


def test_each_peak_against_the_bytes_it_must_and_must_not_hold(fake_gpu) -> None:
    plan = tm.sweep_plan(fake_gpu("h100_sxm").device, lengths=[512])
    b, h, t, d, size = plan.batch, plan.heads, 512, plan.head_dim, plan.dtype.itemsize
    out, lse, scores = b * h * t * d * size, b * h * t * 4, b * h * t * t * size
    assert tm.peak_rule(plan, "triton", t)[:2] == (out + lse, out + lse + 1024)
    assert tm.peak_rule(plan, "sdpa flash", t)[:2] == (out, scores)
    assert tm.peak_rule(plan, "written out", t)[:2] == (scores, None)
    assert tm.peak_rule(plan, "sdpa default", t)[:2] == tm.peak_rule(plan, "pytorch tiles", t)[:2] == (out, None)  # fmt: skip
    peaks = {
        "triton": (out + lse, True),
        "sdpa flash": (2 * out, True),
        "written out": (3 * scores + t * t, True),  # scores, masked, probabilities, mask
        "sdpa efficient": (scores, False),  # a fused kernel never holds the T x T scores
        "sdpa cudnn": (out - 1, False),  # below its own output
        "sdpa default": (3 * scores, True),  # its math fallback may hold them
    }
    rows = [{"row": f"{m} @ {t}", "T": t, "method": m, "peak MiB": n / 2**20} for m, (n, _) in peaks.items()]  # fmt: skip
    rows.append({"row": "written out @ 8192", "T": 8192, "method": "written out", "note": "skipped"})  # fmt: skip
    checks = tm.peak_checks(plan, rows)
    assert [c["holds"] for c in checks] == [ok for _, ok in peaks.values()]
    assert tm.peak_checks(tm.sweep_plan("cpu"), [{"row": "x", "T": 8, "method": "triton"}]) == []


def test_memory_slopes_from_the_peaks() -> None:
    rows = [
        {"method": m, "T": t, "peak MiB": peak}
        for t in (512, 1024, 2048)
        for m, peak in (
            ("written out", 3 * (t / 512) ** 2),
            ("triton", t / 512),
            ("sdpa default", 0.0),
        )
    ]
    rows.append({"method": "pytorch tiles", "T": 512, "peak MiB": 1.0})  # one point: no slope
    slopes = tm.memory_slopes(rows)
    assert slopes == pytest.approx({"written out": 2.0, "triton": 1.0})
    assert tm.memory_slopes([{"method": "sdpa default", "T": 128, "ms": 1.0}]) == {}


# --- the H200 audit: what the sweep times ---------------------------------------------------------


def test_an_sdpa_kernel_row_enters_its_context_once_per_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Entered inside the timed function, sdpa_kernel's Python cost was timed on every call."""
    entered = []

    @contextlib.contextmanager
    def counting(backend):  # noqa: ANN001, ANN202
        entered.append(backend)
        yield

    monkeypatch.setattr(tm, "sdpa_kernel", counting)
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(tm.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))  # fmt: skip
    plan = tm.sweep_plan("cpu", lengths=[16])
    row = tm._time_one(plan, "sdpa flash", 16, 0.01)
    assert "ms" in row, row
    assert len(calls) > 3 and entered == [tm.SDPBackend.FLASH_ATTENTION], (len(calls), entered)
    context, fn = tm.timed_method("sdpa default", plan.device)
    assert isinstance(context, contextlib.nullcontext)


def test_a_gpu_sweep_times_the_tiles_up_to_4096_and_says_why(monkeypatch: pytest.MonkeyPatch, fake_gpu) -> None:  # fmt: skip
    compiled(monkeypatch)
    plan = tm.sweep_plan(fake_gpu("h100_sxm").device)
    left_out = sorted(t for (m, t) in plan.skips if m == "pytorch tiles")
    assert left_out == [t for t in tm.GPU_LENGTHS if t > tm.TILES_MAX_T] == [8192]
    why = plan.skips[("pytorch tiles", 8192)]
    assert (
        "left out above T = 4096" in why
        and "2,080 tile steps" in why
        and "3.9 times as many" in why
    ), why
    assert "skipped pytorch tiles at T = 8192: left out above T = 4096" in str(plan)
    assert tm.TILES_MAX_T >= 2048  # the verdicts' shortest T (triton_verdicts' min_t)
    assert not [t for (m, t) in tm.sweep_plan("cpu", lengths=[8192]).skips if m == "pytorch tiles"]  # fmt: skip


# --- timed for training (issue 31, item 6): plans, rows and verdicts; kernels only on a GPU ------


@pytest.mark.parametrize(("kind", "sixteen"), [("h100_sxm", torch.bfloat16), ("t4", torch.float16), ("mi300x", torch.bfloat16)])  # fmt: skip
def test_training_plans_on_a_gpu(monkeypatch: pytest.MonkeyPatch, fake_gpu, kind, sixteen) -> None:
    compiled(monkeypatch)
    gpu = fake_gpu(kind)
    plan = tm.training_plan(gpu.device, lengths=[512, 1024])  # lengths: the full table's only
    assert plan.shapes == [(sixteen, 64, 2048), (sixteen, 64, 8192)]
    assert plan.passes == ("forward+backward",) and plan.methods[0] == "triton"
    assert {"sdpa flash", "sdpa efficient"} <= set(plan.methods) and "sdpa default" not in plan.methods  # fmt: skip
    full = tm.training_plan(gpu.device, full=True)
    assert len(full.shapes) == 2 * 4 * 5 and full.passes == ("forward", "backward", "forward+backward")  # fmt: skip
    assert {d for _, d, _ in full.shapes} == {16, 32, 64, 128}
    assert {dt for dt, _, _ in full.shapes} == {sixteen, torch.float32}
    assert {t for _, _, t in full.shapes} == set(tm.GPU_LENGTHS)
    text = str(full)
    assert "40 shapes (head_dim 16, 32, 64, 128; T = 512, 1024, 2048, 4096, 8192" in text, text
    assert "passes: forward, backward, forward+backward" in text
    assert tm.training_plan(gpu.device, lengths=[4096], full=True).shapes[0][2] == 4096


def test_no_training_timing_without_a_compiled_triton(fake_gpu) -> None:
    cpu = tm.training_plan("cpu", full=True)
    assert cpu.shapes == [] and "interpreter runs them in NumPy" in str(cpu)
    mps = tm.training_plan(fake_gpu("mps").device)
    assert mps.shapes == [] and "no training timing" in str(mps)


def training_rows(machine=None) -> list[dict]:
    """Rows as training_timing makes them: Triton and two SDPA kernels at T = 1024 and 2048."""
    rows = []
    for t, times in ((1024, (1.0, 0.8, 0.9)), (2048, (3.0, 2.0, 2.5))):
        for method, ms in zip(("triton", "sdpa flash", "sdpa efficient"), times):
            name = tm.training_row_name(method, "forward+backward", torch.bfloat16, 64, t)
            rows.append({"row": name, "method": method, "pass": "forward+backward", "dtype": "bfloat16", "head_dim": 64, "T": t, "ms": ms, "IQR ms": 0.01, "machine": machine, "note": ""})  # fmt: skip
    rows.append({**rows[-1], "row": "sdpa cudnn forward+backward d=64 bfloat16 @ 2048", "method": "sdpa cudnn", "note": "did not run: no kernel"})  # fmt: skip
    del rows[-1]["ms"]
    return rows


def test_training_rows_keep_triton_and_the_fastest_sdpa_kernel() -> None:
    rows = training_rows()
    kept = tm.fastest_sdpa_rows(rows)
    assert [r["row"] for r in kept] == [
        "triton forward+backward d=64 bfloat16 @ 1024",
        "sdpa flash forward+backward d=64 bfloat16 @ 1024",
        "triton forward+backward d=64 bfloat16 @ 2048",
        "sdpa flash forward+backward d=64 bfloat16 @ 2048",
    ]
    assert kept[-1]["note"] == "fastest SDPA kernel; sdpa efficient 2.5 ms, sdpa cudnn did not run"
    verdicts = tm.training_verdicts(rows)
    assert len(verdicts) == 1 and "triton forward+backward d=64 bfloat16 @ 2048" in str(verdicts[0])
    assert "sdpa flash forward+backward d=64 bfloat16 @ 2048" in str(verdicts[0])


@pytest.mark.parametrize("pass_", ["forward", "backward", "forward+backward"])
@pytest.mark.parametrize("method", ["triton", "sdpa flash"])
def test_training_calls_run_each_pass(method: str, pass_: str) -> None:
    """The timed calls themselves, on CPU tensors (Triton through the interpreter)."""
    from helpers.attention_triton import triton_status

    if method == "triton" and not triton_status("cpu").runs:
        pytest.skip(f"Triton cannot run here: {triton_status('cpu')}")
    g = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(1, 1, 40, 16, generator=g) for _ in range(4))
    qkv = [x.requires_grad_() for x in (q, k, v)]
    context, call = tm.training_call(method, pass_, qkv, dout)
    with context:
        first, second = call(), call()  # the backward alone runs twice on one graph
    if pass_ == "forward":
        assert first.shape == q.shape and first.requires_grad
    else:
        assert len(first) == 3 and all(torch.equal(a, b) for a, b in zip(first, second))


def test_a_training_row_on_a_fake_gpu(monkeypatch: pytest.MonkeyPatch, fake_gpu) -> None:
    """The GPU branch's row: rate in TFLOP/s counting the backward as 2.5 forwards; failures as notes."""
    compiled(monkeypatch)
    plan = tm.training_plan(fake_gpu("h100_sxm").device)
    monkeypatch.setattr(tm, "training_inputs", lambda plan, shape: [torch.zeros(1, 1, 8, 16) for _ in range(4)])  # fmt: skip
    monkeypatch.setattr(tm, "training_call", lambda *a: (contextlib.nullcontext(), lambda: None))
    row = tm._time_training(plan, "triton", "forward+backward", plan.shapes[0], 0.01)
    flops = 3.5 * tm.causal_forward_flops(4, 16, 2048, 64)
    assert row["TFLOP/s"] == pytest.approx(flops / (row["ms"] / 1e3) / 1e12)
    assert row["row"] == "triton forward+backward d=64 bfloat16 @ 2048" and row["note"] == ""

    def broken(*a):
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(tm, "training_call", broken)
    row = tm._time_training(plan, "sdpa flash", "forward+backward", plan.shapes[0], 0.01)
    assert "ms" not in row and row["note"].startswith("did not run: No available kernel")


def test_the_backward_check_on_this_cpu() -> None:
    """Interpreted here: dq, dk, dv of the Triton backward within the float64 rule, causal and not."""
    from helpers.attention_triton import triton_status

    if not triton_status("cpu").runs:
        assert tm.backward_check("cpu") == []
        return
    rows = tm.backward_check("cpu")
    assert [(r["dtype"], r["causal"]) for r in rows] == [("float32", False), ("float32", True), ("float16", False), ("float16", True)]  # fmt: skip
    assert all(r["passes"] and r["run"] == "interpreter" and r["T"] == 72 for r in rows), rows
