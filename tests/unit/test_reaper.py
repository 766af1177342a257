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
