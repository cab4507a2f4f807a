"""Chapter 8's data-parallel checkers: the solutions pass, the untouched stubs are 'todo', and each
typical wrong answer fails with its own hint.

The solutions are read from solutions/08_build_it_solutions.ipynb, the untouched stubs from the
generated exercises/08_build_it_exercises.ipynb. Each check runs the answer at world size 1 in
this process, then on 2 and on 3 launched gloo ranks (a few seconds each); wrong answers caught
at world size 1 launch nothing.
"""

from __future__ import annotations

import functools
import os
import re
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed import all_reduce

from helpers.checks import FAIL, PASS, TODO
from helpers.checks import ch08_parallel as ch08p
from helpers.sharding import wire_bytes

import nbfiles

NOTEBOOKS = {
    "solutions": "solutions/08_build_it_solutions.ipynb",
    "exercises": "exercises/08_build_it_exercises.ipynb",
}
NAMES = ("overlap_hooks", "zero1_step")


@functools.cache
def namespace(kind: str) -> dict:
    """The solutions ('solutions') or untouched stubs ('exercises') of exercises 3 and 4."""
    return nbfiles.exercise_namespace(NOTEBOOKS[kind])


CHECKS = {"overlap_hooks": ch08p.check_overlap_hooks, "zero1_step": ch08p.check_zero1_step}


@pytest.mark.parametrize("name", NAMES)
def test_solution_passes(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert CHECKS[name](namespace("solutions")[name]).status == PASS
    assert "✅" in capsys.readouterr().out


@pytest.mark.parametrize("name", NAMES)
def test_untouched_stub_is_todo(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    before = set(psutil.Process().children(recursive=True))
    assert CHECKS[name](namespace("exercises")[name]).status == TODO
    assert "not done yet" in capsys.readouterr().out
    assert set(psutil.Process().children(recursive=True)) <= before, "a stub launched nothing"


# --- exercise 3: typical wrong answers ----------------------------------------------------------


def hooks_without_wait(model):
    pending = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(
            lambda p: pending.append((p, dist.all_reduce(p.grad, async_op=True)))
        )

    def finish():
        for p, _work in pending:
            p.grad /= dist.get_world_size()  # the work is never waited for
        pending.clear()

    return finish


def hooks_averaging_twice(model):
    pending = []

    def hook(p):
        p.grad /= dist.get_world_size()
        pending.append((p, dist.all_reduce(p.grad, async_op=True)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for p, work in pending:
            work.wait()
            p.grad /= dist.get_world_size()
        pending.clear()

    return finish


def hooks_before_accumulation(model):
    pending = []
    for p in model.parameters():
        p.register_hook(lambda g: pending.append(dist.all_reduce(g, async_op=True)) and None)

    def finish():
        for work in pending:
            work.wait()
        for p in model.parameters():
            p.grad /= dist.get_world_size()
        pending.clear()

    return finish


def hooks_blocking(model):
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad))

    def finish():
        for p in model.parameters():
            p.grad /= dist.get_world_size()

    return finish


def reduce_after_backward(model):
    def finish():
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= dist.get_world_size()

    return finish


def hooks_never_forget(model):
    pending = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(
            lambda p: pending.append((p, dist.all_reduce(p.grad, async_op=True)))
        )

    def finish():
        for p, work in pending:
            work.wait()
            p.grad /= dist.get_world_size()  # the list is never cleared: step 2 divides again

    return finish


def hooks_without_division(model):
    pending = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(
            lambda p: pending.append(dist.all_reduce(p.grad, async_op=True))
        )

    def finish():
        for work in pending:
            work.wait()
        pending.clear()

    return finish


def hooks_reducing_a_copy(model):
    pending = []

    def hook(p):
        copy = p.grad.clone()  # the sum lands in the copy
        pending.append((p, copy, dist.all_reduce(copy, async_op=True)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for p, copy, work in pending:
            work.wait()
            p.grad.copy_(copy / dist.get_world_size())
        pending.clear()

    return finish


def hooks_reducing_at_setup(model):
    for p in model.parameters():
        dist.all_reduce(p.detach())  # not a broadcast: sums the weights
        p.detach().div_(dist.get_world_size())
    return hooks_blocking(model)


def hooks_like_ddp(model):
    """Broadcast the weights at setup, as DDP does, and reduce p.grad.data: the same memory."""
    for p in model.parameters():
        dist.broadcast(p.detach(), src=0)
    pending = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(
            lambda p: pending.append((p, dist.all_reduce(p.grad.data, async_op=True)))
        )

    def finish():
        for p, work in pending:
            work.wait()
            p.grad /= dist.get_world_size()
        pending.clear()

    return finish


def hooks_from_the_environment(model):
    world = int(os.environ["WORLD_SIZE"])  # as torchrun sets it, also at world size 1
    pending = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(
            lambda p: pending.append((p, dist.all_reduce(p.grad, async_op=True)))
        )

    def finish():
        for p, work in pending:
            work.wait()
            p.grad /= world
        pending.clear()

    return finish


@pytest.mark.parametrize(
    ("wrong", "hints"),
    [
        (hooks_without_wait, ("[probe: 1 rank] step 1", "never waited for", "work.wait()")),
        (hooks_before_accumulation, ("[probe: 1 rank]", "before the gradient was accumulated")),
        (hooks_reducing_a_copy, ("[probe: 1 rank] step 1", "a copy of p.grad", "in place")),
        (hooks_reducing_at_setup, ("[probe: 1 rank]", "called all_reduce before any backward")),
        (hooks_blocking, ("[probe: 1 rank]", "blocking (async_op=False)")),
        (reduce_after_backward, ("[probe: 1 rank]", "no all-reduce started during backward")),
    ],
)
def test_overlap_mistakes_caught_at_world_size_one(wrong, hints: tuple) -> None:  # noqa: ANN001
    before = set(psutil.Process().children(recursive=True))
    result = ch08p.check_overlap_hooks(wrong)
    assert result.status == FAIL and all(h in result.message for h in hints), result.message
    assert set(psutil.Process().children(recursive=True)) <= before, "no launch was needed"


@pytest.mark.parametrize(
    ("wrong", "hints"),
    [
        (hooks_averaging_twice, ("2 ranks, rank 0] step 1", "2x too small", "averaged twice")),
        (hooks_never_forget, ("2 ranks, rank 0] step 2", "clear its list")),
        (hooks_without_division, ("2 ranks, rank 0] step 1", "2x too large")),
    ],
)
def test_overlap_value_mistakes_caught_on_the_ranks(wrong, hints: tuple) -> None:  # noqa: ANN001
    result = ch08p.check_overlap_hooks(wrong)
    assert result.status == FAIL and all(h in result.message for h in hints), result.message


def test_an_answer_that_reads_torchruns_environment_passes() -> None:
    assert ch08p.check_overlap_hooks(hooks_from_the_environment).passed


def test_a_setup_broadcast_and_grad_data_pass() -> None:
    result = ch08p.check_overlap_hooks(hooks_like_ddp)
    assert result.passed, result.message


def test_the_gradient_bound_is_an_fp32_all_reduce_of_the_ranks_own() -> None:
    g = torch.Generator().manual_seed(0)
    local = [[torch.randn(50, generator=g)] for _ in range(3)]
    results = [{"steps": [{"local grads": grads}]} for grads in local]
    want = ch08p.exact_mean(results, 0)
    a, b, c = (grads[0] for grads in local)
    for order in ((a + b) + c, a + (b + c), (c + a) + b):  # fp32 sums in any order, divided
        assert ch08p._close([order / 3], want)
    assert ch08p._close([(a / 3 + b / 3) + c / 3], want)  # divided first, as DDP does
    assert not ch08p._close([(a + b + c) / 3 * (1 + 1e-5)], want)  # beyond rounding
    assert ch08p._close([a + b + c], want, 3) and not ch08p._close([a + b + c], want)


# --- exercise 4: typical wrong answers ----------------------------------------------------------
# Each rank's params hold its own gradients; the answer reduce-scatters the flat padded gradient,
# steps its piece and all-gathers the parameters. Every answer below is self-contained: the
# launched ranks rebuild it from its own code.


def zero1_without_gather(params, shard, optimizer):
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    grad = F.pad(grad, (0, world * s - grad.numel()))
    shard.grad = torch.empty_like(shard)
    rs(shard.grad, grad)
    shard.grad /= world
    optimizer.step()
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    flat = F.pad(flat, (0, world * s - flat.numel()))
    flat[rank * s : (rank + 1) * s] = shard.detach()  # only this rank's piece: no all-gather
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_gather_first(params, shard, optimizer):
    world, s = dist.get_world_size(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    flat = torch.empty(world * s, dtype=shard.dtype)
    ag(flat, shard.detach())  # the old pieces
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = torch.empty_like(shard)
    rs(shard.grad, F.pad(grad, (0, world * s - grad.numel())))
    shard.grad /= world
    optimizer.step()
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_all_reduce_then_slice(params, shard, optimizer):
    """The naive first try: the whole sum on every rank, a piece of it kept."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    grad = F.pad(grad, (0, world * s - grad.numel()))
    dist.all_reduce(grad)
    shard.grad = grad[rank * s : (rank + 1) * s] / world
    optimizer.step()
    flat = torch.empty(world * s, dtype=shard.dtype)
    ag(flat, shard.detach())
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_own_gradient(params, shard, optimizer):
    """No reduce-scatter: the rank steps its own gradient, never averaged."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = F.pad(grad, (0, world * s - grad.numel()))[rank * s : (rank + 1) * s].clone()
    optimizer.step()
    flat = torch.empty(world * s, dtype=shard.dtype)
    ag(flat, shard.detach())
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_no_grad_given(params, shard, optimizer):
    world, s = dist.get_world_size(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    piece = torch.empty_like(shard)
    rs(piece, F.pad(grad, (0, world * s - grad.numel())))
    optimizer.step()  # shard.grad was never set: nothing moves
    flat = torch.empty(world * s, dtype=shard.dtype)
    ag(flat, shard.detach())
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_not_divided(params, shard, optimizer):
    """The reduce-scatter's sum stepped as if it were the mean."""
    world, s = dist.get_world_size(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = torch.empty_like(shard)
    rs(shard.grad, F.pad(grad, (0, world * s - grad.numel())))
    optimizer.step()
    flat = torch.empty(world * s, dtype=shard.dtype)
    ag(flat, shard.detach())
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_in_float32(params, shard, optimizer):
    world, s = dist.get_world_size(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = torch.empty_like(shard)
    rs(shard.grad, F.pad(grad, (0, world * s - grad.numel())))
    shard.grad /= world
    optimizer.step()
    flat = torch.empty(world * s)  # always float32
    ag(flat, shard.detach().float())
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_one_ulp_off(params, shard, optimizer):
    world, s = dist.get_world_size(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = torch.empty_like(shard)
    rs(shard.grad, F.pad(grad, (0, world * s - grad.numel())))
    shard.grad /= world
    optimizer.step()
    flat = torch.empty(world * s, dtype=shard.dtype)
    ag(flat, shard.detach())
    flat[0] = torch.nextafter(flat[0], flat[0] + 1)  # rank 0's element 0, one ulp up
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


@pytest.mark.parametrize(
    ("wrong", "hints"),
    [
        (
            zero1_all_reduce_then_slice,
            (
                "[probe: 1 rank] float32, step 1",
                "you all-reduced",
                "3 such shares",
                "on 2 ranks, 2,124 bytes",
                "ZeRO-1 puts 2 (1,416 bytes)",
            ),
        ),  # fmt: skip
        (zero1_own_gradient, ("[probe: 1 rank] float32, step 1", "no reduce-scatter before")),
        (zero1_one_ulp_off, ("[probe: 1 rank] float32, step 1", "own piece")),
        (zero1_no_grad_given, ("[probe: 1 rank] float32, step 1", "shard.grad was None")),
        (zero1_gather_first, ("[probe: 1 rank]", "before optimizer.step()")),
        (zero1_in_float32, ("[probe: 1 rank] float64", "keep the parameters' dtype")),
    ],
)
def test_zero1_mistakes_caught_at_world_size_one(wrong, hints: tuple) -> None:  # noqa: ANN001
    result = ch08p.check_zero1_step(wrong)
    assert result.status == FAIL and all(h in result.message for h in hints), result.message


@pytest.mark.parametrize(
    ("wrong", "hints"),
    [
        (zero1_without_gather, ("2 ranks, rank 0] float32, step 1", "no all-gather")),
        (zero1_not_divided, ("2 ranks, rank 0] float32, step 1", "2x the mean", "Divide it")),
    ],
)
def test_zero1_mistakes_caught_on_the_ranks(wrong, hints: tuple) -> None:  # noqa: ANN001
    result = ch08p.check_zero1_step(wrong)
    assert result.status == FAIL and all(h in result.message for h in hints), result.message


def test_the_all_reduce_hint_counts_what_the_chapter_counts() -> None:
    """3 ring shares against 2: DDP's all-reduce plus an all-gather, against DDP's alone."""
    step = {"before": torch.zeros(353), "after": torch.zeros(353)}
    w, naive, zero1 = ch08p._naive_wire(step, 3)
    nbytes = 3 * 118 * 4  # 353 float32 elements padded to 3 x 118
    assert (w, zero1) == (3, wire_bytes("all_reduce", nbytes, 3))
    assert naive == zero1 + wire_bytes("all_gather", nbytes, 3) == 1.5 * zero1


# --- the in-process world looks like torchrun's ----------------------------------------------


def test_the_one_rank_world_has_torchruns_environment_and_restores_it(
    tmp_path: Path, monkeypatch
) -> None:  # noqa: ANN001
    monkeypatch.setenv("RANK", "7")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with ch08p.one_rank_world(tmp_path):
        assert os.environ["RANK"] == os.environ["LOCAL_RANK"] == "0"
        assert os.environ["WORLD_SIZE"] == "1" and os.environ["MASTER_ADDR"] == "127.0.0.1"
        assert dist.get_world_size() == 1
    assert os.environ["RANK"] == "7" and "WORLD_SIZE" not in os.environ
    assert not dist.is_initialized()


def test_a_notebook_process_group_leaves_world_size_one_to_the_launch(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    assert ch08p.run_at_world_one(hooks_blocking, "overlap_hooks") == {}


# --- the launch's own failures -----------------------------------------------------------------


def hooks_killing_rank_one(model):
    import os as _os

    if dist.get_rank() == 1:
        _os._exit(3)  # a rank that dies: the launch fails, the others are stopped
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad, async_op=True))
    return lambda: None


def test_a_rank_that_dies_fails_the_check_with_the_launchers_words() -> None:
    before = set(psutil.Process().children(recursive=True))
    with pytest.raises(ch08p.CheckFailed, match=r"the 3-rank run failed\..*rank 1"):
        ch08p.run_on_launched_ranks(hooks_killing_rank_one, "overlap_hooks", 3)
    alive = set(psutil.Process().children(recursive=True)) - before
    assert not [p for p in alive if p.is_running()]


def hooks_calling_a_module_without_forward(model):
    torch.nn.Module()(1)  # torch raises NotImplementedError: an error, not a stub
    return lambda: None


def hooks_raising_it_themselves(model):
    names = {c.__name__: c for c in RuntimeError.__subclasses__()}
    raise names["NotImplemented" + "Error"]("Write it here.")  # unseen by a name scan


def test_launched_ranks_tell_a_stub_from_torchs_not_implemented() -> None:
    with pytest.raises(ch08p.NotDoneYet):  # caught before any launch
        ch08p.run_on_launched_ranks(namespace("exercises")["overlap_hooks"], "overlap_hooks", 2)
    with pytest.raises(ch08p.NotDoneYet):
        ch08p.run_on_launched_ranks(hooks_raising_it_themselves, "overlap_hooks", 2)
    with pytest.raises(ch08p.CheckFailed, match='NotImplementedError: Module .* "forward"'):
        ch08p.run_on_launched_ranks(hooks_calling_a_module_without_forward, "overlap_hooks", 2)


def test_a_group_left_broken_is_still_destroyed(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    def broken() -> None:
        raise RuntimeError("the learner's code left the group broken")

    monkeypatch.setattr(ch08p, "teardown", broken)
    with ch08p.one_rank_world(tmp_path):
        assert dist.get_world_size() == 1
    assert not dist.is_initialized()


# --- issue 31: wrong answers the checks used to accept, right ones they used to refuse ----------


def hooks_waiting_in_the_hook(model):
    def hook(p):
        dist.all_reduce(p.grad, async_op=True).wait()  # waits at once: nothing overlaps

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for p in model.parameters():
            p.grad /= dist.get_world_size()

    return finish


def hooks_flat_copy_from_the_last_hook(model):
    params, seen, pending = list(model.parameters()), [], []

    def hook(p):
        seen.append(p)
        if len(seen) == len(params):  # the last gradient: reduce them all at once
            flat = torch.cat([q.grad.reshape(-1) for q in params])
            pending.append((flat, dist.all_reduce(flat, async_op=True)))
            seen.clear()

    for p in params:
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for flat, work in pending:
            work.wait()
            offset = 0
            for q in params:
                q.grad.copy_(flat[offset : offset + q.numel()].view_as(q) / dist.get_world_size())
                offset += q.numel()
        pending.clear()

    return finish


def hooks_all_from_the_last_hook(model):
    params, seen, pending = list(model.parameters()), [], []

    def hook(p):
        seen.append(p)
        if len(seen) == len(params):  # each p.grad in place, but only once all have arrived
            pending.extend((q, dist.all_reduce(q.grad, async_op=True)) for q in params)
            seen.clear()

    for p in params:
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for q, work in pending:
            work.wait()
            q.grad /= dist.get_world_size()
        pending.clear()

    return finish


def hooks_half_in_finish(model):
    params, pending = list(model.parameters()), []
    for p in params[2:]:  # only the last layer's hooks
        p.register_post_accumulate_grad_hook(
            lambda p: pending.append((p, dist.all_reduce(p.grad, async_op=True)))
        )

    def finish():
        for p in params[:2]:
            pending.append((p, dist.all_reduce(p.grad, async_op=True)))
        for p, work in pending:
            work.wait()
            p.grad /= dist.get_world_size()
        pending.clear()

    return finish


def hooks_on_a_flat_view(model):
    """Correct: all-reduce a flattened view of p.grad, the same memory."""
    pending = []

    def hook(p):
        pending.append((p, dist.all_reduce(p.grad.view(-1), async_op=True)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for p, work in pending:
            work.wait()
            p.grad /= dist.get_world_size()
        pending.clear()

    return finish


def zero1_gather_list(params, shard, optimizer):
    """Correct: the pieces all-gathered into a list (a copy, not in place) and concatenated."""
    world, s = dist.get_world_size(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    piece = torch.empty_like(shard)
    rs(piece, F.pad(grad, (0, world * s - grad.numel())))
    shard.grad = piece / world
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # shard.grad gone after the step: still right
    pieces = [torch.empty_like(shard) for _ in range(world)]
    dist.all_gather(pieces, shard.detach())
    flat, offset = torch.cat(pieces), 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_full_state(params, shard, optimizer):
    """Adds every parameter to the optimizer: full Adam on every rank, and the shard too."""
    world, s = dist.get_world_size(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    if len(optimizer.param_groups) == 1:
        optimizer.add_param_group({"params": list(params)})
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = torch.empty_like(shard)
    rs(shard.grad, F.pad(grad, (0, world * s - grad.numel())))
    shard.grad /= world
    for p in params:
        p.grad /= world  # wrong for world > 1, but the state is refused before the values
    optimizer.step()  # steps the parameters themselves, and the shard
    flat = torch.empty(world * s, dtype=shard.dtype)
    ag(flat, shard.detach())


def zero1_own_full_adam(params, shard, optimizer):
    """Keeps a full Adam of its own beside the shard's: the whole state on every rank."""
    world, s = dist.get_world_size(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    if not hasattr(optimizer, "full"):
        optimizer.full = torch.optim.Adam(params, lr=optimizer.param_groups[0]["lr"], foreach=False)
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = torch.empty_like(shard)
    rs(shard.grad, F.pad(grad, (0, world * s - grad.numel())))
    shard.grad /= world
    optimizer.step()
    optimizer.full.step()
    flat = torch.empty(world * s, dtype=shard.dtype)
    ag(flat, shard.detach())


def zero1_replacing_storage(params, shard, optimizer):
    """Right values, but every parameter's storage replaced by a new one."""
    world, s = dist.get_world_size(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = torch.empty_like(shard)
    rs(shard.grad, F.pad(grad, (0, world * s - grad.numel())))
    shard.grad /= world
    optimizer.step()
    flat = torch.empty(world * s, dtype=shard.dtype)
    ag(flat, shard.detach())
    offset = 0
    for p in params:
        p.data = flat[offset : offset + p.numel()].view_as(p).clone()  # new storage
        offset += p.numel()


def zero1_unpadded(params, shard, optimizer):
    """Right at 1 rank (353 = 1 x 353), but the flat gradient is never padded."""
    world, s = dist.get_world_size(), shard.numel()
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    grad = torch.cat([p.grad.reshape(-1) for p in params])  # 353 elements, never padded
    shard.grad = torch.empty_like(shard)
    rs(shard.grad, grad)  # gloo's own size check aborts the process on torch 2.5
    shard.grad /= world
    optimizer.step()
    flat = torch.empty(world * s, dtype=shard.dtype)
    ag(flat, shard.detach())
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


@pytest.mark.parametrize(
    ("wrong", "hints"),
    [
        (hooks_waiting_in_the_hook, ("[probe: 1 rank] step 1", "work.wait() ran during backward")),
        (
            hooks_flat_copy_from_the_last_hook,
            ("[probe: 1 rank] step 1", "torch.cat of several gradients"),
        ),  # fmt: skip
        (hooks_all_from_the_last_hook, ("[probe: 1 rank] step 1", "from a later gradient's hook")),
        (
            hooks_half_in_finish,
            ("[probe: 1 rank] step 1", "2 of 4 gradients were not all-reduced during backward"),
        ),  # fmt: skip
        (
            zero1_full_state,
            ("[probe: 1 rank] float32, step 1", "5,648 bytes of state", "2,824 bytes"),
        ),  # fmt: skip
        (zero1_own_full_adam, ("[probe: 1 rank] float32, step 1", "a full Adam of your own")),
        (zero1_replacing_storage, ("[probe: 1 rank] float32, step 1", "replaced the storage of 4")),
    ],
)
def test_issue_31_wrong_answers_fail_at_world_size_one(wrong, hints: tuple) -> None:  # noqa: ANN001
    """Each passed every probe before issue 31 (no overlap, a copy, the whole state, new storage)."""
    check = (
        ch08p.check_overlap_hooks if wrong.__name__.startswith("hooks") else ch08p.check_zero1_step
    )
    result = check(wrong)
    assert result.status == FAIL and all(h in result.message for h in hints), result.message


@pytest.mark.parametrize("right", [hooks_on_a_flat_view, zero1_gather_list])
def test_issue_31_right_answers_pass(right) -> None:  # noqa: ANN001
    """A flattened view of p.grad is p.grad in place; the pieces gathered into a list, shard.grad cleared."""
    check = (
        ch08p.check_overlap_hooks if right.__name__.startswith("hooks") else ch08p.check_zero1_step
    )
    result = check(right)
    assert result.passed, result.message


def test_a_rank_that_raises_is_reported_with_its_own_error_at_once() -> None:
    """Before issue 31: a gloo timeout after about 30 s, the rank's own error lost (on torch 2.5
    gloo's size check even aborts the rank); now the rank's plain error, at once."""
    import time

    start = time.perf_counter()
    result = ch08p.check_zero1_step(zero1_unpadded)
    assert result.status == FAIL, result.message
    assert re.search(
        r"\[probe: 2 ranks, rank [01]\] your function raised: ValueError", result.message
    ), result.message
    for words in ("353 elements and a piece of 177", "world x piece = 354", "Pad the flat vector"):
        assert words in result.message, result.message
    assert "Timed out" not in result.message, result.message
    assert time.perf_counter() - start < 25  # two launches' worth, not a 20-s group timeout


# --- the strict grader's overlap answers (issue 31, section 2) --------------------------------------


def hooks_chaining_the_division_never_waiting(model):
    """Wrong: the division chained on each work's future, and finish() never waits for one."""
    for p in model.parameters():

        def hook(p):
            world = dist.get_world_size()
            dist.all_reduce(p.grad, async_op=True).get_future().then(lambda f, g=p.grad: g.div_(world))  # fmt: skip

        p.register_post_accumulate_grad_hook(hook)

    def finish():
        time.sleep(0.05)  # 'give them time'

    return finish


def hooks_with_all_reduce_imported(model):
    """Right: the solution, with `from torch.distributed import all_reduce` at the top of the cell."""
    pending = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: pending.append((p, all_reduce(p.grad, async_op=True))))  # fmt: skip

    def finish():
        for p, work in pending:
            work.wait()
            p.grad /= dist.get_world_size()
        pending.clear()

    return finish


def hooks_polling_until_completed(model):
    """Right (if unusual): finish() polls work.is_completed() until every all-reduce is done."""
    pending = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: pending.append((p, dist.all_reduce(p.grad, async_op=True))))  # fmt: skip

    def finish():
        while not all(work.is_completed() for _, work in pending):
            time.sleep(0.001)
        for p, _ in pending:
            p.grad /= dist.get_world_size()
        pending.clear()

    return finish


def hooks_broadcasting_on_rank_0_only(model):
    """Wrong: broadcasts the weights at setup on rank 0 only, so they pair with the others' all-reduces."""
    if dist.get_rank() == 0:
        for p in model.parameters():
            dist.broadcast(p.detach(), src=0)
    pending = []
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(lambda p: pending.append((p, dist.all_reduce(p.grad, async_op=True))))  # fmt: skip

    def finish():
        for p, work in pending:
            work.wait()
            p.grad /= dist.get_world_size()
        pending.clear()

    return finish


def test_a_future_chained_but_never_waited_for_fails() -> None:
    """Accepted before: taking the future counted as a wait."""
    result = ch08p.check_overlap_hooks(hooks_chaining_the_division_never_waiting)
    assert result.status == FAIL, result.message
    for words in ("[probe: 1 rank] step 1", "never waited for", "torch.futures.wait_all", ".then() alone"):  # fmt: skip
        assert words in result.message, result.message


@pytest.mark.parametrize("right", [hooks_with_all_reduce_imported, hooks_polling_until_completed])
def test_all_reduce_imported_by_name_and_a_completed_poll_pass(right) -> None:  # noqa: ANN001
    """Refused before: 'no all-reduce started during backward' (the name bound before the
    recorder patched torch.distributed) and 'never waited for' (a poll until done is a wait)."""
    result = ch08p.check_overlap_hooks(right)
    assert result.passed, result.message


def test_ranks_calling_different_collectives_are_told_so_at_once() -> None:
    """Before: gloo's 'Timed out waiting 20000ms for send operation' after 27 s, nothing else."""
    start = time.perf_counter()
    result = ch08p.check_overlap_hooks(hooks_broadcasting_on_rank_0_only)
    assert result.status == FAIL, result.message
    for words in ("[probe: 2 ranks, rank", "the ranks called different collectives", "dist.broadcast", "dist.all_reduce"):  # fmt: skip
        assert words in result.message, result.message
    assert "Timed out" not in result.message, result.message
    assert time.perf_counter() - start < 18  # one launch, not a 20-s group timeout


#: Bound at import, as `from torch.distributed import reduce_scatter_single` binds them.
RS_BY_NAME = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
AG_BY_NAME = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def zero1_collectives_imported_by_name(params, shard, optimizer):
    """A right answer whose collectives were imported by name before the check patched dist."""
    world, s = dist.get_world_size(), shard.numel()
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = torch.empty_like(shard)
    RS_BY_NAME(shard.grad, F.pad(grad, (0, world * s - grad.numel())))
    shard.grad /= world
    optimizer.step()
    flat = torch.empty(world * s, dtype=shard.dtype)
    AG_BY_NAME(flat, shard.detach())
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def test_zero1_collectives_imported_by_name_are_seen() -> None:
    # The strict grader's finding for exercise 3, which the ZeRO-1 probe shared: a collective
    # imported by name was invisible to the recorder ("no reduce-scatter before ...").
    result = ch08p.check_zero1_step(zero1_collectives_imported_by_name)
    assert result.status != FAIL, result.message
