"""What the multi-process, capstone and attention helpers (and the torchrun scripts' own lines)
show a learner reads in Simplified Chinese after set_language("zh_CN"): errors, summaries,
verdicts, table titles, plot texts and widget labels; numbers, units and identifiers kept.

Each output is checked as the Chinese notebooks print it: Chinese in it, and no run of three
English words (tools/english_share.py's measure). The scripts' lines are built by the same
functions the ranks call, here in one process: a launch costs seconds and changes nothing in
the words. English comes back with set_language("en") (the `chinese` fixture, conftest.py).
"""

from __future__ import annotations

import re
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import helpers.attention_errors as ae
import helpers.attention_tiles as tiles
import helpers.attention_timing as tm
import helpers.attention_triton as at
import helpers.capstone as cap
import helpers.comm_overlap as co
import helpers.dp_by_hand as dbh
import helpers.flash_attention as fa
import helpers.launch as la
import helpers.scaling_sweep as ss
import helpers.sharding as sh
from helpers.gpt import GPTConfig
from helpers.i18n import set_language, tr
from helpers.scripts import (
    capstone_ddp,
    common,
    ddp_train,
    fsdp_by_hand,
    fsdp_vs_ddp,
    one_launch,
    zero1_by_hand,
)
from helpers.scripts import dp_by_hand as dp_script
from helpers.scripts import scaling as scaling_script

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import translate  # noqa: E402
from english_share import ENGLISH_RUN  # the measure of an English line

CJK = re.compile(r"[\u4e00-\u9fff]")
#: The modules this file covers (helpers.scripts: every torchrun script).
MODULES = (
    "helpers.launch", "helpers.processes", "helpers.scaling_sweep", "helpers.dp_by_hand",
    "helpers.comm_overlap", "helpers.sharding", "helpers.capstone", "helpers.gpt",
    "helpers.attention_errors", "helpers.attention_tiles", "helpers.attention_timing",
    "helpers.attention_triton", "helpers.flash_attention", "helpers.scripts",
)  # fmt: skip


def chinese_text(text: str, quoted: tuple[str, ...] = ()) -> str:
    """`text` if it reads as Chinese: Chinese in it, no three English words in a row.

    `quoted`: English the message quotes on purpose (torch's or Python's own error text, a
    file path); `code spans` and pip commands are commands, left as they are.
    """
    plain = re.sub(r"`[^`]*`|pip install [\w.\[\]-]+", " ", str(text))  # commands
    for q in quoted:
        plain = plain.replace(q, " ")
    assert CJK.search(plain), text
    run = ENGLISH_RUN.search(plain)
    assert run is None, f"{run.group(0)!r} in {text!r}"
    return str(text)


def my_messages() -> list[tuple[str, str]]:
    """(module, English) of every tr()/tr_mark() message of these modules."""
    return [
        (module, msgid)
        for module, ids in translate.helper_messages().items()
        if any(module == m or module.startswith(m + ".") for m in MODULES)
        for msgid in ids
    ]


MESSAGES = my_messages()


@pytest.mark.parametrize(("module", "msgid"), MESSAGES, ids=[f"{m}:{i[:40]}" for m, i in MESSAGES])
def test_every_message_of_these_modules_reads_as_chinese(chinese, module: str, msgid: str) -> None:  # noqa: ANN001
    if not re.search(r"[A-Za-z]{2,}", re.sub(r"\{[^{}]*\}", "", msgid)):
        return  # punctuation around placeholders ('{failures}.'): nothing to read
    text = tr(msgid)
    assert text != msgid, f"{module}: {msgid!r} has no translation"
    # placeholders hold numbers and names at run time: a digit, not a word
    chinese_text(re.sub(r"\{[^{}]*\}", "0", text))


def test_english_comes_back() -> None:
    set_language("zh_CN")
    try:
        assert "进程" in ss.tr("processes (ranks)")
    finally:
        set_language("en")
    assert tr("processes (ranks)") == "processes (ranks)"


# ------------------------------------------------------------------------ launch (chapter 4)


def test_refused_launch_requests_in_chinese(chinese, fake_gpu, tmp_path: Path) -> None:  # noqa: ANN001
    with pytest.raises(FileNotFoundError) as missing:
        la.script_path("no_such_script")
    assert "没有脚本 'no_such_script'" in chinese_text(missing.value)
    with pytest.raises(la.LaunchError) as no_function:
        la.script_source("manual_allreduce", "nothing_here")
    assert "manual_allreduce.py 中没有名为" in chinese_text(no_function.value)
    for jobs in ([], [("ddp_train", "--out x")]):
        with pytest.raises(la.LaunchError) as bad_jobs:
            la.one_launch_args(jobs)
        chinese_text(bad_jobs.value, quoted=("script name, [its options]", "--out x"))
    with pytest.raises(la.LaunchError) as unknown:
        la.check_backend("mpi")
    assert "未知的后端 'mpi'" in chinese_text(unknown.value)
    with pytest.raises(la.LaunchError) as too_many:
        la.check_nproc(10_000, "gloo")
    assert "nproc=10000 超过了这台机器允许的数目" in chinese_text(too_many.value)
    with pytest.raises(la.LaunchError) as zero:
        la.check_nproc(0, "gloo")
    assert "它是要启动的进程（rank）数" in str(zero.value)  # after helpers.validate's words
    with pytest.raises(la.LaunchError) as rendezvous:
        la.torchrun_command("train.py", 2)
    assert "主机" in chinese_text(rendezvous.value)
    with pytest.raises(la.LaunchError) as restarts:
        la.launch("manual_allreduce", 2, backend="gloo", max_restarts=-1)  # refused before it runs
    assert "max_restarts 必须是 >= 0 的整数" in chinese_text(restarts.value)
    with pytest.raises(la.LaunchError) as nothing:
        la.read_results(tmp_path)
    chinese_text(nothing.value, quoted=(str(tmp_path),))
    (tmp_path / "rank0.pt").write_bytes(b"")
    with pytest.raises(la.LaunchError) as count:
        la.read_results(tmp_path, world_size=2)
    assert "应有 2 个 rank 结果文件，实际找到 1 个" in chinese_text(count.value, (str(tmp_path),))
    fake_gpu("h100_sxm", count=1)  # NCCL: one GPU per rank, and torch sees one
    with pytest.raises(la.LaunchError) as nccl:
        la.check_nproc(2, "nccl")
    assert "nccl 需要每个 rank 一块 GPU，而 torch 看到 1 块" in chinese_text(nccl.value)


def result(returncode: int = 0, **state: object) -> la.LaunchResult:
    """A LaunchResult with made-up figures."""
    res = la.LaunchResult(command=[], nproc=2, backend="gloo", returncode=returncode, seconds=4.2)
    for key, value in state.items():
        setattr(res, key, value)
    return res


def report(*failures: tuple[int, int], errors: dict[int, str]) -> list[str]:
    """torchrun's final report of these (rank, exit code) failures, the first the root cause."""
    lines = [f"[rank{r}]: {e}" for r, e in errors.items()] + ["Failures:"]

    def entry(rank: int, code: int) -> list[str]:
        return [f"  rank      : {rank} (local_rank: {rank})", f"  exitcode  : {code} (pid: 1)"]

    for rank, code in failures[1:]:
        lines += entry(rank, code)
    return [*lines, "Root Cause (first observed failure):", *entry(*failures[0])]


def test_a_launch_and_its_failures_are_told_in_chinese(chinese) -> None:  # noqa: ANN001
    assert str(result(lines=["a"])) == "torchrun，2 x gloo：成功，退出码 0，4.2 s，输出 1 行"
    failed = chinese_text(result(1))
    assert failed.startswith("torchrun，2 x gloo：失败，退出码 1")
    with pytest.raises(la.LaunchError) as no_job:
        result().job_lines("ddp_train")
    assert "这次启动中没有任务 'ddp_train'" in chinese_text(no_job.value)
    assert "已杀掉 torchrun" in chinese_text(la.explain_failure(result(interrupted=True), 60))
    assert "到达 60 s 超时后停止" in chinese_text(la.explain_failure(result(timed_out=True), 60))
    assert "有一个 rank 失败了" in chinese_text(la.explain_failure(result(1), 60))
    lost = "RuntimeError: timeout"  # a rank that lost its peer (torch's own words stay English)
    one = la.explain_failure(result(1, lines=report((1, 3), (0, -15), errors={0: lost})), 60)
    assert "rank 1 最先失败（退出码 3），没有 Python 回溯" in chinese_text(one)
    assert "其余 rank 随后失去了对端（rank 0: RuntimeError: timeout）。" in one
    two = la.explain_failure(result(1, lines=report((0, -6), (1, 3), errors={0: lost})), 60)
    assert "rank 0 和 1 都在 torchrun 查看之前失败了" in chinese_text(two)
    assert "rank 1 很可能最先失败（退出码 3）" in two and "rank 0（退出码 -6），报错 " in two
    bad = {0: "ValueError: bad", 1: "ValueError: bad"}
    both = la.explain_failure(result(1, lines=report((1, 1), (0, 1), errors=bad)), 60)
    assert "rank 1 失败（退出码 1），报错 ValueError: bad；rank 0 失败" in chinese_text(both)
    shown: list[str] = []
    echo = la._HideLauncherTraceback(shown.append)
    for line in ("Traceback (most recent call last):", '  File "<frozen runpy>", line 1', "x", "====="):  # fmt: skip
        echo(line)
    assert chinese_text(shown[0]) == "（已隐藏 torchrun 自身的回溯；其报告如下）"


# ------------------------------------------------------------------ the scaling sweep (chapter 4)


def scaling_result() -> ss.ScalingResult:
    """Two process counts, measured in one made-up launch."""
    rows = [
        {"processes": n, "samples/s": 100.0 * n * 0.9 ** (n - 1), "efficiency": 0.9 ** (n - 1)}
        for n in (1, 2)
    ]
    return ss.ScalingResult("processes", rows, startup_s=1.5, launch_s=6.0)


def test_the_scaling_summary_plot_and_widgets_in_chinese(chinese) -> None:  # noqa: ANN001
    last = str(scaling_result()).splitlines()[-1]
    assert chinese_text(last) == "一次启动 2 个 rank：6.0 s 中有 1.5 s 用于启动"
    with pytest.raises(ValueError) as bad:
        ss.measure_scaling([])
    chinese_text(bad.value)
    fig = ss.plot_scaling(scaling_result())
    a, b = fig.axes
    texts = [a.get_title(), a.get_xlabel(), b.get_title(), b.get_ylabel()]
    texts += [t.get_text() for t in a.get_legend().get_texts()]
    assert texts[:3] == ["吞吐量", "进程数（rank）", "扩展效率"]
    for text in texts:
        chinese_text(text)
    labels = [w.description for w in ss.scaling_controls(2).values()]
    assert labels == ["进程数 ≤", "批大小/rank", "宽度", "步数"]


def test_column_names_stay_keys_and_translate_where_shown(chinese) -> None:  # noqa: ANN001
    rows = scaling_result().rows
    assert "processes" in rows[0] and "samples/s" in rows[0]  # what the notebook looks up
    assert [tr(c) for c in ("processes", "global batch", "step spread")] == ["进程数", "全局批大小", "每步波动（IQR/中位数）"]  # fmt: skip
    assert tr(dbh.WAY_NAMES["flat"]) == "(b) 一次展平全归约" and dbh.WAY_NAMES["flat"] == "(b) one flat all-reduce"  # fmt: skip


# ------------------------------------------------------- data parallelism by hand (chapter 8)


def dp_result() -> dict:
    """A dp_by_hand result of rank 0: t(n) = 100 µs + 1 ns per byte, a sweep of three caps."""
    mib = 2**20
    step = {"comm": [(0.002, 0.004)], "compute": [(0.001, 0.003)], "backward s": 0.003, "sizes": [mib, 3 * mib]}  # fmt: skip
    way = {"step median s": 0.01, "step IQR s": 0.001, "instrumented": [step], "first step sizes": [4 * mib]}  # fmt: skip
    return {
        "world_size": 2,
        "device": "cpu",
        "ways": {w: dict(way) for w in dbh.WAY_NAMES},
        "allreduce": [
            {"bytes": n, "step median s": 1e-4 + n * 1e-9, "step IQR s": 1e-5}
            for n in (4096, 65536, mib, 4 * mib)
        ],
        "backward order bytes": [mib] * 4,
        "bucket sweep": [
            {
                "cap bytes": c * mib,
                "buckets": 4 // c,
                "step median s": t,
                "step IQR s": 1e-4,
                "wait median s": 1e-3,
            }  # fmt: skip
            for c, t in ((1, 0.010), (2, 0.009), (4, 0.011))
        ],
        "ddp default cap sizes": [mib, 3 * mib],
    }


def test_the_alpha_beta_model_and_the_bucket_verdict_in_chinese(chinese) -> None:  # noqa: ANN001
    result = dp_result()
    rows, fit = dbh.allreduce_fit(result)
    line = chinese_text(dbh.fit_line(fit, 2))
    assert line.startswith(
        "alpha = 每次调用 100.0 µs，beta = 每字节 1.000 ns（1/beta = 缓冲区 1.00 GB/s"
    )
    assert line.endswith("该模型描述了这台机器")
    sweep = dbh.bucket_rows(result, fit)
    assert [tr(r["note"]) for r in sweep] == ["", "", "全部放进一个桶"]
    verdict = chinese_text(dbh.predicted_vs_best(sweep, dbh.model_bucket(result, fit)), ("s* = G sqrt(alpha / B)",))  # fmt: skip
    assert (
        "实测最佳：桶上限 2.00 MiB（2 个桶，每步 9.00 ms）；与次佳的桶上限 1.00 MiB 相比："
        in verdict
    )
    assert "桶上限 2.00 MiB 的速度是桶上限 1.00 MiB 的 1.11 倍" in verdict, verdict
    assert verdict.endswith("；扫描中最接近模型取值的上限正是次佳的")
    assert chinese_text(dbh.predicted_vs_best(sweep, None)).endswith("；没有可比较的模型")
    model = {"rule": "s", "bytes": 2**20, "cap bytes": 2**20, "buckets": 1, "G bytes": 2**20, "B s": 1e-3, "wait s": 1e-4}  # fmt: skip
    close = [{"cap MiB": c, "buckets": 1, "step ms": ms, "IQR ms": 1.0} for c, ms in ((2, 10.0), (4, 10.4), (1, 10.5))]  # fmt: skip
    said = chinese_text(dbh.predicted_vs_best(close, model))
    assert "；扫描中最接近模型取值的上限 1.00 MiB 与最佳的相比：" in said and "难分高下" in said, (
        said
    )
    result["allreduce"][0]["step median s"] = 1e-3  # one size far off the line: a rough guide
    rough_fit = dbh.allreduce_fit(result)[1]
    missed = chinese_text(dbh.fit_line(rough_fit, 2))
    assert "在 4 个大小中，直线在 4 个上的偏差超过了重复测量的波动：4.00 KiB 偏离 0.869 ms（IQR 0.01 ms）" in missed  # fmt: skip
    assert missed.endswith("下面模型给出的桶大小只是粗略的参考，以实测的扫描为准")
    rough = dbh.predicted_vs_best(dbh.bucket_rows(result, rough_fit), dbh.model_bucket(result, rough_fit))  # fmt: skip
    assert chinese_text(rough, ("s* = G sqrt(alpha / B)",)).endswith(
        "模型只是粗略的参考，以扫描的实测为准"
    )
    negative = {"alpha s": -1e-4, "beta s/B": 1e-9, "worst gap": 0.5, "fits": False}
    no_line = chinese_text(dbh.fit_line(negative, 2), ("t = alpha + n beta",))
    assert "今天描述不了这台机器，不做预测" in no_line and "每次调用的固定开销为负" in no_line
    flat = {"alpha s": 1e-4, "beta s/B": -1e-12, "worst gap": 0.5, "fits": False}
    chinese_text(dbh.fit_line(flat, 2), ("t = alpha + n beta",))
    assert [tr(c) for c in ("backward ms", "backward IQR ms", "stretch ms")] == ["反向 ms", "反向 IQR ms", "反向拉长 ms"]  # fmt: skip
    buckets = chinese_text(dbh.ddp_bucket_line(result))
    assert buckets == (
        "DDP 的全归约，第一步：[4.00] MiB；重建之后：[1.00, 3.00] MiB；"
        "在默认上限（bucket_cap_mb=None）下，重建之后：[1.00, 3.00] MiB"
    )


def test_the_peak_breakdown_and_the_overlap_plot_in_chinese(chinese) -> None:  # noqa: ANN001
    at = {"op": "", "from before": 100, "made in the step": [(sh.RESIZED, 40), ("aten.empty_like", 20)]}  # fmt: skip
    parts = chinese_text(dbh.peak_parts(at, 160))
    assert parts == "160 B，在 一次原地 resize 中达到峰值 = 该步之前已有的 100 + 40 (就地重新扩大), 20 (empty_like)"  # fmt: skip
    assert chinese_text(dbh.peak_parts(None, 160)) == "160 B（CUDA 分配器的峰值：没有按张量的细分）"
    assert chinese_text(sh.LiveBytes("cpu").how) == "存活张量的存储（一个 dispatch mode）"
    fig = dbh.plot_overlap(dp_result(), ("ddp", "bucketed"))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["(d) 分桶并重叠", "DDP"]
    assert ax.get_title() == "cpu 上 2 个 rank 的一步"
    for text in [ax.get_xlabel(), *(t.get_text() for t in ax.get_legend().get_texts())]:
        chinese_text(text)


@pytest.mark.parametrize(
    "call",
    [
        lambda: co.merge_spans([(2.0, 1.0)]),
        lambda: co.plan_buckets([4], 0),
        lambda: co.plan_buckets([-1], 4),
        lambda: co.ring_wire_bytes(8, 0),
        lambda: co.fit_alpha_beta([1.0], [1.0]),
        lambda: co.fit_alpha_beta([1.0, 2.0], [0.0, 1.0]),
        lambda: co.collective("all_to_all"),
        lambda: co.shard_bounds(-1, 2, 0),
        lambda: co.shard_bounds(8, 2, 2),
        lambda: sh.wire_bytes("broadcast", 8, 2),
    ],
)
def test_the_overlap_and_sharding_arithmetic_refuse_in_chinese(chinese, call) -> None:  # noqa: ANN001
    with pytest.raises(ValueError) as refused:
        call()
    chinese_text(refused.value)


# ---------------------------------------------------------------------- the capstone (chapter 7)


def lever_row(label: str, kept: str = "", peak: float | None = None) -> cap.LeverRow:
    """A LeverRow with made-up figures."""
    return cap.LeverRow(label, 0.01, 0.02, 1000.0, 1.0, peak, 0.1, [5.0], kept=kept)


def test_the_capstone_tables_plot_and_errors_in_chinese(chinese) -> None:  # noqa: ANN001
    assert cap.LEVER_TITLES["resident"] == "数据常驻设备，每个区间同步一次（第 2 章）"
    assert list(cap.LEVER_TITLES)[0] == "resident" and "resident" in cap.LEVER_TITLES  # keys stay
    for name in cap.LEVER_TITLES:
        if name not in ("sdpa", "compile"):  # API names
            chinese_text(cap.LEVER_TITLES[name], ("fused AdamW",))
    row = lever_row("baseline").as_row()
    assert (
        row["peak MiB"] == "不适用"
        and row["MFU datasheet"] == "不适用"
        and cap.percent(0.5) == "50.0%"
    )
    assert tr("kept?") == "保留？" and tr("MFU datasheet") == "MFU（数据手册）"
    fig = cap.plot_levers([lever_row("baseline", "基线"), lever_row("sdpa", cap.tr(cap.KEPT))])
    ax = fig.axes[0]
    assert ax.get_xlabel() == "tokens/s（中位数）" and chinese_text(ax.get_title())
    assert cap.describe_sdpa_kernel([]) == "math（未融合的参考实现）"
    assert cap.describe_sdpa_kernel(["aten::_scaled_dot_product_flash_attention_for_cpu"]) == "flash（CPU 内核）"  # fmt: skip
    chinese_text(cap.NANOGPT_H100, ("NVIDIA H100 80GB HBM3",))
    with pytest.raises(ValueError) as unknown:
        cap.check_lever("turbo")
    assert "未知的优化手段 'turbo'" in str(unknown.value)
    with pytest.raises(ValueError) as two:
        cap.changed_lever(cap.Levers(), cap.Levers(sdpa=True, amp=True))
    chinese_text(two.value)
    with pytest.raises(ValueError) as cannot:
        cap.Trainer(GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=8), cap.Levers(tf32=True), torch.zeros(100, dtype=torch.long), device="cpu", batch_size=2)  # fmt: skip
    assert "优化手段 'tf32' 无法在 cpu 上运行：TF32 需要" in chinese_text(cannot.value)
    with pytest.raises(ValueError) as orphan:
        cap.LeverSearch.change_of(None, lever_row("sdpa"))  # type: ignore[arg-type]
    assert "没有可供比较的上一个配置" in chinese_text(orphan.value)


def test_the_capstone_ratios_read_one_way(chinese) -> None:  # noqa: ANN001
    best = cap.LeverRow("sdpa", 0.01, 0.0, 1000.0, 1.0, None, 0.1, [5.0])
    keep, text = cap.keep_verdict(replace_step(best, 0.008), best)
    assert keep and text == "保留：在每步 10 ms 时，速度是不用它时的 1.25 倍（噪声 ±2%）", text
    assert cap.is_kept(text)
    _, text = cap.keep_verdict(replace_step(best, 0.0125), best)
    assert text == "舍弃：在每步 10 ms 时，耗时是不用它时的 1.25 倍（噪声 ±2%）", text
    _, text = cap.removal_verdict("resident", replace_step(best, 0.008), best)
    assert text == "移除 常驻设备的张量：不用它时的速度是用它时的 1.25 倍（噪声 ±2%）", text
    _, text = cap.removal_verdict("resident", replace_step(best, 0.0125), best)
    assert text == "常驻设备的张量 保留：在每步 12.5 ms 时，速度是不用它时的 1.25 倍（噪声 ±2%）", (
        text
    )


def replace_step(row: cap.LeverRow, step_s: float) -> cap.LeverRow:
    """`row` with another step time, as the row of another configuration."""
    return replace(row, step_s=step_s, label=row.label + " + amp")


def test_gpt_config_errors_in_chinese(chinese) -> None:  # noqa: ANN001
    with pytest.raises(ValueError) as heads:
        GPTConfig(d_model=10, n_head=4)
    assert "d_model（10）必须是 n_head（4）的倍数" in str(heads.value)
    with pytest.raises(ValueError) as attention:
        GPTConfig(attention="flash")
    chinese_text(attention.value)


# ------------------------------------------------------------------- attention (chapter 8)


def test_the_attention_gallery_checks_and_plots_in_chinese(chinese) -> None:  # noqa: ANN001
    rows = ae.bug_gallery(shape=(1, 1, 40, 16))
    assert [r["planted bug"] for r in rows][:2] == ["P @ V 之前把 P 舍入到 fp16", "用舍入到 fp16 的 O 计算 D"]  # fmt: skip
    for r in rows:
        chinese_text(r["planted bug"])
    assert ae.OUT_SHARE in rows[0] and tr(ae.OUT_SHARE) == "out：误差 / (2 x 界)"
    with pytest.raises(ValueError) as dtype:
        ae.allowed_factor(torch.float64)
    chinese_text(dtype.value, ("float16, bfloat16",))
    with pytest.raises(ValueError) as stale:
        ae.plant(fa.flash_forward, "no such line", "x")
    chinese_text(stale.value, ("no such line",))
    with pytest.raises(ValueError) as slope:
        tiles.loglog_slope([1.0], [1.0])
    chinese_text(slope.value)
    with pytest.raises(ValueError) as length:
        tiles.saved_bytes_sweep({}, [0])
    assert "每个序列长度" in str(length.value)
    saved = [{"T": t, "tiles MiB": t / 1024} for t in (128, 256)]
    ax = tiles.plot_saved_bytes(saved).axes[0]
    for text in (ax.get_xlabel(), ax.get_ylabel(), ax.get_title()):
        chinese_text(text)
    bad = torch.zeros(2, 3)
    with pytest.raises(TypeError) as not_tensors:
        fa.flash_forward("q", bad, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError) as shape:
        fa.flash_forward(bad, bad, bad)
    for exc in (not_tensors, shape):
        chinese_text(exc.value)


def test_the_attention_timing_tables_and_plot_in_chinese(chinese) -> None:  # noqa: ANN001
    plan = tm.SweepPlan(torch.device("cpu"), torch.float32, 1, 2, 64, (128, 256), ("written out", "triton"))  # fmt: skip
    rows = [
        {"row": f"{m} @ {t}", "T": t, "method": m, "ms": 0.1 * t, "peak MiB": 1e-3 * t * t}
        for m in ("written out", "triton")
        for t in (128, 256)
    ]
    checks = tm.peak_checks(plan, rows)
    assert checks[0]["rule"] == ">= 一个 T x T 的分数张量"
    for check in checks:
        chinese_text(check["rule"])
    fig = tm.plot_attention_timing(rows)
    t_ax, m_ax = fig.axes
    assert [t_ax.get_title(), m_ax.get_title()] == ["时间（中位数）", "显存"]
    for text in (t_ax.get_xlabel(), t_ax.get_ylabel(), m_ax.get_ylabel()):
        chinese_text(text)
    with pytest.raises(ValueError) as unknown:
        tm.method_function("magic", torch.device("cpu"))
    assert str(unknown.value).startswith("未知的方法 'magic'；已知的有：")  # then the method names


def test_the_triton_status_and_its_refusals_in_chinese(chinese, monkeypatch, fake_gpu) -> None:  # noqa: ANN001
    monkeypatch.setattr(at, "interpreting", lambda: True)
    monkeypatch.setattr(at, "_interpreter_fails", lambda: "")
    if at.triton is not None:
        status = at.triton_status("mps")
        assert str(status).startswith(
            f"triton {at.triton.__version__}: 可以运行（解释器）；设备 mps："
        )
        chinese_text(status)
        monkeypatch.setattr(at, "_interpreter_fails", lambda: at._DIFFERS)
        assert "与 flash_forward 的不同" in chinese_text(at.triton_status("cpu"))
    q = torch.zeros(1, 1, 8, 16)
    with pytest.raises(ValueError) as head_dim:
        at.triton_flash_forward(*(torch.zeros(1, 1, 8, 12) for _ in range(3)))
    with pytest.raises(ValueError) as mixed:
        at.triton_flash_forward(q, q, q.double())
    for exc in (head_dim, mixed):
        chinese_text(exc.value)
    monkeypatch.setattr(at, "triton", None)
    monkeypatch.setattr(at, "KERNEL", None)
    for system in ("Darwin", "Linux"):
        monkeypatch.setattr(at.platform, "system", lambda s=system: s)
        chinese_text(at.triton_status("cpu"))
    with pytest.raises(RuntimeError) as missing:
        at.triton_flash_forward(q, q, q)
    assert chinese_text(missing.value).startswith("Triton 无法在这里运行：")
    monkeypatch.undo()
    monkeypatch.setattr(at, "interpreting", lambda: False)
    if at.triton is None:
        monkeypatch.setattr(at, "triton", SimpleNamespace(__version__="3.9.0"))
    gpu = fake_gpu("h100_sxm")
    assert "为 NVIDIA H100 80GB HBM3 编译" in str(at.triton_status(gpu.device))
    chinese_text(at.triton_status("cpu").reason)


# --------------------------------------------------------- the torchrun scripts' own lines


def test_the_scripts_lines_in_chinese(chinese, monkeypatch) -> None:  # noqa: ANN001
    ready = common.ready_line(2, "gloo", "cpu", 1)
    assert (
        ready == "[course:ready] 进程组已就绪：2 个 rank，后端 gloo，设备 cpu，每个 rank 1 个线程"
    )
    assert ready.startswith(common.READY_MARKER)  # the launcher times start-up by it
    lines = [
        scaling_script.run_line(
            "ddp", 2, {"global_batch": 64, "step_median_s": 0.01, "samples_per_s": 6400.0}
        ),  # fmt: skip
        ddp_train.epoch_line(0, 0.6931, 2048),
        ddp_train.identical_line(2, True),
        ddp_train.identical_line(2, False),
        ddp_train.accumulation_line(
            4, {"no_sync": {"allreduce_calls": 1}, "every_step": {"allreduce_calls": 4}}
        ),  # fmt: skip
        capstone_ddp.alone_line(1234.0),
        capstone_ddp.ddp_line(2, 2345.0),
        fsdp_vs_ddp.held_line(1.0, 0.5, None),
        fsdp_vs_ddp.held_line(1.0, None, "because"),
        dp_script.done_line(2, {"step median s": 0.01}, {"step median s": 0.009}, "/tmp/out"),
        zero1_by_hand.bytes_line(
            {"steps": [{"after": 1000}]},
            {"steps": [{"after": 600}]},
            {"DDP": {"all_reduce": 100.0}, "ZeRO-1": {"reduce_scatter": 50.0, "all_gather": 50.0}},
            {"DDP": {"all_reduce": 100.0}, "ZeRO-1": {"all_reduce": 100.0, "all_gather": 50.0}},
            "gloo",
        ),  # fmt: skip
        fsdp_by_hand.alive_line({"ddp": 1000, "by hand": 600}),
    ]
    assert lines[1] == "第 0 个 epoch：2048 个样本上的平均损失 0.6931"
    assert lines[2] == "全部 2 个 rank 上的参数完全相同：是"
    for line in lines:
        chinese_text(line, ("/tmp/out",))
    monkeypatch.setattr(torch, "__version__", "2.6.0")
    chinese_text(fsdp_vs_ddp.fsdp_skip_reason(torch.device("cpu")), ("FSDP requires CUDA for streams",))  # fmt: skip


def test_the_scripts_refusals_in_chinese(chinese, monkeypatch) -> None:  # noqa: ANN001
    refusals = []
    for argv in ([], ["ddp_train", "--then"], ["scaling"]):
        with pytest.raises(SystemExit) as bad:
            one_launch.split_jobs(argv)
        refusals.append(bad.value)
    with pytest.raises(SystemExit) as sizes:
        scaling_script.parse_sizes("1,5", 2)
    refusals.append(sizes.value)
    ctx = common.Context(0, 1, 0, "gloo", torch.device("cpu"))
    with pytest.raises(SystemExit) as dataparallel:
        scaling_script.build(ctx, "dataparallel", 8, 2, None)
    refusals.append(dataparallel.value)
    monkeypatch.setenv(common.BACKEND_ENV, "mpi")
    with pytest.raises(SystemExit) as backend:
        common.choose_backend()
    refusals.append(backend.value)
    monkeypatch.setenv(common.BACKEND_ENV, "nccl")
    with pytest.raises(SystemExit) as nccl:
        common.choose_backend()
    refusals.append(nccl.value)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit) as alone:
        common.setup()
    refusals.append(alone.value)
    usage = one_launch.USAGE
    for exc in refusals:
        chinese_text(str(exc).replace(usage, ""), ("RANK, WORLD_SIZE, LOCAL_RANK",))
    assert "没有设置 RANK" in str(alone.value)
