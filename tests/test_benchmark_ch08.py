"""benchmarks/ch08_build_it.py runs and prints its tables and target lines (timings printed, never asserted)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch

from helpers.machine_state import GpuTenants, MachineState

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ch08_build_it.py"


def load_script() -> ModuleType:
    """The benchmark script as a module."""
    spec = importlib.util.spec_from_file_location("ch08_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_ch08_benchmark_prints_the_attention_part() -> None:
    args = [
        "--device",
        "cpu",
        "--min-run-time",
        "0.02",
        "--lengths",
        "64",
        "128",
        "--threads",
        "1",
        "--part",
        "attention",
    ]
    run = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert f"torch {torch.__version__}" in out and "chapter 8 benchmark v6" in out
    assert re.search(r"^4096\s+80\s+1\.016\s+0\.0127", out, re.M), out  # bytes are exact
    assert "CPU target: tiles at T = 4096 at most 1/8 of the written-out attention's bytes; 1.27% meets it" in out  # fmt: skip
    assert "correctness first" in out and "CHECK FAILED" not in out
    for row in ("sdpa default @ 64", "pytorch tiles @ 128", "written out @ 128"):
        assert re.search(rf"^\s*{row}\s+\d", out, re.M), row
    assert "machine:" in out
    assert "GPU target: n/a here, no compiled Triton kernel was timed at T >= 2048" in out
    # issue 31: the Triton backward checked in the interpreter, never timed there
    assert re.search(r"^float32\s+True\s+72\s+interpreter\s+d[qkv]\s+[\d.]+\s+10\s+True$", out, re.M), out  # fmt: skip
    assert re.search(r"^float16\s+False\s+72\s+interpreter\s+d[qkv]\s+[\d.]+\s+2\s+True$", out, re.M), out  # fmt: skip
    assert "cpu: no training timing: timing Triton for training needs its kernels compiled" in out
    assert "training timing: n/a here; on a CUDA GPU this part times Triton's forward+backward" in out  # fmt: skip


def test_the_parallel_part_warns_no_deprecation() -> None:
    """Issue 31: the benchmark and its ranks with FutureWarning and DeprecationWarning as errors.

    torch 2.13 deprecated the collectives' old names with a FutureWarning at every call; the
    smallest sizes on 2 gloo ranks keep the launch to about 15 s on a 2-core CPU.
    """
    errors = "error::FutureWarning,error::DeprecationWarning"
    small = ["--width", "64", "--depth", "3", "--per-rank-batch", "8", "--bucket-mb", "0.01"]
    args = ["--device", "cpu", "--part", "parallel", "--nproc", "2", *small, "--blocks", "2"]
    warn = ["-W", "error::FutureWarning", "-W", "error::DeprecationWarning"]
    env = {**os.environ, "PYTHONWARNINGS": errors}  # the launched ranks inherit it
    run = subprocess.run(
        [sys.executable, *warn, str(SCRIPT), *args, "--steps", "2"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "5. ZeRO-1" in run.stdout and "on every rank: True" in run.stdout, run.stdout[-3000:]
    assert not re.search(r"(Future|Deprecation)Warning", run.stderr), run.stderr[-3000:]


QUIET = MachineState("cuda:0", 6, 6, 16, 1.0, GpuTenants(0), 0.0, 1.0)
SHARED = MachineState("cuda:0", 6, 6, 16, 1.0, GpuTenants(2, 2**30), 0.0, 1.0)


def target_rows(machine: MachineState) -> list[dict]:
    """Timing rows at T = 2048 and 4096, each taken in the machine state given."""
    rows = [
        {"row": f"{m} @ 2048", "T": 2048, "method": m, "ms": ms, "machine": machine}
        for m, ms in (
            ("sdpa flash", 1.0),
            ("sdpa default", 1.2),
            ("pytorch tiles", 1470.0),
            ("triton", 1.5),
        )
    ]
    rows += [{"row": "triton @ 4096", "T": 4096, "method": "triton", "ms": 9.0, "machine": machine}]
    rows += [{"row": "sdpa default @ 4096", "T": 4096, "method": "sdpa default", "ms": 3.0, "machine": machine}]  # fmt: skip
    rows += [{"row": "pytorch tiles @ 4096", "T": 4096, "method": "pytorch tiles", "ms": 6.0, "machine": machine}]  # fmt: skip
    return rows


def test_gpu_target_lines(capsys) -> None:
    bench = load_script()
    bench.triton_targets(target_rows(QUIET), (1024, 2048, 4096))
    out = capsys.readouterr().out
    # Triton's time over the tiles', as every ratio of the line: "N x the time", never "N x faster"
    assert "GPU target at T = 2048: triton 1.50x the time of sdpa flash @ 2048 (MISSES: <= 1.25x), 0.00102x the time of the PyTorch tiles (meets: faster)\n" in out  # fmt: skip
    assert "GPU target at T = 4096: triton 3.00x the time of sdpa default @ 4096 (MISSES: <= 1.25x), 1.50x the time of the PyTorch tiles (MISSES: faster)\n" in out  # fmt: skip
    rows = [r for r in target_rows(QUIET) if r["row"] != "pytorch tiles @ 4096"]
    bench.triton_targets(rows, (4096,))
    assert "the PyTorch tiles were not timed (MISSES: faster)" in capsys.readouterr().out
    assert bench.than_the_tiles(0.05) == "0.0500x the time of the PyTorch tiles"
    assert bench.than_the_tiles(1 / 1020) == "0.000980x the time of the PyTorch tiles"
    assert "faster" not in bench.than_the_tiles(1 / 1234.4)


def test_gpu_target_lines_are_inconclusive_on_a_busy_machine(capsys) -> None:
    """As the verdicts: a target met or missed on a shared GPU says nothing of the kernel."""
    bench = load_script()
    bench.triton_targets(target_rows(SHARED), (2048, 4096))
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("GPU target at T")]
    assert len(lines) == 2 and not re.search("meets|MISSES", out), out
    assert all(ln.count("(inconclusive:") == 2 for ln in lines), lines
    assert all(ln.endswith(f"; the machine was busy ({SHARED.caveat()})") for ln in lines), lines


def test_a_failed_check_sets_the_exit_status(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    bench = load_script()
    monkeypatch.setattr(bench, "attention_part", lambda args: ["triton's error against float64 exceeds ..."])  # fmt: skip
    assert bench.main(["--device", "cpu"]) == 1
    assert "CHECK FAILED: triton's error against float64" in capsys.readouterr().out


def test_a_failed_method_is_named_with_the_rule_it_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The failure says what the check does: float64, the factor rule, not SDPA's rounding bound."""
    bench = load_script()
    plan = SimpleNamespace(lengths=(), device=torch.device("cpu"))
    checked = [{"method": "triton", "worst / allowed": 1.5, "note": ""}, {"method": "tiles", "worst / allowed": 0.5, "note": ""}]  # fmt: skip
    monkeypatch.setattr(bench, "sweep_plan", lambda device, lengths: plan)
    monkeypatch.setattr(bench, "check_methods", lambda plan: checked)
    monkeypatch.setattr(bench, "attention_timing_sweep", lambda plan, min_run_time: [])
    monkeypatch.setattr(bench, "triton_targets", lambda rows, lengths: None)
    assert bench.timing_part(torch.device("cpu"), None, 0.01) == [
        "triton's error against float64 exceeds the allowed factor times the written-out attention's"
    ]
    doc = " ".join(bench.__doc__.split())
    assert "is first checked against float64 at T = 200 by helpers.attention_errors' rule" in doc
    assert "SDPA at T = 256" not in doc and "sqrt(G alpha / beta) when" not in doc


def test_the_comm_model_part_judges_the_sweep_with_the_machine_state(capsys) -> None:
    """The best cap against the runner-up is a compare_rows verdict: inconclusive on a busy machine."""
    bench = load_script()
    mib = 2**20
    step = {"backward s": 0.003, "sizes": [2 * mib, 2 * mib]}
    dp = {
        "world_size": 2,
        "ways": {"flat": {"instrumented": [step]}, "ddp": {"instrumented": [step], "first step sizes": [4 * mib]}},
        "allreduce": [{"bytes": n, "step median s": 1e-4 + n * 1e-9, "step IQR s": 1e-5} for n in (4096, mib, 4 * mib)],
        "backward order bytes": [mib] * 4,
        "bucket sweep": [
            {"cap bytes": c * mib, "buckets": 4 // c, "step median s": t, "step IQR s": 1e-3, "wait median s": 1e-3}
            for c, t in ((1, 0.0153), (2, 0.01467), (4, 0.019))
        ],
    }  # fmt: skip
    bench.comm_model_part(dp, QUIET)
    out = capsys.readouterr().out
    assert "model: s* = G sqrt(alpha / B) = 0.73 MiB" in out
    assert "; against the runner-up, cap 1.00 MiB: cap 2.00 MiB vs cap 1.00 MiB: too close to call" in out  # fmt: skip
    assert re.search(r"^\s*4\s+1\s+19\s.*one bucket for all$", out, re.M), out
    bench.comm_model_part(dp, SHARED)
    assert "against the runner-up, cap 1.00 MiB: inconclusive, " in capsys.readouterr().out


def test_bad_options_are_refused() -> None:
    bench = load_script()
    for bad in (["--min-run-time", "0"], ["--threads", "0"], ["--lengths", "0"]):
        with pytest.raises(SystemExit) as exc:
            bench.parse_args(bad)
        assert exc.value.code == 2


def training_rows(machine: MachineState) -> list[dict]:
    """Training rows as helpers.attention_timing.training_timing makes them, forward and forward+backward."""
    from helpers.attention_timing import training_row_name

    rows = []
    for pass_, t, times in (("forward", 2048, (1.2, 1.0)), ("forward+backward", 2048, (3.0, 2.0)), ("forward+backward", 8192, (50.0, 20.0)), ("forward+backward", 1024, (9.0, 1.0))):  # fmt: skip
        for method, ms in zip(("triton", "sdpa flash"), times):
            rows.append({"row": training_row_name(method, pass_, torch.bfloat16, 64, t), "method": method, "pass": pass_, "dtype": "bfloat16", "head_dim": 64, "T": t, "ms": ms, "IQR ms": 0.01, "TFLOP/s": 1.0, "machine": machine, "note": ""})  # fmt: skip
    return rows


def test_training_target_lines(capsys) -> None:
    """Issue 31: forward within 1.25x, forward+backward within 2x of SDPA's fastest, at T >= 2048."""
    bench = load_script()
    bench.training_targets(training_rows(QUIET))
    out = capsys.readouterr().out
    assert "GPU target at T = 2048, forward (head_dim 64, bfloat16): triton 1.20x the time of sdpa flash forward d=64 bfloat16 @ 2048 (meets: <= 1.25x)\n" in out  # fmt: skip
    assert "GPU target at T = 2048, forward+backward (head_dim 64, bfloat16): triton 1.50x the time of sdpa flash forward+backward d=64 bfloat16 @ 2048 (meets: <= 2x)\n" in out  # fmt: skip
    assert "GPU target at T = 8192, forward+backward (head_dim 64, bfloat16): triton 2.50x the time of sdpa flash forward+backward d=64 bfloat16 @ 8192 (MISSES: <= 2x)\n" in out  # fmt: skip
    assert "T = 1024" not in out
    bench.training_targets(training_rows(SHARED))
    out = capsys.readouterr().out
    assert out.count("(inconclusive: <= ") == 3 and not re.search("meets|MISSES", out), out
    bench.training_targets([])
    assert "GPU target, training: n/a here" in capsys.readouterr().out


def test_training_part_on_a_fake_gpu(monkeypatch: pytest.MonkeyPatch, fake_gpu, capsys) -> None:
    """The GPU branch: the compiled check's table, the plan, the table of Triton and SDPA's fastest, verdicts, targets."""
    import helpers.attention_timing as tm
    from helpers.attention_triton import TritonStatus

    bench = load_script()
    monkeypatch.setattr(tm, "triton_status", lambda device: TritonStatus(True, "compiled", "fake"))
    gpu = fake_gpu("h100_sxm")
    check = [{"dtype": "bfloat16", "causal": True, "T": 72, "run": "compiled", "worst": "dq", "x PyTorch's error": 0.5, "allowed": 2.0, "passes": True}]  # fmt: skip
    monkeypatch.setattr(bench, "backward_check", lambda device: check)
    planned = []

    def timing(plan, min_run_time):
        planned.append(plan)
        return [r for r in training_rows(QUIET) if r["pass"] == "forward+backward" and r["T"] > 1024]  # fmt: skip

    monkeypatch.setattr(bench, "training_timing", timing)
    assert bench.training_part(gpu.device, [512], 0.01, full=False) == []
    out = capsys.readouterr().out
    assert planned[0].shapes == [(torch.bfloat16, 64, 2048), (torch.bfloat16, 64, 8192)]
    assert "batch 4 x 16 heads, causal, 2 shapes (head_dim 64; T = 2048, 8192; bfloat16); passes: forward+backward" in out  # fmt: skip
    assert re.search(r"^bfloat16\s+True\s+72\s+compiled\s+dq", out, re.M), out
    assert re.search(r"^\s*triton forward\+backward d=64 bfloat16 @ 8192\s+50", out, re.M), out
    assert re.search(r"^\s*sdpa flash forward\+backward d=64 bfloat16 @ 8192\s+20\s.*fastest SDPA kernel", out, re.M), out  # fmt: skip
    assert "machine: quiet" in out and out.count("GPU target at T = ") == 2
    monkeypatch.setattr(bench, "backward_check", lambda device: [{**check[0], "passes": False}])
    assert bench.training_part(gpu.device, None, 0.01, full=True) == ["the Triton backward (bfloat16, causal=True) misses the float64 rule"]  # fmt: skip
    assert len(planned[-1].shapes) == 40


def test_training_table_flag() -> None:
    bench = load_script()
    assert bench.parse_args(["--training-table"]).training_table
    assert not bench.parse_args([]).training_table
