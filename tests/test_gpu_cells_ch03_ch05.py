"""The GPU-only branches of chapters 3 and 5 (and the chapter 5 benchmark), run on a fake GPU.

A fake GPU runs no kernel, so each test runs the branch's own code with the one line that
would touch the device (torch.randn / torch.empty on "cuda") made on the CPU instead: everything
else (the CUDA-events timing, NVML's process list, the table, the machine line, the verdict)
runs as it would on the GPU. Each verdict is checked against the table printed above it
(issue 24, item 2: the ratio a verdict prints is the ratio of the rows it names)."""

from __future__ import annotations

import importlib.util
import re
import sys
from decimal import Decimal
from typing import Any

import pytest
import torch

from helpers.amp_sweep import AmpSweep
from helpers.machine_state import GpuTenants, MachineState
from helpers.sweeps import SweepResult
from helpers.tables import print_table
from helpers.units import MiB
from tools.nbfiles import ROOT, read


def cell(notebook: str, marker: str) -> str:
    """The one code cell of `notebook` that contains `marker`."""
    found = [
        c.source
        for c in read(ROOT / "notebooks" / notebook).cells
        if c.cell_type == "code" and marker in c.source
    ]
    assert len(found) == 1, f"{notebook}: {len(found)} code cells contain {marker!r}"
    return found[0]


def on_the_cpu(monkeypatch: pytest.MonkeyPatch, factory: str, size: int | None = None) -> None:
    """torch.<factory>(..., device="cuda") makes its tensor on the CPU (of `size` x `size` if given)."""
    real = getattr(torch, factory)

    def make(*shape: Any, device: Any = None, **kw: Any) -> torch.Tensor:
        return real(*((size, size) if size else shape), **kw)

    monkeypatch.setattr(torch, factory, make)


def half_unit(shown: str) -> float:
    """Half a unit of the last digit a number is printed with (0.01779, 8.968e-05): its rounding."""
    return 0.5 * 10.0 ** Decimal(shown).as_tuple().exponent


def numbers(text: str) -> list[float]:
    """The 'N.NNx' ratios a line prints."""
    return [float(n) for n in re.findall(r"(\d+\.\d+)x", text)]


# ------------------------------------------------------ chapter 3, section 1: TF32's speed


def test_ch03_tf32_cell_on_an_h100_prints_its_tables_ratio(fake_gpu, monkeypatch, capsys) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm")
    gpu.nvml.processes = {0: [(4242, 20 * 2**30)]}  # another notebook on the GPU, as on 2026-11-26
    on_the_cpu(monkeypatch, "randn", size=96)
    exec(cell("03_mixed_precision.ipynb", "time_tf32("), {"torch": torch, "device": gpu.device})
    out = capsys.readouterr().out
    table, quote = out.split("Hugging Face quotes")
    tf32_row = next(line for line in table.splitlines() if line.strip().startswith("TF32"))
    shown = tf32_row.split()[-1]  # the 'vs fp32' column
    assert quote.strip().endswith(f"measured here: {shown}")
    assert "GPU shared with 1 other compute process(es), holding 20.00 GiB" in table
    verdict = table.strip().splitlines()[-1]
    assert verdict.startswith("inconclusive, GPU shared") and "TF32" in verdict
    fp32_ms, tf32_ms = (r.split()[-4] for r in table.splitlines()[2:4])
    ratio = float(fp32_ms) / float(tf32_ms)
    expected = max(ratio, 1 / ratio)  # the row ahead is named first
    # the table rounds each time to its printed digits and the verdict its ratio: the ratio of
    # the printed times is off by up to the sum of their relative roundings (a loaded machine
    # once timed one row 1228x the other: 4 digits each, off by 0.27 there)
    shown = re.search(r"(\d+\.\d+)x", verdict).group(1)
    slack = expected * sum(half_unit(t) / float(t) for t in (fp32_ms, tf32_ms)) + half_unit(shown)
    assert numbers(verdict)[0] == pytest.approx(expected, abs=slack * 1.001)


@pytest.mark.parametrize(
    ("kind", "why"),
    [("t4", "it needs an NVIDIA GPU of compute capability 8.0+"), ("mps", "it needs")],
)
def test_ch03_tf32_cell_says_why_there_is_none(fake_gpu, capsys, kind: str, why: str) -> None:  # noqa: ANN001
    gpu = fake_gpu(kind)
    exec(cell("03_mixed_precision.ipynb", "time_tf32("), {"torch": torch, "device": gpu.device})
    out = capsys.readouterr().out
    assert f"TF32 does not exist on {gpu.device} ({why}" in out and "does not apply here" in out


# ----------------------------------------- chapter 3, section 7: the verdicts under the sweep


def h100_sweep(machine: MachineState) -> AmpSweep:
    """The H100 run's sweep (chapter 3, 2026-11-26) at two batch sizes, as run_amp_sweep builds it."""
    sweep = AmpSweep("cuda:0", (4096,) * 5 + (1,), "meter")
    h100 = {"fp32": (4.296, 62.31), "tf32": (2.896, 12.97), "bf16": (2.924, 6.844)}
    saved = {"fp32": (20.0, 640.1), "tf32": (20.0, 640.1), "bf16": (106.0, 416.1)}
    peak = {"fp32": (512.2, 836.1), "tf32": (512.2, 836.1), "bf16": (512.2, 644.1)}
    for precision, times in h100.items():
        result = sweep.results.setdefault(precision, SweepResult("batch size"))
        for i, (batch, ms) in enumerate(zip((256, 8192), times)):
            row = {"ms/step": ms, "IQR ms": 0.01 * ms, "samples/s": batch / ms * 1e3}
            mib = {"peak MiB": peak[precision][i], "saved MiB": saved[precision][i]}
            result.rows.append({"batch size": batch, **row, **mib})
            sweep.states[(precision, batch)] = machine
    return sweep


@pytest.mark.parametrize("shared", [False, True])
def test_ch03_sweep_verdicts_with_tf32_rows(capsys, shared: bool) -> None:
    """The TF32 lines run only on NVIDIA 8.0+: here they run on the H100 run's rows."""
    tenants = GpuTenants(2, 28 * 2**30) if shared else GpuTenants(0)
    sweep = h100_sweep(MachineState("cuda:0", 6, 6, 16, 1.0, tenants, 0.0, 1.0))
    namespace = {
        "sweep": sweep,
        "low_name": "bf16",
        "device": torch.device("cuda:0"),
        "describe_device": lambda d: type("Info", (), {"name": "NVIDIA H100 80GB HBM3"})(),
        "sweep_batches": (256, 8192),
    }
    exec(cell("03_mixed_precision.ipynb", "sweep.verdict(low_name, 'fp32', largest)"), namespace)
    exec(cell("03_mixed_precision.ipynb", "grew with the activations"), namespace)
    exec(cell("03_mixed_precision.ipynb", "same fp32 tensors"), namespace)
    out = capsys.readouterr().out
    rows = {r["precision"]: r for r in sweep.rows() if r["batch size"] == 8192}
    lines = {line.split(":")[0].strip(): line for line in out.splitlines()}
    assert numbers(lines["bf16 autocast against fp32"]) == [float(rows["bf16"]["vs fp32"][:-1])]
    assert numbers(lines["TF32 against fp32"]) == [float(rows["tf32"]["vs fp32"][:-1])]
    assert numbers(lines["bf16 against TF32"]) == [pytest.approx(12.97 / 6.844, abs=0.006)]
    assert "the peak grew with the activations" in out
    assert all(("inconclusive, GPU shared" in lines[k]) is shared for k in ("TF32 against fp32",))


# ------------------------------- chapter 5: the price of empty_cache, in the notebook and bench


def test_ch05_allocation_cell_on_an_h100(fake_gpu, monkeypatch, capsys) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm")
    on_the_cpu(monkeypatch, "empty")
    source = cell("05_memory.ipynb", "alloc_after_empty_cache")
    exec(
        source,
        {
            "torch": torch,
            "device": gpu.device,
            "CUDA": True,
            "MiB": MiB,
            "print_table": print_table,
        },
    )
    out = capsys.readouterr().out.strip().splitlines()
    header, _, cached, uncached, machine, verdict = out
    assert header.split() == ["64", "MiB", "allocation", "median", "µs", "IQR", "µs"]
    assert machine.startswith("machine: ") and "no other process on this GPU" in machine
    cached_us, uncached_us = cached.split()[-2], uncached.split()[-2]
    ratio = float(uncached_us) / float(cached_us)  # how many times faster the cached allocation was
    expected = max(ratio, 1 / ratio)  # the row ahead is named first
    shown = re.search(r"(\d+\.\d+)x", verdict).group(1)  # as the TF32 test: printed roundings
    slack = expected * sum(half_unit(t) / float(t) for t in (cached_us, uncached_us)) + half_unit(
        shown
    )
    assert numbers(verdict)[0] == pytest.approx(expected, abs=slack * 1.001)
    assert gpu.synchronize_calls > 0  # the CUDA-events path timed it


def load_bench_ch05():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("bench_ch05", ROOT / "benchmarks/ch05_memory.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_ch05"] = module
    spec.loader.exec_module(module)
    return module


def test_ch05_benchmark_allocation_on_an_h100(fake_gpu, monkeypatch, capsys) -> None:  # noqa: ANN001
    bench = load_bench_ch05()
    gpu = fake_gpu("h100_sxm")
    gpu.nvml.processes = {0: [(4242, 2**30)]}
    on_the_cpu(monkeypatch, "empty")
    bench.allocation(gpu.device)
    out = capsys.readouterr().out
    assert "64 MiB allocation:" in out and "from_cache" in out and "after_empty_cache" in out
    assert "machine: BUSY" in out and "GPU shared with 1 other compute process(es)" in out
    assert out.strip().splitlines()[-1].strip().startswith("inconclusive, GPU shared")


def test_ch05_benchmark_runs_on_a_cpu(capsys) -> None:
    """The whole CPU path, tiny: every variant, the FLOPs, the verdicts and the AMP table."""
    bench = load_bench_ch05()
    model = bench.make_mlp(bench.wide_mlp_sizes(32, 4, 10), blocks=True)
    x, y = torch.randn(8, 32), torch.randint(0, 10, (8,))
    bench.checkpointing(model, x, y, 0.02)
    bench.precision(model, x, y, 0.02)
    out = capsys.readouterr().out
    for name in bench.CHECKPOINTING:
        assert name in out
    assert "each block: saved nothing" in out and "checkpoint_sequential(2): saved " in out
    extra = {m[0]: int(m[1]) for m in re.findall(r"  (.+?): saved .*?, \+(\d+)% FLOPs", out)}
    assert extra["each block"] == extra["pairs of blocks"] > extra["checkpoint_sequential(2)"] > 0
    assert "bf16 autocast" in out and out.count("machine: ") == 2


@pytest.mark.parametrize("depth", [4, 6])
def test_ch05_benchmarks_checkpoint_sequential_row_is_torchs(depth: int) -> None:
    """The row named checkpoint_sequential(2) runs torch's function, at any depth (not only 4)."""
    bench = load_bench_ch05()
    model = bench.make_mlp(bench.wide_mlp_sizes(32, depth, 10), blocks=True)
    x = torch.randn(8, 32)
    blocks, head = model[:-1], model[-1]
    with bench.ActivationMeter(model) as meter:
        head(torch.utils.checkpoint.checkpoint_sequential(blocks, 2, x, use_reentrant=False))
    assert bench.saved_bytes(model, x, "checkpoint_sequential(2)") == meter.total_bytes
    torch.testing.assert_close(
        bench.forward(model, x, *bench.CHECKPOINTING["checkpoint_sequential(2)"]), model(x)
    )
