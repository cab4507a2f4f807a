"""What the precision, memory, loop, profiling and sampling helpers show a learner speaks
Simplified Chinese after set_language("zh_CN"): their tables (headers and words), summaries,
verdicts, plot texts, widget labels and the course's own errors (issue 32).

Each output is checked to contain Chinese and no run of three English words (identifiers,
units and numbers stay as they are). Real calls on small CPU inputs; the branches that read a
GPU's properties run on the fake GPU of tests/fake_gpu.py.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from english_share import ENGLISH_RUN  # the measure of an English line
from torch import nn  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from helpers import (  # noqa: E402
    activations,
    amp_choice,
    amp_sweep,
    case_study,
    cuda_graphs,
    fp8,
    loops,
    max_batch,
    memory_bill,
    profiling,
    same_math,
    sampler,
    step_profile,
    syncs,
)
from helpers.formats import PrecisionError  # noqa: E402
from helpers.i18n import set_language, tr  # noqa: E402
from helpers.machine_state import GpuTenants, MachineState  # noqa: E402
from helpers.sweeps import SweepResult  # noqa: E402
from helpers.tables import format_table  # noqa: E402
from helpers.timing import BenchResult  # noqa: E402
from helpers.validate import DeviceError  # noqa: E402

CJK = re.compile(r"[\u4e00-\u9fff]")
MiB = 2**20
QUIET = MachineState("cuda:0", 6, 6, 16, 1.0, GpuTenants(0), others_cores=0.0, window_s=1.0)
BUSY = MachineState("cuda:0", 6, 6, 16, 9.0, GpuTenants(2, 2**30), 4.0, 1.0)


def chinese(text: object, *code: str, cjk: bool = True) -> str:
    """`text` as a string, asserted Chinese: some CJK (unless not `cjk`: a table row of numbers,
    a label of acronyms), and no run of three English words once the `code` it quotes (a list
    of identifiers, an API call) is left out."""
    text = str(text)
    assert not cjk or CJK.search(text), text
    prose = text
    for c in code:
        prose = prose.replace(c, " ")
    found = ENGLISH_RUN.search(prose)
    assert found is None, f"English left: {found.group(0)!r} in {text!r}"
    return text


def raises_chinese(exc: type[BaseException], fn: Callable[[], object], *code: str) -> str:
    """The message of the `exc` that fn() raises, asserted Chinese (`code`: as in chinese())."""
    with pytest.raises(exc) as info:
        fn()
    message = info.value.args[0] if info.value.args else str(info.value)
    return chinese(message, *code)


def table_chinese(text: str) -> None:
    """A printed table: Chinese headers, and no English sentence in any row."""
    head, _rule, *body = text.splitlines()
    chinese(head)
    for line in body:
        chinese(line, cjk=False)


def figure_texts(fig: matplotlib.figure.Figure) -> list[str]:
    """Every title, axis label, legend entry and suptitle a helper drew."""
    out = []
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        legend = ax.get_legend()
        if legend is not None:
            out += [t.get_text() for t in legend.get_texts()]
    if fig._suptitle is not None:
        out.append(fig._suptitle.get_text())
    plt.close(fig)
    return [t for t in out if t.strip()]


@pytest.fixture(autouse=True)
def zh():  # noqa: ANN201
    """Every test here runs in Chinese; English comes back after it."""
    set_language("zh_CN")
    try:
        yield
    finally:
        set_language("en")


def bench(name: str, ms: float, iqr_ms: float, machine: MachineState | None = QUIET) -> BenchResult:
    return BenchResult(
        name, ms / 1e3, iqr_ms / 1e3, [ms / 1e3] * 7, 1, 6, "cuda:0", "CUDA events", machine
    )


# --- helpers.amp_sweep --------------------------------------------------------------------------


def test_amp_sweep_table_meter_and_skipped_precision_are_chinese() -> None:
    for kind in ("cpu", "cuda", "mps", "xpu"):
        chinese(amp_sweep.memory_meter(kind))
    sweep = amp_sweep.run_amp_sweep(
        "cpu", ("fp32", "fp16"), (4,), sizes=(16, 16, 1), min_run_time=0.01
    )
    text = str(sweep)
    head, *rest = text.splitlines()
    assert head == "cpu, MLP 16-16-1"
    table_chinese("\n".join(rest[:3]))  # fp32's one row
    assert "批大小" in rest[0] and "ms/步" in rest[0], rest[0]  # the headers, translated
    for line in rest[3:]:  # fp16 skipped, the machine, what the two MiB columns mean
        chinese(line)
    assert "跳过 fp16：" in text and "峰值 MiB = " in text and "保存 MiB = " in text
    sweep.results["fp32"].stopped = "显存不足"
    assert "（fp32 提前停止：显存不足）" in str(sweep)
    raises_chinese(KeyError, lambda: sweep.speedup("bf16", 4))
    raises_chinese(KeyError, lambda: sweep.speedup("fp32", 8))
    raises_chinese(ValueError, lambda: amp_sweep.run_amp_sweep("cpu", ()))
    raises_chinese(ValueError, lambda: amp_sweep.run_amp_sweep("cpu", ("fp32",), ()))


def test_amp_sweep_plot_and_widgets_are_chinese() -> None:
    sweep = amp_sweep.run_amp_sweep(
        "cpu", ("fp32", "fp16"), (4, 8), sizes=(16, 16, 1), min_run_time=0.01
    )
    with warnings.catch_warnings():  # a font without CJK glyphs warns; the texts are what counts
        warnings.simplefilter("ignore", UserWarning)
        texts = figure_texts(amp_sweep.plot_amp_sweep(sweep))
    for t in texts:
        if t not in ("fp32", "MiB"):
            chinese(t)
    assert any(t.startswith("已跳过：fp16") for t in texts), texts
    controls = amp_sweep.amp_controls("cpu")
    for widget in controls.values():
        chinese(widget.description)


def test_tf32_table_and_the_loss_gap_refusals_are_chinese(fake_gpu) -> None:  # noqa: ANN001
    rows = [
        {"matmul": "fp32", "shape": "8x8 @ 8x8", "ms": 2.0, "IQR ms": 0.01, "TFLOP/s": 1.0},
        {"matmul": "TF32", "shape": "8x8 @ 8x8", "ms": 1.0, "IQR ms": 0.01, "TFLOP/s": 2.0},
    ]
    for row in rows:
        row["vs fp32"] = f"{rows[0]['ms'] / row['ms']:.2f}x"
    text = str(amp_sweep.Tf32Speed(rows, [QUIET, QUIET]))
    assert "矩阵乘法" in text.splitlines()[0] and "形状" in text.splitlines()[0]
    chinese(text.splitlines()[0])
    chinese(text.splitlines()[-1])  # the verdict
    fake_gpu("a100")  # TF32 exists there: the shape and dtype checks come next
    raises_chinese(ValueError, lambda: amp_sweep.time_tf32(torch.ones(3), torch.ones(3), "cuda"))
    ints = torch.ones(2, 2, dtype=torch.int32)
    raises_chinese(ValueError, lambda: amp_sweep.time_tf32(ints, ints, "cuda"))
    raises_chinese(ValueError, lambda: amp_sweep.LossGap("bf16", 0.5, {0: 0.5}))
    raises_chinese(ValueError, lambda: amp_sweep.LossGap("bf16", float("nan"), {0: 0.5, 1: 0.4}))
    chinese(amp_sweep.LossGap("bf16", 0.03363, {0: 0.04518, 1: 0.0477, 2: 0.0351}))


# --- helpers.amp_choice -------------------------------------------------------------------------

MACHINES = [
    {"kind": "cuda", "compute_capability": (9, 0)},
    {"kind": "cuda", "compute_capability": (7, 5), "bf16_reported": True},
    {"kind": "cuda", "compute_capability": (6, 0)},
    {"kind": "cpu", "cpu_flags": ["amx_bf16"]},
    {"kind": "cpu", "cpu_flags": ["avx2"]},
    {"kind": "rocm", "name": "MI300X", "bf16_native": True},
    {"kind": "rocm", "bf16_native": False},
    {"kind": "mps"},
    {"kind": "xpu"},
    {"kind": "tpu"},
]


@pytest.mark.parametrize(
    "desc", MACHINES, ids=lambda d: f"{d['kind']}-{d.get('compute_capability')}"
)
def test_every_amp_choice_says_why_in_chinese(desc: dict) -> None:
    choice = amp_choice.choose_amp_dtype(desc)
    text = chinese(choice)
    assert text.startswith(choice.name)  # the dtype's name stays


def test_amp_choice_requests_and_refusals_are_chinese() -> None:
    t4 = {"kind": "cuda", "compute_capability": (7, 5)}
    plain_cpu = {"kind": "cpu", "cpu_flags": []}
    chinese(amp_choice.choose_amp_dtype(t4, prefer="fp32"))
    chinese(amp_choice.choose_amp_dtype(t4, prefer="fp16"))
    chinese(amp_choice.choose_amp_dtype(plain_cpu, prefer="fp16", allow_slow=True))
    chinese(amp_choice.choose_amp_dtype(plain_cpu, prefer="bf16", allow_slow=True))
    for bad in (
        lambda: amp_choice.choose_amp_dtype(t4, prefer="bf16"),
        lambda: amp_choice.choose_amp_dtype(plain_cpu, prefer="fp16"),
        lambda: amp_choice.choose_amp_dtype({"kind": "mps"}, prefer="bf16"),
        lambda: amp_choice.choose_amp_dtype({}),
        lambda: amp_choice.choose_amp_dtype({"kind": "cuda", "compute_capability": "8.0"}),
        lambda: amp_choice.choose_amp_dtype({"kind": "cuda"}),
        lambda: amp_choice.choose_amp_dtype({"kind": "ve"}, prefer="bf16"),
    ):
        raises_chinese(PrecisionError, bad)


def test_autocast_probe_and_gradscaler_fallback_are_chinese(monkeypatch, fake_gpu) -> None:  # noqa: ANN001
    monkeypatch.setattr(torch.amp, "is_autocast_available", lambda kind: False)
    raises_chinese(PrecisionError, lambda: amp_choice.check_autocast("cpu", "bf16"))
    monkeypatch.undo()
    gpu = fake_gpu("t4")
    monkeypatch.setattr(amp_choice, "check_autocast", lambda device, dtype: dtype)
    monkeypatch.setattr(amp_choice, "grad_scaler_works", lambda device: False)
    choice = amp_choice.amp_for_device(gpu.device)  # fp16 would need a GradScaler: fp32
    assert choice.name == "fp32"
    chinese(choice)
    raises_chinese(PrecisionError, lambda: amp_choice.amp_for_device(gpu.device, prefer="fp16"))
    monkeypatch.setattr(
        amp_choice, "check_autocast", lambda d, t: (_ for _ in ()).throw(PrecisionError("x"))
    )
    raises_chinese(
        PrecisionError,
        lambda: amp_choice.demo_dtype(gpu.device, amp_choice.AmpChoice(torch.float32, False, "")),
    )


# --- helpers.fp8 --------------------------------------------------------------------------------


def test_fp8_reasons_peak_and_install_hint_are_chinese(fake_gpu) -> None:  # noqa: ANN001
    ok, why = fp8.fp8_hardware("cpu")
    assert not ok
    chinese(why)
    plan, why = fp8.fp8_plan("cpu")
    chinese(why)
    fake_gpu("a100")
    chinese(fp8.fp8_hardware("cuda")[1])
    fake_gpu("h100_sxm")
    if fp8.torchao_version() is None:
        chinese(fp8.fp8_available("cuda")[1])
        chinese(fp8.fp8_plan("cuda")[1])
        raises_chinese(ModuleNotFoundError, lambda: fp8.convert_fp8(nn.Linear(16, 16)))
    peak = fp8.fp8_peak("cuda")
    assert peak is not None and "H100" in peak.source
    chinese(peak.source)


# --- helpers.activations ------------------------------------------------------------------------


def test_activation_table_words_and_headers_are_chinese() -> None:
    model = nn.Sequential(
        nn.Linear(8, 8), nn.ReLU(), nn.Flatten(), nn.Identity(), nn.GELU(), nn.Linear(8, 4)
    )
    rows = activations.activation_table(model, (8,), 4, autocast_dtype=torch.bfloat16)
    for row in rows:
        chinese(row["keeps"])
    assert rows[0]["keeps"] == "输入（bfloat16 副本）"
    chinese(format_table(rows).splitlines()[0])  # the headers
    frozen = nn.Sequential(nn.Linear(4, 4).requires_grad_(False), nn.ReLU())
    for row in activations.activation_table(frozen, (4,), 2):
        chinese(row["keeps"])
    cnn = nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2))
    for row in activations.activation_table(cnn, (1, 6, 6), 2):
        chinese(row["keeps"])
    for row in activations.activation_table(model, (8,), 4, checkpoint_every=2):
        chinese(row["keeps"])
    with activations.ActivationMeter(model) as meter:
        model(torch.randn(4, 8))
    chinese(format_table(meter.table()).splitlines()[0])


def test_activation_refusals_are_chinese() -> None:
    model = nn.Sequential(nn.Linear(8, 8))
    raises_chinese(TypeError, lambda: activations.ActivationMeter(3))
    raises_chinese(TypeError, lambda: activations.checkpointed_forward(nn.Linear(2, 2), None, 1))
    raises_chinese(TypeError, lambda: activations.measure_activation_bytes(model, [1.0]))
    raises_chinese(TypeError, lambda: activations.activation_table(nn.Linear(8, 8), (8,), 2))
    raises_chinese(ValueError, lambda: activations.activation_table(model, (7,), 2))
    conv = nn.Sequential(nn.Conv2d(3, 2, 3))
    raises_chinese(ValueError, lambda: activations.activation_table(conv, (1, 6, 6), 2))
    dropout = nn.Sequential(nn.Linear(8, 8), nn.Dropout())
    raises_chinese(TypeError, lambda: activations.activation_table(dropout, (8,), 2))
    pool = nn.Sequential(nn.Conv2d(1, 1, 3), nn.MaxPool2d(2, return_indices=True))
    raises_chinese(ValueError, lambda: activations.activation_table(pool, (1, 6, 6), 2))
    with pytest.raises(ValueError) as exc:
        activations.activation_table(model, (0,), 2)
    assert "sample_shape 的每一项" in str(exc.value)
    timings = {"a": bench("a", 1.0, 0.1)}
    raises_chinese(ValueError, lambda: activations.CheckpointCost("t", timings, {}, {}))


def test_checkpoint_cost_table_and_default_name_are_chinese() -> None:
    timings = {
        "no checkpointing": bench("plain", 15.4, 0.07),
        "pairs": bench("pairs", 21.5, 0.09),
    }
    cost = activations.CheckpointCost(
        "大步",
        timings,
        {"no checkpointing": 300, "pairs": 409},
        {"no checkpointing": 20 * MiB, "pairs": 12 * MiB},
    )
    lines = str(cost).splitlines()
    table_chinese("\n".join(lines[1:-1]))
    plain = tr("no checkpointing")
    assert CJK.search(plain) and any(line.strip().startswith(plain) for line in lines), lines
    chinese(cost.line("pairs"))
    assert plain in str(cost.verdict("pairs"))


# --- helpers.max_batch --------------------------------------------------------------------------


def test_max_batch_probe_words_and_refusals_are_chinese() -> None:
    result = max_batch.find_max_batch(lambda b: b <= 5, limit=16)
    body = str(result).splitlines()
    chinese(body[0])
    assert {line.split()[1] for line in body[3:]} == {"是", "否"}  # a probe's yes / no
    assert max_batch.try_step(lambda: 1).message == "成功"
    raises_chinese(TypeError, lambda: max_batch.try_step(3))
    raises_chinese(TypeError, lambda: max_batch.find_max_batch(lambda b: "yes"))
    raises_chinese(TypeError, lambda: max_batch.find_max_batch(3))
    raises_chinese(ValueError, lambda: max_batch.find_max_batch(lambda b: True, start=8, limit=4))
    with pytest.raises(ValueError) as exc:
        max_batch.find_max_batch(lambda b: True, start=0)
    assert "第一个要尝试的批大小" in str(exc.value)
    model = nn.Sequential(nn.Linear(4, 4))
    raises_chinese(ValueError, lambda: max_batch.max_batch_under_budget(model, (4,), "1 GiB"))
    raises_chinese(ValueError, lambda: max_batch.max_batch_under_budget(model, (4,), 0))
    raises_chinese(
        ValueError, lambda: max_batch.max_batch_under_budget(model, (4,), 2**30, method="guess")
    )
    raises_chinese(TypeError, lambda: max_batch.max_batch_before_oom(3, "cpu"))


# --- helpers.memory_bill ------------------------------------------------------------------------


def test_memory_bills_are_chinese(fake_gpu) -> None:  # noqa: ANN001
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    for bill in (
        memory_bill.estimate_training_memory(model, 4, (8,), precision="bf16"),
        memory_bill.MemoryBill(1, 2, 3, 4),
    ):
        for line in str(bill).splitlines():
            if not set(line) <= set("- "):
                chinese(line)
    x, y = torch.randn(4, 8), torch.randn(4, 4)
    opt = torch.optim.Adam(model.parameters())
    measured = memory_bill.measure_training_memory(model, opt, nn.functional.mse_loss, x, y)
    chinese(measured.label)
    fake_gpu("h100_sxm")
    on_gpu = memory_bill.estimate_training_memory(model, 4, (8,), device="cuda")
    assert on_gpu.context is not None
    chinese(str(on_gpu).splitlines()[-1])  # the CUDA context's row


def test_memory_bill_refusals_are_chinese() -> None:
    raises_chinese(TypeError, lambda: memory_bill.estimate_training_memory("mlp", 1, (1,)))
    raises_chinese(ValueError, lambda: memory_bill.estimate_training_memory(nn.ReLU(), 1, (1,)))
    model = nn.Linear(2, 2)
    known = ", ".join(memory_bill.OPTIMIZER_COPIES)
    raises_chinese(ValueError, lambda: memory_bill.optimizer_kind("lion"), known)
    rms = torch.optim.RMSprop(model.parameters())
    raises_chinese(ValueError, lambda: memory_bill.optimizer_kind(rms))
    raises_chinese(DeviceError, lambda: memory_bill.outside_allocator("cpu"))


@pytest.mark.parametrize(
    "others",
    [
        GpuTenants(0),
        GpuTenants(2, 3 * 2**30),
        GpuTenants(None, note="NVML 不可用"),
        GpuTenants(1, note="容器"),
        GpuTenants(1),
        GpuTenants(1, 40 * 2**30),
    ],
)
def test_memory_outside_the_allocator_is_chinese(others: GpuTenants) -> None:
    reading = memory_bill.OutsideAllocator(10 * 2**30, 2**30, others)
    chinese(reading)


def test_bill_sweep_and_its_plot_are_chinese() -> None:
    result = memory_bill.bill_sweep(
        8, checkpointing=True, device="cpu", width=16, depth=2, points=2
    )
    head, *table = str(result).splitlines()
    chinese(head)
    table_chinese("\n".join(table))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for text in figure_texts(memory_bill.plot_bill_sweep(result)):
            if text != "MiB":
                chinese(text)
    rows = [{"batch": 8, "CUDA peak MiB": 1.0, "peak during": "backward"}]
    settings = dict(result.settings, checkpointing=False)
    gpu_like = memory_bill.BillSweep(SweepResult("batch", rows, "显存不足"), settings)
    assert "反向传播" in str(gpu_like) and "峰值出现在" in str(gpu_like)
    assert gpu_like.sweep.rows[0]["peak during"] == "backward"  # the data keeps its key
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fig = memory_bill.plot_bill_sweep(
            memory_bill.BillSweep(
                SweepResult(
                    "batch", [dict(r, **{"predicted MiB": 1.0}) for r in result.sweep.rows], "x"
                ),
                result.settings,
            )
        )
    chinese(fig._suptitle.get_text())
    plt.close(fig)


# --- helpers.loops and helpers.same_math --------------------------------------------------------


def test_loop_refusals_are_chinese() -> None:
    model = nn.Linear(2, 2)
    raises_chinese(ValueError, lambda: loops.make_adam(model.parameters(), impl="lion"))
    raises_chinese(ValueError, lambda: loops.float32_bias_corrections("lion", "cpu"))
    raises_chinese(ValueError, lambda: loops.flatten_parameters(nn.ReLU()))
    frozen = nn.Linear(2, 2)
    frozen.bias.requires_grad_(False)
    raises_chinese(ValueError, lambda: loops.flatten_parameters(frozen))
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double())
    raises_chinese(ValueError, lambda: loops.flatten_parameters(mixed), ".to(device, dtype)")
    raises_chinese(ValueError, lambda: loops.FlatAdam(torch.ones(2)))
    flat = loops.flatten_parameters(nn.Linear(2, 2))
    raises_chinese(ValueError, lambda: loops.FlatAdam(flat, lr=-1))
    raises_chinese(TypeError, lambda: loops.time_once(3))
    raises_chinese(ValueError, lambda: loops.same_but_for([1.0], [1.0, 2.0]))
    raises_chinese(ValueError, lambda: loops.same_but_for(["a"], [1.0]))
    raises_chinese(ValueError, lambda: loops.same_but_for([float("inf")], [1.0]))
    raises_chinese(ValueError, lambda: loops.same_but_for([1.0], [1.0], ([1.0, 2.0], [1.0])))
    with pytest.raises(ValueError) as exc, loops.torch_threads(0):
        pass
    assert "线程数" in str(exc.value)


def test_same_math_refusals_and_noise_floor_are_chinese() -> None:
    raises_chinese(ValueError, lambda: same_math.loss_gaps([1.0], [1.0, 2.0]))
    raises_chinese(ValueError, lambda: same_math.noise_floor("基线", [float("nan")], [1.0], [1.0]))
    floor = same_math.noise_floor("基线", [5.5, 5.2], [5.5, 5.2], [5.5, 5.2])
    assert "本底噪声" in chinese(floor)
    raises_chinese(ValueError, lambda: same_math.same_math("x", [1.0] * 3, [1.0] * 3, floor))
    raises_chinese(ValueError, lambda: same_math.same_math("x", [1.0], [1.0], None).as_control())


# --- helpers.syncs ------------------------------------------------------------------------------


def test_sync_counter_and_its_kinds_are_chinese() -> None:
    t = torch.ones(3)
    _, counter = syncs.count_syncs(lambda: (t.sum().item(), f"{t[0]:.1f}", t[t > 0]))
    text = chinese(counter)
    assert text.startswith("3 次主机同步：") and ".item() x1" in text
    for place in counter.by_place():
        chinese(place)
    counter.events.append(syncs.SyncEvent(".item()", "cpu", "torch/x.py:1", False))
    counter.cuda_syncs = 2
    chinese(counter)
    _, none = syncs.count_syncs(lambda: t * 2)
    chinese(none)
    kinds = list(syncs.sync_kinds())
    for kind, _ in kinds:
        chinese(kind)
    assert ("读取值", "f-string 格式化") in kinds
    raises_chinese(TypeError, lambda: syncs.count_syncs(3))
    if not torch.cuda.is_available():
        raises_chinese(RuntimeError, lambda: syncs.SyncCounter(cuda_debug=True))


# --- helpers.step_profile and helpers.profiling -------------------------------------------------

BUCKETS = (
    step_profile.MATMUL,
    step_profile.OPTIMIZER,
    step_profile.FUSED,
    step_profile.COPIES,
    step_profile.OTHER,
)


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_step_profile_table_and_advice_are_chinese(device: str) -> None:
    idle = step_profile.IDLE_GPU if device != "cpu" else step_profile.IDLE_CPU
    buckets = {b: 0.001 * (i + 1) for i, b in enumerate((*BUCKETS, idle))}
    profile_ = step_profile.StepProfile(device, 0.05, buckets, {step_profile.MATMUL: "aten::mm"})
    lines = str(profile_).splitlines()
    chinese(lines[0])
    chinese(lines[1])  # the headers
    for line in lines[3:]:
        chinese(line)
    everything = ["fused_adamw", "graphs", "compile", "resident"]
    for on, available in (([], everything), (everything, everything), (["graphs"], []), ([], [])):
        for line in step_profile.advice(profile_, on, available, n=6):
            chinese(line)


def summary(**kw: object) -> profiling.ProfileSummary:
    return profiling.ProfileSummary(**{"steps": 1, "step_s": 0.01, "ops": 10.0, **kw})


@pytest.mark.parametrize(
    ("kw", "verdict"),
    [
        ({"labels_s": {"data": 0.005}}, "input-bound"),
        ({"sync_s": 0.005}, "sync-bound"),
        ({"device_busy_s": 0.009}, "compute-bound"),
        ({}, "launch/overhead-bound"),
        ({"device_busy_s": 0.002}, "launch/overhead-bound"),
    ],
)
def test_every_diagnosis_is_chinese(kw: dict, verdict: str) -> None:
    d = profiling.diagnose(summary(**kw))
    assert d.verdict == verdict  # the verdict itself stays a key
    chinese(d)
    chinese(profiling.diagnose(summary(**kw), machine=BUSY))
    compute = profiling.diagnose(summary(), flops_per_step=1e9, flop_rate=1e11)
    assert compute.verdict == "compute-bound"
    chinese(compute)


def test_profiling_refusals_and_plot_are_chinese() -> None:
    raises_chinese(ValueError, lambda: profiling.profile_steps(lambda: None, "cpu", warmup=0))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(2).sum()
    raises_chinese(ValueError, lambda: profiling.summarize_profile(prof))
    raises_chinese(ValueError, lambda: profiling.diagnose(summary(step_s=0.0)))
    with profile(activities=[ProfilerActivity.CPU]) as empty:
        pass
    raises_chinese(ValueError, lambda: profiling.matmul_share(empty, "cpu"))
    toy = profiling.ToyAsyncDevice()
    toy.close()
    raises_chinese(RuntimeError, lambda: toy.kernel(0.0))
    raises_chinese(ValueError, lambda: profiling.plot_timing_methods({}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        texts = figure_texts(profiling.plot_timing_methods({"time.perf_counter": [0.001, 0.002]}))
    for text in texts:
        chinese(text)


# --- helpers.case_study -------------------------------------------------------------------------


def case_rows() -> list[dict]:
    ms = [377.4, 250.0, 230.0, 209.9, 40.0]
    rows = [
        {
            "variant": name,
            "ms per epoch": m,
            "IQR (ms)": 1.0,
            "speed-up vs previous": (ms[i - 1] if i else m) / m,
            "speed-up vs slow": ms[0] / m,
            "final loss": 0.5,
            "max |Δ param|": 0.0,
            "same result as slow": "yes",
        }
        for i, ((name, _), m) in enumerate(zip(case_study.VARIANTS, ms))
    ]
    rows[-1]["same result as slow"] = "different math (batch 1024, 8 steps)"
    return rows


def test_case_study_table_names_and_verdicts_are_chinese() -> None:
    rows = case_rows()
    table = case_study.CaseStudyTable(rows, [QUIET] * len(rows), 5)
    lines = str(table).splitlines()
    chinese(lines[0])  # the headers
    for line in lines[2:]:
        chinese(line)
    assert rows[0]["variant"] == "slow loop, as written"  # the rows keep their names
    assert rows[-1]["same result as slow"].startswith("different math")
    for verdict in table.verdicts():
        chinese(verdict)
    bare = case_study.CaseStudyTable(rows, [None] * len(rows), 5)
    chinese(str(bare).splitlines()[-1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fig = case_study.plot_case_study(rows)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    for text in [*labels, *figure_texts(fig)]:
        chinese(text)
    raises_chinese(ValueError, lambda: case_study.plot_case_study([]))
    cs = case_study.make_case_study(64)
    unknown = [("x", {"fast": True})]
    raises_chinese(ValueError, lambda: case_study.time_interleaved(cs, "cpu", unknown))


def test_the_widget_run_and_its_plot_are_chinese() -> None:
    result = case_study.run_fixes(n_samples=128, rounds=1)
    chinese(result["verdict"])
    assert result["chosen"] == [
        case_study.FIX_NAMES[k] for k in ("preprocess_once", "resident", "no_sync")
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fig = case_study.plot_fixes(result)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    for text in [*labels, *figure_texts(fig)]:
        chinese(text)
    none = dict(result, chosen=[])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fig = case_study.plot_fixes(none)
    assert "没有修复" in [t.get_text() for t in fig.axes[0].get_xticklabels()]
    plt.close(fig)


# --- helpers.cuda_graphs ------------------------------------------------------------------------


def test_cuda_graph_plan_table_and_refusal_are_chinese(fake_gpu) -> None:  # noqa: ANN001
    chinese(cuda_graphs.graph_capture_plan("cpu")[1])
    chinese(format_table(cuda_graphs.bias_correction_rows((1, 10))).splitlines()[0])
    raises_chinese(ValueError, lambda: cuda_graphs.batch_shapes(0, 4))
    fake_gpu("h100_sxm")
    chinese(cuda_graphs.graph_capture_plan("cuda")[1])


# --- helpers.sampler ----------------------------------------------------------------------------


def test_samplers_monitor_and_plot_are_chinese(fake_gpu) -> None:  # noqa: ANN001
    process = sampler.process_sampler()
    chinese(process.label)
    for name in process():
        chinese(name)
    with sampler.Monitor(process, interval=0.01) as monitor:
        torch.ones(64, 64) @ torch.ones(64, 64)
    chinese(format_table([{"量": k, **v} for k, v in monitor.summary().items()]).splitlines()[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for text in figure_texts(sampler.plot_samples(monitor)):
            chinese(text)
    raises_chinese(TypeError, lambda: sampler.Monitor(3))
    raises_chinese(ValueError, lambda: sampler.Monitor(process, interval=0))
    raises_chinese(ValueError, lambda: sampler.plot_samples(sampler.Monitor(process)))
    running = sampler.Monitor(process, interval=0.01).start()
    try:
        raises_chinese(RuntimeError, running.start)
    finally:
        running.stop()

    def broken() -> dict[str, float]:
        raise OSError("x")

    raises_chinese(sampler.MonitorUnavailable, sampler.Monitor(broken).start)
    fake_gpu("h100_sxm")
    gpu = sampler.nvml_sampler()
    try:
        chinese(gpu.label, cjk=False)
        for name in gpu():
            chinese(name)
    finally:
        gpu.close()


def test_english_is_unchanged_after_switching_back() -> None:
    set_language("en")
    assert str(amp_choice.choose_amp_dtype({"kind": "xpu"})) == (
        "bf16: Intel GPU: bf16 in hardware (XMX), no scaler"
    )
    assert str(memory_bill.MemoryBill(1, 2, 3, 4)).startswith("estimate\n")
    assert amp_sweep.memory_meter("xpu") == (
        "not measured on xpu: no peak meter for this device kind here"
    )
    assert fp8.fp8_available("cpu")[1].endswith("this is cpu")
    assert profiling.diagnose(summary(labels_s={"data": 0.005})).reason == (
        "50% of each step is spent getting the batch"
    )
