"""helpers.activations: the saved-tensor meter and the layer-by-layer count agree to the byte."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.activations import (
    ActivationMeter,
    activation_table,
    analytic_activation_bytes,
    checkpointed_forward,
    measure_activation_bytes,
    unique_storage_bytes,
)
from helpers.models import make_mlp, wide_mlp_sizes

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
