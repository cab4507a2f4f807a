"""helpers.activations: the saved-tensor meter and the layer-by-layer count agree to the byte."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from helpers.activations import (
    ActivationMeter,
    CheckpointCost,
    activation_table,
    analytic_activation_bytes,
    checkpointed_forward,
    measure_activation_bytes,
    unique_storage_bytes,
)
from helpers.machine_state import GpuTenants, MachineState
from helpers.models import make_mlp, wide_mlp_sizes
from helpers.timing import BenchResult, benchmark

MiB = 2**20


def mlp(width: int, depth: int) -> torch.nn.Sequential:
    """Chapter 5's MLP: `depth` blocks of Linear + ReLU, then a 10-way head."""
    return make_mlp(wide_mlp_sizes(width, depth, 10), blocks=True)


def small_cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 8 * 8, 10),
    )


def odd_cnn() -> nn.Sequential:
    """Strides, dilation, 'same' padding, ceil_mode and the other supported activations."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding="same"),
        nn.GELU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1),
        nn.SiLU(),
        nn.Conv2d(8, 4, 5, stride=2, dilation=2, padding=2),
        nn.Tanh(),
        nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
        nn.Flatten(),
        nn.Linear(4 * 2 * 2, 6),
        nn.Sigmoid(),
        nn.Identity(),
    )


def test_mlp_4x2048_at_batch_512_saves_exactly_20_mib() -> None:
    torch.manual_seed(0)
    model, x = mlp(2048, 4), torch.randn(512, 2048)
    assert measure_activation_bytes(model, x) == 20 * MiB
    assert analytic_activation_bytes(model, (2048,), 512) == 20 * MiB


def test_small_cnn_matches_the_analytic_count() -> None:
    model, x = small_cnn(), torch.randn(64, 3, 32, 32)
    measured = measure_activation_bytes(model, x)
    assert measured == analytic_activation_bytes(model, (3, 32, 32), 64) == 11_796_480


@pytest.mark.parametrize("amp", [None, torch.bfloat16])
@pytest.mark.parametrize("every", [0, 1, 2, 3])
def test_checkpointing_and_autocast_match_the_count(amp: torch.dtype | None, every: int) -> None:
    torch.manual_seed(1)
    for model, shape in ((mlp(64, 4), (64,)), (odd_cnn(), (3, 16, 16))):
        x = torch.randn(8, *shape)
        measured = measure_activation_bytes(model, x, autocast_dtype=amp, checkpoint_every=every)
        predicted = analytic_activation_bytes(
            model, shape, 8, autocast_dtype=amp, checkpoint_every=every
        )
        assert measured == predicted, (type(model[0]).__name__, amp, every)


def test_checkpoint_placement_per_block_saves_nothing_pairs_save() -> None:
    model = mlp(2048, 4)
    bytes_at = {
        k: analytic_activation_bytes(model, (2048,), 512, checkpoint_every=k) for k in (0, 1, 2)
    }
    assert bytes_at == {0: 20 * MiB, 1: 20 * MiB, 2: 12 * MiB}


def test_autocast_halves_activations_and_adds_weight_copies() -> None:
    model = mlp(256, 4)
    rows = activation_table(model, (256,), 128, autocast_dtype=torch.bfloat16)
    copies = sum(r["weight-copy bytes"] for r in rows)
    assert copies == 2 * (3 * 256 * 256 + 256 * 10)  # not the first layer: its input needs no grad
    fp32 = analytic_activation_bytes(model, (256,), 128)
    assert sum(r["bytes"] for r in rows) - copies == fp32 // 2


def test_inplace_relu_saves_the_same_and_frozen_layers_save_nothing() -> None:
    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(inplace=True), nn.Linear(32, 4))
    x = torch.randn(16, 32)
    assert measure_activation_bytes(model, x) == analytic_activation_bytes(model, (32,), 16)
    for p in model.parameters():
        p.requires_grad_(False)
    assert measure_activation_bytes(model, x) == 0 == analytic_activation_bytes(model, (32,), 16)


def test_no_grad_and_inference_mode_save_nothing() -> None:
    model, x = mlp(64, 2), torch.randn(4, 64)
    for ctx in (torch.no_grad(), torch.inference_mode()):
        with ActivationMeter(model) as meter, ctx:
            model(x)
        assert meter.total_bytes == 0 and meter.table() == []


def test_meter_excludes_parameters_but_counts_views_once() -> None:
    w = nn.Parameter(torch.randn(8, 8))
    a = torch.randn(8, 8, requires_grad=True)
    with ActivationMeter(w) as meter:
        out = (a @ w) * a.t()  # a is saved twice (once as a view); w is excluded
    assert meter.total_bytes == a.nbytes + (a @ w).nbytes
    assert {row["shape"] for row in meter.table()} == {(8, 8)}
    del out


def test_meter_table_and_repeated_readings() -> None:
    model, x = mlp(32, 2), torch.randn(4, 32)
    with ActivationMeter(model) as meter:
        out = model(x)
    assert [row["shape"] for row in meter.table()] == [(4, 32)] * 3
    assert measure_activation_bytes(model, x) == measure_activation_bytes(model, x)
    del out


def test_unique_storage_bytes_counts_aliases_once() -> None:
    t = torch.zeros(10)
    assert unique_storage_bytes([t, t[2:], t.view(2, 5)]) == 40
    assert unique_storage_bytes([t, torch.zeros(5)]) == 60


def test_checkpointed_forward_gives_the_plain_output() -> None:
    model, x = mlp(16, 3), torch.randn(5, 16)
    assert torch.equal(checkpointed_forward(model, x, 2), model(x))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: analytic_activation_bytes(mlp(8, 1), (8,), -1), ValueError, "batch_size"),
        (lambda: analytic_activation_bytes(mlp(8, 1), (8,), 0), ValueError, "batch_size"),
        (lambda: analytic_activation_bytes(mlp(8, 1), (0,), 4), ValueError, "sample_shape"),
        (lambda: analytic_activation_bytes(mlp(8, 1), (9,), 4), ValueError, "features"),
        (lambda: analytic_activation_bytes(nn.Linear(8, 2), (8,), 4), TypeError, "nn.Sequential"),
        (
            lambda: analytic_activation_bytes(nn.Sequential(nn.LSTM(4, 4)), (4,), 2),
            TypeError,
            "Supported layers",
        ),
        (
            lambda: analytic_activation_bytes(mlp(8, 2), (8,), 4, checkpoint_every=-2),
            ValueError,
            "checkpoint_every",
        ),
        (
            lambda: checkpointed_forward(nn.Linear(2, 2), torch.randn(1, 2), 1),
            TypeError,
            "nn.Sequential",
        ),
        (lambda: checkpointed_forward(mlp(2, 1), torch.randn(1, 2), 0), ValueError, "every"),
        (lambda: measure_activation_bytes(mlp(2, 1), [1.0, 2.0]), TypeError, "tensor"),
        (lambda: ActivationMeter("model"), TypeError, "modules or tensors"),
    ],
)
def test_bad_input_gets_a_clear_error(call, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


# ------------------------------------- what checkpointing costs (AUDIT finding 13, issue 24)


def bench(name: str, ms: float, iqr_ms: float, machine: MachineState | None = None) -> BenchResult:
    return BenchResult(
        name, ms / 1e3, iqr_ms / 1e3, [ms / 1e3] * 7, 1, 6, "cuda:0", "CUDA events", machine
    )


QUIET = MachineState("cuda:0", 6, 6, 16, 1.0, GpuTenants(0), others_cores=0.0, window_s=1.0)
SHARED = MachineState("cuda:0", 6, 6, 16, 1.0, GpuTenants(2, 28 * 2**30))
H100_BIG = {  # the H100 run's big step (chapter 5, cell 85): median and IQR in ms
    "no checkpointing": (15.4, 0.0743),
    "each block": (21.5, 0.0857),
    "pairs of blocks": (21.5, 0.0935),
}
SAVED = {"no checkpointing": 20 * MiB, "each block": 20 * MiB, "pairs of blocks": 12 * MiB}
FLOPS = {"no checkpointing": 300, "each block": 409, "pairs of blocks": 409}


def h100_cost(machine: MachineState = QUIET) -> CheckpointCost:
    timings = {k: bench(k, *v, machine) for k, v in H100_BIG.items()}
    return CheckpointCost("big step: 4 x 4096, batch 2048", timings, FLOPS, SAVED)


def printed_ratio(text: str) -> float:
    found = re.findall(r"(\d+\.\d+)x", text.split("; ")[-1])
    assert len(found) == 1, text
    return float(found[0])


def test_each_verdict_prints_the_time_ratio_of_its_row() -> None:
    cost = h100_cost()
    rows = {r["checkpointing"]: r for r in cost.rows()}
    for name in ("each block", "pairs of blocks"):
        verdict = cost.verdict(name)
        assert f"{printed_ratio(verdict):.2f}x" == rows[name]["time vs plain"] == "1.40x"
        assert verdict == f"here, {name} was 1.40x slower than no checkpointing"
    assert (
        rows["pairs of blocks"]["FLOPs vs plain"] == "1.36x"
        and rows["each block"]["saved MiB"] == 20
    )
    assert cost.extra_flops("pairs of blocks") == pytest.approx(109 / 300)
    text = str(cost)
    assert (
        text.startswith("big step: 4 x 4096, batch 2048\n   checkpointing")
        and "machine: quiet" in text
    )


def test_a_variant_that_saves_nothing_is_called_a_pure_cost() -> None:
    line = h100_cost().line("each block")
    assert line.startswith(
        "each block: saved nothing (20.00 MiB for backward, as without checkpointing), +36% FLOPs"
    )
    assert line.endswith("a pure cost: here, each block was 1.40x slower than no checkpointing")
    saving = h100_cost().line("pairs of blocks")
    assert saving.startswith(
        "pairs of blocks: saved 8.00 MiB of 20.00 MiB for backward, +36% FLOPs; here"
    )


def test_on_a_shared_gpu_the_cost_is_not_concluded() -> None:
    line = h100_cost(SHARED).line("each block")
    assert "a pure cost" not in line
    assert "inconclusive, GPU shared with 2 other compute process(es)" in line
    assert "each block was 1.40x slower" in line and "machine: BUSY" in str(h100_cost(SHARED))


def test_within_the_spread_it_is_too_close_to_call() -> None:
    timings = {
        "no checkpointing": bench("a", 10.0, 1.0, QUIET),
        "each block": bench("b", 10.5, 1.0, QUIET),
    }
    cost = CheckpointCost("t", timings, {k: 1 for k in timings}, {k: 1 for k in timings})
    assert "ahead by 1.05x; spreads add up to" in cost.line(
        "each block"
    ) and "pure cost" not in cost.line("each block")


def test_the_variants_must_match() -> None:
    timings = {"no checkpointing": bench("a", 10.0, 1.0)}
    with pytest.raises(ValueError, match="the same variants"):
        CheckpointCost("t", timings, {"each block": 1}, {"no checkpointing": 1})
    with pytest.raises(ValueError, match="'no checkpointing' among them"):
        CheckpointCost("t", {"x": bench("x", 1.0, 0.0)}, {"x": 1}, {"x": 1})


def test_a_measured_cpu_step_gives_a_consistent_table() -> None:
    """The chapter's own recipe on a tiny MLP: FlopCounterMode counts the recomputation."""
    model, x, y = mlp(32, 4), torch.randn(8, 32), torch.randint(0, 10, (8,))

    def step(every: int) -> None:
        model.zero_grad(set_to_none=True)
        out = checkpointed_forward(model[:-1], x, every) if every else model[:-1](x)
        nn.functional.cross_entropy(model[-1](out), y).backward()

    variants = {"no checkpointing": 0, "pairs of blocks": 2}
    timings = {n: benchmark(step, e, label=n, min_run_time=0.02) for n, e in variants.items()}
    flops = {}
    for n, every in variants.items():
        with FlopCounterMode(display=False) as counter:
            step(every)
        flops[n] = counter.get_total_flops()
    saved = {
        n: measure_activation_bytes(model[:-1], x, checkpoint_every=e) for n, e in variants.items()
    }
    cost = CheckpointCost("tiny", timings, flops, saved)
    assert 0.3 < cost.extra_flops("pairs of blocks") < 0.4  # one more forward of every block
    assert cost.line("pairs of blocks").startswith("pairs of blocks: saved ")
    ratio = timings["pairs of blocks"].median / timings["no checkpointing"].median
    shown = max(ratio, 1 / ratio)  # the row ahead is named first
    assert printed_ratio(cost.verdict("pairs of blocks")) == pytest.approx(shown, abs=0.006)
