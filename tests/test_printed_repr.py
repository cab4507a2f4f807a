"""Results meant as readouts show as their text in a notebook, through IPython's own printer.

IPython takes the first class in the MRO that defines ``_repr_pretty_`` or ``__repr__``; a
``@dataclass`` subclass of ``Printed`` defines ``__repr__``, so before the fix a notebook cell
ending in ``describe_device(device)`` or an ``MfuResult`` showed ``DeviceInfo(device=...)``
(AUDIT finding 24 of the H100 run of 2026-11-26)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch
from IPython.lib.pretty import pretty

import helpers
from helpers.devices import describe_device
from helpers.mfu import MfuResult, Peak
from helpers.units import Printed


def printed_subclasses() -> list[type]:
    """Every Printed subclass defined in helpers/ (scripts left out: they are programs)."""
    for info in pkgutil.walk_packages(helpers.__path__, "helpers."):
        if not info.name.startswith("helpers.scripts"):
            importlib.import_module(info.name)
    found, todo = [], [Printed]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def test_every_printed_class_wins_over_its_dataclass_repr() -> None:
    classes = printed_subclasses()
    assert len(classes) >= 10, classes
    missing = [c.__qualname__ for c in classes if "_repr_pretty_" not in c.__dict__]
    assert not missing, f"IPython would print these with their __repr__: {missing}"


def test_device_info_shows_as_its_text_in_a_notebook() -> None:
    info = describe_device("cpu")
    shown = pretty(info)
    assert shown == str(info) and not shown.startswith("DeviceInfo(")


@pytest.mark.parametrize("achievable", [None, 0.5e12])
def test_mfu_result_shows_its_mfu_not_a_repr(achievable) -> None:  # noqa: ANN001
    peak = Peak(1e12, "a test peak", measured=False)
    result = MfuResult(
        flops=3 * 10**9,
        seconds=0.01,
        peak=peak,
        achievable=None if achievable is None else Peak(achievable, "measured", measured=True),
    )
    shown = pretty(result)
    assert "MFU 30.0%" in shown and "MfuResult(" not in shown


def test_a_new_dataclass_subclass_is_covered_too() -> None:
    from dataclasses import dataclass

    @dataclass
    class Reading(Printed):
        value: float

        def __str__(self) -> str:
            return f"reading {self.value}"

    assert pretty(Reading(torch.tensor(2.0).item())) == "reading 2.0"
