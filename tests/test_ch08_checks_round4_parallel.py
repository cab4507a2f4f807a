"""Chapter 8's data-parallel checkers, round 4: the strict grader's round-31b findings on exercises 3
(overlap_hooks) and 4 (zero1_step), defects 4-8 and 12, each kind closed by a test that failed before.

Kinds: (1) the recorder saw only torch.distributed.<name> called positionally, so collectives called
through distributed_c10d, by keyword or on the process group were missed; (2) ZeRO-1's all-reduce was
refused by name only (a reduce-scatter plus an all-gather of the averaged gradient passed) and
optimizer state was counted only for optimizers stepped with step(); (3) the float64 run was judged
with float32's rounding; (4) shard.grad could keep a world x s buffer alive; (5) async collectives
were never required to be waited for before their result was used; (6) misleading hints. The answers
live in ch08_round4_parallel_answers.py (self-contained: the launched ranks rebuild them).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import ch08_round4_parallel_answers as answers
import psutil
import pytest
import torch
import torch.distributed as dist

from helpers.checks import FAIL, PASS
from helpers.checks import ch08_parallel as ch08p
from helpers.scripts import ch08_exercise_check as task


def check_of(fn):  # noqa: ANN001, ANN201
    """The check an answer is for: exercise 3's hooks or exercise 4's ZeRO-1 step."""
    return ch08p.check_overlap_hooks if fn.__name__.startswith("hooks") else ch08p.check_zero1_step


# --- right answers the checks refused (kind 1), or could refuse through a new rule --------------


@pytest.mark.parametrize(
    "right",
    [
        answers.hooks_through_c10d,  # refused before: "no all-reduce started during backward"
        answers.hooks_process_group_allreduce,  # refused before, the same way
        answers.hooks_wait_all_futures,
        answers.hooks_keywords_and_group,
        answers.hooks_chained_division_waited,  # a write in a .then() callback is no race
        answers.hooks_avg_op,  # gloo's own division of an AVG is no write of the learner's
        answers.zero1_through_c10d,  # refused before: "no reduce-scatter before optimizer.step()"
        answers.zero1_keyword_arguments,  # refused before: the recorder's own TypeError
        answers.zero1_list_forms,
        answers.zero1_persistent_buffers,  # the collectives' own buffers are no optimizer state
        answers.zero1_avg_op,
        answers.zero1_async_waited,
    ],
    ids=lambda fn: fn.__name__,
)
def test_right_answers_pass(right) -> None:  # noqa: ANN001
    result = check_of(right)(right)
    assert result.status == PASS, result.message


# --- wrong answers, each refused at world size 1 with the hint that names its mistake ------------


@pytest.mark.parametrize(
    ("wrong", "hints"),
    [
        # kind 6, exercise 3: the hints that pointed at another mistake
        (
            answers.hooks_divide_by_2,
            ("[probe: 1 rank] step 1", "0.5x the mean: you divided by 2, not by the world size"),
        ),
        (
            answers.hooks_reducing_the_weights,
            ("[probe: 1 rank] step 1", "was given the parameter itself", "all-reduce p.grad"),
        ),
        (
            answers.hooks_blocking_all_reduce_in_threads,
            ("[probe: 1 rank] step 1", "in a thread of your own", "with async_op=True"),
        ),
        (
            answers.hooks_dividing_in_flight,
            (
                "[probe: 1 rank] step 1",
                "you changed p.grad while its all-reduce was in flight",
                "Divide after wait()",
            ),
        ),
        # kind 5, exercise 3: value() is no wait (torch's INTERNAL ASSERT, or a pass, before)
        (
            answers.hooks_value_without_wait,
            ("[probe: 1 rank] step 1", "fut.value() ran before the future was waited for"),
        ),
        # kind 2: the all-reduce by other names, and a full Adam kept on the optimizer object
        (
            answers.zero1_all_reduce_by_rs_and_ag,
            (
                "[probe: 1 rank] float32, step 1",
                "put 3 shares of the flat vector on the wire",
                "dist.all_gather_single: 1 share(s); dist.all_gather_single: 1 share(s)",
                "ZeRO-1 exactly 2",
                "on 2 ranks 2,124 bytes per rank per step against 1,416",
                "the all-reduce again, by other names",
            ),
        ),
        (answers.zero1_functional_full_adam, ("[probe: 1 rank] float32, step 1", "3 shares")),
        (
            answers.zero1_functional_full_adam_no_extra_traffic,
            (
                "[probe: 1 rank] float32, step 1",
                "the optimizer holds 5,648 bytes of tensors between steps",
                "2,824 bytes",
                "torch.optim.adam.adam",
            ),
        ),
        # kind 2 / 6: the moments compared (the hint said "its gradient is elements rank*s ..")
        (
            answers.zero1_state_cleared,
            ("[probe: 1 rank] float32, step 2", "its step count is 1, not 2: its state was reset"),
        ),
        (answers.zero1_step_twice, ("[probe: 1 rank] float32, step 1", "ran 2 times in one call")),
        (
            answers.zero1_new_adam_each_step,
            ("[probe: 1 rank] float32, step 1", "never stepped, but another one was"),
        ),
        # kind 3: float64 judged with float64's rounding (accepted before)
        (
            answers.zero1_grad_buffer_float32,
            ("[probe: 1 rank] float64, step 1", "float32 rounding in the float64 run"),
        ),
        # kind 5, exercise 4: the waits (flatten/pad or rank-order hints, changing from run to run)
        (
            answers.zero1_async_never_waited,
            (
                "[probe: 1 rank] float32, step 1",
                "dist.reduce_scatter_single was started with async_op=True and never waited for",
                "wait() for each async collective before using its result",
            ),
        ),
        (
            answers.zero1_gather_async_not_waited,
            ("[probe: 1 rank] float32, step 1", "dist.all_gather_single", "never waited for"),
        ),
        (
            answers.zero1_gather_waited_after_copy,
            ("[probe: 1 rank] float32, step 1", "the parameters were written before its wait"),
        ),
        (
            answers.zero1_piece_read_before_wait,
            ("[probe: 1 rank] float32, step 1", "its result was read before its wait"),
        ),
        (
            answers.zero1_step_before_wait,
            ("[probe: 1 rank] float32, step 1", "optimizer.step() ran before its wait"),
        ),
        (
            answers.zero1_divide_by_2,
            ("[probe: 1 rank] float32, step 1", "shard.grad is 0.5x the mean: you divided by 2"),
        ),
    ],
    ids=lambda v: v.__name__ if callable(v) else "",
)
def test_wrong_answers_fail_at_world_size_one_with_their_hint(wrong, hints: tuple) -> None:  # noqa: ANN001
    before = set(psutil.Process().children(recursive=True))
    result = check_of(wrong)(wrong)
    assert result.status == FAIL, result.message
    for words in hints:
        assert words in result.message, result.message
    assert set(psutil.Process().children(recursive=True)) <= before, "no launch was needed"


def test_a_shard_grad_keeping_the_whole_buffer_alive_fails() -> None:
    """Kind 4 (issue 31's item 2 leak): accepted before. At one rank the buffer is the shard."""
    result = ch08p.check_zero1_step(answers.zero1_grad_view_keeps_full)
    assert result.status == FAIL, result.message
    for words in ("[probe: 2 ranks, rank 0] float32, step 1", "a view of a buffer of 1,416 bytes", "needs 708"):  # fmt: skip
        assert words in result.message, result.message


# --- the recorder itself (kind 1), in a one-rank group here ---------------------------------------


def test_the_recorder_sees_keywords_distributed_c10d_and_the_group_once(tmp_path: Path) -> None:
    """Keywords raised the recorder's own TypeError before; distributed_c10d and the group's own
    allreduce went unseen. A deprecated name (calling the new one) and dist.all_reduce (calling
    the group's allreduce) count once."""
    c10d = dist.distributed_c10d
    real_all_reduce, real_group_allreduce = c10d.all_reduce, vars(dist.ProcessGroup)["allreduce"]
    param = torch.nn.Parameter(torch.ones(4))
    with ch08p.one_rank_world(tmp_path), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the deprecated name says so
        flat, piece = torch.ones(6), torch.empty(6)
        with task.recording([param], {}) as calls:
            dist.reduce_scatter_single(output=piece, input=flat)
            c10d.all_gather_into_tensor(output_tensor=flat, input_tensor=piece)
            c10d._get_default_group().allreduce([piece]).wait()
            dist.all_reduce(tensor=piece, async_op=True).wait()
        ops = [c["op"] for c in calls]
        assert ops == [
            "reduce_scatter_single",
            "all_gather_into_tensor",
            "all_reduce",
            "all_reduce",
        ]
        assert [c["bytes"] for c in calls] == [24] * 4
        assert [c["async"] for c in calls] == [False, False, True, True]
        assert all(c["waited"] for c in calls[2:])
        dist.all_reduce(piece)  # everything put back: the group's allreduce works unwatched
    assert c10d.all_reduce is real_all_reduce and dist.all_reduce is real_all_reduce
    assert vars(dist.ProcessGroup)["allreduce"] is real_group_allreduce


def test_the_shard_gradient_bound_is_in_the_runs_dtype() -> None:
    """Kind 3: the bound was float32's for float64 too (2^29 times too loose)."""
    abs_sum = [torch.ones(3, dtype=torch.float64)]
    f32 = ch08p.allreduce_bound_in(abs_sum, 2, torch.float32)[0]
    f64 = ch08p.allreduce_bound_in(abs_sum, 2, torch.float64)[0]
    assert torch.equal(f32, ch08p.allreduce_rounding_bound(abs_sum, 2)[0])
    assert torch.allclose(f64 * 2.0**29, f32)
