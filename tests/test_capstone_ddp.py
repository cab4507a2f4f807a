"""helpers/scripts/capstone_ddp.py under torchrun: DDP on 2 ranks is the same math as 1 rank (chapter 7)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest
import torch

from helpers.capstone import Levers, Trainer
from helpers.gpt import GPTConfig, text_bytes
from helpers.launch import launch, read_results
from helpers.processes import alive_pids
from helpers.same_math import SAME_MATH_FACTOR, noise_floor, same_math
from helpers.scripts.capstone_ddp import rate_spread, round_sizes

TINY = ["--n-layer", 1, "--n-head", 2, "--d-model", 16, "--seq-len", 8]


def test_ddp_equals_one_rank_and_the_trainer(tmp_path: Path) -> None:
    args = ["--out", tmp_path, *TINY, "--global-batch", 4, "--steps", 5, "--warmup", 1]
    res = launch("capstone_ddp", 2, [*args, "--rounds", 3], backend="gloo", timeout=120, echo=False)
    assert res.ok, res.lines[-20:]
    assert alive_pids(res.child_pids) == []
    rank0, rank1 = read_results(tmp_path, 2)
    assert "alone" in rank0 and "alone" not in rank1  # only rank 0 trains the reference
    alone, ddp = rank0["alone"], rank0["ddp"]
    rerun, nudged = rank0["alone_rerun"], rank0["alone_nudged"]
    assert rerun["losses"] == alone["losses"] and rerun["param_gap"] == 0  # a CPU repeats itself
    assert nudged["param_gap"] > 0  # every weight one ulp up moves the weights
    # the chapter's check: the losses within 64 x the reference's noise floor, and the weights
    floor = noise_floor("one rank alone", alone["losses"], rerun["losses"], nudged["losses"])
    assert same_math("ddp", ddp["losses"], alone["losses"], floor).check().passed
    weight_gap = (ddp["params"] - alone["params"]).abs().max().item()
    assert weight_gap <= SAME_MATH_FACTOR * nudged["param_gap"]
    torch.testing.assert_close(rank1["ddp"]["params"], ddp["params"], rtol=0, atol=0)  # the ranks
    for run in (alone, ddp):  # 4 timed steps in 3 rounds: 2, 1, 1
        assert len(run["round_tokens_per_s"]) == 3 and min(run["round_tokens_per_s"]) > 0
        assert run["tokens_per_s"] == statistics.median(run["round_tokens_per_s"])
        assert run["tokens_per_s_iqr"] >= 0
    # the notebook's Trainer on the same batches (sdpa, resident) computes the same losses
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=8)
    trainer = Trainer(
        cfg,
        Levers(resident=True, sdpa=True),
        text_bytes(),
        device="cpu",
        batch_size=4,
        interval=5,
        steps=5,
    )
    torch.testing.assert_close(torch.tensor(trainer.run()), torch.tensor(alone["losses"]))


def test_uneven_global_batch_is_refused(tmp_path: Path) -> None:
    args = ["--out", tmp_path, *TINY, "--global-batch", 3, "--steps", 3]
    res = launch("capstone_ddp", 2, args, backend="gloo", timeout=120, echo=False, check=False)
    assert not res.ok
    assert any("does not split evenly over 2 ranks" in line for line in res.lines), res.lines[-10:]


def test_more_rounds_than_timed_steps_are_refused(tmp_path: Path) -> None:
    args = ["--out", tmp_path, *TINY, "--global-batch", 4, "--steps", 3, "--warmup", 1]
    res = launch(
        "capstone_ddp", 2, [*args, "--rounds", 3], backend="gloo", timeout=120, echo=False,
        check=False,
    )  # fmt: skip
    assert not res.ok
    assert any("--rounds must be between 1 and" in line for line in res.lines), res.lines[-10:]


def test_round_sizes_and_their_spread() -> None:
    assert round_sizes(10, 5) == [2] * 5 and round_sizes(4, 3) == [2, 1, 1]
    assert rate_spread([5.0]) == (5.0, 0.0)
    assert rate_spread([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, 2.0)


def test_the_waiting_ranks_outlast_the_reference_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The other ranks wait in a barrier while rank 0 trains the reference three times."""
    from helpers.scripts import capstone_ddp

    seen = {}

    def fake_setup(timeout: float) -> None:
        seen["timeout"] = timeout
        raise SystemExit(0)

    monkeypatch.setattr(capstone_ddp, "setup", fake_setup)
    monkeypatch.setattr(sys, "argv", ["capstone_ddp.py", "--out", "unused"])
    with pytest.raises(SystemExit):
        capstone_ddp.main()
    assert seen["timeout"] >= 240  # 3 x 12 steps of GPT-2 small on an A100: about a minute
