"""Chapter 1's ground helpers speak Simplified Chinese after set_language("zh_CN"): devices,
dtypes and formats, tables, timing, sweeps, memory, NVML, MFU, the matmul sweep, throughput,
batching and compare_rows, in what they print, plot and raise; English unchanged after "en".

Each printed text is checked for Chinese and for no run of three English words, with the
parts that are not the course's own left out first (torch's and NVML's error text, a CPU's
model name): those stay as the library or the machine wrote them.
"""

from __future__ import annotations

import re
import sys
import warnings

import matplotlib.pyplot as plt
import pytest
import torch
from english_share import ENGLISH_RUN  # the measure of an English line

import helpers.matmul as mm
from helpers import sweeps
from helpers.batching import PermutationSampler, ResidentBatches, SlowReadDataset
from helpers.devices import check_dtype, describe_device, pick_device, resolve_device
from helpers.dtypes import parse_dtype
from helpers.formats import PrecisionError, finfo_rows, parse_precision
from helpers.i18n import set_language
from helpers.machine_state import GpuTenants, MachineState
from helpers.memory import PeakMemory, track_peak
from helpers.mfu import (
    MfuResult,
    Peak,
    achievable_peak,
    count_flops,
    measure_mfu,
    mfu,
    reference_peak,
)
from helpers.nvml_snapshot import GpuSample, NvmlUnavailable, format_snapshot, nvml_snapshot
from helpers.sweeps import SweepResult, run_sweep
from helpers.tables import format_table, screen_width
from helpers.throughput import plot_throughput, run_throughput, throughput_controls
from helpers.timing import BenchResult, benchmark
from helpers.validate import DeviceError, first_line
from helpers.verdicts import compare_rows

CJK = re.compile(r"[\u4e00-\u9fff]")
QUIET = MachineState("cuda:0", 6, 6, 16, 1.0, GpuTenants(0), others_cores=0.0, window_s=1.0)
SHARED = MachineState("cuda:0", 6, 6, 16, 9.0, GpuTenants(2, 2**30), 4.0, 1.0)


def assert_chinese(text: str, *foreign: str) -> None:
    """`text` has Chinese and no three English words in a row, once `foreign` is left out."""
    shown = str(text)
    for part in foreign:
        shown = shown.replace(str(part), " ")
    assert CJK.search(shown), f"no Chinese in {text!r}"
    run = ENGLISH_RUN.search(shown)
    assert run is None, f"English left ({run.group(0)!r}) in {text!r}"


def raised(call, *args, **kwargs) -> BaseException:  # noqa: ANN001 - any callable
    """The exception call(*args, **kwargs) raises (the test fails if it raises none)."""
    with pytest.raises(Exception) as info:
        call(*args, **kwargs)
    return info.value


def plot_texts(fig: plt.Figure) -> list[str]:
    """Every title, axis label, legend entry and text a figure draws."""
    texts = [fig._suptitle.get_text()] if fig._suptitle is not None else []
    for ax in fig.axes:
        texts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        texts += [t.get_text() for t in ax.texts]
        legend = ax.get_legend()
        if legend is not None:
            texts += [t.get_text() for t in legend.get_texts()]
    return [t for t in texts if t]


# --- devices and dtypes ------------------------------------------------------------------------


def test_describe_device_prints_chinese_and_keeps_its_english_rows(chinese) -> None:  # noqa: ANN001
    info = describe_device("cpu")
    text = str(info)
    assert_chinese(text, info.name)
    lines = text.splitlines()
    assert lines[0].startswith("设备") and lines[0].endswith("  cpu")
    assert any(line.startswith("系统内存（与其他所有程序共享）") for line in lines), text
    assert "数据手册峰值 TFLOP/s" in text and "未知：请测量可达速率（第 1 章）" in text
    assert [k for k, _ in info.rows()][:3] == ["device", "kind", "name"]  # lookups stay English
    assert dict(info.rows())["bf16 in hardware"] in ("True", "False")


def test_describe_device_values_line_up_by_screen_width(chinese) -> None:  # noqa: ANN001
    text = str(describe_device("cpu"))
    value_columns = set()
    for line in text.splitlines():
        value = re.match(r"\S.*?\s{2,}(\S.*)$", line).group(1)
        value_columns.add(screen_width(line) - screen_width(value))
    assert len(value_columns) == 1, text


def test_a_fake_gpus_description_is_chinese(chinese, fake_gpu) -> None:  # noqa: ANN001
    gpu = fake_gpu("t4")
    text = str(describe_device("cuda"))
    assert_chinese(text, gpu.spec.name)
    assert "显存" in text and "计算能力" in text and "7.5" in text
    assert "fp32 8.1, fp16 65（tf32, bf16 没有快速路径）" in text, text
    fake_gpu("mps")
    mps = describe_device("mps")
    assert_chinese(str(mps))
    assert "上的 Apple GPU (MPS)" in mps.name and "建议的最大内存（与 CPU 共享）" in str(mps)


def test_device_errors_are_chinese(chinese, monkeypatch) -> None:  # noqa: ANN001
    here = ", ".join(["cpu"])
    for spec in ("cuda", "mps", "xpu", "hpu"):
        exc = raised(resolve_device, spec)
        assert isinstance(exc, DeviceError) and f"设备 '{spec}' 不可用" in str(exc)
        assert_chinese(str(exc))
        assert str(exc).endswith(f"本机的设备：{here}。"), str(exc)
    assert "`nvidia-smi`" in str(raised(resolve_device, "cuda"))
    assert_chinese(str(raised(resolve_device, 3)))
    bad = raised(resolve_device, "nope:x")
    torch_error = str(raised(torch.device, "nope:x"))
    assert_chinese(str(bad), torch_error)
    monkeypatch.setenv("COURSE_DEVICE", "xpu")
    forced = str(raised(pick_device))
    assert forced.startswith("$COURSE_DEVICE='xpu'：设备 'xpu' 不可用")
    assert_chinese(forced)


def test_a_missing_gpu_index_and_a_dtype_that_cannot_run_are_chinese(chinese, fake_gpu) -> None:  # noqa: ANN001
    fake_gpu("a100", count=2)
    missing = str(raised(resolve_device, "cuda:5"))
    assert "本机有 2 个 cuda 设备，编号为 0 到 1" in missing
    assert_chinese(missing)
    meta = str(raised(check_dtype, "meta", "fp32"))
    a = torch.ones(2, 2, device="meta")
    torch_error = first_line(raised(lambda: (a @ a).sum().item()))
    assert meta.startswith("meta 在这里无法用 fp32 计算（")
    assert_chinese(meta, torch_error)


def test_dtype_and_precision_errors_are_chinese(chinese) -> None:  # noqa: ANN001
    for call, name in ((parse_dtype, "tf32"), (parse_dtype, "int4"), (parse_precision, "int4")):
        exc = raised(call, name)
        assert isinstance(exc, DeviceError)
        assert_chinese(str(exc))
    assert "不是混合精度的选项" in str(raised(parse_precision, "fp64"))
    assert isinstance(raised(parse_precision, "fp64"), PrecisionError)


# --- tables, formats, timing, sweeps, memory ---------------------------------------------------


def test_table_headers_are_translated_where_printed_and_keys_stay(chinese) -> None:  # noqa: ANN001
    rows = finfo_rows()
    assert "smallest normal" in rows[0] and rows[0]["format"] == "fp32"  # keys stay English
    text = format_table(rows)
    head = text.splitlines()[0]
    assert_chinese(head)
    assert "最小次正规数" in head and "eps" in head
    assert "tf32（仅矩阵乘法）" in text
    widths = {screen_width(line) for line in text.splitlines()}
    assert len(widths) == 1, text  # every line as wide on screen: the header lines up
    assert format_table([]) == "（没有任何行）"
    unknown = format_table([{"a column nobody translates": 1}])
    assert unknown.startswith("a column nobody translates")  # not in the catalog: as it is


def test_a_benchmark_prints_chinese(chinese) -> None:  # noqa: ANN001
    result = benchmark(torch.ones, 4, min_run_time=0.01)
    text = str(result)
    assert text.startswith("基准测试：每次调用的中位时间 ")
    assert_chinese(text)
    timed = BenchResult("step", 1e-3, 1e-5, [1e-3] * 5, 10, 6, "cuda:0", "CUDA events")
    assert str(timed).endswith("6 个线程，cuda:0，CUDA 事件）"), str(timed)
    assert_chinese(str(raised(benchmark, 3)))
    assert_chinese(str(raised(benchmark, torch.ones, 2, warmup=-1)))


def test_a_sweep_says_in_chinese_why_it_stopped(chinese, monkeypatch, capsys) -> None:  # noqa: ANN001
    bars = []

    class Bar(list):
        def __init__(self, values, **kwargs) -> None:  # noqa: ANN001
            super().__init__(values)
            bars.append(kwargs)

        def close(self) -> None:
            pass

    monkeypatch.setattr(sweeps, "tqdm", Bar)

    def measure(batch: int) -> dict[str, int]:
        if batch > 2:
            raise MemoryError("can't allocate memory")
        return {"square": batch * batch}

    result = run_sweep(measure, [1, 2, 3], param="batch size")
    assert bars[0]["desc"] == "扫描 批大小", bars
    printed = capsys.readouterr().out
    assert printed.startswith("扫描已停止：在 batch size=3 处显存或内存不足：")
    assert_chinese(printed, "can't allocate memory")
    text = str(result)
    assert text.splitlines()[0].lstrip().startswith("批大小")
    assert text.splitlines()[-1].startswith("（提前停止：")
    assert_chinese(text.splitlines()[-1], "can't allocate memory")
    assert result.column("batch size") == [1, 2]  # the key stays English
    assert_chinese(str(raised(result.column, "nope")), "batch size, square")
    assert_chinese(str(raised(run_sweep, measure, [], param="n")))
    assert_chinese(str(raised(run_sweep, lambda v: [v], [1], progress=False)))


def test_a_peak_reading_is_chinese(chinese) -> None:  # noqa: ANN001
    with track_peak("cpu") as peak:
        torch.ones(1000)
    assert str(peak).startswith("峰值比开始时高 ") and "进程的 RSS，每毫秒采样一次：近似值" in str(
        peak
    )
    assert "approximate" in peak.meter  # the reading keeps its English name
    assert_chinese(str(PeakMemory(0, 2**30, 0, "torch.cuda.max_memory_allocated, exact")))
    assert str(PeakMemory(0, 1024, 0, "")) == "峰值比开始时高 1.00 KiB（）"


# --- NVML ------------------------------------------------------------------------------------


def test_the_nvml_table_and_its_refusals_are_chinese(chinese, fake_gpu, monkeypatch) -> None:  # noqa: ANN001
    samples = [
        GpuSample(0, "NVIDIA H100 80GB HBM3", 45, 10 * 2**30, 80 * 2**30, 55, 300.0),
        GpuSample(1, "NVIDIA H100 80GB HBM3", None, None, None, None, None),
    ]
    text = format_snapshot(samples)
    head, first, second = text.splitlines()
    assert_chinese(head)
    assert head.startswith("GPU  名称") and "显存已用 / 总量" in head and "功率" in head
    assert screen_width(head[: head.index("显存")]) == 42  # the memory column, as in English
    assert "  不适用" in second and "n/a" not in second
    assert format_snapshot([]) == "NVML 可以使用，但没有报告任何 GPU。"
    fake_gpu("mi300x")  # NVML raises NVMLError_LibraryNotFound without an NVIDIA driver
    gone = nvml_snapshot()
    assert isinstance(gone, NvmlUnavailable) and gone.reason.startswith("无法加载 NVIDIA 驱动（")
    nvml_error = gone.reason[len("无法加载 NVIDIA 驱动（") : -1]
    assert_chinese(format_snapshot(gone), nvml_error)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml fails
    missing = format_snapshot(nvml_snapshot())
    assert missing == "NVML 不可用：没有安装 nvidia-ml-py 包（pip install nvidia-ml-py）"


def test_the_nvml_header_is_the_same_in_english() -> None:
    text = format_snapshot([GpuSample(0, "x", None, None, None, None, None)])
    assert text.splitlines()[0] == (
        "GPU  name                          util   memory used / total     temp   power"
    )


# --- MFU ----------------------------------------------------------------------------------------


def test_mfu_results_and_refusals_are_chinese(chinese, fake_gpu) -> None:  # noqa: ANN001
    measured = Peak(1e11, "best fp32 matmul measured here, m=8, k=8, n=8", True)
    over = MfuResult(int(1e9), 1e-3, measured, achievable=measured, machine=QUIET)
    text = str(over)
    assert text.startswith(
        "每步 1 GFLOP，用时 1 ms，即 1000 GFLOP/s；MFU 为 1000.0%，参考峰值：0.1 TFLOP/s（"
    )
    depth = 0  # the peak's description in brackets, with no brackets inside (learner 32)
    for ch in text:
        depth += {"（": 1, "(": 1, "）": -1, ")": -1}.get(ch, 0)
        assert depth <= 1, text
    assert "MFU 超过 100%：错的是参考峰值，而不是这一步。它是在机器有负载时" in text
    assert_chinese(text, measured.source)
    datasheet = Peak(1e15, "x", measured=False)
    assert "请检查这块 GPU 在该 dtype 下的峰值" in str(MfuResult(int(1e12), 1e-4, datasheet))
    best = achievable_peak("cpu", "fp32", shapes=[(16, 16, 16)])
    assert best.source.startswith("在这里测得的最佳 fp32 矩阵乘法，m=16、k=16、n=16")
    assert_chinese(str(best))
    for call, args in (
        (mfu, (0, 1.0, 1.0)),
        (mfu, ("many", 1.0, 1.0)),
        (count_flops, (3,)),
        (measure_mfu, (lambda: None, "cpu")),
        (achievable_peak, ("cpu", "fp32", [])),
    ):
        assert_chinese(str(raised(call, *args)))
    gpu = fake_gpu("h100_sxm")
    sheet = reference_peak("cuda", "bf16")
    assert sheet.source == f"{gpu.spec.name} 数据手册上的稠密 bf16 峰值"
    assert str(sheet) == f"989 TFLOP/s（{sheet.source}）"


# --- the matmul sweep -------------------------------------------------------------------------


def speedup_sweep(machine: MachineState) -> mm.MatmulSweep:
    """run_speedup's result as the H100 run measured it: a flat CPU at small n (no GPU here)."""
    data = {64: (8.0, 0.01), 128: (8.0, 0.012), 256: (8.1, 0.02), 512: (16.0, 0.05)}
    rows = [
        {
            "n": n,
            "CPU (ms)": c,
            "CPU IQR (%)": 1.0,
            "CPU threads": 6,
            "cuda:0 (ms)": g,
            "cuda:0 IQR (%)": 1.0,
            "speed-up": c / g,
            "note": "",
        }
        for n, (c, g) in data.items()
    ]
    return mm.MatmulSweep(
        param="n",
        rows=rows,
        dtype="fp32",
        device="cpu 对比 cuda:0",
        compares_devices=True,
        machine=machine,
    )


def test_a_matmul_sweep_prints_chinese(chinese) -> None:  # noqa: ANN001
    sweep = mm.run_matmul_sweep([16, 32, 4096], "fp32", "cpu", min_run_time=0.01, progress=False)
    text = str(sweep)
    lines = text.splitlines()
    assert lines[0].startswith("cpu 上的 fp32 矩阵乘法；峰值 未知（数据手册中没有")
    assert "时间 (ms)" in lines[1] and "GFLOP/s" in lines[1]
    assert sweep.column("time (ms)")  # the key stays English
    assert sweep.skipped[0].startswith("n=4096：超出了每次调用 1 s 的预算（按 n^3 推算")
    assert any(line.startswith("已跳过 n=4096：") for line in lines)
    for line in [lines[0], *lines[-2:]]:
        assert_chinese(line)


def test_the_speedup_table_and_its_plot_are_chinese(chinese) -> None:  # noqa: ANN001
    sweep = speedup_sweep(QUIET)
    floors = mm.cpu_floor_notes(sweep.rows)
    for row in sweep.rows:
        row["note"] = "CPU 下限" if row["n"] in floors else ""
    text = str(sweep)
    assert text.startswith("cpu 对比 cuda:0 上的 fp32 矩阵乘法\n"), text
    head = text.splitlines()[1]
    assert "CPU 线程数" in head and "加速比" in head and "备注" in head
    assert_chinese(mm.speedup_verdict(sweep))
    with warnings.catch_warnings():  # a font without CJK glyphs warns; the texts are strings
        warnings.simplefilter("ignore", UserWarning)
        timed = [{"n": 64, "time (ms)": 1.0, "IQR (%)": 1.0, "GFLOP/s": 0.5}]
        figures = [
            mm.plot_speedup(sweep),
            mm.plot_matmul_sweep(mm.MatmulSweep("n", timed, peak=1e9)),
        ]
        figures.append(mm.plot_matmul_sweep(mm.MatmulSweep(param="n", stopped="OOM")))
    texts = [t for fig in figures for t in plot_texts(fig)]
    for fig in figures:
        plt.close(fig)
    assert "相对 CPU 的加速比 (x)" in texts and "持平点" in texts and "数据手册峰值" in texts
    assert "每次调用的中位时间 (ms)" in texts and "实测" in texts
    assert "什么也没有测到：\nOOM" in texts
    assert any(t.endswith("（显存或内存不足，提前停止）") for t in texts), texts
    for t in texts:
        if ENGLISH_RUN.search(t):
            assert_chinese(t)


def test_matmul_refusals_and_controls_are_chinese(chinese) -> None:  # noqa: ANN001
    for call, args, kwargs in (
        (mm.run_speedup, ([16],), {"device": "cpu"}),
        (mm.check_tf32, (torch.device("cpu"),), {}),
        (mm.run_matmul_sweep, ([16],), {"size_range": (16, 32)}),
        (mm.run_matmul_sweep, (), {"size_range": (64, 32)}),
        (mm.run_matmul_sweep, (), {"size_range": 5}),
        (mm.run_matmul_sweep, ([],), {}),
        (mm.achievable_rate, ("fp32", "cpu", [(1, 2)]), {}),
    ):
        assert_chinese(str(raised(call, *args, **kwargs)))
    controls = mm.matmul_controls("cpu")
    assert controls["size_range"].description == "n 的范围"
    assert controls["device"].description == "设备" and controls["dtype"].description == "dtype"


def test_a_skipped_cpu_configuration_is_named_in_chinese(chinese, monkeypatch) -> None:  # noqa: ANN001
    def fake_sweep(sizes, dtype="fp32", device=None, **options):  # noqa: ANN001, ANN202
        rows = [{"n": 16, "time (ms)": 1.0, "IQR (%)": 1.0, "GFLOP/s": 1.0}]
        return mm.MatmulSweep("n", rows, device=str(device), skipped=["n=32：太慢"])

    monkeypatch.setattr(mm, "run_matmul_sweep", fake_sweep)
    monkeypatch.setattr(mm, "resolve_device", lambda d: torch.device("meta"))
    result = mm.run_speedup([16], device="meta")
    assert result.device == "cpu 对比 meta"
    assert "在 meta 上：n=32：太慢" in result.skipped
    threads = torch.get_num_threads()
    assert f"在 {threads} 个线程的 cpu 上：n=32：太慢" in result.skipped, result.skipped


# --- throughput and batching ---------------------------------------------------------------


def test_the_throughput_sweep_its_plot_and_controls_are_chinese(chinese) -> None:  # noqa: ANN001
    result = run_throughput((3, 4), device="cpu", n_samples=64, threads=1, min_run_time=0.01)
    head = str(result).splitlines()[0]
    assert_chinese(head)
    for word in ("批大小", "步数/epoch", "µs/步", "样本/s", "1 个 epoch 后的损失"):
        assert word in head, head
    assert result.column("samples/s") and result.column("batch size") == [8, 16]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fig = plot_throughput(result)
    texts = plot_texts(fig)
    plt.close(fig)
    assert "源教程的 MLP（cpu），批次来源：常驻设备的张量" in texts, texts
    assert "吞吐量" in texts and "批大小" in texts
    for t in texts:
        if ENGLISH_RUN.search(t) or CJK.search(t):
            assert_chinese(t)
    controls = throughput_controls()
    assert controls["log2_batch"].description == "log2 批大小"
    assert controls["feeding"].description == "喂数据方式"
    assert controls["feeding"].value == "resident"  # the value the sweep takes stays English
    assert dict(controls["feeding"].options)["常驻设备的张量"] == "resident"
    for kwargs in (
        {"feeding": "disk"},
        {"log2_batch": (1,)},
        {"log2_batch": (5, 3)},
        {"log2_batch": (10, 11), "n_samples": 64},
    ):
        assert_chinese(str(raised(run_throughput, device="cpu", **kwargs)))
    assert_chinese(str(raised(plot_throughput, SweepResult("batch size"))))


def test_batching_refusals_are_chinese(chinese) -> None:  # noqa: ANN001
    x, y = torch.zeros(8, 2), torch.zeros(8, 1)
    for call, args, kwargs in (
        (ResidentBatches, (), {"batch_size": 2}),
        (ResidentBatches, (x, "y"), {"batch_size": 2}),
        (ResidentBatches, (torch.tensor(1.0),), {"batch_size": 1}),
        (ResidentBatches, (x, torch.zeros(7)), {"batch_size": 2}),
        (ResidentBatches, (x, torch.zeros(8, device="meta")), {"batch_size": 2}),
        (ResidentBatches, (x,), {"batch_size": 9}),
        (ResidentBatches, (x[:0],), {"batch_size": 1}),
        (ResidentBatches, (x,), {"batch_size": 2, "generator": 3}),
        (PermutationSampler, (8, 3), {}),
        (SlowReadDataset, (x, y, 2.0), {}),
    ):
        assert_chinese(str(raised(call, *args, **kwargs)))


# --- compare_rows -------------------------------------------------------------------------------


ROWS = [
    {"run": "a", "ms": 10.0, "IQR": 0.1, "tokens/s": 300.0},
    {"run": "b", "ms": 20.0, "IQR": 0.1, "tokens/s": 100.0},
    {"run": "c", "ms": 10.2, "IQR": 1.0, "tokens/s": 290.0},
]


def test_compare_rows_reads_each_ratio_one_way_in_chinese(chinese) -> None:  # noqa: ANN001
    def verdict(a: str, b: str, **kwargs: object) -> str:
        return str(compare_rows(ROWS, "run", a, b, "ms", iqr="IQR", **kwargs))

    assert verdict("a", "b") == "在这台机器上，a 的速度是 b 的 2.00 倍"
    assert verdict("b", "a") == "在这台机器上，a 的速度是 b 的 2.00 倍"
    assert verdict("b", "a", higher_is_better=True, better="slower") == (
        "在这台机器上，b 的耗时是 a 的 2.00 倍"
    )
    assert verdict("a", "b", better="shorter") == "在这台机器上，a 的耗时只有 b 的 1/2.00"
    tokens = compare_rows(
        ROWS, "run", "a", "b", "tokens/s", higher_is_better=True, better="more tokens/s"
    )
    assert str(tokens) == "在这台机器上，a 每秒处理的 token 数是 b 的 3.00 倍"
    own = verdict("a", "b", better="leaner")
    assert own == "在这台机器上，按「leaner」来比，a 是 b 的 2.00 倍"
    close = verdict("a", "c")
    assert close.startswith("a 对比 c：难分高下（前者领先，比值 1.02；两者的波动合计 ")
    busy = verdict("a", "b", machine=SHARED)
    assert busy.startswith("无从判断：这块 GPU 与其他 2 个计算进程共用")
    assert busy.endswith("测得：在这台机器上，a 的速度是 b 的 2.00 倍")
    for text in (close, busy, own):
        assert_chinese(text)


def test_compare_rows_refusals_are_chinese(chinese) -> None:  # noqa: ANN001
    text_rows = [{"run": "a", "ms": "10 ms"}, {"run": "b", "ms": 20.0}]
    for args, kwargs in (
        ((ROWS, "run", "a", "a", "ms"), {}),
        ((ROWS, "run", "a", "zz", "ms"), {}),
        ((text_rows, "run", "a", "b", "ms"), {}),
        (([{"run": "a", "ms": 0.0}, {"run": "b", "ms": 1.0}], "run", "a", "b", "ms"), {}),
        ((ROWS, "run", "a", "b", "ms"), {"iqr": "IQR", "spread": "IQR"}),
    ):
        assert_chinese(str(raised(compare_rows, *args, **kwargs)))


# --- English is unchanged -------------------------------------------------------------------


def test_english_comes_back_unchanged() -> None:
    set_language("zh_CN")
    set_language("en")
    verdict = compare_rows(ROWS, "run", "a", "b", "ms", iqr="IQR")
    assert str(verdict) == "here, a was 2.00x faster than b"
    shorter = compare_rows(ROWS, "run", "a", "b", "ms", iqr="IQR", better="shorter")
    assert str(shorter) == "here, a was 2.00x shorter than b"
    busy = compare_rows(ROWS, "run", "a", "c", "ms", iqr="IQR", machine=SHARED)
    assert busy.startswith("inconclusive, GPU shared with 2 other compute process(es)")
    assert "too close to call (the first ahead by 1.02x; spreads add up to " in busy
    info = describe_device("cpu")
    assert str(info).splitlines()[0] == "device" + " " * (len(info.memory_label) - 4) + "cpu"
    assert format_table([]) == "(no rows)" and not CJK.search(str(info))
    assert str(PeakMemory(0, 1024, 0, "m")) == "peak +1.00 KiB over the start (m)"
    assert "tf32 (matmul only)" in [r["format"] for r in finfo_rows()]
