"""The daemon's part in containing jobs (see pgworkerd.worker.reaper and .tmpdirs).

- Orphans: the daemon is a child subreaper, so what a job child leaves when it is
  SIGKILLed (a timeout's kill grace over, kill -9, a lost lease) is re-parented to the
  daemon. After every reaped process the daemon kills each child of its own that is
  neither a fork server nor a job child it knows. While a spawned child has not said
  hello its pid is unknown (it too is the daemon's child): the sweep waits for that.
- Temp directories: the daemon's own directory, `$TMPDIR/pgworkerd-UID/dPID-XXXX`,
  locked (flock) for the daemon's life. A starting daemon removes every directory whose
  lock nobody holds: the leftovers of daemons that were killed. A child's leftovers are
  removed when the daemon reaps it; the whole directory when the daemon exits.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import stat
import tempfile
import time

from pgworkerd.daemon.cgroups import JobCgroups
from pgworkerd.worker import reaper, tmpdirs

log = logging.getLogger("pgworkerd")

# A directory being set up (".new-", not yet locked and renamed) this old was left by a
# daemon that died during its start.
STALE_SETUP_AGE = 600.0


def _shared_root() -> str | None:
    """`$TMPDIR/pgworkerd-UID`, private to this user; None if someone else made it or
    it is not a private directory (then this daemon's directory goes elsewhere). Others
    may traverse it (0711, for the children of a daemon with job_uids), never list or
    write it."""
    root = os.path.join(tempfile.gettempdir(), f"pgworkerd-{os.getuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o066:
        log.warning("%s is not a private directory of this user; not using it", root)
        return None
    return root


def _is_abandoned(path: str) -> bool:
    """Whether no living daemon holds the lock on `path` (flock: released at its death)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # (releases the lock taken to test it)


def remove_abandoned(root: str) -> int:
    """Remove the directories of daemons that died; returns how many."""
    removed = 0
    now = time.time()
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith("d") and _is_abandoned(path):
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
        elif name.startswith(".new-"):
            with contextlib.suppress(OSError):
                if now - os.lstat(path).st_mtime > STALE_SETUP_AGE:
                    shutil.rmtree(path, ignore_errors=True)
    return removed


class Containment:
    """Orphan sweeps and the temp directory root of one daemon."""

    def __init__(self, *, traversable: bool = False, cgroups: JobCgroups | None = None) -> None:
        # whether children of other uids (job_uids) must reach their directories in it:
        # then it and the shared root are 0711 (others pass through, never list or write)
        self.traversable = traversable
        self.cgroups = cgroups  # one cgroup per attempt ([worker] job_cgroups; None: off)
        self.tmp_root: str | None = None
        self._lock_fd: int | None = None
        self.sweep_due = False
        self.early_sweep_due = False  # the sweep while a child's pid is unknown (sweep)

    # -- temp directories ----------------------------------------------------------------

    def start(self) -> None:
        """Make and lock this daemon's directory, after removing dead daemons' ones.
        Never raises: without it jobs run with the daemon's TMPDIR (logged)."""
        if self.tmp_root is not None:
            return
        try:
            shared = _shared_root()
            if shared is None:
                self.tmp_root = tempfile.mkdtemp(prefix="pgworkerd-")
                self._open_to_children(self.tmp_root)
                return
            self._open_to_children(shared)
            removed = remove_abandoned(shared)
            if removed:
                log.info("removed the temp directories of %d daemon(s) that died", removed)
            # Locked before it gets the name other daemons look at, so none of them
            # can take it for abandoned.
            staging = tempfile.mkdtemp(prefix=".new-", dir=shared)
            fd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            final = os.path.join(shared, f"d{os.getpid()}-{os.path.basename(staging)[5:]}")
            os.rename(staging, final)
            self._open_to_children(final)
            self.tmp_root, self._lock_fd = final, fd
        except OSError as exc:
            log.warning("no private temp directories for jobs: %s", exc)

    def _open_to_children(self, path: str) -> None:
        if self.traversable:
            os.chmod(path, 0o711)

    def child_settings(self) -> dict[str, str]:
        settings = {"tmpdir": self.tmp_root} if self.tmp_root is not None else {}
        if self.cgroups is not None:
            settings.update(self.cgroups.child_settings())
        return settings

    # -- orphans -------------------------------------------------------------------------

    def child_exited(self, pid: int | None) -> str | None:
        """A job child was reaped: its temp directory goes, its attempt's cgroup (killed
        at once) too, its orphans go next sweep. Returns the outcome its death means when
        the OOM killer killed in its attempt's cgroup (else None)."""
        if pid is not None and self.tmp_root is not None:
            tmpdirs.remove_child_dirs(self.tmp_root, pid)
        self.sweep_due = self.early_sweep_due = True
        if pid is not None and self.cgroups is not None:
            return self.cgroups.child_exited(pid)
        return None

    def tick(self, now: float) -> None:
        """Attempt cgroups that could not be removed when their child was reaped, again."""
        if self.cgroups is not None:
            self.cgroups.retry_left(now)

    def next_deadline(self) -> float | None:
        return self.cgroups.next_retry() if self.cgroups is not None else None

    def process_reaped(self) -> None:
        """Some process of ours was reaped: what it left may have come to us."""
        self.sweep_due = self.early_sweep_due = True

    def sweep(self, keep: set[int], *, pids_known: bool) -> None:
        """Kill adopted orphans if a process was reaped since the last sweep.

        A child that has not said hello yet (`pids_known` False) looks like an orphan,
        so until every pid is known only what cannot be one goes (reaper.runs_pgworkerd
        spares pgworkerd's own processes), once per reaping; the rest at the full sweep.
        Not waiting for the hello matters under load: children start slowly, one is
        nearly always starting, and a daemon killed meanwhile would leave its orphans
        to init (the chaos soak's kill -9 of a parent after one of a job child)."""
        if not self.sweep_due:
            return
        if pids_known:
            self.sweep_due = self.early_sweep_due = False
            killed = reaper.kill_adopted(keep)
        elif self.early_sweep_due:
            self.early_sweep_due = False
            killed = reaper.kill_adopted(keep, spare=reaper.runs_pgworkerd)
        else:
            return
        if killed:
            log.warning(
                "killed %d process(es) left behind by job children: %s",
                len(killed),
                " ".join(map(str, killed)),
            )

    # -- exit ----------------------------------------------------------------------------

    def close(self) -> None:
        """At the daemon's exit: kill and reap everything it still has, remove its temp
        directory and let go of the lock."""
        reaper.kill_all_children()
        if self.cgroups is not None:
            self.cgroups.close()
        if self.tmp_root is not None:
            shutil.rmtree(self.tmp_root, ignore_errors=True)
            self.tmp_root = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
