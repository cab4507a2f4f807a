"""helpers.fp8: where FP8 training can run, converting a model, FP8 peaks (chapter 7).

The device branches run through the fake GPU (tests/fake_gpu.py). torchao is optional: the
tests stub its presence and its module; one test trains a converted GPT for real, emulated
on the CPU, where torchao is installed.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
import torch
from notebook_code import cell_containing
from torch import nn

from helpers import fp8
from helpers.fp8 import (
    FP8_DENSE_TFLOPS,
    INSTALL_HINT,
    convert_fp8,
    fp8_available,
    fp8_hardware,
    fp8_layer_filter,
    fp8_layers,
    fp8_peak,
    fp8_plan,
    torchao_version,
)
from helpers.gpt import GPTConfig, make_gpt
from helpers.peaks import _PEAK_TABLE, peak_row
from helpers.same_math import same_math

#: kind -> FP8 tensor cores? (compute capability 8.9+ on NVIDIA)
HARDWARE = {
    "h100_sxm": True,  # 9.0
    "rtx4090": True,  # 8.9
    "a100": False,  # 8.0
    "t4": False,  # 7.5
    "mi300x": False,  # ROCm
    "mps": False,
}


@pytest.mark.parametrize("kind", list(HARDWARE))
def test_fp8_only_on_nvidia_8_9_and_later(fake_gpu, kind: str) -> None:  # noqa: ANN001
    gpu = fake_gpu(kind)
    ok, why = fp8_hardware(gpu.device)
    assert ok is HARDWARE[kind], why
    if kind == "a100":
        assert why == (
            "NVIDIA A100-SXM4-80GB is compute capability 8.0: FP8 tensor cores start at 8.9 "
            "(Ada, Hopper)"
        )
    elif kind == "mi300x":
        assert "NVIDIA GPUs only" in why
    elif kind == "mps":
        assert why.endswith("this is mps")
    else:
        assert ok or "compute capability" in why


def test_no_fp8_on_a_cpu() -> None:
    ok, why = fp8_available("cpu")
    assert not ok and why.startswith("FP8 matmuls need an NVIDIA GPU") and why.endswith("cpu")


def test_fp8_needs_torchao_too(fake_gpu, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    fake_gpu("h100_sxm")
    monkeypatch.setattr(fp8, "torchao_version", lambda: None)
    assert fp8_available("cuda") == (False, f"torchao is not installed: {INSTALL_HINT}")
    monkeypatch.setattr(fp8, "torchao_version", lambda: "0.18.0")
    assert fp8_available("cuda") == (True, "")


def test_torchao_version_reads_the_installed_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fp8.importlib.util, "find_spec", lambda name: None)
    assert torchao_version() is None
    monkeypatch.setattr(fp8.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(fp8.importlib.metadata, "version", lambda name: "0.18.0")
    assert torchao_version() == "0.18.0"

    def missing(name: str) -> str:
        raise fp8.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(fp8.importlib.metadata, "version", missing)
    assert torchao_version() == "unknown"


def test_layer_filter_skips_the_tied_head_and_odd_sizes() -> None:
    assert fp8_layer_filter(nn.Linear(64, 192), "blocks.0.attn.qkv")
    assert not fp8_layer_filter(nn.Linear(64, 256), "head")  # tied to the embedding
    assert not fp8_layer_filter(nn.Linear(60, 64), "x")  # FP8 matmuls need multiples of 16
    assert not fp8_layer_filter(nn.LayerNorm(64), "ln_f")


@pytest.fixture
def fake_torchao(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """A stand-in torchao.float8 that records its calls and swaps nothing."""
    calls: list[dict] = []
    float8 = types.ModuleType("torchao.float8")

    class Float8LinearConfig:
        def __init__(self, emulate: bool = False) -> None:
            self.emulate = emulate

    def convert_to_float8_training(module, *, module_filter_fn, config):  # noqa: ANN001, ANN202
        calls.append({"module": module, "filter": module_filter_fn, "emulate": config.emulate})
        return module

    float8.Float8LinearConfig = Float8LinearConfig
    float8.convert_to_float8_training = convert_to_float8_training
    monkeypatch.setitem(sys.modules, "torchao", types.ModuleType("torchao"))
    monkeypatch.setitem(sys.modules, "torchao.float8", float8)
    monkeypatch.setattr(fp8, "torchao_version", lambda: "0.18.0")
    return calls


def test_convert_fp8_calls_torchao_with_the_filter(fake_torchao: list[dict]) -> None:
    model = nn.Sequential(nn.Linear(16, 16))
    assert convert_fp8(model, emulate=True) is model
    assert fake_torchao == [{"module": model, "filter": fp8_layer_filter, "emulate": True}]
    convert_fp8(model)
    assert fake_torchao[-1]["emulate"] is False


def test_convert_fp8_without_torchao_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fp8, "torchao_version", lambda: None)
    with pytest.raises(ModuleNotFoundError, match="pip install 'torchao>=0.14,<0.19'"):
        convert_fp8(nn.Linear(16, 16))


def test_a_gpt_trains_in_emulated_fp8_where_torchao_is_installed() -> None:
    pytest.importorskip("torchao.float8")
    cfg = GPTConfig(n_layer=1, n_head=2, d_model=32, seq_len=16)
    model = make_gpt(cfg)
    params = [id(p) for p in model.parameters()]
    convert_fp8(model, emulate=True)
    assert fp8_layers(model) == 4  # qkv, proj, and the MLP's two; not the head
    assert [id(p) for p in model.parameters()] == params  # the optimizer's tensors stay
    idx = torch.randint(0, 256, (2, 16))
    model(idx, idx).backward()
    assert model.blocks[0].mlp[0].weight.grad is not None


def test_fp8_layers_counts_by_class_name() -> None:
    Float8Linear = type("Float8Linear", (nn.Linear,), {})
    model = nn.Sequential(Float8Linear(16, 16), nn.Linear(16, 16))
    assert fp8_layers(model) == 1


def test_fp8_table_keys_are_rows_of_the_peak_table() -> None:
    patterns = {row.pattern for row in _PEAK_TABLE}
    assert set(FP8_DENSE_TFLOPS) <= patterns
    for row in _PEAK_TABLE:  # twice bf16 (the L40S datasheet's own figures are 1.2% apart)
        if row.pattern in FP8_DENSE_TFLOPS and "bf16" in row.tflops:
            assert FP8_DENSE_TFLOPS[row.pattern] == pytest.approx(2 * row.tflops["bf16"], rel=0.02)


@pytest.mark.parametrize(
    ("kind", "tflops"), [("h100_sxm", 1979.0), ("rtx4090", 330.3), ("a100", None), ("t4", None)]
)
def test_fp8_peak(fake_gpu, kind: str, tflops: float | None) -> None:  # noqa: ANN001
    gpu = fake_gpu(kind)
    peak = fp8_peak(gpu.device)
    if tflops is None:
        assert peak is None
    else:
        assert peak.flops == tflops * 1e12 and not peak.measured
        assert peak.source == f"datasheet dense FP8 peak of {gpu.spec.name}"


def test_fp8_peak_of_an_unknown_gpu_or_a_cpu(fake_gpu) -> None:  # noqa: ANN001
    assert fp8_peak("cpu") is None
    fake_gpu("h100_sxm", name="NVIDIA Mystery GPU")
    assert peak_row("NVIDIA Mystery GPU") is None and fp8_peak("cuda") is None


#: GPUs with FP8 tensor cores, as torch names them, and their dense FP8 datasheet figure; none
#: of them is a fake-GPU kind of its own, so the rtx4090 kind (8.9) lends its other figures.
FP8_NAMES = {
    "NVIDIA H100 80GB HBM3": 1979.0,  # the SXM part, as torch names it
    "NVIDIA H100 PCIe": 1513.0,
    "NVIDIA H200": 1979.0,
    "NVIDIA H200 NVL": 1670.5,
    "NVIDIA GH200 480GB": 1979.0,
    "NVIDIA GeForce RTX 4090": 330.3,
    "NVIDIA GeForce RTX 5090": 419.0,
    "NVIDIA L4": 242.5,
    "NVIDIA L40S": 733.0,
    "NVIDIA L40": 362.0,
    "NVIDIA H20": 296.0,
    "NVIDIA H800 PCIe": 1513.0,
    "NVIDIA H800": 1979.0,
    "NVIDIA B200": 4500.0,
    "NVIDIA GB200": 5000.0,
    "NVIDIA RTX 6000 Ada Generation": 728.5,
    "NVIDIA H100 NVL": 1670.5,
}


@pytest.mark.parametrize(("name", "tflops"), list(FP8_NAMES.items()))
def test_fp8_peak_by_the_tables_own_patterns(fake_gpu, name: str, tflops: float) -> None:  # noqa: ANN001
    fake_gpu("rtx4090", name=name)
    peak = fp8_peak("cuda")
    assert peak is not None and peak.flops == tflops * 1e12
    assert peak.source == f"datasheet dense FP8 peak of {name}"


@pytest.mark.parametrize(
    "name",
    ["NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 3090"],
)
def test_fp8_peak_of_other_chips_is_unknown(fake_gpu, name: str) -> None:  # noqa: ANN001
    """A laptop part of the same name is another chip: no datasheet figure, not the desktop's."""
    fake_gpu("rtx4090", name=name)
    assert fp8_peak("cuda") is None


def test_each_fp8_name_matches_one_pattern_only() -> None:
    for name in FP8_NAMES:
        hits = [p for p in FP8_DENSE_TFLOPS if re.search(p, name, re.IGNORECASE)]
        assert len(hits) == 1, (name, hits)


#: (kind, torchao installed) -> what chapter 7 does about FP8 there
PLANS = {
    ("h100_sxm", True): "native",
    ("rtx4090", True): "native",
    ("h100_sxm", False): "none",
    ("a100", True): "emulated",
    ("t4", True): "emulated",
    ("mi300x", True): "emulated",
    ("mps", True): "none",  # MPS has no float8 dtypes: the emulation would raise there
    ("mps", False): "none",
    ("a100", False): "none",
}


@pytest.mark.parametrize(("kind", "torchao"), list(PLANS))
def test_fp8_plan_emulates_only_without_fp8_tensor_cores(
    fake_gpu,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    torchao: bool,  # noqa: ANN001
) -> None:
    gpu = fake_gpu(kind)
    monkeypatch.setattr(fp8, "torchao_version", lambda: "0.18.0" if torchao else None)
    mode, why = fp8_plan(gpu.device)
    assert mode == PLANS[(kind, torchao)]
    assert (mode == "native") == fp8_available(gpu.device)[0]  # the lever runs where native
    if mode == "native":
        assert why == ""
    elif kind == "h100_sxm":
        assert why == f"torchao is not installed: {INSTALL_HINT}"
    else:
        assert why.startswith(fp8_hardware(gpu.device)[1])
        assert why.endswith(INSTALL_HINT) is (not torchao and kind != "mps")
        assert ("MPS has no float8 dtypes" in why) is (kind == "mps")


def test_fp8_plan_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fp8, "torchao_version", lambda: "0.18.0")
    assert fp8_plan("cpu")[0] == "emulated"
    monkeypatch.setattr(fp8, "torchao_version", lambda: None)
    assert fp8_plan("cpu")[0] == "none"


CHAPTER = Path(__file__).resolve().parents[1] / "notebooks" / "07_capstone.ipynb"


class FailingSearch:
    """What chapter 7's FP8 cells read of a LeverSearch; its FP8 run raises, as on a broken install."""

    def __init__(self) -> None:
        self.current = types.SimpleNamespace(plus=lambda name: name)
        self.calls: list[str] = []

    def side_row(self, levers: object, parent: object) -> tuple[None, str]:
        self.calls.append(str(levers))
        return None, "RuntimeError: torchao float8 needs torch.compile here"


class StandInTrainer:
    """The emulated branch's Trainer: a model to convert, constant losses."""

    model = None

    def losses(self, steps: int) -> list[float]:
        return [5.0] * steps


@pytest.mark.parametrize("kind", ["h100_sxm", "a100"])
def test_the_chapters_fp8_cells_never_hide_a_failure(
    fake_gpu,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    kind: str,  # noqa: ANN001
) -> None:
    """On an FP8 GPU a failed run prints its error and emulates nothing; without FP8, emulation."""
    gpu = fake_gpu(kind)
    monkeypatch.setattr(fp8, "torchao_version", lambda: "0.18.0")
    emulated: list[bool] = []
    monkeypatch.setattr(fp8, "convert_fp8", lambda model, emulate: emulated.append(emulate))

    search = FailingSearch()
    namespace = {
        "device": gpu.device, "search": search, "final": object(), "Levers": lambda: None,
        "trainer": lambda levers: StandInTrainer(), "CHECK_STEPS": 2, "estimate": 1.0,
        "baseline_losses": [5.0, 5.0], "same_math": same_math,
    }  # fmt: skip
    for marker in ("fp8_mode, fp8_why = fp8_plan(device)", 'elif fp8_mode == "emulated"'):
        exec(cell_containing(CHAPTER, marker), namespace)
    out = capsys.readouterr().out
    if kind == "h100_sxm":  # FP8 tensor cores: measured for real, and its failure said
        assert search.calls == ["fp8"] and emulated == []
        assert "FP8 FAILED on this FP8-capable GPU: RuntimeError: torchao float8 needs" in out
        assert "no FP8 row here: the run failed (the reason is printed above)" in out
        assert "skipped here: ." not in out and "FP8 skipped" not in out
    else:  # no FP8 tensor cores: the rounding emulated, nothing measured
        assert search.calls == [] and emulated == [True]
        assert "FP8 not measured here: NVIDIA A100-SXM4-80GB is compute capability 8.0" in out
        assert "FP8, emulated, vs fp32: the rounding FP8 makes" in out
