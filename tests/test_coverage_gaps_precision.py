"""Lines of helpers/amp_choice.py, amp_sweep.py and mfu.py no other unit test ran (tests/gpu_only_lines.md)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from pretty_text import pretty  # noqa: E402

from helpers import amp_choice  # noqa: E402
from helpers.amp_choice import AmpChoice
from helpers.amp_sweep import AmpSweep, plot_amp_sweep
from helpers.mfu import MfuResult, Peak  # noqa: E402
from helpers.sweeps import SweepResult  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():  # noqa: ANN202
    yield
    plt.close("all")


def _row(batch: int, rate: float) -> dict:
    return {"batch size": batch, "samples/s": rate, "peak MiB": 1.0, "saved MiB": 0.5}


def _sweep(**results: SweepResult) -> AmpSweep:
    return AmpSweep(
        device="cuda:0", sizes=(16, 16, 1), meter="peak MiB = allocator", results=results
    )


def test_pretty_printers_print_str() -> None:
    choice = AmpChoice(torch.bfloat16, False, "bf16 is native here")
    sweep = _sweep(fp32=SweepResult("batch size", [_row(8, 100.0)]))
    result = MfuResult(flops=2 * 10**9, seconds=1e-3, peak=Peak(1e13, "datasheet", False))
    for obj in (choice, sweep, result):
        assert pretty(obj) == str(obj) and pretty(obj)
    assert "bf16 is native here" in pretty(choice) and "GFLOP/s" in pretty(result)


def test_speedup_names_what_was_measured() -> None:
    sweep = _sweep(
        fp32=SweepResult("batch size", [_row(8, 100.0)]),
        bf16=SweepResult("batch size", [_row(8, 250.0)]),
    )
    assert sweep.speedup("bf16", 8) == 2.5
    with pytest.raises(KeyError, match="fp16 was not measured; measured: fp32, bf16"):
        sweep.speedup("fp16", 8)
    with pytest.raises(KeyError, match="fp32 was not measured; measured: bf16"):
        _sweep(bf16=SweepResult("batch size", [_row(8, 1.0)])).speedup("bf16", 8)


@pytest.mark.parametrize(
    ("desc", "native"),
    [
        ({"kind": "xpu"}, True),
        ({"kind": "rocm", "bf16_reported": True}, True),
        ({"kind": "rocm", "bf16_native": False, "bf16_reported": True}, False),
        ({"kind": "rocm"}, False),
        ({"kind": "cpu", "bf16_native": True}, True),  # no flags listed: the field decides
        ({"kind": "cpu", "cpu_flags": "avx2 avx512_bf16"}, True),
        ({"kind": "cpu", "cpu_flags": ["avx2"], "bf16_native": True}, False),  # flags win
        ({"kind": "mps"}, False),
        ({"kind": "npu", "bf16_native": True}, True),
    ],
)
def test_bf16_is_native_for_every_kind(desc: dict, native: bool) -> None:
    assert amp_choice.bf16_is_native(desc) is native


def test_plot_amp_sweep_leaves_out_a_precision_without_rows() -> None:
    sweep = _sweep(
        fp32=SweepResult("batch size", [_row(8, 100.0), _row(16, 180.0)]),
        fp16=SweepResult("batch size", [], stopped="out of memory"),
    )
    sweep.skipped["bf16"] = "no bf16 here"
    fig = plot_amp_sweep(sweep)
    rate, mem = fig.axes
    assert [t.get_text() for t in rate.get_legend().get_texts()] == ["fp32"]
    assert len(mem.lines) == 2, "peak and saved, for fp32 only"
    assert "skipped: bf16" in fig._suptitle.get_text()
