"""Chapter 1 benchmark: the matmul size sweep, and the helper checked against an independent timer.

    .venv/bin/python benchmarks/ch01_matmul.py            # the device pick_device() chooses
    .venv/bin/python benchmarks/ch01_matmul.py --device cpu --rounds 7

1. Prints the chapter's sweep table (fp32 and bf16) on the device, and the CPU-vs-GPU speed-up
   when the device is an accelerator, with its verdict (``helpers.matmul.speedup_verdict``:
   CPU rows whose time stays flat while n grows are not counted, and the ratio is relative
   to this CPU's threads and load, printed beside it).
2. Compares the GFLOP/s that ``helpers.matmul`` reports for a 1024 x 1024 fp32 matmul with a
   plain ``torch.utils.benchmark.Timer`` measurement that uses all threads
   (``num_threads=torch.get_num_threads()``; the Timer's own default is one thread). The two
   are taken in alternating rounds, so a busy machine slows both alike; the target is that
   their medians agree within 10%.
3. Burst against sweep, per dtype (fp32, TF32 where the GPU has it, bf16) and n: after an idle
   gap (``--idle``, 2 s on a GPU), a short burst (5 warm-ups, then at least 20 calls and 20 ms,
   each call between CUDA events, so the burst has a median and a spread), then the helper's
   sweep (blocks of calls for ``min_run_time``, as chapter 1 runs it). On NVIDIA GPUs a thread
   samples the SM clock and NVML's clock-event reasons (SW power cap, HW slowdown, thermal)
   every 2 ms, keeping only samples taken inside each window. Each row shows the datasheet peak
   rescaled to the clock measured (``helpers.peaks.clock_adjusted_peak``: the datasheet figure
   assumes a boost clock, which the header names). Each pair gets a verdict from
   ``helpers.verdicts.compare_rows``: "too close to call" within the two spreads, and, where
   they differ, whether the clock explains it (the same rate per clock within the spreads).

Version 4. Version 3 called "the two methods disagree" from differences inside the sweep's own
spread, sampled the clock every 5 ms around bursts of under a millisecond (the first sample
taken before the burst began), reported NVML's power, which is averaged over one second on
Ampere and newer (so it described the previous second), and ran each burst straight after the
previous sweep, with the GPU already at its power cap. Version 2 swept the TF32 row's sustained
half as true fp32. When changing how this script measures, bump the version.
"""

from __future__ import annotations

import argparse
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import benchmark as tbench

from helpers.devices import describe_device, native_bf16, pick_device, synchronize
from helpers.machine_state import MachineState, MachineWatch, machine_state
from helpers.matmul import (
    default_size_range,
    matmul_flops,
    run_matmul_sweep,
    run_speedup,
    speedup_verdict,
    tf32_matmuls,
)
from helpers.nvml_snapshot import nvml_handle
from helpers.peaks import clock_adjusted_peak, datasheet_clock_mhz, peak_flops
from helpers.tables import print_table
from helpers.verdicts import Verdict, compare_rows

VERSION = 4
N = 1024
TARGET_PCT = 10.0
#: A burst is at least this many calls and this long, so the clock sampler sees it ~10 times.
BURST_CALLS, BURST_MIN_S = 20, 0.02
#: How often the clock thread samples NVML (an NVML query takes tens of microseconds).
SAMPLE_S = 0.002
#: Idle seconds before each burst on a GPU: longer than NVML's 1 s power-averaging window.
IDLE_S = 2.0
#: NVML's clock-event reason bits (nvml.h, nvmlClocksEventReason*; the same values under the
#: older nvmlClocksThrottleReason* names). 0x1 is "GPU idle".
CLOCK_EVENTS = {
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x20: "SW thermal",
    0x40: "HW thermal",
    0x80: "HW power brake",
}
IDLE_BIT = 0x1


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


def burst_times(
    fn: Callable[[], object],
    device: torch.device,
    warmup: int = 5,
    calls: int = BURST_CALLS,
    min_seconds: float = BURST_MIN_S,
) -> list[float]:
    """Seconds of each call of a short burst: CUDA events between calls on CUDA, a synced clock elsewhere."""
    begin = time.perf_counter()
    for _ in range(warmup):
        fn()
    synchronize(device)
    per_call = (time.perf_counter() - begin) / max(warmup, 1)
    calls = max(calls, min(10_000, math.ceil(min_seconds / max(per_call, 1e-7))))
    if device.type == "cuda":
        with torch.cuda.device(device):  # events on the timed GPU's stream
            events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
            events[0].record()
            for event in events[1:]:
                fn()
                event.record()
            events[-1].synchronize()
        return [s.elapsed_time(e) / 1e3 for s, e in zip(events, events[1:])]
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


@dataclass
class ClockReading:
    """The SM clock and the clock-event reasons NVML reported inside one timed window."""

    samples: int = 0
    clock_mhz: float | None = None
    #: reason name -> share of the window's samples with that bit set
    events: dict[str, float] = field(default_factory=dict)
    window_s: float = 0.0
    note: str = "n/a"

    def events_text(self) -> str:
        """'SW power cap 100%', 'none', or why there is no reading."""
        if not self.samples:
            return self.note
        if not self.events:
            return self.note or "none"
        return ", ".join(f"{name} {share:.0%}" for name, share in self.events.items())


class ClockWatch:
    """SM clock (MHz) and clock-event reasons of one NVIDIA GPU, sampled every SAMPLE_S in a thread."""

    def __init__(self, device: torch.device) -> None:
        self.samples: list[tuple[float, float | None, int | None]] = []
        self._stop = threading.Event()
        self._handle, self._nvml, self._reasons = None, None, None
        self.power_limit_w: float | None = None
        if device.type != "cuda" or torch.version.hip:
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = nvml_handle(pynvml, device)
            self._nvml = pynvml
        except Exception:  # no driver library, or NVML refuses: no clock readings
            self._handle = None
            return
        # nvidia-ml-py 12.535+ names it ...ClocksEventReasons; older ones ...ClocksThrottleReasons
        self._reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        try:
            self.power_limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(self._handle) / 1e3
        except Exception:  # not supported on this board
            self.power_limit_w = None

    @property
    def available(self) -> bool:
        """Whether NVML answers for this GPU."""
        return self._handle is not None

    def sample(self) -> tuple[float, float | None, int | None]:
        """(host time, SM clock MHz, reason bits) now; None for a reading NVML refuses."""
        nv, now = self._nvml, time.perf_counter()
        try:
            clock = float(nv.nvmlDeviceGetClockInfo(self._handle, nv.NVML_CLOCK_SM))
        except Exception:  # NotSupported on some vGPUs
            clock = None
        try:
            reasons = int(self._reasons(self._handle)) if self._reasons else None
        except Exception:  # NotSupported on some boards and vGPUs
            reasons = None
        return now, clock, reasons

    def close(self) -> None:
        """Let NVML go (nvmlInit counts its callers)."""
        if self._nvml is not None:
            self._nvml.nvmlShutdown()
            self._nvml, self._handle = None, None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(SAMPLE_S)

    def measure(self, fn: Callable[[], Any]) -> tuple[Any, ClockReading]:
        """fn()'s result, and the clock readings taken while it ran (samples outside it dropped)."""
        if not self.available:
            return fn(), ClockReading(note="n/a (no NVML here)")
        self.samples, self._stop = [], threading.Event()
        thread = threading.Thread(target=self._loop, daemon=True)
        thread.start()
        begin = time.perf_counter()
        try:
            result = fn()
        finally:
            end = time.perf_counter()
            self._stop.set()
            thread.join()
        return result, summarize([s for s in self.samples if begin <= s[0] <= end], end - begin)

    def idle(self, seconds: float) -> ClockReading:
        """Sleep `seconds` (the GPU idles), then one reading: the state a burst starts from."""
        time.sleep(seconds)
        if not self.available:
            return ClockReading(note="n/a (no NVML here)")
        return summarize([self.sample()], 0.0)


def summarize(
    samples: list[tuple[float, float | None, int | None]], window_s: float
) -> ClockReading:
    """Median clock and the share of samples with each clock-event reason set."""
    if not samples:
        return ClockReading(window_s=window_s, note=f"no sample in {window_s * 1e3:.1f} ms")
    clocks = [c for _, c, _ in samples if c is not None]
    clock = statistics.median(clocks) if clocks else None
    bits = [r for _, _, r in samples if r is not None]
    events = {}
    for bit, name in CLOCK_EVENTS.items():
        share = sum(1 for r in bits if r & bit) / len(bits) if bits else 0.0
        if share:
            events[name] = share
    if bits and all(r & IDLE_BIT for r in bits):
        events["GPU idle"] = 1.0
    note = "" if bits else "reasons not readable"
    return ClockReading(len(samples), clock, events, window_s, note)


def burst_dtypes(device: torch.device) -> list[tuple[str, str, bool]]:
    """(label, dtype, tf32) rows to compare on `device`: TF32 only on CUDA GPUs that have it."""
    rows = [("fp32", "fp32", False)]
    if device.type == "cuda" and not torch.version.hip:
        if torch.cuda.get_device_capability(device) >= (8, 0):
            rows.append(("tf32", "fp32", True))
    if native_bf16(device):
        rows.append(("bf16", "bf16", False))
    return rows


def method_row(
    label: str, n: int, method: str, gflops: float, spread: float, clock: ClockReading, name: str
) -> dict[str, Any]:
    """One method's row: rate, spread, clock, and the share of the datasheet and clock-adjusted peaks."""
    peak = peak_flops(name, label) if name else None
    adjusted = clock_adjusted_peak(name, label, clock.clock_mhz) if name else None
    return {
        "dtype": label,
        "n": n,
        "method": method,
        "GFLOP/s": gflops,
        "IQR (GFLOP/s)": gflops * spread,
        "SM MHz": "n/a" if clock.clock_mhz is None else round(clock.clock_mhz),
        "clock events": clock.events_text(),
        "% of datasheet": "n/a" if peak is None else 100 * gflops * 1e9 / peak,
        "peak at this clock (GFLOP/s)": "n/a" if adjusted is None else adjusted / 1e9,
        "% at this clock": "n/a" if adjusted is None else 100 * gflops * 1e9 / adjusted,
    }


@dataclass
class BurstPair:
    """One (dtype, n): its two table rows, the clock readings behind them, and the machine's state."""

    rows: list[dict[str, Any]]
    start: ClockReading  # read at the end of the idle gap, as the burst began
    readings: list[ClockReading]  # burst, sweep
    machine: MachineState | None


def burst_pair(
    label: str, dtype: str, n: int, device: torch.device, watch: ClockWatch, idle_s: float
) -> BurstPair:
    """After an idle gap: an independent burst, then the helper's sweep; their two rows (long form)."""
    torch_dtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    a = torch.randn(n, n, device=device, dtype=torch_dtype)
    b = torch.randn(n, n, device=device, dtype=torch_dtype)
    flops = matmul_flops(n, n, n)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    start = watch.idle(idle_s)
    with MachineWatch(device) as machine:
        times, burst_clock = watch.measure(lambda: burst_times(lambda: a @ b, device))

        def sweep() -> tuple[float, float]:  # by label: "tf32" sweeps TF32 matmuls
            rows = run_matmul_sweep([n], label, device, max_call_seconds=60.0, progress=False).rows
            return (rows[0]["GFLOP/s"], rows[0]["IQR (%)"] / 100) if rows else (math.nan, 0.0)

        (swept, sweep_spread), sweep_clock = watch.measure(sweep)
    median = statistics.median(times)
    q = statistics.quantiles(times, n=4) if len(times) > 1 else [median, median, median]
    burst = flops / median / 1e9
    rows = [
        method_row(label, n, "burst", burst, (q[2] - q[0]) / median, burst_clock, name),
        method_row(label, n, "sweep", swept, sweep_spread, sweep_clock, name),
    ]
    return BurstPair(rows, start, [burst_clock, sweep_clock], machine.state)


def burst_vs_sweep(
    device: torch.device, sizes: list[int], idle_s: float, watch: ClockWatch
) -> list[BurstPair]:
    """Every burst_pair for this device's dtypes and `sizes`, TF32 switched on only for its rows."""
    pairs = []
    for label, dtype, tf32 in burst_dtypes(device):
        with tf32_matmuls(tf32):
            pairs += [burst_pair(label, dtype, n, device, watch, idle_s) for n in sizes]
    return pairs


def pair_verdict(pair: list[dict[str, Any]], machine: MachineState | None) -> Verdict:
    """compare_rows over one (dtype, n): the burst row against the sweep row, beyond their spreads."""
    return compare_rows(
        pair,
        "method",
        "burst",
        "sweep",
        "GFLOP/s",
        iqr="IQR (GFLOP/s)",
        higher_is_better=True,
        machine=machine,
    )


def clock_explains(pair: list[dict[str, Any]]) -> str:
    """Whether the two rows' rates per clock agree within their spreads (the clock explains the gap)."""
    if any(r["% at this clock"] == "n/a" for r in pair):
        if any(r["SM MHz"] == "n/a" for r in pair):
            return "no clock readings here"
        return f"clock: burst {pair[0]['SM MHz']} MHz, sweep {pair[1]['SM MHz']} MHz"
    per_clock = [
        {
            "method": r["method"],
            "% at this clock": r["% at this clock"],
            "IQR": r["% at this clock"] * r["IQR (GFLOP/s)"] / r["GFLOP/s"],
        }
        for r in pair
    ]
    same = compare_rows(
        per_clock, "method", "burst", "sweep", "% at this clock", iqr="IQR", higher_is_better=True
    )  # ratio = burst / sweep per clock, the direction of pair_verdict's burst-vs-sweep ratio
    clocks = f"burst {pair[0]['SM MHz']} MHz, sweep {pair[1]['SM MHz']} MHz"
    per = f"burst/sweep per clock {same.ratio:.2f}x"
    if not same.conclusive:
        return f"the clock explains it ({clocks}; {per}, within the spreads)"
    return f"not the clock ({clocks}; {per}): rerun to see whether it repeats"


def burst_verdict(pairs: list[BurstPair]) -> str:
    """One verdict per (dtype, n) from the table's own rows, then a count of what differs and why."""
    lines, beyond, within, busy = [], 0, 0, []
    for pair in pairs:
        head = f"{pair.rows[0]['dtype']} n={pair.rows[0]['n']}"
        if not all(math.isfinite(r["GFLOP/s"]) and r["GFLOP/s"] > 0 for r in pair.rows):
            lines.append(f"{head}: the sweep measured nothing (over its time budget)")
            continue
        verdict = pair_verdict(pair.rows, pair.machine)
        line = f"{head}: {verdict}"
        if abs(verdict.ratio - 1) <= verdict.noise:
            within += 1
        elif not verdict.conclusive:  # beyond the spreads, but the machine was busy
            busy.append(pair.machine.caveat() if pair.machine is not None else "busy")
        else:
            beyond += 1
            line += f"; {clock_explains(pair.rows)}"
        lines.append(line)
    summary = f"{within} pair(s) within their spreads, {beyond} beyond them"
    if busy:
        summary += f", {len(busy)} beyond them on a busy machine, not called ({busy[0]})"
    lines.append(summary + ".")
    return "\n".join(lines)


def clock_summary(pairs: list[BurstPair], watch: ClockWatch) -> str:
    """What the clock readings show: which reasons held the clock, and the state bursts began from."""
    if not watch.available:
        return "no clock readings on this device (NVML reads NVIDIA GPUs only)."
    held: dict[str, list[str]] = {}
    for pair in pairs:
        for row, reading in zip(pair.rows, pair.readings):
            for name in reading.events:
                where = f"{row['dtype']} n={row['n']} {row['method']}"
                held.setdefault(name, []).append(where)
    idle = sum(1 for p in pairs if "GPU idle" in p.start.events)
    windows = 2 * len(pairs)
    lines = [f"at the end of the idle gaps: 'GPU idle' set in {idle} of {len(pairs)}"]
    for name, where in held.items():
        if name != "GPU idle":
            lines.append(f"{name} set during {len(where)} of {windows} windows: {', '.join(where)}")
    if len(lines) == 1:
        lines.append("no clock-event reason (power cap, slowdown, thermal) in any window")
    if watch.power_limit_w is not None:
        lines.append(f"board power limit {watch.power_limit_w:.0f} W (NVML)")
    return "\n".join(lines)


def peak_header(device: torch.device, labels: list[str]) -> str:
    """The datasheet peak of each dtype, the clock it assumes and the FLOPs per clock it implies."""
    if device.type != "cuda":
        return "datasheet peaks: none for this device"
    name, lines = torch.cuda.get_device_name(device), []
    for label in labels:
        peak, clock = peak_flops(name, label), datasheet_clock_mhz(name, label)
        if peak is None:
            lines.append(f"{label}: no datasheet peak for {name}")
        elif clock is None:
            lines.append(
                f"{label}: datasheet {peak / 1e12:g} TFLOP/s; its clock is not in the table"
            )
        else:
            lines.append(
                f"{label}: datasheet {peak / 1e12:g} TFLOP/s at a {clock:.0f} MHz boost clock = "
                f"{peak / (clock * 1e6):,.0f} FLOP per clock; 'peak at this clock' = that x the SM clock read"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda:0, mps ... (default: best)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating comparison rounds")
    parser.add_argument(
        "--idle",
        type=float,
        default=None,
        help=f"idle seconds before each burst (default {IDLE_S:g} on a GPU, 0 on a CPU)",
    )
    args = parser.parse_args()
    device = pick_device(args.device)
    idle_s = args.idle if args.idle is not None else (IDLE_S if device.type == "cuda" else 0.0)
    print(
        f"ch01_matmul benchmark v{VERSION}, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(describe_device(device), end="\n\n")
    print(machine_state(device), end="\n\n")

    for dtype in ("fp32", "bf16"):
        print(
            run_matmul_sweep(
                size_range=default_size_range(device), dtype=dtype, device=device, progress=False
            )
        )
        print()
    if device.type != "cpu":
        speedup = run_speedup(size_range=(64, 4096), device=device, progress=False)
        print(speedup)
        print(speedup_verdict(speedup), end="\n\n")
    else:
        print("speed-up: skipped, the device is the CPU (run on a GPU machine to see it).\n")

    print(f"{N} x {N} fp32 matmul on {device}: helpers.matmul vs torch.utils.benchmark.Timer")
    compare(device, args.rounds)

    sizes = [2048, 4096, 8192] if device.type != "cpu" else [256, 512]
    print(
        f"\nburst vs sweep on {device}: {idle_s:g} s idle, a burst (5 warm-ups, >= {BURST_CALLS} "
        f"calls and {BURST_MIN_S * 1e3:g} ms), then the sweep"
    )
    print(peak_header(device, [label for label, _, _ in burst_dtypes(device)]))
    watch = ClockWatch(device)
    pairs = burst_vs_sweep(device, sizes, idle_s, watch)
    print_table([row for pair in pairs for row in pair.rows])
    print(burst_verdict(pairs))
    print(clock_summary(pairs, watch))
    print(machine_state(device))
    watch.close()


if __name__ == "__main__":
    main()
