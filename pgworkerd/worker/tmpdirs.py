"""A private temp directory per attempt: TMPDIR for the handler and what it starts.

Layout: the daemon's own directory (pgworkerd.daemon.containment makes it and holds a lock
on it for its life) holds the attempts' directories, named `PID-N` after the child that
runs them (its Nth). Making and removing a directory costs journal writes, milliseconds
on a busy disk, so neither is on a job's path: the child makes the next one while it
waits for a job, and removes it after it has reported the outcome (the attempt's
processes were killed before: nothing writes into it any more). The daemon removes a
dead child's leftovers by that PID prefix, and the next daemon to start removes whole
directories of daemons that died (kill -9). A reused child gives the next attempt the
same directory when the last one left it empty and as it was made (renew): no journal
write at all between two short jobs.

Dependency-free: the job's child imports it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass

_numbers = itertools.count(1)


@dataclass(frozen=True)
class Scratch:
    """An attempt's temp directory and what TMPDIR was before it."""

    path: str
    previous_env: str | None
    previous_tempdir: str | None


_current: str | None = None  # the directory a running attempt uses


def prepare(root: str | None) -> str | None:
    """Make the next attempt's directory (mode 0700). None when there is no root (a
    supervisor without containment) or it cannot be made: the attempt then runs with
    the inherited TMPDIR, and says so on stderr."""
    if root is None:
        return None
    path = os.path.join(root, f"{os.getpid()}-{next(_numbers)}")
    try:
        os.mkdir(path, 0o700)
    except OSError as exc:
        print(f"pgworkerd child {os.getpid()}: no private TMPDIR: {exc}", file=sys.stderr)
        return None
    return path


def enter(path: str | None) -> Scratch | None:
    """Point TMPDIR (and the tempfile module, which caches its choice) at `path`."""
    global _current
    if path is None:
        return None
    _current = path
    scratch = Scratch(path, os.environ.get("TMPDIR"), tempfile.tempdir)
    os.environ["TMPDIR"] = path
    tempfile.tempdir = path
    return scratch


def leave(scratch: Scratch | None) -> None:
    """Restore TMPDIR (for the child's next job); the directory is removed later."""
    if scratch is None:
        return
    if scratch.previous_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = scratch.previous_env
    tempfile.tempdir = scratch.previous_tempdir


def renew(path: str | None, root: str | None) -> str | None:
    """The next attempt's directory, after an attempt that used `path`: `path` itself if
    it is as prepare() made it (an empty directory of this uid, mode 0700, not a link),
    else a new one (and `path` removed). A mkdir and an rmdir cost a short job more than
    it runs on a disk PostgreSQL keeps busy; an empty directory left as it was given
    carries nothing from one attempt to the next (which share this process anyway)."""
    if path is not None and root is not None and _pristine(path):
        return path
    remove(path)
    return prepare(root)


def _pristine(path: str) -> bool:
    try:
        st = os.lstat(path)
        if not (
            stat.S_ISDIR(st.st_mode)
            and stat.S_IMODE(st.st_mode) == 0o700
            and st.st_uid == os.geteuid()
        ):
            return False
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def remove(path: str | None) -> None:
    global _current
    if path is not None:
        if os.path.islink(path):  # put there by the attempt: rmtree refuses a link
            with contextlib.suppress(OSError):
                os.unlink(path)
        shutil.rmtree(path, ignore_errors=True)
        if _current == path:
            _current = None


def remove_current() -> None:
    """Remove the running attempt's directory, if any (the child is stopping itself)."""
    remove(_current)


def remove_child_dirs(root: str, pid: int) -> None:
    """Remove what a child that has exited left (it was killed before it could)."""
    prefix = f"{pid}-"
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
