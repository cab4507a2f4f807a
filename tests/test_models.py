"""helpers.models: one make_mlp for every chapter, flat or in blocks, seeded, on a device."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers.models import make_mlp, wide_mlp_sizes


def test_default_is_the_sources_mlp_with_logits() -> None:
    model = make_mlp()
    assert [type(m) for m in model] == [nn.Linear, nn.ReLU, nn.Linear, nn.ReLU, nn.Linear]
    assert [m.out_features for m in model if isinstance(m, nn.Linear)] == [64, 32, 1]
    assert model(torch.randn(5, 20)).shape == (5, 1)


def test_sigmoid_appends_a_sigmoid_with_the_same_parameter_names() -> None:
    with_sigmoid, logits = make_mlp(sigmoid=True), make_mlp()
    assert len(with_sigmoid) == 6 and isinstance(with_sigmoid[-1], nn.Sigmoid)
    logits.load_state_dict(with_sigmoid.state_dict())
    x = torch.randn(4, 20)
    torch.testing.assert_close(torch.sigmoid(logits(x)), with_sigmoid(x))


def test_blocks_group_linear_relu_and_end_with_the_head() -> None:
    model = make_mlp(wide_mlp_sizes(16, 3, 10), blocks=True)
    assert len(model) == 4 and isinstance(model[-1], nn.Linear) and model[-1].out_features == 10
    for block in model[:-1]:
        assert [type(m) for m in block] == [nn.Linear, nn.ReLU]
    assert model(torch.randn(2, 16)).shape == (2, 10)


@pytest.mark.parametrize("sizes", [(20, 64, 32, 1), (8, 8, 8, 8, 3), (5, 2)])
def test_a_seed_gives_the_same_weights_flat_or_in_blocks(sizes: tuple[int, ...]) -> None:
    flat, grouped = make_mlp(sizes, seed=3), make_mlp(sizes, blocks=True, seed=3)
    for p, q in zip(flat.parameters(), grouped.parameters(), strict=True):
        assert torch.equal(p, q)
    x = torch.randn(3, sizes[0])
    assert torch.equal(flat(x), grouped(x))
    assert not torch.equal(next(make_mlp(sizes, seed=4).parameters()), next(flat.parameters()))


def test_device_moves_the_model() -> None:
    assert next(make_mlp(device="meta").parameters()).device.type == "meta"
    assert next(make_mlp().parameters()).device.type == "cpu"


def test_wide_mlp_sizes() -> None:
    assert wide_mlp_sizes(8, depth=2) == (8, 8, 8, 1)
    assert wide_mlp_sizes(4, 1, n_out=10) == (4, 4, 10)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: make_mlp((20,)), "at least an input and an output"),
        (lambda: make_mlp((20, 0, 1)), "must be > 0"),
        (lambda: make_mlp((20, 2.5, 1)), "whole number"),
        (lambda: wide_mlp_sizes(-4), "width must be > 0"),
        (lambda: wide_mlp_sizes(4, 0), "depth must be > 0"),
        (lambda: wide_mlp_sizes(4, 2, n_out=0), "n_out must be > 0"),
    ],
)
def test_bad_sizes_get_a_clear_error(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
