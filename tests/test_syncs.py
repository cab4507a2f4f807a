"""helpers.syncs: the sync counter sees every kind of host read, on any device."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers.batching import PermutationSampler, ResidentBatches
from helpers.loops import fast_epoch, make_adam, sources_epoch
from helpers.models import make_mlp
from helpers.syncs import SyncCounter, count_syncs, sync_kinds

T = torch.tensor([0.5, -1.0, 2.0])
S = T.sum()


@pytest.mark.parametrize(
    ("code", "fn"),
    [
        (".item()", lambda: S.item()),
        (".cpu()", lambda: T.cpu()),
        (".tolist()", lambda: T.tolist()),
        (".numpy()", lambda: T.numpy()),
        ("print / repr", lambda: print(T)),
        ("f-string format", lambda: f"{S:.2f}"),
        ("bool(t) / if t:", lambda: 1 if S > 0 else 0),
        ("int(t)", lambda: int(S)),
        ("float(t)", lambda: float(S)),
        ("t used as an index", lambda: [1, 2, 3][torch.tensor(1)]),
        ("nonzero", lambda: T.nonzero()),
        ("nonzero", lambda: torch.nonzero(T)),
        ("boolean-mask indexing", lambda: T[T > 0]),
        ("masked_select", lambda: T.masked_select(T > 0)),
        ("unique", lambda: torch.unique(T)),
        ("unique", lambda: T.unique()),
        ("torch.where(condition)", lambda: torch.where(T > 0)),
        ("repeat_interleave(tensor repeats)", lambda: T.repeat_interleave(torch.tensor([1, 2, 1]))),
        ("torch.equal", lambda: torch.equal(T, T)),
        ("numpy.asarray(t)", lambda: __import__("numpy").asarray(T)),
    ],
)
def test_each_sync_kind_counts_once(code: str, fn, capsys) -> None:
    _, counter = count_syncs(fn)
    assert counter.count == 1, counter.events
    assert counter.by_kind() == {code: 1}


def test_device_math_and_shapes_are_not_syncs() -> None:
    def work() -> torch.Tensor:
        u = (T * 2 + 1).relu().sum()
        v = torch.where(T > 0, T, torch.zeros_like(T))  # three-argument where: no sync
        w = T.repeat_interleave(2)  # an int count: no sync
        return (
            u
            + v.sum()
            + w.sum()
            + len(T)
            + T.shape[0]
            + T[1:].sum()
            + T[torch.tensor([0, 2])].sum()
        )

    _, counter = count_syncs(work)
    assert counter.count == 0, counter.events


def test_copies_to_the_host_count_only_from_a_device() -> None:
    # on the CPU, .to("cpu") cannot be told apart from .to(device), so it is not counted
    _, counter = count_syncs(lambda: T.to("cpu"))
    assert counter.count == 0
    # from a device it is counted; the meta device stands in for a GPU (it has no data, so
    # the copy itself then fails, after the counter has seen it)
    meta = torch.empty(3, device="meta")
    for copy in (lambda: meta.to("cpu"), lambda: torch.empty(3).copy_(meta)):
        counter = SyncCounter()
        with pytest.raises((NotImplementedError, RuntimeError)), counter:
            copy()
        assert counter.count == 1, counter.events
        assert counter.events[0].device == "meta" or "meta" in counter.events[0].device


def test_host_bookkeeping_by_pytorch_is_recorded_not_counted() -> None:
    x, y = torch.randn(128, 20), torch.rand(128, 1)
    model = make_mlp(sigmoid=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    opt = torch.optim.Adam(model.parameters())  # for-loop Adam reads its CPU step counters
    _, counter = count_syncs(sources_epoch, model, loader, opt, nn.BCELoss(), torch.device("cpu"))
    assert counter.count == 4 and counter.by_kind() == {".item()": 4}
    assert counter.ignored > 0
    assert all(e.where.startswith("loops.py:") for e in counter.events if e.counted)
    assert "not counted" in str(counter)


def test_sources_loop_one_sync_per_step_fast_loop_one_per_epoch() -> None:
    x, y = torch.randn(300, 20), (torch.rand(300, 1) > 0.5).float()
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    src = make_mlp(sigmoid=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=64, sampler=PermutationSampler(300, g1))
    _, c_src = count_syncs(
        sources_epoch, src, loader, make_adam(src.parameters()), nn.BCELoss(), torch.device("cpu")
    )
    fast = make_mlp()
    batches = ResidentBatches(x, y, batch_size=64, generator=g2)
    opt = make_adam(fast.parameters(), impl="fused")
    _, c_fast = count_syncs(fast_epoch, fast, batches, opt, nn.BCEWithLogitsLoss())
    assert c_src.count == len(loader) == 5
    assert c_fast.count == 1 and c_fast.by_kind() == {".tolist()": 1}


def test_user_code_reading_cpu_tensors_is_counted() -> None:
    def user() -> float:
        return T.sum().item() + T.max().item()

    _, counter = count_syncs(user)
    assert counter.count == 2
    assert all("test_syncs.py" in e.where for e in counter.events)


def test_counter_is_reusable_and_reports() -> None:
    counter = SyncCounter()
    with counter:
        S.item()
    with counter:
        S.item()
        S.item()
    assert counter.count == 2  # each `with` starts afresh
    assert "2 host sync(s)" in str(counter)
    assert sum(counter.by_place().values()) == 2
    assert counter.cuda_syncs is None or torch.cuda.is_available()


def test_other_warnings_pass_through() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with SyncCounter():
            warnings.warn("hello from inside", UserWarning, stacklevel=1)
    assert any("hello from inside" in str(w.message) for w in caught)


def test_bad_input() -> None:
    with pytest.raises(TypeError, match="function"):
        count_syncs(42)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            SyncCounter(cuda_debug=True)


def test_sync_kinds_lists_every_call_once() -> None:
    kinds = list(sync_kinds())
    names = [name for _, name in kinds]
    assert len(names) == len(set(names))
    assert {".item()", ".cpu()", ".tolist()", ".numpy()", "nonzero", "bool(t) / if t:"} <= set(
        names
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_debug_mode_counts_real_syncs() -> None:  # pragma: no cover - GPU only
    t = torch.ones(4, device="cuda")
    before = torch.cuda.get_sync_debug_mode()
    _, counter = count_syncs(lambda: (t.sum().item(), t + 1))
    assert counter.count == 1 and counter.cuda_syncs >= 1
    assert torch.cuda.get_sync_debug_mode() == before
