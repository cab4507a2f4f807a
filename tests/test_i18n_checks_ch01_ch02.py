"""The chapter 1 and 2 checkers speak Simplified Chinese after set_language("zh_CN"), numbers kept."""

from __future__ import annotations

import os
import re

import numpy as np
import torch

from helpers.checks import FAIL, PASS, ch01, ch02
from helpers.devices import DEVICE_ENV

CJK = re.compile(r"[\u4e00-\u9fff]")


# --- chapter 1 ------------------------------------------------------------------------------


def gflops_from_mean(m: int, k: int, n: int, result) -> float:  # noqa: ANN001
    return 2 * m * k * n / (sum(result.times) / len(result.times)) / 1e9


def test_a_mean_time_gflops_is_explained_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch01.check_achieved_gflops(gflops_from_mean)
    out = capsys.readouterr().out
    assert result.status == FAIL and CJK.search(out), out
    assert out.startswith(
        "❌ 练习 4，根据基准测试计算实际达到的 GFLOP/s：[探针：m, k, n = 3, 5, 7，耗时 "
    )
    # 210 FLOPs over the median 5.5 us, and over the mean 11.25 us
    assert "期望 0.0381818 GFLOP/s，实际得到 0.0186667：你用了平均耗时" in out, out
    assert "result.median" in out


def pick_forgets_mps(prefer: str | None = None) -> torch.device:
    if prefer:
        return torch.device(prefer)
    forced = os.environ.get(DEVICE_ENV)
    if forced:
        return torch.device(forced)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def test_a_picker_without_mps_names_the_machine_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch01.check_pick_device(pick_forgets_mps)
    out = capsys.readouterr().out
    assert result.status == FAIL and CJK.search(out), out
    assert "[探针：未强制指定，在一台 MPS 机器上] " in out, out
    assert "期望得到设备 device(type='mps')，实际得到 device(type='cpu')。" in out, out
    assert "torch.backends.mps.is_available()" in out and "加速器" in out


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def test_a_right_to_numpy_is_correct_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch01.check_to_numpy(to_numpy)
    out = capsys.readouterr().out
    assert result.status == PASS, out
    assert out == "✅ 练习 5，适用于任何张量的 to_numpy：正确。\n", out


def test_english_is_back_after_chinese(capsys) -> None:  # noqa: ANN001
    ch01.check_achieved_gflops(gflops_from_mean)
    out = capsys.readouterr().out
    assert not CJK.search(out), out
    assert "expected 0.0381818 GFLOP/s, got 0.0186667: you used the mean time" in out, out


# --- chapter 2 ------------------------------------------------------------------------------


def fastest_ignoring_the_cap(rows, memory_cap):  # noqa: ANN001, ANN201
    return max(rows, key=lambda r: r["samples/s"])["batch size"]


def test_a_batch_size_over_the_cap_is_explained_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch02.check_fastest_batch_size(fastest_ignoring_the_cap)
    out = capsys.readouterr().out
    assert result.status == FAIL and CJK.search(out), out
    assert out == (
        "❌ 练习 4：内存上限下最快的批大小："
        "上限为 128 MiB 时答案是 1024（4096 需要 400 MiB），实际得到 4096。\n"
    ), out


def batches_dropping_the_last(x, y, batch_size, generator):  # noqa: ANN001, ANN201
    if batch_size <= 0:
        raise ValueError("batch_size must be positive")
    perm = torch.randperm(len(x), generator=generator).to(x.device)
    for start in range(0, len(x) - batch_size + 1, batch_size):
        idx = perm[start : start + batch_size]
        yield x[idx], y[idx]


def test_a_dropped_last_batch_is_explained_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch02.check_resident_batches(batches_dropping_the_last)
    out = capsys.readouterr().out
    assert result.status == FAIL and CJK.search(out), out
    assert "100 个样本按 32 一批，批大小应依次为 [32, 32, 32, 4]，实际是 [32, 32, 32]。" in out, out
    assert out.startswith("❌ 练习 3：常驻张量的批次迭代器："), out


def fastest_batch_size(rows, memory_cap):  # noqa: ANN001, ANN201
    fits = [r for r in rows if r["peak memory"] <= memory_cap]
    if not fits:
        raise ValueError("no row fits under the memory cap")
    return max(fits, key=lambda r: (r["samples/s"], -r["batch size"]))["batch size"]


def test_a_right_batch_size_is_correct_in_chinese(chinese, capsys) -> None:  # noqa: ANN001
    result = ch02.check_fastest_batch_size(fastest_batch_size)
    out = capsys.readouterr().out
    assert result.status == PASS, out
    assert out == "✅ 练习 4：内存上限下最快的批大小：正确。\n", out
