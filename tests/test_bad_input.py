"""Bad input to the foundation helpers gets a clear error that says what is wrong and what to do."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from helpers.data import make_classification_data
from helpers.devices import check_dtype, describe_device, resolve_device
from helpers.dtypes import parse_dtype
from helpers.memory import memory_readout
from helpers.sweeps import run_sweep
from helpers.timing import benchmark
from helpers.units import format_bytes
from helpers.validate import DeviceError, positive_int

NO_CUDA = not torch.cuda.is_available()
NO_MPS = not torch.backends.mps.is_available()
ABSENT = f"cuda:{torch.cuda.device_count() + 3}"  # one index past every GPU here

CASES: list[tuple[str, Callable[[], object], type[BaseException], str]] = [
    (
        "absent GPU index lists devices",
        lambda: resolve_device(ABSENT),
        DeviceError,
        "Devices here: .*cpu",
    ),
    (
        "not a device name",
        lambda: resolve_device("gpu"),
        DeviceError,
        "not a device name.*Devices on this machine",
    ),
    ("device of the wrong type", lambda: resolve_device(3), DeviceError, "must be a string"),
    (
        "device of the wrong type (list)",
        lambda: resolve_device(["cpu"]),
        DeviceError,
        "must be a string",
    ),
    ("describe an absent device", lambda: describe_device(ABSENT), DeviceError, ABSENT),
    ("memory of an absent device", lambda: memory_readout(ABSENT), DeviceError, ABSENT),
    (
        "benchmark on an absent device",
        lambda: benchmark(lambda: None, device=ABSENT),
        DeviceError,
        ABSENT,
    ),
    (
        "unknown dtype string",
        lambda: parse_dtype("fp99"),
        DeviceError,
        "Unknown dtype 'fp99'. Use one of",
    ),
    ("integer dtype string", lambda: parse_dtype("int4"), DeviceError, "Use one of"),
    (
        "dtype check with an unknown dtype",
        lambda: check_dtype("cpu", "half-float"),
        DeviceError,
        "Unknown dtype",
    ),
    ("negative size", lambda: positive_int(-3, "size"), ValueError, "size must be > 0.*positive"),
    ("zero size", lambda: positive_int(0, "batch_size"), ValueError, "batch_size must be > 0"),
    ("fractional size", lambda: positive_int(2.5, "size"), ValueError, "whole number"),
    ("size as a string", lambda: positive_int("8", "size"), ValueError, "whole number"),
    ("size as a bool", lambda: positive_int(True, "size"), ValueError, "whole number"),
    (
        "empty sweep",
        lambda: run_sweep(lambda v: {}, [], param="n", progress=False),
        ValueError,
        "got no values",
    ),
    (
        "sweep row not a dict",
        lambda: run_sweep(lambda v: v, [1], progress=False),
        TypeError,
        "must return a dict",
    ),
    ("benchmark of a non-function", lambda: benchmark(42), TypeError, "needs a function"),
    ("negative warm-up", lambda: benchmark(lambda: None, warmup=-1), ValueError, "warmup must be"),
    (
        "zero run time",
        lambda: benchmark(lambda: None, min_run_time=0),
        ValueError,
        "min_run_time must be a positive",
    ),
    (
        "zero repeats",
        lambda: benchmark(lambda: None, min_repeats=0),
        ValueError,
        "min_repeats must be",
    ),
    ("bytes not a number", lambda: format_bytes("10"), ValueError, "finite number of bytes"),
    ("bytes not finite", lambda: format_bytes(float("nan")), ValueError, "finite number of bytes"),
    ("empty dataset", lambda: make_classification_data(0), ValueError, "n_samples must be > 0"),
    (
        "negative features",
        lambda: make_classification_data(10, -1),
        ValueError,
        "n_features must be > 0",
    ),
]
if NO_CUDA:
    CASES.append(
        (
            "CUDA on a CPU-only machine",
            lambda: resolve_device("cuda"),
            DeviceError,
            "No CUDA/ROCm GPU is visible",
        )
    )
if NO_MPS:
    CASES.append(("MPS off a Mac", lambda: resolve_device("mps"), DeviceError, "Apple-silicon"))


def test_at_least_twenty_cases() -> None:
    assert len(CASES) >= 20


@pytest.mark.parametrize(
    ("call", "exc", "pattern"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_explained(
    call: Callable[[], object], exc: type[BaseException], pattern: str
) -> None:
    with pytest.raises(exc, match=pattern):
        call()
