"""helpers.verdicts.compare_rows: the ratio a verdict prints is the ratio of the rows it names.

AUDIT finding 2 (H100 run of 2026-11-26): chapter 2 printed "never reading vs loss.item()
every step: too close to call (1.00x)" under a table that showed 1.56x, because the verdict
compared the "never" timing with itself. A verdict built by compare_rows reads both rows from
the table by name, so it cannot compare numbers the table does not show."""

from __future__ import annotations

import random
import re

import pytest

from helpers.machine_state import GpuTenants, MachineState
from helpers.verdicts import compare_rows, row_named


def printed_ratio(text: str) -> float:
    """The one 'N.NNx' a verdict prints."""
    found = re.findall(r"(\d+\.\d+)x", text)
    assert len(found) == 1, text
    return float(found[0])


def table(ms: dict[str, float], iqr: float = 0.0) -> list[dict]:
    return [
        {"loss.item() every": k, "ms/epoch": v, "spread (IQR, ms)": iqr * v} for k, v in ms.items()
    ]


def test_the_finding_2_table_gets_its_own_ratio() -> None:
    rows = table({"1 step(s)": 399.7, "10 step(s)": 270.0, "never": 256.1}, iqr=0.02)
    verdict = compare_rows(
        rows, "loss.item() every", "never", "1 step(s)", "ms/epoch", iqr="spread (IQR, ms)"
    )
    assert printed_ratio(verdict) == pytest.approx(399.7 / 256.1, abs=0.005)
    assert verdict.startswith("here, never was 1.56x faster than 1 step(s)")
    assert verdict.conclusive


@pytest.mark.parametrize("seed", range(20))
def test_the_printed_ratio_is_always_the_tables(seed: int) -> None:
    rnd = random.Random(seed)
    names = [f"row {i}" for i in range(rnd.randint(2, 6))]
    rows = table({n: rnd.uniform(0.1, 1000.0) for n in names}, iqr=rnd.uniform(0.0, 0.2))
    a, b = rnd.sample(names, 2)
    higher = rnd.random() < 0.5
    verdict = compare_rows(
        rows,
        "loss.item() every",
        a,
        b,
        "ms/epoch",
        iqr="spread (IQR, ms)",
        higher_is_better=higher,
    )
    va, vb = (
        row_named(rows, "loss.item() every", a)["ms/epoch"],
        row_named(rows, "loss.item() every", b)["ms/epoch"],
    )
    a_better = va / vb if higher else vb / va
    expected = max(a_better, 1 / a_better)  # the row ahead is named first
    assert printed_ratio(verdict) == pytest.approx(expected, abs=0.006)
    assert verdict.ratio == pytest.approx(a_better)
    assert a in verdict and b in verdict


def test_a_row_compared_with_itself_is_refused() -> None:
    rows = table({"1 step(s)": 399.7, "never": 256.1})
    with pytest.raises(ValueError, match="two different rows"):
        compare_rows(rows, "loss.item() every", "never", "never", "ms/epoch")


def test_a_row_the_table_does_not_have_is_refused() -> None:
    rows = table({"1 step(s)": 399.7, "never": 256.1})
    with pytest.raises(ValueError, match="0 rows with 'loss.item\\(\\) every' = 'every step'"):
        compare_rows(rows, "loss.item() every", "never", "every step", "ms/epoch")


def test_text_cells_are_refused_with_a_hint() -> None:
    rows = [{"v": "a", "t": "1.0 ms"}, {"v": "b", "t": "2.0 ms"}]
    with pytest.raises(ValueError, match="must hold numbers"):
        compare_rows(rows, "v", "a", "b", "t")


def test_within_the_spreads_it_is_too_close_to_call() -> None:
    rows = table({"a": 100.0, "b": 104.0}, iqr=0.03)
    verdict = compare_rows(rows, "loss.item() every", "a", "b", "ms/epoch", iqr="spread (IQR, ms)")
    assert "a vs b: too close to call (the first ahead by 1.04x; spreads add up to 6%)" in verdict
    assert not verdict.conclusive


def test_the_call_does_not_depend_on_which_row_is_named_first() -> None:
    """A learner's find (issue 31, ch08): 1.64x against spreads of 41% was "too close to call"
    when the slower row came first (abs(0.61 - 1) < 0.41) and conclusive the other way."""
    rows = [
        {"way": "flat", "ms": 10.0, "iqr": 2.05},  # 20.5% each: 41% together
        {"way": "hooks", "ms": 16.4, "iqr": 16.4 * 0.205},
    ]
    one = compare_rows(rows, "way", "hooks", "flat", "ms", iqr="iqr")
    other = compare_rows(rows, "way", "flat", "hooks", "ms", iqr="iqr")
    assert one.conclusive and other.conclusive and one.beyond and other.beyond
    assert printed_ratio(one) == printed_ratio(other) == 1.64
    assert "flat was 1.64x faster than hooks" in one and "flat was 1.64x faster than hooks" in other
    close = [dict(r, iqr=r["ms"] * 0.33) for r in rows]  # spreads 66% > the 64% gap
    for a, b in (("hooks", "flat"), ("flat", "hooks")):
        v = compare_rows(close, "way", a, b, "ms", iqr="iqr")
        assert not v.beyond and "flat vs hooks: too close to call (the first ahead by 1.64x" in v


def test_a_shared_gpu_gives_no_conclusion() -> None:
    busy = MachineState("cuda:0", 6, 6, 16, 2.0, GpuTenants(1, 2**30))
    rows = table({"fp32": 5.169, "tf32": 0.75})
    verdict = compare_rows(rows, "loss.item() every", "tf32", "fp32", "ms/epoch", machine=[busy])
    assert verdict.startswith("inconclusive, GPU shared with 1 other compute process(es)")
    assert "tf32 was 6.89x faster than fp32" in verdict and not verdict.conclusive


def test_a_relative_spread_column_and_a_label() -> None:
    rows = [
        {"processes": 1, "samples/s": 1000.0, "spread": 0.02},
        {"processes": 2, "samples/s": 1500.0, "spread": 0.03},
    ]
    verdict = compare_rows(
        rows,
        "processes",
        2,
        1,
        "samples/s",
        spread="spread",
        higher_is_better=True,
        label="{} rank(s)",
    )
    assert verdict == "here, 2 rank(s) was 1.50x faster than 1 rank(s)"
    assert verdict.noise == pytest.approx(0.05)
    with pytest.raises(ValueError, match="not both"):
        compare_rows(rows, "processes", 2, 1, "samples/s", spread="spread", iqr="spread")
