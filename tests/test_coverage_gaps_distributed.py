"""Lines of helpers/distributed.py no other unit test ran: results, failure reports, filters (tests/gpu_only_lines.md).

No torchrun here: LaunchResult objects are built by hand, and the process cleanup runs on `sleep`.
"""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest
import torch
from pretty_text import pretty

from helpers import distributed as d
from helpers.scripts.common import READY_MARKER


def _result(**kw: object) -> d.LaunchResult:
    return d.LaunchResult(command=["torchrun"], nproc=3, backend="gloo", **kw)


def test_launch_result_text_says_ok_or_failed_and_why() -> None:
    ok = _result(returncode=0, lines=["a", "b"], seconds=1.25)
    assert str(ok) == "torchrun, 3 x gloo: ok, exit code 0, 1.2 s, 2 output lines"
    bad = _result(returncode=1, message="rank 2 failed first")
    assert str(bad).startswith("torchrun, 3 x gloo: FAILED, exit code 1")
    assert str(bad).endswith("\nrank 2 failed first")
    timed_out = _result(returncode=0, timed_out=True)
    assert "FAILED" in str(timed_out), "exit code 0 after a timeout is not ok"
    assert pretty(bad) == str(bad)


def test_seconds_until_the_first_marked_line_or_none() -> None:
    r = _result(
        lines=["hello", f"{READY_MARKER}: 3 rank(s)", READY_MARKER], line_times=[0.1, 0.7, 0.9]
    )
    assert r.seconds_until() == 0.7
    assert r.seconds_until("hello") == 0.1
    assert r.seconds_until("never printed") is None


def test_explain_interrupt_and_timeout_count_the_killed_processes() -> None:
    r = _result(interrupted=True, seconds=2.0, killed_pids=[1, 2, 3])
    assert d.explain_failure(r, 60) == (
        "Interrupted after 2.0 s: killed torchrun and its workers (3 processes)."
    )
    r = _result(timed_out=True, killed_pids=[1, 2])
    text = d.explain_failure(r, 7.5)
    assert "7.5 s timeout" in text and "(2 processes)" in text
    assert "pass a larger timeout=" in text, "the fix is named"


_REPORT = [
    "[rank1]: Traceback (most recent call last):",
    "[rank1]: ValueError: bad batch",
    "[rank0]: RuntimeError: Connection closed by peer",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "Root Cause (first observed failure):",
    "[0]:",
    "  rank      : 1 (local_rank: 1)",
    "  exitcode  : 1 (pid: 42)",
]


def test_explain_names_the_first_failed_rank_its_error_and_the_others() -> None:
    text = d.explain_failure(_result(returncode=1, lines=_REPORT, seconds=3.0), 60)
    assert text.startswith("torchrun exited with code 1 after 3.0 s: rank 1 failed first")
    assert "(exit code 1) with ValueError: bad batch" in text
    assert "The others then lost their peer (rank 0: RuntimeError: Connection closed" in text
    assert "ChildFailedError" not in text, "torchrun's own exception is not the cause"


def test_explain_a_rank_that_died_without_a_traceback() -> None:
    lines = [ln for ln in _REPORT if "ValueError" not in ln]
    text = d.explain_failure(_result(returncode=1, lines=lines), 60)
    assert "rank 1 failed first (exit code 1) without a Python traceback" in text
    assert "os._exit" in text


def test_explain_without_torchruns_report() -> None:
    text = d.explain_failure(_result(returncode=2, lines=["usage: torchrun ..."]), 60)
    assert "torchrun exited with code 2" in text and "a rank failed." in text
    assert "lost their peer" not in text


def test_hide_launcher_traceback_keeps_the_ranks_and_the_report() -> None:
    said: list[str] = []
    hide = d._HideLauncherTraceback(said.append)
    rank_tb = [
        "Traceback (most recent call last):",
        '  File "/x/ddp_train.py", line 3, in <module>',
        "ValueError: bad batch",
    ]
    launcher_tb = [
        "Traceback (most recent call last):",
        '  File "<frozen runpy>", line 198, in _run_module_as_main',
        '  File "/venv/torch/distributed/run.py", line 900, in main',
        "    raise ChildFailedError(",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "Root Cause (first observed failure):",
    ]
    for line in rank_tb + launcher_tb:
        hide(line)
    assert said[:3] == rank_tb, "a rank's traceback is shown whole"
    assert said[3:] == [
        "(torchrun's own traceback is hidden; its report follows)",
        "============================================================",
        "Root Cause (first observed failure):",
    ]


def test_hide_launcher_traceback_ends_at_the_report_rule() -> None:
    said: list[str] = []
    hide = d._HideLauncherTraceback(said.append)
    for line in [
        "Traceback (most recent call last):",
        '  File "<frozen runpy>", line 198, in _run_module_as_main',
        "    hidden",
        "=====",
        "after",
    ]:
        hide(line)
    assert said == ["(torchrun's own traceback is hidden; its report follows)", "=====", "after"]


def test_printer_goes_to_a_callable_the_notebook_or_nowhere(
    capsys: pytest.CaptureFixture[str],
) -> None:
    got: list[str] = []
    assert d._printer(got.append) == got.append
    d._printer(True)("to the notebook")
    d._printer(False)("dropped")
    assert capsys.readouterr().out == "to the notebook\n"
    assert isinstance(d._printer(True), d._HideLauncherTraceback)


def test_read_results_in_rank_order_and_says_what_is_missing(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(d.LaunchError, match="did not get as far as writing them"):
        d.read_results(tmp_path)
    for rank in (10, 2, 0):
        torch.save({"rank": rank}, tmp_path / f"rank{rank}.pt")
    assert [r["rank"] for r in d.read_results(tmp_path)] == [0, 2, 10]  # 10 after 2
    with pytest.raises(d.LaunchError, match="Expected 4 rank files in .*, found 3"):
        d.read_results(tmp_path, world_size=4)


def test_script_source_of_one_function_or_says_it_is_missing() -> None:
    assert d.script_source("exercise_check").startswith('"""')
    assert d.script_source("exercise_check", "run_task").startswith("def run_task(")
    with pytest.raises(
        d.LaunchError, match="exercise_check.py has no function or class named 'nope'"
    ):
        d.script_source("exercise_check", "nope")


def _sleep(seconds: float) -> subprocess.Popen:
    return subprocess.Popen(["sleep", str(seconds)], start_new_session=True)


def test_family_stop_kills_the_tree_on_timeout() -> None:
    proc = _sleep(60)
    family = d._Family(proc.pid, watch_sockets=False)
    result = _result(timed_out=True)
    family.stop(proc, result)
    assert result.killed_pids == [proc.pid]
    assert not d._alive(proc.pid)
    # returncode is not checked: psutil.wait_procs reaps the killed child, so Popen.wait then
    # reads 0 (reported to the lead); a timed-out result is FAILED whatever its code
    assert not result.ok


def test_family_stop_kills_an_orphan_left_after_torchrun_exited() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    family = d._Family(proc.pid, watch_sockets=False)
    orphan, quick = _sleep(60), _sleep(0.1)
    family.seen = {p.pid: psutil.Process(p.pid) for p in (orphan, quick)}
    proc.wait()
    result = _result()
    family.stop(proc, result)
    quick.wait()
    assert result.returncode == 0
    assert result.killed_pids == [orphan.pid], "one that ends by itself is not killed"
    assert not d._alive(orphan.pid)
    assert result.child_pids == sorted([orphan.pid, quick.pid])


def test_family_stop_with_nothing_left_kills_nothing() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    family = d._Family(proc.pid, watch_sockets=False)
    proc.wait()
    result = _result()
    family.stop(proc, result)
    assert result.killed_pids == [] and result.returncode == 0


def test_kill_tree_kills_what_ignores_sigterm() -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    stubborn = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert stubborn.stdout.readline().strip() == "ready"  # SIGTERM is ignored from here on
    assert d.kill_tree(None, [psutil.Process(stubborn.pid)], grace=0.3) == [stubborn.pid]
    assert not d._alive(stubborn.pid), "SIGKILL after the grace period"
    stubborn.stdout.close()
