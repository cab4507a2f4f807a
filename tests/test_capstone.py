"""helpers.capstone: the levers, the Trainer, its measurement and the table helpers (chapter 7).

Tiny GPTs (1 layer, 16 channels, 8 tokens) keep every test to milliseconds of training; no
test here compiles. The device branches run on a CPU through the fake GPU (tests/fake_gpu.py):
sizes and lever availability read device properties only, and measure_trainer is fed a
stand-in trainer whose work runs on the CPU while the fake reports the GPU's memory.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import types
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import torch
from matplotlib.figure import Figure

from helpers import amp_choice, capstone, fp8
from helpers.amp_choice import AmpChoice
from helpers.capstone import (
    GREEDY,
    LEVER_TITLES,
    NANOGPT_H100,
    RECIPE_SIZES,
    REORDERS,
    ROUNDING,
    SAME_KERNELS,
    LeverRow,
    Levers,
    LeverSearch,
    Regime,
    Trainer,
    WindowDataset,
    batch_starts,
    capstone_sizes,
    changed_lever,
    compile_cache_label,
    compile_model,
    cost_verdict,
    describe_sdpa_kernel,
    fx_graph_cache_counts,
    keep_verdict,
    lever_available,
    make_optimizer,
    math_change,
    measure_trainer,
    plot_levers,
    recipe_ratio,
    regime_for,
    removal_verdict,
    run_or_reason,
    same_losses,
    sdpa_backend,
    set_lr,
    throughput_verdict,
    use_fresh_compile_cache,
)
from helpers.gpt import GPTConfig, make_gpt, text_bytes
from helpers.machine_state import GpuTenants, MachineState
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
    assert both.minus("sdpa") == Levers(resident=True) and both.minus("amp") == both
    assert both.toggled("sdpa") == Levers(resident=True)
    assert both.toggled("amp") == Levers(resident=True, sdpa=True, amp=True)
    every = Levers()
    for name in LEVER_TITLES:
        every = every.plus(name)
    assert every.on() == list(LEVER_TITLES)


def test_a_bad_lever_name_lists_the_levers() -> None:
    with pytest.raises(ValueError, match=r"unknown lever 'flash'; the levers are resident, sdpa, "):
        Levers().plus("flash")
    with pytest.raises(ValueError, match="unknown lever"):
        Levers().minus("flash")


def test_every_lever_has_one_kind() -> None:
    kinds = SAME_KERNELS + REORDERS + ROUNDING
    assert sorted(kinds) == sorted(LEVER_TITLES) and len(set(kinds)) == len(kinds)
    assert set(GREEDY) == set(LEVER_TITLES) - {"checkpoint", "fp8"}


# --------------------------------------------------------------------------- the regime


def test_regime_warms_up_then_decays_to_its_floor() -> None:
    r = Regime(lr=6e-4, min_lr=6e-5, warmup=8, decay=56)
    assert r.lr_at(0) == pytest.approx(6e-4 / 8) and r.lr_at(7) == pytest.approx(6e-4)
    assert r.lr_at(8) == pytest.approx(6e-4)  # the top of the cosine
    assert r.lr_at(8 + 28) == pytest.approx((6e-4 + 6e-5) / 2)  # half-way down
    assert r.lr_at(64) == pytest.approx(6e-5) and r.lr_at(10_000) == pytest.approx(6e-5)
    lrs = [r.lr_at(s) for s in range(100)]
    assert lrs[:8] == sorted(lrs[:8]) and lrs[7:] == sorted(lrs[7:], reverse=True)
    assert str(r).startswith("AdamW, betas (0.9, 0.95), weight decay 0.1 on matrices")


def test_regime_for_follows_gpt2_and_nanogpt() -> None:
    assert regime_for(GPTConfig(n_layer=12, n_head=12, d_model=768)).lr == 6e-4  # GPT-2 small
    small = regime_for(TINY)
    assert (small.lr, small.min_lr, small.clip, small.betas) == (1e-3, 1e-4, 1.0, (0.9, 0.95))


def test_make_optimizer_decays_matrices_only() -> None:
    model = make_gpt(TINY)
    opt = make_optimizer(model, Regime(weight_decay=0.1))
    decay, rest = opt.param_groups
    assert decay["weight_decay"] == 0.1 and rest["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in rest["params"])
    assert len(decay["params"]) + len(rest["params"]) == len(list(model.parameters()))
    assert opt.defaults["betas"] == (0.9, 0.95) and opt.defaults["fused"] is None
    assert make_optimizer(model, Regime(), fused=True).defaults["fused"] is True
    set_lr(opt, Regime(lr=1e-3, warmup=4), 1)
    assert [g["lr"] for g in opt.param_groups] == [5e-4, 5e-4]


def test_the_loss_falls_from_the_first_interval() -> None:
    """The CPU chapter's GPT in the regime: no spike above the first loss, lower after 2 intervals."""
    cfg, batch = capstone_sizes("cpu")
    trainer = Trainer(cfg, Levers(resident=True, sdpa=True), TOKENS, device="cpu", batch_size=batch)
    losses = trainer.losses(12)
    assert max(losses) <= losses[0] + 0.01
    assert sum(losses[8:]) / 4 < sum(losses[:4]) / 4 - 0.05


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
        (0.008, 0.01, 0.01, True, "kept: 1.25x faster than without it at a 10 ms step (noise ±2%)"),
        (0.012, 0.01, 0.01, False, "dropped: 1.20x slower at a 10 ms step (noise ±2%)"),
        (
            0.0099,
            0.01,
            0.01,
            False,
            "dropped: not shown to help at a 10 ms step (1.01x, noise ±2%)",
        ),
        (
            0.009,
            0.15,
            0.01,
            False,
            "dropped: not shown to help at a 10 ms step (1.11x, noise ±16%)",
        ),
        (0.009, 0.01, 0.05, True, "kept: 1.11x faster than without it at a 10 ms step (noise ±6%)"),
        (0.009, 0.0, 0.0, True, "kept: 1.11x faster than without it at a 10 ms step (noise ±2%)"),
    ],
)
def test_keep_verdict(
    step_s: float, spread: float, best_spread: float, kept: bool, verdict: str
) -> None:
    best = row("sdpa", step_s=0.01, spread=best_spread)
    assert keep_verdict(row("sdpa + amp", step_s=step_s, spread=spread), best) == (kept, verdict)


def test_a_verdicts_ratio_is_the_tables() -> None:
    """The ratio a verdict prints is the ratio of the two rows' printed step times."""
    best, new = row("sdpa", step_s=0.030813), row("sdpa + fused_adamw", step_s=0.029177)
    new.kept = keep_verdict(new, best)[1]
    table = {r["levers"]: r for r in (best.as_row(), new.as_row())}
    step_ms = {k: float(v["step ms"].split()[0]) for k, v in table.items()}
    printed = float(new.kept.split("kept: ")[1].split("x")[0])
    assert printed == round(step_ms["sdpa"] / step_ms["sdpa + fused_adamw"], 2) == 1.06
    assert "at a 30.81 ms step" in new.kept


def test_a_busy_machine_is_named_in_the_verdict() -> None:
    busy = MachineState("cpu", 2, 2, 2, 9.0, GpuTenants(None), others_cores=1.9, window_s=1.0)
    best = row(step_s=0.01, machine=busy)
    keep, text = keep_verdict(row("resident", step_s=0.005), best)
    assert keep and text.endswith("; on a busy machine: re-run to confirm")


def test_removal_verdict() -> None:
    final = row("resident + sdpa", step_s=0.010)
    assert removal_verdict("resident", row("sdpa", step_s=0.008), final) == (
        True,
        "resident removed: 1.25x faster without it (noise ±2%)",
    )
    assert removal_verdict("resident", row("sdpa", step_s=0.012), final) == (
        False,
        "resident stays: 1.20x faster than without it at a 12 ms step (noise ±2%)",
    )
    assert removal_verdict("resident", row("sdpa", step_s=0.0101), final) == (
        False,
        "resident stays (on in resident + sdpa): not shown to help at a 10.1 ms step now (1.01x, noise ±2%)",
    )
    kept_by = removal_verdict("resident", row("sdpa", step_s=0.0101), final, "ablation pass 2")
    assert kept_by[1].startswith("resident stays (kept by ablation pass 2): not shown to help")


def test_cost_and_throughput_verdicts() -> None:
    without = row("sdpa", step_s=0.010, tokens_per_s=1000.0)
    ckpt = row("sdpa + checkpoint", step_s=0.0135, tokens_per_s=740.0)
    assert cost_verdict(ckpt, without, "checkpointing") == (
        "with checkpointing the step took 1.35x as long at a 10 ms step (noise ±2%)"
    )
    same = row("sdpa + checkpoint", step_s=0.0101)
    assert cost_verdict(same, without, "checkpointing").startswith("no cost of checkpointing shown")
    bigger = row("sdpa + checkpoint", step_s=0.04, tokens_per_s=1200.0)
    verdict = throughput_verdict(bigger, without, "batch 16", "batch 4")
    assert str(verdict) == "here, batch 16 was 1.20x more tokens/s than batch 4"
    assert verdict.ratio == pytest.approx(1.2) and verdict.conclusive


def test_math_change_and_changed_lever() -> None:
    assert math_change("sdpa", Levers(sdpa=True)) == ""
    assert math_change("resident", Levers(amp=True, resident=True)) == ""
    assert math_change("fused_adamw", Levers(amp=True, fused_adamw=True)) == ""
    assert math_change("amp", Levers(amp=True)) == "rounding changed by amp on purpose"
    assert math_change("compile", Levers(amp=True, compile=True)).startswith(
        "compile rounds the amp sums in another order"
    )
    assert math_change("graphs", Levers(amp=True, compile=True, graphs=True)) == ""
    assert changed_lever(Levers(sdpa=True), Levers()) == "sdpa"
    with pytest.raises(ValueError, match="not by one lever"):
        changed_lever(Levers(sdpa=True, amp=True), Levers())


#: step_s each configuration "measures" in the LeverSearch tests: sdpa helps at once; resident
#: and fused_adamw only once the others are on, which the greedy order cannot see.
STEP_S = {
    "baseline": 0.010,
    "resident": 0.0099,
    "sdpa": 0.008,
    "fused_adamw": 0.0098,
    "sdpa + fused_adamw": 0.0079,
    "resident + sdpa": 0.006,
    "resident + fused_adamw": 0.009,
    "resident + sdpa + fused_adamw": 0.004,
}


def scripted_measure(trainer: Trainer) -> LeverRow:
    """A stand-in for measure_trainer: the step time from STEP_S, the real first losses."""
    losses = trainer.losses(4)
    label = trainer.levers.label()
    return row(label, step_s=STEP_S[label], spread=0.01, first_losses=losses)


def test_lever_search_keeps_only_what_is_faster(capsys: pytest.CaptureFixture[str]) -> None:
    search = LeverSearch(make_trainer, scripted_measure)
    assert search.best.kept == "the baseline" and search.current == Levers()
    resident = search.try_lever("resident")
    assert resident.kept.startswith("dropped: not shown to help at a 10 ms step")
    sdpa = search.try_lever("sdpa")
    assert sdpa.kept.startswith("kept: 1.25x") and search.current == Levers(sdpa=True)
    assert sdpa.parent_losses == search.rows[0].first_losses and sdpa.speedup == 1.25
    assert sdpa.parent == Levers() and sdpa.levers == Levers(sdpa=True)
    fused = search.try_lever("fused_adamw")
    assert fused.kept.startswith("dropped: ") and search.current == Levers(sdpa=True)
    assert fused.parent_losses == sdpa.first_losses
    assert search.try_lever("tf32") is None  # not on a CPU
    assert search.try_lever("graphs") is None
    assert [r["levers"] for r in search.table()] == [
        "baseline",
        "resident",
        "sdpa",
        "sdpa + fused_adamw",
    ]
    out = capsys.readouterr().out
    assert "sdpa: kept: 1.25x faster than without it at a 10 ms step (noise ±2%); now 1.25x" in out
    assert "tf32: skipped here: TF32 needs an NVIDIA GPU" in out
    assert "graphs: skipped here: CUDA graphs need a CUDA or ROCm GPU and this is cpu" in out
    # each row's losses were checked against its parent's, against the parent's noise floor
    for r in search.rows[1:]:
        assert r.check.checked and r.check.passed and len(r.check.gaps) == 4
    assert set(search.floors) == {Levers(), Levers(sdpa=True)}
    assert set(search.trainers) == {Levers(), Levers(sdpa=True)}  # the others were dropped


def test_the_ablation_finds_what_the_greedy_order_hid(capsys: pytest.CaptureFixture[str]) -> None:
    search = LeverSearch(make_trainer, scripted_measure)
    for name in ("resident", "sdpa", "fused_adamw"):
        search.try_lever(name)
    assert search.current == Levers(sdpa=True)
    assert search.ablate(("resident", "sdpa", "fused_adamw")) is True
    assert search.current == Levers(resident=True, sdpa=True, fused_adamw=True)
    finals = [r for r in search.ablation if r.parent is None]
    assert [r.label for r in finals] == [
        "sdpa",
        "resident + sdpa",
        "resident + sdpa + fused_adamw",
    ]
    assert search.final_row is finals[-1]
    table = search.ablation_table()
    assert table[0]["change"] == "(final)" and table[1]["change"] == "+ resident"
    assert table[2]["change"] == "- sdpa"
    assert table[2]["kept?"].startswith("sdpa stays: 1.25x faster than without it")
    assert table[3]["kept?"].startswith("dropped: not shown to help at a 8 ms step")
    out = capsys.readouterr().out
    assert "ablation pass 1: resident + sdpa beats the final, 1.33x" in out
    assert "ablation pass 3: no lever switched on or off beats the final" in out
    for r in search.ablation:
        assert r.parent is None or r.check.passed
    assert (
        search.final_verdict()
        == "here, resident + sdpa + fused_adamw was 2.50x faster than baseline"
    )


def test_the_ablation_measures_each_configuration_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each pass's final is the row the search already has (the greedy best, then the switch
    the last pass applied), with its trainer kept for its noise floor: not a second run."""
    measured: list[str] = []

    def counting(trainer: Trainer) -> LeverRow:
        measured.append(trainer.levers.label())
        return scripted_measure(trainer)

    search = LeverSearch(make_trainer, counting)
    for name in ("resident", "sdpa", "fused_adamw"):
        search.try_lever(name)
    greedy = list(measured)
    assert search.ablate(("resident", "sdpa", "fused_adamw"), progress=False) is True
    assert measured[len(greedy) :] == [  # three passes of three switches, no final again
        *("resident + sdpa", "baseline", "sdpa + fused_adamw"),  # from sdpa
        *("sdpa", "resident", "resident + sdpa + fused_adamw"),  # from resident + sdpa
        *("sdpa + fused_adamw", "resident + fused_adamw", "resident + sdpa"),  # from all three
    ]
    finals = [r for r in search.ablation if r.parent is None]
    assert finals[0].step_s == search.rows[2].step_s and finals[0] is not search.rows[2]
    assert search.rows[2].kept.startswith("kept")  # the greedy table keeps its own verdict
    assert finals[1].first_losses == search.ablation[1].first_losses  # pass 1's winning switch
    assert Levers(resident=True, sdpa=True, fused_adamw=True) in search.trainers
    assert "ablation pass" not in capsys.readouterr().err  # progress=False: no bar


def test_the_ablation_removes_a_lever_that_now_slows_the_step() -> None:
    steps = dict(STEP_S, **{"resident + sdpa": 0.0085})

    def scripted(t: Trainer) -> LeverRow:
        return row(t.levers.label(), step_s=steps[t.levers.label()], first_losses=t.losses(2))

    search = LeverSearch(make_trainer, scripted)
    search.current = Levers(resident=True, sdpa=True)  # as if the greedy pass had kept both
    search.best = search.measured(search.current)
    assert search.ablate(("resident",), max_passes=1) is False  # changed, and out of passes
    assert search.current == Levers(sdpa=True)
    assert search.ablation[1].kept == "resident removed: 1.06x faster without it (noise ±2%)"


def test_a_lever_an_ablation_pass_added_is_said_to_come_from_it() -> None:
    steps = {"baseline": 0.010, "sdpa": 0.008, "resident + sdpa": 0.007, "resident": 0.0099}

    def scripted(t: Trainer) -> LeverRow:
        label = t.levers.label()
        return row(label, step_s=steps[label], spread=0.01, first_losses=t.losses(2))

    search = LeverSearch(make_trainer, scripted)
    search.try_lever("sdpa")
    assert search.ablate(("resident", "sdpa"), max_passes=1) is False
    assert search.current == Levers(resident=True, sdpa=True)
    steps.update({"sdpa": 0.00701, "resident": 0.00702})  # now neither is shown to help
    assert search.ablate(("resident", "sdpa"), max_passes=1) is True
    kept = {r["change"]: r["kept?"] for r in search.ablation_table()[-2:]}
    assert kept["- resident"].startswith("resident stays (kept by ablation pass 1): not shown")
    assert kept["- sdpa"].startswith("sdpa stays (kept by the greedy pass): not shown to help")


def test_side_rows_and_measured_references() -> None:
    search = LeverSearch(make_trainer, scripted_measure)
    search.try_lever("sdpa")
    ref = search.measured(Levers(sdpa=True))
    assert ref is search.best  # measured already: not measured again
    new = search.measured(Levers(resident=True))
    assert new.kept == "measured as a reference" and new in search.side
    side, error = search.side_row(Levers(resident=True, sdpa=True), search.best)
    assert error == "" and side.kept.startswith("kept: 1.33x") and side.check.passed
    assert search.current == Levers(sdpa=True)  # a side row changes nothing
    removed, _ = search.side_row(Levers(), search.best)
    assert removed.kept.startswith("sdpa stays: 1.25x")


def test_a_side_row_or_a_switch_that_fails_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    def measure(trainer: Trainer) -> LeverRow:
        if trainer.levers.resident:
            raise RuntimeError("out of memory")
        return scripted_measure(trainer)

    search = LeverSearch(make_trainer, measure)
    search.try_lever("sdpa")
    assert search.side_row(Levers(resident=True, sdpa=True), search.best) == (
        None,
        "RuntimeError: out of memory",
    )
    assert search.ablate(("resident",)) is True
    assert "  resident + sdpa: failed here: RuntimeError: out of memory" in capsys.readouterr().out


def test_the_final_verdict_when_nothing_helped() -> None:
    search = LeverSearch(make_trainer, scripted_measure)
    assert search.final_verdict() == (
        "nothing beat the baseline here: the final configuration is the baseline"
    )
    with pytest.raises(ValueError, match="was not measured"):
        search.floor(Levers(amp=True))
    with pytest.raises(ValueError, match="no parent configuration"):
        search.same_math(search.baseline)


def test_a_check_that_cannot_run_fails_where_the_math_must_be_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An OOM (or a failed recompile, a diverged rerun) while building the floor is no pass."""
    search = LeverSearch(make_trainer, scripted_measure)

    def broken(levers: Levers) -> None:
        raise RuntimeError("no memory left for the rerun")

    monkeypatch.setattr(search, "floor", broken)
    sdpa = search.try_lever("sdpa")
    assert sdpa.check.gaps == [] and not sdpa.check.passed
    assert sdpa.check.error == "RuntimeError: no memory left for the rerun"
    assert sdpa.check.label == "sdpa vs baseline"
    with pytest.raises(AssertionError, match="NOT CHECKED, and this lever must keep the math"):
        sdpa.check.check()


def test_a_rounding_lever_whose_comparison_cannot_run_is_a_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def measure(t: Trainer) -> LeverRow:
        return row(t.levers.label(), step_s=0.01, spread=0.01, first_losses=t.losses(4))

    search = LeverSearch(make_trainer, measure)
    monkeypatch.setattr(capstone, "lever_available", lambda name, device: (True, ""))
    monkeypatch.setattr(search, "row_for", lambda levers: None)  # the parent's row is gone
    tf32 = search.try_lever("tf32")
    assert tf32.check.passed and tf32.check.check() is tf32.check and not tf32.check.error
    assert tf32.check.note == (
        "rounding changed by tf32 on purpose; not compared: ValueError: 'baseline' was not "
        "measured: measure it first."
    )


def test_a_check_whose_parent_was_never_measured_fails() -> None:
    search = LeverSearch(make_trainer, scripted_measure)
    orphan = row("resident + sdpa", first_losses=[5.0, 4.0])
    orphan.levers, orphan.parent = Levers(resident=True, sdpa=True), Levers(resident=True)
    search._check(orphan)
    assert not orphan.check.passed and "'resident' was not measured" in orphan.check.error


def test_lever_search_drops_a_lever_that_raises(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch.compile without a C++ compiler fails at the first call: the lever is dropped."""

    def no_compiler(model: torch.nn.Module, **options: object) -> object:
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
    search.current = Levers(compile=True)  # the final configuration itself fails to run again
    with pytest.raises(RuntimeError, match="failed to run again"):
        search.ablate(("sdpa",))


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
    "h100_sxm": (6, 12, 768, 512, 16),
    "a100": (6, 12, 768, 512, 16),
    "mi300x": (6, 12, 768, 512, 16),
    "t4": (6, 6, 384, 256, 16),
    "rtx4090": (6, 6, 384, 256, 16),
    "mps": (4, 4, 256, 256, 16),
}


def sizes(device: str | torch.device, recipe: bool = False) -> tuple[int, int, int, int, int]:
    """capstone_sizes as (n_layer, n_head, d_model, seq_len, batch size)."""
    cfg, batch = capstone_sizes(device, recipe=recipe)
    assert cfg.attention == "manual" and not cfg.checkpoint  # the baseline's
    return cfg.n_layer, cfg.n_head, cfg.d_model, cfg.seq_len, batch


@pytest.mark.parametrize("kind", list(SIZES))
def test_capstone_sizes_grow_with_the_device(fake_gpu, kind: str) -> None:  # noqa: ANN001
    gpu = fake_gpu(kind)
    assert sizes(gpu.device) == SIZES[kind]


def test_capstone_sizes_on_the_cpu() -> None:
    assert sizes("cpu") == (2, 4, 64, 256, 4)
    assert sizes("cpu", recipe=True) == (2, 4, 64, 256, 4)  # the recipe's shape needs a big GPU


@pytest.mark.parametrize("kind", ["h100_sxm", "a100", "mi300x"])
def test_the_recipe_shape_on_a_big_gpu(fake_gpu, kind: str) -> None:  # noqa: ANN001
    """nanoGPT's GPT-2-small shape, which the public recipe's figure was measured at."""
    gpu = fake_gpu(kind)
    assert sizes(gpu.device, recipe=True) == (12, 12, 768, 1024, 16)


def test_the_recipe_shape_is_the_public_recipes() -> None:
    cfg, batch = RECIPE_SIZES
    shape = (cfg.n_layer, cfg.n_head, cfg.d_model, cfg.seq_len, batch, cfg.vocab_size)
    assert shape == NANOGPT_H100.shape


def test_a100_40gb_gets_the_big_size(fake_gpu) -> None:  # noqa: ANN001
    """An A100-40GB (Colab's) reports 40,536 MiB, under 40 GiB: it is an A100 all the same."""
    gpu = fake_gpu("a100", name="NVIDIA A100-SXM4-40GB")
    gpu.spec = replace(gpu.spec, total_memory=40_536 * MiB)
    assert sizes("cuda") == SIZES["a100"]


#: kind -> {lever: available?} (amp and fused_adamw with their probes stubbed, torchao present).
AVAILABLE = {
    "h100_sxm": {"amp": True, "tf32": True, "compile": True, "graphs": True, "fp8": True},
    "a100": {"amp": True, "tf32": True, "compile": True, "graphs": True, "fp8": False},
    "rtx4090": {"amp": True, "tf32": True, "compile": True, "graphs": True, "fp8": True},
    "t4": {"amp": True, "tf32": False, "compile": True, "graphs": True, "fp8": False},
    "mi300x": {"amp": True, "tf32": False, "compile": True, "graphs": True, "fp8": False},
    "mps": {"amp": True, "tf32": False, "compile": False, "graphs": False, "fp8": False},
}


@pytest.fixture
def stub_kernel_probes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kernel-running probes under lever_available pass, as they do on the real GPUs."""
    probed: list[str] = []
    monkeypatch.setattr(amp_choice, "check_autocast", lambda d, t: probed.append("amp") or t)
    monkeypatch.setattr(amp_choice, "grad_scaler_works", lambda d: True)
    monkeypatch.setattr(capstone, "best_adam_impl", lambda d: probed.append("adam") or "fused")
    monkeypatch.setattr(fp8, "torchao_version", lambda: "0.18.0")
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


def test_graphs_and_fp8_reasons(fake_gpu, stub_kernel_probes: list[str]) -> None:  # noqa: ANN001
    assert lever_available("graphs", "cpu") == (
        False,
        "CUDA graphs need a CUDA or ROCm GPU and this is cpu",
    )
    fake_gpu("mps")
    assert lever_available("graphs", "mps")[1].startswith("torch.compile on MPS is still early")
    fake_gpu("a100")
    assert lever_available("fp8", "cuda")[1].endswith("FP8 tensor cores start at 8.9 (Ada, Hopper)")


# --------------------------------------------------------------------------- restart, graphs, fp8


def test_restart_reproduces_the_run_and_a_nudge_moves_each_weight_one_ulp() -> None:
    trainer = make_trainer(Levers(sdpa=True, fused_adamw=True))
    first = trainer.losses(4)
    assert trainer.optimizer.state and trainer.step_count == 4
    trainer.restart()
    assert not trainer.optimizer.state and trainer.step_count == 0
    assert trainer.losses(4) == first
    trainer.restart(nudge=True)
    for p, p0 in zip(trainer.params, trainer.initial):
        assert torch.equal(p, torch.nextafter(p0, torch.full_like(p0, math.inf)))
        assert torch.all(p > p0)
    nudged = trainer.losses(4)
    assert max(abs(a - b) for a, b in zip(nudged, first)) < 1e-5


def test_restart_renews_the_grad_scaler(monkeypatch: pytest.MonkeyPatch) -> None:
    fp16 = AmpChoice(torch.float16, True, "fp16 for the test")
    monkeypatch.setattr(capstone, "amp_for_device", lambda device: fp16)
    trainer = make_trainer(Levers(amp=True))
    old = trainer.scaler
    trainer.run()
    trainer.restart()
    assert trainer.scaler is not old and trainer.scaler.get_scale() == old._init_scale


def test_measure_trainer_records_the_check_steps() -> None:
    r = measure_trainer(make_trainer(Levers(resident=True)), min_run_time=0.01, check_steps=5)
    assert len(r.first_losses) == 5 and r.levers == Levers(resident=True)
    assert r.first_losses == make_trainer(Levers(resident=True)).losses(5)
    assert r.machine is not None and r.compile_cache == ""


@pytest.mark.parametrize(
    ("levers", "expected"),
    [
        (Levers(), None),
        (Levers(compile=True), {}),
        (Levers(compile=True, graphs=True), {"mode": "reduce-overhead"}),
        (Levers(graphs=True), {"backend": "cudagraphs"}),
    ],
)
def test_compile_model_picks_the_mode(
    monkeypatch: pytest.MonkeyPatch, levers: Levers, expected: dict | None
) -> None:
    calls: list[dict] = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(kw) or model)
    model = make_gpt(TINY)
    assert compile_model(model, levers) is model
    assert calls == ([] if expected is None else [expected])


def test_the_graphs_lever_marks_each_step_and_copies_the_loss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CUDA branch of Trainer.step, run on the CPU: compile stubbed, the marks counted."""
    marks: list[int] = []
    monkeypatch.setattr(capstone, "lever_available", lambda name, device: (True, ""))
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    trainer = make_trainer(Levers(resident=True, graphs=True))
    assert trainer.run() == make_trainer(Levers(resident=True)).run()
    assert len(marks) == trainer.interval


def test_the_fp8_lever_converts_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The FP8 branch of the Trainer, run on the CPU: always native (lever_available refuses the rest)."""
    converted: list[tuple[object, dict]] = []
    monkeypatch.setattr(capstone, "lever_available", lambda name, device: (True, ""))
    monkeypatch.setattr(capstone, "convert_fp8", lambda model, **kw: converted.append((model, kw)))
    trainer = make_trainer(Levers(fp8=True))
    assert converted == [(trainer.model, {})]
    assert math_change("fp8", trainer.levers) == "rounding changed by fp8 on purpose"


# --------------------------------------------------------------------------- the public recipe


def test_the_public_recipe_figure_is_the_audits() -> None:
    assert (NANOGPT_H100.tokens_per_s, NANOGPT_H100.mfu) == (572_379, 0.362)
    assert NANOGPT_H100.shape == (12, 12, 768, 1024, 16, 256)
    text = str(NANOGPT_H100)
    assert text.startswith("572,379 tokens/s, 36.2% MFU") and "2026-11-26" in text


BIG = GPTConfig(n_layer=12, n_head=12, d_model=768, seq_len=1024)


def test_recipe_ratio_on_an_h100_at_its_shape(fake_gpu) -> None:  # noqa: ANN001
    fake_gpu("h100_sxm")
    assert recipe_ratio("cuda", BIG, 16, 629_617) == (
        "final vs the public recipe: 1.10x (629,617 vs 572,379 tokens/s)"
    )
    other = recipe_ratio("cuda", BIG, 32, 629_617)
    assert other.startswith("the public recipe's figure does not apply here: it was measured at")


def test_recipe_ratio_elsewhere(fake_gpu) -> None:  # noqa: ANN001
    assert recipe_ratio("cpu", BIG, 16, 1.0).endswith("this is cpu")
    fake_gpu("a100")
    assert recipe_ratio("cuda", BIG, 16, 1.0).endswith("this is NVIDIA A100-SXM4-80GB")
    fake_gpu("h100_sxm", name="NVIDIA H200")
    assert recipe_ratio("cuda", BIG, 16, 572_379).endswith("other memory: indicative)")


# --------------------------------------------------------------------------- compile caches


def test_a_fresh_compile_cache_points_inductor_and_triton_at_a_new_folder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    path = use_fresh_compile_cache()
    try:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path) and path.is_dir()
        assert os.environ["TRITON_CACHE_DIR"] == str(path / "triton")
        assert list(path.iterdir()) == []
    finally:
        path.rmdir()


@pytest.fixture
def inductor_counters(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """torch._dynamo.utils' counters, stubbed: the test moves them as a compile would."""
    counts: dict[str, int] = {}
    utils = types.ModuleType("torch._dynamo.utils")
    utils.counters = {"inductor": counts}
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", utils)
    return counts


def test_fx_graph_cache_counts_read_dynamos_counters(inductor_counters: dict[str, int]) -> None:
    assert fx_graph_cache_counts() == (0, 0)  # nothing compiled yet
    inductor_counters.update(fxgraph_cache_hit=3, fxgraph_cache_miss=2, fxgraph_cache_bypass=1)
    assert fx_graph_cache_counts() == (3, 2)


def test_fx_graph_cache_counts_before_dynamo_is_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch._dynamo.utils", raising=False)
    assert fx_graph_cache_counts() == (0, 0)


def test_this_torchs_counters_tell_a_cold_compile_from_a_warm_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A real compile, twice, in a fresh cache: the counters the label reads exist in this torch.

    Run on the oldest and newest torch the course supports too (2.5 and 2.15 both count
    fxgraph_cache_miss and fxgraph_cache_hit); where the FX-graph cache is off the label says
    'unknown' instead of guessing.
    """
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (tmp_path / "tmp").mkdir()  # torch 2.5's compile leaves temp folders behind: here, not TMPDIR
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    for var in ("TMPDIR", "TMP", "TEMP"):  # and for the compile's worker processes
        monkeypatch.setenv(var, str(tmp_path / "tmp"))
    on = Levers(compile=True)

    def compile_once() -> str:
        torch._dynamo.reset()  # forget the compiled code: the next call compiles or loads it
        x = torch.randn(8, requires_grad=True)
        before = fx_graph_cache_counts()
        try:
            torch.compile(lambda t: (t.sin() * 2).sum())(x).backward()
        except Exception as exc:  # noqa: BLE001 - no C++ compiler: nothing to count here
            pytest.skip(f"torch.compile cannot run here: {type(exc).__name__}: {exc}")
        return compile_cache_label(on, before, fx_graph_cache_counts())

    cold, warm = compile_once(), compile_once()
    torch._dynamo.reset()
    if not torch._inductor.config.fx_graph_cache:
        assert cold.startswith("unknown") and warm.startswith("unknown")
        return
    assert cold.startswith("cold cache (") and warm.startswith("warm cache ("), (cold, warm)


def test_compile_cache_label_from_the_counts() -> None:
    on = Levers(compile=True)
    assert compile_cache_label(on, (2, 5), (2, 9)) == "cold cache (4 graph(s) compiled)"
    assert compile_cache_label(on, (2, 5), (6, 5)) == "warm cache (4 graph(s) loaded)"
    assert compile_cache_label(on, (0, 0), (1, 3)) == (
        "partly warm cache (1 graph(s) loaded, 3 compiled)"
    )
    assert compile_cache_label(on, (1, 1), (1, 1)).startswith("unknown (no FX-graph cache lookup")
    assert compile_cache_label(Levers(graphs=True), (0, 0), (0, 0)) == "n/a (no Inductor)"
    assert compile_cache_label(Levers(compile=True, graphs=True), (0, 0), (0, 2)).startswith("cold")
    assert compile_cache_label(Levers(sdpa=True), (0, 0), (0, 0)) == ""


def test_measure_trainer_labels_the_first_interval_by_the_counters(
    monkeypatch: pytest.MonkeyPatch, inductor_counters: dict[str, int]
) -> None:
    """Files left in the cache folder by other rows do not make a compile warm: its lookups do."""
    monkeypatch.setattr(capstone, "lever_available", lambda name, device: (True, ""))

    def compile_missing(model: torch.nn.Module, **kw: object) -> object:
        def call(*args: object) -> torch.Tensor:
            if not compiled:  # the first call compiles a forward and a backward graph
                inductor_counters["fxgraph_cache_miss"] = misses + 2
                compiled.append(1)
            return model(*args)

        return call

    for misses, label in ((0, "cold cache (2 graph(s) compiled)"), (7, "cold cache (2 graph(s)")):
        compiled: list[int] = []
        inductor_counters.update(fxgraph_cache_hit=5, fxgraph_cache_miss=misses)
        monkeypatch.setattr(torch, "compile", compile_missing)
        r = measure_trainer(make_trainer(Levers(compile=True)), min_run_time=0.01)
        assert r.compile_cache.startswith(label)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: None)
    graphs = measure_trainer(make_trainer(Levers(graphs=True)), min_run_time=0.01)
    assert graphs.compile_cache == "n/a (no Inductor)"
