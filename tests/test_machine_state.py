"""helpers.machine_state: co-tenants on the GPU, other processes' CPU use, threads.

Every branch that reads the GPU runs here through the fake GPU (tests/fake_gpu.py)."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest
import torch

from helpers import machine_state as ms
from helpers.machine_state import GpuTenants, MachineState, MachineWatch, gpu_tenants, machine_state
from helpers.timing import benchmark
from helpers.units import MiB


def state(**kw) -> MachineState:  # noqa: ANN003
    base = dict(
        device="cuda:0",
        torch_threads=6,
        usable_cores=6,
        system_cores=16,
        load_1min=2.0,
        gpu=GpuTenants(0),
    )
    return MachineState(**(base | kw))


def test_a_cpu_reading_is_quiet_on_an_idle_machine() -> None:
    s = machine_state("cpu")
    assert s.gpu.count is None and s.torch_threads == torch.get_num_threads()
    assert s.system_cores == psutil.cpu_count() and s.usable_cores >= 1
    assert "torch" in str(s) and "thread" in str(s)


def test_other_compute_processes_on_the_timed_gpu_are_counted(fake_gpu) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm", count=2)
    gpu.nvml.processes = {1: [(os.getpid(), 900 * MiB), (4242, 29 * 1024 * MiB)]}
    assert gpu_tenants("cuda:1").count == 1  # our own pid is not a tenant
    assert gpu_tenants("cuda:1").memory == 29 * 1024 * MiB
    assert gpu_tenants("cuda:0").count == 0  # the other GPU is free
    s = machine_state("cuda:1")
    assert s.gpu_shared and not s.quiet
    assert "GPU shared with 1 other compute process(es), holding 29.00 GiB" in s.caveat()
    assert gpu.nvml.init_count == 0, "NVML is shut down after each reading"


def test_host_pids_in_a_container_count_one_process_as_ours(fake_gpu, monkeypatch) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm")
    gpu.nvml.processes = {0: [(777001, None), (777002, None)]}  # pids of the host's namespace
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    gpu.reserved = 64 * MiB  # this process holds memory there: it has a context
    tenants = gpu_tenants("cuda:0")
    assert tenants.count == 1 and "namespace" in tenants.note
    gpu.nvml.processes = {0: [(777001, None)]}
    assert gpu_tenants("cuda:0").count == 0  # the one process on the GPU is this one


@pytest.mark.parametrize(
    ("kind", "reason"),
    [("mi300x", "rocm-smi"), ("mps", "not read on mps")],
)
def test_gpus_without_nvml_say_why(fake_gpu, kind, reason) -> None:  # noqa: ANN001
    gpu = fake_gpu(kind)
    tenants = gpu_tenants(gpu.device)
    assert tenants.count is None and reason in tenants.note
    assert "unknown" in str(tenants)


def test_nvml_that_cannot_list_processes_is_reported(fake_gpu) -> None:  # noqa: ANN001
    gpu = fake_gpu("a100")
    gpu.nvml.unsupported = {"processes"}
    tenants = gpu_tenants("cuda:0")
    assert tenants.count is None and "could not list" in tenants.note
    gpu.nvml.driver_present = False
    assert "NVML unavailable" in gpu_tenants("cuda:0").note


def test_loaded_means_other_processes_took_cores() -> None:
    assert not state(others_cores=0.3, window_s=1.0).cpu_loaded
    loaded = state(others_cores=9.0, window_s=1.0)
    assert loaded.cpu_loaded and "kept 9.0 cores busy" in loaded.caveat()
    # no window: only a load average clearly above the cores counts
    assert not state(load_1min=15.0).cpu_loaded
    assert state(load_1min=21.3).cpu_loaded
    assert not state(load_1min=None).cpu_loaded


def test_merge_keeps_the_busiest_reading() -> None:
    merged = ms.merge_states(
        [state(others_cores=0.1, window_s=0.5), state(gpu=GpuTenants(2, 10 * MiB), load_1min=3.0)]
    )
    assert merged.gpu.count == 2 and merged.load_1min == 3.0 and merged.others_cores == 0.1
    assert ms.merge_states([]) is None


def test_a_watch_sees_another_process_busy(tmp_path) -> None:  # noqa: ANN001
    import subprocess
    import sys

    # Another process, not a child of this one (a child's CPU time is this job's own work, see
    # the tests below): a shell starts the busy loop in the background, prints its pid and
    # exits, so the loop is re-parented away from this process.
    spawn = f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"
    pid = int(
        subprocess.run(["sh", "-c", spawn], capture_output=True, text=True, check=True).stdout
    )
    try:
        assert pid not in {c.pid for c in psutil.Process().children(recursive=True)}
        time.sleep(0.2)
        with MachineWatch("cpu", threads=1) as watch:
            time.sleep(0.6)
    finally:
        os.kill(pid, signal.SIGKILL)
    s = watch.state
    assert s.torch_threads == 1 and s.window_s >= 0.5
    assert s.others_cores > 0.5, s  # the busy loop kept about one core busy


def test_a_watch_subtracts_its_own_cpu_time(monkeypatch) -> None:  # noqa: ANN001
    # 2 s of window: the machine was busy 3.0 core-seconds, 2.2 of them this process's own.
    clock = iter([100.0, 102.0])
    busy, own = iter([50.0, 53.0]), iter([10.0, 12.2])
    monkeypatch.setattr(ms.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(ms, "_busy_seconds", lambda: next(busy))
    monkeypatch.setattr(ms, "_own_seconds", lambda: next(own))
    with MachineWatch("cpu") as watch:
        pass
    assert watch.state.others_cores == pytest.approx(0.4) and watch.state.window_s == 2.0


def test_a_short_window_tells_nothing_about_other_processes(monkeypatch) -> None:  # noqa: ANN001
    # A window shorter than MIN_WINDOW_S, by the clock the watch reads (a real empty `with` can
    # take longer than that on a loaded machine: a 16-core box at load 70 did, 2026-11-27).
    clock = iter([100.0, 100.0 + ms.MIN_WINDOW_S / 2])
    monkeypatch.setattr(ms.time, "perf_counter", lambda: next(clock))
    with MachineWatch("cpu") as watch:
        pass
    assert watch.state.others_cores is None and watch.state.window_s is None


def test_benchmark_records_the_machine_state() -> None:
    result = benchmark(torch.ones, 8, min_run_time=0.12)
    assert isinstance(result.machine, MachineState)
    assert result.machine.torch_threads == result.num_threads
    assert result.machine.window_s is not None


def test_benchmark_on_a_shared_gpu_says_so(fake_gpu) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm")
    gpu.nvml.processes = {0: [(4242, 1 * MiB)]}
    result = benchmark(lambda: time.sleep(0.001), device="cuda", min_run_time=0.05)
    assert result.method == "CUDA events" and result.machine.gpu_shared


def test_finished_children_count_as_this_job_s_own_work() -> None:
    import subprocess
    import sys

    before = ms._own_seconds()
    busy = "import time\nwhile time.process_time() < 0.3: pass"  # 0.3 s of CPU, however loaded
    subprocess.run([sys.executable, "-c", busy], check=True)
    # 10 ms clock ticks: at least 0.28 s of the child's 0.3 s lands in this process's count
    assert ms._own_seconds() - before >= 0.28  # so a watch does not call it another's load


def test_a_process_without_a_context_is_not_taken_for_a_listed_one(fake_gpu, monkeypatch) -> None:  # noqa: ANN001
    gpu = fake_gpu("h100_sxm")
    gpu.nvml.processes = {0: [(777001, None)]}  # another container's process, host pid
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # CUDA queried, no memory
    assert gpu_tenants("cuda:0").count == 1


def test_running_children_count_as_this_job_s_own_work() -> None:
    import subprocess
    import sys

    busy = "import time\nwhile time.process_time() < 0.6: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", busy])
    try:
        before, deadline = ms._own_seconds(), time.perf_counter() + 20
        while ms._own_seconds() - before < 0.3 and time.perf_counter() < deadline:
            time.sleep(0.05)  # however loaded the machine, the child gets its 0.6 s in the end
        assert ms._own_seconds() - before >= 0.3  # the running child's CPU time is ours
    finally:
        child.kill()
        child.wait()
