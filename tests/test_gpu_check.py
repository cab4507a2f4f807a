"""tools/gpu_check.py on a CPU: every part with tiny inputs, and its GPU branches on fake GPUs."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import gpu_check
import nbformat
import psutil
import pytest
import torch

from helpers import launch as torchrun
from helpers.launch import LaunchResult
from helpers.scripts.one_launch import split_jobs

from gpucheck import machine as machine_mod
from gpucheck import plan as plan_mod
from gpucheck import report as report_mod
from gpucheck import run as run_mod
from gpucheck.common import child_env

ROOT = Path(__file__).resolve().parent.parent


def tiny_notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    }
    nb.cells = [nbformat.v4.new_code_cell("import helpers\nprint('tiny notebook ran')")]
    path = folder / "tiny.ipynb"
    nbformat.write(nb, path)
    return path


def tiny_tests(folder: Path) -> Path:
    path = folder / "test_tiny.py"
    path.write_text(
        "import pytest\n\n"
        "def test_passes():\n    assert True\n\n"
        "def test_fails():\n    assert 1 == 2, 'broken on purpose'\n\n"
        "def test_skips():\n    pytest.skip('not here')\n"
    )
    return path


def fake_benchmark(folder: Path, body: str, name: str = "bench_fake.py") -> Path:
    path = folder / name
    path.write_text(body)
    return path


def in_process_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """machine_info() without a subprocess, so that fake GPUs (patched here) are seen."""
    monkeypatch.setattr(machine_mod, "machine_info", lambda *a, **k: machine_mod.probe_machine())


def test_cpu_run_writes_one_report_and_fails_on_a_failing_test(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    in_process_machine(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    table = "   n  time (ms)\n----  ---------\n 256      0.017\n"
    bench = fake_benchmark(tmp_path, f"print({table!r}, end='')\n")
    out = tmp_path / "report"
    status = gpu_check.main(
        [
            "--out",
            str(out),
            "--notebooks",
            str(tiny_notebook(tmp_path)),
            "--tests",
            str(tiny_tests(tmp_path)),
            "--benchmarks",
            str(bench),
        ]
    )
    assert status == 1, "a failing unit test must make the check fail"
    text = (out / "summary.md").read_text()
    assert text.startswith("# GPU check: no GPU")
    assert re.search(r", commit [0-9a-f]{7,} \(tree [0-9a-f]{7,}\)", text), "commit and tree"
    assert "| torch | " + torch.__version__ in text
    assert re.search(r"\| tiny\.ipynb \| ok \| [\d.]+ \|", text), text
    assert "1 notebooks, 0 failed" in text
    assert "1 passed, 1 failed, 0 errors, 1 skipped" in text
    assert "test_tiny.py::test_fails" in text and "broken on purpose" in text
    assert table.strip() in text, "the benchmark's table is in the report verbatim"
    assert "## NCCL\n\nSkipped: no GPU" in text
    assert "**Result: FAILED.**" in text and "tests: FAILED" in text
    assert "nccl: skipped" in text and "notebooks: ok" in text
    for log in ("notebooks.log", "tests.log", "benchmarks/bench_fake.log", "machine.json"):
        assert (out / log).is_file(), log
    printed = capsys.readouterr().out
    assert "skipped: no GPU" in printed and "FAILED: tests" in printed


def run_part(part: str, out: Path, argv: list[str], machine: dict) -> report_mod.Part:
    """One part of gpu_check, as main runs it (its machine-state readings included)."""
    out.mkdir(parents=True, exist_ok=True)
    args = gpu_check.parse_args(["--only", part, *argv])
    check = run_mod.Check(args, out, machine, argv)
    check.items = plan_mod.plan(args, machine)
    check.run()
    (found,) = report_mod.parts_of(check)
    return found


def test_a_hung_benchmark_is_stopped_and_reported(tmp_path: Path) -> None:
    hung = fake_benchmark(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    broken = fake_benchmark(tmp_path, "raise SystemExit('no device')\n", "bench_broken.py")
    argv = ["--benchmarks", str(hung), str(broken), "--benchmark-timeout", "2"]
    part = run_part("benchmarks", tmp_path, argv, {"gpu_count": 0})
    assert part.status == "FAILED"
    assert "bench_fake.py: FAILED (timed out after 2 s)" in part.problems
    assert "bench_broken.py: FAILED (exit code 1)" in part.problems
    assert "started" in part.markdown and "no device" in part.markdown
    assert part.seconds < 30


def test_only_quick_and_bad_parts() -> None:
    args = gpu_check.parse_args(["--only", "tests,nccl", "--quick"])
    assert args.parts == ["tests", "nccl"] and args.quick
    with pytest.raises(SystemExit) as exc:
        gpu_check.parse_args(["--only", "notebooks,gpus"])
    assert exc.value.code == 2


def test_quick_settings_name_real_scripts_and_flags() -> None:
    settings = [*plan_mod.QUICK_BENCHMARK_ARGS.items(), *plan_mod.HEADLINE_BENCHMARKS.items()]
    for stem, flags in settings:
        source = (ROOT / "benchmarks" / f"{stem}.py").read_text()
        for flag in (f for f in flags if f.startswith("--")):
            assert f'"{flag}"' in source, f"{stem}.py has no {flag} option"
    for path in (*plan_mod.QUICK_NOTEBOOKS, *plan_mod.QUICK_TESTS):
        assert (ROOT / path).exists(), path
    for script, flags in plan_mod.NCCL_SCRIPTS.items():
        source = torchrun.script_path(script).read_text()
        assert all(f'"{f}"' in source for f in flags if f.startswith("--")), script


def test_pytest_uses_xdist_only_where_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = run_mod.importlib.util.find_spec
    args = gpu_check.parse_args([])
    for present in (True, False):
        monkeypatch.setattr(
            run_mod.importlib.util,
            "find_spec",
            lambda name, present=present: (
                (object() if present else None) if name == "xdist" else real(name)
            ),
        )
        command = run_mod.pytest_command(args, tmp_path / "t.xml")
        assert ("-n" in command) is present
        assert "tests" in command and "--ignore=tests/browser" in command


def test_the_cuda_tests_collect_only_their_own_files(tmp_path: Path) -> None:
    # The H200 run of 2026-11-28 failed its tests on `import polib` in tests/test_translate.py,
    # a module with no cuda test, collected only because the whole folder was.
    args = gpu_check.parse_args([])
    item = plan_mod.Item("tests", "tests", 1.0, args=["-m", plan_mod.CUDA_MARKER])
    command = run_mod.pytest_command(args, tmp_path / "t.xml", item)
    files = [c for c in command if c.startswith("tests/test_")]
    listed = (ROOT / "tests" / "cuda_tests.txt").read_text(encoding="utf-8")
    assert files and all(f + "::" in listed for f in files) and "tests" not in command
    assert "tests/test_translate.py" not in files and "tests/test_devices.py" in files
    every = run_mod.pytest_command(gpu_check.parse_args(["--all-tests"]), tmp_path / "t.xml")
    assert "tests" in every


def test_a_part_whose_modules_are_missing_fails_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_process_machine(monkeypatch)
    monkeypatch.setitem(plan_mod.NEEDS, "benchmarks", ("torch", "no_such_module_here"))
    status = gpu_check.main(["--only", "benchmarks", "--out", str(tmp_path)])
    assert status == 1
    text = (tmp_path / "summary.md").read_text()
    assert "cannot import no_such_module_here" in text and "carry the wheels" in text


def test_nccl_world_sizes() -> None:
    assert plan_mod.nccl_world_sizes(0) == []
    assert plan_mod.nccl_world_sizes(1) == [1]
    assert plan_mod.nccl_world_sizes(2) == [1, 2]
    assert plan_mod.nccl_world_sizes(8) == [1, 2]


def good_results(script: str, world: int) -> list[dict]:
    """What the chapter 4 scripts save, in the shapes check_results reads."""
    g = [torch.ones(3)]
    if script == "manual_allreduce":
        return [{"averaged": g, "no_division": [world * t for t in g]} for _ in range(world)]
    if script == "ddp_train":
        acc = {"no_sync": {"grads": g}, "every_step": {"grads": [t + 1e-7 for t in g]}}
        return [{"identical": True, "accumulation": acc} for _ in range(world)]
    losses = [0.7, 0.6, 0.5]
    return [{"ddp": {"losses": losses}, "fsdp": {"losses": losses}} for _ in range(world)]


class FakeLauncher:
    """Stands in for helpers.launch.launch: records the calls, saves chosen rank results."""

    def __init__(self, fail: str = "", wrong: str = "") -> None:
        self.calls: list[tuple[str, int, str]] = []
        self.fail, self.wrong = fail, wrong

    def __call__(
        self, script, nproc, args, *, backend, timeout, echo, check, env, threads
    ) -> LaunchResult:  # noqa: ANN001
        self.calls.append((script, nproc, backend))
        assert check is False and timeout > 0
        assert threads is None or threads >= 1, "each rank gets its share of the stream's threads"
        assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT), "ranks import this checkout"
        result = LaunchResult(command=["torchrun"], nproc=nproc, backend=backend, seconds=0.5)
        echo(f"[course:ready] process group ready: {nproc} rank(s), backend {backend}")
        if script == self.fail:
            result.returncode, result.message = 1, "rank 0 failed first: NCCL error"
            return result
        jobs = split_jobs(args) if script == "one_launch" else [(script, args)]
        for job, options in jobs:
            assert options[options.index("--pg-timeout") + 1] == "120"
            out = Path(options[options.index("--out") + 1])
            out.mkdir(parents=True, exist_ok=True)
            ranks = good_results(job, nproc)
            if job == self.wrong:
                ranks[0]["identical"] = False
            for r, data in enumerate(ranks):
                torch.save(data, out / f"rank{r}.pt")
        result.returncode = 0
        return result


def test_two_fake_gpus_run_ddp_and_fsdp_on_nccl_at_world_sizes_1_and_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_gpu, capsys: pytest.CaptureFixture
) -> None:  # noqa: ANN001
    fake_gpu("h100_sxm", count=2)
    in_process_machine(monkeypatch)
    launcher = FakeLauncher()
    monkeypatch.setattr(torchrun, "launch", launcher)
    assert gpu_check.main(["--only", "nccl", "--out", str(tmp_path)]) == 0
    assert launcher.calls == [
        ("ddp_train", 1, "nccl"),
        ("ddp_train", 2, "nccl"),
        ("fsdp_vs_ddp", 1, "nccl"),
        ("fsdp_vs_ddp", 2, "nccl"),
        ("one_launch", 1, "nccl"),
        ("one_launch", 2, "nccl"),
    ]
    text = (tmp_path / "summary.md").read_text()
    assert text.startswith("# GPU check: 2 x NVIDIA H100 80GB HBM3")
    assert "| driver | 580.95.05 |" in text and "CUDA 12.8" in text
    assert "| ddp_train | 2 | ok |" in text and "| fsdp_vs_ddp | 1 | ok |" in text
    assert "| one_launch | 2 | ok |" in text
    assert (tmp_path / "nccl" / "one_launch-nccl-x2" / "manual_allreduce" / "rank1.pt").is_file()
    assert (tmp_path / "nccl" / "ddp_train-nccl-x2.log").read_text().startswith("[course:ready]")
    assert "reference/nvidia-h100-80gb-hbm3" in capsys.readouterr().out


def test_one_fake_gpu_reports_a_failed_launch_and_wrong_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_gpu
) -> None:  # noqa: ANN001
    fake_gpu("a100", count=1)
    machine = machine_mod.probe_machine()
    assert machine["gpu_count"] == 1 and machine["gpus"][0]["name"] == "NVIDIA A100-SXM4-80GB"
    launcher = FakeLauncher(fail="fsdp_vs_ddp", wrong="ddp_train")
    monkeypatch.setattr(torchrun, "launch", launcher)
    part = run_part("nccl", tmp_path, [], machine)
    assert [c[1] for c in launcher.calls] == [1, 1, 1], "one GPU: world size 1 only"
    assert part.status == "FAILED"
    assert any("parameters differ between ranks" in p for p in part.problems)
    # the wrong ddp_train results are found inside the one launch too, named by job
    assert any(p.startswith("one_launch x1: ddp_train: parameters differ") for p in part.problems)
    assert any("NCCL error" in p for p in part.problems)


def test_amd_and_apple_machines_are_described(fake_gpu) -> None:  # noqa: ANN001
    fake_gpu("mi300x", count=1)
    amd = machine_mod.probe_machine()
    text = machine_mod.machine_markdown(amd)
    assert "AMD Instinct MI300X" in text and "ROCm (HIP" in text
    assert machine_mod.slug(amd) == "amd-instinct-mi300x"
    fake_gpu("mps")
    mac = machine_mod.probe_machine()
    assert mac["gpu_count"] == 0 and machine_mod.gpu_summary(mac) == "no GPU (Apple MPS available)"
    (item,) = plan_mod.plan(gpu_check.parse_args(["--only", "nccl"]), mac)
    assert item.status == "skipped" and "no GPU" in item.detail
    assert machine_mod.state_devices(mac) == ["mps"]


def test_the_real_probe_runs_in_a_subprocess() -> None:
    machine = machine_mod.machine_info()
    assert machine["torch"] == torch.__version__
    assert machine["cores"] >= 1 and isinstance(machine["gpus"], list)


def test_manual_allreduce_results_are_checked() -> None:
    good = good_results("manual_allreduce", 2)
    assert run_mod.check_results("manual_allreduce", good) == []
    good[1]["averaged"] = [torch.zeros(3)]
    good[0]["no_division"] = [torch.ones(3)]  # the sum, not 2 x the average
    wrong = run_mod.check_results("manual_allreduce", good)
    assert "rank 1: averaged gradients differ from rank 0's" in wrong
    assert "rank 0: the sum is not world size x the average" in wrong


# -- a check that fits a short lease (--deadline, --resume) ---------------------------------


class VirtualRun:
    """Runs items instantly on virtual clocks, one per stream: each takes `pace` x its estimate.

    A stream's clock starts at the call's start-up (CALL_OVERHEAD_S, as schedule() counts it),
    the timing phase's where the last stream ended; the call's clock is the latest of them.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, pace: float = 1.0) -> None:
        self.pace, self.ran, self.clocks = pace, [], {}
        self.lock = threading.Lock()
        monkeypatch.setattr(run_mod.Check, "elapsed", lambda check: self.elapsed())
        monkeypatch.setattr(machine_mod, "read_state", self.state)
        for stage in plan_mod.STAGES:
            monkeypatch.setitem(run_mod.RUNNERS, stage, self.run)

    @property
    def now(self) -> float:
        return max(self.clocks.values(), default=0.0)

    def new_call(self) -> None:
        self.clocks, self.ran = {}, []

    def elapsed(self) -> float:
        name = threading.current_thread().name
        with self.lock:
            if name.startswith("correctness-"):
                return self.clocks.setdefault(name, plan_mod.CALL_OVERHEAD_S)
            if name.startswith("timing-"):
                streams = [t for n, t in self.clocks.items() if n.startswith("correctness-")]
                return self.clocks.setdefault(name, max(streams, default=plan_mod.CALL_OVERHEAD_S))
            return self.now

    def state(self, machine: dict, timeout: float = 0) -> dict:
        return {"text": f"state at {self.now:.0f} s", "quiet": True, "caveat": ""}

    def run(self, item, out, args, limit) -> None:  # noqa: ANN001
        assert item.estimate * self.pace <= limit.seconds or not args.deadline, (
            f"{item.name} was started with {limit.seconds:.0f} s left"
        )
        name = threading.current_thread().name
        with self.lock:
            self.ran.append((item.stage, item.name, limit.seconds, item.stream))
            item.seconds = item.estimate * self.pace
            self.clocks[name] += item.seconds + plan_mod.ITEM_OVERHEAD_S  # starting it costs too
        item.status = "ok"


def cpu_plan() -> list[plan_mod.Item]:
    """Every item gpu_check plans on this CPU (no GPU: NCCL skipped)."""
    return plan_mod.plan(gpu_check.parse_args([]), {"gpu_count": 0})


def test_a_deadline_runs_the_most_informative_first_and_lists_what_did_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    run = VirtualRun(monkeypatch)
    in_process_machine(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "a"
    assert gpu_check.main(["--deadline", "540", "--out", str(out)]) == 3, "incomplete: exit 3"
    assert {stream for *_, stream in run.ran} == {0}, "one stream on a CPU"
    stages = [stage for stage, *_ in run.ran]
    order = list(plan_mod.STAGES)
    assert stages == sorted(stages, key=order.index), "chapters, tests, ..., in that order"
    chapters = sorted(
        p.relative_to(ROOT).as_posix() for p in ROOT.glob("notebooks/[0-9][0-9]_*.ipynb")
    )
    ran_chapters = [n for s, n, *_ in run.ran if s == "chapters"]
    assert ran_chapters == [c for c in chapters if c in ran_chapters], "chapters in order"
    assert ran_chapters and run.ran[0][1] == chapters[0], "the chapters come first"
    assert run.now <= 540 - plan_mod.STOP_GRACE_S - plan_mod.FINISH_RESERVE_S
    text = (out / "summary.md").read_text()
    assert "**Result: incomplete" in text and "## Not run" in text
    section = text.split("## Not run")[1].split("\n## ")[0]
    not_run = [line for line in section.splitlines() if line.startswith("- ")]
    assert all(any(c in line for line in not_run) for c in chapters if c not in ran_chapters), (
        "a chapter that did not fit is listed, with why"
    )
    everything = cpu_plan()
    assert len(not_run) == len(everything) - 1 - len(run.ran), (
        "the rest, each with why (nccl skipped)"
    )
    assert all("before the 540 s deadline" in line for line in not_run)
    assert "| correctness phase, 1 stream(s) x " in text and "| state at 0 s | " in text
    assert "--resume" in text
    # the next calls: each goes on where the last stopped, nothing twice, one report of all
    first, earlier, done, calls = list(run.ran), out, [], 1
    order = [i.name for i in everything]
    sched = plan_mod.schedule(everything, 1, 2, 540, budget=float("inf"))
    while True:
        run.new_call()
        nxt = tmp_path / f"call{calls + 1}"
        code = gpu_check.main(["--deadline", "540", "--resume", str(earlier), "--out", str(nxt)])
        calls += 1
        assert not {n for _, n, *_ in first} & {n for _, n, *_ in run.ran}, "nothing runs twice"
        assert {n for _, n, *_ in run.ran} == {
            s.item.name for s in sched.slots if s.call == calls
        }, "each call runs what schedule() (--plan) says it runs"
        if calls == 2:
            left = [n for n in order if n not in {name for _, name, *_ in first}]
            assert run.ran[0][1] == left[0], "it goes on where the first call stopped"
            text = (nxt / "summary.md").read_text()
            assert "Resumed from" in text and text.count("(earlier run, ") >= len(first)
        first += run.ran
        earlier = nxt
        done = json.loads((nxt / "progress.json").read_text())["items"]
        if code != 3 or calls > 8:
            break
    assert all(i["status"] in ("ok", "skipped") for i in done), "every item ran in the end"
    assert calls == len(sched.call_ends), "as many calls as --plan says"
    capsys.readouterr()


def h100_box(monkeypatch: pytest.MonkeyPatch) -> dict:
    """The machine the plan is for: one H100, 16 usable cores (machine_info patched to say so)."""
    box = {
        "gpu_count": 1,
        "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.2, "capability": "9.0"}],
        "cores": 16,
        "usable_cores": 16,
        "torch": torch.__version__,
    }
    monkeypatch.setattr(machine_mod, "machine_info", lambda *a, **k: dict(box))
    return box


def test_the_whole_course_fits_one_gpu_rental_in_two_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Issue 33: everything within 780 s on one H100 with 16 cores, in at most two calls."""
    box = h100_box(monkeypatch)
    args = gpu_check.parse_args(["--plan"])
    items = plan_mod.plan(args, box)
    stages = {i.stage for i in items}
    assert stages == set(plan_mod.STAGES), "notebooks, tests, benchmarks and NCCL: everything"
    sched = plan_mod.schedule(items, 3, 5, plan_mod.CALL_S)
    assert sched.fits(), plan_mod.schedule_text(sched, "one H100, 16 cores")
    assert sched.deadlines[0] == plan_mod.CALL_S
    assert all(
        d == plan_mod.BUDGET_S - sum(sched.call_ends[:k])
        for k, d in enumerate(sched.deadlines)
        if k
    )
    assert len(sched.call_ends) <= 2 and sched.total <= plan_mod.BUDGET_S
    assert all(end <= plan_mod.CALL_S for end in sched.call_ends)
    assert gpu_check.main(["--plan"]) == 0
    printed = capsys.readouterr().out
    assert "3 stream(s) of 5 thread(s)" in printed and "fits the budget of 780 s" in printed
    # the runner, played through at the expected times, does what the plan says
    run = VirtualRun(monkeypatch)
    earlier: Path | None = None
    for call in range(1, len(sched.call_ends) + 1):
        run.new_call()
        out = tmp_path / f"call{call}"
        argv = ["--deadline", str(sched.deadlines[call - 1]), "--out", str(out)]
        code = gpu_check.main(argv + (["--resume", str(earlier)] if earlier else []))
        planned = {s.item.name: max(s.stream, 0) for s in sched.slots if s.call == call}
        assert {name: stream for _, name, _, stream in run.ran} == planned, f"call {call}"
        assert run.now <= sched.call_ends[call - 1], "no later than the plan"
        earlier = out
    assert code == 0, "after the last call, everything has run"
    text = (out / "summary.md").read_text()
    assert "3 streams side by side, each with 5 thread(s)" in text
    assert "shared-GPU, shared-CPU times" in text and "alone on the machine" in text
    readme = (ROOT / "README.md").read_text()
    assert f"in {len(sched.call_ends)} calls" in readme and "--plan" in readme


def test_the_streams_get_the_cores_split_between_them(tmp_path: Path) -> None:
    assert plan_mod.default_streams(16, 1) == 3 and plan_mod.stream_threads(16, 3) == 5
    assert plan_mod.default_streams(8, 1) == 2 and plan_mod.default_streams(4, 1) == 1
    assert plan_mod.default_streams(64, 0) == 1, "no GPU: one stream (they would share cores)"
    items = [plan_mod.Item("chapters", f"c{i}", e) for i, e in enumerate([100, 90, 50, 40, 30])]
    items.append(plan_mod.Item("benchmarks", "b", 20))
    plan_mod.assign_streams(items, 3, 5)
    load = {k: sum(i.estimate for i in items if i.stream == k) for k in (1, 2, 3)}
    assert load == {1: 100, 2: 120, 3: 90}, "longest first onto the least loaded"
    assert items[-1].stream == 0 and items[-1].threads == 0, "the timing phase: alone"
    assert all(i.threads == 5 for i in items[:-1])
    env = child_env(5)
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "5"


def test_two_streams_run_side_by_side_with_their_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real commands on two streams: they overlap in time, and each sees its stream's threads."""
    monkeypatch.setattr(
        machine_mod, "read_state", lambda machine, timeout=0: {"text": "-", "quiet": None}
    )
    books = []
    for name in ("one", "two"):
        nb = nbformat.v4.new_notebook()
        nb.metadata = {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        }
        nb.cells = [
            nbformat.v4.new_code_cell(
                "import os, time, torch\nstart = time.time()\ntime.sleep(3)\n"
                "print('threads', os.environ['OMP_NUM_THREADS'], torch.get_num_threads(), start)"
            )
        ]
        books.append(tmp_path / f"{name}.ipynb")
        nbformat.write(nb, books[-1])
    out = tmp_path / "out"
    argv = ["--notebooks", *map(str, books), "--streams", "2"]
    start = time.monotonic()
    part = run_part("notebooks", out, argv, {"gpu_count": 0, "usable_cores": 4})
    assert part.status == "ok", part.markdown
    assert time.monotonic() - start < 2 * 3 + 2 * (5 + 3), "side by side, not one after the other"
    for k, name in ((1, "one"), (2, "two")):
        executed = nbformat.read(out / "notebooks" / f"{name}.ipynb", as_version=4)
        text = executed.cells[0].outputs[0]["text"]
        assert text.startswith("threads 2 2 "), text
        assert (out / f"notebooks-stream{k}.log").is_file()
    assert "| one.ipynb | ok |" in part.markdown and "2 streams side by side" in part.markdown


def test_the_pace_so_far_scales_the_estimates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = VirtualRun(monkeypatch, pace=2.0)
    in_process_machine(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gpu_check.main(["--only", "notebooks", "--deadline", "540", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "progress.json").read_text())["items"]
    ran = [i for i in data if i["status"] == "ok"]
    expected = sum(i["estimate"] for i in ran)
    assert sum(i["seconds"] for i in ran) == pytest.approx(2 * expected)
    # the pace is damped by a prior, so at twice the expected times the last item started may
    # overrun by a little: the real runner's limit stops it in the grace it keeps (the test
    # of an item that overruns); the virtual one just lets it end
    assert slow.now <= 540 - plan_mod.FINISH_RESERVE_S
    skipped = [i for i in data if i["status"] == "not run"]
    assert skipped, "at twice the expected times, the notebooks do not all fit in 540 s"
    pace = float(re.search(r"x ([\d.]+), the pace so far", skipped[0]["detail"])[1])
    assert 1.5 < pace < 2, "twice as slow, damped by the prior"


def test_resume_needs_an_earlier_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    in_process_machine(monkeypatch)
    with pytest.raises(SystemExit, match="progress.json"):
        gpu_check.main(
            ["--only", "tests", "--resume", str(tmp_path / "nope"), "--out", str(tmp_path)]
        )


def test_the_deadline_stops_an_item_that_overruns_and_finishes_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(plan_mod.DEFAULT_S, "benchmarks", 1.0)  # a wrong estimate
    hung = fake_benchmark(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    after = fake_benchmark(tmp_path, "print('after')\n", "bench_after.py")
    deadline = plan_mod.STOP_GRACE_S + plan_mod.FINISH_RESERVE_S + 12
    out = tmp_path / "out"
    start = time.monotonic()
    argv = [
        "--only",
        "benchmarks",
        "--benchmarks",
        str(hung),
        str(after),
        "--deadline",
        str(deadline),
    ]
    assert gpu_check.main([*argv, "--out", str(out)]) == 3
    assert time.monotonic() - start < deadline, "the whole check ends before its deadline"
    data = {i["name"]: i for i in json.loads((out / "progress.json").read_text())["items"]}
    hung_item = data[hung.name]
    assert (
        hung_item["status"] == "STOPPED"
        and f"the --deadline of {deadline:g} s" in hung_item["detail"]
    )
    assert data[after.name]["status"] == "not run"
    text = (out / "summary.md").read_text()
    assert "started" in text and "**Result: incomplete, 1 item(s) stopped, 1 not run.**" in text


def test_a_notebook_stopped_by_the_timeout_says_so_not_assertionerror(tmp_path: Path) -> None:
    # The H100 run of 2026-11-26: exercise 6 "failed" with a bare AssertionError when the
    # exercises' --notebooks-timeout ran out mid-cell (nbclient's SIGTERM handler).
    slow = tmp_path / "slow.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
    }
    nb.cells = [
        nbformat.v4.new_code_cell("print('one')"),
        nbformat.v4.new_code_cell("import time\ntime.sleep(120)"),
    ]
    nbformat.write(nb, slow)
    after = tiny_notebook(tmp_path)
    argv = ["--notebooks", str(slow), str(after), "--notebooks-timeout", "15"]
    start = time.monotonic()
    part = run_part("notebooks", tmp_path / "out", argv, {"gpu_count": 0})
    assert time.monotonic() - start < 15 + plan_mod.STOP_GRACE_S + 2 * machine_mod.STATE_TIMEOUT_S
    assert part.status == "FAILED" or part.status == "incomplete"
    text = part.markdown
    assert (
        "| slow.ipynb | STOPPED: stopped by SIGTERM (deadline/timeout) in cell 1 (--notebooks-timeout) |"
        in text
    )
    assert "| tiny.ipynb | not run" in text or "| tiny.ipynb | FAILED" not in text
    assert "AssertionError" not in text
    executed = nbformat.read(tmp_path / "out" / "notebooks" / "slow.ipynb", as_version=4)
    assert executed.cells[0].outputs, "the stopped notebook's executed copy is kept"


def test_gpu_check_stopped_by_sigterm_writes_its_report_and_leaves_nothing_running(
    tmp_path: Path,
) -> None:
    hung = fake_benchmark(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(120)\n")
    out = tmp_path / "out"
    command = [sys.executable, str(ROOT / "tools" / "gpu_check.py"), "--only", "benchmarks"]
    proc = subprocess.Popen(
        [*command, "--benchmarks", str(hung), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    log = out / "benchmarks" / "bench_fake.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "started" not in (
        log.read_text() if log.exists() else ""
    ):
        time.sleep(0.2)
    bench = [
        p
        for p in psutil.Process(proc.pid).children(recursive=True)
        if "bench_fake" in " ".join(p.cmdline())
    ]
    proc.send_signal(signal.SIGTERM)  # gpu_check alone, as an outer `timeout` does
    assert proc.wait(timeout=60) == 1
    assert bench and not [p for p in bench if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    text = (out / "summary.md").read_text()
    assert "- gpu_check was stopped by SIGTERM" in text
    assert "bench_fake.py: STOPPED: gpu_check was stopped by SIGTERM" in text


def test_an_error_in_gpu_check_itself_comes_with_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_process_machine(monkeypatch)
    monkeypatch.setattr(
        machine_mod, "read_state", lambda machine, timeout=0: {"text": "-", "quiet": None}
    )

    def broken(item, out, args, limit):  # noqa: ANN001, ANN202
        raise KeyError("no such field in the report")

    monkeypatch.setitem(run_mod.RUNNERS, "benchmarks", broken)
    bench = fake_benchmark(tmp_path, "print('x')\n")
    assert (
        gpu_check.main(["--only", "benchmarks", "--benchmarks", str(bench), "--out", str(tmp_path)])
        == 1
    )
    text = (tmp_path / "summary.md").read_text()
    assert "KeyError in gpu_check, not in the benchmarks: 'no such field in the report'" in text
    assert "Traceback of bench_fake.py (not a cell's or a test's error):" in text
    assert 'raise KeyError("no such field in the report")' in text


def test_the_machine_state_names_gpu_co_tenants_and_cpu_load(fake_gpu) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm", count=2)
    gpu.nvml.processes = {1: [(4242, 2 * 2**30)]}
    reading = machine_mod.state_reading(["cuda:0", "cuda:1"])
    assert reading["quiet"] is False
    assert "cuda:0: machine:" in reading["text"] and "cuda:1: machine: BUSY" in reading["text"]
    assert "GPU shared with 1 other compute process(es), holding 2.00 GiB" in reading["caveat"]
    assert "torch" in reading["text"] and "thread" in reading["text"]
    state = machine_mod.StageState("chapters", reading, reading, others_cores=0.5, seconds=60)
    table = machine_mod.states_markdown([state], 16)
    assert "| chapters | cuda:0: machine:" in table and "0.5 of 16 cores, over 60 s" in table
    assert "Timings of these phases ran on a busy machine: chapters (" in table
    assert "GPU shared with 1 other compute process(es)" in table.split("busy machine")[1]


def test_each_reference_folder_says_what_it_holds_and_under_what_conditions() -> None:
    folders = sorted(p for p in (ROOT / "reference").iterdir() if p.is_dir())
    assert ROOT / "reference" / "nvidia-h100-80gb-hbm3" in folders
    for folder in folders:
        files = {p.name for p in folder.iterdir()}
        if files == {"summary.md"}:  # a fresh gpu_check summary says it all itself
            continue
        readme = (folder / "README.md").read_text(encoding="utf-8")
        found = re.findall(r"`([\w.-]+(?:\.(?:md|log|txt|json)|/))`", readme)
        named = {name.rstrip("/") for name in found}
        if "summary.md" not in files:  # "replaced by its `summary.md`": a later run's
            named.discard("summary.md")
        assert named <= files, f"{folder.name}/README.md names missing files: {named - files}"
        assert files - {"README.md"} <= named, f"unexplained: {files - named - {'README.md'}}"
        assert re.search(r"main at \*\*[0-9a-f]{7}\*\*", readme), "the commit it was measured at"
        assert "shared GPU" in readme and "load average" in readme, "the conditions"


def test_an_error_of_gpu_check_outside_every_item_is_in_the_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_process_machine(monkeypatch)

    def broken(self, phase, items):  # noqa: ANN001, ANN202
        raise RuntimeError("the scheduler broke")

    monkeypatch.setattr(run_mod.Check, "run_phase", broken)
    assert gpu_check.main(["--only", "tests", "--out", str(tmp_path)]) == 1
    text = (tmp_path / "summary.md").read_text()
    assert "**Result: FAILED.**" in text and "**gpu_check itself failed**" in text
    assert 'raise RuntimeError("the scheduler broke")' in text


def test_failures_logged_as_they_happen_are_named_when_pytest_has_no_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from failures_log import log_failure

    log = tmp_path / "failures.txt"
    monkeypatch.setenv("COURSE_FAILURES_LOG", str(log))
    for nodeid, failed in (
        ("tests/a.py::t1", True),
        ("tests/a.py::t2", False),
        ("tests/a.py::t1", True),
    ):
        report = pytest.TestReport(
            nodeid, ("a.py", 1, "t"), {}, "failed" if failed else "passed", None, "call"
        )
        log_failure(report)  # xdist: a worker and the controller both log
    assert run_mod.failed_before_stop(log) == ["tests/a.py::t1 (call)"]
    assert run_mod.failed_before_stop(tmp_path / "none.txt") == []


def finished_run(folder: Path, items: list[dict], gpus: str = "no GPU") -> Path:
    """An earlier run's progress.json with these items."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {"started": "then", "commit": "abc", "gpus": gpus, "used_s": 300.0, "items": items}
    (folder / "progress.json").write_text(json.dumps(data))
    return folder


def test_resume_carries_only_what_ran_the_same_way_on_the_same_gpus(tmp_path: Path) -> None:
    """The review of issue 33: a --quick or other-options result is not the full one."""
    args = gpu_check.parse_args(["--only", "tests,benchmarks"])
    items = plan_mod.plan(args, {"gpu_count": 0})
    tests = next(i for i in items if i.stage == "tests")
    bench = next(i for i in items if i.stage == "benchmarks")
    old = [
        {"stage": "tests", "name": "tests", "status": "ok", "args": [], "seconds": 5.0},
        {"stage": "benchmarks", "name": bench.name, "status": "ok", "args": bench.args},
    ]
    note = plan_mod.carry_over(items, finished_run(tmp_path / "a", old))
    assert tests.status == "pending", "the earlier run ran every test, this one the cuda ones"
    assert bench.status == "ok" and bench.earlier
    assert "1 item(s) it finished are carried over" in note and "other options" in note
    assert "300 s used" in note
    fresh = plan_mod.plan(args, {"gpu_count": 0})
    note = plan_mod.carry_over(fresh, finished_run(tmp_path / "b", old, "1 x H100"), "no GPU")
    assert all(i.status == "pending" for i in fresh) and "Not resumed" in note


def test_an_item_the_deadline_stopped_is_expected_to_take_at_least_that_long(
    tmp_path: Path,
) -> None:
    args = gpu_check.parse_args(["--only", "notebooks"])
    items = plan_mod.plan(args, {"gpu_count": 0})
    first = items[0]
    stopped = {"stage": first.stage, "name": first.name, "status": "STOPPED", "args": [],
               "seconds": 900.0, "detail": "stopped after 900 s (the --deadline of 940 s)"}  # fmt: skip
    missing = {"stage": items[1].stage, "name": items[1].name, "status": "FAILED", "args": [],
               "detail": "not run: this Python cannot import nbclient"}  # fmt: skip
    plan_mod.carry_over(items, finished_run(tmp_path, [stopped, missing]))
    assert first.status == "pending" and first.estimate == 900.0
    assert items[1].status == "pending", "modules installed since: try it again"
    sched = plan_mod.schedule(items, 1, 2, plan_mod.CALL_S)
    assert first in sched.never or any(i.name == first.name for i in sched.never)


def test_without_xdist_the_tests_get_all_the_streams_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = run_mod.importlib.util.find_spec
    monkeypatch.setattr(
        run_mod.importlib.util, "find_spec", lambda name: None if name == "xdist" else real(name)
    )
    seen = {}

    def fake_run(command, log, timeout, echo=None, append=False, threads=None, env=None):  # noqa: ANN001, ANN202
        seen.update(command=command, threads=threads)
        return run_mod.Step(command, log, returncode=5)

    monkeypatch.setattr(run_mod, "run_command", fake_run)
    item = plan_mod.Item("tests", "tests", 100, args=["-m", "cuda"], threads=5)
    args = gpu_check.parse_args([])
    run_mod.run_tests(item, tmp_path, args, run_mod.Limit(60))
    assert seen["threads"] == 5 and "-n" not in seen["command"], "one process, every thread"
    assert "-m" in seen["command"] and "cuda" in seen["command"]


def test_sigterm_during_the_machine_probe_still_writes_a_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stopped(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise run_mod.Stopped(signal.SIGTERM)

    monkeypatch.setattr(machine_mod, "machine_info", stopped)
    assert gpu_check.main(["--only", "tests", "--out", str(tmp_path)]) == 1
    assert "stopped by SIGTERM during the machine probe" in (tmp_path / "summary.md").read_text()


def test_the_plan_names_the_second_calls_deadline(capsys: pytest.CaptureFixture) -> None:
    gpu_check.main(["--plan", "--all-tests"])
    out = capsys.readouterr().out
    assert "call 1: python tools/gpu_check.py --all-tests --deadline 540 --out gpu-check/a" in out
    assert re.search(r"--deadline \d+ --resume gpu-check/a --out gpu-check/b", out)
