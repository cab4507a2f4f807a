"""The capstone's and the attention timing's verdicts speak Simplified Chinese after
set_language("zh_CN"), numbers kept; English comes back with set_language("en")."""

from __future__ import annotations

import re

import torch

import helpers.attention_timing as tm
from helpers.attention_triton import TritonStatus
from helpers.capstone import (
    LeverRow,
    Levers,
    LeverSearch,
    Regime,
    Trainer,
    compile_cache_label,
    cost_verdict,
    is_kept,
    keep_verdict,
    lever_available,
    math_change,
    plot_levers,
    recipe_ratio,
    removal_verdict,
)
from helpers.gpt import GPTConfig, text_bytes
from helpers.i18n import set_language

CJK = re.compile(r"[\u4e00-\u9fff]")
TINY = GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=8)
BIG = GPTConfig(n_layer=12, n_head=12, d_model=768, seq_len=1024)


def row(label: str = "baseline", step_s: float = 0.01, spread: float = 0.0) -> LeverRow:
    """A LeverRow with made-up figures."""
    return LeverRow(label, step_s, spread, 1000.0, 1.0, None, 0.1, [5.0, 4.0])


# --------------------------------------------------------------------------- capstone verdicts


def test_a_lever_that_helps_is_kept_in_chinese(chinese) -> None:
    best = row("sdpa", step_s=0.01)
    keep, text = keep_verdict(row("sdpa + amp", step_s=0.009), best)
    assert keep and text == "保留：在每步 10 ms 时，速度是不用它时的 1.11 倍（噪声 ±2%）", text
    assert is_kept(text)


def test_a_lever_that_does_not_help_is_dropped_in_chinese_with_its_numbers(chinese) -> None:
    best = row("sdpa", step_s=0.01)
    keep, text = keep_verdict(row("sdpa + amp", step_s=0.0101), best)
    assert not keep and text.startswith("舍弃：在每步 10 ms 时未显示出帮助（0.99x，噪声 ±2%）")
    keep, text = keep_verdict(row("sdpa + amp", step_s=0.0125), best)
    assert not keep and text == "舍弃：在每步 10 ms 时，耗时是不用它时的 1.25 倍（噪声 ±2%）", text
    assert not is_kept(text)


def test_removal_and_cost_verdicts_in_chinese(chinese) -> None:
    final = row("resident + sdpa", step_s=0.010)
    assert removal_verdict("resident", row("sdpa", step_s=0.008), final) == (
        True,
        "移除 常驻设备的张量：不用它时的速度是用它时的 1.25 倍（噪声 ±2%）",
    )
    stays = removal_verdict("resident", row("sdpa", step_s=0.0101), final)[1]
    assert stays == (
        "常驻设备的张量 保留（在 常驻设备的张量 + sdpa 中已开启）：在每步 10.1 ms 时现在未显示出帮助"
        "（1.01x，噪声 ±2%）"
    ), stays
    without, ckpt = row("sdpa", step_s=0.010), row("sdpa + checkpoint", step_s=0.0135)
    cost = cost_verdict(ckpt, without, "checkpointing")
    assert cost == "在每步 10 ms 时，开启激活检查点后每步耗时是原来的 1.35 倍（噪声 ±2%）", cost


def test_explanations_in_chinese(chinese, fake_gpu) -> None:  # noqa: ANN001
    assert math_change("amp", Levers(amp=True)) == "amp 有意改变了舍入"
    assert "学习率在 8 步内预热到 0.0006" in str(Regime(lr=6e-4, min_lr=6e-5, warmup=8))
    counts = compile_cache_label(Levers(compile=True), (0, 0), (0, 3))
    assert counts == "冷缓存（编译了 3 个图）"
    assert lever_available("graphs", "cpu") == (False, "CUDA 图需要 CUDA 或 ROCm GPU，而这里是 cpu")
    fake_gpu("h100_sxm")
    ratio = recipe_ratio("cuda", BIG, 16, 629_617)
    assert ratio == "最终配置的吞吐量是公开方案的 1.10 倍（629,617 对 572,379 tokens/s）", ratio


STEP_S = {"baseline": 0.010, "resident": 0.0099, "sdpa": 0.008, "resident + sdpa": 0.006}


def make_trainer(levers: Levers = Levers()) -> Trainer:
    """The tiny GPT on the first 3,000 bytes of text: batch 4, 2 steps an interval."""
    tokens = text_bytes()[:3000]
    return Trainer(TINY, levers, tokens, device="cpu", batch_size=4, interval=2, steps=3)


def scripted_measure(trainer: Trainer) -> LeverRow:
    """A stand-in for measure_trainer: the step time from STEP_S, the real first losses."""
    measured = row(trainer.levers.label(), step_s=STEP_S[trainer.levers.label()], spread=0.01)
    measured.first_losses = trainer.losses(4)
    return measured


def test_the_lever_search_prints_chinese(chinese, capsys) -> None:
    search = LeverSearch(make_trainer, scripted_measure)
    assert search.best.kept == "基线"
    search.try_lever("sdpa")
    search.try_lever("tf32")  # no TF32 on a CPU
    out = capsys.readouterr().out
    assert (
        "sdpa：保留：在每步 10 ms 时，速度是不用它时的 1.25 倍（噪声 ±2%）；目前的速度是基线的 1.25 倍"
        in out
    )
    assert "tf32：在这里跳过：TF32 需要计算能力 8.0 及以上的 NVIDIA GPU" in out, out
    assert search.ablate(("resident", "sdpa")) is True
    out = capsys.readouterr().out
    # a lever combination and the baseline named in Chinese wherever shown (learner 32)
    assert "第 1 轮消融：常驻设备的张量 + sdpa 胜过最终配置，速度是后者的 1.33 倍" in out, out
    assert "第 2 轮消融：开启或关闭任何一个优化手段都没有胜过最终配置" in out, out
    assert search.ablation[0].kept == "最终配置（第 1 轮）"
    assert search.not_shown_to_help() == []  # kept levers are told apart in Chinese too
    verdict = search.final_verdict()
    assert verdict.replace(" 的", "的").replace("是 ", "是") == (
        "在这台机器上，常驻设备的张量 + sdpa的速度是基线的 1.67 倍"
    ), verdict  # how verdicts space a Chinese row name is helpers.verdicts' choice
    assert [r["levers"] for r in search.table()] == ["基线", "sdpa"]  # the keys stay English
    changes = [r["change"] for r in search.ablation_table()]
    assert "- 常驻设备的张量" in changes or "+ 常驻设备的张量" in changes, changes
    labels = [r.check.label for r in search.rows + search.ablation if r.check is not None]
    assert "sdpa 对比 基线" in labels, labels  # the same-math checks' names
    assert all(" vs " not in label and "baseline" not in label for label in labels), labels
    figure = plot_levers(search.rows)
    colors = [p.get_facecolor()[:3] for p in figure.axes[0].patches]
    assert len(set(colors)) == 2  # the kept lever stands out
    ticks = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert "基线" in ticks and "baseline" not in ticks, ticks


def test_english_is_back_after_chinese() -> None:
    set_language("zh_CN")
    set_language("en")
    keep, text = keep_verdict(row("sdpa + amp", step_s=0.009), row("sdpa", step_s=0.01))
    assert text == "kept: 1.11x faster than without it at a 10 ms step (noise ±2%)"


# --------------------------------------------------------------------------- attention timing


def test_the_cpu_sweep_plan_reads_in_chinese(chinese) -> None:
    plan = tm.sweep_plan("cpu", lengths=[32, 64])
    text = str(plan)
    assert text.startswith(
        "cpu：批大小 1 x 4 个头 x head_dim 64，float32（CPU：fp32，它的快速格式）"
    )
    assert "因果；T = 32, 64；方法：sdpa default, pytorch tiles, written out" in text, text
    assert any(n.startswith("没有峰值内存列") for n in plan.notes), plan.notes


def test_a_failing_method_is_noted_in_chinese(chinese, monkeypatch) -> None:  # noqa: ANN001
    plan = tm.sweep_plan("cpu", lengths=[16])

    def broken(q, k, v):  # noqa: ANN001
        raise RuntimeError("no kernel for this dtype")

    monkeypatch.setattr(tm, "method_function", lambda name, device: broken)
    note = tm._time_one(plan, "pytorch tiles", 16, 0.01)["note"]
    assert note == "没能运行：no kernel for this dtype", note
    checked = tm.check_methods(plan, t=16)
    assert plan.skips[("written out", 16)] == "在检查中没能运行" and len(checked) == 3
    assert "跳过 T = 16 时的 written out：在检查中没能运行" in str(plan)


def test_triton_verdicts_in_chinese_carry_the_ratio(chinese) -> None:
    rows = [
        {"row": f"{m} @ 2048", "T": 2048, "method": m, "ms": ms, "IQR ms": 0.01}
        for m, ms in (("triton", 1.0), ("sdpa flash", 1.5), ("pytorch tiles", 3.0))
    ]
    verdicts = [str(v) for v in tm.triton_verdicts(rows)]
    assert verdicts == [
        "在这台机器上，triton @ 2048 的速度是 sdpa flash @ 2048 的 1.50 倍",
        "在这台机器上，triton @ 2048 的速度是 pytorch tiles @ 2048 的 3.00 倍",
    ], verdicts
    assert all(CJK.search(v) for v in verdicts)


def test_the_gpu_plan_explains_a_skip_in_chinese(chinese, monkeypatch, fake_gpu) -> None:  # noqa: ANN001
    status = TritonStatus(False, "unavailable", "no triton here")
    monkeypatch.setattr(tm, "triton_status", lambda device: status)
    plan = tm.sweep_plan(fake_gpu("t4").device)
    assert plan.dtype == torch.float16 and "没有原生 bf16" in plan.why_dtype
    why = plan.skips[("written out", 8192)]
    assert re.fullmatch(r"需要约 [\d.]+ GiB，超过总内存的 60%", why), why
    assert any(n.startswith("未对 triton 计时") and "no triton here" in n for n in plan.notes)
