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
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.checks import FAIL, PASS, TODO
from helpers.checks import ch08_parallel as ch08p

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


def zero1_without_gather(params, shard, optimizer):
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    grad = F.pad(grad, (0, world * s - grad.numel()))
    shard.grad = grad[rank * s : (rank + 1) * s].clone()
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
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    pieces = [torch.empty_like(shard) for _ in range(world)]
    dist.all_gather(pieces, shard.detach())  # the old pieces
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = F.pad(grad, (0, world * s - grad.numel()))[rank * s : (rank + 1) * s].clone()
    optimizer.step()
    flat, offset = torch.cat(pieces), 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_reduce_again(params, shard, optimizer):
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    for p in params:
        dist.all_reduce(p.grad)  # they were averaged already
        p.grad /= world
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = F.pad(grad, (0, world * s - grad.numel()))[rank * s : (rank + 1) * s].clone()
    optimizer.step()
    pieces = [torch.empty_like(shard) for _ in range(world)]
    dist.all_gather(pieces, shard.detach())
    flat, offset = torch.cat(pieces), 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_no_grad_given(params, shard, optimizer):
    optimizer.step()  # shard.grad was never set: nothing moves
    pieces = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, shard.detach())
    flat, offset = torch.cat(pieces), 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_first_slice_everywhere(params, shard, optimizer):
    s = shard.numel()
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = grad[:s].clone()  # rank 0's piece of the gradient, on every rank
    optimizer.step()
    pieces = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(pieces, shard.detach())
    flat, offset = torch.cat(pieces), 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_in_float32(params, shard, optimizer):
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = F.pad(grad, (0, world * s - grad.numel()))[rank * s : (rank + 1) * s].clone()
    optimizer.step()
    pieces = [torch.empty(shard.shape) for _ in range(world)]  # always float32
    dist.all_gather(pieces, shard.detach().float())
    flat, offset = torch.cat(pieces), 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def zero1_one_ulp_off(params, shard, optimizer):
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    shard.grad = F.pad(grad, (0, world * s - grad.numel()))[rank * s : (rank + 1) * s].clone()
    optimizer.step()
    pieces = [torch.empty_like(shard) for _ in range(world)]
    dist.all_gather(pieces, shard.detach())
    flat, offset = torch.cat(pieces), 0
    flat[0] = torch.nextafter(flat[0], flat[0] + 1)  # rank 0's element 0, one ulp up
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


@pytest.mark.parametrize(
    ("wrong", "hints"),
    [
        (zero1_reduce_again, ("[probe: 1 rank] float32, step 1", "already", "no all-reduce")),
        (zero1_one_ulp_off, ("[probe: 1 rank] float32, step 1", "own piece")),
        (zero1_no_grad_given, ("[probe: 1 rank]", "the shard did not change")),
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
        (zero1_first_slice_everywhere, ("2 ranks, rank 0]", "another rank's differs")),
    ],
)
def test_zero1_mistakes_caught_on_the_ranks(wrong, hints: tuple) -> None:  # noqa: ANN001
    result = ch08p.check_zero1_step(wrong)
    assert result.status == FAIL and all(h in result.message for h in hints), result.message


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
