"""The containment helpers on their own: a subreaper killing a tree that left it by a new
session and a double fork (real processes), and the daemons' temp directory locks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pgworkerd.daemon import containment

# In a forked process: become a subreaper, start a double-forked grandchild in a new
# session (its parent exits at once), print its pid, kill the tree, print how many died.
SCRIPT = """
import os, subprocess, sys, time
from pgworkerd.worker import reaper
reaper.become_subreaper()
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.write(w, str(os.getpid()).encode())
        time.sleep(1000)
    os._exit(0)
grandchild = int(os.read(r, 64))
time.sleep(0.2)  # its parent has exited: it is ours now
assert grandchild in reaper.children(), (grandchild, reaper.children())
same_group = subprocess.Popen(["sleep", "1000"])
print(grandchild, same_group.pid, flush=True)
print(reaper.kill_descendants(), reaper.has_children(), flush=True)
"""


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def test_a_subreaper_kills_and_reaps_its_whole_tree() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    pids = [int(p) for p in first.split()]
    try:
        # both killed, the middle one reaped (a zombie): nothing left, not even a zombie
        assert second == "3 False"
        deadline = time.monotonic() + 10
        while not all(gone(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert all(gone(p) for p in pids)
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


# In a subprocess, the daemon's position: a subreaper with a job child still starting
# (pgworkerd's code, its pid not yet known: no hello) and a process a dead job child left
# behind (re-parented to us). The sweep must not wait for the hello to kill the orphan,
# even one whose name starts like pgworkerd's (the chaos soak's leftovers are named
# "pgworkerd-chaos-leftover-..."; spared, they outlived a daemon killed before its full
# sweep). Only pgworkerd's own titles ("pgworkerd: ...") and the fork server are spared.
EARLY_SWEEP_SCRIPT = """
import os, signal, subprocess, time
from pgworkerd.daemon.containment import Containment
from pgworkerd.worker import reaper

def exited(pid):  # reaped here within 30 s (a SIGKILLed process exits at once)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
        time.sleep(0.01)
    return False

reaper.become_subreaper()
starting = subprocess.Popen(["bash", "-c", 'exec -a "pgworkerd: idle child" sleep 1000'])
orphan = None
try:
    left = subprocess.run(
        ["bash", "-c", 'exec -a pgworkerd-lookalike sleep 1000 >/dev/null 2>&1 & echo $!'],
        capture_output=True,
        text=True,
    )
    orphan = int(left.stdout)
    deadline = time.monotonic() + 30
    while not (
        orphan in reaper.children() and reaper.runs_pgworkerd(starting.pid)
    ) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert orphan in reaper.children() and reaper.runs_pgworkerd(starting.pid)
    assert not reaper.runs_pgworkerd(orphan)
    c = Containment()
    c.child_exited(None)  # a job child was reaped: what it left is ours
    c.sweep(set(), pids_known=False)  # a child is starting
    assert exited(orphan), "the orphan was left for the starting child's hello"
    orphan = None
    assert starting.poll() is None, "a child still starting was killed"
    c.sweep(set(), pids_known=False)
    assert starting.poll() is None  # once per reaping, never before its hello
    c.sweep({starting.pid}, pids_known=True)  # its hello came: the full sweep spares it
    assert starting.poll() is None
finally:
    for pid in (starting.pid, orphan):
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
print("ok", flush=True)
"""


def test_orphans_are_killed_while_a_child_is_still_starting_and_it_is_spared() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", EARLY_SWEEP_SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n"


def test_a_dead_daemons_temp_directory_is_removed_a_live_ones_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    live, dead = containment.Containment(), containment.Containment()
    live.start()
    dead.start()
    assert live.tmp_root and dead.tmp_root
    root = Path(live.tmp_root).parent
    assert root == tmp_path / f"pgworkerd-{os.getuid()}"
    assert (root.stat().st_mode & 0o777) == 0o700
    (Path(dead.tmp_root) / "123-1").mkdir()
    assert dead._lock_fd is not None
    os.close(dead._lock_fd)  # as its process's death would
    dead._lock_fd = None

    assert containment.remove_abandoned(str(root)) == 1
    assert not Path(dead.tmp_root).exists()
    assert Path(live.tmp_root).exists()
    Path(live.tmp_root, "4242-1").mkdir()
    live.child_exited(4242)  # a child killed before it removed its own
    assert not Path(live.tmp_root, "4242-1").exists()
    assert live._lock_fd is not None
    os.close(live._lock_fd)  # (not close(): that kills the test process's children)


def test_a_shared_root_not_private_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    (tmp_path / f"pgworkerd-{os.getuid()}").mkdir(mode=0o777)
    os.chmod(tmp_path / f"pgworkerd-{os.getuid()}", 0o777)  # (umask)
    c = containment.Containment()
    c.start()
    assert c.tmp_root is not None
    assert Path(c.tmp_root).parent == tmp_path
    assert Path(c.tmp_root).name.startswith("pgworkerd-")
