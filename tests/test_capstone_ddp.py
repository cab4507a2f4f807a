"""helpers/scripts/capstone_ddp.py under torchrun: DDP on 2 ranks is the same math as 1 rank (chapter 7)."""

from __future__ import annotations

from pathlib import Path

import torch

from helpers.capstone import Levers, Trainer
from helpers.gpt import GPTConfig, text_bytes
from helpers.launch import launch, read_results
from helpers.processes import alive_pids

TINY = ["--n-layer", 1, "--n-head", 2, "--d-model", 16, "--seq-len", 8]


def test_ddp_equals_one_rank_and_the_trainer(tmp_path: Path) -> None:
    args = ["--out", tmp_path, *TINY, "--global-batch", 4, "--steps", 5, "--warmup", 1]
    res = launch("capstone_ddp", 2, args, backend="gloo", timeout=120, echo=False)
    assert res.ok, res.lines[-20:]
    assert alive_pids(res.child_pids) == []
    rank0, rank1 = read_results(tmp_path, 2)
    assert "alone" in rank0 and "alone" not in rank1  # only rank 0 trains the reference
    alone, ddp = rank0["alone"], rank0["ddp"]
    torch.testing.assert_close(torch.tensor(ddp["losses"]), torch.tensor(alone["losses"]))
    torch.testing.assert_close(
        ddp["params"], alone["params"], rtol=1e-4, atol=1e-5
    )  # Adam: tiny grads
    torch.testing.assert_close(rank1["ddp"]["params"], ddp["params"])  # the ranks agree
    assert ddp["tokens_per_s"] > 0 and alone["tokens_per_s"] > 0
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
