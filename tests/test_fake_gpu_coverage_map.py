"""tools/coverage_map.py: every unrun line of helpers/ is tested or listed with its reason."""

from __future__ import annotations

from pathlib import Path

import coverage
import coverage_map
import pytest

ROOT = Path(__file__).resolve().parent.parent
LIST = ROOT / "tests" / "gpu_only_lines.md"

SOURCE = '''"""doc"""
X = 1


def top(a):
    if a:
        return 1
    return 2


class K:
    def method(self):
        def inner():
            return 3
        return inner()
'''


def test_qualnames_name_the_innermost_function() -> None:
    names = coverage_map.qualnames(SOURCE)
    assert names.get(2) is None  # module level
    assert names[7] == "top" and names[14] == "K.method.inner" and names[15] == "K.method"


def test_ranges() -> None:
    assert coverage_map.ranges([9, 3, 4, 5]) == "3-5, 9"
    assert coverage_map.ranges([]) == ""


def test_entry_covers_nested_functions_only_of_its_own_module() -> None:
    e = coverage_map.Entry("helpers/x.py", "K.method", 3, "why")
    assert e.covers("helpers/x.py", "K.method") and e.covers("helpers/x.py", "K.method.inner")
    assert not e.covers("helpers/x.py", "K.methods") and not e.covers("helpers/y.py", "K.method")


def test_the_list_parses_and_names_real_functions() -> None:
    entries = coverage_map.read_list(LIST)
    assert entries, "tests/gpu_only_lines.md lists nothing"
    for e in entries:
        path = ROOT / e.path
        assert path.is_file(), e.path
        assert e.reason and e.allowed >= 1, e
        if e.function != coverage_map.MODULE:
            names = set(coverage_map.qualnames(path.read_text(encoding="utf-8")).values())
            assert e.function in names, f"{e.path}::{e.function} no longer exists"


def _data(tmp_path: Path, module: Path, run: list[int]) -> str:
    data_file = str(tmp_path / ".coverage")
    data = coverage.CoverageData(basename=data_file)
    data.add_lines({str(module): run})
    data.write()
    return data_file


@pytest.fixture
def fake_module(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A module under a fake project root, so the map's relative paths are helpers/x.py."""
    (tmp_path / "helpers").mkdir()
    module = tmp_path / "helpers" / "x.py"
    module.write_text(SOURCE, encoding="utf-8")
    monkeypatch.setattr(coverage_map, "ROOT", tmp_path)
    return module


def test_map_passes_when_every_unrun_line_is_listed(
    fake_module: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listing = tmp_path / "list.md"
    listing.write_text("| helpers/x.py | top | 1 | needs a GPU |\n", encoding="utf-8")
    data = _data(tmp_path, fake_module, [1, 2, 5, 6, 8, 11, 12, 13, 15, 14])
    assert coverage_map.main(["--data", data, "--list", str(listing), "--min", "50"]) == 0
    out = capsys.readouterr().out
    assert "helpers/x.py::top lines 7: needs a GPU" in out and "TOTAL helpers/" in out


def test_map_fails_on_unlisted_lines_too_many_lines_and_a_low_total(
    fake_module: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    listing = tmp_path / "list.md"
    listing.write_text(
        "| helpers/x.py | top | 1 | needs a GPU |\n| helpers/x.py | gone | 1 | old |\n",
        encoding="utf-8",
    )
    data = _data(tmp_path, fake_module, [1, 2, 5, 11, 12])
    assert coverage_map.main(["--data", data, "--list", str(listing)]) == 1
    out = capsys.readouterr().out
    assert "(K.method" in out and "not listed" in out
    assert "helpers/x.py::top has 3 unrun lines, the list allows 1" in out
    assert "stale entry" in out and "under the 95% minimum" in out


def test_bad_count_in_the_list_is_an_error(tmp_path: Path) -> None:
    listing = tmp_path / "list.md"
    listing.write_text("| helpers/x.py | top | many | why |\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="lines column must be a number"):
        coverage_map.read_list(listing)
