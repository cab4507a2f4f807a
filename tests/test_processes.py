"""helpers/processes.py: who runs, who listens, and stopping a whole process tree (chapter 4).

No torchrun here: the trees are small Python or `sleep` processes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import psutil

from helpers.processes import ProcessFamily, alive_pids, kill_tree, listening_sockets


def _sleep(seconds: float) -> subprocess.Popen:
    return subprocess.Popen(["sleep", str(seconds)], start_new_session=True)


def _family(*command: str, watch_sockets: bool = False) -> ProcessFamily:
    return ProcessFamily(list(command), dict(os.environ), watch_sockets)


def _zombie(proc: subprocess.Popen) -> subprocess.Popen:
    """Wait until `proc` has exited; it is not reaped yet: a zombie until Popen.poll or wait."""
    for _ in range(600):
        if psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.05)
    return proc


def _exited() -> subprocess.Popen:
    return _zombie(subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True))


def test_alive_pids_skips_zombies_and_unknown_pids() -> None:
    sleeper, done = _sleep(60), _exited()
    try:
        assert alive_pids([sleeper.pid, done.pid, 2**22 + 1]) == [sleeper.pid]
    finally:
        sleeper.kill()
        sleeper.wait()
        done.wait()


def test_kill_tree_stops_grandchildren_in_other_sessions() -> None:
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
        "start_new_session=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    root = psutil.Process(proc.pid)
    for _ in range(100):
        kids = root.children(recursive=True)
        if kids:
            break
        psutil.wait_procs([], timeout=0.05)
    assert kids, "the grandchild did not start"
    hit = kill_tree(root, kids)
    proc.wait(timeout=10)
    assert set(hit) >= {proc.pid, *(k.pid for k in kids)}
    assert alive_pids([proc.pid, *(k.pid for k in kids)]) == []


def test_kill_tree_kills_what_ignores_sigterm() -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(60)"
    )
    stubborn = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert stubborn.stdout.readline().strip() == "ready"  # SIGTERM is ignored from here on
    assert kill_tree(None, [psutil.Process(stubborn.pid)]) == [stubborn.pid]
    assert alive_pids([stubborn.pid]) == [], "SIGKILL after the grace period"
    stubborn.stdout.close()


def test_listening_sockets_sees_this_process() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert ("127.0.0.1", port) in listening_sockets()
    assert ("127.0.0.1", port) not in listening_sockets()


def test_family_stop_kills_the_tree_on_timeout() -> None:
    family = _family("sleep", "60")
    proc = family.proc
    _, killed = family.stop(everything=True)
    assert killed == [proc.pid]
    assert alive_pids([proc.pid]) == []
    # the exit code is not checked: psutil.wait_procs reaps the killed child, so Popen.wait
    # then reads 0; a timed-out launch is FAILED whatever its code


def test_family_stop_kills_a_root_that_still_runs() -> None:
    family = _family("sleep", "60")
    proc = family.proc
    code, killed = family.stop(everything=False)
    assert killed == [proc.pid] and code is not None and alive_pids([proc.pid]) == []


def test_family_stop_kills_an_orphan_left_after_torchrun_exited() -> None:
    family = _family(sys.executable, "-c", "pass")
    _zombie(family.proc)
    orphan, quick = _sleep(60), _sleep(0.1)
    family.seen = {p.pid: psutil.Process(p.pid) for p in (orphan, quick)}
    code, killed = family.stop(everything=False)
    quick.wait()
    assert code == 0
    assert killed == [orphan.pid], "one that ends by itself is not killed"
    assert alive_pids([orphan.pid]) == []


def test_family_stop_with_nothing_left_kills_nothing() -> None:
    family = _family(sys.executable, "-c", "pass")
    _zombie(family.proc)
    assert family.stop(everything=False) == (0, [])


def test_family_tracks_descendants_and_their_sockets() -> None:
    code = (
        "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "print(s.getsockname()[1], flush=True); time.sleep(60)"
    )
    family = _family(
        sys.executable,
        "-c",
        f"import subprocess, sys; subprocess.run([sys.executable, '-c', {code!r}])",
        watch_sockets=True,
    )
    parent = family.proc
    port = int(parent.stdout.readline())
    family.track()
    (child,) = family.seen
    assert (child, "127.0.0.1", port) in family.listening
    _, killed = family.stop(everything=True)
    assert set(killed) == {parent.pid, child} and alive_pids(killed) == []
    parent.stdout.close()
