"""Chapter 8, issue 31 item 8: the one-tensor collectives under the name the installed torch
recommends (helpers.comm_overlap.collective), and no deprecation warning from the FSDP-by-hand
and ZeRO-1 steps with warnings as errors.

torch 2.13 renamed all_gather_into_tensor to all_gather_single and reduce_scatter_tensor to
reduce_scatter_single; the old names still work there but warn (FutureWarning) at every call,
and torch 2.5-2.12 have only the old names. In-process, without torchrun: a one-rank gloo
group runs both steps (tests/test_comm_bytes.py makes one the same way); the launched ranks
and the benchmark's parallel part are run with warnings as errors in tests/test_dp_by_hand.py
and tests/test_benchmark_ch08.py.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
import torch.distributed as dist

from helpers import comm_overlap as co
from helpers.models import make_mlp
from helpers.scripts import fsdp_by_hand as fbh
from helpers.scripts import zero1_by_hand as zbh


@pytest.mark.parametrize("name", sorted(co.RENAMED_COLLECTIVES))
def test_the_installed_torch_s_recommended_name_is_picked(name: str) -> None:
    old = co.RENAMED_COLLECTIVES[name]
    want = getattr(dist, name) if hasattr(dist, name) else getattr(dist, old)
    assert co.collective(name) is want
    if hasattr(dist, name):  # torch 2.13+: the same arguments under both names
        new, alias = inspect.signature(getattr(dist, name)), inspect.signature(getattr(dist, old))
        assert [p.name for p in new.parameters.values()] == [
            p.name for p in alias.parameters.values()
        ]
        assert [p.default for p in new.parameters.values()] == [
            p.default for p in alias.parameters.values()
        ]


@pytest.mark.parametrize("name", sorted(co.RENAMED_COLLECTIVES))
def test_the_old_name_only_where_the_new_one_is_missing(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def new(*args: object) -> None:
        """A stand-in for the new name."""

    def old(*args: object) -> None:
        """A stand-in for the old name."""

    monkeypatch.setattr(dist, co.RENAMED_COLLECTIVES[name], old, raising=False)
    monkeypatch.setattr(dist, name, new, raising=False)
    assert co.collective(name) is new  # torch 2.13+
    monkeypatch.delattr(dist, name)
    assert co.collective(name) is old  # torch 2.5-2.12


def test_an_unknown_collective_is_refused() -> None:
    with pytest.raises(ValueError, match="all_gather_single"):
        co.collective("all_gather_into_tensor")


def test_the_steps_warn_nothing_with_warnings_as_errors(one_rank_group: None) -> None:
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        net = fbh.by_hand(make_mlp((16, 24, 1), seed=0))
        net(x).sum().backward()  # forward and backward all-gather, backward reduce-scatters
        model = make_mlp((16, 24, 1), seed=0)
        zero1 = zbh.Zero1Adam(list(model.parameters()), lr=1e-2)
        model(x).sum().backward()
        zero1.step()  # reduce-scatter, Adam on this rank's piece, then the all-gather
    sharded = [m for m in net if isinstance(m, fbh.ShardedLinear)]
    for m in sharded:  # gathered in forward and again in backward, reduce-scattered once
        padded = 4 * m.world * m.size
        assert m.handed == {"all_gather": 2 * padded, "reduce_scatter": padded}
    assert all(m.shard.grad is not None for m in sharded)
    flat = 4 * sum(p.numel() for p in model.parameters())
    assert zero1.handed == {"reduce_scatter": flat, "all_gather": flat}
