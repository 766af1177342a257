"""Unit tests of tests/support/proctree.py (the process helpers of tests and benchmarks)
on a real process tree: a shell with two sleeping children, one with a child of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from proctree import children_of, descendants, is_gone, process_state, process_title


def test_children_descendants_titles_and_exit() -> None:
    script = "sleep 60 & sh -c 'sleep 61 & wait' & wait"
    shell = subprocess.Popen(["sh", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(descendants(shell.pid)) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        below = descendants(shell.pid)
        kids = children_of(shell.pid)
        assert len(below) == 4 and shell.pid in below, below  # sh, sleep, sh, sleep
        assert len(kids) == 2 and set(kids) < below
        titles = sorted(process_title(p) for p in below)
        assert "sleep 60" in titles and "sleep 61" in titles, titles
        assert process_state(shell.pid) in ("S", "R")
        assert not is_gone(shell.pid)
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait()
    assert is_gone(shell.pid) and process_state(shell.pid) is None
    assert children_of(shell.pid) == [] and process_title(shell.pid) == ""
