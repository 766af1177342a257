"""A job child's own uid ([worker] job_uids, README "Per-job uids").

With job_uids set, the daemon (root) hands every child it spawns a uid of the range that
no other live child holds, and the child, forked by the root fork server, becomes that
user before it says hello, so before any handler code runs:

- its private directory `<daemon's temp dir>/PID-uUID` (mode 0700, owned by the uid) is
  made while it is still root: its attempts' TMPDIRs go in there (pgworkerd.worker.tmpdirs),
  and the daemon removes it with the child's other leftovers (by the `PID-` prefix);
- then, irrevocably: no supplementary groups, gid = uid, uid (real, effective and saved:
  the kernel drops every capability), no new privileges (a setuid program cannot give
  them back), not dumpable (its /proc files are root's: no other process of any job may
  open its descriptors, memory or environment, nor ptrace it);
- then it kills every process of that uid (kill(-1) as that user): what an earlier child
  of the same uid may have left. From here on the child owns the uid alone, so its
  reaper sweeps kill by uid too (pgworkerd.worker.reaper.own_uid), which reaches a
  process that left the tree (clone(CLONE_PARENT)) as well.

Another job, another uid: it can neither signal these processes nor open their /proc
files, their output (a root-owned file in the daemon's 0711 directory, held open) or their
TMPDIR; nor the daemon's and the fork server's (root), nor the daemon's config (which the
daemon refuses to start with when others can read it: pgworkerd.daemon.jobuids).

Dependency-free: the job's child imports it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

from pgworkerd.worker import reaper

PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3
PR_SET_NO_NEW_PRIVS = 38
PR_GET_NO_NEW_PRIVS = 39
# Loaded once in the fork server (which preloads this module), not in every child.
_libc = ctypes.CDLL(None, use_errno=True)


class DropFailed(RuntimeError):
    """The child could not become its job user: it must not run any job."""


def home_for(root: str, uid: int) -> str:
    """The private directory of this child (PID-uUID: the daemon's removal of a child's
    leftovers goes by the `PID-` prefix)."""
    return os.path.join(root, f"{os.getpid()}-u{uid}")


def become(uid: int, tmp_root: str | None) -> str | None:
    """Make this child's private directory, then become `uid` for good (see the module
    doc). Returns the directory for its attempts' TMPDIRs (None: none could be made; the
    attempts then run with the inherited TMPDIR, which the child says on stderr). Raises
    DropFailed if any step of the drop did not take."""
    home = None
    if tmp_root is not None:
        path = home_for(tmp_root, uid)
        try:
            os.mkdir(path, 0o700)
            os.chown(path, uid, uid)
            home = path
        except OSError as exc:
            print(f"pgworkerd child {os.getpid()}: no private TMPDIR: {exc}", file=sys.stderr)
    try:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    except OSError as exc:
        raise DropFailed(f"cannot become uid {uid}: {exc}") from exc
    libc = _libc
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise DropFailed(f"prctl(PR_SET_NO_NEW_PRIVS): errno {ctypes.get_errno()}")
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise DropFailed(f"prctl(PR_SET_DUMPABLE): errno {ctypes.get_errno()}")
    _verify(uid, libc)
    reaper.own_uid = True
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)  # (never this process itself)
    return home


def set_dumpable(dumpable: bool) -> None:
    """Whether processes of this uid may open this process's /proc files (descriptors,
    memory, environment) and ptrace it; not dumpable: root's alone. (Reset to dumpable by
    an exec; kept across fork.)"""
    _libc.prctl(PR_SET_DUMPABLE, 1 if dumpable else 0, 0, 0, 0)


def _verify(uid: int, libc: ctypes.CDLL) -> None:
    """Check that the drop took and cannot be undone; DropFailed if not."""
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid):
        raise DropFailed(f"uid/gid are {os.getresuid()}/{os.getresgid()}, not {uid}")
    if os.getgroups():
        raise DropFailed(f"supplementary groups left: {os.getgroups()}")
    if libc.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 1 or libc.prctl(PR_GET_DUMPABLE) != 0:
        raise DropFailed("no_new_privs or dumpable did not take")
    with open("/proc/self/status") as f:
        caps = {k: v.strip() for k, _, v in (line.partition(":") for line in f) if k[:3] == "Cap"}
    if any(int(caps.get(k, "1"), 16) for k in ("CapPrm", "CapEff", "CapAmb")):
        raise DropFailed(f"capabilities left: {caps}")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise DropFailed("setuid(0) succeeded after the drop")
