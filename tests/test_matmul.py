"""helpers.matmul: the chapter-1 size sweep, its speed-up helper, plots, widget and bad input."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from matplotlib.figure import Figure
from tf32_state import tf32_readings

import helpers.matmul as mm
from helpers.machine_state import GpuTenants, MachineState
from helpers.validate import DeviceError
from helpers.widgets import interactive_plot

TESTS = str(Path(__file__).resolve().parent)
FAST = dict(min_run_time=0.01, progress=False)


def test_matmul_flops_counts_two_per_multiply_add() -> None:
    assert mm.matmul_flops(2, 3, 4) == 48
    assert mm.matmul_flops(1024, 1024, 1024) == 2 * 1024**3


def test_matmul_flops_agrees_with_torch_flop_counter() -> None:
    from torch.utils.flop_counter import FlopCounterMode

    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with FlopCounterMode(display=False) as counter:
        a @ b
    assert counter.get_total_flops() == mm.matmul_flops(8, 16, 4)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "8", True, None])
def test_matmul_flops_rejects_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError, match="whole number > 0|must be > 0"):
        mm.matmul_flops(bad, 4, 4)


def test_size_range_is_doublings() -> None:
    assert mm._sizes(None, (64, 1024)) == [64, 128, 256, 512, 1024]
    assert mm._sizes(None, (100, 1000)) == [100, 200, 400, 800]
    assert mm._sizes(None, (8, 8)) == [8]
    assert mm._sizes(None, None) == [64, 128, 256, 512, 1024]


@pytest.mark.parametrize(
    ("lo", "hi", "match"),
    [(1024, 64, "smaller size first"), (0, 8, "> 0"), (-4, 8, "> 0"), (4, 2.5, "whole number")],
)
def test_size_range_rejects_bad_ranges(lo: object, hi: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        mm._sizes(None, (lo, hi))


def test_default_size_range_is_small_on_cpu_and_offered_by_the_slider() -> None:
    lo, hi = mm.default_size_range("cpu")
    assert (lo, hi) == (64, 1024)
    slider = mm.matmul_controls("cpu")["size_range"].options
    assert lo in slider and hi in slider


def test_peak_is_unknown_on_cpu() -> None:
    assert mm.matmul_peak_flops("cpu", "fp32") is None


def test_sweep_rows_are_consistent() -> None:
    result = mm.run_matmul_sweep([16, 32], "fp32", "cpu", **FAST)
    assert isinstance(result, mm.MatmulSweep) and result.param == "n"
    assert result.column("n") == [16, 32] and not result.skipped and result.stopped is None
    for row in result.rows:
        assert set(row) == {"n", "time (ms)", "IQR (%)", "GFLOP/s"}  # no peak known on CPU
        assert row["time (ms)"] > 0
        expected = mm.matmul_flops(row["n"], row["n"], row["n"]) / (row["time (ms)"] / 1e3) / 1e9
        assert math.isclose(row["GFLOP/s"], expected, rel_tol=1e-9)
    text = str(result)
    assert "fp32 matmul on cpu" in text and "peak unknown" in text and "GFLOP/s" in text


def test_sweep_accepts_a_range_and_other_dtypes() -> None:
    result = mm.run_matmul_sweep(size_range=(16, 32), dtype=torch.bfloat16, device="cpu", **FAST)
    assert result.column("n") == [16, 32] and result.dtype == "bf16"
    assert mm.run_matmul_sweep(16, "float64", "cpu", **FAST).dtype == "fp64"


def test_sweep_reports_percent_of_a_known_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mm, "matmul_peak_flops", lambda device, dtype: 1e12)
    result = mm.run_matmul_sweep([16], "fp32", "cpu", **FAST)
    row = result.rows[0]
    assert math.isclose(row["% of peak"], row["GFLOP/s"] / 1e3 * 100, rel_tol=1e-9)
    assert "1,000 GFLOP/s (datasheet)" in str(result)


def test_sweep_skips_calls_over_the_time_budget() -> None:
    result = mm.run_matmul_sweep([16, 32], "fp32", "cpu", max_call_seconds=1e-12, **FAST)
    assert result.rows == [] and len(result.skipped) == 2
    assert "first two calls took" in result.skipped[0] and "would take about" in result.skipped[1]
    assert "skipped n=16" in str(result)
    assert isinstance(mm.plot_matmul_sweep(result), Figure)  # says "nothing measured"


def test_sweep_calibrates_before_a_big_first_size() -> None:
    result = mm.run_matmul_sweep([4096], "fp32", "cpu", max_call_seconds=1e-12, **FAST)
    assert result.rows == [] and "would take about" in result.skipped[0]


def test_sweep_survives_running_out_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    real_randn = torch.randn

    def randn(*size: object, **kw: object) -> torch.Tensor:
        if size and size[0] == 64:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 16 EiB")
        return real_randn(*size, **kw)

    monkeypatch.setattr(torch, "randn", randn)
    result = mm.run_matmul_sweep([16, 32, 64, 128], "fp32", "cpu", **FAST)
    assert result.column("n") == [16, 32]
    assert result.stopped and "out of memory at n=64" in result.stopped
    assert "stopped early" in mm.plot_matmul_sweep(result)._suptitle.get_text()


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(sizes=[]), ValueError, "no sizes"),
        (dict(sizes=[0]), ValueError, "> 0"),
        (dict(sizes=[-8]), ValueError, "> 0"),
        (dict(sizes=[1.5]), ValueError, "whole number"),
        (dict(sizes=["64"]), ValueError, "whole number"),
        (dict(sizes=[16], size_range=(16, 32)), ValueError, "not both"),
        (dict(size_range=(1024, 64)), ValueError, "smaller size first"),
        (dict(size_range=(16, 32, 64)), ValueError, r"\(smallest, largest\)"),
        (dict(sizes=[16], dtype="fp8"), DeviceError, "Unknown dtype"),
        (dict(sizes=[16], dtype="int32"), DeviceError, "Unknown dtype"),
        (dict(sizes=[16], device="cuda:3"), DeviceError, "Devices here"),
        (dict(sizes=[16], device="tpu"), DeviceError, "not a device name"),
        (dict(sizes=[16], device=3.5), DeviceError, "must be a string"),
        (dict(sizes=[16], min_run_time=0), ValueError, "min_run_time"),
        (dict(sizes=[16], min_run_time=-1.0), ValueError, "min_run_time"),
        (dict(sizes=[16], max_call_seconds=0), ValueError, "max_call_seconds"),
    ],
)
def test_sweep_rejects_bad_input_clearly(kwargs: dict, error: type, match: str) -> None:
    kwargs = {"device": "cpu", "progress": False, **kwargs}
    with pytest.raises(error, match=match):
        mm.run_matmul_sweep(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_absent_gpu_is_named_with_what_exists() -> None:
    with pytest.raises(DeviceError, match=r"'cuda:3' is not available.*Devices here: .*cpu"):
        mm.run_matmul_sweep([16], device="cuda:3", progress=False)


def test_speedup_needs_an_accelerator() -> None:
    with pytest.raises(DeviceError, match="needs a GPU"):
        mm.run_speedup([16], device="cpu", progress=False)


def sweep_of(
    device: str, times: dict[int, float], iqr: float = 1.0, **kw: object
) -> mm.MatmulSweep:
    rows = [{"n": n, "time (ms)": t, "IQR (%)": iqr} for n, t in times.items()]
    return mm.MatmulSweep(param="n", rows=rows, device=device, **kw)


def test_speedup_joins_on_n_and_takes_the_faster_cpu_configuration(monkeypatch, fake_gpu) -> None:  # noqa: ANN001
    fake_gpu("h100_sxm")
    gpu = sweep_of("cuda:0", {16: 4.0, 32: 0.5, 64: 1.0}, skipped=["n=128: over the budget"])
    every = sweep_of("cpu", {16: 2.0, 32: 8.0}, skipped=["n=64: over the budget"])
    one = sweep_of("cpu", {16: 1.0, 32: 16.0})
    calls = []

    def fake_sweep(sizes, dtype, device, num_threads=None, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append((str(device), num_threads))
        return {"cuda": gpu, "cpu": one if num_threads == 1 else every}[str(device)]

    monkeypatch.setattr(mm, "run_matmul_sweep", fake_sweep)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 6)
    both = mm.run_speedup([16, 32, 64], device="cuda")
    assert calls == [("cuda", None), ("cpu", None), ("cpu", 1)]
    assert both.column("n") == [16, 32]
    assert both.column("CPU (ms)") == [1.0, 8.0] and both.column("CPU threads") == [1, 6]
    assert both.column("speed-up") == [0.25, 16.0]
    assert both.column("cuda:0 (ms)") == [4.0, 0.5]
    assert both.device == "cpu vs cuda:0" and len(both.skipped) == 2
    assert isinstance(mm.plot_speedup(both), Figure)


def test_run_speedup_on_a_fake_h100_runs_its_gpu_branch(monkeypatch, fake_gpu) -> None:  # noqa: ANN001
    """End to end on the fake GPU: kernels replaced by CPU work, NVML and events faked."""
    fake_gpu("h100_sxm")
    for name in ("randn", "ones"):
        real = getattr(torch, name)
        monkeypatch.setattr(
            torch, name, lambda *size, device=None, dtype=None, _r=real: _r(*size, dtype=dtype)
        )
    result = mm.run_speedup([16, 32], "fp32", "cuda", **FAST)
    assert result.column("n") == [16, 32] and "note" in result.rows[0]
    assert set(result.column("CPU threads")) <= {1, torch.get_num_threads()}
    assert result.machine is not None and str(result.machine).startswith("machine: ")
    assert str(result).splitlines()[-1] == str(result.machine)
    assert (
        mm.speedup_verdict(result).splitlines()[-1].startswith("relative to this CPU configuration")
    )


#: Chapter 1 cell 20 on the H100 run of 2026-11-26 (6 CPU threads, shared GPU): the CPU's
#: 8 ms scheduling floor at n = 64..512; IQRs were not printed, 1% here.
H100_ROWS = {
    64: (7.997, 0.01432),
    128: (7.994, 0.0136),
    256: (7.996, 0.01792),
    512: (7.994, 0.02752),
    1024: (16.73, 0.122),
    2048: (72.63, 0.7),
    4096: (459.3, 5.189),
}


def speedup_rows(data: dict[int, tuple[float, float]], iqr: float = 1.0) -> list[dict]:
    return [
        {
            "n": n,
            "CPU (ms)": c,
            "CPU IQR (%)": iqr,
            "CPU threads": 6,
            "cuda:0 (ms)": g,
            "cuda:0 IQR (%)": iqr,
            "speed-up": c / g,
            "note": "",
        }
        for n, (c, g) in data.items()
    ]


def test_flat_cpu_rows_are_flagged_as_a_floor() -> None:
    notes = mm.cpu_floor_notes(speedup_rows(H100_ROWS))
    assert sorted(notes) == [64, 128, 256, 512]
    assert notes[64] == notes[512] and "not a measurement of the matmul" in notes[512]
    assert "stayed flat (7.994-7.997 ms) from n=64 to n=512 while the FLOPs grew 512x" in notes[64]
    quiet = {64: (0.007986, 0.01369), 128: (0.01428, 0.01385), 256: (0.07418, 0.01807)}
    assert mm.cpu_floor_notes(speedup_rows(quiet)) == {}  # bench-ch01: the time grows
    two_runs = {16: (1.0, 1.0), 32: (1.0, 1.0), 64: (5.0, 1.0), 128: (40.0, 1.0), 256: (40.0, 1.0)}
    runs = mm.cpu_floor_notes(speedup_rows(two_runs))
    assert sorted(runs) == [16, 32, 128, 256] and runs[16] != runs[128]


QUIET = MachineState("cuda:0", 6, 6, 16, 1.0, GpuTenants(0), 0.0, 1.0)
SHARED = MachineState("cuda:0", 6, 6, 16, 9.0, GpuTenants(2, 2**30), 4.0, 1.0)


def verdict_for(data: dict, machine: MachineState | None, iqr: float = 1.0) -> str:
    rows = speedup_rows(data, iqr)
    return mm.speedup_verdict(
        mm.MatmulSweep(param="n", rows=rows, compares_devices=True, machine=machine)
    )


def test_the_speedup_verdict_leaves_the_floor_out_and_states_the_tables_ratio() -> None:
    """Finding 7: cell 20 printed 'the GPU wins from n=64; at best 588.0x, at n=128'."""
    text = verdict_for(H100_ROWS, QUIET)
    first = text.splitlines()[0]
    assert first.startswith("largest speed-up, at n=1024: here, cuda:0 was 137.13x faster than CPU")
    assert float(re.findall(r"(\d+\.\d+)x", first)[0]) == pytest.approx(16.73 / 0.122, abs=0.005)
    assert "cuda:0 faster beyond the spreads from n=1024 on" in text
    assert "not counted, n = 64, 128, 256, 512: the CPU time stayed flat" in text
    assert "588" not in text
    assert (
        "relative to this CPU configuration (the faster of 6 thread(s) per n; machine: quiet"
        in text
    )


def test_on_a_busy_machine_the_speedup_is_not_concluded() -> None:
    text = verdict_for(H100_ROWS, SHARED)
    assert text.splitlines()[0].startswith("largest speed-up, at n=1024: inconclusive, GPU shared")
    assert "no break-even called: GPU shared with 2 other compute process(es)" in text
    assert "machine: BUSY" in text


def test_a_gpu_slower_at_small_n_breaks_even_later() -> None:
    data = {
        64: (0.007986, 0.01369),
        128: (0.01428, 0.01385),
        256: (0.07418, 0.01807),
        512: (0.4658, 0.01792),
    }
    text = verdict_for(data, QUIET, iqr=2.0)
    assert "faster beyond the spreads from n=256 on" in text  # 128: 1.03x, within the 4% spreads


def test_a_gpu_slower_at_the_largest_n_has_no_break_even() -> None:
    data = {64: (0.01, 0.02), 128: (0.04, 0.01), 256: (0.16, 0.2)}
    text = verdict_for(data, QUIET)
    assert "cuda:0 was not faster beyond the spreads at every size from some n on" in text
    assert (
        text.splitlines()[0] == "largest speed-up, at n=128: here, cuda:0 was 4.00x faster than CPU"
    )


@pytest.mark.parametrize("seed", range(12))
def test_the_speedup_verdicts_ratio_is_the_tables(seed: int) -> None:
    rnd = random.Random(seed)
    data, cpu = {}, rnd.uniform(0.001, 0.01)
    for n in (64, 128, 256, 512, 1024):
        cpu *= rnd.uniform(2.5, 8.0)  # grows with n: no floor
        data[n] = (cpu, rnd.uniform(0.01, 5.0))
    rows = speedup_rows(data, iqr=rnd.uniform(0.0, 10.0))
    first = mm.speedup_verdict(mm.MatmulSweep(param="n", rows=rows, machine=QUIET)).splitlines()[0]
    n = int(re.search(r"at n=(\d+)", first).group(1))
    top = max(rows, key=lambda r: r["speed-up"])
    assert n == top["n"]
    ratio = top["speed-up"]
    shown = max(ratio, 1 / ratio)  # the row ahead is named first
    assert float(re.findall(r"(\d+\.\d+)x", first)[0]) == pytest.approx(shown, abs=0.006)


def test_timing_pair_verdict_reads_both_timings_from_the_row() -> None:
    row = {
        "n": 1024,
        "1 thread (ms)": 17.79,
        "1 thread IQR (%)": 1.0,
        "6 threads (ms)": 27.98,
        "6 threads IQR (%)": 1.0,
    }
    verdict = mm.timing_pair_verdict(row, "6 threads", "1 thread", QUIET)
    assert verdict == "here, 1 thread was 1.57x faster than 6 threads" and verdict.conclusive
    busy = mm.timing_pair_verdict(row, "6 threads", "1 thread", SHARED)
    assert busy.startswith("inconclusive, GPU shared") and not busy.conclusive


def test_no_rows_no_speedup_verdict() -> None:
    assert "no speed-up" in mm.speedup_verdict(mm.MatmulSweep(param="n"))


def test_a_sweep_on_one_thread_says_so_and_restores_the_count() -> None:
    before = torch.get_num_threads()
    result = mm.run_matmul_sweep([32], "fp32", "cpu", num_threads=1, **FAST)
    assert result.machine is not None and result.machine.torch_threads == 1
    assert "torch 1 thread(s)" in str(result).splitlines()[-1]
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="num_threads"):
        mm.run_matmul_sweep([32], "fp32", "cpu", num_threads=0, **FAST)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_speedup_on_a_gpu() -> None:
    # A generous per-call budget: on a loaded machine (pytest -n 8 on the H100 box) one cold
    # 256 x 256 call once went over the default second and the row was skipped.
    result = mm.run_speedup([64, 256], "fp32", "cuda", max_call_seconds=60.0, **FAST)
    assert result.column("n") == [64, 256] and all(s > 0 for s in result.column("speed-up"))
    assert "peak" not in str(result).splitlines()[0]  # a comparison has no datasheet peak


def test_a_slow_first_call_is_retried_before_a_size_is_skipped(monkeypatch) -> None:
    """The first call of a size may include one-time set-up (cuBLAS, thread pools): not a reason to skip."""
    real, calls = torch.matmul, []

    def cold_once(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.3)
        return real(a, b)

    monkeypatch.setattr(torch, "matmul", cold_once)
    result = mm.run_matmul_sweep([32], "fp32", "cpu", max_call_seconds=0.2, **FAST)
    assert result.column("n") == [32] and not result.skipped


def test_an_always_slow_size_is_skipped_with_its_reason(monkeypatch) -> None:
    real = torch.matmul

    def slow(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        time.sleep(0.15)
        return real(a, b)

    monkeypatch.setattr(torch, "matmul", slow)
    result = mm.run_matmul_sweep([32], "fp32", "cpu", max_call_seconds=0.1, **FAST)
    assert not result.rows and "first two calls" in result.skipped[0]


def test_unknown_peak_says_how_to_find_the_achievable_rate() -> None:
    text = str(mm.run_matmul_sweep([16], "fp32", "cpu", **FAST))
    assert "achievable rate" in text.splitlines()[0]


def test_plots_have_the_expected_panels() -> None:
    result = mm.run_matmul_sweep([16, 32], "fp32", "cpu", **FAST)
    fig = mm.plot_matmul_sweep(result)
    assert len(fig.axes) == 2
    assert fig.axes[1].get_ylabel() == "GFLOP/s"


def test_controls_match_the_run_function() -> None:
    controls = mm.matmul_controls("cpu")
    assert set(controls) == {"size_range", "dtype", "device"}
    assert controls["size_range"].value == (64, 1024)
    assert controls["dtype"].value == "fp32" and "cpu" in controls["device"].options


def test_widget_button_runs_the_sweep() -> None:
    controls = mm.matmul_controls("cpu")
    controls["size_range"].value = (16, 32)
    box = interactive_plot(
        lambda **kw: mm.run_matmul_sweep(**kw, **FAST), mm.plot_matmul_sweep, controls
    )
    box.run_button.click()
    assert isinstance(box.last_result, mm.MatmulSweep)
    assert box.last_result.column("n") == [16, 32]


@pytest.mark.parametrize(
    ("kind", "has_tf32"),
    [("h100_sxm", True), ("a100", True), ("rtx4090", True), ("t4", False), ("mi300x", False)],
)
def test_tf32_is_offered_only_where_it_exists(fake_gpu, kind: str, has_tf32: bool) -> None:  # noqa: ANN001
    gpu = fake_gpu(kind)
    assert mm.tf32_available(gpu.device) is has_tf32
    assert ("tf32" in mm.dtype_choices(gpu.device)) is has_tf32
    assert ("tf32" in mm.matmul_controls(gpu.device)["dtype"].options) is has_tf32
    if has_tf32:
        assert mm.check_tf32(gpu.device) == torch.float32
    assert mm.dtype_choices(gpu.device)[0] == "fp32"


def test_tf32_peak_comes_from_the_table(fake_gpu) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm")
    assert mm.matmul_peak_flops(gpu.device, "tf32") == pytest.approx(494e12)
    with mm.tf32_matmuls(True):
        assert mm.matmul_peak_flops(gpu.device, "fp32") == pytest.approx(494e12)
    assert mm.matmul_peak_flops(gpu.device, "fp32") == pytest.approx(67e12)


def test_tf32_on_a_cpu_is_a_clear_error() -> None:
    assert mm.dtype_choices("cpu") == ["fp32", "bf16", "fp16", "fp64"]
    with pytest.raises(DeviceError, match="compute capability 8.0 or newer.*Use 'fp32'"):
        mm.run_matmul_sweep([16], "tf32", "cpu", **FAST)


def test_fp32_sweep_runs_true_fp32_and_restores_the_setting(monkeypatch) -> None:
    seen, real = [], torch.matmul

    def spy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(mm.tf32_enabled())
        return real(a, b)

    monkeypatch.setattr(torch, "matmul", spy)
    with mm.tf32_matmuls(True):  # a learner who switched TF32 on globally
        mm.run_matmul_sweep([16], "fp32", "cpu", **FAST)
        assert mm.tf32_enabled() is True  # restored after the sweep
    assert seen and not any(seen)  # every timed call ran with TF32 off
    assert mm.tf32_enabled() is False


# Every way a learner may have set TF32 before a helper switches it: torch >= 2.9 has two APIs
# for the one switch and raises on reading the older one after the newer one was used.
TF32_SETTINGS = {
    "untouched": "",
    "precision high": "torch.set_float32_matmul_precision('high')",
    "precision medium": "torch.set_float32_matmul_precision('medium')",
    "precision highest": "torch.set_float32_matmul_precision('highest')",
    "allow_tf32 on": "torch.backends.cuda.matmul.allow_tf32 = True",
    "allow_tf32 off": "torch.backends.cuda.matmul.allow_tf32 = False",
    "fp32_precision tf32": "torch.backends.cuda.matmul.fp32_precision = 'tf32'",
    "fp32_precision ieee": "torch.backends.cuda.matmul.fp32_precision = 'ieee'",
    "backends fp32_precision tf32": "torch.backends.fp32_precision = 'tf32'",
    "medium, then allow_tf32 off": (
        "torch.set_float32_matmul_precision('medium'); torch.backends.cuda.matmul.allow_tf32 = False"
    ),
}
TF32_PROBE = """
import json, sys, torch
sys.path.insert(0, TESTS)
from helpers.matmul import tf32_enabled, tf32_matmuls
from tf32_state import tf32_readings as readings
SETTING
before, was = readings(), tf32_enabled()
inside = []
for enabled in (False, True):
    with tf32_matmuls(enabled):
        # cuBLAS and torch.compile read allow_tf32, which raises where the two APIs disagree
        inside.append((tf32_enabled(), torch.backends.cuda.matmul.allow_tf32))
print(json.dumps({"before": before, "after": readings(), "inside": inside, "was": was,
                  "after_enabled": tf32_enabled()}))
"""


@pytest.mark.parametrize("setting", list(TF32_SETTINGS))
def test_tf32_switch_leaves_every_setting_as_it_was(setting: str) -> None:
    if "fp32_precision" in TF32_SETTINGS[setting] and not hasattr(torch.backends, "fp32_precision"):
        pytest.skip("torch < 2.9 has no fp32_precision")
    code = TF32_PROBE.replace("SETTING", TF32_SETTINGS[setting]).replace("TESTS", repr(TESTS))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout)
    assert got["inside"] == [[False, False], [True, True]], "the block runs as asked"
    assert got["after"] == got["before"], "every reading, raising or not, is as it was"
    assert got["after_enabled"] == got["was"]
    on = setting.endswith(("high", "medium", "on", "tf32"))
    assert got["was"] is on, "tf32_enabled reads the setting whichever API set it"


def test_achievable_rate_is_the_best_of_a_short_search() -> None:
    result = mm.achievable_rate("fp32", "cpu", [(32, 32, 32), (64, 16, 64)], min_run_time=0.01)
    assert result.column("m, k, n") == [(32, 32, 32), (64, 16, 64)]
    best = result.best()
    assert best["GFLOP/s"] == max(result.column("GFLOP/s")) and result.peak is None
    with pytest.raises(ValueError, match=r"\(m, k, n\)"):
        mm.achievable_rate("fp32", "cpu", [(32, 32)])


def test_achievable_rate_shapes_grow_on_gpus() -> None:
    assert max(max(s) for s in mm.MAMF_SHAPES["cuda"]) > max(max(s) for s in mm.MAMF_SHAPES["cpu"])


@pytest.mark.skipif(not hasattr(torch.backends, "fp32_precision"), reason="torch < 2.9")
@pytest.mark.parametrize(
    "mix",
    [
        ["torch.backends.cuda.matmul.fp32_precision = 'tf32'"],  # allow_tf32 raises
        [
            "torch.set_float32_matmul_precision('medium')",
            "torch.backends.cuda.matmul.allow_tf32 = False",
        ],
    ],
    ids=["allow_tf32 raises", "float32_matmul_precision raises"],
)
def test_tf32_switch_in_a_mixed_state_in_this_process(mix: list[str]) -> None:
    """The subprocess test's mixed states, in-process, so that coverage sees the restore's branches."""
    pristine, saved = tf32_readings(), mm._tf32_settings()
    try:
        for line in mix:
            exec(line, {"torch": torch})  # noqa: S102 - the learner's own line
        before = tf32_readings()
        assert "raises" in before.values()
        with mm.tf32_matmuls(True):
            assert torch.backends.cuda.matmul.allow_tf32 is True and mm.tf32_enabled()
        assert tf32_readings() == before
    finally:  # back to the state the tests before left, for the tests that follow
        mm._restore_tf32_settings(saved)
    assert tf32_readings() == pristine


@pytest.mark.parametrize("allowed", [True, False])
def test_tf32_enabled_on_a_torch_with_one_api(monkeypatch, allowed: bool) -> None:  # noqa: ANN001
    """torch < 2.9 (2.5 is the floor) has allow_tf32 only, with no fp32_precision to read."""
    monkeypatch.setattr(torch.backends.cuda, "matmul", SimpleNamespace(allow_tf32=allowed))
    assert mm.tf32_enabled() is allowed


def test_only_a_cpu_predicts_a_big_call_from_a_small_one(fake_gpu) -> None:  # noqa: ANN001
    # The H200 run of 2026-11-28: a 256 x 256 probe read 269 us of launch and sync on a shared
    # GPU, and n = 4096 (2.7 ms) was skipped as "about 1.1 s".
    assert mm.calibrates(torch.device("cpu"))
    gpu = fake_gpu("h100_sxm")
    assert not mm.calibrates(gpu.device)
    assert not mm.calibrates(torch.device("mps"))
