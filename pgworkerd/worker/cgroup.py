"""One cgroup per attempt ([worker] job_cgroups, README "Per-attempt cgroups").

Where the daemon runs in a cgroup v2 directory delegated to it (systemd's `Delegate=yes`;
pgworkerd.daemon.cgroups finds it and moves the daemon into the leaf `daemon/` of it,
since cgroup v2 allows processes only in leaves once controllers are enabled below), each
attempt runs in a cgroup of its own, `<delegated>/job-ID-aATTEMPT-pPID`:

- the job child's watcher (root, or the daemon's uid: never the job's) makes it and moves
  the job child into it when the job's message arrives (the watcher reads its own copy),
  and the child waits for its word before it runs the job (Watcher.job_began), so
  before any handler code of the attempt runs; every process the attempt starts is born
  in it and cannot leave it (the directory is the watcher's: a job of a uid of its own
  cannot write any file in it, so cannot move out or raise its own limit);
- `memory.max` is the handler's memory limit where the memory controller is delegated:
  the kernel enforces it, and an OOM kill in the cgroup (memory.events `oom_kill`) is
  the job's own (the watcher stops the job and reports "killed: memory");
- at the end of the attempt, before its outcome is sent, the watcher moves the job child
  back to the daemon's leaf, kills whatever is left in the cgroup at once (`cgroup.kill`,
  Linux 5.14+; before that: freeze it, SIGKILL each member, thaw), and removes it; when
  the watcher stops a job (its lease, its memory) it kills the whole cgroup the same way.
  A process that left the job's process tree (a double fork + setsid racing the walk,
  clone(CLONE_PARENT)) is still in the cgroup: it dies with the rest, atomically.
- the daemon removes (killing first) the cgroups a dead child's watcher left behind.

Dependency-free: the job's child and its watcher import it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

# The leaf the daemon, its fork server, its idle children and the watchers live in.
DAEMON_LEAF = "daemon"
# Attempt cgroups: job-<job id>-a<attempt>-p<child pid>
PREFIX = "job-"
# How long killing a cgroup waits for it to be empty (a process in uninterruptible sleep
# cannot die until the kernel lets it): the attempt still ends; the daemon retries later.
KILL_WAIT = 5.0


class CgroupError(OSError):
    """A cgroup operation failed (the message says which file and why)."""


def attempt_name(job_id: int, attempt: int, child_pid: int) -> str:
    return f"{PREFIX}{job_id}-a{attempt}-p{child_pid}"


def child_pid_of(name: str) -> int | None:
    """The job child's pid in an attempt cgroup's name (None: not one)."""
    if not name.startswith(PREFIX):
        return None
    tail = name.rpartition("-p")[2]
    return int(tail) if tail.isdigit() else None


def _write(path: str, value: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot open {path}: {exc.strerror}") from exc
    try:
        os.write(fd, value.encode())
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot write {value!r} to {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def create(base: str, name: str, pid: int, memory_max: int | None) -> str:
    """Make the cgroup `name` under `base` (mode 0755: only its maker writes it), set its
    memory.max (if given and the controller is there), move `pid` into it; returns its
    path. Raises CgroupError (what is made is removed again)."""
    path = os.path.join(base, name)
    try:
        os.mkdir(path, 0o755)
    except OSError as exc:
        raise CgroupError(exc.errno, f"cannot make {path}: {exc.strerror}") from exc
    try:
        if memory_max is not None and os.path.exists(os.path.join(path, "memory.max")):
            _write(os.path.join(path, "memory.max"), str(memory_max))
            # no swapping past it either, where swap is accounted
            with contextlib.suppress(OSError):
                _write(os.path.join(path, "memory.swap.max"), "0")
        _write(os.path.join(path, "cgroup.procs"), str(pid))
    except CgroupError:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        raise
    return path


def move(pid: int, to: str) -> None:
    """Move process `pid` (all its threads) into cgroup `to`; raises CgroupError."""
    _write(os.path.join(to, "cgroup.procs"), str(pid))


def members(path: str) -> list[int]:
    try:
        return [int(p) for p in _read(os.path.join(path, "cgroup.procs")).split()]
    except (OSError, ValueError):
        return []


def populated(path: str) -> bool:
    try:
        for line in _read(os.path.join(path, "cgroup.events")).splitlines():
            key, _, value = line.partition(" ")
            if key == "populated":
                return value.strip() != "0"
    except OSError:
        return False
    return bool(members(path))


def oom_kills(path: str) -> int:
    """How many processes the OOM killer killed in the cgroup (memory.events oom_kill;
    0 without the memory controller)."""
    try:
        for line in _read(os.path.join(path, "memory.events")).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def kill(path: str, wait: float = KILL_WAIT) -> bool:
    """SIGKILL every process in the cgroup at once and wait (at most `wait`) until it is
    empty; True when it is. cgroup.kill where the kernel has it (5.14+); otherwise the
    cgroup is frozen (nothing in it can fork meanwhile), each member is SIGKILLed, and it
    is thawed (a frozen process dies once thawed)."""
    if not os.path.isdir(path):
        return True
    give_up = time.monotonic() + wait
    kill_file = os.path.join(path, "cgroup.kill")
    while True:
        if os.path.exists(kill_file):
            with contextlib.suppress(OSError):
                _write(kill_file, "1")
        else:
            freeze = os.path.join(path, "cgroup.freeze")
            with contextlib.suppress(OSError):
                _write(freeze, "1")
            for pid in members(path):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                _write(freeze, "0")
        if not populated(path):
            return True
        if time.monotonic() > give_up:
            return False
        time.sleep(0.005)


def remove(path: str, wait: float = KILL_WAIT) -> bool:
    """Kill what is in the cgroup (waiting at most `wait` for it to be empty) and remove
    it; True when it is gone (False: the caller retries later)."""
    kill(path, wait)
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
