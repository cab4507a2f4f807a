"""The chapter 4 launcher (helpers.launch), its scripts, and the Slurm example.

Launches use 2 gloo processes on the CPU, like the notebook on a machine without 2 GPUs.
Each costs a few seconds (torch is imported by torchrun and by every rank).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch
from torch import nn

from helpers.data import make_classification_data
from helpers.launch import (
    SCRIPTS_DIR,
    TINY_JOB_RANKS,
    LaunchError,
    LaunchResult,
    _HideLauncherTraceback,
    as_flags,
    available_scripts,
    check_backend,
    check_nproc,
    explain_failure,
    launch,
    max_processes,
    new_run_dir,
    read_results,
    script_path,
    script_source,
    torchrun_command,
    worker_env,
)
from helpers.models import make_mlp
from helpers.processes import alive_pids, gpu_count
from helpers.scripts import elastic_train
from helpers.scripts.common import BACKEND_ENV, READY_MARKER

ROOT = Path(__file__).resolve().parent.parent
SBATCH = ROOT / "slurm" / "torchrun_multinode.sbatch"
SCRIPTS = {"manual_allreduce", "ddp_train", "fsdp_vs_ddp", "scaling", "elastic_train", "one_launch"}


@pytest.fixture(scope="module")
def torchrun_help() -> str:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--help"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout


def launch2(script: str, args: list, **kw) -> LaunchResult:
    kw.setdefault("echo", False)
    kw.setdefault("backend", "gloo")
    kw.setdefault("timeout", 120)
    return launch(script, 2, args, **kw)


def close(a: list[torch.Tensor], b: list[torch.Tensor], scale: float = 1.0) -> bool:
    return all(torch.allclose(x, y * scale, rtol=1e-5, atol=1e-6) for x, y in zip(a, b))


# --- the scripts are shipped and findable ----------------------------------------------------


def test_scripts_ship_inside_the_package() -> None:
    assert SCRIPTS | {"exercise_check"} <= set(available_scripts())
    assert (SCRIPTS_DIR / "__init__.py").is_file(), "helpers/scripts must be a package"
    for name in available_scripts():
        path = script_path(name)
        assert path.parent == SCRIPTS_DIR and path.suffix == ".py"
        compile(path.read_text(), str(path), "exec")
    assert script_path(str(script_path("scaling"))) == script_path("scaling")


def test_missing_script_says_which_exist() -> None:
    with pytest.raises(FileNotFoundError, match="manual_allreduce"):
        script_path("no_such_script")
    with pytest.raises(FileNotFoundError, match="No script"):
        launch("/tmp/definitely/not/here.py", 2, echo=False)


def test_script_source_and_flags() -> None:
    src = script_source("manual_allreduce", "average_gradients")
    assert src.startswith("def average_gradients") and "all_reduce" in src
    with pytest.raises(LaunchError, match="no function"):
        script_source("manual_allreduce", "nope")
    assert as_flags({"per_rank_batch": 32, "hang": True, "x": False, "y": None}) == [
        "--per-rank-batch",
        "32",
        "--hang",
    ]


# --- bad input is refused before anything starts ----------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"nproc": 10_000}, "more than this machine allows"),
        ({"nproc": 0}, "nproc must be > 0"),
        ({"nproc": -2}, "nproc must be > 0"),
        ({"nproc": 1.5}, "whole number"),
        ({"nproc": True}, "whole number"),
        ({"backend": "mpi"}, "Unknown backend"),
        ({"timeout": 0}, "timeout must be a positive"),
        ({"max_restarts": -1}, "max_restarts"),
    ],
)
def test_bad_input_is_refused(kwargs: dict, words: str) -> None:
    before = set(psutil.Process().children(recursive=True))
    args = {"nproc": 2, "backend": "gloo", "echo": False, **kwargs}
    with pytest.raises(LaunchError, match=words):
        launch("manual_allreduce", args.pop("nproc"), **args)
    assert set(psutil.Process().children(recursive=True)) <= before, "nothing may be started"


def test_too_many_processes_names_the_limit() -> None:
    limit = max_processes("gloo")
    assert limit >= 2
    with pytest.raises(LaunchError, match=rf"nproc <= {limit}"):
        check_nproc(limit + 1, "gloo")
    assert check_nproc(limit, "gloo") == limit


def test_a_tiny_gloo_job_may_start_three_ranks_anywhere() -> None:
    top = max(max_processes("gloo"), TINY_JOB_RANKS)
    assert check_nproc(TINY_JOB_RANKS, "gloo", tiny_job=True) == TINY_JOB_RANKS
    with pytest.raises(LaunchError, match=rf"nproc <= {top}"):
        check_nproc(top + 1, "gloo", tiny_job=True)


@pytest.mark.skipif(gpu_count() > 0, reason="needs a machine without GPUs")
def test_nccl_without_gpus_is_refused() -> None:
    with pytest.raises(LaunchError, match="needs CUDA"):
        check_backend("nccl")
    assert check_backend(None, 2) == "gloo"


def test_tcp_rendezvous_command_and_loopback() -> None:
    cmd = torchrun_command("x.py", 2, ["--a", 1], rdzv_endpoint="127.0.0.1:29500")
    assert "--rdzv-endpoint=127.0.0.1:29500" in cmd and cmd[-3:] == ["x.py", "--a", "1"]
    env = worker_env("gloo", 2)
    assert env[BACKEND_ENV] == "gloo" and int(env["OMP_NUM_THREADS"]) >= 1
    addrs = psutil.net_if_addrs().items()
    lo = [name for name, a in addrs if any(x.address == "127.0.0.1" for x in a)]
    if lo and "GLOO_SOCKET_IFNAME" not in os.environ:
        assert env["GLOO_SOCKET_IFNAME"] == lo[0], "gloo's sockets stay on loopback"


def test_each_rank_gets_the_threads_asked_for_whatever_the_parent_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The H200 run of 2026-11-28: the GPU check exported MKL_NUM_THREADS=5, torch took it over
    # OMP_NUM_THREADS=1, and chapter 4's "one thread per rank" table ran 5 per rank.
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    env = worker_env("gloo", 2, threads=1)
    assert all(
        env[v] == "1" for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    )
    res = launch2("manual_allreduce", ["--out", tmp_path, "--per-rank-batch", 8], threads=1)
    ready = [line for line in res.lines if READY_MARKER in line]
    assert res.ok and ready and "1 thread(s) per rank" in ready[0], res.lines[-5:]


def test_torchrun_command_in_the_order_the_notebook_prints() -> None:
    cmd = torchrun_command(
        "t.py", 8, [1], nnodes=2, rdzv_endpoint="n:9", rdzv_id="j", max_restarts=3
    )
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert cmd[3:] == [
        "--nnodes=2",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=n:9",
        "--rdzv-id=j",
        "--max-restarts=3",
        "t.py",
        "1",
    ]


@pytest.mark.parametrize("where", [{"rdzv_dir": "/tmp/r"}, {"rdzv_endpoint": "node1:29500"}])
def test_torchrun_command_flags_exist(torchrun_help: str, where: dict[str, str]) -> None:
    cmd = torchrun_command("x.py", 2, max_restarts=1, **where)
    for flag in [c.split("=")[0] for c in cmd if c.startswith("--")]:
        assert flag in torchrun_help, f"torchrun has no {flag}"


def test_torchrun_command_needs_one_rendezvous() -> None:
    with pytest.raises(LaunchError, match="exactly one"):
        torchrun_command("x.py", 2)
    with pytest.raises(LaunchError, match="exactly one"):
        torchrun_command("x.py", 2, rdzv_dir="/tmp/r", rdzv_endpoint="h:1")
    cmd = torchrun_command("x.py", 2, rdzv_dir="/tmp/r")
    assert "--rdzv-conf=store_type=file" in cmd and "--local-addr=127.0.0.1" in cmd


def test_init_method_file_per_attempt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from helpers.scripts import common

    monkeypatch.delenv(common.PG_FILE_ENV, raising=False)
    assert common.init_method() == "env://"
    monkeypatch.setenv(common.PG_FILE_ENV, str(tmp_path / "pg"))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert common.init_method() == (tmp_path / "pg-2").resolve().as_uri()


def test_script_outside_torchrun_explains(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    run = subprocess.run(
        [sys.executable, str(script_path("ddp_train")), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert run.returncode != 0 and "Start it with torchrun" in run.stderr


def test_explain_failure_reads_torchrun_report() -> None:
    report = textwrap.dedent(
        """\
        [rank0]: RuntimeError: Connection closed by peer
        Root Cause (first observed failure):
        [0]:
          rank      : 1 (local_rank: 1)
          exitcode  : 3 (pid: 42)
        """
    )
    res = LaunchResult(command=[], nproc=2, backend="gloo", returncode=1, seconds=4.2)
    res.lines = report.splitlines()
    msg = explain_failure(res, 60)
    assert "rank 1 failed first (exit code 3) without a Python traceback" in msg
    assert "rank 0: RuntimeError: Connection closed by peer" in msg
    res.timed_out = True
    assert "timeout" in explain_failure(res, 60)


def torchrun_report(*failures: tuple[int, int], errors: dict[int, str] | None = None) -> list[str]:
    """The lines of a failed launch as torch 2.13's torchrun prints them, the first failure the root cause."""
    lines = [f"[rank{r}]: {e}" for r, e in (errors or {}).items()]
    lines += ["=" * 60, "/x/elastic_train.py FAILED", "-" * 60, "Failures:"]

    def entry(i: int, rank: int, code: int) -> list[str]:
        return [
            f"[{i}]:",
            "  time      : 2026-11-25_16:35:49",
            "  host      : localhost",
            f"  rank      : {rank} (local_rank: {rank})",
            f"  exitcode  : {code} (pid: {100 + rank}) ",
            "  error_file: <N/A>",
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        ]

    root, *others = failures
    for i, (rank, code) in enumerate(others, start=1):
        lines += entry(i, rank, code)
    lines += ["  <NO_OTHER_FAILURES>"] if not others else []
    lines += ["-" * 60, "Root Cause (first observed failure):", *entry(0, *root), "=" * 60]
    return lines


LOST = (
    "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:64744."
)


def explain(lines: list[str]) -> str:
    res = LaunchResult(command=[], nproc=2, backend="gloo", returncode=1, seconds=3.8)
    res.lines = lines
    return explain_failure(res, 60)


def test_explain_when_two_ranks_failed_within_one_look() -> None:
    # seen in CI: rank 1 crashed (os._exit(3)), rank 0 lost its peer and aborted before torchrun
    # looked, and torchrun, timing failures to the second, named rank 0 the first observed one
    msg = explain(torchrun_report((0, -6), (1, 3), errors={0: LOST}))
    assert "ranks 0 and 1 each failed before torchrun looked" in msg
    assert "rank 1 most likely failed first (exit code 3) without a Python traceback" in msg
    assert "the others then lost their peer: rank 0 (exit code -6) with RuntimeError" in msg
    assert "names rank 0 as the first observed failure" in msg and "whole second" in msg
    # two ranks that each broke: both named, neither called first
    bad = {0: "ValueError: bad batch on 0", 1: "ValueError: bad batch on 1"}
    msg = explain(torchrun_report((1, 1), (0, 1), errors=bad))
    assert "ranks 1 and 0 each failed" in msg and "most likely" not in msg
    assert "rank 1 failed (exit code 1) with ValueError: bad batch on 1" in msg
    assert "rank 0 failed (exit code 1) with ValueError: bad batch on 0" in msg
    # three ranks
    msg = explain(torchrun_report((0, 1), (1, 1), (2, 3), errors={0: LOST, 1: LOST}))
    assert "ranks 0, 1 and 2 each failed" in msg and "rank 2 most likely failed first" in msg


def test_explain_ignores_the_ranks_torchrun_stopped() -> None:
    # rank 1 hung and was stopped (SIGTERM: -15); rank 0 failed at the timeout
    msg = explain(torchrun_report((0, 1), (1, -15), errors={0: "RuntimeError: wait timed out"}))
    assert "rank 0 failed first (exit code 1) with RuntimeError: wait timed out." in msg
    assert "each failed" not in msg
    msg = explain(torchrun_report((1, 3)))
    assert "rank 1 failed first (exit code 3) without a Python traceback" in msg
    assert "The others" not in msg


def test_echo_hides_only_torchruns_own_traceback() -> None:
    shown: list[str] = []
    echo = _HideLauncherTraceback(shown.append)
    lines = [
        "[rank0]: RuntimeError: the rank's error",
        "Traceback (most recent call last):",
        '  File "<frozen runpy>", line 198, in _run_module_as_main',
        "    raise ChildFailedError(",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "Root Cause (first observed failure):",
        "Traceback (most recent call last):",
        '  File "/x/ddp_train.py", line 3, in <module>',
        "ValueError: a rank's own traceback",
    ]
    for line in lines:
        echo(line)
    assert shown[0] == lines[0] and "hidden" in shown[1] and shown[2] == lines[5]
    assert shown[3:] == lines[6:], "a rank's unprefixed traceback is kept"


# --- run folders: removed at exit, and swept after a day ---------------------------------------


def test_run_dir_is_removed_when_python_exits(tmp_path: Path) -> None:
    code = (
        "from helpers.launch import new_run_dir; out = new_run_dir('x'); "
        "(out / 'rank0.pt').write_text('r'); print(out)"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert run.returncode == 0, run.stderr
    made = Path(run.stdout.strip())
    assert made.parent == tmp_path and made.name.startswith("course_ch04_x_")
    assert not made.exists(), "the run folder outlived the interpreter"


def test_new_run_dir_removes_day_old_run_dirs_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old, fresh = tmp_path / "course_ch04_ddp_old", tmp_path / "course_ch04_ddp_fresh"
    other, link = tmp_path / "not_the_course", tmp_path / "course_ch04_link"
    for folder in (old, fresh, other):
        folder.mkdir()
        (folder / "rank0.pt").write_text("r")
    link.symlink_to(other)
    day_and_a_bit = time.time() - 25 * 3600
    for path in (old, other, link):
        os.utime(path, (day_and_a_bit, day_and_a_bit), follow_symlinks=False)
    made = new_run_dir("new")
    assert made.is_dir() and made.parent == tmp_path
    assert not old.exists(), "a course_ch04_* folder untouched for a day is removed"
    assert fresh.exists() and other.exists() and link.is_symlink(), "the rest is kept"


# --- the scripts do what the chapter says -----------------------------------------------------


def test_manual_allreduce_equals_one_process(tmp_path: Path) -> None:
    res = launch2(
        "manual_allreduce", ["--out", tmp_path, "--per-rank-batch", 8], watch_sockets=True
    )
    assert res.ok and res.seconds_until(READY_MARKER) is not None
    x, y = make_classification_data(16, seed=0)
    model = make_mlp(seed=0)
    nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
    ref = [p.grad for p in model.parameters()]
    ranks = read_results(tmp_path, 2)
    for r in ranks:
        assert close(r["averaged"], ref)
        assert not close(r["local"], ref)
        assert close(r["no_division"], ref, 2.0)
        assert close(r["sources_recipe"], ref, 2.0)
    assert all(torch.equal(a, b) for a, b in zip(ranks[1]["no_grad_local"], ranks[1]["local"]))
    # whatever listened (the ranks' gloo sockets, if a sample caught them) was on loopback
    assert {ip for _, ip, _ in res.listening} <= {"127.0.0.1", "::1"}, res.listening
    assert {pid for pid, _, _ in res.listening} <= set(res.child_pids), res.listening
    assert alive_pids(res.child_pids) == []


def test_ddp_train(tmp_path: Path) -> None:
    b, n, epochs, lr, accum = 16, 256, 2, 0.1, 3
    args = ["--out", tmp_path, "--samples", n, "--per-rank-batch", b, "--epochs", epochs]
    res = launch2("ddp_train", [*args, "--lr", lr, "--accum", accum])
    assert res.ok
    assert res.rank_lines(0) and not res.rank_lines(1), "only rank 0 logs"
    r0, r1 = read_results(tmp_path, 2)
    assert r0["identical"] and r1["identical"] and torch.equal(r0["params"], r1["params"])
    state = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert not any(k.startswith("module.") for k in state)
    plain = make_mlp()
    plain.load_state_dict(state)
    assert torch.equal(
        torch.cat([p.detach().reshape(-1) for p in plain.parameters()]), r0["params"]
    )
    for e in range(epochs):  # DistributedSampler: disjoint shares, covering the data
        a, c = set(r0["indices"][e].tolist()), set(r1["indices"][e].tolist())
        assert not a & c and len(a | c) == n
    assert not torch.equal(r0["indices"][0], r0["indices"][1]), "set_epoch reshuffles"
    # one process on the same global batches ends with the same weights
    x, y = make_classification_data(n, seed=0)
    ref = make_mlp(seed=0)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    for e in range(epochs):
        for s in range(0, n // 2, b):
            idx = torch.cat([r0["indices"][e][s : s + b], r1["indices"][e][s : s + b]])
            opt.zero_grad()
            nn.functional.binary_cross_entropy_with_logits(ref(x[idx]), y[idx]).backward()
            opt.step()
    ref_flat = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    assert torch.allclose(ref_flat, r0["params"], atol=1e-5)
    # no_sync: the big batch's gradient, one all-reduce round instead of `accum`
    xa, ya = make_classification_data(accum * b * 2, seed=1)
    big = make_mlp(seed=0)
    nn.functional.binary_cross_entropy_with_logits(big(xa), ya).backward()
    for r in (r0, r1):
        acc = r["accumulation"]
        assert close(acc["no_sync"]["grads"], [p.grad for p in big.parameters()])
        assert close(acc["every_step"]["grads"], [p.grad for p in big.parameters()])
        assert acc["every_step"]["allreduce_calls"] == accum * acc["no_sync"]["allreduce_calls"]


@pytest.fixture(scope="module")
def fsdp_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("fsdp")
    res = launch2("fsdp_vs_ddp", ["--out", out, "--width", 64, "--steps", 3])
    assert res.ok
    return read_results(out, 2)


def test_fsdp_matches_ddp_with_half_the_bytes(fsdp_results: list[dict]) -> None:
    r0, r1 = fsdp_results
    assert torch.allclose(r0["ddp"]["final"], r0["fsdp"]["final"], atol=1e-6)
    assert r1["ddp"]["final"] is None, "only rank 0 reports the full weights"
    for r in fsdp_results:
        assert torch.allclose(torch.tensor(r["ddp"]["losses"]), torch.tensor(r["fsdp"]["losses"]))
        for name, full, mine in r["fsdp"]["shapes"]:
            assert mine[0] <= (full[0] + 1) // 2 and mine[1:] == full[1:], name
        ddp_b, fsdp_b = sum(r["ddp"]["held_bytes"].values()), sum(r["fsdp"]["held_bytes"].values())
        assert fsdp_b <= ddp_b / 2 + 4 * 64 * 4


def test_ddp_sends_the_same_bytes_with_any_optimizer(fsdp_results: list[dict]) -> None:
    """Erratum 4: the optimizer's state size never changes what DDP all-reduces; a hook does."""
    runs = fsdp_results[0]["communication"]
    by = {(r["optimizer"], r["hook"]): r for r in runs}
    n = runs[0]["parameters"]
    assert n == sum(64 * 64 + 64 for _ in range(3)) + 64 + 1
    for other in fsdp_results[1:]:
        assert [r["sent per step"] for r in other["communication"]] == [
            r["sent per step"] for r in runs
        ]
    for key in [("Adam", "none"), ("SGD", "none"), ("Adam", "fp16"), ("Adam", "bf16")]:
        assert by[key]["error"] is None, by[key]["error"]  # gloo runs both 16-bit hooks
        assert len(by[key]["sent per step"]) == 2  # --comm-steps defaults to 2
    assert by[("Adam", "none")]["sent per step"] == [4 * n, 4 * n]
    assert by[("SGD", "none")]["sent per step"] == [4 * n, 4 * n]
    for hook in ("fp16", "bf16"):
        assert by[("Adam", hook)]["sent per step"] == [2 * n, 2 * n]
        assert by[("Adam", hook)]["grads exact in wire dtype"]
    assert by[("SGD", "none")]["state bytes"] == 0
    assert by[("Adam", "none")]["state bytes"] >= 8 * n
    eight = by[("8-bit Adam", "none")]
    if eight["error"] is None:  # bitsandbytes or torchao is installed and runs here
        assert eight["sent per step"] == [4 * n, 4 * n]
        assert eight["state bytes"] < by[("Adam", "none")]["state bytes"] / 2
    else:
        assert "no 8-bit optimizer" in eight["error"] and "state bytes" not in eight
    assert 2 * n < eight["computed 8-bit state bytes"] < 3 * n


def test_dead_rank_fails_fast_and_leaves_nothing(tmp_path: Path) -> None:
    res = launch2(
        "elastic_train",
        ["--out", tmp_path, "--die-rank", 1, "--die-at-step", 2],
        timeout=60,
        check=False,
    )
    assert res.returncode not in (0, None) and not res.timed_out
    assert res.seconds < 45, f"took {res.seconds:.1f} s"
    # rank 1 is named with its exit code; whether rank 0 also failed by itself (it lost its
    # peer) before torchrun's next look is a race, so which message reads is not asserted
    assert re.search(r"rank 1 [a-z ]*\(exit code 3\)", res.message), res.message
    assert len(res.child_pids) >= 2
    assert alive_pids(res.child_pids) == [], "a worker process was left behind"
    with pytest.raises(LaunchError, match=r"rank 0 [a-z ]*\(exit code 3\)"):
        launch2("elastic_train", ["--out", tmp_path / "b", "--die-rank", 0, "--die-at-step", 0])


def test_hang_becomes_an_error_at_the_process_group_timeout(tmp_path: Path) -> None:
    args = ["--out", tmp_path, "--die-rank", 1, "--die-at-step", 1, "--hang", "--pg-timeout", 5]
    res = launch2("elastic_train", args, timeout=90, check=False, watch_sockets=True)
    assert res.returncode not in (0, None) and not res.timed_out
    assert "rank 0 failed first" in res.message
    assert alive_pids(res.child_pids) == []
    # the ranks sat connected for 5 s: their gloo sockets were seen, all on loopback, and
    # torchrun (not among child_pids, which are its descendants) listened on nothing
    addrs = {ip for _, ip, _ in res.listening}
    assert addrs, "no listening socket was seen in 5 s"
    assert addrs <= {"127.0.0.1", "::1"}, res.listening
    assert {pid for pid, _, _ in res.listening} <= set(res.child_pids), res.listening


def test_launch_timeout_kills_torchrun_and_workers(tmp_path: Path) -> None:
    args = ["--out", tmp_path, "--die-rank", 1, "--die-at-step", 0, "--hang", "--pg-timeout", 600]
    res = launch2("elastic_train", args, timeout=25, check=False)
    assert res.timed_out and not res.ok and "timeout" in res.message
    assert res.killed_pids and alive_pids(res.killed_pids + res.child_pids) == []
    assert res.returncode not in (0, None), "a killed torchrun did not exit cleanly"


def test_interrupt_kills_everything(tmp_path: Path) -> None:
    seen: list[psutil.Process] = []
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # e.g. nbval's kernel

    def interrupt_on_hang(line: str) -> None:
        if "stops answering" in line:
            now = psutil.Process().children(recursive=True)
            seen.extend(p for p in now if p.pid not in before)
            raise KeyboardInterrupt

    args = ["--out", tmp_path, "--die-rank", 1, "--die-at-step", 0, "--hang", "--pg-timeout", 600]
    with pytest.raises(KeyboardInterrupt):
        launch2("elastic_train", args, echo=interrupt_on_hang)
    assert len(seen) >= 3, "torchrun and two workers"
    assert alive_pids([p.pid for p in seen]) == []


def elastic_reference(steps: int, per_rank: int = 32, lr: float = 0.05) -> torch.Tensor:
    model = make_mlp(elastic_train.SIZES, seed=0)
    opt = elastic_train.make_optimizer(model.parameters(), lr)
    for step in range(steps):
        x, y = elastic_train.global_batch(step, 2, per_rank)
        opt.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize(
    ("fault", "first_failure"),
    [([], (1, 3)), (["--hang", "--pg-timeout", 3], (0, 1))],  # (local rank, exit code)
    ids=["crash", "hang"],
)
def test_restart_resumes_from_the_checkpoint(
    tmp_path: Path, fault: list, first_failure: tuple[int, int]
) -> None:
    # a crash: rank 1 exits with 3. A hang (the notebook's run): rank 1 stops answering, and
    # rank 0, the waiting peer, fails at the process-group timeout with exit code 1
    args = ["--out", tmp_path, "--die-rank", 1, "--die-at-step", 6, "--steps", 10, *fault]
    res = launch2("elastic_train", args, max_restarts=1)
    assert res.ok and any("attempt 1: starting at step 4" in ln for ln in res.lines)
    failed = res.failures()
    assert len(failed) == 1, "torchrun logs the first failure of attempt 0, and attempt 1 ran"
    # a hang: the waiting rank 0 fails, the hung rank only when torchrun stops it. Rank 0's exit
    # code is 1, or -6 when a gloo thread aborts its shutdown ("terminate called without an
    # active exception": 1 run in 10 under load). A crash: rank 0 may lose its peer and fail
    # within the same second, and torchrun, which times failures to the second, may then log
    # rank 0's failure as the first (a race)
    rank, code = failed[0]
    assert (rank, code) == first_failure or (rank == 0 and code != 0), failed
    if fault:
        assert res.rank_lines(0) and any("step 6: all-reduce failed" in ln for ln in res.lines)
    (r0,) = read_results(tmp_path)
    assert r0["attempt"] == 1 and r0["resumed_from"] == 4
    assert torch.allclose(r0["params"], elastic_reference(10), atol=1e-6)
    assert alive_pids(res.child_pids) == [], "no worker of either attempt is left behind"


# --- the Slurm example -------------------------------------------------------------------------


def free_tcp_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now, chosen by the OS."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_slurm_script_parses() -> None:
    subprocess.run(["bash", "-n", str(SBATCH)], check=True, timeout=30)
    text = SBATCH.read_text()
    assert "#SBATCH --nodes=" in text and "--rdzv-endpoint=" in text and "--max-restarts=" in text


def torchrun_flags(text: str) -> list[str]:
    block = text.split("torch.distributed.run", 1)[1].split('"$TRAIN_SCRIPT"', 1)[0]
    return re.findall(r"(--[a-z][a-z-]*)=", block)


def test_slurm_torchrun_flags_exist(torchrun_help: str) -> None:
    flags = torchrun_flags(SBATCH.read_text())
    assert {"--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint"} <= set(flags)
    for flag in flags:
        assert flag in torchrun_help, f"torchrun has no {flag}"


def test_slurm_script_runs_with_stand_ins(tmp_path: Path) -> None:
    """srun and scontrol replaced by tiny scripts: one node, 2 CPU ranks, a crash, a restart."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shims = {
        "scontrol": '#!/usr/bin/env bash\necho "$SLURM_JOB_NODELIST"\n',
        "srun": '#!/usr/bin/env bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n',
    }
    for name, body in shims.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(stat.S_IRWXU)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": "localhost",
        "NPROC_PER_NODE": "2",
        "MAX_RESTARTS": "1",
        "RDZV_HOST": "127.0.0.1",
        "RDZV_PORT": str(free_tcp_port()),
        "OUT_DIR": str(tmp_path / "out"),
        "OMP_NUM_THREADS": "1",
        BACKEND_ENV: "gloo",
    }
    run = subprocess.run(
        ["bash", str(SBATCH), "--die-rank", "1", "--die-at-step", "6", "--steps", "8"],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        start_new_session=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (r0,) = read_results(tmp_path / "out")
    assert r0["attempt"] == 1 and r0["resumed_from"] == 4


# --- teardown: the order that cannot deadlock on torch < 2.8 ------------------------------------


def test_teardown_holds_the_barrier_work_until_the_group_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch < 2.8 destroys a gloo group holding the GIL; a gloo thread that then dropped the
    last reference to a collective's tensors would need the GIL too, and both would wait for
    ever. teardown keeps the barrier's work (which holds those tensors) alive in the calling
    thread until destroy_process_group has returned, so it is released there, with the GIL."""
    import torch.distributed as dist

    from helpers.scripts import common

    order: list[str] = []

    class Work:
        def wait(self) -> bool:
            order.append("wait")
            return True

        def __del__(self) -> None:
            order.append("released")

    def barrier(async_op: bool = False) -> Work | None:
        order.append(f"barrier(async_op={async_op})")
        return Work() if async_op else None

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "barrier", barrier)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: order.append("destroy"))
    common.teardown()
    assert order == ["barrier(async_op=True)", "wait", "destroy", "released"]


def test_one_rank_world_is_left_even_when_its_barrier_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch.distributed as dist

    from helpers.checks import ch04

    def broken_teardown() -> None:
        raise RuntimeError("Timed out waiting 5000ms for recv operation to complete")

    monkeypatch.setattr(ch04, "teardown", broken_teardown)
    with ch04._one_rank_world(tmp_path):
        assert dist.is_initialized() and dist.get_world_size() == 1
    assert not dist.is_initialized(), "the next check must be able to start its own group"


def test_exit_now_flushes_and_ends_the_process_with_code_0() -> None:
    code = "from helpers.scripts.common import exit_now; print('saved', end=''); exit_now(); print('never')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "saved"


@pytest.mark.parametrize("name", sorted(SCRIPTS | {"exercise_check"}))
def test_every_script_ends_with_exit_now(name: str) -> None:
    text = script_path(name).read_text()
    assert text.rstrip().endswith(
        "main()\n    exit_now()  # skip the slow interpreter shutdown: see common.exit_now"
    )
