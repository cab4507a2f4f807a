"""Every torch.cuda/mps/accelerator/amp attribute and device-property name the course uses exists.

This is the test that would have caught the sources' `total_mem` (it is `total_memory`): the
CPU build of torch has the whole torch.cuda namespace, and the CUDA device-properties type is
described in torch's own type stub.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
import torch

import nbfiles

ROOT = Path(__file__).resolve().parent.parent
NAMESPACES = (
    "torch.cuda",
    "torch.mps",
    "torch.accelerator",
    "torch.amp",
    "torch.backends",
    "torch.xpu",
)
USE = re.compile(r"\b(torch\.(?:cuda|mps|accelerator|amp|backends|xpu)(?:\.[A-Za-z_]\w*)+)")
PROPS = re.compile(r"(?:get_device_properties\([^()]*\)|\bprops|\bproperties)\.([A-Za-z_]\w*)")


def course_sources() -> list[tuple[str, str]]:
    files = [p for d in ("helpers", "benchmarks", "tests") for p in (ROOT / d).rglob("*.py")]
    out = [
        (str(p.relative_to(ROOT)), p.read_text(encoding="utf-8"))
        for p in files
        if p.name != Path(__file__).name
    ]
    for nb in nbfiles.all_notebooks():
        code = "\n".join(c.source for c in nbfiles.read(nb).cells if c.cell_type == "code")
        out.append((str(nb.relative_to(ROOT)), code))
    return out


def device_property_names() -> set[str]:
    stub = Path(torch.__file__).parent / "_C" / "__init__.pyi"
    tree = ast.parse(stub.read_text(encoding="utf-8"))
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_CudaDeviceProperties"
    )
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    return names | {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}


def resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 1, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


USES = sorted({(m, src) for src, text in course_sources() for m in USE.findall(text)})


def test_property_stub_is_readable() -> None:
    names = device_property_names()
    assert "total_memory" in names and "multi_processor_count" in names
    assert "total_mem" not in names


@pytest.mark.parametrize(("dotted", "where"), USES, ids=[f"{w}:{d}" for d, w in USES])
def test_namespace_attribute_exists(dotted: str, where: str) -> None:
    assert resolves(dotted), f"{where} uses {dotted}, which this torch does not have"


def test_device_property_names_exist() -> None:
    names = device_property_names()
    bad = [
        (src, n) for src, text in course_sources() for n in PROPS.findall(text) if n not in names
    ]
    assert not bad, f"unknown CUDA device-property names: {bad} (known: {sorted(names)})"


def test_namespaces_scanned_exist() -> None:
    for ns in NAMESPACES:
        assert resolves(ns)
