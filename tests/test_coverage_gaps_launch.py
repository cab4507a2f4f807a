"""Lines of helpers/launch.py no other unit test ran: results, failure reports, filters (tests/gpu_only_lines.md).

No torchrun here: LaunchResult objects are built by hand.
"""

from __future__ import annotations

import pytest
import torch
from pretty_text import pretty

from helpers.launch import (
    LaunchError,
    LaunchResult,
    _HideLauncherTraceback,
    explain_failure,
    read_results,
    script_source,
)
from helpers.scripts.common import READY_MARKER


def _result(**kw: object) -> LaunchResult:
    return LaunchResult(command=["torchrun"], nproc=3, backend="gloo", **kw)


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
    assert explain_failure(r, 60) == (
        "Interrupted after 2.0 s: killed torchrun and its workers (3 processes)."
    )
    r = _result(timed_out=True, killed_pids=[1, 2])
    text = explain_failure(r, 7.5)
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
    text = explain_failure(_result(returncode=1, lines=_REPORT, seconds=3.0), 60)
    assert text.startswith("torchrun exited with code 1 after 3.0 s: rank 1 failed first")
    assert "(exit code 1) with ValueError: bad batch" in text
    assert "The others then lost their peer (rank 0: RuntimeError: Connection closed" in text
    assert "ChildFailedError" not in text, "torchrun's own exception is not the cause"


def test_explain_a_rank_that_died_without_a_traceback() -> None:
    lines = [ln for ln in _REPORT if "ValueError" not in ln]
    text = explain_failure(_result(returncode=1, lines=lines), 60)
    assert "rank 1 failed first (exit code 1) without a Python traceback" in text
    assert "os._exit" in text


def test_explain_without_torchruns_report() -> None:
    text = explain_failure(_result(returncode=2, lines=["usage: torchrun ..."]), 60)
    assert "torchrun exited with code 2" in text and "a rank failed." in text
    assert "lost their peer" not in text


def test_hide_launcher_traceback_keeps_the_ranks_and_the_report() -> None:
    said: list[str] = []
    hide = _HideLauncherTraceback(said.append)
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
    hide = _HideLauncherTraceback(said.append)
    for line in [
        "Traceback (most recent call last):",
        '  File "<frozen runpy>", line 198, in _run_module_as_main',
        "    hidden",
        "=====",
        "after",
    ]:
        hide(line)
    assert said == ["(torchrun's own traceback is hidden; its report follows)", "=====", "after"]


def test_read_results_in_rank_order_and_says_what_is_missing(tmp_path) -> None:  # noqa: ANN001
    with pytest.raises(LaunchError, match="did not get as far as writing them"):
        read_results(tmp_path)
    for rank in (10, 2, 0):
        torch.save({"rank": rank}, tmp_path / f"rank{rank}.pt")
    assert [r["rank"] for r in read_results(tmp_path)] == [0, 2, 10]  # 10 after 2
    with pytest.raises(LaunchError, match="Expected 4 rank files in .*, found 3"):
        read_results(tmp_path, world_size=4)


def test_script_source_of_one_function_or_says_it_is_missing() -> None:
    assert script_source("exercise_check").startswith('"""')
    assert script_source("exercise_check", "run_task").startswith("def run_task(")
    with pytest.raises(
        LaunchError, match="exercise_check.py has no function or class named 'nope'"
    ):
        script_source("exercise_check", "nope")
