"""Chapter 8's checkers speak Chinese after set_language("zh_CN"): hints, probe names, titles (chapter 8).

The tiled-attention checks run in this process; the data-parallel ones at world size 1 here and,
for one case, on launched gloo ranks, whose results the checker reads back and words in the
language COURSE_LANG (set by set_language) names.
"""

from __future__ import annotations

import re

import pytest
import torch
from test_exercises_ch08 import merge_deciding_for_the_whole_tensor, tiled_by
from test_exercises_ch08_parallel import (
    hooks_averaging_twice,
    hooks_blocking,
    hooks_waiting_in_the_hook,
    zero1_full_state,
    zero1_in_float32,
)

from helpers.checks import FAIL, PASS, ch08, ch08_parallel

from nbfiles import exercise_namespace

CJK = re.compile(r"[\u4e00-\u9fff]")


pytestmark = pytest.mark.usefixtures("chinese")  # every test here runs in Chinese


@pytest.fixture(scope="module")
def solutions() -> dict:
    return exercise_namespace("solutions/08_build_it_solutions.ipynb")


def merge_without_rescaling_l(a, b):
    (ma, la, acca), (mb, lb, accb) = a, b
    m = torch.maximum(ma, mb)
    sa, sb = torch.exp(ma - m), torch.exp(mb - m)
    return m, la + lb, acca * sa[..., None] + accb * sb[..., None]


def tiled_returning_q_twice(q, k, v, causal=False, block=16):
    return q, q


def test_a_wrong_merge_gets_its_hint_in_chinese(capsys: pytest.CaptureFixture[str]) -> None:
    result = ch08.check_merge_states(merge_without_rescaling_l)
    out = capsys.readouterr().out
    assert result.status == FAIL
    assert out.startswith(
        "❌ 练习 1：合并两个 softmax 状态：[探针：分别有 5 个和 7 个分数的两个分块"
    ), out
    assert CJK.search(result.message) and "l = l_a * exp(m_a - m) + l_b * exp(m_b - m)" in out
    assert "you added" not in out


def test_a_wrong_shape_is_reported_in_chinese_with_the_shapes(capsys) -> None:  # noqa: ANN001
    result = ch08.check_tiled_attention(tiled_returning_q_twice)
    out = capsys.readouterr().out
    assert result.status == FAIL and "练习 2：分块注意力的前向传播" in out
    assert "float64，T = 40（2 个分块：16 + 8），causal=True" in out
    assert "lse 的形状是 (2, 3, 40, 8)；每个查询行一个数：(2, 3, 40)。" in out, out


def test_the_solutions_are_correct_in_chinese(solutions: dict, capsys) -> None:  # noqa: ANN001
    assert ch08.check_merge_states(solutions["merge_states"]).status == PASS
    assert ch08.check_tiled_attention(solutions["tiled_attention"]).status == PASS
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "✅ 练习 1：合并两个 softmax 状态：正确。",
        "✅ 练习 2：分块注意力的前向传播：正确。",
    ], out


def test_the_skipped_stretch_check_says_why_in_chinese(
    monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # noqa: ANN001
    from helpers.attention_triton import TritonStatus

    monkeypatch.setattr(ch08, "triton_status", lambda d: TritonStatus(False, "unavailable", "no triton for Darwin"))  # fmt: skip
    result = ch08.check_triton_backward(lambda *args: None)
    out = capsys.readouterr().out
    assert result.status == ch08.SKIP
    assert out.startswith("⏭ 练习 5：用 Triton 实现反向传播：已跳过，这里无法运行 Triton："), out
    assert "no triton for Darwin" in out


def test_a_blocking_all_reduce_is_explained_in_chinese_at_world_size_one(capsys) -> None:  # noqa: ANN001
    result = ch08_parallel.check_overlap_hooks(hooks_blocking)
    out = capsys.readouterr().out
    assert result.status == FAIL
    assert "❌ 练习 3：与反向传播重叠的全归约：[探针：1 个 rank] 第 1 步：" in out, out
    assert "阻塞" in out and "async_op=False" in out


def test_a_value_mistake_on_launched_ranks_is_explained_in_chinese(capsys) -> None:  # noqa: ANN001
    result = ch08_parallel.check_overlap_hooks(hooks_averaging_twice)
    out = capsys.readouterr().out
    assert result.status == FAIL
    assert "[探针：2 个 rank，rank 0] 第 1 步：梯度只有正确值的 1/2：平均了两次。" in out, out


def test_a_float32_passage_is_measured_in_chinese(capsys) -> None:  # noqa: ANN001
    result = ch08_parallel.check_zero1_step(zero1_in_float32)
    out = capsys.readouterr().out
    assert result.status == FAIL and "练习 4：一步 ZeRO-1" in out
    assert re.search(
        r"\[探针：1 个 rank\] float64，第 1 步：参数与完整 Adam 的结果相差 [0-9.e+-]+，", out
    ), out
    assert "float32 舍入误差" in out


def test_a_wait_inside_the_hook_is_explained_in_chinese(capsys) -> None:  # noqa: ANN001
    result = ch08_parallel.check_overlap_hooks(hooks_waiting_in_the_hook)
    out = capsys.readouterr().out
    assert result.status == FAIL
    assert "[探针：1 个 rank] 第 1 步：work.wait() 在反向传播期间、在钩子里运行了" in out, out


def test_a_full_optimizer_state_is_measured_in_chinese(capsys) -> None:  # noqa: ANN001
    result = ch08_parallel.check_zero1_step(zero1_full_state)
    out = capsys.readouterr().out
    assert result.status == FAIL
    # at 1 rank the shard is the whole 353-element model: its two float32 moments are 2,824 B;
    # with every parameter added to the optimizer too, twice that
    assert "你调用 step 的优化器共持有 5,648 字节的状态" in out and "共 2,824 字节" in out, out


def test_rows_empty_beside_real_rows_are_explained_in_chinese(capsys) -> None:  # noqa: ANN001
    result = ch08.check_merge_states(merge_deciding_for_the_whole_tensor)
    out = capsys.readouterr().out
    assert result.status == FAIL
    assert "[探针：并排的几行：只在 a 中为空" in out and "要逐行选择安全最大值" in out, out


def test_tiles_of_the_wrong_size_are_explained_in_chinese(capsys) -> None:  # noqa: ANN001
    def keys_only(q, k, v, causal=False, block=16):
        return tiled_by(q, k, v, causal, block, keys=block)

    result = ch08.check_tiled_attention(keys_only)
    out = capsys.readouterr().out
    assert result.status == FAIL
    assert "你一次计算了 64 x 16 个分数：所有查询对一个键分块。" in out, out
