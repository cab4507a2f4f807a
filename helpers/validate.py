"""Argument checks and error types shared by every chapter (chapter 1). A ground-floor module:
it imports nothing from the course."""

from __future__ import annotations

from typing import Any

from helpers.i18n import tr


class DeviceError(ValueError):
    """A device that does not exist here, or cannot do what was asked (chapter 1)."""


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name if it has none (chapter 1)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def positive_int(value: Any, name: str) -> int:
    """`value` as an int if it is a whole number > 0, else a ValueError naming `name` (chapter 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ValueError(
            tr("{name} must be a whole number > 0, got {value!r}.").format(name=name, value=value)
        )
    if value <= 0:
        raise ValueError(
            tr("{name} must be > 0, got {value!r}. Use a positive size.").format(
                name=name, value=value
            )
        )
    return int(value)


def positive_seconds(value: Any, name: str) -> float:
    """`value` as a float if it is a number of seconds > 0, else a ValueError naming `name` (chapter 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            tr("{name} must be a positive number of seconds, got {value!r}.").format(
                name=name, value=value
            )
        )
    return float(value)
