"""The same-math, machine-state, same_but_for and max-batch verdicts speak Simplified Chinese
after set_language("zh_CN"), numbers kept; English comes back after set_language("en")."""

from __future__ import annotations

import re

import pytest
import torch

from helpers.i18n import set_language
from helpers.loops import same_but_for
from helpers.machine_state import GpuTenants, MachineState
from helpers.max_batch import find_max_batch, max_batch_before_oom, max_batch_under_budget, try_step
from helpers.models import make_mlp
from helpers.same_math import check_not_run, loss_ulp, noise_floor, same_math
from helpers.tables import screen_width

CJK = re.compile(r"[\u4e00-\u9fff]")
IMPOSSIBLE = 2**60  # 1 EiB: no machine can allocate it


def base_and_floor() -> tuple[list[float], object]:
    base = [5.5, 5.2, 5.0]
    return base, noise_floor("base", base, list(base), list(base))


def test_same_math_verdicts_are_chinese_with_their_numbers(chinese, capsys) -> None:
    base, floor = base_and_floor()
    ulp = loss_ulp(5.5)
    far = same_math("bug vs base", [5.5, 5.2, 5.0 + 100 * ulp], base, floor, "a bug")
    print(far)
    out = capsys.readouterr().out
    assert out.startswith(
        "bug vs base：不一致：第 3 步的差距是容差的 1.56 倍（容差为本底噪声的 64 倍）；a bug"
    )
    table = out.splitlines()[1:4]  # the row names in Chinese, the columns still aligned
    assert [line.split()[0] for line in table] == ["步", "差距", "容差"], table
    assert len({screen_width(line) for line in table}) == 1, table  # 步 is two columns wide
    control = same_math("lr +10%", [5.5, 5.2 + 100 * ulp, 5.0 + 200 * ulp], base, floor)
    assert control.as_control().startswith("lr +10%：在 3 步中从第 2 步起超出容差")
    assert control.as_control().endswith("检查看得出这一改动")
    assert str(floor).startswith("base 在 3 步内的本底噪声：重跑一次的差距最多 0.0e+00")
    missing = check_not_run("compile", "")
    assert missing.verdict() == (
        "compile：未检查，而这个优化手段必须保持数学等价：检查无法运行（未给出原因）"
    )


def test_same_math_that_passes_says_so_in_chinese(chinese) -> None:
    base, floor = base_and_floor()
    close = same_math("lever vs base", [5.5, 5.2 + 3 * loss_ulp(5.5), 5.0], base, floor)
    assert close.passed
    text = close.verdict()
    assert text.startswith("lever vs base：3 步内数学等价（最大差距 ")
    assert "最接近容差的是第 2 步，为容差的 0.047 倍" in text, text
    identical = same_math("常驻设备的张量 对比 基线", base, base, floor)
    assert identical.verdict() == "常驻设备的张量 对比 基线：3 步内逐位相同（差距全为 0）"
    assert identical.as_control().startswith(
        "常驻设备的张量 对比 基线：全部 3 步逐位相同（差距全为 0）："
    )


def test_machine_state_line_and_caveat_are_chinese(chinese, capsys) -> None:
    busy = MachineState("cuda:0", 6, 6, 16, 2.0, GpuTenants(2, 2**30), 5.5, 1.0)
    quiet = MachineState("cpu", 1, 2, 2, 0.5, GpuTenants(None, note="not read on cpu"))
    assert not busy.quiet and quiet.quiet  # the same logic, whatever the language
    print(busy)
    print(quiet)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "机器：繁忙（其他进程平均占用 5.5 个核心，负载 2.0，共 16 个核心，可用 6 个；torch 6 个线程；"
        "这块 GPU 与其他 2 个计算进程共用，它们占用 1.00 GiB）"
    ), lines[0]
    assert lines[1] == "机器：空闲（负载 0.5，共 2 个核心，可用 2 个；torch 1 个线程）", lines[1]
    caveat = busy.caveat()
    assert caveat.startswith("这块 GPU 与其他 2 个计算进程共用") and "CPU 负载高，" in caveat
    assert "（" not in caveat.split("CPU 负载高")[1]  # no brackets inside the brackets it is put in
    assert str(GpuTenants(0, note="x")) == "这块 GPU 上没有其他进程（x）"


def test_same_but_for_beyond_and_within_rounding_in_chinese(chinese, capsys) -> None:
    reference = [1.0, 2.0, 3.0]
    print(same_but_for([1.0, 2.5, 3.0], reference))
    print(same_but_for([1.0, 2.0, 3.0 + 1e-7], reference))
    print(same_but_for([1.5, 2.5, 3.5], reference, ([0.0] * 3, [0.5] * 3)))
    wrong, right, removed = capsys.readouterr().out.splitlines()
    assert wrong == "损失：3 个值，最大差距 5.0e-01：1 个值超出了舍入误差 (rtol 0.0001, atol 1e-05)"
    assert right.startswith("损失：3 个值，最大差距 1.0e-07：在舍入误差之内"), right
    assert "单是已知的影响就让它们最多变化 5.0e-01；减去这部分之后，最大差距为 0.0e+00" in removed
    named = same_but_for([1.0], [1.0], what="graph vs eager")
    assert str(named).startswith("graph vs eager：1 个值")  # a caller's own name stays as given


def test_max_batch_results_and_refusals_are_chinese(chinese) -> None:
    result = find_max_batch(lambda b: (b <= 50, f"b={b}"), start=8, limit=4096, method="toy")
    text = str(result)
    assert text.startswith("能放下的最大批大小：50  [toy，"), text
    assert "批大小" in text and "放得下" in text and "是" in text  # headers and words translated
    at_limit = find_max_batch(lambda b: True, limit=64)
    assert str(at_limit).startswith(
        "能放下的最大批大小：64（已到搜索上限；更大的批大小也可能放得下）"
    )
    with pytest.raises(ValueError, match="连批大小 1 都放不下：太大了。"):
        find_max_batch(lambda b: (False, "太大了"))
    with pytest.raises(ValueError, match="优化器状态就需要") as exc:
        max_batch_under_budget(make_mlp([64, 64, 10]), (64,), 1000)
    assert CJK.search(str(exc.value)) and "任何批大小都放不下" in str(exc.value)
    with pytest.raises(ValueError, match="在 CPU 上"):
        max_batch_before_oom(lambda b: None, "cpu")


def test_out_of_memory_is_explained_in_chinese(chinese, fake_gpu) -> None:
    outcome = try_step(torch.empty, IMPOSSIBLE, dtype=torch.uint8)
    assert not outcome.ok
    assert outcome.message.startswith(
        "torch.empty 中显存或内存不足：尝试分配 1.00 EiB，被 CPU 分配器拒绝。"
    )
    assert "激活检查点" in outcome.message
    fake_gpu("t4")

    def step(batch: int) -> None:
        torch.empty(IMPOSSIBLE if batch > 20 else batch, dtype=torch.uint8)

    result = max_batch_before_oom(step, "cuda", limit=64)
    assert result.largest == 20 and result.probes[0]["detail"] == "成功运行"
    assert (
        result.probes[-1]["detail"] == "step 中显存或内存不足：尝试分配 1.00 EiB，被 CPU 分配器拒绝"
    )
    assert "cuda 上真实的显存不足" in str(result)


def test_english_comes_back() -> None:
    set_language("zh_CN")
    set_language("en")
    assert str(GpuTenants(0)) == "no other process on this GPU"
    assert str(same_but_for([1.0], [1.0])).startswith("losses: 1 values, largest gap 0.0e+00")


def test_a_verdict_names_chinese_rows_without_stray_spaces(chinese) -> None:  # noqa: ANN001
    """A learner read 「最终循环 的速度是 源教程的循环 的 2.69 倍」: the template's spaces
    belong around Latin names only."""
    from helpers.verdicts import compare_rows

    rows = [
        {"how": "最终循环", "ms": 1.0, "IQR": 0.01},
        {"how": "源教程的循环", "ms": 2.69, "IQR": 0.01},
    ]
    says = str(compare_rows(rows, "how", "最终循环", "源教程的循环", "ms", iqr="IQR"))
    assert "最终循环的速度是源教程的循环的 2.69 倍" in says, says
    rows = [{"how": "GPU", "ms": 1.0, "IQR": 0.01}, {"how": "CPU", "ms": 3.0, "IQR": 0.01}]
    assert "GPU 的速度是 CPU 的 3.00 倍" in str(
        compare_rows(rows, "how", "GPU", "CPU", "ms", iqr="IQR")
    )
