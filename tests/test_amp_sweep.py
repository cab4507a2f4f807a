"""helpers.amp_sweep: the fp32-vs-TF32-vs-AMP training-step sweep, its meters, plot and widget."""

from __future__ import annotations

import os
import re
import time

import ipywidgets as widgets
import matplotlib
import pytest
import torch

matplotlib.use("Agg")

from helpers import amp_sweep  # noqa: E402
from helpers.amp_choice import local_cpu_flags  # noqa: E402
from helpers.amp_sweep import (  # noqa: E402
    AmpSweep,
    LossGap,
    _Step,
    amp_controls,
    default_batch_sizes,
    default_width,
    measure_amp_step,
    memory_meter,
    plot_amp_sweep,
    run_amp_sweep,
    step_peak_bytes,
    time_tf32,
)
from helpers.formats import PrecisionError  # noqa: E402
from helpers.machine_state import GpuTenants, MachineState  # noqa: E402
from helpers.matmul import tf32_enabled, tf32_matmuls  # noqa: E402
from helpers.profiler_markers import without_profiler_markers  # noqa: E402
from helpers.sweeps import SweepResult  # noqa: E402
from helpers.widgets import interactive_plot  # noqa: E402

CPU_HAS_FP16 = "amx_fp16" in local_cpu_flags()


def test_default_sizes_are_small_on_a_cpu() -> None:
    assert default_width("cpu") < default_width("cuda")
    assert max(default_batch_sizes("cpu")) < max(default_batch_sizes("cuda"))


def test_saved_bytes_are_exact_in_fp32_and_bf16() -> None:
    """The 'saved MiB' meter (ActivationMeter) on an 8-4-2 MLP, batch 16: parameters left out."""
    cpu = torch.device("cpu")
    _, fp32 = _Step((8, 4, 2), 16, torch.float32, cpu).memory()
    # x, the ReLU output (also the second Linear's input), the MSE loss's input and target
    assert fp32 == 16 * 8 * 4 + 16 * 4 * 4 + 16 * 2 * 4 + 16 * 2 * 4
    _, bf16 = _Step((8, 4, 2), 16, torch.bfloat16, cpu).memory()
    # x and the ReLU output in bf16, the bf16 copy of the second weight, the loss's fp32 input and target
    assert bf16 == 16 * 8 * 2 + 16 * 4 * 2 + 2 * 4 * 2 + 16 * 2 * 4 + 16 * 2 * 4


def test_memory_meter_says_what_it_measures() -> None:
    for kind in ("cuda", "mps", "cpu"):
        assert "peak during one step over the memory held before it" in memory_meter(kind)
    assert "max_memory_allocated, exact" in memory_meter("cuda")
    assert "sampled" in memory_meter("mps") and "approximate" in memory_meter("mps")
    assert "torch.profiler, exact" in memory_meter("cpu")
    assert "not measured on xpu" in memory_meter("xpu")


def test_step_peak_bytes_on_cpu_is_exact() -> None:
    held = torch.ones(2**20)  # 4 MiB allocated before: not part of the peak

    def step() -> torch.Tensor:
        a = torch.ones(2**18)  # 1 MiB
        b = a * 2  # 1 MiB more: the peak is 2 MiB
        del a
        return (b + held[: 2**18]).sum()

    peak = step_peak_bytes(step, "cpu")
    assert 2 * 2**20 <= peak < 2 * 2**20 + 4096


def test_the_cpu_peak_meter_hides_only_the_profiler_markers(capfd) -> None:  # noqa: ANN001
    """torch 2.13's profiler writes "USDT:... profiler_start" and "... profiler_stop" to stderr
    around every trace; the meter drops those two lines and passes on everything else."""
    x = torch.ones(64, 64)
    assert step_peak_bytes(lambda: x @ x, "cpu") > 0
    assert "profiler_start" not in capfd.readouterr().err
    marker = b"USDT:2026-11-29 02:03:14 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
    with without_profiler_markers():
        os.write(2, marker + b"a real warning\n" + marker.replace(b"start", b"stop"))
    assert capfd.readouterr().err == "a real warning\n"


def test_step_peak_bytes_on_cuda_reads_the_allocator(fake_gpu) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm")
    gpu.allocate(1000)  # held before the step

    def step() -> None:
        gpu.allocate(300)
        gpu.free(300)
        gpu.allocate(10)

    assert step_peak_bytes(step, "cuda") == 300
    assert gpu.allocated == 1010 and gpu.synchronize_calls >= 2


def test_step_peak_bytes_on_mps_samples(fake_gpu) -> None:  # noqa: ANN001
    gpu = fake_gpu("mps")
    gpu.allocate(1000)

    def step() -> None:
        gpu.allocate(500)
        time.sleep(0.05)  # long enough for the 1 ms sampler
        gpu.free(500)

    assert step_peak_bytes(step, "mps") == 500


def test_step_memory_excludes_the_previous_steps_gradients() -> None:
    """The bug of issue 13: stale gradients counted as 'held before', so the peak never grew."""
    sizes = (64, 64, 64, 1)
    small = measure_amp_step(sizes, 4, "fp32", "cpu", min_run_time=0.01)
    large = measure_amp_step(sizes, 2048, "fp32", "cpu", min_run_time=0.01)
    params = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:])) * 4 / 2**20
    assert small["peak MiB"] >= params  # at least the fresh gradients
    assert large["saved MiB"] > 100 * small["saved MiB"]  # activations grow with the batch
    assert large["peak MiB"] > small["peak MiB"] + large["saved MiB"] / 2


# --- measuring, plotting, the widget ------------------------------------------------------------


def test_measure_amp_step() -> None:
    row = measure_amp_step((16, 16, 1), 8, "bf16", "cpu", min_run_time=0.01)
    assert set(row) == {"ms/step", "IQR ms", "samples/s", "peak MiB", "saved MiB"}
    assert row["ms/step"] > 0 and row["samples/s"] > 0
    assert row["peak MiB"] > 0 and row["saved MiB"] > 0
    with pytest.raises(ValueError, match="batch_size must be > 0"):
        measure_amp_step((16, 1), 0, "fp32", "cpu")
    with pytest.raises(PrecisionError, match="Unknown precision"):
        measure_amp_step((16, 1), 4, "fp12", "cpu")


def small_sweep(**kw: object) -> AmpSweep:
    args = {"precisions": ("fp32", "bf16", "fp16"), "batch_sizes": (4, 8), "sizes": (16, 16, 1)}
    return run_amp_sweep("cpu", min_run_time=0.01, **{**args, **kw})


def test_run_amp_sweep_skips_slow_fp16_with_a_reason() -> None:
    sweep = small_sweep(allow_slow=not local_cpu_flags())  # bf16 emulated: allow it there
    assert sweep.results["fp32"].column("batch size") == [4, 8]
    if not CPU_HAS_FP16:
        assert "fp16" not in sweep.results and "allow_slow" in sweep.skipped["fp16"]
    assert sweep.speedup("fp32", 8) == 1.0 and sweep.speedup("bf16", 4) > 0
    rows = sweep.rows()
    assert {r["precision"] for r in rows} >= {"fp32", "bf16"} and rows[0]["vs fp32"] == "1.00x"
    text = str(sweep)
    assert "MLP 16-16-1" in text and "peak MiB =" in text and "saved MiB =" in text
    assert "saved for backward" in text and "the same meter on every device" in text
    with pytest.raises(KeyError, match="not measured"):
        sweep.speedup("bf16", 1024)


def test_run_amp_sweep_allow_slow_runs_fp16() -> None:
    sweep = small_sweep(precisions=("fp16",), batch_sizes=(4,), allow_slow=True)
    assert sweep.results["fp16"].column("batch size") == [4] and not sweep.skipped
    assert sweep.rows()[0]["vs fp32"] == "n/a"


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"precisions": ()}, ValueError, "at least one precision"),
        ({"precisions": ("fp32", "fp4")}, PrecisionError, "Unknown precision 'fp4'"),
        ({"batch_sizes": (4, -1)}, ValueError, "batch size must be > 0"),
        ({"sizes": (16,)}, ValueError, "at least an input and an output"),
    ],
)
def test_run_amp_sweep_bad_input(kw: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        small_sweep(**kw)


def test_plot_amp_sweep() -> None:
    sweep = small_sweep(precisions=("fp32", "fp16"), allow_slow=False)
    fig = plot_amp_sweep(sweep)
    rate, mem = fig.axes
    assert len(rate.lines) == len(sweep.results) and len(mem.lines) == 2 * len(sweep.results)
    assert "samples / s" in rate.get_ylabel() and "peak" in mem.get_title()
    assert "saved for backward" in mem.get_title()
    if sweep.skipped:
        assert "skipped: fp16" in fig._suptitle.get_text()


def test_widget_button_runs_the_sweep() -> None:
    controls = amp_controls("cpu", precisions=("fp32", "bf16"))
    assert controls["precisions"].value == ("fp32", "bf16")
    assert controls["width"].value == default_width("cpu")
    assert controls["batch_sizes"].value == default_batch_sizes("cpu")

    def run(precisions, batch_sizes, width, allow_slow):  # noqa: ANN001, ANN202
        return run_amp_sweep(
            "cpu",
            precisions,
            batch_sizes,
            sizes=(16, width // 64, 1),
            allow_slow=allow_slow,
            min_run_time=0.01,
        )

    box = interactive_plot(run, plot_amp_sweep, controls)
    controls["batch_sizes"].value = (8, 16)
    controls["allow_slow"].value = True
    box.run_button.click()
    assert isinstance(box.last_result, AmpSweep) and not box.run_button.disabled
    assert box.last_result.results["fp32"].column("batch size") == [8, 16]
    with pytest.raises(PrecisionError):
        amp_controls("cpu", precisions=("fp32", "fp7"))
    assert isinstance(controls["allow_slow"], widgets.Checkbox)


# --------------------------------------------------------------------------- TF32 (issue 15)


def test_sweep_skips_tf32_where_it_does_not_exist() -> None:
    sweep = run_amp_sweep("cpu", ("fp32", "tf32"), (8,), sizes=(16, 16, 1), min_run_time=0.01)
    assert list(sweep.results) == ["fp32"]
    assert "compute capability 8.0 or newer" in sweep.skipped["tf32"]
    assert "skipped tf32" in str(sweep)


def test_measure_tf32_rejected_on_cpu() -> None:
    with pytest.raises(PrecisionError, match="TF32 needs an NVIDIA GPU"):
        measure_amp_step((16, 16, 1), 8, "tf32", "cpu", min_run_time=0.01)


@pytest.mark.parametrize(("precision", "during"), [("fp32", False), ("tf32", True)])
def test_fp32_is_true_fp32_and_tf32_turns_it_on(monkeypatch, precision: str, during: bool) -> None:  # noqa: ANN001
    """The sweep's fp32 row runs with TF32 off even if the notebook turned it on; restored after."""
    seen, real_benchmark = [], amp_sweep.benchmark

    def fake_benchmark(step, **kwargs):  # noqa: ANN001, ANN003, ANN202
        seen.append(tf32_enabled())
        step()
        return real_benchmark(step, **{**kwargs, "min_run_time": 0.01})

    monkeypatch.setattr("helpers.matmul.tf32_available", lambda device=None: True)
    monkeypatch.setattr(amp_sweep, "benchmark", fake_benchmark)
    with tf32_matmuls(not during):  # the notebook's global setting, the opposite of the row's
        row = measure_amp_step((16, 16, 1), 8, precision, "cpu", min_run_time=0.01)
        assert seen == [during] and row["samples/s"] > 0
        assert tf32_enabled() is (not during), "restored"


def test_an_empty_batch_size_list_is_an_error_not_the_defaults() -> None:
    with pytest.raises(ValueError, match="at least one batch size"):
        run_amp_sweep(precisions=["fp32"], batch_sizes=[], device="cpu")


# ------------------------------------------- verdicts from the printed rows (issue 24, item 2)


def printed_ratio(text: str) -> float:
    """The one 'N.NNx' a verdict prints."""
    found = re.findall(r"(\d+\.\d+)x", text)
    assert len(found) == 1, text
    return float(found[0])


def table_ratio(row: dict) -> float:
    """The 'vs fp32' column of a printed row, as a number."""
    return float(row["vs fp32"].removesuffix("x"))


def quiet(device: str = "cpu") -> MachineState:
    return MachineState(device, 2, 2, 2, 0.1, GpuTenants(None), others_cores=0.0, window_s=1.0)


def made_sweep(ms: dict[tuple[str, int], float], iqr: float = 0.0, state=None) -> AmpSweep:  # noqa: ANN001
    """An AmpSweep with these ms/step per (precision, batch), as run_amp_sweep builds it."""
    sweep = AmpSweep("cuda:0", (8, 8, 1), "meter")
    for (precision, batch), t in ms.items():
        rows = sweep.results.setdefault(precision, SweepResult("batch size")).rows
        row = {"ms/step": t, "IQR ms": iqr * t, "samples/s": batch / (t / 1e3)}
        rows.append({"batch size": batch, **row, "peak MiB": 1.0, "saved MiB": 1.0})
        sweep.states[(precision, batch)] = state or quiet("cuda:0")
    return sweep


def test_each_verdict_prints_the_ratio_of_the_rows_it_names() -> None:
    """The H100 run's table (chapter 3, cell 78): every pair at every batch, both ways round."""
    h100 = {256: (4.296, 2.896, 2.924), 1024: (9.635, 3.494, 3.184), 8192: (62.31, 12.97, 6.844)}
    sweep = made_sweep(
        {(p, b): t for b, ts in h100.items() for p, t in zip(("fp32", "tf32", "bf16"), ts)},
        iqr=0.005,
    )
    for batch in h100:
        rows = {r["precision"]: r for r in sweep.rows() if r["batch size"] == batch}
        for a in rows:
            for b in rows:
                if a == b:
                    continue
                verdict = sweep.verdict(a, b, batch)
                ratio = rows[b]["ms/step"] / rows[a]["ms/step"]  # a's throughput over b's
                shown = max(ratio, 1 / ratio)  # the row ahead is named first
                assert printed_ratio(verdict) == pytest.approx(shown, abs=0.006), verdict
                if b == "fp32" and ratio >= 1:  # the table's own column, to the digit
                    assert f"{printed_ratio(verdict):.2f}x" == rows[a]["vs fp32"]
    assert str(sweep.verdict("bf16", "fp32", 8192)) == "here, bf16 was 9.10x faster than fp32"


def test_a_verdict_on_a_shared_gpu_does_not_conclude() -> None:
    busy = MachineState("cuda:0", 6, 6, 16, 2.0, GpuTenants(2, 28 * 2**30))
    sweep = made_sweep({("fp32", 64): 1.252, ("bf16", 64): 1.593}, iqr=0.03, state=busy)
    verdict = sweep.verdict("bf16", "fp32", 64)
    assert verdict.startswith("inconclusive, GPU shared with 2 other compute process(es)")
    assert "fp32 was 1.27x faster than bf16" in verdict and not verdict.conclusive
    assert "machine: BUSY" in str(sweep)


def test_a_verdict_names_rows_the_table_has() -> None:
    sweep = made_sweep({("fp32", 64): 1.0, ("bf16", 64): 2.0})
    with pytest.raises(ValueError, match="two different rows"):
        sweep.verdict("fp32", "fp32", 64)
    with pytest.raises(ValueError, match="0 rows with 'precision' = 'tf32'"):
        sweep.verdict("tf32", "fp32", 64)
    with pytest.raises(ValueError, match="0 rows with 'precision' = 'bf16'"):
        sweep.verdict("bf16", "fp32", 128)  # a batch size the sweep did not run


def test_a_measured_sweep_records_the_machine_of_each_row() -> None:
    sweep = small_sweep(precisions=("fp32", "bf16"), batch_sizes=(4,), allow_slow=True)
    assert set(sweep.states) == {("fp32", 4), ("bf16", 4)}
    assert all(isinstance(s, MachineState) for s in sweep.states.values())
    assert "machine: " in str(sweep) and "torch" in str(sweep.machine)
    verdict = sweep.verdict("bf16", "fp32", 4)
    rows = {r["precision"]: r for r in sweep.rows()}
    ratio = rows["fp32"]["ms/step"] / rows["bf16"]["ms/step"]
    expected = max(ratio, 1 / ratio)  # the row ahead is named first
    assert printed_ratio(verdict) == pytest.approx(expected, abs=0.006)


# ----------------------------------------------------- TF32 against fp32 (AUDIT finding 25)


def test_time_tf32_on_an_ampere_gpu_prints_its_tables_ratio(fake_gpu) -> None:  # noqa: ANN001
    """The CUDA branch, on a fake H100: the work runs on the CPU, timed with CUDA events."""
    gpu = fake_gpu("h100_sxm")
    a, b = torch.randn(64, 32), torch.randn(32, 48)
    speed = time_tf32(a, b, "cuda", min_run_time=0.02)
    fp32, tf32 = speed.rows
    assert (fp32["matmul"], tf32["matmul"]) == ("fp32", "TF32") and fp32["vs fp32"] == "1.00x"
    assert fp32["shape"] == "64x32 @ 32x48" and tf32["TFLOP/s"] > 0
    ratio = fp32["ms"] / tf32["ms"]
    assert tf32["vs fp32"] == f"{ratio:.2f}x"
    shown = max(ratio, 1 / ratio)  # the row ahead is named first
    assert printed_ratio(speed.verdict) == pytest.approx(shown, abs=0.006)
    assert gpu.synchronize_calls > 0 and "no other process on this GPU" in str(speed)
    gpu.nvml.processes = {0: [(4242, 20 * 2**30)]}  # a co-tenant arrives
    shared = time_tf32(a, b, "cuda", min_run_time=0.02)
    assert shared.verdict.startswith("inconclusive, GPU shared with 1 other compute process(es)")


@pytest.mark.parametrize("kind", ["t4", "mi300x", "mps"])
def test_time_tf32_says_why_where_there_is_none(fake_gpu, kind: str) -> None:  # noqa: ANN001
    gpu = fake_gpu(kind)
    with pytest.raises(PrecisionError, match="compute capability 8.0 or newer"):
        time_tf32(torch.randn(4, 4), torch.randn(4, 4), gpu.device)


def test_time_tf32_bad_input() -> None:
    with pytest.raises(PrecisionError, match="cpu has none"):
        time_tf32(torch.randn(4, 4), torch.randn(4, 4))


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        (torch.randn(4, 3), torch.randn(4, 3), "an \\(m x k\\) and a \\(k x n\\) matrix"),
        (torch.randn(4), torch.randn(4, 3), "matrix"),
        (torch.randn(4, 4).half(), torch.randn(4, 4).half(), "float32 matrices"),
    ],
)
def test_time_tf32_refuses_what_is_not_an_fp32_matmul(fake_gpu, a, b, match: str) -> None:  # noqa: ANN001
    fake_gpu("a100")
    with pytest.raises(ValueError, match=match):
        time_tf32(a, b, "cuda")


# ------------------------------------------ AMP's final loss against a new seed (finding 27)


def test_the_h100_gap_is_measured_against_the_seed_spread() -> None:
    """The H100 run's wide MLP: bf16 0.03363 against fp32 0.04518, 26% apart."""
    within = LossGap("bf16", 0.03363, {0: 0.04518, 1: 0.0477, 2: 0.0351})
    assert within.gap == pytest.approx(0.01155) and within.within
    text = str(within)
    assert "lower by 0.012, 26% of fp32's" in text and "seeds 0, 1, 2" in text
    assert "within what a new seed changes (0.92x the spread)" in text
    beyond = LossGap("bf16", 0.03363, {0: 0.04518, 1: 0.0453})
    assert not beyond.within and "beyond what a new seed changes (96.2x the spread)" in str(beyond)


def test_a_tiny_gap_keeps_its_digits() -> None:
    """Chapter 3's fp16 epoch: 5e-05 apart is 0.015% of fp32's loss and 0.0018x the spread,
    not the "0.0%" and "0.00x" that fixed decimals print."""
    tiny = str(LossGap("fp16", 0.33985, {0: 0.3398, 1: 0.3224, 2: 0.3496}))
    assert "higher by 5e-05, 0.015% of fp32's" in tiny, tiny
    assert "(0.0018x the spread)" in tiny, tiny
    assert "0.0%" not in tiny and "0.00x" not in tiny


def test_loss_gap_edge_cases() -> None:
    assert str(LossGap("fp16", 0.5, {0: 0.5, 1: 0.5})).endswith("identical")
    assert "fp16 changed it and no seed did" in str(LossGap("fp16", 0.6, {0: 0.5, 1: 0.5}))
    assert "higher by 0.1" in str(LossGap("fp16", 0.6, {0: 0.5, 1: 0.5}))
    epoch = LossGap("fp16", 0.3398, {0: 0.3398, 1: 0.3224, 2: 0.3496}, what="mean loss of epoch 1")
    assert str(epoch).startswith("fp16 mean loss of epoch 1 0.3398 against fp32's 0.3398")
    with pytest.raises(ValueError, match="at least two seeds"):
        LossGap("bf16", 0.1, {0: 0.1})
    with pytest.raises(ValueError, match="finite numbers"):
        LossGap("bf16", float("nan"), {0: 0.1, 1: 0.2})
