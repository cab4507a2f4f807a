"""Lines of small helpers no other unit test ran: printers, plots, edge cases (tests/gpu_only_lines.md)."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from pretty_text import pretty  # noqa: E402
from torch import nn  # noqa: E402

from helpers import activations, syncs  # noqa: E402
from helpers.matmul import MatmulSweep, _sizes, plot_matmul_sweep, plot_speedup  # noqa: E402
from helpers.max_batch import MaxBatchResult, _oom_message  # noqa: E402
from helpers.memory_bill import BillSweep, MemoryBill, plot_bill_sweep  # noqa: E402
from helpers.plots import plot_sweep  # noqa: E402
from helpers.profiling import _union_us  # noqa: E402
from helpers.sweeps import SweepResult  # noqa: E402
from helpers.tables import print_table  # noqa: E402
from helpers.timing import BenchResult  # noqa: E402
from helpers.units import format_seconds  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():  # noqa: ANN202
    yield
    plt.close("all")


def test_repr_pretty_prints_str() -> None:
    sweep = SweepResult("batch", [{"batch": 1, "ms": 2.0}])
    bench = BenchResult("mm", 1e-3, 1e-5, [1e-3], 1, 2, "cpu", "torch.utils.benchmark")
    found = MaxBatchResult(8, [{"batch": 8, "fits": True}], limit=8, method="doubling")
    bill = MemoryBill(4, 4, 8, 16)
    for obj in (sweep, bench, found, bill, BillSweep(sweep, {"depth": 2})):
        assert pretty(obj) == str(obj) and pretty(obj)


def test_format_seconds_passes_non_finite_through() -> None:
    assert format_seconds(math.inf) == "inf" and format_seconds(math.nan) == "nan"


def test_print_table_prints_the_formatted_rows(capsys: pytest.CaptureFixture[str]) -> None:
    print_table([{"n": 64, "GFLOP/s": 1.5}])
    out = capsys.readouterr().out
    assert "GFLOP/s" in out and "64" in out


def test_plot_sweep_says_it_stopped_early() -> None:
    r = SweepResult("batch", [{"batch": 1, "ms": 1.0}], stopped="CUDA out of memory")
    fig = plot_sweep(r, "ms", title="time")
    assert "stopped early: out of memory" in fig.axes[0].get_title()
    assert fig.axes[0].get_xlabel() == "batch" and fig.axes[0].get_ylabel() == "ms"


def test_union_of_nested_intervals_counts_the_outer_one() -> None:
    assert _union_us([(0.0, 10.0), (2.0, 5.0), (8.0, 12.0)]) == 12.0


def test_matmul_sizes_default_and_scalar() -> None:
    assert _sizes(None, None) == [64, 128, 256, 512, 1024]
    assert _sizes(256, None) == [256]


def _matmul_sweep(rows: list[dict], peak: float | None) -> MatmulSweep:
    return MatmulSweep("n", rows, device="cuda:0", peak=peak)


def test_plot_matmul_sweep_draws_the_datasheet_peak() -> None:
    rows = [
        {"n": 64, "time (ms)": 0.1, "GFLOP/s": 5.0},
        {"n": 128, "time (ms)": 0.5, "GFLOP/s": 8.0},
    ]
    fig = plot_matmul_sweep(_matmul_sweep(rows, peak=1e10))
    ax_t, ax_f = fig.axes
    assert ax_t.get_ylabel() == "median time per call (ms)" and ax_f.get_ylabel() == "GFLOP/s"
    assert [t.get_text() for t in ax_f.get_legend().get_texts()] == ["achieved", "datasheet peak"]
    assert any(list(line.get_ydata()) == [10.0, 10.0] for line in ax_f.get_lines())


def test_plot_speedup_without_rows_says_so() -> None:
    fig = plot_speedup(_matmul_sweep([], peak=None))
    ax = fig.axes[0]
    assert "cuda:0" in ax.get_title() and not ax.get_lines()
    assert ax.texts, "an empty sweep is explained on the plot"


def test_max_batch_result_says_when_the_limit_was_hit() -> None:
    text = str(MaxBatchResult(64, [{"batch": 64, "fits": True}], limit=64, method="doubling"))
    assert "largest batch that fits: 64 (the search limit; larger may fit too)" in text
    assert "[doubling, 1 probes]" in text


def test_oom_message_keeps_an_unknown_first_line() -> None:
    assert _oom_message("out of memory somewhere\nmore") == "out of memory somewhere"
    assert _oom_message("") == "out of memory"


def test_memory_bill_rows_list_autocast_copies_and_the_context_range() -> None:
    bill = MemoryBill(2**20, 2**20, 2**21, 2**22, autocast_copies=2**19, context=(2**28, 2**29))
    lines = [line.strip() for line in str(bill).splitlines()]
    assert lines[-3].startswith("autocast weight copies") and lines[-3].endswith(str(2**19))
    assert lines[-2].startswith("total (tensors)")
    assert lines[-1].startswith("CUDA context (cited range)") and "256-512" in lines[-1]


def test_plot_bill_sweep_draws_the_cuda_peak_and_says_it_stopped() -> None:
    row = {
        "batch": 8,
        "predicted MiB": 2.0,
        "measured MiB": 2.1,
        "CUDA peak MiB": 2.5,
        "predicted activations MiB": 1.0,
        "measured activations MiB": 1.0,
    }
    sweep = SweepResult("batch", [row], stopped="out of memory")
    settings = {
        "depth": 2,
        "width": 64,
        "precision": "fp32",
        "checkpointing": True,
        "device": "cuda",
    }
    fig = plot_bill_sweep(BillSweep(sweep, settings))
    left = fig.axes[0]
    labels = [t.get_text() for t in left.get_legend().get_texts()]
    assert "CUDA max_memory_allocated" in labels
    assert "stopped early: out of memory" in fig._suptitle.get_text()
    assert "checkpointing on" in fig._suptitle.get_text()


def test_storage_key_of_a_tensor_without_plain_storage() -> None:
    sparse = torch.eye(3).to_sparse()
    assert activations.unique_storage_bytes([sparse]) == 9 * 4  # numel x itemsize


@pytest.mark.parametrize(
    "layer",
    [
        nn.Conv2d(3, 4, 3, padding="same"),
        nn.Conv2d(3, 4, 3, padding="valid"),
        nn.MaxPool2d(2, stride=2, padding=1, ceil_mode=True),
    ],
)
def test_analytic_shapes_match_pytorch(layer: nn.Module) -> None:
    model = nn.Sequential(layer, nn.Flatten())
    x = torch.zeros(2, 3, 5, 5)
    rows = activations.activation_table(model, (3, 5, 5), 2)
    assert rows[0]["output shape"] == tuple(layer(x).shape)
    if isinstance(layer, nn.MaxPool2d):  # an input without gradient: pooling keeps nothing
        assert rows[0]["keeps"] == "nothing (no gradient needed)" and rows[0]["bytes"] == 0


def test_analytic_count_refuses_what_it_cannot_count() -> None:
    with pytest.raises(ValueError, match="input channels"):
        activations.activation_table(nn.Sequential(nn.Conv2d(4, 4, 3)), (3, 8, 8), 1)
    with pytest.raises(ValueError, match="return_indices"):
        activations.activation_table(
            nn.Sequential(nn.MaxPool2d(2, return_indices=True)), (3, 4, 4), 1
        )


def test_sync_argument_helpers() -> None:
    a, b = torch.zeros(1), torch.zeros(1, device="meta")
    assert syncs._tensors_in((a, [b, 3]), {}) == [a, b]
    assert syncs._target_is_host((b, a), {}) is True  # .to(other_tensor): other's device
    assert syncs._target_is_host((a, b), {}) is False
    assert syncs._target_is_host((b, torch.float16), {}) is False  # a dtype only: no move


def test_caller_when_every_frame_is_plumbing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(syncs, "_PLUMBING", ("",))
    assert syncs._caller(()) == ("?", False)


def test_sync_counter_pretty_prints_its_summary() -> None:
    with syncs.SyncCounter(cuda_debug=False) as counter:
        torch.ones(2).sum().item()
    assert pretty(counter) == str(counter) and "1 host sync(s)" in pretty(counter)
