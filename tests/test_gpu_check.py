"""tools/gpu_check.py on a CPU: every part with tiny inputs, and its GPU branches on fake GPUs."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import gpu_check
import nbformat
import pytest
import torch

from helpers import launch as torchrun
from helpers.launch import LaunchResult
from helpers.scripts.one_launch import split_jobs

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
    monkeypatch.setattr(gpu_check, "machine_info", lambda *a, **k: gpu_check.probe_machine())


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


def test_a_hung_benchmark_is_stopped_and_reported(tmp_path: Path) -> None:
    hung = fake_benchmark(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    broken = fake_benchmark(tmp_path, "raise SystemExit('no device')\n", "bench_broken.py")
    args = gpu_check.parse_args(
        ["--benchmarks", str(hung), str(broken), "--benchmark-timeout", "2"]
    )
    part = gpu_check.run_benchmarks(tmp_path, args)
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
    for stem, flags in gpu_check.QUICK_BENCHMARK_ARGS.items():
        source = (ROOT / "benchmarks" / f"{stem}.py").read_text()
        for flag in (f for f in flags if f.startswith("--")):
            assert f'"{flag}"' in source, f"{stem}.py has no {flag} option"
    for path in (*gpu_check.QUICK_NOTEBOOKS, *gpu_check.QUICK_TESTS):
        assert (ROOT / path).exists(), path
    for script, flags in gpu_check.NCCL_SCRIPTS.items():
        source = torchrun.script_path(script).read_text()
        assert all(f'"{f}"' in source for f in flags if f.startswith("--")), script


def test_pytest_uses_xdist_only_where_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = gpu_check.importlib.util.find_spec
    args = gpu_check.parse_args([])
    for present in (True, False):
        monkeypatch.setattr(
            gpu_check.importlib.util,
            "find_spec",
            lambda name, present=present: (
                (object() if present else None) if name == "xdist" else real(name)
            ),
        )
        command = gpu_check.pytest_command(args, tmp_path / "t.xml")
        assert ("-n" in command) is present
        assert "tests" in command and "--ignore=tests/browser" in command


def test_a_part_whose_modules_are_missing_fails_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_process_machine(monkeypatch)
    monkeypatch.setitem(gpu_check.NEEDS, "benchmarks", ("torch", "no_such_module_here"))
    status = gpu_check.main(["--only", "benchmarks", "--out", str(tmp_path)])
    assert status == 1
    text = (tmp_path / "summary.md").read_text()
    assert "cannot import no_such_module_here" in text and "carry the wheels" in text


def test_nccl_world_sizes() -> None:
    assert gpu_check.nccl_world_sizes(0) == []
    assert gpu_check.nccl_world_sizes(1) == [1]
    assert gpu_check.nccl_world_sizes(2) == [1, 2]
    assert gpu_check.nccl_world_sizes(8) == [1, 2]


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

    def __call__(self, script, nproc, args, *, backend, timeout, echo, check, env) -> LaunchResult:  # noqa: ANN001
        self.calls.append((script, nproc, backend))
        assert check is False and timeout > 0
        assert env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT), "ranks import this checkout"
        result = LaunchResult(command=["torchrun"], nproc=nproc, backend=backend, seconds=0.5)
        echo(f"[course] process group ready: {nproc} rank(s), backend {backend}")
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
    assert (tmp_path / "nccl" / "ddp_train-nccl-x2.log").read_text().startswith("[course]")
    assert "reference/nvidia-h100-80gb-hbm3" in capsys.readouterr().out


def test_one_fake_gpu_reports_a_failed_launch_and_wrong_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_gpu
) -> None:  # noqa: ANN001
    fake_gpu("a100", count=1)
    machine = gpu_check.probe_machine()
    assert machine["gpu_count"] == 1 and machine["gpus"][0]["name"] == "NVIDIA A100-SXM4-80GB"
    launcher = FakeLauncher(fail="fsdp_vs_ddp", wrong="ddp_train")
    monkeypatch.setattr(torchrun, "launch", launcher)
    part = gpu_check.run_nccl(tmp_path, gpu_check.parse_args([]), machine)
    assert [c[1] for c in launcher.calls] == [1, 1, 1], "one GPU: world size 1 only"
    assert part.status == "FAILED"
    assert any("parameters differ between ranks" in p for p in part.problems)
    # the wrong ddp_train results are found inside the one launch too, named by job
    assert any(p.startswith("one_launch x1: ddp_train: parameters differ") for p in part.problems)
    assert any("NCCL error" in p for p in part.problems)


def test_amd_and_apple_machines_are_described(fake_gpu) -> None:  # noqa: ANN001
    fake_gpu("mi300x", count=1)
    amd = gpu_check.probe_machine()
    text = gpu_check.machine_markdown(amd)
    assert "AMD Instinct MI300X" in text and "ROCm (HIP" in text
    assert gpu_check.slug(amd) == "amd-instinct-mi300x"
    fake_gpu("mps")
    mac = gpu_check.probe_machine()
    assert mac["gpu_count"] == 0 and gpu_check.gpu_summary(mac) == "no GPU (Apple MPS available)"
    part = gpu_check.run_nccl(Path("unused"), argparse.Namespace(), mac)
    assert part.status == "skipped" and "no GPU" in part.markdown


def test_the_real_probe_runs_in_a_subprocess() -> None:
    machine = gpu_check.machine_info()
    assert machine["torch"] == torch.__version__
    assert machine["cores"] >= 1 and isinstance(machine["gpus"], list)


def test_manual_allreduce_results_are_checked() -> None:
    good = good_results("manual_allreduce", 2)
    assert gpu_check.check_results("manual_allreduce", good) == []
    good[1]["averaged"] = [torch.zeros(3)]
    good[0]["no_division"] = [torch.ones(3)]  # the sum, not 2 x the average
    wrong = gpu_check.check_results("manual_allreduce", good)
    assert "rank 1: averaged gradients differ from rank 0's" in wrong
    assert "rank 0: the sum is not world size x the average" in wrong
