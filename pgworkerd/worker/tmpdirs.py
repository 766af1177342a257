"""A private temp directory per attempt: TMPDIR for the handler and what it starts.

Layout: the daemon's own directory (pgworkerd.daemon.containment makes it and holds a lock
on it for its life) holds one directory per attempt, named `PID-job-ID-ATTEMPT` after the
child that runs it. The child makes it when the attempt starts and removes it when the
attempt ends (after killing the attempt's processes, so nothing writes into it any more);
the daemon removes a dead child's leftovers by that PID prefix, and the next daemon to
start removes whole directories of daemons that died (kill -9).

Dependency-free: the job's child imports it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Scratch:
    """An attempt's temp directory and what TMPDIR was before it."""

    path: str
    previous_env: str | None
    previous_tempdir: str | None


_current: Scratch | None = None


def attempt_dir(root: str, pid: int, job_id: int, attempt: int) -> str:
    return os.path.join(root, f"{pid}-job-{job_id}-{attempt}")


def enter(root: str | None, job_id: int, attempt: int) -> Scratch | None:
    """Make the attempt's directory and point TMPDIR (and the tempfile module) at it.
    None when there is no root (a supervisor without containment) or it cannot be made:
    the attempt then runs with the inherited TMPDIR, and says so on stderr."""
    global _current
    if root is None:
        return None
    path = attempt_dir(root, os.getpid(), job_id, attempt)
    try:
        shutil.rmtree(path, ignore_errors=True)  # a leftover of the same pid: not ours
        os.mkdir(path, 0o700)
    except OSError as exc:
        print(f"pgworkerd child {os.getpid()}: no private TMPDIR: {exc}", file=sys.stderr)
        return None
    _current = Scratch(path, os.environ.get("TMPDIR"), tempfile.tempdir)
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path  # tempfile caches its choice: set it, no probing
    return _current


def leave(scratch: Scratch | None) -> None:
    """Remove the attempt's directory and restore TMPDIR (for the child's next job)."""
    global _current
    if scratch is None:
        return
    _current = None
    shutil.rmtree(scratch.path, ignore_errors=True)
    if scratch.previous_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = scratch.previous_env
    tempfile.tempdir = scratch.previous_tempdir


def leave_current() -> None:
    """Remove the running attempt's directory, if any (the child is stopping itself)."""
    leave(_current)


def remove_child_dirs(root: str, pid: int) -> None:
    """Remove what a child that has exited left (it was killed before it could)."""
    prefix = f"{pid}-job-"
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
