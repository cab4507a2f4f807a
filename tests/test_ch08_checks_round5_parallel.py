"""Chapter 8's data-parallel checkers, round 5: two answers the strict grader found misdiagnosed or
accepted, each closed by a test that failed before.

(A) Exercise 4: the solution with one line moved, this rank's shard copied into its slot of the
in-place all-gather's buffer before optimizer.step(): every rank sends its old piece, and the
check said "the parameters did not change: write the gathered pieces back" (they were written).
The recorder now keeps what each all-gather sent, as it was when called, and the rank notes a
piece equal to the shard before the step and not after it.

(B) Exercise 3: p.grad read before the wait on its all-reduce (p.grad / world in finish() before
work.wait(), or p.grad.clone() in the hook after starting it) passed at one rank and got the
generic "differ from the mean" on the ranks, or passed there too as timing allowed. The
recorder's WriteWatch already noted reads of an async collective's output ("read in flight",
for exercise 4); exercise 3's check now says it, as it says a write. The checker's own reads
after finish() are unwatched, and a read of another parameter's gradient is no race (the
solution's finish() divides each gradient while the later ones still travel).

Wrong answers fail at world size 1, in this process: nothing is launched.
"""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from helpers.checks import FAIL, PASS
from helpers.checks import ch08_parallel as ch08p
from helpers.scripts import ch08_exercise_check as task

# --- the answers (self-contained, as the launched ranks would rebuild them) ----------------------


def zero1_shard_copied_before_step(params, shard, optimizer):
    """Wrong: the solution with `mine.copy_(shard.detach())` moved above optimizer.step(): the
    in-place all-gather sends this rank's piece as it was before the step."""
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    flat_grad = torch.cat([p.grad.reshape(-1) for p in params])
    flat_grad = F.pad(flat_grad, (0, world * s - flat_grad.numel()))
    piece = torch.empty_like(shard)
    reduce_scatter(piece, flat_grad)
    shard.grad = piece.div_(world)
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())  # the mistake: before the step
    optimizer.step()
    all_gather(flat, mine)
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def hooks_divided_before_the_wait(model):
    """Wrong (race): finish() computes p.grad / world before work.wait(), then copies it in: what
    it read is this rank's own gradient, the sum or a mix, as the timing goes."""
    pending = []

    def hook(p):
        pending.append((p, dist.all_reduce(p.grad, async_op=True)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        world = dist.get_world_size()
        for p, work in pending:
            mean = p.grad / world  # the mistake: read before the wait
            work.wait()
            p.grad.copy_(mean)
        pending.clear()

    return finish


def hooks_reading_other_gradients_in_flight(model):
    """Right: each hook reads its own p.grad (a finiteness check) before starting its all-reduce,
    while the earlier gradients' all-reduces travel; finish() looks at the in-flight gradients'
    dtype, then waits for each work and divides its gradient while the later ones travel."""
    pending = []

    def hook(p):
        if not torch.isfinite(p.grad).all():
            raise FloatingPointError("a gradient is not finite")
        pending.append((p, dist.all_reduce(p.grad, async_op=True)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        world = dist.get_world_size()
        assert all(p.grad.is_floating_point() and p.grad.numel() for p, _ in pending)
        for p, work in pending:
            work.wait()
            p.grad.div_(world)
        pending.clear()

    return finish


# --- the checks (three runs, none launched) --------------------------------------------------------


@pytest.mark.parametrize(
    ("wrong", "check", "hints"),
    [
        (
            zero1_shard_copied_before_step,
            ch08p.check_zero1_step,
            (
                "[probe: 1 rank] float32, step 1",
                "the all-gather sent this rank's piece as it was before optimizer.step()",
                "Take the shard after optimizer.step()",
            ),
        ),
        (
            hooks_divided_before_the_wait,
            ch08p.check_overlap_hooks,
            (
                "[probe: 1 rank] step 1",
                "p.grad was read while its all-reduce was in flight",
                "belongs after work.wait(), in finish()",
            ),
        ),
    ],
    ids=["zero1_shard_copied_before_step", "hooks_divided_before_the_wait"],
)
def test_wrong_answers_fail_at_world_size_one_with_their_hint(wrong, check, hints: tuple) -> None:  # noqa: ANN001
    before = set(psutil.Process().children(recursive=True))
    result = check(wrong)
    assert result.status == FAIL, result.message
    for words in hints:
        assert words in result.message, result.message
    assert "write the gathered pieces back" not in result.message, result.message
    assert set(psutil.Process().children(recursive=True)) <= before, "no launch was needed"


def test_reading_other_gradients_in_flight_passes_at_world_size_one(monkeypatch) -> None:  # noqa: ANN001
    """No false positive: reads of gradients whose all-reduce is not in flight, and a look at the
    dtype and size of those in flight. World size 1 only: the recording is the same there (which
    works are waited for does not depend on the world size), and the solution's own launched runs
    (test_exercises_ch08_parallel.py) read each gradient while the later ones travel."""
    monkeypatch.setattr(ch08p, "launched_worlds", lambda: [])
    result = ch08p.check_overlap_hooks(hooks_reading_other_gradients_in_flight)
    assert result.status == PASS, result.message


# --- the recorder itself, in a one-rank group here --------------------------------------------------


def test_the_recorder_notes_reads_of_the_grad_in_flight_only(tmp_path: Path) -> None:
    """A read of the in-flight gradient is noted; another gradient, a view, its size, the checker's
    own reads (unwatched) and a read after the wait are not. An all-gather's sent piece is kept as
    it was when called."""
    params = [torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(3))]
    for p in params:
        p.grad = torch.ones_like(p)
    with ch08p.one_rank_world(tmp_path), task.recording(params, {}) as calls:
        work = dist.all_reduce(params[0].grad, async_op=True)
        (params[1].grad / 2).clone()  # another parameter's gradient
        params[0].grad.view(2, 2), params[0].grad.numel(), params[0].grad.is_floating_point()
        with task.unwatched():
            params[0].grad.clone()  # the checker's
        assert not calls[0]["read in flight"]
        params[0].grad / 2
        assert calls[0]["read in flight"] and not calls[0]["written in flight"]
        work.wait()
        again = dist.all_reduce(params[1].grad, async_op=True)
        again.wait()
        params[1].grad.clone()  # after the wait
        assert not calls[1]["read in flight"]
        flat, mine = torch.zeros(3), torch.full((3,), 2.0)
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        all_gather(flat, mine)
        mine.add_(1)
        assert torch.equal(calls[2]["_sent"][0], torch.full((3,), 2.0))


# --- a third grader's run of the new checks (issue 31, round 5) ------------------------------------
# Two correct answers refused: calls that look only at an in-flight tensor's type or shape
# (t.type(), torch.empty_like(t), t.new_empty(...)) counted as reads of its values. Two wrong
# answers misled: an all-gather of the gradient piece instead of the stepped shard was told its
# gradient slice was wrong, or (a full Adam stepped after gathering the gradient pieces) that it
# gathered "the old pieces".


def _collectives():
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return rs, ag


def _write_back(params, flat):
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def hooks_looking_at_types_in_flight(model):
    """Right: after the launch, only the in-flight gradient's type and shape are looked at."""
    works, scratch = [], {}

    def hook(p):
        work = dist.all_reduce(p.grad, async_op=True)
        assert p.grad.nelement() and p.grad.ndimension() >= 1
        assert p.grad.type().endswith("FloatTensor") or p.grad.type().endswith("DoubleTensor")
        scratch.setdefault(p, torch.empty_like(p.grad))  # a buffer shaped like it, no values read
        scratch.setdefault((p, 0), p.grad.new_zeros(p.grad.shape))
        works.append((p, work))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for p, work in works:
            work.wait()
            p.grad.div_(dist.get_world_size())
        works.clear()

    return finish


def zero1_allocating_while_scattering(params, shard, optimizer):
    """Right: the gather buffer allocated with piece.new_empty while the reduce-scatter travels."""
    rs, ag = _collectives()
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    work = rs(piece, flat_grad, async_op=True)
    flat = piece.new_empty(world * s)  # the allocation overlaps the communication
    work.wait()
    shard.grad = piece.div_(world)
    optimizer.step()
    mine = flat[rank * s : (rank + 1) * s]
    mine.copy_(shard.detach())
    ag(flat, mine)
    _write_back(params, flat)


def zero1_receiving_into_its_gather_slot(params, shard, optimizer):
    """Right: the reduce-scatter receives into this rank's slot of the gather buffer, and the
    stepped shard is copied back there before the in-place all-gather (sent = the slot)."""
    rs, ag = _collectives()
    world, rank, s = dist.get_world_size(), dist.get_rank(), shard.numel()
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    flat = torch.empty_like(flat_grad)
    mine = flat[rank * s : (rank + 1) * s]
    rs(mine, flat_grad)
    shard.grad = mine / world
    optimizer.step()
    mine.copy_(shard.detach())
    ag(flat, mine)
    _write_back(params, flat)


def zero1_gathering_the_gradient_piece(params, shard, optimizer):
    """Wrong: all-gathers the averaged gradient piece, not the stepped shard."""
    rs, ag = _collectives()
    world, s = dist.get_world_size(), shard.numel()
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad)
    shard.grad = piece.div_(world)
    optimizer.step()
    flat = torch.empty_like(flat_grad)
    ag(flat, piece)
    _write_back(params, flat)


def zero1_full_adam_on_gathered_gradients(params, shard, optimizer):
    """Wrong: gathers the averaged gradient pieces and steps a full Adam on every rank (ZeRO-0)."""
    rs, ag = _collectives()
    world, s = dist.get_world_size(), shard.numel()
    n = sum(p.numel() for p in params)
    flat_grad = F.pad(torch.cat([p.grad.reshape(-1) for p in params]), (0, world * s - n))
    piece = torch.empty_like(shard)
    rs(piece, flat_grad)
    shard.grad = piece.div_(world)
    full = torch.empty_like(flat_grad)
    ag(full, piece)
    offset = 0
    for p in params:
        p.grad = full[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()
    if not hasattr(optimizer, "full"):
        optimizer.full = torch.optim.Adam(params, lr=optimizer.param_groups[0]["lr"], foreach=False)
    optimizer.full.step()
    optimizer.step()


@pytest.mark.parametrize(
    ("right", "check"),
    [
        (hooks_looking_at_types_in_flight, ch08p.check_overlap_hooks),
        (zero1_allocating_while_scattering, ch08p.check_zero1_step),
        (zero1_receiving_into_its_gather_slot, ch08p.check_zero1_step),
    ],
    ids=[
        "hooks_looking_at_types_in_flight",
        "zero1_allocating_while_scattering",
        "zero1_receiving_into_its_gather_slot",
    ],
)
def test_right_answers_pass_at_world_size_one(right, check, monkeypatch) -> None:  # noqa: ANN001, E501
    """t.type(), nelement(), empty_like, new_zeros and new_empty read no values (the first two were
    refused); a gather slot that received the reduce-scatter and then the stepped shard is no
    gradient sent (refused by a first version of the gradient-sent check)."""
    monkeypatch.setattr(ch08p, "launched_worlds", lambda: [])
    result = check(right)
    assert result.status == PASS, result.message


@pytest.mark.parametrize(
    "wrong", [zero1_gathering_the_gradient_piece, zero1_full_adam_on_gathered_gradients]
)
def test_an_all_gather_of_the_gradient_piece_is_named(wrong) -> None:  # noqa: ANN001
    """Told it gathered the gradient, not its slice (w4) nor 'the old pieces' (w7)."""
    result = ch08p.check_zero1_step(wrong)
    assert result.status == FAIL, result.message
    assert "[probe: 1 rank] float32, step 1" in result.message, result.message
    assert "sent this rank's averaged gradient piece" in result.message, result.message
    assert "the old ones" not in result.message and "elements rank*s" not in result.message


def test_a_type_conversion_in_flight_is_a_read(tmp_path: Path) -> None:
    """t.type() names the type (no read); t.type(torch.float64) converts it (a read)."""
    params = [torch.nn.Parameter(torch.ones(4))]
    params[0].grad = torch.ones(4)
    with ch08p.one_rank_world(tmp_path), task.recording(params, {}) as calls:
        work = dist.all_reduce(params[0].grad, async_op=True)
        params[0].grad.type(), torch.empty_like(params[0].grad), params[0].grad.new_zeros(2)
        assert not calls[0]["read in flight"]
        params[0].grad.type(torch.float64)
        assert calls[0]["read in flight"]
        work.wait()


# --- the expert's re-read: a division chained with .then() is done when the chained future is -----
# work.wait() (or a wait on the future chained from) passed: on gloo the source future's wait()
# can return before the callback ran, on NCCL the callback runs on a side stream work.wait() does
# not order the optimizer after. The future .then() returns must be waited for.


def hooks_then_divide_waiting_the_work(model):
    """Wrong: the division chained with .then(); finish() waits the work only."""
    works = []
    world = dist.get_world_size()

    def hook(p):
        work = dist.all_reduce(p.grad, async_op=True)
        work.get_future().then(lambda f, p=p: p.grad.div_(world))
        works.append(work)

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        for work in works:
            work.wait()
        works.clear()

    return finish


def hooks_then_divide_waiting_the_source(model):
    """Wrong: the division chained with .then(); finish() waits the future it was chained from."""
    futs = []
    world = dist.get_world_size()

    def hook(p):
        fut = dist.all_reduce(p.grad, async_op=True).get_future()
        fut.then(lambda f, p=p: p.grad.div_(world))
        futs.append(fut)

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        torch.futures.wait_all(futs)
        futs.clear()

    return finish


def hooks_then_divide_collected(model):
    """Right: the chained futures collected with collect_all, and that waited for."""
    futs = []
    world = dist.get_world_size()

    def hook(p):
        fut = dist.all_reduce(p.grad, async_op=True).get_future()
        futs.append(fut.then(lambda f, p=p: p.grad.div_(world)))

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(hook)

    def finish():
        torch.futures.collect_all(futs).wait()
        futs.clear()

    return finish


@pytest.mark.parametrize(
    "wrong", [hooks_then_divide_waiting_the_work, hooks_then_divide_waiting_the_source]
)
def test_a_chained_division_not_waited_for_is_named(wrong) -> None:  # noqa: ANN001
    result = ch08p.check_overlap_hooks(wrong)
    assert result.status == FAIL, result.message
    assert "[probe: 1 rank] step 1" in result.message, result.message
    assert "callback(s) chained with .then() were never waited for" in result.message


def test_chained_divisions_waited_through_collect_all_pass(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(ch08p, "launched_worlds", lambda: [])
    result = ch08p.check_overlap_hooks(hooks_then_divide_collected)
    assert result.status == PASS, result.message
