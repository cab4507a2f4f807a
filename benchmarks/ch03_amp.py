"""Chapter 3 benchmark: fp32 vs autocast training steps on this machine.

    .venv/bin/python benchmarks/ch03_amp.py                      # the device pick_device() chooses
    .venv/bin/python benchmarks/ch03_amp.py --device cpu --threads 1 --min-run-time 1
    .venv/bin/python benchmarks/ch03_amp.py --precisions fp32 bf16 fp16 --allow-slow

For each model it prints one table: per precision and batch size, the median time of one Adam
training step (forward, backward, optimizer; fp16 with a GradScaler), its spread, samples/s,
the throughput relative to fp32 at the same batch size, and two memory columns (their meters
are printed under each table): 'peak MiB', the step's peak over what is held between steps
(the allocator's exact peak on CUDA, torch.profiler's memory events on a CPU, sampled on
MPS), and 'saved MiB', the exact bytes autograd saves for backward, on every device.

Models: the sources' 20-64-32-1 MLP (launch-bound: AMP should not help) and a matmul-bound MLP
of `--depth` square layers of `--width` (where AMP can help, given hardware for it).
Precisions the hardware has no fast path for (fp16 on most CPUs, bf16 on a T4 or a CPU without
bf16 instructions) are skipped with the reason, unless --allow-slow.

Under each table: the machine's state while it was timed (other compute processes on the GPU,
CPU time other processes used, torch threads), and at the largest batch one verdict per
precision against fp32 (and the 16-bit dtype against TF32), each built by compare_rows from
the two rows it names: "inconclusive" on a shared GPU or a loaded CPU.

Version 3 (v2 printed a relative spread and no machine state or verdicts; v1's single memory
column counted the previous step's gradients as held before the step). When changing how this
script measures, bump the version.
"""

from __future__ import annotations

import argparse

import torch

from helpers.amp_choice import amp_for_device, local_cpu_flags
from helpers.amp_sweep import AmpSweep, default_batch_sizes, default_width, run_amp_sweep
from helpers.devices import describe_device, pick_device
from helpers.matmul import tf32_available
from helpers.models import wide_mlp_sizes

VERSION = 3
SOURCES_MLP = (20, 64, 32, 1)


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda:0, mps ... (default: best)")
    parser.add_argument(
        "--precisions", nargs="+", default=None, help="default: fp32 + the device's AMP dtype"
    )
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=None)
    parser.add_argument(
        "--width", type=int, default=None, help="wide MLP width (default: by device)"
    )
    parser.add_argument("--depth", type=int, default=4, help="square layers in the wide MLP")
    parser.add_argument("--min-run-time", type=float, default=0.5, help="seconds per measurement")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument(
        "--allow-slow", action="store_true", help="also run emulated/slow precisions"
    )
    parser.add_argument(
        "--skip-small", action="store_true", help="skip the sources' 20-64-32-1 MLP"
    )
    return parser.parse_args()


def main() -> None:
    """Print the device, the AMP choice, and one fp32-vs-AMP table per model."""
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    choice = amp_for_device(device)
    print(
        f"ch03_amp benchmark v{VERSION}, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
    )
    print(describe_device(device))
    if device.type == "cpu":
        print(f"CPU bf16/fp16 flags torch sees: {', '.join(local_cpu_flags()) or 'none'}")
    print(f"AMP choice here: {choice}\n")
    low = choice.name if choice.enabled else ("bf16" if device.type == "cpu" else "fp16")
    # fp32 (TF32 off), TF32 where the GPU has it, and the 16-bit dtype (issue 15)
    precisions = args.precisions or ["fp32", *["tf32"] * tf32_available(device), low]
    allow_slow = args.allow_slow or not choice.enabled  # where AMP is off, show why
    batch_sizes = args.batch_sizes or default_batch_sizes(device)
    models = [] if args.skip_small else [("sources' MLP (launch-bound)", SOURCES_MLP, (64, 256))]
    width = args.width or default_width(device)
    models.append(("wide MLP (matmul-bound)", wide_mlp_sizes(width, args.depth), batch_sizes))
    for title, sizes, batches in models:
        sweep = run_amp_sweep(
            device,
            precisions,
            batches,
            sizes=sizes,
            min_run_time=args.min_run_time,
            allow_slow=allow_slow,
        )
        print(f"== {title}")
        print(sweep)
        for line in verdicts(sweep, low):
            print(line)
        print()


def verdicts(sweep: AmpSweep, low: str) -> list[str]:
    """At the largest batch every precision measured against fp32, and `low` against TF32."""
    if "fp32" not in sweep.results or not sweep.results["fp32"].rows:
        return []
    largest = sweep.results["fp32"].column("batch size")[-1]
    pairs = [(p, "fp32") for p in sweep.results if p != "fp32"] + [(low, "tf32")]
    lines = []
    for a, b in pairs:
        if all(
            p in sweep.results and largest in sweep.results[p].column("batch size") for p in (a, b)
        ):
            lines.append(f"batch {largest}, {a} against {b}: {sweep.verdict(a, b, largest)}")
    return lines


if __name__ == "__main__":
    main()
