"""The chapter 5 and 6 checkers speak Simplified Chinese after set_language("zh_CN"), numbers kept."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from helpers.checks import FAIL, ch05, ch06
from helpers.i18n import set_language

CJK = re.compile(r"[\u4e00-\u9fff]")


# --- chapter 5 ------------------------------------------------------------------------------


def bill_without_parameters(model: nn.Sequential, batch_size: int) -> dict[str, int]:
    return {"parameters": 0, "gradients": 0, "optimizer_state": 0, "activations": 0}


def test_a_wrong_bill_is_explained_in_chinese_with_its_numbers(chinese, capsys) -> None:  # noqa: ANN001
    result = ch05.check_training_bill(bill_without_parameters)
    out = capsys.readouterr().out
    assert result.status == FAIL and CJK.search(out), out
    # MLP 32-64-64-10: 2112 + 4160 + 650 = 6922 fp32 numbers, 27688 bytes
    assert out.startswith("❌ 练习 1：训练账单：批大小为 16 时 MLP 32-64-64-10 的参数："), out
    assert "你给出 0，模型实际占用 27688 字节（6922 个 fp32 数，每个 4 字节）。" in out, out


def accumulate_without_scaling(
    model: nn.Module, loss_fn: Callable, x: torch.Tensor, y: torch.Tensor, micro_batch: int
) -> None:
    model.zero_grad(set_to_none=True)
    for i in range(0, len(x), micro_batch):
        loss_fn(model(x[i : i + micro_batch]), y[i : i + micro_batch]).backward()


def test_unscaled_accumulation_is_explained_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch05.check_accumulate_gradients(accumulate_without_scaling)
    out = capsys.readouterr().out
    assert result.status == FAIL and CJK.search(out), out
    assert out.startswith("❌ 练习 2：梯度累积："), out
    # 64 samples in micro-batches of 16: four unscaled means, 4x the whole batch's gradient
    assert "对 64 个样本、每个微批次 16 个，你的梯度是整个批次梯度的 4 倍。" in out, out
    assert (
        "每个微批次的损失都是一个均值：在 backward() 之前先把它按比例缩小（除以微批次的个数，或按样本比例加权）。"
        in out
    ), out


def linear_search(fits: Callable[[int], bool], limit: int) -> int:
    best = 0
    for b in range(1, limit + 1):
        if not fits(b):
            break
        best = b
    return best


def doubling_then_bisect(fits: Callable[[int], bool], limit: int) -> int:
    if not fits(1):
        return 0
    good = 1
    while good < limit:
        nxt = min(2 * good, limit)
        if not fits(nxt):
            bad = nxt
            break
        good = nxt
    else:
        return good
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def test_a_linear_search_counts_its_probes_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch05.check_largest_batch(linear_search)
    out = capsys.readouterr().out
    assert result.status == FAIL and CJK.search(out), out
    # limit 4096, true max 100: 101 calls where 2 * 12 + 2 = 26 are allowed
    assert "你为了找到 100 调用了 fits 101 次；先倍增再二分查找最多只需要 26 次。" in out, out


def test_a_right_search_passes_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    assert ch05.check_largest_batch(doubling_then_bisect).passed
    assert capsys.readouterr().out == "✅ 练习 4：能放下的最大批大小：正确。\n"


def safe_step_swallowing_everything(step: Callable[[int], object], batch: int) -> bool:
    try:
        step(batch)
    except Exception:
        return False
    return True


def test_a_swallowed_shape_bug_names_its_probe_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch05.check_safe_step(safe_step_swallowing_everything)
    out = capsys.readouterr().out
    assert result.status == FAIL and CJK.search(out), out
    assert (
        "[探针：一个不是显存不足的 RuntimeError] 这一步中的形状不匹配错误被吞掉了（你返回了 False）"
        in out
    )


# --- chapter 6 ------------------------------------------------------------------------------


def _flops(step: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def mfu_as_percent(step: Callable[[], object], seconds: float, peak: float) -> float:
    if seconds <= 0 or peak <= 0:
        raise ValueError("positive, please")
    return 100 * _flops(step) / seconds / peak


def mfu(step: Callable[[], object], seconds: float, peak: float) -> float:
    if seconds <= 0 or peak <= 0:
        raise ValueError("positive, please")
    return _flops(step) / seconds / peak


def test_a_percentage_mfu_is_explained_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch06.check_step_mfu(mfu_as_percent)
    out = capsys.readouterr().out
    assert result.status == FAIL and CJK.search(out), out
    # 256 -> 128 at batch 64: 4 * 64 * 256 * 128 = 8388608 FLOPs in 2e-4 s against 1e11
    assert out.startswith(
        "❌ 练习 4，一步训练的 MFU：[探针：Linear 层 256-128，批大小 64] 你返回了 41.94，"
        "这是百分数：请返回比例（0.4194）。"
    ), out


def test_a_right_mfu_passes_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    assert ch06.check_step_mfu(mfu).passed
    assert capsys.readouterr().out == "✅ 练习 4，一步训练的 MFU：正确。\n"


def the_first_row(prof) -> str:  # noqa: ANN001
    return prof.key_averages()[0].key


def test_the_first_row_is_explained_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch06.check_top_self_op(the_first_row)
    out = capsys.readouterr().out
    assert result.status == FAIL and CJK.search(out), out
    assert out.startswith("❌ 练习 2，说出性能分析结果中排名第一的算子：[探针：性能分析结果（"), out
    assert "'aten::neg'" in out and "第一行：key_averages() 的结果没有排序；请取最大值。" in out, (
        out
    )


def test_english_is_back_after_chinese(capsys) -> None:  # noqa: ANN001
    set_language("zh_CN")
    try:
        ch06.check_step_mfu(mfu_as_percent)
    finally:
        set_language("en")
    capsys.readouterr()
    ch06.check_step_mfu(mfu_as_percent)
    out = capsys.readouterr().out
    assert out.startswith(
        "❌ Exercise 4, MFU of a step: [probe: Linear layers 256-128 at batch 64] you returned "
        "41.94, a percentage: return the fraction (0.4194)."
    ), out
    assert not CJK.search(out), out


def test_checkpointing_that_saves_nothing_says_so_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    from torch.utils.checkpoint import checkpoint

    def each_block(model: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        h = x
        for block in model[:-1]:
            h = checkpoint(block, h, use_reentrant=False)
        return model[-1](h)

    result = ch05.check_forward_low_memory(each_block)
    out = capsys.readouterr().out
    assert result.status == FAIL, out
    # not 「从 0.44 MiB 降到 0.44 MiB，减少了 0%」 (learner 32)
    assert "激活值字节数仍为 0.44 MiB（没有减少）；至少需要减少 40%。" in out, out
    assert "降到" not in out, out
