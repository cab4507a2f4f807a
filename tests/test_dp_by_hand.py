"""Chapter 8, data parallelism by hand: the overlap arithmetic, buckets, shards, labelled ranges
(helpers.comm_overlap), the notebook's tables and plot (helpers.dp_by_hand), the benchmark's
verdicts, and the three scripts run for real under torchrun with 1, 2 and 3 gloo ranks, a
FutureWarning or DeprecationWarning an error on every rank (issue 31: torch 2.13's renamed
collectives).

Each world size is one launch of one_launch.py with all three scripts, as the chapter runs them
(about 10-20 s each on a 2-core machine): loopback only, a process-group timeout so a dead rank
fails fast, every process gone and nothing left in the temporary folder afterwards.
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from helpers import comm_overlap as co
from helpers import dp_by_hand as dbh
from helpers.launch import launch, one_launch_args, read_results, script_source
from helpers.machine_state import machine_state
from helpers.scripts import one_launch
from helpers.scripts.common import READY_MARKER

ROOT = Path(__file__).resolve().parent.parent

# --- spans ------------------------------------------------------------------------------------


def test_spans_merge_and_measure() -> None:
    assert co.merge_spans([(3, 4), (0, 1), (0.5, 2)]) == [(0.0, 2.0), (3.0, 4.0)]
    assert co.total_length([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)
    assert co.overlap_length([(0, 2), (3, 5)], [(1, 4)]) == pytest.approx(2.0)
    assert co.overlap_length([], [(0, 1)]) == 0.0
    with pytest.raises(ValueError, match="ends before it starts"):
        co.merge_spans([(2, 1)])


def test_hidden_communication_splits_in_flight_time() -> None:
    got = co.hidden_communication([(0.5, 1.5), (1.4, 2.0)], [(0.0, 1.0)])
    assert got["in flight s"] == pytest.approx(1.5) and got["hidden s"] == pytest.approx(0.5)
    assert got["exposed s"] == pytest.approx(1.0) and got["hidden share"] == pytest.approx(1 / 3)
    assert co.hidden_communication([], [(0, 1)])["hidden share"] == 0.0


def fake_event(name: str, device: DeviceType, start_us: float, end_us: float) -> SimpleNamespace:
    """What torch.profiler's events carry that kernel_spans reads."""
    return SimpleNamespace(
        name=name, device_type=device, time_range=SimpleNamespace(start=start_us, end=end_us)
    )


def test_kernel_spans_split_nccl_from_compute_and_skip_the_cpu() -> None:
    events = [
        fake_event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", DeviceType.CUDA, 10, 30),
        fake_event("ampere_sgemm_128x64_tn", DeviceType.CUDA, 0, 20),
        fake_event("aten::mm", DeviceType.CPU, 0, 50),
    ]
    comm, compute = co.kernel_spans(events)
    assert comm == [(10e-6, 30e-6)] and compute == [(0.0, 20e-6)]
    assert co.hidden_communication(comm, compute)["hidden s"] == pytest.approx(10e-6)


def test_trace_spans_read_complete_events_by_name_prefix() -> None:
    trace = {
        "traceEvents": [
            {"ph": "X", "name": "backward", "ts": 100.0, "dur": 50.0},
            {"ph": "X", "name": "gloo:all_reduce", "ts": 120.0, "dur": 60.0},
            {"ph": "i", "name": "backward", "ts": 10.0},
            {"ph": "X", "name": "forward"},  # no duration: skipped
        ]
    }
    spans = co.trace_spans(trace, ("backward", "gloo:all_reduce", "forward"))
    assert spans["backward"] == [pytest.approx((100e-6, 150e-6))] and spans["forward"] == []
    assert spans["gloo:all_reduce"] == [pytest.approx((120e-6, 180e-6))]


# --- buckets and shards ----------------------------------------------------------------------


def test_buckets_close_once_they_reach_the_cap_like_ddp() -> None:
    assert co.plan_buckets([4, 4, 4, 4, 4], 8) == [[0, 1], [2, 3], [4]]
    assert co.plan_buckets([20, 1, 1], 8) == [[0], [1, 2]]  # a big tensor gets a bucket alone
    assert co.plan_buckets([], 8) == []
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="cap_bytes"):
            co.plan_buckets([1], bad)
    with pytest.raises(ValueError, match="byte counts"):
        co.plan_buckets([1, -2], 8)


@pytest.mark.parametrize(("numel", "world"), [(353, 1), (353, 2), (353, 3), (6402, 3), (2, 3)])
def test_shards_cover_the_padded_vector_in_equal_pieces(numel: int, world: int) -> None:
    pieces = [co.shard_bounds(numel, world, r) for r in range(world)]
    size = pieces[0][2]
    assert all(stop - start == size for start, stop, _ in pieces)
    assert pieces[0][0] == 0 and pieces[-1][1] == world * size
    assert 0 <= world * size - numel < world  # padding: less than one element per rank


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((10, 0, 0), "world"),
        ((10, 2, 2), "does not exist"),
        ((-1, 1, 0), "numel"),
        ((1.0, 1, 0), "numel"),
    ],
)
def test_shard_bounds_refuse_bad_input(args: tuple, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        co.shard_bounds(*args)


# --- labelled ranges: the profiler on every device, NVTX on CUDA -----------------------------


def test_labelled_ranges_reach_the_profiler_on_cpu() -> None:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with co.labelled("backward", "cpu"):
            torch.ones(4).sum()
    assert "backward" in {e.name for e in prof.events()}


def test_labelled_ranges_push_and_pop_nvtx_on_cuda(fake_gpu, monkeypatch) -> None:  # noqa: ANN001
    fake_gpu("h100_sxm")
    seen = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: seen.append(("push", name)))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: seen.append(("pop",)))
    with pytest.raises(RuntimeError, match="inside"), co.labelled("forward", "cuda"):
        raise RuntimeError("inside")  # the range is closed even when the body fails
    assert seen == [("push", "forward"), ("pop",)]


def test_nsys_command_records_cuda_and_nvtx_of_a_torchrun_job() -> None:
    cmd = co.nsys_command("helpers/scripts/dp_by_hand.py", 2, ["--out", "/tmp/x y"])
    assert cmd.startswith("nsys profile -t cuda,nvtx,osrt -o ch08_overlap")
    assert "torchrun --standalone --nproc-per-node=2 helpers/scripts/dp_by_hand.py" in cmd
    assert cmd.endswith("--out '/tmp/x y'")


# --- the notebook's tables, plot and trace reading -------------------------------------------


def synthetic_result(world: int = 2, device: str = "cpu") -> dict:
    """A dp_by_hand result of rank 0, small enough to reason about."""
    step = {
        "comm": [(0.002, 0.004)],
        "compute": [(0.001, 0.003)],
        "in flight s": 0.002,
        "exposed s": 0.001,
        "hidden share": 0.5,
    }
    way = {
        "max |grad - DDP|": 0.0,
        "within the bound": True,
        "same on every rank": True,
        "step median s": 0.01,
        "step IQR s": 0.001,
        "calls per step": 2,
        "bytes per step": 12,
        "instrumented": [step],
    }
    ways = {w: dict(way) for w in dbh.WAY_NAMES}
    ways["flat"] = {**way, "max |grad - DDP|": 1e-3, "within the bound": False}
    return {"world_size": world, "device": device, "ways": ways}


def test_allreduce_rounding_bound_follows_the_world_size() -> None:
    eps = torch.finfo(torch.float32).eps
    (b,) = co.allreduce_rounding_bound([torch.tensor([3.0])], 3)
    assert b.item() == pytest.approx(4 * eps * 3.0 / 3)


def test_gradient_rows_flag_a_way_beyond_rounding() -> None:
    rows = {r["way"]: r for r in dbh.gradient_rows(synthetic_result())}
    assert rows["DDP"]["max |grad - DDP|"] == 0.0 and rows["DDP"]["within the bound"]
    assert not rows["(b) one flat all-reduce"]["within the bound"]


def test_timing_rows_and_their_verdicts() -> None:
    rows = dbh.timing_rows(synthetic_result())
    assert [r["way"] for r in rows] == list(dbh.WAY_NAMES.values())
    assert rows[0]["step ms"] == pytest.approx(10.0) and rows[0]["hidden %"] == pytest.approx(50.0)
    bench = load_benchmark()
    state = machine_state("cpu")
    lines = bench.target_lines(rows, state, 2, "gloo")
    assert lines[0].startswith("bucketed overlapped / DDP step time: 1.00x")
    assert ("met)" if state.quiet else "not judged") in lines[0]
    assert "too close to call" in lines[1] or "inconclusive" in lines[1]
    assert "hidden communication, (c) overlapped hooks: 50%" in lines[3]


def test_plot_overlap_draws_one_row_per_way() -> None:
    fig = dbh.plot_overlap(synthetic_result(3, "cuda"), ("ddp", "bucketed"))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["(d) buckets, overlapped", "DDP"]
    assert "3 rank(s) on cuda" in ax.get_title()


def test_trace_overlap_reads_a_cpu_trace_and_a_gpu_trace(tmp_path: Path) -> None:
    cpu = {
        "traceEvents": [
            {"ph": "X", "name": n, "ts": ts, "dur": d}
            for n, ts, d in [("step", 0, 100), ("backward", 10, 50), ("gloo:all_reduce", 40, 40)]
        ]
    }
    (tmp_path / "cpu.json").write_text(json.dumps(cpu))
    got = dbh.trace_overlap(tmp_path / "cpu.json")
    assert got["ranges"]["step"] == 1 and got["all-reduce spans"] == 1
    assert got["hidden share"] == pytest.approx(0.5)
    gpu = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce", "ts": 0, "dur": 10},
            {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm", "ts": 5, "dur": 20},
            {"ph": "X", "cat": "cpu_op", "name": "backward", "ts": 0, "dur": 1},
        ]
    }
    (tmp_path / "gpu.json").write_text(json.dumps(gpu))
    assert dbh.trace_overlap(tmp_path / "gpu.json")["hidden share"] == pytest.approx(0.5)


def load_benchmark():  # noqa: ANN201 - a module
    """benchmarks/ch08_build_it.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "ch08_build_it", ROOT / "benchmarks" / "ch08_build_it.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_zero1_rows_say_whether_the_state_is_exactly_one_over_world() -> None:
    res = {
        "world_size": 2,
        "parameters": 6,
        "full Adam bytes": {"moments": 48},
        "ZeRO-1 bytes": {"moments": 24},
        "max param diff per step": [0.0],
    }
    rows = load_benchmark().zero1_rows([res, {**res, "ZeRO-1 bytes": {"moments": 28}}])
    assert rows[0]["exactly 1/world"] and not rows[1]["exactly 1/world"]


def test_the_benchmark_picks_nccl_on_gpus(fake_gpu, monkeypatch, capsys) -> None:  # noqa: ANN001
    fake_gpu("h100_sxm", count=2)
    bench = load_benchmark()
    seen = {}

    def fake_launch(args, backend, nproc):  # noqa: ANN001, ANN202
        seen.update(backend=backend, nproc=nproc)
        raise SystemExit("stop before launching")

    monkeypatch.setattr(bench, "launch_parts", fake_launch)
    p = __import__("argparse").ArgumentParser()
    bench.add_parallel_options(p)
    with pytest.raises(SystemExit, match="stop"):
        bench.parallel_part(p.parse_args([]))
    assert seen == {"backend": "nccl", "nproc": 2}
    assert "2 rank(s) on nccl" in capsys.readouterr().out


# --- the scripts, for real ---------------------------------------------------------------------


def test_the_scripts_share_a_launch_and_show_their_technique() -> None:
    assert {"dp_by_hand", "zero1_by_hand", "fsdp_by_hand"} <= set(one_launch.JOINABLE)
    assert "register_post_accumulate_grad_hook" in script_source("dp_by_hand", "Overlapped")
    assert "all_gather" in script_source("zero1_by_hand", "Zero1Adam")
    assert "reduce_scatter_single" in script_source("fsdp_by_hand", "ShardedLinear")


def rendezvous_folder(command: list[str]) -> Path:
    """The temporary folder a launch's ranks met in, read from its torchrun command."""
    endpoint = next(w for w in command if w.startswith("--rdzv-endpoint="))
    return Path(endpoint.split("=", 1)[1]).parent


#: The ranks' warnings filter: a deprecated name (torch 2.13's renamed collectives) fails the launch.
DEPRECATIONS_ARE_ERRORS = "error::FutureWarning,error::DeprecationWarning"


@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_three_scripts_on_real_ranks(
    world: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONWARNINGS", DEPRECATIONS_ARE_ERRORS)  # torchrun and every rank
    before_procs = set(psutil.Process().children(recursive=True))
    dp, zero, fsdp = tmp_path / "dp", tmp_path / "zero1", tmp_path / "fsdp"
    small = ["--width", 64, "--depth", 3, "--per-rank-batch", 8, "--blocks", 2, "--steps", 2]
    jobs = [
        ("dp_by_hand", ["--out", dp, *small, "--bucket-mb", 0.01, "--trace", "--pg-timeout", 30]),
        ("zero1_by_hand", ["--out", zero, "--steps", 3]),
        ("fsdp_by_hand", ["--out", fsdp, "--width", 32, "--depth", 3, "--steps", 3]),
    ]
    res = launch(
        "one_launch", world, one_launch_args(jobs), backend="gloo", echo=False, timeout=240,
        tiny_job=True, watch_sockets=True,
    )  # fmt: skip
    assert res.ok and sum(READY_MARKER in ln for ln in res.lines) == 1
    assert all(addr.startswith("127.") for _, addr, _ in res.listening), res.listening
    check_dp(read_results(dp, world), world, dp)
    check_zero1(read_results(zero, world), world)
    check_fsdp(read_results(fsdp, world), world)
    folder = rendezvous_folder(res.command)
    assert folder.parent == Path(tempfile.gettempdir()) and not folder.exists(), "removed"
    alive = set(psutil.Process().children(recursive=True)) - before_procs
    assert not [p for p in alive if p.is_running()], "no process outlives the launch"


def check_dp(ranks: list[dict], world: int, out: Path) -> None:
    """Every way's gradients equal DDP's within rounding; bytes, calls and overlap recorded."""
    first = ranks[0]
    rows = {r["way"]: r for r in dbh.gradient_rows(first)}
    assert all(r["within the bound"] and r["same on every rank"] for r in rows.values()), rows
    if world <= 2:  # sums of two fp32 numbers, halved: exact in any order
        assert all(r["max |grad - DDP|"] == 0.0 for r in rows.values()), rows
    ways = first["ways"]
    sent = {w: ways[w]["bytes per step"] for w in ways}
    assert len(set(sent.values())) == 1 and sent["ddp"] == 4 * first["parameters"]
    assert ways["flat"]["calls per step"] == 1
    assert ways["per_param"]["calls per step"] == ways["overlap"]["calls per step"] == 6
    assert 1 < ways["bucketed"]["calls per step"] < 6
    for way in ("per_param", "flat"):  # reduced after backward: nothing hidden
        assert all(s["hidden s"] == 0.0 for s in ways[way]["instrumented"])
    assert all(
        len(s["comm"]) == ways["overlap"]["calls per step"] for s in ways["overlap"]["instrumented"]
    )
    got = dbh.trace_overlap(out / "trace_rank0.json")
    assert got["ranges"] == {n: 1 for n in got["ranges"]} and got["all-reduce spans"] >= 1


def check_zero1(ranks: list[dict], world: int) -> None:
    """ZeRO-1 equals full Adam on the same gradients; its moments are 1/world of full Adam's."""
    for r, res in enumerate(ranks):
        assert max(res["max param diff per step"]) == 0.0
        assert res["ZeRO-1 bytes"]["moments"] * world == res["full Adam bytes"]["moments"]
        assert res["shard"] == co.shard_bounds(res["parameters"], world, r)[:2]
        assert res["all-gathered bytes per step"] == res["all-reduced bytes per step"]


def check_fsdp(ranks: list[dict], world: int) -> None:
    """By-hand FSDP's losses equal DDP's and FSDP2's; it holds its pieces plus one layer."""

    def same_losses(a: list[float], b: list[float]) -> bool:
        # The first loss precedes any step: the same forward on the same weights, to the bit.
        # Later ones follow steps on gradients summed across ranks: sums of two fp32 numbers,
        # halved, are exact in any order, so up to 2 ranks they are equal to the bit too. At 3
        # the reduce-scatter and the all-reduce may add in other orders (gloo added them alike
        # on 2026-11-27: equal to the bit), and one step moves these losses by about 1e-2, so
        # rtol 1e-5 is 2 orders above fp32 rounding of 3-term sums and 3 below a missing average.
        if a[0] != b[0] or len(a) != len(b):
            return False
        if world <= 2:
            return a == b
        return torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-5, atol=0)

    for res in ranks:
        ddp, hand, fsdp2 = res["ddp"], res["by hand"], res["fsdp2"]
        assert same_losses(hand["losses"], ddp["losses"]), (hand["losses"], ddp["losses"])
        assert ddp["peak parameter bytes"] == ddp["full model bytes"]
        assert hand["held after the step"] * world >= hand["full model bytes"]
        assert hand["peak parameter bytes"] < hand["full model bytes"] or world == 1
        if not fsdp2.get("skipped"):
            assert same_losses(fsdp2["losses"], ddp["losses"]), (fsdp2["losses"], ddp["losses"])
            # at one rank FSDP2's "shard" is the whole model, and a layer is copied besides
            assert fsdp2["peak parameter bytes"] <= ddp["peak parameter bytes"] or world == 1


def test_on_cuda_the_instrumented_step_reads_the_gpu_timeline(fake_gpu, monkeypatch) -> None:  # noqa: ANN001
    """The script's CUDA branch, run on the fake GPU: kernels from the profiler, not host clocks."""
    from helpers.scripts import dp_by_hand as script

    gpu = fake_gpu("h100_sxm", count=2)
    kernels = [
        fake_event("ampere_sgemm_128x64_tn", DeviceType.CUDA, 1000, 1040),
        fake_event("ncclDevKernel_AllReduce_Sum_f32", DeviceType.CUDA, 1020, 1060),
    ]

    class FakeProfile:
        def __init__(self, activities: list) -> None:
            assert ProfilerActivity.CUDA in activities

        def __enter__(self) -> FakeProfile:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def events(self) -> list:
            return kernels

    monkeypatch.setattr(script, "profile", FakeProfile)
    monkeypatch.setattr(script, "train_step", lambda *a: None)
    monkeypatch.setattr(script.dist, "barrier", lambda: None)
    ctx = script.Context(0, 2, 0, "nccl", torch.device("cuda", 0))
    run = script.Run(None, script.Comm(), None, None, None)
    (step,) = script.instrumented_steps(ctx, run, (None, None), 1)
    assert step["comm"] == [pytest.approx((20e-6, 60e-6))]
    assert step["compute"] == [pytest.approx((0.0, 40e-6))]
    assert step["hidden share"] == pytest.approx(0.5) and step["calls"] == 0
    assert gpu.synchronize_calls >= 1, "the step's GPU work is waited for inside the profile"
