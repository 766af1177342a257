"""What running jobs print: read from their children's output files, kept bounded per
attempt, written to job_logs (migration 0015) and copied to the daemon's own log.

The child side is pgworkerd.worker.capture: each child appends its attempts' output to
its own file in the daemon's temp directory. Here, about once a second (tick), the new
bytes of every running attempt are read, and:

- kept bounded: the first half of [logs] max_bytes_per_attempt (the head) and a rolling
  last half (the tail), with the count of every byte written; what lies between is
  omitted, and said to be. A job printing faster than that is not read in full: only
  the unread bytes that can still end up in the tail are (so capture costs the loop at
  most about the cap per attempt and second, however fast a job prints), and the file's
  read part is given back to the file system (a hole punched in it), so a job printing
  for hours does not fill the disk;
- upserted into job_logs, every attempt with new output in one statement;
- copied line by line to the daemon's log, tagged with the job id and attempt, at most
  forward_lines_per_second lines per attempt; lines over that are counted and the count
  is logged (they are left out of the daemon's log only, never out of the stored copy).

When an attempt ends, however it ends (outcome, crash, kill -9 of the child, timeout,
cancel), the rest of its output is read before the next attempt of that child starts and
before its file is closed: the tail is complete. The daemon unlinks each file as soon as
it opens it (the child keeps writing to the open file), so nothing is left behind when a
child or the daemon dies; a file the daemon never opened (a child that ran no job) is
removed when its child is reaped, and those of a daemon killed with kill -9 go with its
whole directory at the next start (pgworkerd.daemon.containment). What such a daemon
loses is the output its running attempts wrote after its last write, under a second.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgworkerd.config import LogsConfig
from pgworkerd.queue.joblogs import LogWrite, storable
from pgworkerd.sizes import format_size
from pgworkerd.worker.capture import path_for

log = logging.getLogger("pgworkerd")

# Output is read, copied and written about this often.
INTERVAL = 1.0
# Read in pieces of at most this size.
CHUNK = 1 << 20
# A line longer than this is copied to the daemon's log cut in pieces of this size.
MAX_LINE = 4096
# Read parts of a file are punched out once this much has been read since the last hole.
PUNCH_AFTER = 4 << 20
# Ended attempts' logs kept at most while the database is away (the oldest are dropped).
MAX_PENDING_BYTES = 64 << 20

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02


@functools.cache
def _fallocate() -> Any:
    function = ctypes.CDLL(None, use_errno=True).fallocate
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return function


def _punch_hole(fd: int, length: int) -> None:
    """Free the blocks of the file's first `length` bytes (read already); raises OSError."""
    mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
    if _fallocate()(fd, mode, 0, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _whole_chars_end(data: bytes) -> bytes:
    """`data` without an incomplete UTF-8 sequence at its end (a cut head)."""
    for back in range(1, min(4, len(data) + 1)):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:  # a lead byte: is its sequence whole?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data


def _whole_chars_start(data: bytes) -> bytes:
    """`data` without continuation bytes at its start (a cut tail)."""
    skip = 0
    while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
        skip += 1
    return data[skip:]


@dataclass(eq=False)
class AttemptLog:
    """One attempt's output so far."""

    job_id: int
    token: int
    attempt: int
    name: str  # "job 42 attempt 1", as the daemon's log shows it
    head: bytes = b""
    head_full: bool = False  # (then it ends with a whole character)
    tail: bytes = b""
    total: int = 0  # every byte the attempt wrote
    head_written: int = -1  # len(head) when last stored; -1: not stored yet
    dirty: bool = False  # output not stored yet
    finished: bool = False
    # copying to the daemon's log: this second's lines, those left out, an unended line
    partial: bytes = b""
    copied: int = 0
    dropped_lines: int = 0
    unread: int = 0  # bytes not even read (see the module's docstring)


@dataclass(eq=False)
class _ChildFile:
    path: str
    fd: int | None = None
    offset: int = 0  # read up to here
    punched: int = 0
    attempt: AttemptLog | None = None  # the child's current attempt
    open_failed: bool = False


class JobLogs:
    """The output of this daemon's running attempts; the loop calls tick() and reads
    next_deadline(), the job table begin() and end(), its reaping child_exited()."""

    def __init__(
        self,
        config: LogsConfig,
        write: Callable[[list[LogWrite]], set[int] | None],
        database_up: Callable[[], bool],
        root: Callable[[], str | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write = write  # None: the write failed (kept for the next one)
        self.database_up = database_up
        self.root = root  # the daemon's temp directory (None: no capture possible)
        self.clock = clock
        self.configure(config)
        self.files: dict[int, _ChildFile] = {}  # child pid -> its output file
        self.running: dict[int, _ChildFile] = {}  # job id -> its child's file
        # job id -> the attempt of a job run beside others in its child (an async
        # handler's concurrency): its output comes as messages (output()), not from a file
        self.routed: dict[int, AttemptLog] = {}
        self.ended: list[AttemptLog] = []  # ended, not stored yet
        self.due: float | None = None
        self._punching = True

    def configure(self, config: LogsConfig) -> None:
        """(Also after a reload: attempts running keep reading with the new bounds.)"""
        self.config = config
        self.head_max = config.max_bytes_per_attempt // 2
        self.tail_max = config.max_bytes_per_attempt - self.head_max

    # -- the job table's calls -----------------------------------------------------------

    def begin(self, job_id: int, token: int, attempt: int, pid: int | None) -> None:
        """A job was handed to child `pid`: what that child writes now is this attempt's."""
        root = self.root()
        if pid is None or root is None or not self.config.capture:
            return
        f = self.files.get(pid)
        if f is None:
            f = self.files[pid] = _ChildFile(path_for(root, pid))
        f.attempt = AttemptLog(job_id, token, attempt, f"job {job_id} attempt {attempt}")
        self.running[job_id] = f
        if self.due is None:
            self.due = self.clock() + INTERVAL

    def begin_routed(self, job_id: int, token: int, attempt: int) -> None:
        """A job was handed to a child that runs it beside others: its output is what
        the child sends for it (output())."""
        if not self.config.capture:
            return
        self.routed[job_id] = AttemptLog(job_id, token, attempt, f"job {job_id} attempt {attempt}")
        if self.due is None:
            self.due = self.clock() + INTERVAL

    def output(self, job_id: int, data: bytes) -> None:
        """What a job run beside others wrote (its child's Output message)."""
        attempt = self.routed.get(job_id)
        if attempt is not None and data:
            self._add(attempt, data)

    def end(self, job_id: int) -> None:
        """The attempt ended (its child reported, or died): read the rest of its output."""
        routed = self.routed.pop(job_id, None)
        if routed is not None:
            self._ended(routed)
            return
        f = self.running.pop(job_id, None)
        if f is None or f.attempt is None:
            return
        attempt, f.attempt = f.attempt, None
        self._read(f, attempt)
        self._ended(attempt)

    def _ended(self, attempt: AttemptLog) -> None:
        self._copy_rest(attempt)
        attempt.finished = True
        if attempt.total:  # an attempt that printed nothing leaves no row: no write
            attempt.dirty = True
            self.ended.append(attempt)
            self._bound_pending()

    def child_exited(self, pid: int | None) -> None:
        """Close (or, never opened, remove) a reaped child's file."""
        f = self.files.pop(pid, None) if pid is not None else None
        if f is None:
            root = self.root()
            if pid is not None and root is not None:  # (capture may be off since a reload)
                with contextlib.suppress(OSError):
                    os.unlink(path_for(root, pid))
            return
        if f.attempt is not None and self.running.get(f.attempt.job_id) is f:
            self.end(f.attempt.job_id)  # (the job table ends the attempt first, as a rule)
        if f.fd is not None:
            os.close(f.fd)
        elif not f.open_failed:
            with contextlib.suppress(OSError):
                os.unlink(f.path)

    # -- the loop's calls ----------------------------------------------------------------

    def tick(self, now: float) -> None:
        if self.due is None or now < self.due:
            return
        for f in list(self.running.values()):
            if f.attempt is not None:
                self._read(f, f.attempt)
                self._report_dropped(f.attempt)
        for attempt in self.routed.values():
            self._report_dropped(attempt)
        self.flush()
        busy = self.running or self.routed or any(a.dirty for a in self.ended)
        self.due = self.clock() + INTERVAL if busy else None

    def flush(self) -> None:
        """Store every attempt with new output (one statement)."""
        attempts = [f.attempt for f in self.running.values() if f.attempt and f.attempt.dirty]
        attempts += [a for a in self.routed.values() if a.dirty]
        attempts += self.ended
        if not attempts or not self.database_up():
            return
        entries = [self._entry(a) for a in attempts]
        if self.write(entries) is None:
            return  # kept: written with the next one
        for a, e in zip(attempts, entries, strict=True):
            a.dirty = False
            a.head_written = len(a.head) if e.head is not None else a.head_written
        self.ended = [a for a in self.ended if a.dirty]

    def next_deadline(self) -> float | None:
        return self.due

    # -- reading -------------------------------------------------------------------------

    def _open(self, f: _ChildFile) -> bool:
        if f.fd is not None:
            return True
        if f.open_failed:
            return False
        try:
            # O_RDWR: punching holes needs a writable descriptor. Non-blocking and a
            # regular file only: whatever a handler (the same user) put there instead
            # must not stall the loop.
            fd = os.open(f.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(errno.EINVAL, "not a regular file")
        except OSError as exc:
            f.open_failed = True
            log.warning("no output captured from %s: %s", f.path, exc)
            return False
        f.fd = fd
        with contextlib.suppress(OSError):
            os.unlink(f.path)  # the child writes on; nothing is left if either dies
        return True

    def _read(self, f: _ChildFile, attempt: AttemptLog) -> None:
        if not self._open(f):
            return
        assert f.fd is not None
        try:
            size = os.fstat(f.fd).st_size
            while f.offset < size:
                left = size - f.offset
                if attempt.head_full and left > self.tail_max + CHUNK:
                    # More than the tail can hold: only its last part is read.
                    skip = left - self.tail_max
                    attempt.total += skip
                    attempt.unread += skip
                    attempt.tail = b""
                    attempt.partial = b""
                    f.offset += skip
                    continue
                data = os.pread(f.fd, min(left, CHUNK), f.offset)
                if not data:
                    break
                f.offset += len(data)
                self._add(attempt, data)
        except OSError as exc:
            log.warning("%s: reading its output failed: %s", attempt.name, exc)
            return
        if self._punching and f.offset - f.punched >= PUNCH_AFTER:
            try:
                _punch_hole(f.fd, f.offset)
                f.punched = f.offset
            except OSError as exc:  # (a file system without holes: the file just grows)
                self._punching = False
                log.warning("cannot free the read part of job output files: %s", exc)

    def _add(self, attempt: AttemptLog, data: bytes) -> None:
        attempt.total += len(data)
        attempt.dirty = True
        self._copy(attempt, data)
        if not attempt.head_full:
            room = max(0, self.head_max - len(attempt.head))  # (a reload may shrink it)
            attempt.head += data[:room]
            data = data[room:]
            if len(attempt.head) >= self.head_max:  # a character cut in two goes on
                whole = _whole_chars_end(attempt.head)
                data = attempt.head[len(whole) :] + data
                attempt.head, attempt.head_full = whole, True
        if data:
            tail = attempt.tail + data if len(data) < self.tail_max else data
            attempt.tail = tail[-self.tail_max :]

    def _entry(self, a: AttemptLog) -> LogWrite:
        # a tail cut from the stream starts with a whole character
        tail = _whole_chars_start(a.tail) if a.total > len(a.head) + len(a.tail) else a.tail
        changed = len(a.head) != a.head_written
        return LogWrite(
            job_id=a.job_id,
            token=a.token,
            attempt=a.attempt,
            head=storable(a.head) if changed else None,
            tail=storable(tail),
            total_bytes=a.total,
            omitted_bytes=a.total - len(a.head) - len(tail),
            finished=a.finished,
        )

    def _bound_pending(self) -> None:
        size = sum(len(a.head) + len(a.tail) for a in self.ended)
        while size > MAX_PENDING_BYTES and len(self.ended) > 1:
            gone = self.ended.pop(0)
            size -= len(gone.head) + len(gone.tail)
            log.warning("%s: output not stored (the database is away too long)", gone.name)

    # -- copying to the daemon's log -----------------------------------------------------

    def _copy(self, attempt: AttemptLog, data: bytes) -> None:
        rate = self.config.forward_lines_per_second
        if rate == 0:
            return
        buf = attempt.partial + data if attempt.partial else data
        pos = 0
        while attempt.copied < rate:
            end = buf.find(b"\n", pos)
            if end < 0:
                break
            self._line(attempt, buf[pos:end])
            pos = end + 1
        rest = buf[pos:]
        if attempt.copied >= rate:
            attempt.dropped_lines += rest.count(b"\n")
            rest = rest[rest.rfind(b"\n") + 1 :]
        if len(rest) > MAX_LINE:  # a line without end: copied in pieces
            if attempt.copied < rate:
                self._line(attempt, rest)
            else:
                attempt.dropped_lines += 1
            rest = b""
        attempt.partial = rest

    def _line(self, attempt: AttemptLog, line: bytes) -> None:
        attempt.copied += 1
        text = line[:MAX_LINE].decode("utf-8", "replace").rstrip("\r")
        if len(line) > MAX_LINE:
            text += f" [... {len(line) - MAX_LINE} more bytes]"
        # (the log's formatter escapes control characters: the job's text stays inert)
        log.info(
            "%s | %s",
            attempt.name,
            text,
            extra={
                "fields": {"job_id": attempt.job_id, "attempt": attempt.attempt, "event": "output"}
            },
        )

    def _copy_rest(self, attempt: AttemptLog) -> None:
        if attempt.partial and attempt.copied < self.config.forward_lines_per_second:
            self._line(attempt, attempt.partial)
        elif attempt.partial:
            attempt.dropped_lines += 1
        attempt.partial = b""
        self._report_dropped(attempt)

    def _report_dropped(self, attempt: AttemptLog) -> None:
        """Say what was left out of the daemon's log this second; a new second begins."""
        rate = self.config.forward_lines_per_second
        if rate and (attempt.dropped_lines or attempt.unread):
            unread = f", {format_size(attempt.unread)} not read" if attempt.unread else ""
            log.warning(
                "%s: %d line(s) of output not copied to this log (over %d lines/s%s); "
                "`pgworkerd logs %d` shows its head and tail",
                attempt.name,
                attempt.dropped_lines,
                rate,
                unread,
                attempt.job_id,
                extra={"fields": {"job_id": attempt.job_id, "event": "output_dropped"}},
            )
        attempt.copied = attempt.dropped_lines = attempt.unread = 0
