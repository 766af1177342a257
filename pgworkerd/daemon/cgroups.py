"""The daemon's side of [worker] job_cgroups (README "Per-attempt cgroups"): find the
cgroup v2 directory delegated to this daemon, move the daemon into a leaf of it, enable
the memory controller below it where it can, and remove the attempt cgroups a dead
child's watcher left behind. The attempts' own cgroups: pgworkerd.worker.cgroup.

Delegated means: the daemon's own cgroup on the unified (v2) hierarchy, not the root,
writable here, and marked as delegated, by systemd's `trusted.delegate` (or
`user.delegate`) extended attribute on units with Delegate=yes, or owned by the daemon's
own non-root uid (systemd hands a delegated cgroup to the unit's User=). Never a cgroup
someone else manages: writing into a service's cgroup that systemd did not delegate would
fight systemd.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field

from pgworkerd.worker import cgroup

log = logging.getLogger("pgworkerd")

_DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")
# How long the daemon's loop waits for a dead child's attempt cgroup to empty after
# cgroup.kill (a few milliseconds as a rule); what is not empty by then (a process in
# uninterruptible sleep, or a process a loaded machine has not let die yet) is killed and
# removed again at the next reaping, and every RETRY_LEFT seconds until it is gone (a
# daemon whose last job died may reap no other child for hours).
_LOOP_WAIT = 0.1
RETRY_LEFT = 1.0


class NoDelegation(RuntimeError):
    """job_cgroups = "require" and there is no delegated cgroup (the message says why)."""


def _unified_mount() -> str | None:
    """Where the cgroup v2 hierarchy is mounted in this mount namespace (None: nowhere)."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                sep = fields.index("-")
                if fields[sep + 1] == "cgroup2" and fields[3] == "/":
                    return fields[4]
    except (OSError, ValueError, IndexError):
        pass
    return None


def _own_path() -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def _delegated(path: str) -> bool:
    for name in _DELEGATE_XATTRS:
        with contextlib.suppress(OSError):
            if os.getxattr(path, name).strip(b"\0\n") == b"1":
                return True
    with contextlib.suppress(OSError):
        euid = os.geteuid()
        return euid != 0 and os.stat(path).st_uid == euid
    return False


def find() -> tuple[str | None, str]:
    """The delegated cgroup directory of this daemon, or None and why not."""
    mount = _unified_mount()
    if mount is None:
        return None, "no cgroup v2 (unified) hierarchy is mounted"
    own = _own_path()
    if own is None:
        return None, "this process is in no cgroup v2 (no 0:: line in /proc/self/cgroup)"
    base = os.path.normpath(os.path.join(mount, own.lstrip("/")))
    if os.path.basename(base) == cgroup.DAEMON_LEAF and _delegated(os.path.dirname(base)):
        base = os.path.dirname(base)  # (set up already: a daemon started in its leaf)
    if own in ("", "/") or base == mount:
        return None, "the daemon runs in the root cgroup (never delegated)"
    if not _delegated(base):
        return None, (
            f"{base} is not delegated to the daemon (systemd: Delegate=yes, "
            "dropin-job-cgroups.conf)"
        )
    if not os.access(os.path.join(base, "cgroup.procs"), os.W_OK):
        return None, f"{base} is not writable here (ProtectControlGroups=?)"
    return base, ""


@dataclass
class JobCgroups:
    """This daemon's delegated cgroup, once set up."""

    base: str
    memory: bool  # the memory controller is enabled for the attempts (memory.max)
    cgroup_kill: bool  # the kernel has cgroup.kill (5.14+)
    _left: set[str] = field(default_factory=set)  # attempt cgroups not removable yet
    _retry_at: float | None = None  # time.monotonic() of the next try at _left

    def child_settings(self) -> dict[str, str]:
        return {"cgroup": self.base}

    def child_exited(self, pid: int) -> str | None:
        """Kill and remove the attempt cgroups of a reaped child (its watcher died with
        it) and those left earlier; returns the child's exit as the job's outcome when the
        OOM killer killed in its attempt's cgroup (the child itself, perhaps)."""
        outcome = None
        for name in self._names():
            path = os.path.join(self.base, name)
            if cgroup.child_pid_of(name) == pid:
                if cgroup.oom_kills(path):
                    outcome = "killed: memory (the kernel's OOM killer, in the attempt's cgroup)"
                self._left.add(path)
        self._remove_left(time.monotonic())
        return outcome

    def retry_left(self, now: float) -> None:
        """The daemon's tick: try the cgroups left at a reaping again, once they are due."""
        if self._retry_at is not None and now >= self._retry_at:
            self._remove_left(now)

    def next_retry(self) -> float | None:
        """When retry_left has something to do (None: nothing is left)."""
        return self._retry_at

    def _remove_left(self, now: float) -> None:
        for path in list(self._left):
            if cgroup.remove(path, _LOOP_WAIT):
                self._left.discard(path)
        self._retry_at = now + RETRY_LEFT if self._left else None

    def close(self) -> None:
        """At the daemon's exit: no attempt cgroup outlives it."""
        for name in self._names():
            cgroup.remove(os.path.join(self.base, name))

    def _names(self) -> list[str]:
        try:
            return [n for n in os.listdir(self.base) if cgroup.child_pid_of(n) is not None]
        except OSError:
            return []


def setup(mode: str) -> JobCgroups | None:
    """Per [worker] job_cgroups: None for "off" or (with "auto") where there is no
    delegated cgroup; raises NoDelegation for "require" without one, or if the set-up
    fails then."""
    if mode == "off":
        return None
    base, why = find()
    if base is None:
        if mode == "require":
            raise NoDelegation(why)
        log.debug("no per-attempt cgroups: %s", why)
        return None
    try:
        return _set_up(base)
    except OSError as exc:
        if mode == "require":
            raise NoDelegation(f"setting up {base}: {exc}") from exc
        log.warning("no per-attempt cgroups: setting up %s failed: %s", base, exc)
        return None


def _set_up(base: str) -> JobCgroups:
    leaf = os.path.join(base, cgroup.DAEMON_LEAF)
    with contextlib.suppress(FileExistsError):
        os.mkdir(leaf, 0o755)
    # v2 allows no process in a cgroup whose controllers are enabled for its children:
    # the daemon (and whatever else is in the base) goes to the leaf
    for pid in cgroup.members(base):
        with contextlib.suppress(ProcessLookupError):
            cgroup.move(pid, leaf)
    cgroup.move(os.getpid(), leaf)
    has_kill = os.path.exists(os.path.join(leaf, "cgroup.kill"))
    cgroups = JobCgroups(base, memory=False, cgroup_kill=has_kill)
    cgroups.close()  # attempt cgroups of an earlier daemon in this cgroup
    with open(os.path.join(base, "cgroup.controllers")) as f:
        available = f.read().split()
    if "memory" in available:
        try:
            with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")
            cgroups.memory = True
        except OSError as exc:
            log.warning("per-attempt cgroups without memory.max: %s", exc)
    log.info(
        "per-attempt cgroups under %s (memory.max: %s, cgroup.kill: %s)",
        base,
        "yes" if cgroups.memory else "no, the memory controller is not delegated",
        "yes" if cgroups.cgroup_kill else "no, the kernel is older than 5.14",
    )
    return cgroups
