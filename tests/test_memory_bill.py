"""helpers.memory_bill: the estimator predicts every line that one real step measures."""

from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure
from torch import nn

from helpers.memory_bill import (
    CUDA_CONTEXT_RANGE,
    BillSweep,
    MemoryBill,
    bill_sweep,
    estimate_training_memory,
    measure_training_memory,
    optimizer_kind,
    outside_allocator,
    plot_bill_sweep,
)
from helpers.models import make_mlp, wide_mlp_sizes
from helpers.sweeps import run_sweep
from helpers.validate import DeviceError
from helpers.widgets import interactive_plot

MiB = 2**20


def mlp(width: int, depth: int) -> torch.nn.Sequential:
    """Chapter 5's MLP: `depth` blocks of Linear + ReLU, then a 10-way head."""
    return make_mlp(wide_mlp_sizes(width, depth, 10), blocks=True)


LINES = ("parameters", "gradients", "optimizer_state", "saved_for_backward", "total")
OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p),
    "adamw-amsgrad": lambda p: torch.optim.AdamW(p, amsgrad=True),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_estimate_equals_one_real_step(name: str, precision: str) -> None:
    torch.manual_seed(0)
    model = mlp(128, 3)
    opt = OPTIMIZERS[name](model.parameters())
    x, y = torch.randn(32, 128), torch.randint(0, 10, (32,))
    real = measure_training_memory(
        model, opt, nn.functional.cross_entropy, x, y, precision=precision
    )
    pred = estimate_training_memory(model, 32, (128,), optimizer=opt, precision=precision)
    for line in LINES:
        assert getattr(real, line) == getattr(pred, line), line


def test_estimate_with_checkpointing_equals_a_real_step() -> None:
    model = mlp(64, 4)
    opt = torch.optim.Adam(model.parameters())
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    real = measure_training_memory(
        model, opt, nn.functional.cross_entropy, x, y, checkpoint_every=2
    )
    pred = estimate_training_memory(model, 16, (64,), checkpoint_every=2)
    assert real.total == pred.total


def test_bytes_per_parameter_by_optimizer() -> None:
    model = mlp(64, 2)
    n, tensors = sum(p.numel() for p in model.parameters()), len(list(model.parameters()))
    for name, copies in (
        ("adam", 2),
        ("adamw", 2),
        ("adam-amsgrad", 3),
        ("sgd-momentum", 1),
        ("sgd", 0),
    ):
        bill = estimate_training_memory(model, 4, (64,), optimizer=name)
        assert bill.parameters == bill.gradients == 4 * n
        steps = 4 * tensors if name.startswith("adam") else 0
        assert bill.optimizer_state == copies * 4 * n + steps


def test_frozen_parameters_have_no_gradients_or_state() -> None:
    model = mlp(32, 2)
    for p in model[0].parameters():
        p.requires_grad_(False)
    bill = estimate_training_memory(model, 4, (32,), optimizer="adam")
    frozen = sum(p.numel() for p in model[0].parameters())
    assert bill.parameters - bill.gradients == 4 * frozen


def test_cuda_context_is_a_cited_range_only_on_cuda() -> None:
    bill = estimate_training_memory(mlp(16, 1), 2, (16,))
    assert bill.context is None
    last = str(MemoryBill(1, 1, 1, 1, context=CUDA_CONTEXT_RANGE)).splitlines()[-1].split()
    assert last[:2] == ["CUDA", "context"] and last[-1] == "n/a"
    lo, hi = CUDA_CONTEXT_RANGE
    assert lo == 2**30 // 2 and 1.7 * 2**30 < hi < 1.9 * 2**30


def test_activation_bytes_override_and_printing() -> None:
    bill = estimate_training_memory(mlp(16, 1), 2, (16,), activation_bytes=1000)
    assert bill.activations == 1000 and bill.autocast_copies == 0
    text = str(bill)
    assert "optimizer state" in text and "total (tensors)" in text


def test_optimizer_kind() -> None:
    p = [nn.Parameter(torch.zeros(2))]
    assert optimizer_kind(torch.optim.AdamW(p)) == "adamw"
    assert optimizer_kind(torch.optim.SGD(p, lr=0.1)) == "sgd"
    assert optimizer_kind("SGD_momentum") == "sgd-momentum"


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: estimate_training_memory(nn.ReLU(), 4, (8,)), ValueError, "has no parameters"),
        (lambda: estimate_training_memory(nn.Sequential(), 4, (8,)), ValueError, "no parameters"),
        (lambda: estimate_training_memory(mlp(8, 1), -4, (8,)), ValueError, "batch_size"),
        (lambda: estimate_training_memory(mlp(8, 1), 0, (8,)), ValueError, "batch_size"),
        (lambda: estimate_training_memory("model", 4, (8,)), TypeError, "nn.Module"),
        (
            lambda: estimate_training_memory(mlp(8, 1), 4, (8,), optimizer="lion"),
            ValueError,
            "Unknown optimizer",
        ),
        (
            lambda: estimate_training_memory(mlp(8, 1), 4, (8,), precision="int8"),
            Exception,
            "dtype",
        ),
        (
            lambda: estimate_training_memory(mlp(8, 1), 4, (8,), precision="fp64"),
            ValueError,
            "bf16 or fp16",
        ),
        (
            lambda: optimizer_kind(torch.optim.RMSprop([nn.Parameter(torch.zeros(1))])),
            ValueError,
            "Adam, AdamW and SGD",
        ),
        (lambda: bill_sweep(512, precision="fp8", device="cpu"), ValueError, "precision"),
        (lambda: bill_sweep(-1, device="cpu"), ValueError, "max_batch"),
    ],
)
def test_bad_input_gets_a_clear_error(call, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_widget_run_and_plot_functions() -> None:
    result = bill_sweep(64, checkpointing=True, precision="bf16", device="cpu", width=64, points=3)
    assert isinstance(result, BillSweep)
    assert result.sweep.column("batch") == [16, 32, 64]
    for row in result.sweep.rows:
        assert row["measured MiB"] == row["predicted MiB"]
        assert row["measured activations MiB"] == row["predicted activations MiB"]
    fig = plot_bill_sweep(result)
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert [ax.get_title() for ax in fig.axes] == ["training bill", "saved for backward"]
    assert "batch" in str(result)


def test_widget_button_runs_and_plots() -> None:
    import ipywidgets as widgets

    calls = []

    def run(max_batch: int = 32, checkpointing: bool = False, precision: str = "fp32") -> BillSweep:
        calls.append((max_batch, checkpointing, precision))
        return bill_sweep(max_batch, checkpointing, precision, device="cpu", width=32, points=2)

    controls = {
        "max_batch": widgets.Dropdown(options=[16, 32], value=32),
        "checkpointing": widgets.Checkbox(value=True),
        "precision": widgets.Dropdown(options=["fp32", "bf16"], value="fp32"),
    }
    box = interactive_plot(run, plot_bill_sweep, controls)
    box.run_button.click()
    assert calls == [(32, True, "fp32")]
    assert isinstance(box.last_result, BillSweep)
    assert box.last_result.sweep.column("batch") == [16, 32]


def test_cuda_step_phases_reads_each_phase_peak(fake_gpu) -> None:
    """The CUDA branch of the sweep, on a fake H100: each phase's peak and where it started."""
    from helpers.memory_bill import cuda_step_phases

    gpu = fake_gpu("h100_sxm")
    gpu.allocate(1000 * MiB)  # what the process holds before the step
    model = mlp(32, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step_with_temporaries() -> None:  # a parameter-sized buffer, as foreach Adam makes
        gpu.allocate(300 * MiB)  # (a real step asks the fake GPU for its stream: not here)
        gpu.free(300 * MiB)

    opt.step = step_with_temporaries

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        gpu.allocate(50 * MiB)  # the forward's activations, alive until backward
        return nn.functional.cross_entropy(out, y)

    x, y = torch.randn(4, 32), torch.randint(0, 10, (4,))
    phases = cuda_step_phases(model, opt, loss_fn, x, y, device="cuda")
    assert list(phases) == ["forward", "backward", "optimizer.step()"]
    assert phases["forward"] == (1000 * MiB, 1050 * MiB)
    start, peak = phases["optimizer.step()"]
    assert start == 1050 * MiB and peak - start == 300 * MiB
    assert all(p.grad is not None for p in model.parameters())  # backward really ran


# ------------------------------- the GPU memory outside PyTorch's allocator (AUDIT finding 9)

GiB = 2**30


def outside_on(fake_gpu, monkeypatch, others: list, outside: int, **kw):  # noqa: ANN001, ANN003, ANN201
    """A fake H100 whose whole-device reading shows `outside` bytes beyond the allocator."""
    gpu = fake_gpu("h100_sxm")
    gpu.allocate(418 * MiB)
    gpu.nvml.processes = {0: others}
    total = gpu.spec.total_memory
    monkeypatch.setattr(
        torch.cuda, "mem_get_info", lambda d=None: (total - gpu.reserved - outside, total)
    )
    for name, value in kw.items():
        monkeypatch.setattr(torch.cuda, name, value)
    return outside_allocator("cuda")


def test_the_h100_runs_28_gib_split_into_context_and_two_other_notebooks(
    fake_gpu, monkeypatch
) -> None:  # noqa: ANN001
    """The H100 run printed 28.80 GiB 'context + other processes': NVML tells the two apart."""
    others = [(4242, 17 * GiB), (4343, int(11.2 * GiB))]
    reading = outside_on(fake_gpu, monkeypatch, others, int(28.8 * GiB))
    assert reading.outside == int(28.8 * GiB) and reading.reserved == 418 * MiB
    assert reading.context == int(28.8 * GiB) - int(28.2 * GiB)
    text = str(reading)
    assert text.startswith("device memory not held by PyTorch's allocator: 28.80 GiB = 28.20 GiB")
    assert "held by 2 other process(es) (NVML) + 614.40 MiB this process's CUDA context" in text
    assert text.endswith("cited context range 0.5-1.8 GiB on an A100")


def test_alone_on_the_gpu_everything_outside_is_the_context(fake_gpu, monkeypatch) -> None:  # noqa: ANN001
    reading = outside_on(fake_gpu, monkeypatch, [], 600 * MiB)
    assert reading.context == 600 * MiB and not reading.unsplit
    assert (
        "600.00 MiB, no other process on this GPU: 600.00 MiB this process's CUDA context"
        in str(reading)
    )


@pytest.mark.parametrize(
    ("others", "patch", "why"),
    [
        ([(4242, None)], {}, "NVML does not report the other processes' memory here"),
        ([(4242, 40 * GiB)], {}, "more than the whole outside part"),
        (
            [(777001, GiB), (777002, 2 * GiB)],
            {"is_initialized": lambda: True},
            "pids from another namespace",
        ),
    ],
)
def test_what_cannot_be_split_says_why(fake_gpu, monkeypatch, others, patch, why: str) -> None:  # noqa: ANN001
    reading = outside_on(fake_gpu, monkeypatch, others, 3 * GiB, **patch)
    assert reading.context is None and why in reading.unsplit
    assert "(this process's CUDA context + other processes; cannot be split here: " in str(reading)


def test_without_nvml_it_cannot_be_split(fake_gpu, monkeypatch) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm")
    gpu.nvml.unsupported = {"processes"}
    assert "NVML could not list processes" in outside_allocator("cuda").unsplit
    rocm = fake_gpu("mi300x")
    assert "NVML does not see AMD GPUs" in str(outside_allocator(rocm.device))


@pytest.mark.parametrize("kind", ["cpu", "mps"])
def test_outside_allocator_needs_cuda(fake_gpu, kind: str) -> None:  # noqa: ANN001
    device = "cpu" if kind == "cpu" else fake_gpu("mps").device
    with pytest.raises(DeviceError, match="no CUDA context to measure here"):
        outside_allocator(device)


def test_a_bill_sweep_prints_its_settings_as_a_sentence_not_a_dict() -> None:
    # The H200 run of 2026-11-28: chapter 5 printed {'device': 'cuda:0', 'width': 4096, ...}.
    sweep = run_sweep(lambda b: {"MiB": float(b)}, [1, 2], param="batch", progress=False)
    settings = {
        "device": "cuda:0",
        "width": 4096,
        "depth": 4,
        "precision": "fp32",
        "checkpointing": False,
        "parameters MiB": 256.22,
    }
    head = str(BillSweep(sweep, settings)).splitlines()[0]
    assert head == "cuda:0: MLP 4 x 4096 (256.22 MiB of parameters), fp32, no checkpointing"
    assert str(BillSweep(sweep, {"depth": 2})).startswith("depth 2\n")
