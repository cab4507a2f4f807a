"""Set up from inside China (issue 32, section 3): `make lab` installs through the learner's mirror.

README.zh-CN.md tells a learner in mainland China to point pip at a PyPI mirror (PIP_INDEX_URL,
or `pip config set global.index-url ...`) and says that `make lab` honours it. These tests show
it, offline and in a few seconds:

- `make -n` (a dry run): no pip command of `make lab` / `make lab-zh` names an index of its own,
  skips the pip configuration or adds links; the one override is the documented `TORCH_INDEX`,
  on the torch line only;
- a real `make lab` against a tiny PyPI mirror served on 127.0.0.1: the venv's pip fetches from
  it what `make lab` asks for, both when the mirror is set with PIP_INDEX_URL and when it is in
  the user's pip.conf (written by `pip config set`), and with TORCH_INDEX the torch line alone
  goes to that index. The mirror holds only a probe package (`TORCH=course-mirror-probe`), so
  the install stops at requirements.txt's first name, after asking the mirror for it; every
  other host is behind a dead proxy, so nothing leaves the machine;
- every notebook's setup cell installs with a plain `%pip install` (no index of its own);
- the make targets, variables and mirror settings README.zh-CN.md gives exist.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ZH_README = ROOT / "README.zh-CN.md"
PROBE = "course-mirror-probe"  # not on PyPI: found only where a test index serves it
needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
INDEX_OPTIONS = re.compile(
    r"(?:^|\s)(?:-i|--index-url|--extra-index-url|--no-index|--isolated|-f|--find-links)(?:[\s=]|$)"
    r"|PIP_(?:INDEX_URL|EXTRA_INDEX_URL|CONFIG_FILE|FIND_LINKS|NO_INDEX|ISOLATED)="
)


def make_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment a learner's shell would give make: no pip settings but `extra`, a home of
    its own (so its user pip.conf is the test's), and a dead proxy for every host but 127.0.0.1."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PIP_")
        and k not in {"MAKEFLAGS", "MFLAGS", "MAKELEVEL", "VIRTUAL_ENV"}
        and k.lower() not in {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}
    }
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),
        XDG_CACHE_HOME=str(home / ".cache"),
        http_proxy=dead,
        https_proxy=dead,
        HTTP_PROXY=dead,
        HTTPS_PROXY=dead,
        no_proxy="127.0.0.1,localhost",
        NO_PROXY="127.0.0.1,localhost",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_CACHE_DIR="1",
        PIP_RETRIES="0",
        PIP_TIMEOUT="10",
        **extra,
    )
    return env


# ---------------------------------------------------------------------------------------------
# The dry run: what `make lab` would run


def pip_lines(*make_args: str, tmp_path: Path) -> list[str]:
    """The pip commands `make -n` prints for a fresh venv (so the install recipe is included)."""
    out = subprocess.run(
        ["make", "-n", "-C", str(ROOT), *make_args, f"VENV={tmp_path / 'no-venv'}"],
        capture_output=True,
        text=True,
        env=make_env(tmp_path, PIP_INDEX_URL="https://pypi.tuna.tsinghua.edu.cn/simple"),
        timeout=60,
        check=True,
    ).stdout
    lines = [line for line in out.splitlines() if "-m pip" in line]
    assert lines, f"make -n {' '.join(make_args)} printed no pip command:\n{out}"
    return lines


@needs_make
def test_make_lab_passes_no_index_of_its_own(tmp_path: Path) -> None:
    lines = pip_lines("lab", "lab-zh", tmp_path=tmp_path)
    assert len(lines) == 3, lines  # torch, requirements.txt + the course, the language pack
    for line in lines:
        assert not INDEX_OPTIONS.search(line), (
            f"`make lab` would bypass the learner's mirror (PIP_INDEX_URL, pip.conf): {line}"
        )


@needs_make
def test_torch_index_is_the_one_override_and_only_for_torch(tmp_path: Path) -> None:
    index = "https://mirror.nju.edu.cn/pytorch/whl/cpu"
    lines = pip_lines("lab", f"TORCH_INDEX={index}", tmp_path=tmp_path)
    overridden = [line for line in lines if INDEX_OPTIONS.search(line)]
    assert len(overridden) == 1, lines
    assert '"torch>=2.5,<3"' in overridden[0] and overridden[0].endswith(f"--index-url {index}")
    assert not any(INDEX_OPTIONS.search(line) for line in lines if line is not overridden[0])


def test_the_makefile_leaves_pip_settings_to_the_learner() -> None:
    """No `export`/`unexport` of pip settings; the one PIP_CONFIG_FILE is the newest-torch lane's."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert not re.search(r"^\s*(?:export|unexport)\b.*PIP_", text, re.M)
    uses = [line for line in text.splitlines() if "PIP_CONFIG_FILE" in line]
    assert uses and all("NEWEST_PIP_ENV" in line or line.lstrip().startswith("#") for line in uses)
    recipe = re.search(r"^\$\(VENV\)/\.installed:.*\n((?:\t.*\n)+)", text, re.M)
    assert recipe and "NEWEST_PIP_ENV" not in recipe[1], "make lab's install reads pip's config"


# ---------------------------------------------------------------------------------------------
# The real thing: `make lab` against a mirror on 127.0.0.1


def wheel_bytes(where: str) -> bytes:
    """course_mirror_probe 1.0, a pure-Python wheel whose module says which index served it."""
    files = {
        "course_mirror_probe/__init__.py": f"WHERE = {where!r}\n",
        "course_mirror_probe-1.0.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: 1.0\n"
        ),
        "course_mirror_probe-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: tests/test_mirror_setup.py\n"
            "Root-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for name, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("course_mirror_probe-1.0.dist-info/RECORD,,")
    files["course_mirror_probe-1.0.dist-info/RECORD"] = "\n".join(record) + "\n"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return buffer.getvalue()


def write_index(folder: Path, where: str) -> None:
    """A PEP 503 simple index with one project, the probe (what a mirror's /simple/ looks like)."""
    wheel = "course_mirror_probe-1.0-py3-none-any.whl"
    data = wheel_bytes(where)
    project = folder / PROBE
    project.mkdir(parents=True)
    (project / wheel).write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    (project / "index.html").write_text(
        f'<!DOCTYPE html><html><body><a href="{wheel}#sha256={sha}">{wheel}</a></body></html>\n'
    )


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """Two indexes on 127.0.0.1 (a PyPI mirror, /mirror/simple/, and a torch index, /torch/):
    (base URL, the paths pip asked for)."""
    root = tmp_path / "www"
    write_index(root / "mirror" / "simple", "mirror")
    write_index(root / "torch", "torch index")
    asked: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            asked.append(self.path)
            super().do_GET()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(Handler, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()


def requirement_names() -> set[str]:
    names = {"setuptools"}  # pyproject's build backend, which pip installs to build the course
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].split(";")[0].strip()
        if line:
            names.add(re.split(r"[<>=!~\[ ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def run_make_lab(tmp_path: Path, env: dict[str, str], *make_args: str) -> tuple[Path, str]:
    """`make lab` with the probe for torch, into a fresh venv; (the venv, make's output)."""
    venv = tmp_path / "venv"
    proc = subprocess.Popen(
        ["make", "-C", str(ROOT), "lab", f"VENV={venv}", f"PYTHON={sys.executable}",
         f"TORCH={PROBE}", *make_args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"make lab did not stop at the mirror's missing packages:\n{out}")
    # The mirror has only the probe: the install must stop after the torch line.
    assert proc.returncode != 0, f"make lab installed everything from a one-package mirror?\n{out}"
    assert not (venv / ".installed").exists()
    assert "pypi.org" not in out and "pythonhosted" not in out, f"pip left the mirror:\n{out}"
    return venv, out


def served_by(venv: Path) -> str:
    """Which test index the probe in `venv` came from."""
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import course_mirror_probe as p; print(p.WHERE)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()


def asked_for_requirements(asked: list[str], prefix: str) -> set[str]:
    return {
        path[len(prefix) :].strip("/")
        for path in asked
        if path.startswith(prefix) and path[len(prefix) :].strip("/") in requirement_names()
    }


@needs_make
def test_make_lab_installs_from_pip_index_url(
    tmp_path: Path, mirror: tuple[str, list[str]]
) -> None:
    """PIP_INDEX_URL=<mirror> make lab: both install lines ask the mirror, nothing else."""
    url, asked = mirror
    env = make_env(tmp_path, PIP_INDEX_URL=f"{url}/mirror/simple/")
    venv, out = run_make_lab(tmp_path, env)
    assert served_by(venv) == "mirror", out
    assert f"/mirror/simple/{PROBE}/" in asked, asked
    assert asked_for_requirements(asked, "/mirror/simple/"), (
        f"requirements.txt's line did not ask the mirror: {asked}\n{out}"
    )
    assert not [p for p in asked if not p.startswith("/mirror/simple/")], asked


@needs_make
def test_make_lab_installs_from_pip_conf_and_torch_index(
    tmp_path: Path, mirror: tuple[str, list[str]]
) -> None:
    """`pip config set global.index-url <mirror>`, then make lab TORCH_INDEX=<torch index>:
    torch from the torch index, everything else from the mirror in pip.conf."""
    url, asked = mirror
    env = make_env(tmp_path)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "config",
            "--user",
            "set",
            "global.index-url",
            f"{url}/mirror/simple/",
        ],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    conf = Path(env["XDG_CONFIG_HOME"]) / "pip" / "pip.conf"
    assert f"index-url = {url}/mirror/simple/" in conf.read_text(), "pip config set wrote elsewhere"
    venv, out = run_make_lab(tmp_path, env, f"TORCH_INDEX={url}/torch/")
    assert served_by(venv) == "torch index", out
    assert f"/torch/{PROBE}/" in asked and f"/mirror/simple/{PROBE}/" not in asked, asked
    assert asked_for_requirements(asked, "/mirror/simple/"), (
        f"requirements.txt's line did not ask the mirror in pip.conf: {asked}\n{out}"
    )


# ---------------------------------------------------------------------------------------------
# The notebooks' setup cell, and what README.zh-CN.md says


def setup_cells() -> Iterator[tuple[str, str]]:
    for path in sorted(ROOT.rglob("*.ipynb")):
        rel = path.relative_to(ROOT)
        if any(part.startswith(".") or part in {"executed", "gpu-check"} for part in rel.parts):
            continue
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        for cell in cells:
            source = "".join(cell["source"])
            if cell["cell_type"] == "code" and "COURSE_REPO = " in source:
                yield rel.as_posix(), source
                break


def test_every_setup_cell_installs_with_a_plain_pip() -> None:
    """The setup cell's %pip reads the same PIP_INDEX_URL / pip.conf as a terminal's pip."""
    found = dict(setup_cells())
    assert "templates/chapter_template.ipynb" in found and any(k.startswith("zh/") for k in found)
    for rel, source in found.items():
        installs = [line for line in source.splitlines() if re.search(r"[%!]\s*pip\b", line)]
        assert installs, f"{rel}: the setup cell installs nothing"
        for line in installs:
            assert not INDEX_OPTIONS.search(line), f"{rel}: the setup cell names an index: {line}"


def zh_readme_commands() -> list[list[str]]:
    """Every `make ...` command in README.zh-CN.md's code blocks, split as a shell would."""
    text = ZH_README.read_text(encoding="utf-8")
    commands = []
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
        if language not in {"bash", "sh", "powershell", ""}:
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            tokens = list(lexer)
            starts = [0] + [i + 1 for i, t in enumerate(tokens) if t in {"&&", "||", ";", "|"}]
            for start in starts:
                words = tokens[start:]
                while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                    words = words[1:]  # VAR=value make ...
                if words[:1] == ["make"]:
                    end = [i for i, t in enumerate(words) if t in {"&&", "||", ";", "|"}]
                    commands.append(words[1 : end[0] if end else None])
    return commands


def test_zh_readme_make_commands_exist() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z0-9-]+):", makefile, re.M))
    variables = set(re.findall(r"^([A-Z0-9_]+)\s*[?:]?=", makefile, re.M))
    commands = zh_readme_commands()
    assert {"lab", "lab-zh", "set-repo"} <= {w for c in commands for w in c}
    for words in commands:
        for word in words:
            if "=" in word:
                assert word.split("=")[0] in variables, (
                    f"README.zh-CN.md: make {word}: no such variable"
                )
            else:
                assert word in targets, f"README.zh-CN.md: make {word}: no such target"


def test_zh_readme_covers_setting_up_from_inside_china() -> None:
    text = ZH_README.read_text(encoding="utf-8")
    for needed in (
        "PIP_INDEX_URL",  # a PyPI mirror, for one command
        "pip config set global.index-url https://pypi.tuna.tsinghua.edu.cn/simple",
        ".condarc",  # a conda mirror
        "custom_channels",
        "TORCH_INDEX=",  # PyTorch's own index, or a mirror of it
        "environment.yml",
        "make set-repo",
        "fonts-noto-cjk",  # the CJK font on a machine the course did not set up
        "get_cachedir",  # matplotlib's font cache
        "tests/test_mirror_setup.py",  # where the claim that make lab honours a mirror is tested
    ):
        assert needed in text, f"README.zh-CN.md does not say {needed!r}"
    english = (ROOT / "README.md").read_text(encoding="utf-8")
    for index in re.findall(r"TORCH_INDEX=(https://download\.pytorch\.org/whl/\w+)", english):
        assert index in text, f"README.zh-CN.md lacks the English README's {index}"
