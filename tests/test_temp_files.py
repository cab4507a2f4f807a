"""The course leaves nothing in the system temp folder (issue 24 item 7).

Every torchrun launch used to leave a `torchelastic_*` folder there (28 after one pass of the
chapters and benchmarks on the H100 run of 2026-11-26), and chapter 5 kept its memory
snapshots in `<temp>/gpu_course_ch05`. Each test here runs the real thing with TMPDIR pointing
at an empty folder of its own and checks that the folder is empty afterwards.

One thing is allowed, and only this: `torchinductor_<user>`, torch's persistent compile cache.
torch creates it by design (DistributedDataParallel makes the empty folder even when nothing
is compiled), and it is a cache, not a leftover: it is meant to outlive the run, so that the
next `torch.compile` of the same graph is fast (chapter 7 times compilation with it warm and
cold). Triton's cache lives in the home folder (~/.triton), not in the temp folder.

The whole test suite runs with TMPDIR pointing at a private folder too (tests/temp_guard.py),
which fails the session if anything but that cache is left there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
#: What may stay in the temp folder after a run: torch's compile cache (see the docstring).
ALLOWED = re.compile(r"torchinductor_[\w.-]+")


def leftovers(folder: Path) -> list[str]:
    """What a run left in its temp folder, besides the allowed compile cache."""
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if not any(ALLOWED.fullmatch(part) for part in p.relative_to(folder).parts)
    )


def run_with_temp(command: list[str], temp: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run a command from the repository root with TMPDIR (and TMP, TEMP) set to `temp`."""
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "TMP": str(temp), "TEMP": str(temp)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


LAUNCH = """
from helpers.launch import launch, new_run_dir
out = new_run_dir("temp_test")
result = launch("ddp_train", 2, ["--samples", "64", "--epochs", "1", "--out", str(out)],
                backend="gloo", timeout=240, echo=False)
print(result)
"""


def test_a_launch_leaves_nothing_in_the_temp_folder(tmp_path: Path) -> None:
    temp = tmp_path / "temp"
    done = run_with_temp([sys.executable, "-c", LAUNCH], temp, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok, exit code 0" in done.stdout
    assert leftovers(temp) == [], "torchrun's torchelastic_* folder, or the run folder, was left"


def test_a_failed_launch_leaves_nothing_in_the_temp_folder(tmp_path: Path) -> None:
    temp = tmp_path / "temp"
    bad = LAUNCH.replace('"--epochs", "1"', '"--epochs", "1", "--no-such-option"')
    done = run_with_temp([sys.executable, "-c", bad], temp, timeout=300)
    assert done.returncode != 0 and "LaunchError" in done.stderr, done.stdout + done.stderr
    assert leftovers(temp) == [], "a failed launch leaves its error files behind"


def test_a_notebook_that_launches_leaves_nothing_in_the_temp_folder(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    }
    nb.cells = [nbformat.v4.new_code_cell(LAUNCH)]
    path = tmp_path / "launches.ipynb"
    nbformat.write(nb, path)
    temp = tmp_path / "temp"
    command = [sys.executable, str(ROOT / "tools" / "run_all.py"), str(path)]
    command += ["--out", str(tmp_path / "executed"), "--no-html", "--no-describe"]
    done = run_with_temp(command, temp, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert leftovers(temp) == [], "the kernel's run folder or torchrun's logs were left"


def test_a_benchmark_that_launches_leaves_nothing_in_the_temp_folder(tmp_path: Path) -> None:
    temp = tmp_path / "temp"
    script = ROOT / "benchmarks" / "ch04_scaling.py"
    command = [sys.executable, str(script), "--max-procs", "2", "--repeats", "1", "--steps", "5"]
    done = run_with_temp(command, temp, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert leftovers(temp) == [], "ch04_scaling.py's launches left files in the temp folder"


#: The places that create something in the temp folder on purpose, each removing it again:
#: file -> what removes it. A new one must clean up and be listed here (or use a
#: `with tempfile.TemporaryDirectory():` block, which removes itself).
CLEANED_UP = {
    "helpers/launch.py": "the rendezvous folder: shutil.rmtree in launch()'s finally; run "
    "folders: atexit, and new_run_dir() removes this user's that are over a day old",
    "helpers/checks/ch04.py": "shutil.rmtree in run_in_process()'s finally",
    "helpers/checks/ch08_parallel.py": "shutil.rmtree in run_at_world_one()'s finally",
    "helpers/capstone.py": "use_fresh_compile_cache: its folder is removed at exit (atexit); "
    "gettempdir only names torch's own compile cache, to say whether it is warm",
}
MAKES_TEMP = re.compile(r"tempfile\.(gettempdir|mkdtemp|mkstemp|NamedTemporaryFile|mktemp)\b")


def course_sources() -> list[Path]:
    """Every Python file and notebook the course runs (tests excluded)."""
    found = []
    for folder in ("helpers", "benchmarks", "tools", "notebooks", "solutions", "exercises"):
        found += sorted((ROOT / folder).rglob("*.py")) + sorted((ROOT / folder).rglob("*.ipynb"))
    return [p for p in found if ".ipynb_checkpoints" not in p.parts]


def test_nothing_else_writes_to_the_temp_folder_without_cleaning_up() -> None:
    found = {}
    for path in course_sources():
        text = path.read_text(encoding="utf-8")
        if MAKES_TEMP.search(text):
            found[path.relative_to(ROOT).as_posix()] = sorted(set(MAKES_TEMP.findall(text)))
    unexpected = {k: v for k, v in found.items() if k not in CLEANED_UP}
    assert not unexpected, (
        f"these write to the system temp folder: {unexpected}. Use `with "
        "tempfile.TemporaryDirectory():`, or a folder under runs/ (git-ignored) for files the "
        "learner should keep, or remove what you make and list the file in CLEANED_UP"
    )
