"""Chapter 7 benchmark: the capstone GPT, baseline vs the levers kept one by one, same math.

    python benchmarks/ch07_capstone.py                       # the device pick_device() chooses
    python benchmarks/ch07_capstone.py --device cpu --rounds 1 --min-run-time 0.1
    python benchmarks/ch07_capstone.py --no-compile          # leave torch.compile out
    python benchmarks/ch07_capstone.py --threads 1           # a shared CPU: 2 threads can stall

The model is helpers.gpt's byte-level GPT on the standard library's help() text, at the sizes
helpers.capstone.capstone_sizes picks for the device (2 x 64 channels, 256 tokens, batch 4 on a
CPU; a GPT-2-small-like 12 x 768, 1024 tokens, batch 16 on a 32 GiB+ GPU); --batch-size and
--seq-len override them. One timed call is one log interval of Trainer.run() (4 optimizer
steps); every configuration trains from the same initial weights on the same batches.

1. Same math first: each lever alone (resident data, SDPA, fused AdamW, activation
   checkpointing) trains two intervals whose losses must equal the baseline's to float
   tolerance (helpers.capstone.same_losses, rtol = atol = 1e-4). AMP and TF32 change the
   rounding on purpose: their largest loss difference is printed, not checked.
2. The levers are chosen greedily, as the chapter does: the baseline, then resident, sdpa,
   fused_adamw, amp, tf32 and compile, each added to the best configuration so far and kept
   only if helpers.capstone.keep_verdict says it is faster by more than the noise. A lever
   this device lacks is skipped with lever_available's reason; one that raises (torch.compile
   without a C++ compiler, a missing kernel) is dropped with run_or_reason's message. Each
   trial's first interval is also checked against the baseline's (compiled: rtol = atol =
   1e-3; with amp or tf32: the difference is printed only). Each row is measured with
   helpers.capstone.measure_trainer (helpers.timing.benchmark after one timed first call,
   which for compile is the compile time).
3. Baseline and final configuration are then timed again in --rounds interleaved rounds
   (baseline, final, baseline, final, ...: a burst of load on a shared machine hits both),
   each timing with helpers.timing.benchmark. The last line is the median over the rounds
   of each round's ratio final tokens/s / baseline tokens/s.

MFU columns: FLOPs per token from helpers.gpt.flops_per_token (6N + 12 L T d) against the
datasheet peak of helpers.mfu.reference_peak(device, mfu_precision(device)) (bf16 on a GPU with
bf16 units; n/a where no datasheet knows the device, e.g. a CPU) and against
helpers.mfu.achievable_peak (the best matmul measured here in that dtype).

Speed targets (chapter 7 issue 18): on the course's 2-core CPU the final configuration runs at
least 1.3x the baseline's tokens/s with the same math; on an H100 at least 10x the baseline
and at least 40% MFU against the bf16 datasheet peak. They are printed, never asserted:
timings are noisy. The exit status is 1 only when a same-math lever changed the losses.

Version 1. When changing how this script measures, bump the version.
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import dataclass, field, replace
from functools import partial

import torch

from helpers.capstone import (
    Levers,
    LeverSearch,
    Trainer,
    capstone_sizes,
    lever_available,
    measure_trainer,
    percent,
    run_or_reason,
    same_losses,
)
from helpers.devices import cpu_name, describe_device, pick_device
from helpers.gpt import GPTConfig, flops_per_token, non_embedding_params, text_bytes
from helpers.mfu import Peak, achievable_peak, mfu_precision, reference_peak
from helpers.tables import print_table
from helpers.timing import benchmark

VERSION = 1
TARGET_CPU, TARGET_H100, TARGET_H100_MFU = 1.3, 10.0, 0.40
#: The greedy order of the chapter; checkpointing saves memory, not time, so it is only checked.
GREEDY = ("resident", "sdpa", "fused_adamw", "amp", "tf32", "compile")
SAME_MATH = ("resident", "sdpa", "fused_adamw", "checkpoint")
ROUNDING = ("amp", "tf32")  # levers that change the rounding on purpose
TOLERANCE = {"eager": 1e-4, "compiled": 1e-3}  # rtol = atol for the loss checks
CHECK_INTERVALS = 2


@dataclass
class Setup:
    """What every trainer of one benchmark run shares: config, batch, data, device."""

    cfg: GPTConfig
    batch_size: int
    tokens: torch.Tensor
    device: torch.device

    def trainer(self, levers: Levers) -> Trainer:
        """A fresh Trainer with these levers, from the same seed and on the same batches."""
        return Trainer(
            self.cfg, levers, self.tokens, device=self.device, batch_size=self.batch_size
        )


@dataclass
class Choice:
    """The greedy choice: the search (its rows), the levers left out, and the two trainers kept."""

    search: LeverSearch
    baseline: Trainer
    final: Trainer
    left_out: list[str] = field(default_factory=list)
    gaps: dict[str, str] = field(default_factory=dict)
    math_broken: list[str] = field(default_factory=list)


def loss_check(losses: list[float], base: list[float], levers: Levers) -> tuple[float, str, bool]:
    """(largest loss gap, what it means, same math held?) of one configuration vs the baseline."""
    gap = max(abs(a - b) for a, b in zip(losses, base, strict=True))
    changed = [name for name in levers.on() if name in ROUNDING]
    if changed:
        return gap, f"rounding changed by {' + '.join(changed)} (not checked)", True
    tol = TOLERANCE["compiled" if levers.compile else "eager"]
    try:
        same_losses(losses, base, rtol=tol, atol=tol)
    except AssertionError:
        return gap, f"DIFFERENT from the baseline's (tolerance {tol:g})", False
    return gap, f"same math (tolerance {tol:g})", True


def check_same_math(
    setup: Setup, names: tuple[str, ...] = SAME_MATH + ROUNDING
) -> list[dict[str, str]]:
    """Each lever alone vs the baseline over CHECK_INTERVALS intervals: the same-math table."""

    def train(trainer: Trainer) -> list[float]:
        return [x for _ in range(CHECK_INTERVALS) for x in trainer.run()]

    base_losses = train(setup.trainer(Levers()))
    rows = []
    for name in names:
        ok, why = lever_available(name, setup.device)
        if not ok:
            rows.append({"lever": name, "largest loss gap": "n/a", "losses": f"skipped: {why}"})
            continue
        levers = Levers().plus(name)
        losses, failure = run_or_reason(lambda levers=levers: train(setup.trainer(levers)))
        if losses is None:
            rows.append({"lever": name, "largest loss gap": "n/a", "losses": f"failed: {failure}"})
            continue
        gap, verdict, _ = loss_check(losses, base_losses, levers)
        rows.append({"lever": name, "largest loss gap": f"{gap:.1e}", "losses": verdict})
    return rows


def choose_levers(
    setup: Setup,
    *,
    fpt: float,
    peak: float | None,
    achievable: float | None,
    min_run_time: float,
    leave_out: dict[str, str] | None = None,
) -> Choice:
    """The chapter's greedy choice (helpers.capstone.LeverSearch), each trial's losses checked too."""
    leave_out = leave_out or {}
    trainers: dict[Levers, Trainer] = {}

    def make(levers: Levers) -> Trainer:
        trainers[levers] = setup.trainer(levers)
        return trainers[levers]

    measure = partial(
        measure_trainer,
        flops_per_token=fpt,
        peak_flops=peak,
        achievable_flops=achievable,
        min_run_time=min_run_time,
    )
    search = LeverSearch(make, measure)
    base_losses = search.rows[0].first_losses
    gaps, broken, left_out = {search.rows[0].label: "0 (itself)"}, [], []
    for name in GREEDY:
        if name in leave_out:
            print(f"{name}: {leave_out[name]}")
            left_out.append(name)
            continue
        levers = search.current.plus(name)
        row = search.try_lever(name)
        if row is not None:
            gap, verdict, same = loss_check(row.first_losses, base_losses, levers)
            gaps[row.label] = f"{gap:.1e}"
            if not same:
                print(f"  {row.label}: first-interval losses {verdict}")
                broken.append(row.label)
        for old in [lv for lv in trainers if lv not in (Levers(), search.current)]:
            del trainers[old]  # only the baseline and the best so far stay in memory
    return Choice(search, trainers[Levers()], trainers[search.current], left_out, gaps, broken)


def interleaved(
    baseline: Trainer, final: Trainer, rounds: int, min_run_time: float
) -> tuple[list[float], list[float]]:
    """Seconds per step of baseline and final, alternating, one timing of each per round."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(rounds):
        for trainer, out in zip((baseline, final), times, strict=True):
            r = benchmark(
                trainer.run, device=trainer.device, warmup=1,
                min_run_time=min_run_time, min_repeats=3,
            )  # fmt: skip
            out.append(r.median / trainer.interval)
    return times


def peaks(device: torch.device) -> tuple[Peak | None, Peak]:
    """(the datasheet peak, or None where no datasheet knows the device; the achievable peak)."""
    dtype = mfu_precision(device)
    reference = reference_peak(device, dtype)
    if reference.measured:  # no datasheet: reference_peak measured the achievable rate
        return None, reference
    return reference, achievable_peak(device, dtype)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options; --rounds and --min-run-time checked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps (default: best)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument(
        "--min-run-time", type=float, default=0.5, help="seconds per timing (default 0.5)"
    )
    parser.add_argument("--batch-size", type=int, default=None, help="override the batch size")
    parser.add_argument("--seq-len", type=int, default=None, help="override the sequence length")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads for torch (default: torch's)"
    )
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.min_run_time <= 0 or (args.threads is not None and args.threads < 1):
        parser.error("--rounds and --threads must be >= 1 and --min-run-time > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Same math, the greedy lever table, interleaved rounds, then the final ratio."""
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    device = pick_device(args.device)
    cfg, batch_size = capstone_sizes(device)
    cfg = replace(cfg, seq_len=args.seq_len or cfg.seq_len)
    setup = Setup(cfg, args.batch_size or batch_size, text_bytes(), device)

    print(f"chapter 7 benchmark v{VERSION}: the capstone GPT, baseline vs the levers kept")
    print(f"torch {torch.__version__}; CPU {cpu_name()}; {torch.get_num_threads()} threads")
    print(describe_device(device))
    probe = setup.trainer(Levers())
    fpt = flops_per_token(probe.model)
    print(
        f"GPT: {cfg.n_layer} layers x {cfg.d_model} channels, {cfg.n_head} heads, "
        f"{cfg.seq_len} tokens, batch {setup.batch_size} ({probe.tokens_per_step:,} tokens per "
        f"step), {non_embedding_params(probe.model) / 1e6:.2f} M parameters, "
        f"{fpt / 1e6:.2f} MFLOP per token (6N + 12 L T d); one timing call = "
        f"{probe.interval} steps; {len(setup.tokens):,} tokens of text"
    )
    del probe
    datasheet, achievable = peaks(device)
    print(f"MFU reference: {datasheet or 'no datasheet peak for this device'}")
    print(f"achievable reference: {achievable}")

    print(f"\nsame math: each lever alone vs the baseline, {CHECK_INTERVALS} intervals\n")
    same_rows = check_same_math(setup)
    print_table(same_rows)
    broken = [r["lever"] for r in same_rows if r["losses"].startswith("DIFFERENT")]

    print(f"\nthe levers, chosen greedily ({args.min_run_time:g} s of timing per row)\n")
    leave_out = {"compile": "left out (--no-compile)"} if args.no_compile else {}
    choice = choose_levers(
        setup,
        fpt=fpt,
        peak=datasheet.flops if datasheet else None,
        achievable=achievable.flops,
        min_run_time=args.min_run_time,
        leave_out=leave_out,
    )
    broken += choice.math_broken
    rows = choice.search.rows
    table = []
    for row in rows:
        cells = row.as_row()
        cells["first call s"] = f"{row.first_s:.2f}"
        cells["loss gap"] = choice.gaps.get(row.label, "n/a")
        table.append(cells)
    print()
    print_table(table)
    compiled = [r for r in rows if "compile" in r.label.split(" + ")]
    if compiled:
        print(
            f"compile time: the first interval with compile took {compiled[0].first_s:.1f} s "
            f"(the baseline's took {rows[0].first_s:.2f} s)"
        )
    else:
        print("compile time: n/a, compile was not measured here")

    final_levers = choice.search.current
    base_s, final_s = interleaved(choice.baseline, choice.final, args.rounds, args.min_run_time)
    load_end = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    ratios = [b / f for b, f in zip(base_s, final_s, strict=True)]
    print(
        f"\nbaseline vs final ({final_levers.label()}) in {args.rounds} interleaved round(s); "
        f"load average at start / end {load_start:.2f} / {load_end:.2f} on {os.cpu_count()} CPUs\n"
    )
    tokens_per_step = setup.batch_size * cfg.seq_len
    rounds_rows, final_mfu = [], None
    for label, times in (("baseline", base_s), (f"final: {final_levers.label()}", final_s)):
        rate = tokens_per_step / statistics.median(times) * fpt
        final_mfu = rate / datasheet.flops if datasheet else None
        rounds_rows.append(
            {
                "configuration": label,
                "step ms (median)": f"{1e3 * statistics.median(times):.2f}",
                "step ms (best round)": f"{1e3 * min(times):.2f}",
                "tokens/s (median)": f"{tokens_per_step / statistics.median(times):,.0f}",
                "MFU datasheet": percent(final_mfu),
                "MFU achievable": percent(rate / achievable.flops),
            }
        )
    print_table(rounds_rows)
    ratio = statistics.median(ratios)
    print(
        f"\nper-round ratios (baseline step / final step): {', '.join(f'{r:.2f}x' for r in ratios)}"
    )
    rounding = [n for n in final_levers.on() if n in ROUNDING]
    math = f"rounding changed by {' + '.join(rounding)}" if rounding else "same math"
    if device.type == "cpu":
        verdict = "meets" if ratio >= TARGET_CPU else "is BELOW"
        print(f"CPU target: {TARGET_CPU}x with the same math; {ratio:.2f}x {verdict} it ({math})")
    else:
        print(
            f"H100 target: {TARGET_H100}x and {percent(TARGET_H100_MFU)} MFU (bf16 datasheet); here "
            f"{ratio:.2f}x ({'meets' if ratio >= TARGET_H100 else 'BELOW'}) and MFU "
            f"{percent(final_mfu)} ({'meets' if (final_mfu or 0) >= TARGET_H100_MFU else 'BELOW'}), "
            f"{math}"
        )
    if broken:
        print(f"SAME MATH FAILED for: {', '.join(broken)}")
    print(f"final vs baseline (tokens/s, median): {ratio:.2f}x")
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())
