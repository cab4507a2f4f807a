"""Checkers for the chapter 6 exercises (profiling) (chapter 6).

Each ``check_*`` takes the learner's function, runs probes that a plausible wrong answer
fails, and prints ✅, ❌ with a hint, or ⏳ for an untouched stub. None of them raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils import benchmark as tbench

from helpers.checks import CheckResult, expect, run_check
from helpers.profiling import ToyAsyncDevice
from helpers.syncs import SyncCounter

KERNEL_S = 0.005  # what one call costs on the toy device once warm
FIRST_CALLS_S = 0.06  # what each of the first calls costs (think: autotuning, a compile)
HICCUP_S = 0.15  # one slow call among the timed ones (think: another process)


class _SlowStartWorkload:
    """fn() queues KERNEL_S of work on a toy async device; the first `slow_calls` queue FIRST_CALLS_S (chapter 6)."""

    def __init__(self, device: ToyAsyncDevice, slow_calls: int, hiccup_at: int | None = None):
        self.device, self.slow_calls, self.hiccup_at, self.calls = device, slow_calls, hiccup_at, 0

    def __call__(self) -> None:
        seconds = FIRST_CALLS_S if self.calls < self.slow_calls else KERNEL_S
        if self.calls == self.hiccup_at:
            seconds = HICCUP_S
        self.calls += 1
        self.device.kernel(seconds)


def _reference_seconds(device: ToyAsyncDevice) -> float:
    """torch.utils.benchmark's median for one warm call plus sync on the toy device (chapter 6)."""
    fn = _SlowStartWorkload(device, slow_calls=0)
    timer = tbench.Timer(
        stmt="fn(); sync()", globals={"fn": fn, "sync": device.synchronize}, num_threads=1
    )
    return timer.blocked_autorange(min_run_time=0.1).median


def _measure_probes(measure: Callable[..., float]) -> None:
    """The probes of check_measure (chapter 6)."""
    with ToyAsyncDevice() as device:
        reference = _reference_seconds(device)
        warmup, repeats = 3, 5
        fn = _SlowStartWorkload(device, slow_calls=warmup, hiccup_at=warmup + 2)
        got = measure(fn, device.synchronize, warmup=warmup, repeats=repeats)
        device.synchronize()
        expect(
            isinstance(got, (int, float)) and not isinstance(got, bool) and math.isfinite(got),
            f"return the median time per call as a float number of seconds, not {got!r}.",
        )
        expect(
            fn.calls >= warmup + repeats,
            f"fn was called {fn.calls} times, but warmup={warmup} and repeats={repeats} need at "
            f"least {warmup + repeats} calls: `warmup` untimed calls, then `repeats` timed ones.",
        )
        ratio = got / reference
        expect(
            not 300 < ratio < 3000,
            f"you returned {got:.4g}, about 1000x torch.utils.benchmark's {reference:.4g} s: "
            "return seconds, not milliseconds.",
        )
        expect(
            ratio > 0.3,
            f"you measured {got * 1e3:.3g} ms per call, but the work takes "
            f"{reference * 1e3:.3g} ms (torch.utils.benchmark): the clock stopped before the "
            "device finished. Call sync() before you read the clock.",
        )
        expect(
            ratio < 2.0,
            f"you measured {got * 1e3:.3g} ms per call, but a warm call takes "
            f"{reference * 1e3:.3g} ms (torch.utils.benchmark). The first {warmup} calls are "
            "slow on purpose: run `warmup` calls (and sync) before timing, and report the "
            "median of the timed calls, which one slow call (a hiccup) does not move.",
        )
        expect(
            ratio < 1.5,
            f"{got * 1e3:.3g} ms per call is too far from torch.utils.benchmark's "
            f"{reference * 1e3:.3g} ms: time each call with time.perf_counter() and sync().",
        )


def check_measure(measure: Callable[..., float]) -> CheckResult:
    """Exercise 1: warm-up, sync and repeats, compared with torch.utils.benchmark (chapter 6)."""
    return run_check("Exercise 1, a correct benchmark function", lambda: _measure_probes(measure))


def _profile_of(work: Callable[[], None]) -> profile:
    """A CPU profile of one call of work(), wrapped in a record_function label 'outer' (chapter 6)."""
    work()  # warm up, so first-call costs do not decide the answer
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("outer"):
            work()
    return prof


def _matmul_among_small_ops() -> None:
    """One 768x768 matmul and forty small additions (chapter 6)."""
    a, small = torch.randn(768, 768), torch.randn(16)
    a @ a
    for _ in range(40):
        small = small + 1


def _sort_among_small_ops() -> None:
    """One sort of a million numbers, a small matmul and forty small additions (chapter 6)."""
    big, m, small = torch.randn(1_000_000), torch.randn(32, 32), torch.randn(16)
    torch.sort(big)
    m @ m
    for _ in range(40):
        small = small + 1


def check_top_self_op(top_self_op: Callable[[profile], str]) -> CheckResult:
    """Exercise 2: the op with the most self CPU time, read from key_averages (chapter 6)."""

    def probes() -> None:
        for work in (_matmul_among_small_ops, _sort_among_small_ops):
            prof = _profile_of(work)
            averages = prof.key_averages()
            expected = max(averages, key=lambda e: e.self_cpu_time_total).key
            by_total = max(averages, key=lambda e: e.cpu_time_total).key
            got = top_self_op(prof)
            expect(
                isinstance(got, str),
                f"return the op's name as a string (the row's .key), not {type(got).__name__}.",
            )
            expect(
                got != by_total or got == expected,
                f"you returned {got!r}, the row with the largest TOTAL time: it includes its "
                "children. Sort by self time (self_cpu_time_total) to find the op doing the work.",
            )
            expect(
                got == expected,
                f"the op with the most self CPU time in this profile is {expected!r}, you "
                f"returned {got!r}. Use prof.key_averages() and each row's self_cpu_time_total.",
            )

    return run_check("Exercise 2, name the top op of a profile", probes)


def _regression_data(seed: int = 0) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """A small linear model and 512 samples of a noisy linear task (chapter 6)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 8, generator=g)
    y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(512, 1, generator=g)
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)), x, y


def _reference_slow_train(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 32, lr: float = 0.05
) -> list[float]:
    """The exercise's slow loop: one .item() per step (chapter 6)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for i in range(0, len(x), batch_size):
        loss = F.mse_loss(model(x[i : i + batch_size]), y[i : i + batch_size])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def check_fast_train(fast_train: Callable[..., list[float]]) -> CheckResult:
    """Exercise 3: the same per-step losses and parameters as the slow loop, with one sync (chapter 6)."""

    def probes() -> None:
        slow_model, x, y = _regression_data()
        with SyncCounter() as slow_syncs:
            expected = _reference_slow_train(slow_model, x, y)
        model, _, _ = _regression_data()
        with SyncCounter() as syncs:
            got = fast_train(model, x, y)
        expect(
            isinstance(got, list) and all(isinstance(v, float) for v in got),
            f"return the per-step losses as a list of Python floats, got {type(got).__name__}. "
            "Collect the detached losses on the device, then convert once at the end.",
        )
        expect(
            len(got) == len(expected),
            f"return one loss per step: {len(expected)} steps, you returned {len(got)} values.",
        )
        expect(
            torch.allclose(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=1e-7),
            "your losses differ from the slow loop's: keep the same batches, order and optimizer.",
        )
        same_params = all(
            torch.allclose(a, b, rtol=0, atol=1e-6)
            for a, b in zip(model.parameters(), slow_model.parameters())
        )
        expect(
            same_params, "the trained parameters differ from the slow loop's: same math, please."
        )
        expect(
            syncs.count <= 2,
            f"your loop made {syncs.count} host syncs ({dict(syncs.by_kind())}); the slow one made "
            f"{slow_syncs.count}. Keep losses on the device (loss.detach()) and read them once "
            "at the end, e.g. torch.stack(losses).tolist().",
        )

    return run_check("Exercise 3, remove the per-step sync", probes)


def _linear_step_and_flops() -> tuple[Callable[[], None], int]:
    """A Linear(256, 128) forward + backward at batch 64, and its exact FLOPs (chapter 6)."""
    layer, x = nn.Linear(256, 128), torch.randn(64, 256)

    def step() -> None:
        layer(x).square().mean().backward()

    # forward 2*B*in*out, weight gradient 2*B*in*out; x needs no gradient
    return step, 4 * 64 * 256 * 128


def check_step_mfu(step_mfu: Callable[[Callable[[], object], float, float], float]) -> CheckResult:
    """Exercise 4: MFU from FlopCounterMode's count, the step time and the peak (chapter 6)."""

    def probes() -> None:
        step, flops = _linear_step_and_flops()
        seconds, peak = 2e-4, 1e11
        expected = flops / seconds / peak
        got = step_mfu(step, seconds, peak)
        expect(
            isinstance(got, float) and math.isfinite(got),
            f"return the MFU as a float fraction, got {got!r}.",
        )
        expect(
            not math.isclose(got, 100 * expected, rel_tol=1e-3),
            f"you returned {got:.4g}, a percentage: return the fraction ({expected:.4g}).",
        )
        expect(
            not math.isclose(got, 1.5 * expected, rel_tol=0.01),
            "that is the '6 x batch x parameters' rule of thumb; count instead with "
            "FlopCounterMode: this step computes no gradient for its input.",
        )
        expect(
            math.isclose(got, expected, rel_tol=1e-3),
            f"expected {expected:.4g} (= {flops:,} FLOPs / {seconds} s / {peak:.0e} FLOP/s), "
            f"got {got:.4g}. Count one call's FLOPs with FlopCounterMode(display=False).",
        )
        for bad_seconds in (0.0, -1e-3):
            try:
                step_mfu(step, bad_seconds, peak)
            except ValueError:
                continue
            expect(False, f"seconds={bad_seconds} must raise ValueError: a step cannot take that.")
        try:
            step_mfu(step, seconds, 0.0)
        except ValueError:
            return
        expect(False, "peak=0 must raise ValueError: there is no MFU against a zero peak.")

    return run_check("Exercise 4, MFU of a step", probes)
