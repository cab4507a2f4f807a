"""A pytest plugin for the ipywidgets-7 lane: keep notebooks and the unit tests that use widgets.

    PYTHONPATH=tools pytest -p widget_tests_only notebooks tests/test_x.py ...

Notebook items (nbval) are always kept. A unit test is kept when its own source mentions
ipywidgets, `interactive_plot`, `run_button` or `widgets.`; the rest of the unit suite does
not depend on the ipywidgets version and has run already in `make test`.
"""

from __future__ import annotations

import inspect
import re

import pytest

WIDGET_CODE = re.compile(r"ipywidgets|interactive_plot|run_button|\bwidgets\.")


def uses_widgets(item: pytest.Item) -> bool:
    """A notebook cell, or a test function whose source touches ipywidgets."""
    function = getattr(item, "function", None)
    if function is None:
        return True  # nbval cells and other non-Python items
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return True
    return bool(WIDGET_CODE.search(source))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep = [item for item in items if uses_widgets(item)]
    dropped = [item for item in items if not uses_widgets(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
