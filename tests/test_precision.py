"""helpers.precision: formats, the AMP dtype rule, probes, the fp32-vs-AMP sweep and its widget."""

from __future__ import annotations

import time

import ipywidgets as widgets
import matplotlib
import pytest
import torch
from torch import nn

matplotlib.use("Agg")

from helpers.devices import DeviceError, DeviceInfo  # noqa: E402
from helpers.precision import (  # noqa: E402
    SAVED_METER,
    AmpChoice,
    AmpSweep,
    PrecisionError,
    amp_controls,
    amp_for_device,
    check_autocast,
    choose_amp_dtype,
    default_batch_sizes,
    default_width,
    demo_dtype,
    finfo_rows,
    format_bits,
    fp8_dtypes,
    fp16_fate,
    grad_scaler_works,
    local_cpu_flags,
    make_mlp,
    measure_amp_step,
    memory_meter,
    parse_precision,
    plot_amp_sweep,
    run_amp_sweep,
    saved_activation_bytes,
    step_peak_bytes,
    wide_mlp_sizes,
)
from helpers.widgets import interactive_plot  # noqa: E402

CPU_HAS_FP16 = "amx_fp16" in local_cpu_flags()


# --- formats ------------------------------------------------------------------------------------


def test_format_bits() -> None:
    assert format_bits(torch.float32) == (8, 23)
    assert format_bits(torch.float16) == (5, 10)
    assert format_bits(torch.bfloat16) == (8, 7)


def test_finfo_rows() -> None:
    rows = {r["format"]: r for r in finfo_rows()}
    assert rows["fp16"]["max"] == 65504 and rows["fp16"]["smallest subnormal"] == 2.0**-24
    assert rows["bf16"]["smallest normal"] == rows["fp32"]["smallest normal"] == 2.0**-126
    assert rows["tf32 (matmul only)"]["mantissa bits"] == 10
    assert rows["tf32 (matmul only)"]["exponent bits"] == 8
    for dt in fp8_dtypes():
        assert str(dt).removeprefix("torch.") in rows
    assert [r["format"] for r in finfo_rows(include_tf32=False, include_fp8=False)] == [
        "fp32",
        "fp16",
        "bf16",
    ]


@pytest.mark.parametrize(
    ("value", "fate"),
    [
        (1.0, "normal"),
        (0.0, "zero"),
        (1e-4, "normal"),
        (1e-6, "subnormal"),
        (4e-8, "subnormal"),
        (2e-8, "zero"),
        (-1e-9, "zero"),
        (65510.0, "normal"),
        (65520.0, "inf"),
        (-7e4, "inf"),
    ],
)
def test_fp16_fate(value: float, fate: str) -> None:
    assert fp16_fate(value) == fate


# --- parsing and choosing -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("fp32", torch.float32),
        ("bf16", torch.bfloat16),
        ("Float16", torch.float16),
        ("torch.bfloat16", torch.bfloat16),
        (torch.float16, torch.float16),
    ],
)
def test_parse_precision(name: object, dtype: torch.dtype) -> None:
    assert parse_precision(name) == dtype


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("fp8", "Unknown precision 'fp8'. Use one of fp32, bf16, fp16"),
        ("half-ish", "Unknown precision"),
        ("fp64", "fp64 is not a mixed-precision choice"),
        (torch.int8, "not a mixed-precision choice"),
    ],
)
def test_parse_precision_rejects(name: object, message: str) -> None:
    with pytest.raises(PrecisionError, match=message):
        parse_precision(name)
    assert issubclass(PrecisionError, DeviceError) and issubclass(PrecisionError, ValueError)


MACHINES = [
    ({"kind": "cuda", "compute_capability": (7, 5), "bf16_reported": True}, "fp16", True),
    ({"kind": "cuda", "compute_capability": (7, 0)}, "fp16", True),
    ({"kind": "cuda", "compute_capability": (8, 0)}, "bf16", False),
    ({"kind": "cuda", "compute_capability": [9, 0]}, "bf16", False),
    ({"kind": "cuda", "compute_capability": (6, 1), "bf16_reported": True}, "fp32", False),
    ({"kind": "cpu", "cpu_flags": ["avx512f", "avx512_bf16"]}, "bf16", False),
    ({"kind": "cpu", "cpu_flags": "avx2 amx_bf16 amx_tile"}, "bf16", False),
    ({"kind": "cpu", "cpu_flags": ["avx2", "avx512f"]}, "fp32", False),
    ({"kind": "cpu", "bf16_native": True}, "bf16", False),
    ({"kind": "cpu"}, "fp32", False),
    ({"kind": "rocm", "name": "AMD Instinct MI250X", "bf16_reported": True}, "bf16", False),
    ({"kind": "rocm", "bf16_native": False}, "fp16", True),
    ({"kind": "MPS"}, "fp16", True),
    ({"kind": "xpu"}, "bf16", False),
    ({"kind": "tpu"}, "fp32", False),
]


@pytest.mark.parametrize(("desc", "name", "scaler"), MACHINES)
def test_choose_amp_dtype(desc: dict, name: str, scaler: bool) -> None:
    choice = choose_amp_dtype(desc)
    assert (choice.name, choice.use_scaler) == (name, scaler)
    assert choice.enabled == (name != "fp32") and choice.reason
    assert str(choice).startswith(name)


def test_choose_amp_dtype_from_device_info() -> None:
    t4 = DeviceInfo(
        device="cuda:0",
        kind="cuda",
        name="Tesla T4",
        total_memory=16 * 2**30,
        memory_label="GPU memory",
        compute_capability=(7, 5),
        bf16_reported=True,
        bf16_native=False,
    )
    choice = choose_amp_dtype(t4)
    assert choice.name == "fp16" and choice.use_scaler and "emulate" in choice.reason
    cpu = DeviceInfo(
        device="cpu", kind="cpu", name="x", total_memory=None, memory_label="RAM", bf16_native=True
    )
    assert choose_amp_dtype(cpu).name == "bf16"


T4 = {"kind": "cuda", "name": "Tesla T4", "compute_capability": (7, 5), "bf16_reported": True}
OLD_CPU = {"kind": "cpu", "cpu_flags": ["avx2", "avx512f"]}


@pytest.mark.parametrize(
    ("desc", "prefer", "message"),
    [
        (
            T4,
            "bf16",
            "bf16 cannot run at a useful speed here.*emulated.*fp16 with a GradScaler.*allow_slow",
        ),
        (OLD_CPU, "fp16", "fp16 cannot run at a useful speed here.*slow fallback.*allow_slow=True"),
        (OLD_CPU, "bf16", "no bf16 units"),
        ({"kind": "meta"}, "fp16", "fp16 cannot run on a 'meta' device: torch has no autocast"),
        ({"kind": "mps"}, "bf16", "macOS 14"),
        (T4, "fp8", "Unknown precision 'fp8'"),
        (T4, "float64", "not a mixed-precision choice"),
        ({"name": "no kind"}, "auto", "needs a 'kind'"),
        ({"kind": "cuda"}, "auto", "needs compute_capability"),
        ({"kind": "cuda", "compute_capability": "8.0"}, "auto", r"\(major, minor\) pair"),
    ],
)
def test_choose_amp_dtype_errors(desc: dict, prefer: str, message: str) -> None:
    with pytest.raises(PrecisionError, match=message):
        choose_amp_dtype(desc, prefer=prefer)


def test_choose_amp_dtype_preferences() -> None:
    slow = choose_amp_dtype(T4, prefer="bf16", allow_slow=True)
    assert slow.name == "bf16" and not slow.use_scaler and "emulated" in slow.reason
    fp16 = choose_amp_dtype(OLD_CPU, prefer="fp16", allow_slow=True)
    assert fp16.use_scaler
    assert (
        choose_amp_dtype({"kind": "cpu", "cpu_flags": ["amx_fp16"]}, prefer="fp16").name == "fp16"
    )
    off = choose_amp_dtype(T4, prefer="fp32")
    assert off == AmpChoice(torch.float32, False, "fp32 requested: AMP off") and not off.enabled
    a100 = {"kind": "cuda", "compute_capability": (8, 0)}
    assert choose_amp_dtype(a100, prefer="float16").use_scaler  # fp16 runs fine on an A100
    assert choose_amp_dtype({"kind": "mps", "bf16_native": True}, prefer="bf16").name == "bf16"


# --- probes on this machine ---------------------------------------------------------------------


def test_check_autocast_on_cpu() -> None:
    assert check_autocast("cpu", "bf16") == torch.bfloat16
    assert check_autocast("cpu", torch.float16) == torch.float16
    assert check_autocast("cpu", "fp32") == torch.float32


@pytest.mark.parametrize(
    ("device", "dtype", "error", "message"),
    [
        ("meta", "fp16", PrecisionError, "no autocast for 'meta'"),
        ("cpu", "fp64", PrecisionError, "not a mixed-precision choice"),
        ("cpu", "fp9", PrecisionError, "Unknown precision"),
        ("gpu", "fp16", DeviceError, "not a device name"),
    ],
)
def test_check_autocast_rejects(device: str, dtype: str, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        check_autocast(device, dtype)


def test_grad_scaler_works_on_cpu() -> None:
    assert grad_scaler_works("cpu")


def test_amp_for_this_cpu() -> None:
    flags = local_cpu_flags()
    choice = amp_for_device("cpu")
    native = bool({"avx512_bf16", "amx_bf16"} & set(flags))
    assert choice.name == ("bf16" if native else "fp32") and not choice.use_scaler
    assert amp_for_device("cpu", prefer="fp32").name == "fp32"
    assert amp_for_device("cpu", prefer="fp16", allow_slow=True).name == "fp16"
    if not CPU_HAS_FP16:
        with pytest.raises(PrecisionError, match="fp16 cannot run at a useful speed"):
            amp_for_device("cpu", prefer="fp16")


def test_demo_dtype() -> None:
    bf16 = AmpChoice(torch.bfloat16, False, "x")
    off = AmpChoice(torch.float32, False, "AMP off")
    assert demo_dtype("cpu", bf16) == torch.bfloat16
    assert demo_dtype("cpu", off) == torch.bfloat16  # a CPU demo always uses bf16
    assert demo_dtype("cpu", AmpChoice(torch.float16, True, "x")) == torch.float16


# --- models and meters --------------------------------------------------------------------------


def test_make_mlp_and_sizes() -> None:
    model = make_mlp((20, 64, 32, 1))
    linears = [m for m in model if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(20, 64), (64, 32), (32, 1)]
    assert sum(isinstance(m, nn.ReLU) for m in model) == 2
    assert wide_mlp_sizes(8, depth=2) == (8, 8, 8, 1)
    assert default_width("cpu") < default_width("cuda")
    assert max(default_batch_sizes("cpu")) < max(default_batch_sizes("cuda"))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: make_mlp((20,)), "at least an input and an output"),
        (lambda: make_mlp((20, 0, 1)), "must be > 0"),
        (lambda: make_mlp((20, 2.5, 1)), "whole number"),
        (lambda: wide_mlp_sizes(-4), "width must be > 0"),
    ],
)
def test_model_bad_input(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


def test_saved_activation_bytes_counts_exactly() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 4), nn.ReLU(), nn.Linear(4, 2))
    x = torch.randn(16, 8)
    params = list(model.parameters())
    fp32, _ = saved_activation_bytes(lambda: model(x).sum(), exclude=params)
    assert fp32 == 16 * 8 * 4 + 16 * 4 * 4  # the input and the ReLU output, fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16, out = saved_activation_bytes(lambda: model(x).float().sum(), exclude=params)
    # the same two activations in bf16, plus the bf16 copy of the second weight (2 x 4)
    assert bf16 == 16 * 8 * 2 + 16 * 4 * 2 + 2 * 4 * 2
    out.backward()  # the graph is intact
    assert model[0].weight.grad is not None


def test_memory_meter_says_what_it_measures() -> None:
    for kind in ("cuda", "mps", "cpu"):
        assert "peak during one step over the memory held before it" in memory_meter(kind)
    assert "max_memory_allocated, exact" in memory_meter("cuda")
    assert "sampled" in memory_meter("mps") and "approximate" in memory_meter("mps")
    assert "torch.profiler, exact" in memory_meter("cpu")
    assert "not measured on xpu" in memory_meter("xpu")
    assert "saved for backward" in SAVED_METER and "every device" in SAVED_METER


def test_step_peak_bytes_on_cpu_is_exact() -> None:
    held = torch.ones(2**20)  # 4 MiB allocated before: not part of the peak

    def step() -> torch.Tensor:
        a = torch.ones(2**18)  # 1 MiB
        b = a * 2  # 1 MiB more: the peak is 2 MiB
        del a
        return (b + held[: 2**18]).sum()

    peak = step_peak_bytes(step, "cpu")
    assert 2 * 2**20 <= peak < 2 * 2**20 + 4096


def test_step_peak_bytes_on_cuda_reads_the_allocator(fake_gpu) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm")
    gpu.allocate(1000)  # held before the step

    def step() -> None:
        gpu.allocate(300)
        gpu.free(300)
        gpu.allocate(10)

    assert step_peak_bytes(step, "cuda") == 300
    assert gpu.allocated == 1010 and gpu.synchronize_calls >= 2


def test_step_peak_bytes_on_mps_samples(fake_gpu) -> None:  # noqa: ANN001
    gpu = fake_gpu("mps")
    gpu.allocate(1000)

    def step() -> None:
        gpu.allocate(500)
        time.sleep(0.05)  # long enough for the 1 ms sampler
        gpu.free(500)

    assert step_peak_bytes(step, "mps") == 500


def test_step_memory_excludes_the_previous_steps_gradients() -> None:
    """The bug of issue 13: stale gradients counted as 'held before', so the peak never grew."""
    sizes = (64, 64, 64, 1)
    small = measure_amp_step(sizes, 4, "fp32", "cpu", min_run_time=0.01)
    large = measure_amp_step(sizes, 2048, "fp32", "cpu", min_run_time=0.01)
    params = sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:])) * 4 / 2**20
    assert small["peak MiB"] >= params  # at least the fresh gradients
    assert large["saved MiB"] > 100 * small["saved MiB"]  # activations grow with the batch
    assert large["peak MiB"] > small["peak MiB"] + large["saved MiB"] / 2


# --- measuring, plotting, the widget ------------------------------------------------------------


def test_measure_amp_step() -> None:
    row = measure_amp_step((16, 16, 1), 8, "bf16", "cpu", min_run_time=0.01)
    assert set(row) == {"ms/step", "spread %", "samples/s", "peak MiB", "saved MiB"}
    assert row["ms/step"] > 0 and row["samples/s"] > 0
    assert row["peak MiB"] > 0 and row["saved MiB"] > 0
    with pytest.raises(ValueError, match="batch_size must be > 0"):
        measure_amp_step((16, 1), 0, "fp32", "cpu")
    with pytest.raises(PrecisionError, match="Unknown precision"):
        measure_amp_step((16, 1), 4, "fp12", "cpu")


def small_sweep(**kw: object) -> AmpSweep:
    args = {"precisions": ("fp32", "bf16", "fp16"), "batch_sizes": (4, 8), "sizes": (16, 16, 1)}
    return run_amp_sweep("cpu", min_run_time=0.01, **{**args, **kw})


def test_run_amp_sweep_skips_slow_fp16_with_a_reason() -> None:
    sweep = small_sweep(allow_slow=not local_cpu_flags())  # bf16 emulated: allow it there
    assert sweep.results["fp32"].column("batch size") == [4, 8]
    if not CPU_HAS_FP16:
        assert "fp16" not in sweep.results and "allow_slow" in sweep.skipped["fp16"]
    assert sweep.speedup("fp32", 8) == 1.0 and sweep.speedup("bf16", 4) > 0
    rows = sweep.rows()
    assert {r["precision"] for r in rows} >= {"fp32", "bf16"} and rows[0]["vs fp32"] == "1.00x"
    text = str(sweep)
    assert "MLP 16-16-1" in text and "peak MiB =" in text and "saved MiB =" in text
    with pytest.raises(KeyError, match="not measured"):
        sweep.speedup("bf16", 1024)


def test_run_amp_sweep_allow_slow_runs_fp16() -> None:
    sweep = small_sweep(precisions=("fp16",), batch_sizes=(4,), allow_slow=True)
    assert sweep.results["fp16"].column("batch size") == [4] and not sweep.skipped
    assert sweep.rows()[0]["vs fp32"] == "n/a"


@pytest.mark.parametrize(
    ("kw", "error", "message"),
    [
        ({"precisions": ()}, ValueError, "at least one precision"),
        ({"precisions": ("fp32", "fp4")}, PrecisionError, "Unknown precision 'fp4'"),
        ({"batch_sizes": (4, -1)}, ValueError, "batch size must be > 0"),
        ({"sizes": (16,)}, ValueError, "at least an input and an output"),
    ],
)
def test_run_amp_sweep_bad_input(kw: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        small_sweep(**kw)


def test_plot_amp_sweep() -> None:
    sweep = small_sweep(precisions=("fp32", "fp16"), allow_slow=False)
    fig = plot_amp_sweep(sweep)
    rate, mem = fig.axes
    assert len(rate.lines) == len(sweep.results) and len(mem.lines) == 2 * len(sweep.results)
    assert "samples / s" in rate.get_ylabel() and "peak" in mem.get_title()
    assert "saved for backward" in mem.get_title()
    if sweep.skipped:
        assert "skipped: fp16" in fig._suptitle.get_text()


def test_widget_button_runs_the_sweep() -> None:
    controls = amp_controls("cpu", precisions=("fp32", "bf16"))
    assert controls["precisions"].value == ("fp32", "bf16")
    assert controls["width"].value == default_width("cpu")
    assert controls["batch_sizes"].value == default_batch_sizes("cpu")

    def run(precisions, batch_sizes, width, allow_slow):  # noqa: ANN001, ANN202
        return run_amp_sweep(
            "cpu",
            precisions,
            batch_sizes,
            sizes=(16, width // 64, 1),
            allow_slow=allow_slow,
            min_run_time=0.01,
        )

    box = interactive_plot(run, plot_amp_sweep, controls)
    controls["batch_sizes"].value = (8, 16)
    controls["allow_slow"].value = True
    box.run_button.click()
    assert isinstance(box.last_result, AmpSweep) and not box.run_button.disabled
    assert box.last_result.results["fp32"].column("batch size") == [8, 16]
    with pytest.raises(PrecisionError):
        amp_controls("cpu", precisions=("fp32", "fp7"))
    assert isinstance(controls["allow_slow"], widgets.Checkbox)


# --------------------------------------------------------------------------- TF32 (issue 15)


def test_is_tf32_names() -> None:
    from helpers.precision import is_tf32

    assert is_tf32("tf32") and is_tf32(" TensorFloat32 ")
    assert not is_tf32("fp32") and not is_tf32(torch.float32) and not is_tf32("bf16")


def test_sweep_precisions_cpu_has_no_tf32() -> None:
    from helpers.precision import sweep_precisions

    rows = sweep_precisions("cpu")
    assert rows[0] == "fp32" and "tf32" not in rows and set(rows) <= {"fp32", "bf16", "fp16"}


@pytest.mark.parametrize(
    ("kind", "want"),
    [("h100_sxm", ["fp32", "tf32", "bf16"]), ("a100", ["fp32", "tf32", "bf16"]),
     ("t4", ["fp32", "fp16"]), ("mi300x", ["fp32", "bf16"])],
)  # fmt: skip
def test_sweep_precisions_by_gpu(fake_gpu, monkeypatch, kind: str, want: list[str]) -> None:  # noqa: ANN001
    import helpers.precision as precision

    fake_gpu(kind)
    monkeypatch.setattr(precision, "check_autocast", lambda device, dtype: dtype)  # no kernels
    monkeypatch.setattr(precision, "grad_scaler_works", lambda device: True)
    assert precision.sweep_precisions("cuda") == want


def test_sweep_skips_tf32_where_it_does_not_exist() -> None:
    sweep = run_amp_sweep("cpu", ("fp32", "tf32"), (8,), sizes=(16, 16, 1), min_run_time=0.01)
    assert list(sweep.results) == ["fp32"]
    assert "compute capability 8.0+" in sweep.skipped["tf32"]
    assert "skipped tf32" in str(sweep)


def test_measure_tf32_rejected_on_cpu() -> None:
    with pytest.raises(PrecisionError, match="TF32 needs an NVIDIA GPU"):
        measure_amp_step((16, 16, 1), 8, "tf32", "cpu", min_run_time=0.01)


@pytest.mark.parametrize(("precision", "during"), [("fp32", False), ("tf32", True)])
def test_fp32_is_true_fp32_and_tf32_turns_it_on(monkeypatch, precision: str, during: bool) -> None:  # noqa: ANN001
    """The sweep's fp32 row runs with TF32 off even if the notebook turned it on; restored after."""
    import helpers.precision as precision_mod

    seen, real_benchmark = [], precision_mod.benchmark

    def fake_benchmark(step, **kwargs):  # noqa: ANN001, ANN003, ANN202
        seen.append(torch.backends.cuda.matmul.allow_tf32)
        step()
        return real_benchmark(step, **{**kwargs, "min_run_time": 0.01})

    monkeypatch.setattr(precision_mod, "tf32_available", lambda device=None: True)
    monkeypatch.setattr(precision_mod, "benchmark", fake_benchmark)
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = not during
    try:
        row = measure_amp_step((16, 16, 1), 8, precision, "cpu", min_run_time=0.01)
        assert seen == [during] and row["samples/s"] > 0
        assert torch.backends.cuda.matmul.allow_tf32 is (not during), "restored"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_an_empty_batch_size_list_is_an_error_not_the_defaults() -> None:
    with pytest.raises(ValueError, match="at least one batch size"):
        run_amp_sweep(precisions=["fp32"], batch_sizes=[], device="cpu")
