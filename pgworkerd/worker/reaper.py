"""Containment of a job's process tree: nothing a handler starts outlives its attempt.

Both the job's child and the daemon are child subreapers (PR_SET_CHILD_SUBREAPER): a
process whose parent dies is re-parented to its nearest subreaper ancestor, not to init.
So every process a handler starts stays below the job's child (a new session or a double
fork does not leave the tree), and when the child itself is killed its leftovers come to
the daemon. Whoever holds them kills them:

- the job's child at the end of every attempt (kill_descendants: SIGKILL its children,
  reap them, and again for the grandchildren that were re-parented to it meanwhile,
  until it has none), and before it stops itself (the daemon gone);
- the child's watcher, when it stops the job (its lease ran out, its memory limit, the
  daemon gone while the handler holds the GIL): pgworkerd.worker.watcher.stop_tree,
  which freezes the tree before it signals it, since those are not its children;
- the daemon, whenever one of its job children has died (kill_adopted: every child of
  the daemon that is neither its fork server nor a job child it knows).

Here, only direct children are ever signalled: their pids cannot be reused until they are
reaped, so a signal never reaches an unrelated process that got a recycled pid. Children
are listed from /proc/self/task/*/children (a few small reads), not by scanning /proc,
and only when a waitid() says there is a child at all (one system call; a job child
always has one, its watcher, which it leaves out).

Dependency-free: the job's child imports it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time
from collections.abc import Callable

PR_SET_CHILD_SUBREAPER = 36
# The exit code of a job child that stopped itself (its lease ran out without renewal, or
# the daemon died) after killing its processes: the daemon says so (describe_exit).
FENCED_EXIT = 117
# A sweep gives up after this long (a process stuck in uninterruptible sleep, such as on
# a dead NFS server, cannot die until the kernel lets it): the attempt still ends.
SWEEP_LIMIT = 5.0
# Set in a job child that owns its uid alone ([worker] job_uids, pgworkerd.worker.identity):
# its sweeps then also kill every process of that uid, wherever it is in the process tree.
own_uid = False


def become_subreaper() -> None:
    """Make orphaned descendants of this process its children (Linux 3.4+)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def has_children() -> bool:
    """Whether this process has any child, running or a zombie (not reaping any)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def children(*, main_thread_only: bool = False) -> set[int]:
    """This process's children (zombies too): the union over its threads (a thread's
    subprocess is that thread's child). Orphans are always adopted by the main thread, the
    first live thread: `main_thread_only` suffices for a process whose other threads
    start no processes (the daemon)."""
    found: set[int] = set()
    try:
        tasks = [str(os.getpid())] if main_thread_only else os.listdir("/proc/self/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/children", "rb") as f:
                found.update(int(p) for p in f.read().split())
        except OSError:  # the thread ended meanwhile
            continue
    return found


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def _reap(pid: int) -> bool:
    """Reap `pid` if it has exited; True when it is gone (reaped here or elsewhere)."""
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True  # reaped by someone else (a handler thread's Popen.wait)
    return done == pid


def kill_descendants(limit: float = SWEEP_LIMIT, keep: frozenset[int] = frozenset()) -> int:
    """Kill and reap every descendant of this process but the children in `keep` (the
    job child's watcher); returns how many it killed.

    For the job's child, which must be a subreaper: a killed child's own children are
    re-parented here at its exit, so repeating until no child is left reaches the whole
    tree, whatever sessions or double forks it used. A process that forks while this
    runs cannot escape either: its new child is re-parented here once it dies.

    Waits by pid (never waitpid(-1)): a thread of the handler may still be waiting for
    its own subprocess with Popen.wait, which reaps by pid and copes with ECHILD.
    Cost when there is nothing to kill: one directory listing and a read per thread."""
    killed: set[int] = set()
    deadline = time.monotonic() + limit
    if own_uid:
        # kill(-1) as the job's own user: every process of the uid but this one, at once,
        # those that left the tree (clone(CLONE_PARENT)) too; children are reaped below
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
    while True:
        left = children() - keep if has_children() else set()
        if not left:
            return len(killed)
        for pid in left:
            _kill(pid)
        killed |= left
        gone = {pid for pid in left if _reap(pid)}
        if gone != left:
            if time.monotonic() > deadline:
                return len(killed)
            time.sleep(0.001)  # SIGKILLed processes take a moment to exit


def runs_pgworkerd(pid: int) -> bool:
    """Whether child `pid` runs pgworkerd's own code, by its command line: a job child
    still starting (forked by the fork server, `python -P -m pgworkerd.worker.forkserver`,
    then titled `pgworkerd: ...`), or a fork of one that never exec'd. A child's pid is
    not reused before it is reaped, so the read is about that process."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read(4096)
    except OSError:
        return False  # exited meanwhile
    # "pgworkerd: ", not "pgworkerd": a handler's process named "pgworkerd-..." (the chaos
    # soak's leftovers are) was spared, and outlived a daemon killed before its full sweep.
    # (A handler can still take a title of ours; the full sweep, by pid, kills it.)
    return command.startswith(b"pgworkerd: ") or b"pgworkerd.worker.forkserver" in command


def kill_adopted(keep: set[int], spare: Callable[[int], bool] | None = None) -> list[int]:
    """SIGKILL every child of this process whose pid is not in `keep` (nor `spare`d);
    returns them.

    For the daemon: its own children are the fork server and the job children; any other
    child was adopted, as a subreaper, from a job child that died before it could kill
    it (SIGKILL after a timeout, kill -9). They are reaped where the daemon reaps: its
    SIGCHLD path, which calls this again for the grandchildren re-parented meanwhile."""
    adopted = sorted(
        pid for pid in children(main_thread_only=True) - keep if spare is None or not spare(pid)
    )
    for pid in adopted:
        _kill(pid)
    return adopted


def kill_all_children(limit: float = SWEEP_LIMIT) -> int:  # (all threads: it is rare)
    """The daemon's last act: kill and reap every process it still has (job children and
    what was adopted from them), so nothing of a job outlives the daemon's exit."""
    return kill_descendants(limit)
