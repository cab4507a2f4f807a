"""Checkers for the chapter 6 exercises (profiling) (chapter 6).

Each ``check_*`` takes the learner's function, runs probes that a plausible wrong answer
fails, and prints ✅, ❌ with a hint, or ⏳ for an untouched stub. None of them raises.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils import benchmark as tbench

from helpers.checks import CheckResult, expect, probe, run_check
from helpers.i18n import tr, tr_mark
from helpers.profiling import ToyAsyncDevice
from helpers.syncs import SyncCounter

KERNEL_S = 0.005  # what one call costs on the toy device once warm
FIRST_CALLS_S = 0.06  # what each of the first calls costs (think: autotuning, a compile)
HICCUP_S = 0.15  # one slow call among the timed ones (think: another process)


def _probed(name: str, text: str) -> str:
    """A hint prefixed with the probe it comes from, as probe() writes it (chapter 6)."""
    return tr("[probe: {name}] {text}").format(name=name, text=text)


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
            tr("return the median time per call as a float number of seconds, not {got!r}.").format(
                got=got
            ),
        )
        expect(
            fn.calls >= warmup + repeats,
            tr(
                "fn was called {calls} times, but warmup={warmup} and repeats={repeats} need at "
                "least {total} calls: `warmup` untimed calls, then `repeats` timed ones."
            ).format(calls=fn.calls, warmup=warmup, repeats=repeats, total=warmup + repeats),
        )
        ratio = got / reference
        expect(
            not 300 < ratio < 3000,
            tr(
                "you returned {got:.4g}, about 1000x torch.utils.benchmark's {reference:.4g} s: "
                "return seconds, not milliseconds."
            ).format(got=got, reference=reference),
        )
        expect(
            ratio > 0.3,
            tr(
                "you measured {got_ms:.3g} ms per call, but the work takes {ref_ms:.3g} ms "
                "(torch.utils.benchmark): the clock stopped before the device finished. "
                "Call sync() before you read the clock."
            ).format(got_ms=got * 1e3, ref_ms=reference * 1e3),
        )
        expect(
            ratio < 2.0,
            tr(
                "you measured {got_ms:.3g} ms per call, but a warm call takes {ref_ms:.3g} ms "
                "(torch.utils.benchmark). The first {warmup} calls are slow on purpose: run "
                "`warmup` calls (and sync) before timing, and report the median of the timed "
                "calls, which one slow call (a hiccup) does not move."
            ).format(got_ms=got * 1e3, ref_ms=reference * 1e3, warmup=warmup),
        )
        expect(
            ratio < 1.5,
            tr(
                "{got_ms:.3g} ms per call is too far from torch.utils.benchmark's {ref_ms:.3g} ms: "
                "time each call with time.perf_counter() and sync()."
            ).format(got_ms=got * 1e3, ref_ms=reference * 1e3),
        )


class _ScriptedWorkload:
    """fn() queues seconds[i] of work on the i-th call (the last value after the list) (chapter 6)."""

    def __init__(self, device: ToyAsyncDevice, seconds: list[float]) -> None:
        self.device, self.seconds, self.calls = device, seconds, 0

    def __call__(self) -> None:
        self.device.kernel(self.seconds[min(self.calls, len(self.seconds) - 1)])
        self.calls += 1


def _median_probe(measure: Callable[..., float]) -> None:
    """Timed calls where 3 of 7 are instant: min and mean fall below the median (chapter 6)."""
    warmup, slow = 2, 2 * KERNEL_S
    timed = [0.0, slow, 0.0, slow, 0.0, slow, slow]  # median = slow, mean = 4/7 slow, min = 0
    with ToyAsyncDevice() as device, probe(f"warmup={warmup}, repeats={len(timed)}"):
        fn = _ScriptedWorkload(device, [FIRST_CALLS_S] * warmup + timed)
        got = measure(fn, device.synchronize, warmup=warmup, repeats=len(timed))
        device.synchronize()
        expect(
            fn.calls == warmup + len(timed),
            tr(
                "fn was called {calls} times instead of warmup + repeats = "
                "{total}: use the warmup and repeats you are given."
            ).format(calls=fn.calls, total=warmup + len(timed)),
        )
        # every timed call lasts at least what it queued, so the median of the measured times
        # is at least the median of the queued ones: `slow`, on any machine however busy
        expect(
            isinstance(got, (int, float)),
            tr("return a float number of seconds, not {got!r}.").format(got=got),
        )
        expect(
            got >= 0.999 * slow,
            tr(
                "the timed calls queued {queued} ms: their median is {median_ms:g} ms, and you "
                "returned {got_ms:.3g} ms, below it. That looks like {looks_like}, which "
                "outliers move: return statistics.median of the per-call times."
            ).format(
                queued=", ".join(format(t * 1e3, "g") for t in timed),
                median_ms=slow * 1e3,
                got_ms=got * 1e3,
                looks_like=tr("the fastest call (min)") if got < 0.3 * slow else tr("the mean"),
            ),
        )


def check_measure(measure: Callable[..., float]) -> CheckResult:
    """Exercise 1: warm-up, sync, repeats and the median, against torch.utils.benchmark (chapter 6)."""

    def probes() -> None:
        with probe(tr("warmup=3, repeats=5, one hiccup")):
            _measure_probes(measure)
        _median_probe(measure)

    return run_check(tr("Exercise 1, a correct benchmark function"), probes)


def _profile_of(work: Callable[[], None], label: bool = True) -> profile:
    """A CPU profile of one call of work(), wrapped in a record_function label 'outer' (chapter 6)."""
    work()  # warm up, so first-call costs do not decide the answer
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        if label:
            torch.neg(_SMALL)  # a tiny first row, so 'outer' (top by TOTAL time) is not also row 0
            with record_function("outer"):
                work()
        else:
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


_BIG, _SMALL = torch.randn(100_000), torch.randn(4_000)


def _many_small_among_one_big() -> None:
    """One big multiplication and 200 small additions whose sum usually outweighs it (chapter 6)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.neg(_SMALL)  # the first row: tiny, and the top row of any sort by a zero column
        _BIG * 2
        v = _SMALL
        for _ in range(200):
            v = v + 1
    finally:
        torch.set_num_threads(threads)


def _distinguishing_profile(
    work: Callable[[], None], need: Callable[[profile], bool], tries: int = 6
) -> profile:
    """A profile of work() for which need(profile) holds, if a few tries give one (chapter 6)."""
    prof = _profile_of(work, label=False)
    for _ in range(tries - 1):
        if need(prof):
            break
        prof = _profile_of(work, label=False)
    return prof


def _top(rows: object, attr: str) -> str:
    """The key of the row with the largest `attr` (chapter 6)."""
    return max(rows, key=lambda e: getattr(e, attr, 0) or 0).key  # type: ignore[arg-type]


def _biggest_single_event(prof: profile) -> str:
    """The name of the one event with the largest self CPU time (chapter 6)."""
    events = [e for e in prof.events() if e.name != "outer"]
    return max(events, key=lambda e: e.self_cpu_time_total).name


def _top_op_mistakes(prof: profile) -> list[tuple[str, str]]:
    """Each wrong way to read a profile's top op, with the op it returns (chapter 6)."""
    averages = prof.key_averages()
    rows = list(averages)
    return [
        (
            _top(averages, "cpu_time_total"),
            tr(
                "the row with the largest TOTAL time: it includes its children. Sort by "
                "self time (self_cpu_time_total) to find the op doing the work."
            ),
        ),
        (
            _biggest_single_event(prof),
            tr(
                "the op with the biggest single call; key_averages() already sums every "
                "call of an op, and many small calls can outweigh one big one."
            ),
        ),
        (
            max(rows, key=lambda e: e.self_cpu_time_total / max(e.count, 1)).key,
            tr(
                "the op with the largest time PER CALL (an average): use the total over "
                "all calls, self_cpu_time_total."
            ),
        ),
        (
            _top(averages, "self_device_time_total"),
            tr(
                "the op with the most self DEVICE time; on a CPU profile every device time "
                "is 0. The exercise asks for self_cpu_time_total."
            ),
        ),
        (rows[0].key, tr("the first row: key_averages() is not sorted; take the max.")),
    ]


def check_top_self_op(top_self_op: Callable[[profile], str]) -> CheckResult:
    """Exercise 2: the op with the most self CPU time, read from key_averages (chapter 6)."""

    def probes() -> None:
        cases = [
            (
                tr_mark("many additions that together outweigh one multiplication"),
                _many_small_among_one_big,
                lambda prof: (  # the sum wins, but neither one call nor the mean per call does
                    _top(prof.key_averages(), "self_cpu_time_total") == "aten::add"
                    and max(
                        prof.key_averages(), key=lambda e: e.self_cpu_time_total / max(e.count, 1)
                    ).key
                    != "aten::add"
                    and _biggest_single_event(prof) != "aten::add"  # not one preempted addition
                ),
            ),
            (tr_mark("one matmul among small additions"), _matmul_among_small_ops, None),
            (tr_mark("a sort, a small matmul, small additions"), _sort_among_small_ops, None),
        ]
        failed = []  # (probe name, expected, got, the mistakes `got` matches in that probe)
        for what, work, need in cases:
            prof = _profile_of(work) if need is None else _distinguishing_profile(work, need)
            averages = prof.key_averages()
            expected = _top(averages, "self_cpu_time_total")
            name = tr("a profile of {what}").format(what=tr(what))
            with probe(name):
                got = top_self_op(prof)
            expect(
                isinstance(got, str),
                _probed(
                    name,
                    tr("return the op's name as a string (the row's .key), not {kind}.").format(
                        kind=type(got).__name__
                    ),
                ),
            )
            if got != expected:
                whys = [why for wrong, why in _top_op_mistakes(prof) if got == wrong]
                failed.append((name, expected, got, whys))
        if not failed:
            return
        # One profile can fit several mistakes (on a CPU every device time is 0, so sorting by
        # device time returns the first row); name those the answer fits in EVERY failed probe.
        name, expected, got, whys = failed[0]
        common = [why for why in whys if all(why in f[3] for f in failed)]
        if len(common) == 1:
            expect(
                False,
                _probed(
                    name,
                    tr("expected {expected!r}, you returned {got!r}, {why}").format(
                        expected=expected, got=got, why=common[0]
                    ),
                ),
            )
        if common:
            expect(
                False,
                _probed(
                    name,
                    tr(
                        "expected {expected!r}, you returned {got!r}. In every probe it missed, "
                        "your answer fits each of these mistakes (these profiles cannot tell "
                        "them apart): {mistakes}"
                    ).format(expected=expected, got=got, mistakes=tr(" OR ").join(common)),
                ),
            )
        expect(
            False,
            _probed(
                name,
                tr(
                    "expected {expected!r} (the most self CPU time), you returned {got!r}. "
                    "Use prof.key_averages() and each row's self_cpu_time_total."
                ).format(expected=expected, got=got),
            ),
        )

    return run_check(tr("Exercise 2, name the top op of a profile"), probes)


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


class _GraphToken:
    """A marker stored in a step's autograd graph: alive while the graph is (chapter 6)."""


def check_fast_train(fast_train: Callable[..., list[float]]) -> CheckResult:
    """Exercise 3: the same per-step losses and parameters as the slow loop, with one sync (chapter 6)."""

    def probes() -> None:
        for batch_size in (32, 48):  # 512 samples: 16 full batches; 10 full and a short one
            with probe(tr("512 samples, batch_size={batch_size}").format(batch_size=batch_size)):
                one(batch_size)

    def one(batch_size: int) -> None:
        slow_model, x, y = _regression_data()
        with SyncCounter() as slow_syncs:
            expected = _reference_slow_train(slow_model, x, y, batch_size=batch_size)
        model, _, _ = _regression_data()
        outputs: list[weakref.ref[_GraphToken]] = []
        alive: list[int] = []

        def watch(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
            alive.append(sum(r() is not None for r in outputs))
            if out.grad_fn is not None:  # lives exactly as long as this step's graph
                token = _GraphToken()
                out.grad_fn.metadata["course_check"] = token
                outputs.append(weakref.ref(token))

        hook = model.register_forward_hook(watch)
        try:
            with SyncCounter() as syncs:
                got = fast_train(model, x, y, batch_size=batch_size)
        finally:
            hook.remove()
        expect(
            max(alive, default=0) <= 2,
            tr(
                "{alive} steps' autograd graphs were alive at once: you keep each step's loss "
                "with its graph (and every activation in it). Store loss.detach()."
            ).format(alive=max(alive, default=0)),
        )
        expect(
            isinstance(got, list) and all(isinstance(v, float) for v in got),
            tr(
                "return the per-step losses as a list of Python floats, got {kind}. "
                "Collect the detached losses on the device, then convert once at the end."
            ).format(kind=type(got).__name__),
        )
        expect(
            len(got) == len(expected),
            tr("return one loss per step: {steps} steps, you returned {n} values.").format(
                steps=len(expected), n=len(got)
            ),
        )
        expect(
            torch.allclose(torch.tensor(got), torch.tensor(expected), rtol=1e-5, atol=1e-7),
            tr(
                "your losses differ from the slow loop's: keep the same batches, order and "
                "optimizer."
            ),
        )
        same_params = all(
            torch.allclose(a, b, rtol=0, atol=1e-6)
            for a, b in zip(model.parameters(), slow_model.parameters())
        )
        expect(
            same_params,
            tr("the trained parameters differ from the slow loop's: same math, please."),
        )
        expect(
            syncs.count <= 2,
            tr(
                "your loop made {count} host syncs ({kinds}); the slow one made {slow}. Keep "
                "losses on the device (loss.detach()) and read them once at the end, e.g. "
                "torch.stack(losses).tolist()."
            ).format(count=syncs.count, kinds=dict(syncs.by_kind()), slow=slow_syncs.count),
        )

    return run_check(tr("Exercise 3, remove the per-step sync"), probes)


def _linear_step_and_flops(
    batch: int = 64, sizes: tuple[int, ...] = (256, 128)
) -> tuple[Callable[[], None], int]:
    """A forward + backward of Linear layers through `sizes` at `batch`, and its exact FLOPs (chapter 6)."""
    layers = [nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])]
    model, x = nn.Sequential(*layers), torch.randn(batch, sizes[0])

    def step() -> None:
        model(x).square().mean().backward()

    # forward 2*B*in*out per layer, weight gradient 2*B*in*out per layer, and the gradient
    # of each layer's input except the first (x needs none): 2*B*in*out
    pairs = list(zip(sizes, sizes[1:]))
    flops = sum(4 * batch * a * b for a, b in pairs) + sum(2 * batch * a * b for a, b in pairs[1:])
    return step, flops


def check_step_mfu(step_mfu: Callable[[Callable[[], object], float, float], float]) -> CheckResult:
    """Exercise 4: MFU from FlopCounterMode's count, the step time and the peak (chapter 6)."""

    def probes() -> None:
        for batch, sizes, seconds, peak in (
            (64, (256, 128), 2e-4, 1e11),
            (24, (100, 40, 7), 3e-5, 3.7e11),
            (5, (33, 65), 1.1e-6, 9.9e12),
        ):
            name = tr("Linear layers {sizes} at batch {batch}").format(
                sizes="-".join(map(str, sizes)), batch=batch
            )
            with probe(name):
                one(batch, sizes, seconds, peak)

    def one(batch: int, sizes: tuple[int, ...], seconds: float, peak: float) -> None:
        step, flops = _linear_step_and_flops(batch, sizes)
        expected = flops / seconds / peak
        got = step_mfu(step, seconds, peak)
        expect(
            isinstance(got, float) and math.isfinite(got),
            tr("return the MFU as a float fraction, got {got!r}.").format(got=got),
        )
        expect(
            not math.isclose(got, 100 * expected, rel_tol=1e-3),
            tr(
                "you returned {got:.4g}, a percentage: return the fraction ({expected:.4g})."
            ).format(got=got, expected=expected),
        )
        pairs = list(zip(sizes, sizes[1:]))
        for n_params in (sum(a * b for a, b in pairs), sum(a * b + b for a, b in pairs)):
            expect(
                not math.isclose(got, 6 * batch * n_params / seconds / peak, rel_tol=0.01),
                tr(
                    "that is the '6 x batch x parameters' rule of thumb; count instead with "
                    "FlopCounterMode: this step computes no gradient for its input."
                ),
            )
        expect(
            math.isclose(got, expected, rel_tol=1e-3),
            tr(
                "expected {expected:.4g}, got {got:.4g} ({ratio:.3g}x). Count the FLOPs of one "
                "call of step() with FlopCounterMode(display=False) (no fixed number: the step "
                "changes), then divide by seconds_per_step and by peak_flops."
            ).format(expected=expected, got=got, ratio=got / expected),
        )
        for bad_seconds in (0.0, -1e-3):
            try:
                step_mfu(step, bad_seconds, peak)
            except ValueError:
                continue
            expect(
                False,
                tr("seconds={seconds} must raise ValueError: a step cannot take that.").format(
                    seconds=bad_seconds
                ),
            )
        try:
            step_mfu(step, seconds, 0.0)
        except ValueError:
            return
        expect(False, tr("peak=0 must raise ValueError: there is no MFU against a zero peak."))

    return run_check(tr("Exercise 4, MFU of a step"), probes)
