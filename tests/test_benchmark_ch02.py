"""benchmarks/ch02_training_loop.py runs and prints its tables (timings are printed, never asserted)."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from graph_standin import allow_capturable_on_cpu, eager_steps

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ch02_training_loop.py"


def test_ch02_benchmark_prints_the_table() -> None:
    args = ["--device", "cpu", "--rounds", "1", "--min-run-time", "0.05", "--seeds", "5,2"]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "chapter 2 benchmark v5" in out and "flat parameters + FlatAdam" in out
    assert "same math, 2 epochs x 157 steps per seed" in out
    table = out.split("same math, ")[1].split("timed with")[0].split("----")[-1]
    seed_rows = [line.split() for line in table.splitlines()[1:] if line.strip()]
    assert [r[0] for r in seed_rows] == ["5", "2"] and all(r[-1] == "yes" for r in seed_rows)
    assert "timed with permutation seed 5:" in out
    timing = out.split("timed with permutation seed 5:")[1].split("\nmachine: ")[0]
    header, _, *lines = timing.strip().splitlines()
    assert header.endswith("syncs/epoch  final is x faster (median)  (best rounds)"), header
    syncs = {line.split("  ")[0].strip(): int(line.split()[-3]) for line in lines}
    assert all(v == 157 for k, v in syncs.items() if k.startswith("sources'")), syncs
    assert all(v == 1 for k, v in syncs.items() if not k.startswith("sources'")), syncs
    for row in ("sources' loop (", "resident loop, torch.optim.Adam", "final loop"):
        assert row in out
    assert "\nmachine: " in out, "the machine's state next to the timing table"
    assert "speed-up vs the sources' loop as written (median):" in out
    assert "reference dispatch floor 300 µs on the course's 2-core CI CPU" in out
    assert "CUDA graphs: CUDA graphs need a CUDA or ROCm GPU and this is cpu" in out
    assert "SAME MATH FAILED" not in out


def _load_script():  # noqa: ANN202 - the benchmark script as a module
    spec = importlib.util.spec_from_file_location("ch02_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_checks_the_notebooks_seed_first_and_all_of_0_to_7() -> None:
    bench = _load_script()
    assert bench.PERM_SEEDS[0] == 5, "chapter 2's section 6 uses permutation seed 5"
    assert sorted(bench.PERM_SEEDS) == list(range(8))
    assert bench.parse_seeds("5, 0,1") == (5, 0, 1)
    for bad in ("", "a", "-1", "5,x"):
        with pytest.raises(argparse.ArgumentTypeError, match="--seeds"):
            bench.parse_seeds(bad)


def test_capture_failure_falls_back_with_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture that raises on a GPU gives (None, the error): the script then times the eager loop."""
    bench = _load_script()

    def fail(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(bench, "capture_steps", fail)
    x, y = bench.make_classification_data(100, 20, seed=0)
    init = bench.make_mlp().state_dict()
    graphed, why = bench.build_graphed(torch.device("cpu"), x, y, init, 5)
    assert graphed is None
    assert why.startswith("CUDA graph capture failed (RuntimeError: operation not permitted")


def test_capture_success_gives_steps_batches_and_model(monkeypatch: pytest.MonkeyPatch) -> None:
    bench = _load_script()
    seen = {}

    def fake_capture(model, opt, loss_fn, x, y, sizes):  # noqa: ANN001, ANN202
        seen["sizes"], seen["capturable"] = list(sizes), opt.param_groups[0]["capturable"]
        seen["model"] = model
        return {"steps": True}

    monkeypatch.setattr(bench, "capture_steps", fake_capture)
    x, y = bench.make_classification_data(10_000, 20, seed=0)
    graphed, why = bench.build_graphed(
        torch.device("cpu"), x, y, bench.make_mlp(sigmoid=True).state_dict(), 5
    )
    assert why == "" and graphed[0] == {"steps": True} and graphed[2] is seen["model"]
    assert seen["sizes"] == [64, 16] and seen["capturable"]
    assert graphed[1].batch_size == 64 and len(graphed[1]) == 157
    want = bench.ResidentBatches(
        x, y, batch_size=64, generator=torch.Generator().manual_seed(5)
    ).permutation()
    assert torch.equal(graphed[1].permutation(), want), "the seed's permutation"


@pytest.mark.parametrize("seed", [5, 2])
def test_the_cuda_graph_branch_of_the_check_on_a_cpu(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """check_seed's graph path with the capture replaced by eager replays and capturable Adam forced on."""
    bench = _load_script()
    allow_capturable_on_cpu(monkeypatch)
    monkeypatch.setattr(bench, "capture_steps", eager_steps)
    with bench.torch_threads(1):
        row, ok, syncs = bench.check_seed(torch.device("cpu"), seed, graphed=True)
    assert ok, row
    assert row["seed"] == seed and row["same math"] == "yes"
    assert row["capturable Adam's effect"] > 1e-5, "seeds 2 and 5 drift beyond rounding"
    assert row["loss gap, effect removed"] < 1e-6
    assert syncs == {"sources": 157, "final": 1}


def test_the_eager_check_fails_loudly_when_the_math_differs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A final loop with other math (lr 2e-3) is refused, with the check's numbers in the row."""
    bench = _load_script()
    flat_adam = bench.FlatAdam
    monkeypatch.setattr(bench, "FlatAdam", lambda flat, lr: flat_adam(flat, lr=2 * lr))
    with bench.torch_threads(1):
        row, ok, _ = bench.check_seed(torch.device("cpu"), 5, graphed=False)
    assert not ok and row["same math"].startswith("NO: losses: 314 values")


@pytest.mark.parametrize("graphed", [False, True])
def test_floor_line(graphed: bool) -> None:
    bench = _load_script()
    line = bench.floor_line(117.8, 1205.0, graphed)
    assert ("reference dispatch floor" in line) is not graphed, "the CI CPU's 300 µs: CPU only"
    if graphed:
        assert line == (
            "final loop step: 118 µs (median), 0.10x the eager per-step floor measured here "
            "(1205 µs, the fastest eager FlatAdam step at batch 8-32): the CUDA graphs replay the "
            "step without the per-kernel launches that the eager floor is made of"
        )
    else:
        assert "floor measured here (fastest step at batch 8-32): 1205 µs" in line
        assert "-1087 µs (0.10x) from it" in line


def test_every_timed_loop_has_its_own_sync_count() -> None:
    """The syncs/epoch column is counted for each timed loop, never copied from the final loop.

    Version 4 printed the final loop's count for the two eager resident loops as well, which
    were never counted (on CUDA the final loop is the graph loop).
    """
    bench = _load_script()
    device = torch.device("cpu")
    _, _, src, final, with_torch_adam, _ = bench.build(device, 5)
    bce = torch.nn.BCEWithLogitsLoss()

    def reads_three_times(t: torch.Tensor) -> None:
        for _ in range(3):
            t.sum().item()

    loops = {
        "sources": (None, bench.sources_epoch, src),
        "resident, torch.optim.Adam": (1, bench.fast_epoch, (*with_torch_adam, bce)),
        "resident, FlatAdam": (1, bench.fast_epoch, (*final, bce)),
        "three reads": (None, reads_three_times, (torch.ones(3),)),
    }
    assert bench.count_syncs(loops, device) == {
        "sources": 157,
        "resident, torch.optim.Adam": 1,
        "resident, FlatAdam": 1,
        "three reads": 3,
    }
