"""A job's output, captured for the daemon (pgworkerd.daemon.joblogs reads it).

Each child opens one file at its start, `log-PID` in the daemon's temp directory (see
pgworkerd.daemon.containment), before it says hello: the daemon opens it by that name,
unlinks it and reads what is appended. From before the child's first job (seal) to its
end, the child's descriptors 1 and 2 point at it (dup2), so the handler's print() and
sys.stderr, Python logging, C libraries writing to stdout and every subprocess the
handler starts write there. The daemon attributes what it reads to the child's current
attempt (every process of the attempt is dead before the child reports the outcome, and
the next attempt starts after the daemon has read to the end).

The child keeps no descriptor of the daemon's own stdout and stderr (the daemon's log):
a handler could write lines into it that look like the daemon's own. So what the child
itself writes between attempts goes to the file too (the next attempt's log, if any);
its watcher, a process the handler cannot reach, keeps the daemon's stderr for the
messages that matter (a job stopped at its lease or memory limit).

Why a file: a write to a regular file never waits for a reader, so a handler printing at
full speed is never slowed by the daemon (a pipe would block it once the daemon falls a
pipe buffer behind), and what was written survives a kill -9 of the child: the daemon
reads it when it reaps the child. One file per child, not per attempt: a reused child
(max_jobs_per_child > 1) costs no file creation per job.

Dependency-free: the job's child imports it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

# A handler that configured no logging gets a root handler on stderr at this level for
# its attempts (README "Job logs"): its logger.info() lines are captured too.
LOG_LEVEL = logging.INFO
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def path_for(root: str, pid: int) -> str:
    """The output file of child `pid` in the daemon's directory `root`."""
    return os.path.join(root, f"log-{pid}")


class Capture:
    """This child's output file, and what its attempts change and put back."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        # Line-buffered, for the child's life (it writes little between jobs): what a
        # handler printed is in the file (and survives its kill -9) line by line, not
        # 8 KiB at a time.
        for stream in (sys.stdout, sys.stderr):
            if getattr(stream, "line_buffering", None) is False:
                with contextlib.suppress(Exception):
                    stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        # made once: a handler costs a lock and a registration
        self._handler = logging.StreamHandler(sys.stderr)
        self._handler.setFormatter(logging.Formatter(LOG_FORMAT))
        self._handler_added = False
        self._root_level = logging.WARNING

    @classmethod
    def open(cls, root: str | None) -> Capture | None:
        """Create this child's file (mode 0600, never an existing one). None when there
        is no directory or the file cannot be made: jobs then print to the daemon's
        stdout and stderr as without capture, and the child says why on stderr."""
        if root is None:
            return None
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            return cls(os.open(path_for(root, os.getpid()), flags, 0o600))
        except OSError as exc:
            print(f"pgworkerd child {os.getpid()}: output not captured: {exc}", file=sys.stderr)
            return None

    def seal(self) -> None:
        """Point descriptors 1 and 2 at the file for the rest of the child's life: the
        daemon's stdout and stderr are no longer open here (before any handler code)."""
        _flush()
        os.dup2(self.fd, 1)  # (inheritable: the handler's subprocesses write here too)
        os.dup2(self.fd, 2)

    def enter(self) -> None:
        """An attempt begins: what it logs (with no logging set up) goes to stderr."""
        _flush()
        root = logging.getLogger()
        if not root.handlers:  # the handler's own logging config, if any, stays as it is
            self._handler.setStream(sys.stderr)  # (whatever sys.stderr is now)
            self._root_level = root.level
            root.addHandler(self._handler)
            root.setLevel(LOG_LEVEL)
            self._handler_added = True

    def leave(self) -> None:
        """The attempt ends (before the outcome is reported): its output is flushed."""
        _flush()
        if self._handler_added:
            root = logging.getLogger()
            root.removeHandler(self._handler)
            root.setLevel(self._root_level)
            self._handler_added = False


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
