"""benchmarks/ch07_capstone.py runs and prints its tables (timings are printed, never asserted)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F

from helpers import capstone
from helpers.capstone import LeverRow, Levers, LeverSearch, measure_trainer
from helpers.gpt import GPTConfig, text_bytes
from helpers.same_math import SameMath, check_not_run, same_math

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ch07_capstone.py"
TINY = GPTConfig(n_layer=1, n_head=2, d_model=16, seq_len=8)


def load_script() -> ModuleType:
    """The benchmark script as a module."""
    spec = importlib.util.spec_from_file_location("ch07_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_ch07_benchmark_prints_the_tables_and_one_final_line() -> None:
    args = ["--device", "cpu", "--rounds", "1", "--min-run-time", "0.05", "--no-compile"]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--threads", "1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    assert f"torch {torch.__version__}" in out and "GPT: 2 layers x 64 channels" in out
    assert "training: AdamW, betas (0.9, 0.95)" in out and re.search(r"^machine: ", out, re.M)
    assert "noise floor of the baseline over 16 steps" in out
    for lever in ("resident", "sdpa", "fused_adamw", "checkpoint"):
        same = (
            f"{lever} vs baseline: {word} over 16 steps" for word in ("same math", "bit-identical")
        )
        assert any(line in out for line in same), lever  # bit-identical: every gap 0
    assert "amp vs baseline: rounding changed by amp on purpose" in out or "amp: skipped" in out
    assert "compile: skipped: left out (--no-compile)" in out
    assert "graphs: skipped: CUDA graphs need a CUDA or ROCm GPU" in out
    assert "tf32: skipped here: TF32 needs an NVIDIA GPU" in out
    assert "compile: left out (--no-compile)" in out and "compile time: n/a" in out
    for column in ("levers", "tokens/s", "MFU datasheet", "MFU achievable", "kept?", "losses"):
        assert column in out
    assert re.search(r"^\s*baseline\s+\d+\.\d+ ±\d+%", out, re.M)
    assert "the ablation: from the final configuration" in out
    assert re.search(r"^ablation pass \d: no lever switched on or off beats the final$", out, re.M)
    assert re.search(r"^\s*\(final\)\s", out, re.M) and "final configuration: " in out
    assert "fp8: skipped here: FP8 matmuls need an NVIDIA GPU" in out
    assert "interleaved round(s)" in out and "per-round ratios" in out
    assert "verdict (the rows above" in out
    assert "the public recipe's figure does not apply here" in out
    assert "CPU target: 1.3x with the same math" in out
    assert "SAME MATH FAILED" not in out
    finals = re.findall(r"^final vs baseline \(tokens/s, median\): \d+\.\d\dx$", out, re.M)
    assert len(finals) == 1 and out.rstrip().endswith(finals[0])
    # the closing ratio is the table's: final's median tokens/s over the baseline's
    rates = {
        m[1]: float(m[2].replace(",", ""))
        for m in re.finditer(r"^\s*(baseline|final)\s+[\d.]+\s+[\d.]+\s+([\d,]+)\s", out, re.M)
    }
    closing = float(re.search(r"median\): (\d+\.\d\d)x$", finals[0])[1])
    assert abs(closing - rates["final"] / rates["baseline"]) <= 0.01, (closing, rates)


def test_bad_options_are_refused() -> None:
    bench = load_script()
    for bad in (["--rounds", "0"], ["--min-run-time", "0"], ["--threads", "0"]):
        with pytest.raises(SystemExit) as exc:
            bench.parse_args(bad)
        assert exc.value.code == 2


def tiny_setup(bench: ModuleType) -> object:
    """The benchmark's Setup with a 1-layer GPT on 3,000 bytes: trainers that run in ms."""
    return bench.Setup(TINY, 4, text_bytes()[:3000], torch.device("cpu"))


def test_same_math_table_of_each_lever(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script()
    checks = bench.check_same_math(tiny_setup(bench), ("resident", "sdpa", "amp", "tf32"), steps=6)
    assert [c.label for c in checks] == [
        "resident vs baseline",
        "sdpa vs baseline",
        "amp vs baseline",
        "tf32",
    ]
    assert checks[0].passed and checks[0].gaps == [0.0] * 6
    assert checks[1].checked and checks[1].passed
    assert not checks[2].checked and checks[2].note == "rounding changed by amp on purpose"
    assert checks[3].note.startswith("skipped: TF32 needs")
    assert capsys.readouterr().out.startswith("noise floor of the baseline over 6 steps")


def broken_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: object) -> torch.Tensor:
    """SDPA that forgot the causal mask: a bug, not a rounding difference."""
    return REAL_SDPA(q, k, v)


REAL_SDPA = F.scaled_dot_product_attention


def test_a_lever_that_changes_the_math_fails_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_script()
    monkeypatch.setattr(bench, "capstone_sizes", lambda device, recipe=False: (TINY, 4))
    monkeypatch.setattr(F, "scaled_dot_product_attention", broken_sdpa)
    args = ["--device", "cpu", "--rounds", "1", "--min-run-time", "0.02", "--no-compile"]
    assert bench.main([*args, "--keep-compile-cache"]) == 1
    out = capsys.readouterr().out
    assert "sdpa vs baseline: DIFFERENT: at step" in out
    failed = re.search(r"^SAME MATH FAILED for: (.*)$", out, re.M)
    assert failed and failed.group(1).split(", ")[0] == "sdpa"
    assert out.rstrip().splitlines()[-1].startswith("final vs baseline (tokens/s, median): ")


def test_a_lever_that_raises_is_dropped_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """torch.compile without a working C++ compiler: dropped, the rest of the run goes on."""
    bench = load_script()

    def no_compiler(model: torch.nn.Module, **options: object) -> object:
        def call(*args: object) -> None:
            raise RuntimeError("CppCompileError: C++ compile error")

        return call

    monkeypatch.setattr(torch, "compile", no_compiler)
    setup = tiny_setup(bench)
    checks = bench.check_same_math(setup, ("compile",), steps=4)
    assert checks[0].note == "failed: RuntimeError: CppCompileError: C++ compile error"
    monkeypatch.setattr(bench, "GREEDY", ("sdpa", "compile", "tf32"))
    measure = lambda t: measure_trainer(t, min_run_time=0.01, check_steps=4)  # noqa: E731
    search = LeverSearch(setup.trainer, measure)
    bench.greedy(search, {})
    out = capsys.readouterr().out
    assert "compile: dropped, it failed here: RuntimeError: CppCompileError" in out
    assert "tf32: skipped here" in out
    assert [r.label for r in search.rows][0] == "baseline"
    assert bench.broken_rows(search.rows) == []
    cells = bench.row_cells(search.rows[-1])
    assert cells["losses"].startswith("same math, largest gap") or cells["losses"].startswith(
        "DIFF"
    )
    trainers = [search.trainers[Levers()], search.trainers[search.current]]
    (base_s, final_s), states = bench.interleaved(trainers, 2, 0.01)
    assert len(base_s) == len(final_s) == 2 and min(base_s + final_s) > 0 and states


def test_spread_is_the_iqr_over_rounds() -> None:
    bench = load_script()
    assert bench.spread([1.0]) == 0.0
    assert bench.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx(2.0)


def test_a_compiled_levers_first_interval_is_timed_with_its_cache_state(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The compile of the same-math table, labelled by the FX-graph cache's counters (AUDIT finding 20)."""
    bench = load_script()
    counts = {"fxgraph_cache_hit": 4, "fxgraph_cache_miss": 1}  # earlier compiles in this process
    utils = ModuleType("torch._dynamo.utils")
    utils.counters = {"inductor": counts}
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", utils)

    def compile_missing(model: torch.nn.Module, **kw: object) -> object:
        def call(*args: object) -> torch.Tensor:
            counts["fxgraph_cache_miss"] = 3  # its forward and backward graphs: compiled
            return model(*args)

        return call

    monkeypatch.setattr(torch, "compile", compile_missing)  # no real compile in a test
    checks = bench.check_same_math(tiny_setup(bench), ("compile",), steps=4)
    assert checks[0].checked and checks[0].passed
    out = capsys.readouterr().out
    assert re.search(
        r"^compile: its first interval, compiling, took \d+\.\d s; cold cache \(2 graph\(s\) "
        r"compiled\)$",
        out,
        re.M,
    )


def test_a_check_that_cannot_run_fails_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No noise floor (an OOM in the reruns, say): the levers that must keep the math are not passed."""
    bench = load_script()
    monkeypatch.setattr(bench, "capstone_sizes", lambda device, recipe=False: (TINY, 4))

    def no_floor(*args: object) -> None:
        raise RuntimeError("out of memory (a stand-in)")

    monkeypatch.setattr(bench, "noise_floor", no_floor)  # the same-math table's floor
    monkeypatch.setattr(capstone, "noise_floor", no_floor)  # LeverSearch.floor's
    args = ["--device", "cpu", "--rounds", "1", "--min-run-time", "0.02", "--no-compile"]
    assert bench.main([*args, "--keep-compile-cache"]) == 1
    out = capsys.readouterr().out
    assert "the baseline's noise floor could not be measured: RuntimeError: out of memory" in out
    assert "sdpa vs baseline: NOT CHECKED, and this lever must keep the math" in out
    assert "amp vs baseline: rounding changed by amp on purpose" in out or "amp: skipped" in out
    failed = re.search(r"^SAME MATH FAILED for: (.*)$", out, re.M)
    assert failed and {"resident", "sdpa", "fused_adamw", "checkpoint"} <= set(
        failed.group(1).split(", ")
    )
    assert "NOT CHECKED (must keep the math): RuntimeError: out of memory" in out  # greedy table
    assert out.rstrip().splitlines()[-1].startswith("final vs baseline (tokens/s, median): ")


def test_broken_rows_count_a_check_that_did_not_run() -> None:
    bench = load_script()
    rows = [LeverRow(name, 0.01, 0.0, 1.0, 1.0, None, 0.1, [5.0]) for name in "abcd"]
    rows[0].check = same_math("a", [5.0], [5.0], None, "rounding changed by amp on purpose")
    rows[1].check = check_not_run("b vs baseline", "RuntimeError: out of memory")
    rows[2].check = SameMath("c", [0.0], [1e-6])  # checked and passed
    assert bench.broken_rows(rows) == ["b"]  # d: the reference, no check
    assert bench.row_cells(rows[1])["losses"] == (
        "NOT CHECKED (must keep the math): RuntimeError: out of memory"
    )


def test_fp8_is_judged_against_the_final_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ablation can move the final configuration after the greedy pass: FP8 sits on top of it."""
    bench = load_script()
    monkeypatch.setattr(bench, "lever_available", lambda name, device: (True, ""))
    seen: list[tuple[Levers, str]] = []

    class Search:
        device = torch.device("cpu")
        current = Levers(resident=True, sdpa=True)
        best = "the greedy pass's best (stale)"
        final_row = "the ablation's last measurement of the final configuration"

        def side_row(self, levers: Levers, parent: str) -> tuple[None, str]:
            seen.append((levers, parent))
            return None, "RuntimeError: a stand-in"

    assert bench.fp8_row(Search(), 1.0) is None
    assert seen == [(Levers(resident=True, sdpa=True, fp8=True), Search.final_row)]


def test_the_headline_times_baseline_against_the_final_configuration_only() -> None:
    """--headline (gpu_check's timing phase): no same-math table, greedy pass or ablation."""
    args = ["--device", "cpu", "--rounds", "1", "--min-run-time", "0.05", "--no-compile"]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--threads", "1", "--headline"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    assert "headline: baseline vs resident + sdpa + fused_adamw;" in out
    assert "amp: left out here: it changes the rounding; the CPU target keeps the math" in out
    assert "compile: left out here: left out (--no-compile)" in out
    assert "fp8: skipped here: FP8 matmuls need an NVIDIA GPU" in out
    for section in ("same math: each lever alone", "the greedy pass", "the ablation:"):
        assert section not in out, section
    assert re.search(r"^\s*baseline\s+[\d.]+\s+[\d.]+\s+[\d,]+\s", out, re.M)
    assert re.search(r"^\s*final\s+[\d.]+\s+[\d.]+\s+[\d,]+\s", out, re.M)
    target = re.search(r"^CPU target: 1.3x with the same math; .*$", out, re.M)[0]
    busy = "inconclusive, the machine was busy" in target
    assert busy or re.search(r"(meets|is BELOW) it \(same math\)$", target), target
    assert re.search(r"^final vs baseline \(tokens/s, median\): \d+\.\d\dx$", out, re.M)


def test_headline_levers_by_name_and_a_wrong_name_refused(capsys) -> None:  # noqa: ANN001
    bench = load_script()
    assert bench.levers_named("sdpa, amp").label() == "sdpa + amp"
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--headline", "--levers", "sdpa,warp_drive"])
    assert exc.value.code == 2 and "--levers" in capsys.readouterr().err
