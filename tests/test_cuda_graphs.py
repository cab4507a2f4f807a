"""helpers.cuda_graphs: the plan, the batch shapes, the epoch's data flow and capture_steps' Python, on CPU."""

from __future__ import annotations

import contextlib
import types

import pytest
import torch
from graph_standin import eager_static_step
from torch import nn

from helpers.batching import ResidentBatches
from helpers.cuda_graphs import (
    batch_shapes,
    capturable_adam,
    capture_steps,
    graph_capture_plan,
    graphed_epoch,
)
from helpers.data import make_classification_data
from helpers.loops import fast_epoch, make_adam
from helpers.models import make_mlp
from helpers.syncs import SyncCounter


def test_plan_cpu_says_why() -> None:
    ok, why = graph_capture_plan("cpu")
    assert not ok and "cpu" in why and "eager" in why


@pytest.mark.parametrize("kind", ["h100_sxm", "t4", "mi300x"])
def test_plan_cuda_and_rocm_capture(fake_gpu, kind: str) -> None:
    fake_gpu(kind)
    ok, why = graph_capture_plan("cuda")
    assert ok and "captured" in why


def test_plan_mps_does_not_capture(fake_gpu) -> None:
    fake_gpu("mps")
    ok, why = graph_capture_plan("mps")
    assert not ok and "mps" in why


@pytest.mark.parametrize(
    ("n", "b", "want"),
    [(10_000, 64, [64, 16]), (128, 64, [64]), (50, 64, [50]), (65, 64, [64, 1]), (1, 1, [1])],
)
def test_batch_shapes(n: int, b: int, want: list[int]) -> None:
    assert batch_shapes(n, b) == want


@pytest.mark.parametrize(("n", "b"), [(0, 64), (10, 0), (-1, 3)])
def test_batch_shapes_rejects(n: int, b: int) -> None:
    with pytest.raises(ValueError, match="need n_samples"):
        batch_shapes(n, b)


def _setup(n: int = 200, batch: int = 64, seed: int = 3):
    x, y = make_classification_data(n, 20, seed=1)
    torch.manual_seed(0)
    init = make_mlp().state_dict()
    models = []
    for _ in range(2):
        m = make_mlp()
        m.load_state_dict(init)
        models.append(m)
    feeds = [
        ResidentBatches(x, y, batch_size=batch, generator=torch.Generator().manual_seed(seed))
        for _ in range(2)
    ]
    return x, y, models, feeds


def test_graphed_epoch_same_math_as_fast_epoch() -> None:
    """The replay loop's data flow (permutation, short last batch, static buffers) is fast_epoch's."""
    x, y, (m_fast, m_graph), (b_fast, b_graph) = _setup()
    loss_fn = nn.BCEWithLogitsLoss()
    opt_fast = make_adam(m_fast.parameters(), impl="foreach")
    opt_graph = make_adam(m_graph.parameters(), impl="foreach")
    steps = {
        b: eager_static_step(m_graph, opt_graph, loss_fn, x[:b], y[:b])
        for b in batch_shapes(len(x), 64)
    }
    assert sorted(steps) == [8, 64]
    for _ in range(2):
        want = fast_epoch(m_fast, b_fast, opt_fast, loss_fn)
        with SyncCounter() as syncs:
            got = graphed_epoch(steps, b_graph)
        assert len(got) == len(want) == 4
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
        assert syncs.count == 1, "one host sync per epoch"
    for p, q in zip(m_fast.parameters(), m_graph.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_graphed_epoch_drop_last() -> None:
    x, y, (m, _), _ = _setup()
    loss_fn = nn.BCEWithLogitsLoss()
    opt = make_adam(m.parameters(), impl="foreach")
    batches = ResidentBatches(x, y, batch_size=64, drop_last=True, generator=torch.Generator())
    steps = {64: eager_static_step(m, opt, loss_fn, x[:64], y[:64])}
    assert len(graphed_epoch(steps, batches)) == 3


def test_static_buffers_receive_each_batch() -> None:
    x, y, (m, _), (_, batches) = _setup(n=128)
    seen = []
    step = eager_static_step(
        m, make_adam(m.parameters(), impl="foreach"), nn.BCEWithLogitsLoss(), x[:64], y[:64]
    )
    inner = step.replay
    step.replay = lambda: (seen.append(step.x.clone()), inner())[1]
    graphed_epoch({64: step}, batches)
    perm = ResidentBatches(
        x, y, batch_size=64, generator=torch.Generator().manual_seed(3)
    ).permutation()
    assert len(seen) == 2
    torch.testing.assert_close(seen[0], x[perm[:64]])
    torch.testing.assert_close(seen[1], x[perm[64:]])


def test_capturable_adam_flags() -> None:
    opt = capturable_adam(make_mlp().parameters(), lr=2e-3)
    group = opt.param_groups[0]
    assert group["capturable"] and group["foreach"] and group["lr"] == 2e-3


def _fake_capture_api(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """torch.cuda's stream/graph API with CPU stand-ins: the 'capture' runs the step eagerly once."""
    calls: list[str] = []
    stream = types.SimpleNamespace(wait_stream=lambda s: calls.append("wait"))

    class FakeGraph:
        def replay(self) -> None:
            calls.append("replay")

    @contextlib.contextmanager
    def on_stream(s):  # noqa: ANN001, ANN202
        calls.append("side stream")
        yield

    @contextlib.contextmanager
    def capture(g):  # noqa: ANN001, ANN202
        calls.append("capture")
        yield

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: stream)
    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", capture)

    @contextlib.contextmanager
    def on_device(d):  # noqa: ANN001, ANN202
        calls.append(f"device {d}")
        yield

    monkeypatch.setattr(torch.cuda, "device", on_device)
    return calls


def test_capture_steps_undoes_the_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    """After warm-up the weights and Adam state are the starting ones; each capture then runs once here."""
    calls = _fake_capture_api(monkeypatch)
    x, y, (m, ref), _ = _setup()
    loss_fn = nn.BCEWithLogitsLoss()
    opt = make_adam(m.parameters(), impl="foreach")
    steps = capture_steps(m, opt, loss_fn, x, y, [64, 8, 64], warmup=2)
    assert sorted(steps) == [8, 64]
    assert calls.count("capture") == 2 and calls.count("side stream") == 1
    assert calls[0] == f"device {x.device}", "everything runs on the data's GPU"
    assert steps[64].x.shape == (64, 20) and steps[8].y.shape == (8, 1)
    assert steps[64].x.data_ptr() != x.data_ptr(), "static buffers are copies"
    # What the fake 'capture' ran: one step at 64, then one at 8, from the start weights and a
    # fresh Adam (the 2 x 2 warm-up steps undone).
    ref_opt = make_adam(ref.parameters(), impl="foreach")
    for b in (64, 8):
        ref_opt.zero_grad(set_to_none=True)
        loss_fn(ref(x[:b]), y[:b]).backward()
        ref_opt.step()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    steps[64].replay()
    assert calls[-1] == "replay"
