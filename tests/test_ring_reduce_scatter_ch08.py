"""Chapter 8, issue 31 item 1: the ring reduce-scatter written by hand (zero1_by_hand.ring_reduce_scatter).

gloo has no reduce-scatter of its own (it all-reduces a copy: pytorch PR #118911), so on a CPU
ZeRO-1 sends 1.5x DDP's bytes unless the ring is written by hand. Real gloo ranks (spawned
processes, 2 and 3 of them) check that the ring gives each rank its piece of the sum, exactly
what gloo's reduce-scatter and the all-reduce give, that each rank writes (W - 1)/W of the
buffer to its sockets plus one small header per send, and that a planted bug (the wrong chunk
sent first) is caught by the value check.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers.comm_overlap import collective
from helpers.scripts import zero1_by_hand as zbh
from helpers.sharding import sent_since

#: The planted bug: each rank starts the ring with its own chunk instead of rank - 1's.
RIGHT, WRONG = "pieces[(rank - 1) % world].clone()", "pieces[rank].clone()"
#: gloo's header per point-to-point send: 144 B on torch 2.13 (measured 2026-11-29); room to 512.
HEADER = 512


def planted_bug():  # noqa: ANN201 - the function, with its first chunk index changed
    source = inspect.getsource(zbh.ring_reduce_scatter)
    assert source.count(RIGHT) == 1, "the planted bug no longer applies: update RIGHT"
    space = dict(vars(zbh))
    exec(source.replace(RIGHT, WRONG), space)  # noqa: S102 - the shipped source, one index changed
    return space["ring_reduce_scatter"]


def rank_main(rank: int, world: int, folder: str) -> None:
    """One gloo rank: the ring (right and planted), gloo's reduce-scatter and the all-reduce's piece."""
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world
    )
    try:
        # whole numbers: their sums are exact in any order, so the values must be equal
        g = torch.Generator().manual_seed(rank)
        flat = torch.randint(-1000, 1000, (world * 2000,), generator=g).float()
        before = flat.clone()
        dist.barrier()
        sent = sent_since("gloo")
        ring = zbh.ring_reduce_scatter(flat, world, rank)
        sent = sent_since("gloo", sent)
        reference = torch.empty_like(ring)
        collective("reduce_scatter_single")(reference, flat.clone())
        summed = flat.clone()
        dist.all_reduce(summed)
        buggy = planted_bug()(flat, world, rank)
        torch.save(
            {
                "ring": ring,
                "reduce_scatter": reference,
                "all_reduce piece": summed.view(world, -1)[rank].clone(),
                "buggy": buggy,
                "sent": sent,
                "input untouched": torch.equal(flat, before),
                "nbytes": flat.numel() * flat.element_size(),
            },
            Path(folder) / f"rank{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_the_ring_by_hand_gives_the_piece_and_sends_a_ring_s_bytes(
    world: int, tmp_path: Path
) -> None:
    mp.start_processes(rank_main, args=(world, str(tmp_path)), nprocs=world, start_method="spawn")
    for rank in range(world):
        res = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        # (a) the values: this rank's piece of the sum, as gloo's reduce-scatter and the all-reduce
        assert torch.equal(res["ring"], res["reduce_scatter"])
        assert torch.equal(res["ring"], res["all_reduce piece"])
        assert res["input untouched"]
        # the planted bug (the wrong chunk sent first) fails (a)
        assert not torch.equal(res["buggy"], res["reduce_scatter"])
        # (b) the bytes written: (W - 1)/W of the buffer, plus a small header per send
        if res["sent"] is not None:  # Linux: /proc/self/io
            ring = res["nbytes"] * (world - 1) // world
            assert 0 <= res["sent"] - ring <= (world - 1) * HEADER, (res["sent"], ring)
