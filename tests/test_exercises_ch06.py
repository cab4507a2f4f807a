"""Chapter 6 checkers fail typical wrong answers (solution/stub: test_exercise_checks.py)."""

from __future__ import annotations

import statistics
import time

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from helpers.checks import FAIL
from helpers.checks import ch06 as checks
from helpers.checks.ch06 import check_fast_train, check_measure, check_step_mfu, check_top_self_op

from nbfiles import exercise_namespace

SOLUTIONS = "solutions/06_profiling_solutions.ipynb"


@pytest.fixture(scope="module")
def solutions() -> dict:
    return exercise_namespace(SOLUTIONS)


# --- exercise 1: typical wrong benchmark functions ---------------------------------------------


def no_warmup(fn, sync, warmup=3, repeats=10):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def no_sync(fn, sync, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def mean_of_block(fn, sync, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats


def one_reading(fn, sync, warmup=3, repeats=10):
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def milliseconds(fn, sync, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (no_warmup, "warm"),
        (no_sync, "sync()"),
        (mean_of_block, "median"),
        (one_reading, "calls"),
        (milliseconds, "milliseconds"),
    ],
)
def test_wrong_benchmarks_fail(wrong, hint: str) -> None:
    result = check_measure(wrong)
    assert result.status == FAIL and hint in result.message, result.message


# --- exercise 2 ---------------------------------------------------------------------------------


def by_total_time(prof):
    return max(prof.key_averages(), key=lambda row: row.cpu_time_total).key


def always_mm(prof):
    return "aten::mm"


def the_row(prof):
    return max(prof.key_averages(), key=lambda row: row.self_cpu_time_total)


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [(by_total_time, "TOTAL"), (always_mm, "you returned 'aten::mm'"), (the_row, "string")],
)
def test_wrong_top_ops_fail(wrong, hint: str) -> None:
    result = check_top_self_op(wrong)
    assert result.status == FAIL and hint in result.message, result.message


# --- exercise 3 ---------------------------------------------------------------------------------


def still_syncs(model, x, y, batch_size=32, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for i in range(0, len(x), batch_size):
        loss = F.mse_loss(model(x[i : i + batch_size]), y[i : i + batch_size])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [v.item() for v in losses]


def mean_only(model, x, y, batch_size=32, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    total = torch.zeros(())
    for i in range(0, len(x), batch_size):
        loss = F.mse_loss(model(x[i : i + batch_size]), y[i : i + batch_size])
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.detach()
    return [(total / (len(x) // batch_size)).item()]


def bigger_batch(model, x, y, batch_size=32, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for i in range(0, len(x), 2 * batch_size):
        loss = F.mse_loss(model(x[i : i + 2 * batch_size]), y[i : i + 2 * batch_size])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses).tolist() * 2


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [(still_syncs, "host syncs"), (mean_only, "one loss per step"), (bigger_batch, "differ")],
)
def test_wrong_fast_trains_fail(wrong, hint: str) -> None:
    result = check_fast_train(wrong)
    assert result.status == FAIL and hint in result.message, result.message


# --- exercise 4 ---------------------------------------------------------------------------------


def _flops(step) -> int:
    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


def as_percent(step, seconds, peak):
    if seconds <= 0 or peak <= 0:
        raise ValueError("positive, please")
    return 100 * _flops(step) / seconds / peak


def rule_of_thumb(step, seconds, peak):
    if seconds <= 0 or peak <= 0:
        raise ValueError("positive, please")
    return 6 * 64 * 256 * 128 / seconds / peak


def no_validation(step, seconds, peak):
    return _flops(step) / seconds / peak if seconds else 0.0


def forgets_time(step, seconds, peak):
    if seconds <= 0 or peak <= 0:
        raise ValueError("positive, please")
    return _flops(step) / peak


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [
        (as_percent, "percentage"),
        (rule_of_thumb, "rule of thumb"),
        (no_validation, "ValueError"),
        (forgets_time, "expected"),
    ],
)
def test_wrong_mfus_fail(wrong, hint: str) -> None:
    result = check_step_mfu(wrong)
    assert result.status == FAIL and hint in result.message, result.message


# --- new wrong answers of each kind (issue 16) and other correct styles --------------------


def hard_coded_flops(step, seconds, peak):
    if seconds <= 0 or peak <= 0:
        raise ValueError("positive, please")
    return 4 * 64 * 256 * 128 / seconds / peak


def test_a_hard_coded_flop_count_fails_and_the_hint_does_not_print_it() -> None:
    result = checks.check_step_mfu(hard_coded_flops)
    assert result.status == FAIL and "no fixed number" in result.message
    assert f"{4 * 64 * 256 * 128:,}" not in result.message


def step_mfu_by_counter_dict(step, seconds, peak):
    if not (seconds > 0 and peak > 0):
        raise ValueError("seconds and peak must be positive")
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return float(sum(counter.get_flop_counts()["Global"].values())) / (seconds * peak)


def test_step_mfu_other_correct_style_passes() -> None:
    assert checks.check_step_mfu(step_mfu_by_counter_dict).passed


def keeps_graphs(model, x, y, batch_size=32, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for i in range(0, len(x), batch_size):
        loss = F.mse_loss(model(x[i : i + batch_size]), y[i : i + batch_size])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss)  # no detach: every step's graph stays alive
    return torch.stack(losses).tolist()


def fixed_step_count(model, x, y, batch_size=32, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for s in range(len(x) // batch_size):  # drops the short last batch
        i = s * batch_size
        loss = F.mse_loss(model(x[i : i + batch_size]), y[i : i + batch_size])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses).tolist()


@pytest.mark.parametrize(
    ("wrong", "hint"),
    [(keeps_graphs, "graphs were alive at once"), (fixed_step_count, "batch_size=48")],
)
def test_new_wrong_fast_trains_fail(wrong, hint: str) -> None:
    result = checks.check_fast_train(wrong)
    assert result.status == FAIL and hint in result.message


def fast_train_preallocated(model, x, y, batch_size=32, lr=0.05):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    starts = range(0, len(x), batch_size)
    losses = torch.empty(len(starts))
    for k, i in enumerate(starts):
        loss = F.mse_loss(model(x[i : i + batch_size]), y[i : i + batch_size])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[k] = loss.detach()
    return losses.tolist()


def test_fast_train_other_correct_style_passes() -> None:
    assert checks.check_fast_train(fast_train_preallocated).passed


def by_device_time(prof):
    return max(prof.key_averages(), key=lambda e: e.self_device_time_total).key


def by_biggest_call(prof):
    events = [e for e in prof.events() if e.name != "outer"]
    return max(events, key=lambda e: e.self_cpu_time_total).name


def test_sorting_by_device_time_is_told_so() -> None:
    result = checks.check_top_self_op(by_device_time)
    assert result.status == FAIL and "DEVICE time" in result.message


def test_a_preempted_first_call_does_not_hide_the_device_time_hint(monkeypatch) -> None:  # noqa: ANN001
    # CI, 2026-11-27: the tiny first call was preempted and became the biggest single call, so
    # the device-time answer (the first row, as every device time is 0) got the single-call hint.
    monkeypatch.setattr(checks, "_biggest_single_event", lambda p: list(p.key_averages())[0].key)
    result = checks.check_top_self_op(by_device_time)
    assert result.status == FAIL and "DEVICE time" in result.message, result.message


def test_the_biggest_single_call_fails_on_many_small_calls() -> None:
    result = checks.check_top_self_op(by_biggest_call)
    assert result.status == FAIL


def test_top_self_op_other_correct_style_passes() -> None:
    def sorted_rows(prof):
        rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        return rows[0].key

    assert checks.check_top_self_op(sorted_rows).passed


# --- measure: a median that min and mean miss (issue 16) ---------------------------------------


def measure_min(fn, sync, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return min(times)


def measure_fixed_counts(fn, sync, warmup=3, repeats=10):
    return measure_sorted_middle(fn, sync, 3, 5)


def measure_sorted_middle(fn, sync, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def test_measure_min_and_fixed_counts_fail_other_styles_pass() -> None:
    result = check_measure(measure_min)
    assert result.status == FAIL and "fastest call (min)" in result.message, result.message
    result = check_measure(measure_fixed_counts)
    assert result.status == FAIL and "warmup + repeats" in result.message, result.message
    assert check_measure(measure_sorted_middle).passed
