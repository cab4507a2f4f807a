"""Chapter 1 benchmark: the matmul size sweep, and the helper checked against an independent timer.

    .venv/bin/python benchmarks/ch01_matmul.py            # the device pick_device() chooses
    .venv/bin/python benchmarks/ch01_matmul.py --device cpu --rounds 7

1. Prints the chapter's sweep table (fp32 and bf16) on the device, and the CPU-vs-GPU speed-up
   when the device is an accelerator.
2. Compares the GFLOP/s that ``helpers.matmul`` reports for a 1024 x 1024 fp32 matmul with a
   plain ``torch.utils.benchmark.Timer`` measurement that uses all threads
   (``num_threads=torch.get_num_threads()``; the Timer's own default is one thread). The two
   are taken in alternating rounds, so a busy machine slows both alike; the target is that
   their medians agree within 10%.
3. Burst against sustained, per dtype (fp32, TF32 where the GPU has it, bf16) and n: the
   helper's sweep (blocks of calls for ``min_run_time``, as chapter 1 runs it) against an
   independent short burst (5 warm-ups, then 20 calls between two CUDA events: the method of
   shared/gpu-runs' anchor_probe.py and of MAMF finders). On NVIDIA GPUs a background thread
   reads the SM clock and the board power through NVML during each, so a gap between the two
   shows its cause: a clock that drops under long tensor-core load (power or thermal
   capping) lowers the sustained figure, not the short burst. On the H100 run of 2026-11-23 the
   sweep read bf16 11-13% below the burst while fp32 agreed within 1%.

Version 3 (2 swept the TF32 row's sustained half as true fp32, so on an H100 it would have
read about 87% below its burst; it also read the clock of NVML's GPU 0, whatever
CUDA_VISIBLE_DEVICES said). When changing how this script measures, bump the version.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

import torch
from torch.utils import benchmark as tbench

from helpers.devices import describe_device, native_bf16, pick_device, synchronize
from helpers.matmul import (
    default_size_range,
    matmul_flops,
    run_matmul_sweep,
    run_speedup,
    tf32_matmuls,
)
from helpers.nvml_snapshot import nvml_handle
from helpers.tables import print_table

VERSION = 3
N = 1024
TARGET_PCT = 10.0
BURST_TARGET_PCT = 3.0


def helper_gflops(n: int, device: torch.device) -> float:
    """GFLOP/s of one n x n fp32 matmul as helpers.matmul measures it."""
    sweep = run_matmul_sweep(
        [n], "fp32", device, min_run_time=1.0, max_call_seconds=60.0, progress=False
    )
    if not sweep.rows:
        raise SystemExit(f"the helper measured nothing: {sweep}")
    return sweep.rows[0]["GFLOP/s"]


def timer_gflops(n: int, device: torch.device) -> float:
    """GFLOP/s of the same matmul from torch.utils.benchmark.Timer alone, on all threads."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    timer = tbench.Timer(
        stmt="torch.matmul(a, b)",
        globals={"torch": torch, "a": a, "b": b},
        num_threads=torch.get_num_threads(),
    )
    m = timer.blocked_autorange(min_run_time=1.0)  # the Timer syncs an accelerator itself
    return matmul_flops(n, n, n) / m.median / 1e9


def compare(device: torch.device, rounds: int) -> float:
    """Alternate helper and Timer measurements; print both and return the % difference."""
    ours, theirs = [], []
    for i in range(rounds):
        ours.append(helper_gflops(N, device))
        theirs.append(timer_gflops(N, device))
        print(f"  round {i + 1}: helper {ours[-1]:8.1f}  Timer {theirs[-1]:8.1f} GFLOP/s")
    h, t = statistics.median(ours), statistics.median(theirs)
    diff = 100 * (h - t) / t
    verdict = "within" if abs(diff) <= TARGET_PCT else "OUTSIDE"
    print(
        f"median over {rounds} rounds: helper {h:.1f} GFLOP/s, independent Timer {t:.1f} GFLOP/s, "
        f"difference {diff:+.1f}% ({verdict} the {TARGET_PCT:g}% target)"
    )
    return diff


def burst_seconds(
    fn: Callable[[], object], device: torch.device, warmup: int = 5, calls: int = 20
) -> float:
    """Seconds per call of a short burst: CUDA events on CUDA, a synced clock elsewhere."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    if device.type == "cuda":
        with torch.cuda.device(device):  # events on the timed GPU's stream
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls
    begin = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - begin) / calls


class ClockWatch:
    """SM clock (MHz) and board power (W) of one NVIDIA GPU, sampled every 5 ms in a thread."""

    def __init__(self, device: torch.device) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._handle, self._nvml = None, None
        if device.type != "cuda" or torch.version.hip:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = nvml_handle(pynvml, device)
            self._nvml = pynvml
        except Exception:  # no driver library, or NVML refuses: no clock readings
            self._handle = None

    def _loop(self) -> None:
        nv = self._nvml
        while not self._stop.is_set():
            clock = nv.nvmlDeviceGetClockInfo(self._handle, nv.NVML_CLOCK_SM)
            watts = nv.nvmlDeviceGetPowerUsage(self._handle) / 1e3
            self.samples.append((float(clock), watts))
            self._stop.wait(0.005)

    def measure(self, fn: Callable[[], float]) -> tuple[float, str]:
        """fn()'s result, and 'median clock MHz / median power W' while it ran (or 'n/a')."""
        if self._handle is None:
            return fn(), "n/a"
        self.samples, self._stop = [], threading.Event()
        thread = threading.Thread(target=self._loop, daemon=True)
        thread.start()
        try:
            result = fn()
        finally:
            self._stop.set()
            thread.join()
        if not self.samples:
            return result, "n/a"
        clock = statistics.median(c for c, _ in self.samples)
        watts = statistics.median(w for _, w in self.samples)
        return result, f"{clock:.0f} MHz / {watts:.0f} W"


def burst_dtypes(device: torch.device) -> list[tuple[str, str, bool]]:
    """(label, dtype, tf32) rows to compare on `device`: TF32 only on CUDA GPUs that have it."""
    rows = [("fp32", "fp32", False)]
    if device.type == "cuda" and not torch.version.hip:
        if torch.cuda.get_device_capability(device) >= (8, 0):
            rows.append(("tf32", "fp32", True))
    if native_bf16(device):
        rows.append(("bf16", "bf16", False))
    return rows


def burst_row(label: str, dtype: str, n: int, device: torch.device, watch: ClockWatch) -> dict:
    """The helper's sustained GFLOP/s and an independent burst's, with clock readings."""
    torch_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=torch_dtype)
    b = torch.randn(n, n, device=device, dtype=torch_dtype)
    flops = matmul_flops(n, n, n)
    burst, burst_clock = watch.measure(lambda: flops / burst_seconds(lambda: a @ b, device))

    def sweep() -> float:  # by label: "tf32" sweeps TF32 matmuls; "fp32" would turn TF32 off
        rows = run_matmul_sweep([n], label, device, max_call_seconds=60.0, progress=False).rows
        return rows[0]["GFLOP/s"] * 1e9 if rows else float("nan")

    helper, helper_clock = watch.measure(sweep)
    diff = 100 * (helper - burst) / burst
    return {
        "dtype": label,
        "n": n,
        "burst GFLOP/s": burst / 1e9,
        "burst clock / power": burst_clock,
        "sweep GFLOP/s": helper / 1e9,
        "sweep clock / power": helper_clock,
        "sweep vs burst (%)": diff,
    }


def burst_vs_sustained(device: torch.device, sizes: list[int]) -> list[dict]:
    """Every burst_row for this device's dtypes and `sizes`, TF32 switched on only for its row."""
    watch, rows = ClockWatch(device), []
    for label, dtype, tf32 in burst_dtypes(device):
        with tf32_matmuls(tf32):
            rows += [burst_row(label, dtype, n, device, watch) for n in sizes]
    return rows


def burst_verdict(rows: list[dict]) -> str:
    """One line: do the sweep and the burst agree within BURST_TARGET_PCT, and where not."""
    off = [r for r in rows if not abs(r["sweep vs burst (%)"]) <= BURST_TARGET_PCT]
    if not off:
        return f"the sweep agrees with the burst within {BURST_TARGET_PCT:g}% at every row"
    worst = max(off, key=lambda r: abs(r["sweep vs burst (%)"]))
    line = (
        f"{len(off)} of {len(rows)} rows differ by more than {BURST_TARGET_PCT:g}%; the worst is "
        f"{worst['dtype']} n={worst['n']}: {worst['sweep vs burst (%)']:+.1f}%"
    )
    if worst["sweep clock / power"] == "n/a":
        return line + " (no clock readings here: a busy machine moves both; re-run to decide)."
    return line + (
        f" (clock / power: burst {worst['burst clock / power']}, sweep "
        f"{worst['sweep clock / power']}). A lower clock during the sweep means the GPU capped "
        "its clock under sustained load; the same clock means the two methods disagree."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda:0, mps ... (default: best)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating comparison rounds")
    args = parser.parse_args()
    device = pick_device(args.device)
    print(
        f"ch01_matmul benchmark v{VERSION}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(describe_device(device), end="\n\n")

    for dtype in ("fp32", "bf16"):
        print(
            run_matmul_sweep(
                size_range=default_size_range(device), dtype=dtype, device=device, progress=False
            )
        )
        print()
    if device.type != "cpu":
        print(run_speedup(size_range=(64, 4096), device=device, progress=False), end="\n\n")
    else:
        print("speed-up: skipped, the device is the CPU (run on a GPU machine to see it).\n")

    print(f"{N} x {N} fp32 matmul on {device}: helpers.matmul vs torch.utils.benchmark.Timer")
    compare(device, args.rounds)

    sizes = [2048, 4096, 8192] if device.type != "cpu" else [256, 512]
    print(f"\nburst vs sustained on {device}: short burst (5 warm-ups, 20 calls) vs the sweep")
    rows = burst_vs_sustained(device, sizes)
    print_table(rows)
    print(burst_verdict(rows))


if __name__ == "__main__":
    main()
