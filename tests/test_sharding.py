"""Chapter 8, sharded training measured (helpers.sharding): the live-bytes meter on a CPU, the ZeRO
paper's per-rank formulas, and the bytes a ring collective puts on the wire (issue 31)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.sharding import (
    RESIZED,
    LiveBytes,
    bytes_written,
    free_now,
    metered_step,
    sent_since,
    wire_bytes,
    zero_formulas,
)


def test_the_meter_counts_storages_once_and_forgets_them_when_freed() -> None:
    meter = LiveBytes("cpu")
    with meter:
        a = torch.empty(100)
        view = a[:10]  # the same storage: not counted again
        layer = nn.Linear(10, 10)  # 100 + 10 floats
    assert meter.now() == 4 * (100 + 110)
    del a
    assert meter.now() == 4 * (100 + 110), "a view keeps the whole storage alive"
    del view
    assert meter.now() == 4 * 110
    free_now(layer.bias)  # resized to 0 bytes, as FSDP2 frees its gathered weights
    assert meter.now() == 4 * 100


def test_the_peak_sees_a_temporary_that_is_gone_after() -> None:
    meter = LiveBytes("cpu")
    with meter:
        x = torch.ones(1000)
        meter.reset_peak()
        y = (x * 2).sum()  # a temporary of 1,000 floats, then a scalar
    # the sum is made while the temporary still lives
    assert meter.peak() == 4 * (1000 + 1000 + 1) and meter.now() == 4 * (1000 + 1)
    assert y.item() == 2000


def test_tensors_made_outside_the_meter_are_not_counted() -> None:
    outside = torch.empty(50)
    meter = LiveBytes("cpu")
    with meter:
        outside.mul_(0)  # in place on a tensor from before: counted from now on
    assert meter.now() == 4 * 50
    assert LiveBytes("cpu").now() == 0


def test_a_metered_step_reads_before_peak_and_after() -> None:
    meter = LiveBytes("cpu")
    with meter:
        model = nn.Linear(8, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 8)
    steps = [
        metered_step(
            meter,
            lambda: model(x).square().mean(),
            lambda: opt.zero_grad(set_to_none=False),
            opt.step,
        )
        for _ in range(2)
    ]
    params = 4 * (32 + 4)
    assert steps[0]["before"] == params  # no gradients before the first backward
    assert steps[1]["before"] == steps[1]["after"] == 2 * params  # parameters and gradients
    assert steps[1]["peak"] > steps[1]["after"]  # the activations, during the step


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_zero_formulas_follow_the_paper(world: int) -> None:
    psi = 840 * 5  # a multiple of every world size up to 8: no padding
    f = zero_formulas(psi, world, param=2, grad=2, state=12)  # mixed-precision Adam, K = 12
    assert f["DDP"] == 16 * psi
    assert f["ZeRO-1"] == 4 * psi + 12 * psi // world
    assert f["ZeRO-2"] == 2 * psi + 14 * psi // world
    assert f["ZeRO-3 / FSDP"] == 16 * psi // world


def test_zero_formulas_count_the_padding() -> None:
    f = zero_formulas(10, 3, param=4, grad=4, state=8)  # pieces of 4: 2 zeros of padding
    assert f["ZeRO-1"] == 8 * 12 + 8 * 4 and f["ZeRO-3 / FSDP"] == 16 * 4 and f["DDP"] == 160


@pytest.mark.parametrize("world", [2, 3, 4])
def test_reduce_scatter_plus_all_gather_is_an_all_reduce_on_the_wire(world: int) -> None:
    n = 4 * 4200
    both = wire_bytes("reduce_scatter", n, world) + wire_bytes("all_gather", n, world)
    assert both == wire_bytes("all_reduce", n, world) == 2 * (world - 1) / world * n
    assert wire_bytes("all_reduce", n, 1) == 0
    with pytest.raises(ValueError, match="all_reduce"):
        wire_bytes("broadcast", n, world)


@pytest.mark.parametrize("world", [2, 3, 8])
def test_gloo_runs_a_reduce_scatter_as_an_all_reduce(world: int) -> None:
    n = 840 * 4
    assert wire_bytes("reduce_scatter", n, world, "gloo") == wire_bytes("all_reduce", n, world)
    assert wire_bytes("reduce_scatter", n, world, "nccl") == wire_bytes("all_reduce", n, world) / 2
    assert wire_bytes("all_gather", n, world, "gloo") == wire_bytes("all_gather", n, world)


def test_bytes_written_counts_this_process_s_writes(tmp_path) -> None:  # noqa: ANN001
    before = bytes_written()
    if before is None:
        pytest.skip("no /proc/self/io here")
    (tmp_path / "x").write_bytes(b"0" * 10_000)
    assert bytes_written() - before >= 10_000
    assert sent_since("nccl") is None and sent_since("gloo", 0) >= before


def test_the_peak_breakdown_adds_up_to_the_peak_and_names_the_ops() -> None:
    meter = LiveBytes("cpu")
    with meter:
        kept = torch.ones(1000)
        meter.reset_peak()
        tmp = kept * 2
        small = tmp.sum()
        del tmp
    at = meter.at_peak()
    assert meter.peak() == 4 * (1000 + 1000 + 1)
    assert at["from before"] == 4000 and at["op"] == "aten.sum"
    assert at["made in the step"] == [("aten.mul", 4000), ("aten.sum", 4)]
    assert at["from before"] + sum(n for _, n in at["made in the step"]) == meter.peak()
    del kept, small


def test_a_storage_regrown_in_place_counts_as_made_in_the_step() -> None:
    meter = LiveBytes("cpu")
    with meter:
        kept = torch.ones(1000)  # 4,000 B
        freed = torch.ones(250)
    freed.untyped_storage().resize_(0)  # as FSDP2 frees its gathered weights
    meter.reset_peak()
    freed.untyped_storage().resize_(1000)  # regrown during the step, no operation seen
    at = meter.at_peak()
    assert at["from before"] == 4000, at  # what was alive before the step, not what it grew to
    assert (RESIZED, 1000) in at["made in the step"], at
    assert at["from before"] + sum(n for _, n in at["made in the step"]) == meter.peak()
    del kept


def test_the_meter_reads_the_allocator_on_a_cuda_device(fake_gpu) -> None:  # noqa: ANN001
    # The CUDA branch (no dispatch mode; the caching allocator's counters), on the fake GPU:
    # it has never run on a real GPU in a test.
    gpu = fake_gpu("h100_sxm")
    meter = LiveBytes(gpu.device)
    assert meter.cuda and meter.how == "the CUDA caching allocator"
    with meter:
        meter.reset_peak()
        assert meter.now() == 0 and meter.peak() >= 0 and meter.settled() == 0
        assert meter.at_peak() is None  # no breakdown on CUDA: the allocator keeps no names
