"""Instructor mode (tools/run_all.py): executed copies, HTML, a report, and a failing exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest
import run_all

import nbfiles

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "templates" / "chapter_template.ipynb"


def broken_notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    }
    nb.cells = [
        nbformat.v4.new_code_cell("print('first cell runs')"),
        nbformat.v4.new_code_cell("raise ValueError('this notebook is broken on purpose')"),
        nbformat.v4.new_code_cell("print('never reached')"),
    ]
    path = folder / "broken.ipynb"
    nbformat.write(nb, path)
    return path


def test_executes_writes_html_and_reports_failures(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "executed"
    broken = broken_notebook(tmp_path)
    status = run_all.main([str(TEMPLATE), str(broken), "--out", str(out), "--device", "cpu"])
    assert status == 1, "a failing notebook must make the command fail"
    executed = nbfiles.read(out / "templates" / "chapter_template.ipynb")
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "every cell of the template ran"
    assert any(c.outputs for c in code), "the executed copy keeps its outputs"
    page = (out / "templates" / "chapter_template.html").read_text()
    assert "<html" in page and "describe_device" in page
    failed = nbfiles.read(out / "broken.ipynb")
    assert failed.cells[0].outputs and failed.cells[1].outputs[0].output_type == "error"
    assert not failed.cells[2].outputs, "nothing runs after the failing cell"
    summary = (out / "summary.md").read_text()
    assert "| templates/chapter_template.ipynb | ok |" in summary
    assert "FAILED: cell 1: ValueError: this notebook is broken on purpose" in summary
    assert "2 notebooks, 1 failed" in summary
    assert "chapter_template.html" in (out / "index.html").read_text()
    data = json.loads((out / "results.json").read_text())
    assert [(n["path"].endswith("broken.ipynb"), n["ok"]) for n in data["notebooks"]] == [
        (False, True),
        (True, False),
    ]
    assert "ValueError" in data["notebooks"][1]["error"] and "torch" in data["machine"]
    printed = capsys.readouterr().out
    assert "device" in printed and "FAILED" in printed
    assert printed.rstrip().endswith("notebooks: 1 passed, 1 failed"), "the plain count line"


def test_default_selection_is_the_chapters() -> None:
    chosen = run_all.select([], [])
    assert chosen == sorted(ROOT.glob("notebooks/[0-9][0-9]_*.ipynb"))
    with_all = run_all.select([], ["solutions", "exercises"])
    assert set(chosen) < set(with_all) or not (ROOT / "solutions").glob("*.ipynb")


def test_bad_input_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not a notebook"):
        run_all.main([str(tmp_path / "missing.ipynb")])
    with pytest.raises(SystemExit) as exc:
        run_all.main(["--timeout", "0", str(TEMPLATE)])
    assert exc.value.code == 2


def test_a_solution_whose_check_fails_fails_the_run(tmp_path: Path) -> None:
    folder = tmp_path / "solutions"
    folder.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("print('✅ Exercise 1: correct.')"),
        nbformat.v4.new_code_cell("print('❌ Exercise 2: the 3-rank run failed.')"),
    ]
    nbformat.write(nb, folder / "99_demo_solutions.ipynb")
    nbformat.write(nb, tmp_path / "99_demo_exercises.ipynb")  # not a solution: ❌ is expected
    out = tmp_path / "executed"
    paths = [str(folder / "99_demo_solutions.ipynb"), str(tmp_path / "99_demo_exercises.ipynb")]
    assert run_all.main([*paths, "--out", str(out), "--no-html", "--device", "cpu"]) == 1
    data = json.loads((out / "results.json").read_text())
    solution, exercise = data["notebooks"]
    assert not solution["ok"] and exercise["ok"]
    assert "cell 1: a check of the solution failed: ❌ Exercise 2" in solution["error"]


def notebook(folder: Path, name: str, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    }
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    path = folder / name
    nbformat.write(nb, path)
    return path


SLOW_CELL = "import time\nprint('slow cell started', flush=True)\ntime.sleep(120)"
DEAF_CELL = (  # a cell that ignores the interrupt: the runner must give up on it, then go
    "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "print('slow cell started', flush=True)\ntime.sleep(120)"
)


def stop_mid_cell(tmp_path: Path, first_cell: str) -> tuple[int, float, list[int], Path]:
    """Run run_all on [slow, next] in its own session; SIGTERM its group mid-cell, as
    gpu_check's timeout does. (exit code, seconds to exit, kernel pids, out folder)."""
    slow = notebook(tmp_path, "slow.ipynb", "print('cell 0')", first_cell, "print('cell 2')")
    after = notebook(tmp_path, "after.ipynb", "print('never run')")
    out = tmp_path / "executed"
    command = [sys.executable, str(ROOT / "tools" / "run_all.py"), str(slow), str(after)]
    proc = subprocess.Popen(
        [*command, "--out", str(out), "--no-html", "--no-describe", "--device", "cpu"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        kernels: list[int] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not kernels:  # the kernel runs cell 1
            kernels = [
                p.pid
                for p in psutil.Process(proc.pid).children()
                if "ipykernel" in " ".join(p.cmdline())
            ]
            time.sleep(0.2)
        assert kernels, "run_all started no kernel"
        kernel_log = out / "slow.kernel.log"
        time.sleep(3)  # cell 0 done, cell 1 sleeping (kernel start-up on a busy 2-core machine)
        assert kernel_log.exists()
        start = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        return proc.returncode, time.monotonic() - start, kernels, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("cell", [SLOW_CELL, DEAF_CELL], ids=["interruptible", "deaf-to-sigint"])
def test_a_stopped_runner_names_the_notebook_marks_the_rest_and_leaves_no_kernel(
    tmp_path: Path, cell: str
) -> None:
    # Before: nbclient's own SIGTERM handler shut the kernel down and carried on, so the
    # notebook failed with a bare "AssertionError:" and the next one started (exercise 6 on
    # the H100 run of 2026-11-26).
    code, seconds, kernels, out = stop_mid_cell(tmp_path, cell)
    assert code == 128 + signal.SIGTERM, f"exit code {code}"
    # interrupt grace + shutdown wait + the leftovers' grace, with room for a loaded machine
    assert seconds < run_all.INTERRUPT_GRACE_S + run_all.SHUTDOWN_WAIT_S + 20, seconds
    assert not run_all_alive(kernels), "the kernel was left behind"
    data = json.loads((out / "results.json").read_text())
    slow, after = data["notebooks"]
    assert slow["status"] == "stopped" and after["status"] == "not run"
    assert slow["error"] == "stopped by SIGTERM (deadline/timeout) in cell 1"
    assert "AssertionError" not in json.dumps(data)
    summary = (out / "summary.md").read_text()
    assert "| slow.ipynb | STOPPED: stopped by SIGTERM (deadline/timeout) in cell 1 |" in summary
    assert "| after.ipynb | not run: the run was stopped by SIGTERM (deadline/timeout) |" in summary
    executed = nbfiles.read(out / "slow.ipynb")
    assert "cell 0" in executed.cells[0].outputs[0]["text"], "the executed copy is written"
    assert not (out / "after.ipynb").exists()


def run_all_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_an_error_outside_every_cell_comes_with_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # What nbclient raised on the H100 (exercise 6): a bare assert inside nbclient, not a cell
    async def broken(self, cell, cell_index, *args, **kwargs):  # noqa: ANN001, ANN202
        assert self.kc is None

    monkeypatch.setattr(run_all.NotebookClient, "async_execute_cell", broken)
    path = notebook(tmp_path, "fine.ipynb", "print('fine')")
    out = tmp_path / "executed"
    assert run_all.main([str(path), "--out", str(out), "--no-html", "--no-describe"]) == 1
    data = json.loads((out / "results.json").read_text())
    (entry,) = data["notebooks"]
    assert entry["status"] == "failed"
    assert entry["error"].startswith("AssertionError in nbclient or the kernel, not in a cell")
    assert "in broken" in entry["traceback"] and "assert self.kc is None" in entry["traceback"]
    summary = (out / "summary.md").read_text()
    assert "Traceback of fine.ipynb (not a cell's error):" in summary
    assert "assert self.kc is None" in summary
    assert "assert self.kc is None" in capsys.readouterr().out, "the log has it too"


def test_runs_where_an_event_loop_already_runs(tmp_path: Path) -> None:
    # A test process that used playwright's sync API (tests/browser) has a loop running in the
    # main thread; run_all then runs the notebook on its own loop in a thread of its own.
    import asyncio

    broken = broken_notebook(tmp_path)

    async def inside_a_loop() -> run_all.Outcome:
        return run_all.execute(broken, tmp_path / "out", timeout=120, html_export=False)

    # In a thread of its own: the suite's main thread may have a loop running already.
    outcomes: list = []
    runner = threading.Thread(target=lambda: outcomes.append(asyncio.run(inside_a_loop())))
    runner.start()
    runner.join()
    assert outcomes[0].error.startswith("cell 1: ValueError: this notebook is broken on purpose")


def test_a_process_the_kernel_leaves_running_is_stopped_and_reported(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    }
    code = "import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\nprint(child.pid)"
    nb.cells = [nbformat.v4.new_code_cell(code)]
    path = tmp_path / "leaves_a_child.ipynb"
    nbformat.write(nb, path)
    outcome = run_all.execute(path, tmp_path / "out", timeout=120, html_export=False)
    executed = nbfiles.read(tmp_path / "out" / "leaves_a_child.ipynb")
    pid = int(executed.cells[0].outputs[0]["text"].strip())
    assert outcome.ok and "left running" in outcome.note and str(pid) in outcome.result()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
