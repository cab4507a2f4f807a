"""The chapter 3 and 4 checkers speak Simplified Chinese after set_language("zh_CN"), numbers kept.

One test launches 3 gloo ranks: the ranks inherit COURSE_LANG, so what they say is Chinese too.
"""

from __future__ import annotations

import re

import torch
import torch.distributed as dist
from test_exercises_ch03 import fate_forgets_subnormals
from test_exercises_ch04 import halve_after_sum, lr_without_accumulation, swap_with_partner

from helpers.checks import FAIL, ch03, ch04
from helpers.i18n import tr

CJK = re.compile(r"[\u4e00-\u9fff]")
F16 = torch.finfo(torch.float16)


# --- chapter 3 ------------------------------------------------------------------------------


def test_a_wrong_fp16_fate_is_explained_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch03.check_fp16_fate(fate_forgets_subnormals)
    out = capsys.readouterr().out
    assert result.status == FAIL
    assert out.startswith("❌ 练习 1：预测 fp16 会把一个值变成什么：[探针：fp16_fate(5e-05)] "), out
    assert "应为 'subnormal'，实际得到 'zero'" in out and "（6.1e-5）" in out, out
    assert "次正规数" in result.message


def pick_trusts_reported_bf16(desc):  # noqa: ANN001, ANN201
    if desc.get("bf16_reported") or "amx_bf16" in desc.get("cpu_flags", []):
        return ("bf16", False)
    return ("fp32", False)


def test_a_wrong_amp_dtype_names_the_machine_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch03.check_pick_amp_dtype(pick_trusts_reported_bf16)
    out = capsys.readouterr().out
    assert result.status == FAIL and CJK.search(out), out
    assert "[探针：Tesla T4] 应为 'fp16'，实际得到 'bf16'" in out and "T4（7.5）" in out, out


def step_clips_scaled_grads(model, optimizer, scaler, x, y, loss_fn, device_type, dtype, max_norm):  # noqa: ANN001, ANN201, PLR0913
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=dtype):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # before unscale_
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def test_a_wrong_amp_step_keeps_its_numbers_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch03.check_amp_train_step(step_clips_scaled_grads)
    out = capsys.readouterr().out
    assert result.status == FAIL and out.startswith("❌ 练习 3：AMP 训练步：fp16："), out
    assert "scaler.unscale_(optimizer)" in out and "梯度" in out, out


def save_without_scaler(path, model, optimizer, scaler):  # noqa: ANN001, ANN201
    torch.save({"m": model.state_dict(), "o": optimizer.state_dict()}, path)


def load_without_scaler(path, model, optimizer, scaler):  # noqa: ANN001, ANN201
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["m"])
    optimizer.load_state_dict(state["o"])


def save_all(path, model, optimizer, scaler):  # noqa: ANN001, ANN201
    state = {"m": model.state_dict(), "o": optimizer.state_dict(), "s": scaler.state_dict()}
    torch.save(state, path)


def load_all(path, model, optimizer, scaler):  # noqa: ANN001, ANN201
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["m"])
    optimizer.load_state_dict(state["o"])
    scaler.load_state_dict(state["s"])


def test_a_checkpoint_without_the_scaler_gives_both_scales_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch03.check_scaler_checkpoint(save_without_scaler, load_without_scaler)
    out = capsys.readouterr().out
    assert result.status == FAIL
    # one skipped step halves the initial 4096: the checker states both scales
    assert "加载后 GradScaler 的缩放因子是 4096，但保存时是 2048" in out, out


def test_a_right_checkpoint_is_correct_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    assert ch03.check_scaler_checkpoint(save_all, load_all).passed
    assert capsys.readouterr().out == "✅ 练习 4：把 GradScaler 存入检查点：正确。\n"


# --- chapter 4 ------------------------------------------------------------------------------


def lr_right(base_lr, base_batch, per_rank_batch, world_size, accum_steps):  # noqa: ANN001, ANN201
    effective = per_rank_batch * world_size * accum_steps
    return effective, base_lr * effective / base_batch


def test_a_wrong_effective_batch_is_explained_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch04.check_scaled_lr(lr_without_accumulation)
    out = capsys.readouterr().out
    assert result.status == FAIL and out.startswith(
        "❌ 练习 1：有效批大小与学习率：[探针：base_lr=0.1"
    ), out
    assert "有效批大小忽略了梯度累积" in out and "accum_steps=4" in out, out


def test_a_right_learning_rate_is_correct_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    assert ch04.check_scaled_lr(lr_right).passed
    assert capsys.readouterr().out == "✅ 练习 1：有效批大小与学习率：正确。\n"


def test_world_size_one_mistakes_are_explained_in_chinese_without_a_launch(chinese, capsys) -> None:  # noqa: ANN001
    result = ch04.check_average_gradients(halve_after_sum)
    assert result.status == FAIL
    assert result.message.startswith("[探针：1 个 rank] 梯度只有正确值的 1/2"), result.message
    assert "（这里是 1）" in result.message
    # dist.isend is refused in Chinese, and that refusal is still recognised as a world-size-1 one
    result = ch04.check_average_gradients(swap_with_partner)
    assert result.status == FAIL and "[探针：1 个 rank，在本进程中]" in result.message
    assert (
        tr("world size 1") in result.message
        and "进程总数为 1 时无法使用 dist.isend" in result.message
    )
    assert "只有一个 rank 时，没有其他 rank 可以等待" in result.message, result.message
    assert "❌ 练习 2：对梯度求平均：" in capsys.readouterr().out


def average_then_raise_in_the_ranks_language(model):  # noqa: ANN001, ANN201

    from helpers.i18n import tr

    w = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= w
    if w > 1:
        raise ValueError(tr("correct"))


def test_the_launched_ranks_speak_chinese_too(chinese) -> None:  # noqa: ANN001
    result = ch04.check_average_gradients(average_then_raise_in_the_ranks_language)
    assert result.status == FAIL
    world = ch04.launched_ranks()
    want = f"[探针：{world} 个 rank] 你的函数在各个 rank 上抛出了异常：ValueError: 正确"
    assert result.message == want, result.message
