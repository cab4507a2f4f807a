"""helpers.sweeps: tables, and out-of-memory that stops the sweep but keeps the rows."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from helpers.sweeps import SweepResult, is_out_of_memory, run_sweep
from helpers.tables import format_table


def test_sweep_collects_rows() -> None:
    r = run_sweep(lambda n: {"square": n * n}, [1, 2, 3], param="n", progress=False)
    assert r.column("n") == [1, 2, 3] and r.column("square") == [1, 4, 9] and r.stopped is None
    assert "square" in str(r) and len(r) == 3


def test_sweep_with_progress_bar() -> None:
    assert len(run_sweep(lambda n: {"x": n}, [1, 2], progress=True)) == 2


def test_out_of_memory_stops_and_keeps_rows(capsys: pytest.CaptureFixture[str]) -> None:
    def measure(n: int) -> dict:
        if n > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return {"ok": True}

    r = run_sweep(measure, [1, 2, 3, 4], param="batch", progress=False)
    assert r.column("batch") == [1, 2] and "batch=3" in r.stopped
    out = capsys.readouterr().out
    assert "Stopped the sweep" in out and "Kept the 2 row(s)" in out


def test_real_cpu_allocator_failure_is_caught() -> None:
    def measure(n: int) -> dict:
        torch.empty(n, dtype=torch.uint8)  # 2**62 bytes cannot be allocated anywhere
        return {"bytes": n}

    r = run_sweep(measure, [1024, 2**62], param="bytes", progress=False)
    assert len(r) == 1 and r.stopped and "out of memory" in r.stopped


def test_failed_step_tensors_are_released() -> None:
    refs = []

    def measure(n: int) -> dict:
        big = torch.ones(1000)
        refs.append(weakref.ref(big))
        raise MemoryError("pretend")

    run_sweep(measure, [1], progress=False)
    gc.collect()
    assert refs[0]() is None, "the failed frame's tensors must not stay alive"


def test_other_errors_are_raised() -> None:
    with pytest.raises(ZeroDivisionError):
        run_sweep(lambda n: {"x": 1 / n}, [1, 0], progress=False)


@pytest.mark.parametrize(
    "exc,expected",
    [
        (torch.OutOfMemoryError("x"), True),
        (MemoryError(), True),
        (
            RuntimeError(
                "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"
            ),
            True,
        ),
        (RuntimeError("MPS backend out of memory"), True),
        (RuntimeError("shape mismatch"), False),
        (ValueError("out of memory"), False),
    ],
)
def test_is_out_of_memory(exc: BaseException, expected: bool) -> None:
    assert is_out_of_memory(exc) is expected


def test_missing_column_is_explained() -> None:
    with pytest.raises(KeyError, match="columns: n"):
        SweepResult("n", [{"n": 1}]).column("gflops")


def test_format_table() -> None:
    text = format_table([{"n": 1, "t": 0.123456}, {"n": 20, "t": 2.0}])
    assert text.splitlines()[0].split() == ["n", "t"] and "0.1235" in text
    assert format_table([]) == "(no rows)"
