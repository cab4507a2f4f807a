"""benchmarks/ch06_mfu.py: chapter 6's MFU step alone, its FLOP count and its target line."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from helpers.machine_state import GpuTenants, MachineState

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ch06_mfu.py"
spec = importlib.util.spec_from_file_location("ch06_mfu_benchmark", SCRIPT)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

H100_BF16 = "datasheet dense bf16 peak of NVIDIA H100 80GB HBM3"


def state(busy: bool = False, shared: bool = False) -> MachineState:
    """A machine state: quiet, a loaded CPU, or a GPU shared with another process."""
    tenants = GpuTenants(1, 2**30) if shared else GpuTenants(0, 0)
    return MachineState("cuda:0", 16, 16, 16, 40.0 if busy else 0.5, tenants)


def test_the_target_line_meets_misses_and_is_inconclusive_on_a_busy_machine() -> None:
    name = "NVIDIA H100 80GB HBM3"
    assert bench.target_line(0.64, H100_BF16, name, state()).endswith("64.0% against at least 60% of the bf16 datasheet peak: meets it")  # fmt: skip
    assert bench.target_line(0.41, H100_BF16, name, state()).endswith(": MISSES it")
    for busy in (state(busy=True), state(shared=True)):
        line = bench.target_line(0.64, H100_BF16, name, busy)
        assert "inconclusive, the machine was busy" in line and "meets" not in line
    assert "n/a here" in bench.target_line(0.9, H100_BF16, "NVIDIA A100-SXM4-80GB", state())
    assert "n/a" in bench.target_line(0.5, "best bf16 matmul measured here", name, state())
    assert "meets" in bench.target_line(0.7, H100_BF16.replace("H100 80GB HBM3", "H200"), "NVIDIA H200", state())  # fmt: skip


def test_the_flop_count_by_hand_is_the_counters() -> None:
    import torch

    step = bench.make_step(64, 8, torch.device("cpu"), torch.float32)
    assert bench.count_flops(step) == bench.flops_by_hand(64, 8)
    assert bench.flops_by_hand(64, 8) == 11 * 2 * 8 * 64**2, "4 forward, 4 weight, 3 input grads"


def test_a_cpu_run_prints_the_step_its_mfu_and_the_target_line(
    capsys: pytest.CaptureFixture,
) -> None:
    assert bench.main(["--device", "cpu", "--width", "256", "--batch", "32", "--min-run-time", "0.05"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.startswith(f"chapter 6 MFU benchmark v{bench.VERSION}")
    assert re.search(r"step: 4 x 256 MLP, batch 32, matmuls in torch.float32; .* \(equal\)", out)
    assert "MFU " in out and "machine: " in out
    assert "H100 target (MFU >= 60% of the bf16 datasheet peak): n/a here (cpu)" in out


def test_bad_sizes_get_a_clear_message(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(["--device", "cpu", "--width", "0"])
    assert exc.value.code == 2
    assert "--width and --batch must be >= 1" in capsys.readouterr().err
