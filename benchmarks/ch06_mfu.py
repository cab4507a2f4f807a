"""Chapter 6 benchmark: the MFU of chapter 6's MLP training step, alone, against its bf16 peak.

    python benchmarks/ch06_mfu.py                       # the device pick_device() chooses
    python benchmarks/ch06_mfu.py --device cpu --width 1024 --batch 256

The step is chapter 6's section 6 step: four `width` x `width` Linear layers
(helpers.models.make_mlp, ReLU between them; the chapter's also has one after the last,
which adds no matmul), a mean-square loss, SGD; its matmuls in bf16 (autocast) on a GPU that computes bf16 natively,
else in fp32 (helpers.mfu.mfu_precision), at the chapter's sizes unless told (a 4 x 4096 MLP at
batch 4096 on a GPU, 4 x 2048 at batch 512 on a CPU). Its FLOPs are counted by FlopCounterMode
and checked against the count by hand (each layer's forward, weight gradient and input
gradient, but no input gradient for the first layer); it is timed by helpers.mfu.measure_mfu
(helpers.timing.benchmark: warm-up, sync, repeats, median), and its MFU is given against the
datasheet peak where helpers.peaks knows the GPU and against the best matmul of that dtype
measured here (chapter 1's search).

Target (issue 33): on an H100 or H200, MFU at least 60% of the datasheet dense bf16 peak. The
target line follows the machine's state as a verdict does: on a shared GPU or a loaded CPU it
says "inconclusive", since the step's time there is not the GPU's. Timings are printed, never
asserted; the exit code is 1 only if the FLOP count disagrees with the count by hand.

Version 1. When changing how this script measures, bump the version.
"""

from __future__ import annotations

import argparse

import torch

from helpers.devices import describe_device, pick_device
from helpers.machine_state import MachineState, machine_state
from helpers.mfu import achievable_peak, count_flops, measure_mfu, mfu_precision, reference_peak
from helpers.models import make_mlp

VERSION = 1
#: MFU the chapter 6 step should reach on an H100 or H200 (issue 33), of the bf16 datasheet peak.
TARGET_MFU = 0.60
TARGET_GPUS = ("H100", "H200")


def sizes(device: torch.device) -> tuple[int, int]:
    """(width, batch) as chapter 6 picks them: 4096 x 4096 on a GPU, 2048 x 512 elsewhere."""
    return (4096, 4096) if device.type in ("cuda", "mps") else (2048, 512)


def make_step(width: int, batch: int, device: torch.device, dtype: torch.dtype):  # noqa: ANN201
    """Chapter 6's MFU step: a 4-layer MLP, mean-square loss, SGD, matmuls in `dtype`."""
    model = make_mlp((width,) * 5, device=device)  # the course's one MLP: 4 square layers
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = model(x).square().mean()
        loss.backward()
        opt.step()

    return step


def flops_by_hand(width: int, batch: int, layers: int = 4) -> int:
    """Forward, weight gradient and input gradient of each layer, no input gradient for the first."""
    return (layers + layers + (layers - 1)) * 2 * batch * width**2


def target_line(mfu: float | None, peak_source: str, gpu_name: str, state: MachineState) -> str:
    """The H100/H200 target line: meets, MISSES, inconclusive on a busy machine, or n/a."""
    if not any(name in gpu_name for name in TARGET_GPUS):
        return f"H100 target (MFU >= {TARGET_MFU:.0%} of the bf16 datasheet peak): n/a here ({gpu_name})"
    if mfu is None or "datasheet" not in peak_source or "bf16" not in peak_source:
        return "H100 target: n/a, no bf16 datasheet peak to compare with"
    said = (
        f"H100 target: MFU {mfu:.1%} against at least {TARGET_MFU:.0%} of the bf16 datasheet peak"
    )
    if not state.quiet:
        return f"{said}: inconclusive, the machine was busy ({state.caveat()})"
    return f"{said}: {'meets' if mfu >= TARGET_MFU else 'MISSES'} it"


def main(argv: list[str] | None = None) -> int:
    """The step's FLOPs, its MFU against both peaks, the machine's state and the target line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps ... (default: best)")
    parser.add_argument(
        "--width", type=int, default=None, help="the MLP's width (default: chapter 6's)"
    )
    parser.add_argument("--batch", type=int, default=None, help="the batch (default: chapter 6's)")
    parser.add_argument("--min-run-time", type=float, default=0.5, help="seconds of timing")
    args = parser.parse_args(argv)
    device = pick_device(args.device)
    width, batch = sizes(device)
    width = width if args.width is None else args.width
    batch = batch if args.batch is None else args.batch
    if width < 1 or batch < 1 or args.min_run_time <= 0:
        parser.error("--width and --batch must be >= 1 and --min-run-time > 0")
    dtype = mfu_precision(device)
    print(
        f"chapter 6 MFU benchmark v{VERSION}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(describe_device(device), end="\n\n")
    peak = reference_peak(device, dtype)
    achievable = None if peak.measured else achievable_peak(device, dtype)
    step = make_step(width, batch, device, dtype)
    counted, by_hand = count_flops(step), flops_by_hand(width, batch)
    print(f"step: 4 x {width} MLP, batch {batch}, matmuls in {dtype}; {counted / 1e9:.1f} GFLOP "
          f"counted, {by_hand / 1e9:.1f} by hand ({'equal' if counted == by_hand else 'DIFFERENT'})")  # fmt: skip
    result = measure_mfu(step, device, peak, args.min_run_time, counted, achievable)
    print(result)
    state = result.machine or machine_state(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    print(target_line(result.mfu, peak.source, name, state))
    return 0 if counted == by_hand else 1


if __name__ == "__main__":
    raise SystemExit(main())
