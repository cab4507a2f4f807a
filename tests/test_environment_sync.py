"""requirements.txt, environment.yml and pyproject.toml describe the same environment."""

from __future__ import annotations

import re
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CONDA_NAMES = {"pytorch": "torch"}  # conda-forge name -> PyPI name
SPEC = re.compile(r"^([A-Za-z0-9_.\-]+)\s*(.*)$")


def parse(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if not line:
            continue
        name, spec = SPEC.match(line).groups()
        out[CONDA_NAMES.get(name.lower(), name.lower())] = spec.replace(" ", "")
    return out


def requirements() -> dict[str, str]:
    return parse((ROOT / "requirements.txt").read_text().splitlines())


def conda_env() -> dict[str, str]:
    items = []
    for raw in (ROOT / "environment.yml").read_text().splitlines():
        m = re.match(r"^\s*-\s+([^\s:].*)$", raw)
        if m and m.group(1) not in ("conda-forge",):
            items.append(m.group(1))
    deps = parse(items)
    deps.pop("python"), deps.pop("pip")
    return deps


def test_environment_matches_requirements() -> None:
    req, env = requirements(), conda_env()
    assert set(req) == set(env), (
        f"only in requirements.txt: {set(req) - set(env)}; only in environment.yml: {set(env) - set(req)}"
    )
    for name in req:
        assert req[name] == env[name], (
            f"{name}: requirements.txt says {req[name]!r}, environment.yml says {env[name]!r}"
        )


def test_package_runtime_dependencies_match_requirements() -> None:
    runtime = parse(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    req = requirements()
    for name, spec in runtime.items():
        assert req.get(name) == spec, (
            f"{name}: pyproject says {spec!r}, requirements.txt says {req.get(name)!r}"
        )


def test_torch_is_a_range_not_a_pin() -> None:
    spec = requirements()["torch"]
    assert spec.startswith(">=") and "==" not in spec, (
        "GPU users must be able to install requirements.txt as is"
    )
