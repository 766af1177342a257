"""Unit tier: the watcher's stop of a job's tree (pgworkerd.worker.watcher.stop_tree) on a
real tree: a shell that ignores the fence signal's usual handlers, with a child in a
session of its own that forks a grandchild; and the reason in the exit status."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from proctree import descendants, is_gone

from pgworkerd.daemon.supervisor import describe_exit
from pgworkerd.worker.watcher import LEASE_SIGNAL, MEMORY_SIGNAL, stop_tree


def test_stop_tree_kills_every_descendant_and_ends_the_root_with_the_reason() -> None:
    script = "setsid sh -c 'sleep 60 & sleep 61 & wait' & sleep 62 & wait"
    shell = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(below := descendants(shell.pid) - {shell.pid}) < 4:
            assert time.monotonic() < deadline, below
            time.sleep(0.01)
        called: list[bool] = []
        stop_tree(shell.pid, LEASE_SIGNAL, skip=set(), before_end=lambda: called.append(True))
        assert shell.wait(timeout=10) == -LEASE_SIGNAL and called == [True]
        for pid in below:  # (zombies until init reaps them count as gone)
            deadline = time.monotonic() + 10
            while not is_gone(pid):
                assert time.monotonic() < deadline, f"{pid} outlived the stop"
                time.sleep(0.01)
    finally:
        if shell.poll() is None:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()


def test_the_watchers_signals_are_read_as_their_reasons() -> None:
    lease = describe_exit(LEASE_SIGNAL)  # a wait status: killed by that signal
    assert lease == "stopped: its lease ran out without renewal (daemon or database too slow)"
    assert "memory limit" in describe_exit(MEMORY_SIGNAL)
