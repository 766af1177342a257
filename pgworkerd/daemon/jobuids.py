"""The daemon's side of [worker] job_uids (README "Per-job uids"): which uid each child
gets, whether this daemon may hand out uids at all, and the host-wide lock that keeps
two daemons from handing out the same uid.

The child's side, the drop itself, is pgworkerd.worker.identity.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections import deque
from pathlib import Path

# One file for the host: each daemon with job_uids holds a POSIX lock on the bytes
# [first, last] of it for its life (released at its death, however it dies; not held by
# its children), so two daemons can never share a uid: a child kills every process of its
# uid when it starts, which would be another daemon's job.
RANGE_LOCK = "/run/lock/pgworkerd-job-uids"
_held: list[int] = []  # the lock's descriptor, kept open for the daemon's life

# Capabilities the daemon (and its fork server) need to run children as other users and
# to keep containing them: chown their directory, become them, signal them, remove what
# they left in their 0700 directories. (linux/capability.h)
REQUIRED_CAPABILITIES = {
    "CAP_CHOWN": 0,
    "CAP_DAC_OVERRIDE": 1,
    "CAP_FOWNER": 3,
    "CAP_KILL": 5,
    "CAP_SETGID": 6,
    "CAP_SETUID": 7,
}


class UidPool:
    """The uids of the range no live child holds. A uid goes back at its child's reaping
    and is handed out again last (least recently used first): what its earlier child left
    has had the longest time to be swept (and the next child of that uid kills whatever
    of that uid still lives before it says hello)."""

    def __init__(self, first: int, last: int) -> None:
        self._free: deque[int] = deque(range(first, last + 1))
        self._held: set[int] = set()

    def free(self) -> int:
        return len(self._free)

    def take(self, count: int) -> list[int]:
        uids = [self._free.popleft() for _ in range(min(count, len(self._free)))]
        self._held.update(uids)
        return uids

    def give_back(self, uid: int | None) -> None:
        if uid is not None and uid in self._held:
            self._held.discard(uid)
            self._free.append(uid)


def startup_problem(config_path: str | None, uids: tuple[int, int]) -> str | None:
    """Why this daemon cannot run its children as other users (None: it can): it is not
    root with the capabilities the drop and the containment need, or its config file is
    readable by the job users."""
    if os.geteuid() != 0:
        return (
            f"the daemon runs as uid {os.geteuid()}: running children as other users needs "
            "root (uid 0) with CAP_SETUID and CAP_SETGID (and CAP_CHOWN, CAP_DAC_OVERRIDE, "
            "CAP_FOWNER, CAP_KILL to keep containing them); remove job_uids or run as root"
        )
    missing = [name for name, bit in REQUIRED_CAPABILITIES.items() if not _capable(bit)]
    if missing:
        return (
            f"the daemon lacks {', '.join(missing)} (a capability bounding set, e.g. "
            "systemd's CapabilityBoundingSet=): running children as other users needs them"
        )
    if config_path is not None:
        try:
            st = os.stat(config_path)
        except OSError:
            return None
        first, last = uids
        if st.st_mode & stat.S_IROTH or (st.st_mode & stat.S_IRGRP and first <= st.st_gid <= last):
            return (
                f"{config_path} is readable by other users, so by every job: "
                f"chmod o-r {config_path} (jobs run as uids {first}-{last})"
            )
    return None


def claim_range(uids: tuple[int, int], path: str = RANGE_LOCK) -> str | None:
    """Lock this daemon's uids on the host for its life; why not (None: done): another
    daemon holds some of them, or the lock file is not root's own."""
    first, last = uids
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        return f"cannot open {path} to lock the range on this host: {exc}"
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        os.close(fd)
        return f"{path} is not a regular file of root's that only root may write"
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, last - first + 1, first, os.SEEK_SET)
    except OSError:
        os.close(fd)
        return (
            f"some of the uids {first}-{last} are another running daemon's on this host "
            "(each daemon needs a range of its own)"
        )
    _held.append(fd)
    return None


def _capable(bit: int) -> bool:
    """Whether this process holds capability `bit` in its effective set."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> bit & 1)
    except (OSError, ValueError):
        pass
    return False
