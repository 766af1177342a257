"""Handlers for tests/fault/test_job_cgroups.py: a job that leaves the process tree, a
job that tries to leave (or raise the limits of) its attempt's cgroup, and a job that
tries to write into the daemon's log through descriptors it should not have.

Only modules the fork server preloads (this one's imports) and programs every user may
run (a job child of another uid may not read the interpreter's directory).
"""

from __future__ import annotations

import ctypes
import os
import stat
import time
from typing import Any

from pgworkerd.worker import JobContext

SLEEPER = ["/usr/bin/python3", "-c", "import time; time.sleep(300)"]
_libc = ctypes.CDLL(None, use_errno=True)
_SYS_clone = 56  # x86_64
_CLONE_PARENT = 0x00008000
_SIGCHLD = 17


def _clone_parent() -> int:
    """fork(), but the new process is a child of our parent (CLONE_PARENT)."""
    _libc.syscall.restype = ctypes.c_long
    pid = _libc.syscall(_SYS_clone, _CLONE_PARENT | _SIGCHLD, 0, 0, 0, 0)
    if pid < 0:
        raise OSError(ctypes.get_errno(), "clone(CLONE_PARENT)")
    return pid


def escape(job: JobContext) -> Any:
    """Leave the job child's tree: clone(CLONE_PARENT) (a child of the daemon now), setsid
    and fork, both sleepers marked payload["marker"]; then return after
    payload["seconds"]. No walk of the job child's tree reaches them, and nothing of
    theirs exits, so the daemon, which sweeps what it adopted when it reaps a process,
    has no reason to look (a reused child: none dies after the job)."""
    marker = job.payload["marker"]
    if _clone_parent() == 0:  # the daemon's child now, in a session of its own
        os.setsid()
        if os.fork() == 0:
            os.execv(SLEEPER[0], [*SLEEPER, marker, "escapee's child"])
        os.execv(SLEEPER[0], [*SLEEPER, marker, "escapee"])
    time.sleep(float(job.payload.get("seconds", 0.5)))  # (the escapee is a sleeper by then)
    return {"escaped": True}


def _own_cgroup() -> str:
    with open("/proc/self/cgroup") as f:
        return next(line[3:].strip() for line in f if line.startswith("0::"))


def _try(what: Any) -> str:
    try:
        return f"ok: {what()}"
    except OSError as exc:
        return type(exc).__name__


def _write(path: str, text: str) -> int:
    fd = os.open(path, os.O_WRONLY)
    try:
        return os.write(fd, text.encode())
    finally:
        os.close(fd)


def probe_cgroup(job: JobContext) -> Any:
    """Where this attempt runs, and what it can do to its cgroup (payload: the cgroup v2
    mount point): leave it for the daemon's leaf, kill or freeze it, raise its limits,
    make a child cgroup of its own. Then sleeps payload["seconds"]."""
    mount = job.payload["mount"]
    own = _own_cgroup()
    path = os.path.join(mount, own.lstrip("/"))
    leaf = os.path.join(os.path.dirname(path), "daemon")
    pid = str(os.getpid())
    result = {
        "cgroup": own,
        "owner": os.stat(path).st_uid,
        "mode": oct(stat.S_IMODE(os.stat(path).st_mode)),
        "to daemon leaf": _try(lambda: _write(os.path.join(leaf, "cgroup.procs"), pid)),
        "to parent": _try(lambda: _write(os.path.join(os.path.dirname(path), "cgroup.procs"), pid)),
        "pids.max": _try(lambda: _write(os.path.join(path, "pids.max"), "max")),
        "freeze": _try(lambda: _write(os.path.join(path, "cgroup.freeze"), "0")),
        "subtree": _try(lambda: _write(os.path.join(path, "cgroup.subtree_control"), "")),
        "mkdir": _try(lambda: os.mkdir(os.path.join(path, "mine"))),
        "after": _own_cgroup(),
    }
    time.sleep(float(job.payload.get("seconds", 0)))
    return result


def write_to_daemon_log(job: JobContext) -> Any:
    """Write payload["text"] to every descriptor of this process that is the daemon's
    log file (payload["log"]: its device and inode), and to the daemon's (the parent's) stdout and
    stderr through /proc; returns what each try gave."""
    text = job.payload["text"] + "\n"
    log = tuple(job.payload["log"])
    tried: dict[str, str] = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == log:
            tried[f"fd {fd}"] = _try(lambda fd=fd: os.write(fd, text.encode()))
    for what in ("1", "2"):
        path = f"/proc/{os.getppid()}/fd/{what}"
        tried[path] = _try(lambda path=path: _write(path, text))
    return tried
