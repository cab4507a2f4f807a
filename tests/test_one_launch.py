"""Several chapter 4 scripts in one torchrun launch (helpers/scripts/one_launch.py) and the
launcher's per-job view of its output (LaunchResult.jobs, job_lines, rank_lines, failures)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.launch import LaunchError, LaunchResult, launch, one_launch_args, read_results
from helpers.scripts import one_launch
from helpers.scripts.common import JOB_MARKER, READY_MARKER


def equal(a: object, b: object) -> bool:
    """Bit-identical results: tensors with torch.equal, containers item by item."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    return a == b


# --- the command line --------------------------------------------------------------------------


def test_split_jobs_at_then() -> None:
    argv = ["manual_allreduce", "--out", "A", "--then", "ddp_train", "--out", "B", "--epochs", "1"]
    assert one_launch.split_jobs(argv) == [
        ("manual_allreduce", ["--out", "A"]),
        ("ddp_train", ["--out", "B", "--epochs", "1"]),
    ]
    assert one_launch.split_jobs(["fsdp_vs_ddp"]) == [("fsdp_vs_ddp", [])]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        ([], "an empty job"),
        (["ddp_train", "--then"], "an empty job"),
        (["--then", "ddp_train"], "an empty job"),
        (["ddp_train", "--then", "--then", "fsdp_vs_ddp"], "an empty job"),
        (["elastic_train", "--out", "A"], "'elastic_train' cannot share a launch"),
        (["scaling"], "launch it on its own"),
        (["--out", "A"], "'--out' cannot share a launch"),
    ],
)
def test_split_jobs_refuses_what_cannot_run(argv: list[str], words: str) -> None:
    with pytest.raises(SystemExit, match=words) as info:
        one_launch.split_jobs(argv)
    assert "Usage: one_launch.py SCRIPT" in str(info.value)


def test_bad_options_name_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    jobs = [("manual_allreduce", ["--out", "A"]), ("ddp_train", ["--out", "B", "--nope", "1"])]
    with pytest.raises(SystemExit) as info:
        one_launch.parse_jobs(jobs)
    assert info.value.code == 2  # argparse's usage error
    assert (
        "one_launch.py ... ddp_train: error: unrecognized arguments: --nope 1"
        in capsys.readouterr().err
    )


def test_every_joinable_script_has_a_parser_and_a_run() -> None:
    parsed = one_launch.parse_jobs([(name, ["--out", "X"]) for name in one_launch.JOINABLE])
    for (module, args), name in zip(parsed, one_launch.JOINABLE):
        assert module.__name__ == f"helpers.scripts.{name}" and callable(module.run)
        assert args.out == Path("X") and args.pg_timeout > 0


def test_one_launch_args() -> None:
    jobs = [("manual_allreduce", ["--out", Path("/a"), "--seed", 0]), ("ddp_train", [])]
    words = one_launch_args(jobs)
    assert words == ["manual_allreduce", "--out", "/a", "--seed", "0", "--then", "ddp_train"]
    assert one_launch.split_jobs(words) == [
        ("manual_allreduce", ["--out", "/a", "--seed", "0"]),
        ("ddp_train", []),
    ]


@pytest.mark.parametrize(
    ("jobs", "words"),
    [
        ([], "No jobs"),
        ([("ddp_train", "--out A")], "a pair"),
        ([(["ddp_train"], [])], "a pair"),
    ],
)
def test_one_launch_args_refuses_bad_jobs(jobs: list, words: str) -> None:
    with pytest.raises(LaunchError, match=words):
        one_launch_args(jobs)


# --- reading one job's output ------------------------------------------------------------------


def result_with(lines: list[str]) -> LaunchResult:
    return LaunchResult(command=["torchrun"], nproc=2, backend="gloo", lines=lines)


def test_job_lines_split_the_output_at_the_markers() -> None:
    res = result_with(
        [
            f"{READY_MARKER}: 2 rank(s)",
            f"{JOB_MARKER} manual_allreduce",
            "[rank 0] averaged",
            f"{JOB_MARKER} ddp_train",
            "[rank 0] epoch 0",
            "[rank 1] a stray line",
            "warning from torch",
        ]
    )
    assert res.jobs() == ["manual_allreduce", "ddp_train"]
    assert res.job_lines("manual_allreduce") == ["[rank 0] averaged"]
    assert res.job_lines("ddp_train") == [
        "[rank 0] epoch 0",
        "[rank 1] a stray line",
        "warning from torch",
    ]
    assert res.rank_lines(0, "ddp_train") == ["[rank 0] epoch 0"]
    assert res.rank_lines(1, "manual_allreduce") == []
    assert res.rank_lines(0) == ["[rank 0] averaged", "[rank 0] epoch 0"]
    with pytest.raises(
        LaunchError, match=r"No job 'fsdp_vs_ddp'.*\['manual_allreduce', 'ddp_train'\]"
    ):
        res.job_lines("fsdp_vs_ddp")


def test_failures_read_torchruns_log() -> None:
    agent = "E1125 14:43:49.609000 3423 torch/distributed/elastic/multiprocessing/api.py:1002]"
    res = result_with(
        [
            f"{agent} failed (exitcode: 1) local_rank: 0 (pid: 3426) of binary: /usr/bin/python",
            "[rank 0] attempt 1: starting at step 4 of 12",
            f"{agent} failed (exitcode: -15) local_rank: 1 (pid: 3500) of binary: /usr/bin/python",
        ]
    )
    assert res.failures() == [(0, 1), (1, -15)]
    assert result_with(["[rank 0] finished"]).failures() == []


# --- real launches -----------------------------------------------------------------------------


def test_one_launch_gives_what_separate_launches_give(tmp_path: Path) -> None:
    manual = ["--per-rank-batch", 8, "--seed", 1]
    ddp = ["--samples", 256, "--per-rank-batch", 16, "--epochs", 2, "--accum", 2]
    jobs = [
        ("manual_allreduce", ["--out", tmp_path / "m1", *manual]),
        ("ddp_train", ["--out", tmp_path / "d1", *ddp]),
    ]
    res = launch("one_launch", 2, one_launch_args(jobs), backend="gloo", echo=False)
    assert res.ok and res.jobs() == ["manual_allreduce", "ddp_train"]
    assert sum(READY_MARKER in ln for ln in res.lines) == 1, "the ranks joined once"
    assert res.rank_lines(0, "ddp_train") and not res.rank_lines(1, "ddp_train")
    for name, args in [("manual_allreduce", manual), ("ddp_train", ddp)]:
        alone = tmp_path / f"{name}-alone"
        launch(name, 2, ["--out", alone, *args], backend="gloo", echo=False)
        together = tmp_path / ("m1" if name == "manual_allreduce" else "d1")
        merged, separate = read_results(together, 2), read_results(alone, 2)
        for rank in (*merged, *separate):
            rank.pop("checkpoint", None)  # the path of the file, which differs by folder
        assert equal(merged, separate), f"{name}: one launch and its own launch differ"


def test_bad_options_stop_the_launch_before_the_ranks_join(tmp_path: Path) -> None:
    jobs = [("manual_allreduce", ["--out", tmp_path]), ("ddp_train", ["--out", tmp_path, "--nope"])]
    res = launch("one_launch", 2, one_launch_args(jobs), backend="gloo", echo=False, check=False)
    assert not res.ok and res.seconds_until(READY_MARKER) is None
    assert any("unrecognized arguments: --nope" in ln for ln in res.lines)
    assert not list(tmp_path.glob("rank*.pt")), "no job ran"
