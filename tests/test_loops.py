"""helpers.loops: the sources' loop and the fast loop do the same math; thread and timing helpers."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers.batching import PermutationSampler, ResidentBatches
from helpers.data import make_classification_data
from helpers.loops import (
    ADAM_IMPLS,
    best_adam_impl,
    fast_epoch,
    make_adam,
    make_mlp,
    sources_epoch,
    time_once,
    torch_threads,
)


def test_mlp_shapes() -> None:
    with_sigmoid, logits = make_mlp(), make_mlp(logits=True)
    x = torch.randn(5, 20)
    assert with_sigmoid(x).shape == (5, 1) and bool(
        ((with_sigmoid(x) > 0) & (with_sigmoid(x) < 1)).all()
    )
    assert len(with_sigmoid) == 6 and len(logits) == 5
    logits.load_state_dict(with_sigmoid.state_dict())  # same parameter names
    torch.testing.assert_close(torch.sigmoid(logits(x)), with_sigmoid(x))


def test_sources_and_fast_loop_same_math() -> None:
    x, y = make_classification_data(640, 20, seed=1)
    torch.manual_seed(0)
    src, fast = make_mlp(), make_mlp(logits=True)
    fast.load_state_dict(src.state_dict())
    loader = DataLoader(
        TensorDataset(x, y),
        batch_size=64,
        sampler=PermutationSampler(640, torch.Generator().manual_seed(2)),
    )
    batches = ResidentBatches(x, y, batch_size=64, generator=torch.Generator().manual_seed(2))
    src_opt = make_adam(src.parameters())
    fast_opt = make_adam(fast.parameters(), impl=best_adam_impl("cpu"))
    a, b = [], []
    for _ in range(2):
        a += sources_epoch(src, loader, src_opt, nn.BCELoss(), torch.device("cpu"))
        b += fast_epoch(fast, batches, fast_opt, nn.BCEWithLogitsLoss())
    assert len(a) == len(b) == 20 and all(isinstance(v, float) for v in a + b)
    torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=1e-4, atol=1e-5)
    for p, q in zip(src.parameters(), fast.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert a[-1] < a[0]


def test_fast_epoch_set_to_none_false_gives_same_result() -> None:
    x, y = make_classification_data(128, 20)
    results = []
    for flag in (True, False):
        torch.manual_seed(0)
        m = make_mlp(logits=True)
        b = ResidentBatches(x, y, batch_size=32, generator=torch.Generator().manual_seed(0))
        results.append(
            fast_epoch(
                m, b, make_adam(m.parameters(), impl="foreach"), nn.BCEWithLogitsLoss(), flag
            )
        )
    assert results[0] == pytest.approx(results[1], rel=1e-5)


@pytest.mark.parametrize("impl", ADAM_IMPLS)
def test_make_adam(impl: str) -> None:
    opt = make_adam(make_mlp().parameters(), lr=0.01, impl=impl)
    assert opt.defaults["lr"] == 0.01


def test_bad_adam_impl() -> None:
    with pytest.raises(ValueError, match="impl must be one of"):
        make_adam(make_mlp().parameters(), impl="turbo")
    if best_adam_impl("meta") == "foreach":  # where this torch has no fused Adam for meta
        with pytest.raises(RuntimeError, match="not supported on meta"):
            make_adam([torch.zeros(2, device="meta", requires_grad=True)], impl="fused")


def test_best_adam_impl_on_cpu() -> None:
    assert best_adam_impl("cpu") in ("fused", "foreach")


def test_torch_threads_restores() -> None:
    before = torch.get_num_threads()
    with torch_threads(1) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with torch_threads(None) as n:
        assert n == before
    with pytest.raises(ValueError, match="threads"):
        with torch_threads(0):
            pass
    assert torch.get_num_threads() == before
    with pytest.raises(KeyError):
        with torch_threads(1):
            raise KeyError("inside")
    assert torch.get_num_threads() == before


def test_time_once() -> None:
    assert time_once(lambda: sum(range(1000))) >= 0
    with pytest.raises(TypeError, match="function"):
        time_once(3)
