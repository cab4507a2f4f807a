"""The chapter 7 checkers speak Simplified Chinese after set_language("zh_CN"), numbers kept."""

from __future__ import annotations

import math
import re

import torch

from helpers.checks import FAIL
from helpers.checks.ch07 import (
    check_causal_attention,
    check_flops_per_token,
    check_largest_gpt_batch,
)
from helpers.gpt import GPTConfig, flops_per_token, make_gpt

CJK = re.compile(r"[\u4e00-\u9fff]")


def attention_off_by_a_quarter(q, k, v):
    """A written-out causal attention whose output is 0.25 too large everywhere."""
    t = q.size(-2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v + 0.25


def forward_only(model):
    """The forward pass's FLOPs only: 2N + 4 * n_layer * seq_len * d_model."""
    cfg = model.cfg
    n = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    return 2 * n + 4 * cfg.n_layer * cfg.seq_len * cfg.d_model


def test_a_wrong_attention_is_explained_in_chinese(chinese, capsys) -> None:
    result = check_causal_attention(attention_off_by_a_quarter)
    out = capsys.readouterr().out
    assert result.status == FAIL
    assert out.startswith("❌ 练习 1，因果注意力：[探针：fp32] "), out
    assert "相差最多 0.25" in out and CJK.search(result.message), out


def test_a_wrong_flop_count_is_explained_in_chinese_with_its_numbers(chinese, capsys) -> None:
    model = make_gpt(GPTConfig())
    want, got = flops_per_token(model), forward_only(model)
    result = check_flops_per_token(forward_only)
    out = capsys.readouterr().out
    assert result.status == FAIL
    assert out.startswith("❌ 练习 2，每个 token 的 FLOPs："), out
    assert f"你返回了 {got:,}，应为 {want:,}：你只算了前向传播" in out, out
    assert "反向传播" in result.message and CJK.search(result.message)


def test_a_wrong_largest_batch_is_explained_in_chinese(chinese, capsys) -> None:
    result = check_largest_gpt_batch(lambda cfg, budget: 0)
    out = capsys.readouterr().out
    assert result.status == FAIL
    assert out.startswith("❌ 练习 4，能放下的最大批大小：[探针："), out
    assert re.search(r"预算 [\d,]+ 字节\] 你返回了 0，应为 37：", out), out


def test_a_right_flop_count_passes_in_chinese(chinese, capsys) -> None:
    assert check_flops_per_token(flops_per_token).passed
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "✅ 练习 2，每个 token 的 FLOPs：正确。", lines
    assert re.search(r"每个 token [\d,]+ FLOPs；估算值 [\d,]+ 比它[高低] [\d.]+%", lines[1]), lines


def test_english_is_back_after_the_fixture(capsys) -> None:
    assert check_flops_per_token(flops_per_token).passed
    assert capsys.readouterr().out.startswith("✅ Exercise 2, FLOPs per token: correct.")


def test_the_math_kernel_ban_is_explained_in_chinese(chinese, capsys) -> None:
    def calls_the_math_kernel(q, k, v):
        return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, is_causal=True)[0]

    result = check_causal_attention(calls_the_math_kernel)
    out = capsys.readouterr().out
    assert result.status == FAIL
    assert "PyTorch 自带的注意力算子（aten _scaled_dot_product_attention_math）" in out, out
