"""helpers.capstone: the levers, the Trainer, its measurement and the table helpers (chapter 7).

Tiny GPTs (1 layer, 16 channels, 8 tokens) keep every test to milliseconds of training; no
test here compiles. The device branches run on a CPU through the fake GPU (tests/fake_gpu.py):
sizes and lever availability read device properties only, and measure_trainer is fed a
stand-in trainer whose work runs on the CPU while the fake reports the GPU's memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest
import torch
from matplotlib.figure import Figure

from helpers import amp_choice, capstone
from helpers.amp_choice import AmpChoice
from helpers.capstone import (
    LEVER_TITLES,
    LeverRow,
    Levers,
    LeverSearch,
    Trainer,
    WindowDataset,
    batch_starts,
    capstone_sizes,
    describe_sdpa_kernel,
    keep_verdict,
    lever_available,
    measure_trainer,
    plot_levers,
    run_or_reason,
    same_losses,
    sdpa_backend,
)
from helpers.gpt import GPTConfig, text_bytes
from helpers.matmul import tf32_enabled
from helpers.units import MiB

TINY = GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=8)
TOKENS = text_bytes()[:3000]


def make_trainer(levers: Levers = Levers(), **options: int) -> Trainer:
    """A Trainer of the tiny GPT on the first 3,000 bytes of text: batch 4, 2 steps an interval."""
    settings = {"batch_size": 4, "interval": 2, "steps": 3, **options}
    return Trainer(TINY, levers, TOKENS, device="cpu", **settings)


def losses_of(levers: Levers, intervals: int = 3) -> list[float]:
    """The losses of `intervals` log intervals (6 steps: the 3 batches twice) with `levers`."""
    trainer = make_trainer(levers)
    return [x for _ in range(intervals) for x in trainer.run()]


def row(
    label: str = "baseline", step_s: float = 0.01, spread: float = 0.0, **kw: object
) -> LeverRow:
    """A LeverRow with made-up figures."""
    figures = {
        "tokens_per_s": 1000.0,
        "saved_mib": 1.0,
        "peak_mib": None,
        "first_s": 0.1,
        "first_losses": [5.0, 4.0],
    }
    return LeverRow(label, step_s, spread, **{**figures, **kw})


# --------------------------------------------------------------------------- Levers


def test_levers_on_plus_and_label() -> None:
    base = Levers()
    assert base.on() == [] and base.label() == "baseline"
    both = base.plus("sdpa").plus("resident")
    assert both.on() == ["resident", "sdpa"]  # table order, not the order switched on
    assert both.label() == "resident + sdpa"
    assert base.on() == []  # plus returns a new Levers
    assert base.plus("sdpa").plus("sdpa") == Levers(sdpa=True)
    every = Levers()
    for name in LEVER_TITLES:
        every = every.plus(name)
    assert every.on() == list(LEVER_TITLES)


def test_a_bad_lever_name_lists_the_levers() -> None:
    with pytest.raises(ValueError, match=r"unknown lever 'flash'; the levers are resident, sdpa, "):
        Levers().plus("flash")


# --------------------------------------------------------------------------- data


def test_window_dataset_pairs_each_window_with_the_next_tokens() -> None:
    tokens = torch.arange(20)
    data = WindowDataset(tokens, 5)
    assert len(data) == 15
    x, y = data[3]
    assert x.tolist() == [3, 4, 5, 6, 7] and y.tolist() == [4, 5, 6, 7, 8]
    with pytest.raises(ValueError, match="seq_len"):
        WindowDataset(tokens, 0)


def test_batch_starts_are_seeded_and_in_range() -> None:
    starts = batch_starts(100, 8, batch_size=4, steps=50, seed=2)
    assert starts.shape == (50, 4) and starts.dtype == torch.int64
    assert starts.min() >= 0 and starts.max() + 8 + 1 <= 100  # every window fits
    assert torch.equal(starts, batch_starts(100, 8, 4, 50, seed=2))
    assert not torch.equal(starts, batch_starts(100, 8, 4, 50, seed=3))


def test_dataloader_and_resident_feeding_give_the_same_batches() -> None:
    loader, resident = make_trainer(), make_trainer(Levers(resident=True))
    starts = batch_starts(len(TOKENS), TINY.seq_len, 4, 3)
    for step in range(7):  # past the 3 batches: both start the same offsets again
        (xl, yl), (xr, yr) = loader._batch(), resident._batch()
        loader.step_count += 1
        resident.step_count += 1
        assert torch.equal(xl, xr) and torch.equal(yl, yr)
        first = int(starts[step % 3, 0])
        assert xl[0].tolist() == TOKENS[first : first + TINY.seq_len].tolist()
        assert torch.equal(xl[:, 1:], yl[:, :-1])


# --------------------------------------------------------------------------- Trainer


def test_trainer_runs_one_interval_and_counts_tokens() -> None:
    trainer = make_trainer()
    assert trainer.tokens_per_step == 4 * TINY.seq_len
    losses = trainer.run()
    assert len(losses) == 2 and all(isinstance(x, float) for x in losses)
    assert trainer.step_count == 2
    assert trainer.cfg.attention == "manual" and trainer.cfg.checkpoint is False
    assert trainer.scaler is None and trainer.amp_dtype is None
    assert trainer.forward is trainer.model
    resident = make_trainer(Levers(resident=True))
    assert resident.run() == losses


@pytest.mark.parametrize("name", ["resident", "sdpa", "fused_adamw", "checkpoint"])
def test_same_math_levers_train_to_the_baselines_losses(name: str) -> None:
    base = losses_of(Levers())
    losses = losses_of(Levers().plus(name))
    if name in ("resident", "checkpoint"):  # the very same kernels, in the same order
        assert losses == base
    gap = same_losses(losses, base, rtol=1e-5, atol=1e-5)
    assert 0 <= gap < 1e-5
    assert base[-1] < base[0]  # it learns


def test_levers_set_the_model_config() -> None:
    trainer = make_trainer(Levers(sdpa=True, checkpoint=True))
    assert trainer.cfg.attention == "sdpa" and trainer.cfg.checkpoint
    assert trainer.model.cfg == trainer.cfg
    assert make_trainer(Levers(fused_adamw=True)).optimizer.defaults["fused"] is True
    assert make_trainer().optimizer.defaults["fused"] is None


def test_compile_wraps_the_model_lazily() -> None:
    """torch.compile compiles at the first call; building the trainer compiles nothing."""
    trainer = make_trainer(Levers(compile=True))
    assert trainer.forward is not trainer.model
    assert trainer.forward._orig_mod is trainer.model


def test_an_unavailable_lever_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match=r"lever 'tf32' cannot run on cpu: TF32 needs an NVIDIA"):
        make_trainer(Levers(tf32=True))


def test_amp_runs_autocast_and_changes_only_the_rounding(monkeypatch: pytest.MonkeyPatch) -> None:
    bf16 = AmpChoice(torch.bfloat16, False, "bf16 for the test")
    monkeypatch.setattr(capstone, "amp_for_device", lambda device: bf16)
    trainer = make_trainer(Levers(amp=True))
    assert trainer.amp_dtype == torch.bfloat16 and trainer.scaler is None
    losses = [x for _ in range(3) for x in trainer.run()]
    base = losses_of(Levers())
    assert losses != base
    same_losses(losses, base, rtol=0.02, atol=0.02)


def test_fp16_amp_steps_through_the_grad_scaler(monkeypatch: pytest.MonkeyPatch) -> None:
    """The T4/MPS path (fp16 + GradScaler), run on the CPU, where torch 2.13 has both."""
    fp16 = AmpChoice(torch.float16, True, "fp16 for the test")
    monkeypatch.setattr(capstone, "amp_for_device", lambda device: fp16)
    trainer = make_trainer(Levers(amp=True))
    assert trainer.amp_dtype == torch.float16
    assert isinstance(trainer.scaler, torch.amp.GradScaler) and trainer.scaler.is_enabled()
    scale = trainer.scaler.get_scale()
    losses = [x for _ in range(3) for x in trainer.run()]
    assert trainer.scaler.get_scale() == scale  # no inf/nan step skipped at this scale
    same_losses(losses, losses_of(Levers()), rtol=0.02, atol=0.02)


def test_tf32_is_on_only_inside_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capstone, "lever_available", lambda name, device: (True, ""))
    trainer = make_trainer(Levers(tf32=True))
    seen: list[bool] = []
    real_step = trainer.step

    def step() -> torch.Tensor:
        seen.append(tf32_enabled())
        return real_step()

    monkeypatch.setattr(trainer, "step", step)
    before = tf32_enabled()
    trainer.run()
    assert seen == [True, True]
    assert tf32_enabled() == before


def test_saved_bytes_shrink_with_sdpa_and_checkpointing() -> None:
    trainer = make_trainer()
    manual = trainer.saved_bytes()
    assert trainer.step_count == 0  # peeking does not advance the data
    sdpa = make_trainer(Levers(sdpa=True)).saved_bytes()
    ckpt = make_trainer(Levers(checkpoint=True)).saved_bytes()
    assert 0 < sdpa < manual and 0 < ckpt < manual


# --------------------------------------------------------------------------- measuring


def test_measure_trainer_fills_the_row() -> None:
    trainer = make_trainer(Levers(resident=True))
    r = measure_trainer(trainer, min_run_time=0.01)
    assert r.label == "resident" and r.step_s > 0 and r.first_s > 0 and r.spread >= 0
    assert r.tokens_per_s == pytest.approx(trainer.tokens_per_step / r.step_s)
    assert r.saved_mib == pytest.approx(trainer.saved_bytes() / MiB)
    assert r.peak_mib is None  # no allocator to read on a CPU
    assert r.mfu is None and r.mfu_achievable is None
    assert (r.speedup, r.kept, r.parent_losses) == (1.0, "", [])
    assert len(r.first_losses) == trainer.interval
    assert r.first_losses == make_trainer(Levers(resident=True)).run()  # the first interval's
    with_mfu = measure_trainer(
        trainer, flops_per_token=1e6, peak_flops=1e12, achievable_flops=5e11, min_run_time=0.01
    )
    rate = with_mfu.tokens_per_s * 1e6
    assert with_mfu.mfu == pytest.approx(rate / 1e12)
    assert with_mfu.mfu_achievable == pytest.approx(rate / 5e11)


def test_lever_row_as_row_rounds_for_reading() -> None:
    r = row("resident + sdpa", step_s=0.0123, spread=0.04, tokens_per_s=12345.6, mfu=0.4567)
    r.speedup, r.kept = 1.5, "kept: yes"
    assert r.as_row() == {
        "levers": "resident + sdpa",
        "step ms": "12.30 ±4%",
        "tokens/s": "12,346",
        "saved MiB": "1.0",
        "peak MiB": "n/a",
        "MFU datasheet": "45.7%",
        "MFU achievable": "n/a",
        "speed-up": "1.50x",
        "kept?": "kept: yes",
    }
    assert row(peak_mib=1234.4).as_row()["peak MiB"] == "1234"


@pytest.mark.parametrize(
    ("step_s", "spread", "best_spread", "kept", "verdict"),
    [
        (0.008, 0.01, 0.01, True, "kept: 1.25x faster than without it (noise ±2%)"),
        (0.012, 0.01, 0.01, False, "dropped: 1.20x slower here"),
        (0.0099, 0.01, 0.01, False, "dropped: 1.01x is within the noise (±2%)"),
        (0.009, 0.15, 0.01, False, "dropped: 1.11x is within the noise (±15%)"),  # noisy row
        (0.009, 0.01, 0.05, True, "kept: 1.11x faster than without it (noise ±5%)"),
    ],
)
def test_keep_verdict(
    step_s: float, spread: float, best_spread: float, kept: bool, verdict: str
) -> None:
    best = row(step_s=0.01, spread=best_spread)
    assert keep_verdict(row(step_s=step_s, spread=spread), best) == (kept, verdict)


#: step_s each configuration "measures" in the LeverSearch tests: sdpa helps, fused_adamw does not.
STEP_S = {"baseline": 0.010, "sdpa": 0.008, "sdpa + fused_adamw": 0.0081, "resident + sdpa": 0.006}


def scripted_measure(trainer: Trainer) -> LeverRow:
    """A stand-in for measure_trainer: the step time from STEP_S, the first interval's losses."""
    losses = trainer.run()
    label = trainer.levers.label()
    return row(label, step_s=STEP_S[label], spread=0.01, first_losses=losses)


def test_lever_search_keeps_only_what_is_faster(capsys: pytest.CaptureFixture[str]) -> None:
    search = LeverSearch(make_trainer, scripted_measure)
    assert search.best.kept == "the baseline" and search.current == Levers()
    sdpa = search.try_lever("sdpa")
    assert sdpa.kept.startswith("kept: 1.25x") and search.current == Levers(sdpa=True)
    assert sdpa.parent_losses == search.rows[0].first_losses and sdpa.speedup == 1.25
    fused = search.try_lever("fused_adamw")
    assert fused.kept.startswith("dropped: ") and search.current == Levers(sdpa=True)
    assert fused.parent_losses == sdpa.first_losses
    assert search.try_lever("tf32") is None  # not on a CPU
    resident = search.try_lever("resident")
    assert resident.label == "resident + sdpa" and search.best is resident
    assert [r["levers"] for r in search.table()] == [
        "baseline",
        "sdpa",
        "sdpa + fused_adamw",
        "resident + sdpa",
    ]
    out = capsys.readouterr().out
    assert "sdpa: kept: 1.25x faster than without it (noise ±2%); now 1.25x the baseline" in out
    assert "tf32: skipped here: TF32 needs an NVIDIA GPU" in out
    assert "resident: kept: 1.33x faster" in out and "now 1.67x the baseline" in out


def test_lever_search_drops_a_lever_that_raises(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch.compile without a C++ compiler fails at the first call: the lever is dropped."""

    def no_compiler(model: torch.nn.Module) -> object:
        def call(*args: object) -> None:
            raise RuntimeError("InductorError: CppCompileError: C++ compile error\ndetails")

        return call

    monkeypatch.setattr(torch, "compile", no_compiler)
    search = LeverSearch(make_trainer, scripted_measure)
    assert search.try_lever("compile") is None
    assert len(search.rows) == 1 and search.current == Levers()
    assert (
        "compile: dropped, it failed here: RuntimeError: InductorError: CppCompileError: "
        "C++ compile error\n" in capsys.readouterr().out
    )


def test_same_losses_returns_the_gap_or_raises() -> None:
    assert same_losses([1.0, 2.0], [1.0, 2.0], rtol=0, atol=0) == 0
    assert same_losses([1.0, 2.0], [1.0, 2.001], rtol=0, atol=0.01) == pytest.approx(0.001)
    with pytest.raises(AssertionError):
        same_losses([1.0, 2.0], [1.0, 2.1], rtol=1e-4, atol=1e-4)
    with pytest.raises(AssertionError, match="shape"):  # curves of different lengths
        same_losses([1.0], [1.0, 2.0], rtol=1, atol=1)


def test_plot_levers_returns_a_figure() -> None:
    rows = [row(tokens_per_s=100.0), row("x" * 60, tokens_per_s=150.0)]
    rows[1].kept, rows[1].speedup = "kept: faster", 1.5
    fig = plot_levers(rows)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["x" * 45 + "...", "baseline"]  # long labels cut, first row on top
    colors = [tuple(p.get_facecolor()[:3]) for p in ax.patches]
    assert colors[0] != colors[1]  # the kept lever stands out
    assert ax.get_title() == "the capstone's levers: green = kept"
    assert plot_levers(rows, title="mine").axes[0].get_title() == "mine"


def test_run_or_reason_returns_the_value_or_why() -> None:
    assert run_or_reason(lambda: 42) == (42, "")

    def fails() -> None:
        raise RuntimeError("Compiler: cc is not found\nmore detail")

    assert run_or_reason(fails) == (None, "RuntimeError: Compiler: cc is not found")
    assert run_or_reason(lambda: {}["key"]) == (None, "KeyError: 'key'")
    assert run_or_reason(lambda: [][0])[1].startswith("IndexError: ")


# --------------------------------------------------------------------------- SDPA kernels


@pytest.mark.parametrize(
    ("ops", "expected"),
    [
        (["aten::_scaled_dot_product_flash_attention_for_cpu"], "flash (CPU kernel)"),
        (["aten::_scaled_dot_product_cudnn_attention"], "cuDNN"),
        (["aten::_scaled_dot_product_flash_attention", "aten::_flash_attention_forward"], "flash"),
        (["aten::_scaled_dot_product_efficient_attention"], "memory-efficient"),
        (["aten::_efficient_attention_forward"], "memory-efficient"),
        (["aten::_scaled_dot_product_attention_math"], "math (the unfused reference)"),
        ([], "math (the unfused reference)"),
        (["aten::_fused_attention_overrideable"], "aten::_fused_attention_overrideable"),
    ],
)
def test_describe_sdpa_kernel(ops: list[str], expected: str) -> None:
    assert describe_sdpa_kernel(ops) == expected


def test_sdpa_backend_on_the_cpu_is_the_flash_cpu_kernel() -> None:
    q = torch.randn(1, 2, 8, 4)
    assert sdpa_backend(q, q, q) == "flash (CPU kernel)"


# --------------------------------------------------------------------------- fake GPUs

#: kind -> (n_layer, n_head, d_model, seq_len, batch size) capstone_sizes gives.
SIZES = {
    "h100_sxm": (12, 12, 768, 1024, 16),
    "a100": (12, 12, 768, 1024, 16),
    "mi300x": (12, 12, 768, 1024, 16),
    "t4": (6, 6, 384, 256, 16),
    "rtx4090": (6, 6, 384, 256, 16),
    "mps": (4, 4, 256, 256, 16),
}


def sizes(device: str | torch.device) -> tuple[int, int, int, int, int]:
    """capstone_sizes as (n_layer, n_head, d_model, seq_len, batch size)."""
    cfg, batch = capstone_sizes(device)
    assert cfg.attention == "manual" and not cfg.checkpoint  # the baseline's
    return cfg.n_layer, cfg.n_head, cfg.d_model, cfg.seq_len, batch


@pytest.mark.parametrize("kind", list(SIZES))
def test_capstone_sizes_grow_with_the_device(fake_gpu, kind: str) -> None:  # noqa: ANN001
    gpu = fake_gpu(kind)
    assert sizes(gpu.device) == SIZES[kind]


def test_capstone_sizes_on_the_cpu() -> None:
    assert sizes("cpu") == (2, 4, 64, 256, 4)


def test_a100_40gb_gets_the_big_size(fake_gpu) -> None:  # noqa: ANN001
    """An A100-40GB (Colab's) reports 40,536 MiB, under 40 GiB: it is an A100 all the same."""
    gpu = fake_gpu("a100", name="NVIDIA A100-SXM4-40GB")
    gpu.spec = replace(gpu.spec, total_memory=40_536 * MiB)
    assert sizes("cuda") == SIZES["a100"]


#: kind -> {lever: available?} (amp and fused_adamw with their probes stubbed, see below).
AVAILABLE = {
    "h100_sxm": {"amp": True, "tf32": True, "compile": True},
    "a100": {"amp": True, "tf32": True, "compile": True},
    "rtx4090": {"amp": True, "tf32": True, "compile": True},
    "t4": {"amp": True, "tf32": False, "compile": True},
    "mi300x": {"amp": True, "tf32": False, "compile": True},
    "mps": {"amp": True, "tf32": False, "compile": False},
}


@pytest.fixture
def stub_kernel_probes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kernel-running probes under lever_available pass, as they do on the real GPUs."""
    probed: list[str] = []
    monkeypatch.setattr(amp_choice, "check_autocast", lambda d, t: probed.append("amp") or t)
    monkeypatch.setattr(amp_choice, "grad_scaler_works", lambda d: True)
    monkeypatch.setattr(capstone, "best_adam_impl", lambda d: probed.append("adam") or "fused")
    return probed


@pytest.mark.parametrize("kind", list(AVAILABLE))
def test_lever_available_on_each_gpu(fake_gpu, stub_kernel_probes: list[str], kind: str) -> None:  # noqa: ANN001
    gpu = fake_gpu(kind)
    for name, expected in AVAILABLE[kind].items():
        ok, why = lever_available(name, gpu.device)
        assert ok is expected, (name, why)
        if name == "amp":
            assert why == amp_choice.amp_for_device(gpu.device).reason
        elif not ok:
            assert why
    for name in ("resident", "sdpa", "checkpoint", "fused_adamw"):
        assert lever_available(name, gpu.device) == (True, "")
    assert "adam" in stub_kernel_probes and "amp" in stub_kernel_probes


def test_why_tf32_and_compile_are_missing(fake_gpu, stub_kernel_probes: list[str]) -> None:  # noqa: ANN001
    fake_gpu("t4")
    assert lever_available("tf32", "cuda") == (
        False,
        "TF32 needs an NVIDIA GPU of compute capability 8.0+ (Ampere+)",
    )
    assert "fp16" in str(amp_choice.amp_for_device("cuda"))  # the T4's AMP is fp16 + GradScaler


def test_compile_is_left_out_on_mps(fake_gpu) -> None:  # noqa: ANN001
    fake_gpu("mps")
    ok, why = lever_available("compile", "mps")
    assert not ok and why.startswith("torch.compile on MPS is still early")


def test_no_fused_adamw_says_which_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert lever_available("fused_adamw", "cpu") == (True, "")  # torch 2.13 has a fused CPU AdamW
    monkeypatch.setattr(capstone, "best_adam_impl", lambda d: "foreach")
    ok, why = lever_available("fused_adamw", "cpu")
    assert not ok and why == f"this torch {torch.__version__} has no fused AdamW for cpu"


def test_amp_unavailable_where_the_choice_is_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    keep = AmpChoice(torch.float32, False, "this CPU has no bf16 units: keep fp32")
    monkeypatch.setattr(capstone, "amp_for_device", lambda device: keep)
    assert lever_available("amp", "cpu") == (False, "this CPU has no bf16 units: keep fp32")
    with pytest.raises(ValueError, match="lever 'amp' cannot run on cpu: this CPU has no bf16"):
        make_trainer(Levers(amp=True))


@dataclass
class StandInTrainer:
    """What measure_trainer reads of a Trainer; run() works on the CPU and 'allocates' on the fake."""

    device: torch.device
    allocate: object
    levers: Levers = field(default_factory=lambda: Levers(resident=True))
    interval: int = 4
    tokens_per_step: int = 512
    calls: int = 0

    def run(self) -> list[float]:
        self.calls += 1
        self.allocate(64 * MiB)
        torch.ones(64, 64) @ torch.ones(64, 64)
        return [1.0] * self.interval

    def saved_bytes(self) -> int:
        return 3 * MiB


@pytest.mark.parametrize("kind", ["h100_sxm", "t4", "mps"])
def test_measure_trainer_reads_the_gpus_peak(fake_gpu, kind: str) -> None:  # noqa: ANN001
    gpu = fake_gpu(kind)

    def allocate(n: int) -> None:  # a step's activations: allocated, then freed
        gpu.allocate(n)
        gpu.free(n)

    trainer = StandInTrainer(gpu.device, allocate)
    r = measure_trainer(trainer, flops_per_token=1e6, peak_flops=1e15, min_run_time=0.01)
    assert r.label == "resident" and r.saved_mib == 3.0 and trainer.calls > 3
    if kind == "mps":  # sampled: at least what was allocated when the sampler looked
        assert r.peak_mib is not None and r.peak_mib >= 0
    else:  # exact: torch.cuda.max_memory_allocated
        assert r.peak_mib == 64.0
    assert r.mfu == pytest.approx(r.tokens_per_s * 1e6 / 1e15)
    assert r.mfu_achievable is None
