"""The measurement verdicts of helpers.matmul, activations, amp_sweep and case_study speak
Simplified Chinese after set_language("zh_CN"), with the table's numbers kept; English unchanged."""

from __future__ import annotations

import re
import warnings

import matplotlib.pyplot as plt
from test_matmul import H100_ROWS  # chapter 1 cell 20 on the H100 run of 2026-11-26

import helpers.matmul as mm
from helpers.activations import CheckpointCost
from helpers.amp_sweep import LossGap
from helpers.case_study import plot_fixes
from helpers.i18n import set_language
from helpers.machine_state import GpuTenants, MachineState
from helpers.timing import BenchResult
from helpers.verdicts import compare_rows

CJK = re.compile(r"[\u4e00-\u9fff]")
MiB = 2**20
QUIET = MachineState("cuda:0", 6, 6, 16, 1.0, GpuTenants(0), others_cores=0.0, window_s=1.0)
SHARED = MachineState("cuda:0", 6, 6, 16, 9.0, GpuTenants(2, 2**30), 4.0, 1.0)


# --- helpers.matmul: the speed-up verdict ------------------------------------------------------


def speedup(data: dict[int, tuple[float, float]], machine: MachineState, threads=(6,)) -> str:  # noqa: ANN001
    rows = [
        {
            "n": n,
            "CPU (ms)": c,
            "CPU IQR (%)": 1.0,
            "CPU threads": threads[i % len(threads)],
            "cuda:0 (ms)": g,
            "cuda:0 IQR (%)": 1.0,
            "speed-up": c / g,
            "note": "",
        }
        for i, (n, (c, g)) in enumerate(data.items())
    ]
    sweep = mm.MatmulSweep(param="n", rows=rows, compares_devices=True, machine=machine)
    return mm.speedup_verdict(sweep)


def test_the_speedup_verdict_is_chinese_with_the_tables_numbers(chinese, capsys) -> None:  # noqa: ANN001
    print(speedup(H100_ROWS, QUIET, threads=(1, 6)))
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert all(CJK.search(line) for line in lines), out
    assert lines[0].startswith("最大加速比，出现在 n=1024：") and "137.13 倍" in lines[0]
    assert "从 n=1024 起，cuda:0 更快，且超出了波动范围" in out  # a conclusive verdict
    assert "未计入，n = 64, 128, 256, 512：从 n=64 到 n=512，CPU 时间几乎不变" in out
    assert "（7.994-7.997 ms）" in out and "增长到原来的 512 倍" in out
    assert "每个 n 取 1 和 6 个线程中较快的一种" in lines[-1]
    assert "floor" not in out and "relative to" not in out


def test_a_busy_machine_and_no_rows_are_said_in_chinese(chinese) -> None:  # noqa: ANN001
    text = speedup(H100_ROWS, SHARED)
    assert "无法判定持平点：" in text and "2" in text, text
    slower = speedup({64: (0.01, 0.02), 128: (0.04, 0.01), 256: (0.16, 0.2)}, QUIET)
    assert "找不到这样一个 n：从它起 cuda:0 在每个尺寸上都更快" in slower, slower
    assert "4.00 倍" in slower.splitlines()[0]
    none = mm.speedup_verdict(mm.MatmulSweep(param="n"))
    assert CJK.search(none) and "加速比" in none, none


def test_english_is_unchanged_after_switching_back() -> None:
    set_language("zh_CN")
    set_language("en")
    text = speedup(H100_ROWS, QUIET, threads=(1, 6))
    assert not CJK.search(text)
    assert text.splitlines()[0].startswith("largest speed-up, at n=1024: here, cuda:0 was 137.13x")
    assert "(the faster of 1 and 6 thread(s) per n; machine: quiet" in text


# --- helpers.activations: what checkpointing cost ---------------------------------------------


def bench(name: str, ms: float, iqr_ms: float, machine: MachineState) -> BenchResult:
    return BenchResult(
        name, ms / 1e3, iqr_ms / 1e3, [ms / 1e3] * 7, 1, 6, "cuda:0", "CUDA events", machine
    )


def h100_cost(machine: MachineState = QUIET) -> CheckpointCost:
    medians = {
        "no checkpointing": (15.4, 0.0743),
        "each block": (21.5, 0.0857),
        "pairs of blocks": (21.5, 0.0935),
    }
    timings = {k: bench(k, *v, machine) for k, v in medians.items()}
    saved = {"no checkpointing": 20 * MiB, "each block": 20 * MiB, "pairs of blocks": 12 * MiB}
    flops = {"no checkpointing": 300, "each block": 409, "pairs of blocks": 409}
    return CheckpointCost("big step", timings, flops, saved)


def test_a_checkpointing_cost_line_is_chinese(chinese, capsys) -> None:  # noqa: ANN001
    cost = h100_cost()
    print(cost.line("each block"))
    print(cost.line("pairs of blocks"))
    pure, saving = capsys.readouterr().out.splitlines()
    assert pure.startswith(
        "每个块：什么也没省下（为反向传播保存 20.00 MiB，与不做激活检查点时相同）"
    )
    assert "FLOPs +36%；纯属额外开销：" in pure and "1.40 倍" in pure, pure
    assert saving.startswith("每两个块：为反向传播保存的 20.00 MiB 中省下了 8.00 MiB")
    assert "1.40 倍" in saving and CJK.search(saving.split("；")[-1]), saving
    busy = h100_cost(SHARED).line("each block")
    assert "纯属额外开销" not in busy and "无从判断" in busy, busy


# --- helpers.amp_sweep: did AMP move the final loss? --------------------------------------------


def test_the_loss_gap_verdict_is_chinese(chinese, capsys) -> None:  # noqa: ANN001
    print(LossGap("bf16", 0.03363, {0: 0.04518, 1: 0.0477, 2: 0.0351}))
    head, tail = capsys.readouterr().out.splitlines()
    assert head.startswith("bf16 的最终损失为 0.03363，fp32 在同一种子下为 0.04518：低了 0.012")
    assert "26%" in head and "种子 0, 1, 2" in head, head
    assert (
        tail
        == "-> 在换一个种子带来的变化之内（是种子间波动的 0.92 倍）：就训练所能分辨的而言，结果相同"
    )
    beyond = str(LossGap("bf16", 0.03363, {0: 0.04518, 1: 0.0453}))
    assert "超出了换一个种子带来的变化（是种子间波动的 96.2 倍）：在这里，bf16 改变了结果" in beyond
    assert str(LossGap("fp16", 0.5, {0: 0.5, 1: 0.5})).endswith("-> 完全相同")
    changed = str(LossGap("fp16", 0.6, {0: 0.5, 1: 0.5}))
    assert "高了 0.1" in changed and "fp16 改变了结果，而换种子没有" in changed, changed
    own = str(LossGap("fp16", 0.34, {0: 0.34, 1: 0.32}, what="mean loss of epoch 1"))
    assert own.startswith("fp16 的mean loss of epoch 1为 0.34")  # a caller's own words as given


# --- helpers.case_study: the widget's plot title ------------------------------------------------


def test_the_fixes_plot_title_is_chinese(chinese) -> None:  # noqa: ANN001
    rows = [
        {"variant": "slow loop", "ms": 50.0, "IQR (ms)": 1.0},
        {"variant": "chosen fixes", "ms": 10.0, "IQR (ms)": 0.5},
    ]
    verdict = compare_rows(rows, "variant", "chosen fixes", "slow loop", "ms", iqr="IQR (ms)")
    for same, words in ((True, "结果相同"), (False, "结果不同"), (None, "改变了数学计算")):
        result = {
            "chosen": ["resident tensors, no DataLoader"],
            "slow s": 0.05,
            "fixed s": 0.01,
            "verdict": verdict,
            "same result": same,
        }
        with warnings.catch_warnings():  # a font without CJK glyphs warns; the title is text
            warnings.simplefilter("ignore", UserWarning)
            fig = plot_fixes(result)
        title = fig.axes[0].get_title().replace("\n", "")  # Chinese wraps between characters
        plt.close(fig)
        assert CJK.search(title) and "5.00 倍" in title and title.endswith(f"；{words}"), title
