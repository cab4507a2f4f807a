"""helpers.loops: the sources' loop and the fast loop do the same math; thread and timing helpers."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers.batching import PermutationSampler, ResidentBatches
from helpers.data import make_classification_data
from helpers.loops import (
    FlatAdam,
    best_adam_impl,
    fast_epoch,
    flatten_parameters,
    make_adam,
    sources_epoch,
    time_once,
    torch_threads,
)
from helpers.models import make_mlp


def test_sources_and_fast_loop_same_math() -> None:
    x, y = make_classification_data(640, 20, seed=1)
    torch.manual_seed(0)
    src, fast = make_mlp(sigmoid=True), make_mlp()
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
        m = make_mlp()
        b = ResidentBatches(x, y, batch_size=32, generator=torch.Generator().manual_seed(0))
        results.append(
            fast_epoch(
                m, b, make_adam(m.parameters(), impl="foreach"), nn.BCEWithLogitsLoss(), flag
            )
        )
    assert results[0] == pytest.approx(results[1], rel=1e-5)


@pytest.mark.parametrize("impl", ["for-loop", "foreach", "fused", "capturable"])
def test_make_adam(impl: str) -> None:
    opt = make_adam(make_mlp(sigmoid=True).parameters(), lr=0.01, impl=impl)
    assert opt.defaults["lr"] == 0.01
    assert opt.defaults["capturable"] is (impl == "capturable")


def test_bad_adam_impl() -> None:
    with pytest.raises(ValueError, match="impl must be one of"):
        make_adam(make_mlp(sigmoid=True).parameters(), impl="turbo")
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


# --- flat parameters and FlatAdam (section 5.5) --------------------------------------------


def test_flatten_parameters_makes_views_of_one_buffer() -> None:
    torch.manual_seed(0)
    m = make_mlp()
    before = [p.detach().clone() for p in m.parameters()]
    flat = flatten_parameters(m)
    assert flat.dim() == 1 and flat.numel() == sum(b.numel() for b in before)
    for p, b in zip(m.parameters(), before):
        assert torch.equal(p, b), "values are kept"
        assert p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
        assert p.grad.untyped_storage().data_ptr() == flat.grad.untyped_storage().data_ptr()
    x, y = make_classification_data(32, 20)
    nn.BCEWithLogitsLoss()(m(x), y).backward()
    assert flat.grad.abs().sum() > 0
    assert torch.equal(flat.grad, torch.cat([p.grad.reshape(-1) for p in m.parameters()]))
    with torch.no_grad():
        flat.add_(1.0)  # an update of the flat tensor is an update of the model
    for p, b in zip(m.parameters(), before):
        torch.testing.assert_close(p.detach(), b + 1.0)


def test_flatten_parameters_bad_input() -> None:
    with pytest.raises(ValueError, match="no parameters"):
        flatten_parameters(nn.ReLU())
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    with pytest.raises(ValueError, match="one device and dtype"):
        flatten_parameters(mixed)
    frozen = nn.Linear(2, 2)
    frozen.bias.requires_grad_(False)
    with pytest.raises(ValueError, match="require grad"):
        flatten_parameters(frozen)


@pytest.mark.parametrize(
    "lr, betas", [(1e-3, (0.9, 0.999)), (0.05, (0.5, 0.9)), (0.01, (0.0, 0.0))]
)
def test_flat_adam_matches_torch_adam(lr: float, betas: tuple[float, float]) -> None:
    x, y = make_classification_data(256, 20, seed=3)
    torch.manual_seed(1)
    ref, flat_model = make_mlp(), make_mlp()
    flat_model.load_state_dict(ref.state_dict())
    ref_opt = torch.optim.Adam(ref.parameters(), lr=lr, betas=betas, foreach=False)
    opt = FlatAdam(flatten_parameters(flat_model), lr=lr, betas=betas)
    loss_fn = nn.BCEWithLogitsLoss()
    for step in range(40):
        xb, yb = x[step % 4 * 64 :][:64], y[step % 4 * 64 :][:64]
        for model, o in ((ref, ref_opt), (flat_model, opt)):
            o.zero_grad()
            loss_fn(model(xb), yb).backward()
            o.step()
    assert opt.steps == 40
    for p, q in zip(ref.parameters(), flat_model.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-5)


def test_fast_epoch_with_flat_adam_same_math_one_sync() -> None:
    from helpers.syncs import count_syncs

    x, y = make_classification_data(640, 20, seed=1)
    torch.manual_seed(0)
    a, b = make_mlp(), make_mlp()
    b.load_state_dict(a.state_dict())
    opt_a = make_adam(a.parameters(), impl=best_adam_impl("cpu"))
    opt_b = FlatAdam(flatten_parameters(b))
    feeds = [
        ResidentBatches(x, y, batch_size=64, generator=torch.Generator().manual_seed(2))
        for _ in range(2)
    ]
    la = fast_epoch(a, feeds[0], opt_a, nn.BCEWithLogitsLoss())
    lb, counter = count_syncs(fast_epoch, b, feeds[1], opt_b, nn.BCEWithLogitsLoss())
    assert counter.count == 1, "FlatAdam adds no host sync"
    torch.testing.assert_close(torch.tensor(lb), torch.tensor(la), rtol=1e-4, atol=1e-5)


def test_flat_adam_bad_input() -> None:
    m = make_mlp()
    with pytest.raises(ValueError, match="flatten_parameters"):
        FlatAdam(next(m.parameters()))  # 2-D weight, not the flat parameter
    with pytest.raises(ValueError, match="flatten_parameters"):
        FlatAdam(torch.zeros(5, requires_grad=True))  # no gradient buffer
    flat = flatten_parameters(m)
    for kwargs in ({"lr": 0}, {"lr": -1e-3}, {"eps": 0}, {"betas": (0.9, 1.0)}):
        with pytest.raises(ValueError, match="lr > 0"):
            FlatAdam(flat, **kwargs)
    opt = FlatAdam(flat)
    opt.zero_grad(set_to_none=True)  # stays a zeroed buffer: the model's grads are views of it
    assert flat.grad is not None and not flat.grad.any()
