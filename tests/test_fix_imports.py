"""tools/fix_imports.py: every `from helpers.X import name` names the module that defines it."""

from __future__ import annotations

import pytest

import fix_imports


def test_every_helpers_import_names_the_defining_module(capsys: pytest.CaptureFixture) -> None:
    status = fix_imports.main(["--check"])
    out = capsys.readouterr().out
    assert status == 0, f"imports that name the wrong module (run tools/fix_imports.py):\n{out}"
    assert "warning" not in out, out


def test_a_moved_name_is_imported_from_its_new_home() -> None:
    defined = {"format_bytes": {"helpers.units"}, "track_peak": {"helpers.memory"}}
    modules = {"helpers.units", "helpers.memory"}
    source = "from helpers.memory import format_bytes, track_peak as tp\n"
    new, warnings = fix_imports.fix_source(source, None, defined, modules, "x.py")
    assert not warnings
    assert (
        new
        == "from helpers.units import format_bytes\nfrom helpers.memory import track_peak as tp\n"
    )


def test_a_name_defined_nowhere_is_reported_not_guessed() -> None:
    source = "from helpers.gone import nothing\n"
    new, warnings = fix_imports.fix_source(source, None, {}, set(), "x.py")
    assert new == source and warnings and "nothing" in warnings[0]


def test_an_import_of_the_module_itself_is_dropped() -> None:
    defined = {"MiB": {"helpers.units"}}
    source = "import torch\nfrom helpers.memory import MiB\n"
    new, _ = fix_imports.fix_source(source, "helpers.units", defined, {"helpers.units"}, "u.py")
    assert new == "import torch\n"
