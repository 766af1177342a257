"""Logging: one line per event, human-readable or JSON lines; passwords are masked.

Text lines escape control characters, so an error text or a name that came from a job row
cannot forge, recolour or erase log lines. Under journald (stderr is the stream named by
JOURNAL_STREAM) each line starts with its syslog priority (`<3>`, sd-daemon(3)) so
`journalctl -p warning` finds errors, and carries no timestamp: journald adds its own.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, TextIO

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgworkerd.describe import printable
from pgworkerd.masking import dsn_secrets, mask_password

# sd-daemon(3) prefixes: syslog priorities.
_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}

# Literal passwords of the daemon's DSNs, masked wherever they appear (e.g. echoed back
# inside a server message that the URL and key=value patterns do not recognise).
_hidden: list[str] = []


def escape(text: str) -> str:
    """Control and invisible formatting characters (but tab) as visible escapes (\\n,
    \\x1b, \\u202e): one line, inert."""
    return printable(text, keep="\t")


def hide_passwords_of(*dsns: str) -> None:
    """Mask these DSNs' passwords (and PGPASSWORD) in every log line from now on."""
    found = {os.environ.get("PGPASSWORD", "")}
    for dsn in dsns:
        try:
            found.add(str(conninfo_to_dict(dsn).get("password") or ""))
        except psycopg.ProgrammingError:
            found.update(dsn_secrets(dsn))
    # Shorter ones would blank out every such letter of every line; the URL and
    # key=value patterns still mask them where they appear as a DSN's password.
    _hidden[:] = sorted((s for s in found if len(s) >= 4), key=len, reverse=True)


def _mask(text: str) -> str:
    text = mask_password(text)
    for secret in _hidden:
        text = text.replace(secret, "***")
    return text


def under_journald(stream: TextIO) -> bool:
    """True when `stream` is the journal stream systemd connected (JOURNAL_STREAM is
    "device:inode" of it; a redirected stderr keeps the variable but not the file)."""
    dev, _, ino = os.environ.get("JOURNAL_STREAM", "").partition(":")
    try:
        st = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return dev.isdigit() and ino.isdigit() and (st.st_dev, st.st_ino) == (int(dev), int(ino))


def _priority(record: logging.LogRecord) -> str:
    return f"<{_PRIORITY.get(record.levelno, 6)}>"


class _Timestamps:
    """UTC timestamps to the millisecond; the formatted second is kept, as a daemon
    running short jobs writes thousands of lines in it (three per job)."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def __call__(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._text}.{int(record.msecs):03d}Z"


class _TextFormatter(logging.Formatter):
    def __init__(self, journald: bool = False) -> None:
        super().__init__()
        self.journald = journald
        self.timestamp = _Timestamps()

    def format(self, record: logging.LogRecord) -> str:
        prefix = _priority(record) if self.journald else self.timestamp(record) + " "
        line = f"{prefix}{record.levelname:<7} {escape(_mask(record.getMessage()))}"
        if record.exc_info:
            # A traceback keeps its lines (indented, so none can pass for an event line);
            # under journald each line is an entry of its own and needs the prefix too.
            more = _mask(self.formatException(record.exc_info)).splitlines()
            cont = _priority(record) if self.journald else ""
            line += "".join(f"\n{cont}    {escape(text)}" for text in more)
        return line


class _JsonFormatter(logging.Formatter):
    def __init__(self, journald: bool = False) -> None:
        super().__init__()
        self.journald = journald
        self.timestamp = _Timestamps()

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": self.timestamp(record),
            "level": record.levelname.lower(),
            "msg": _mask(record.getMessage()),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = _mask(self.formatException(record.exc_info))
        # json.dumps escapes every control character: always one line.
        return (_priority(record) if self.journald else "") + json.dumps(entry, default=str)


def _skip_unused_record_fields() -> None:
    """The formatters above use a record's time, level, message and fields only. The
    logging module also looks up, for every record, the caller's file and line (a stack
    walk), the thread, the process and its multiprocessing name; with short jobs that is
    a quarter of the parent's time per job (three lines each). These are the logging
    module's documented switches for it, process-wide: this process is the daemon's."""
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # "Setting _srcfile to None will prevent findCaller() from being called" (logging
    # module source); records then name no caller.
    setattr(logging, "_srcfile", None)  # noqa: B010  (no stub for the private name)


# The logger of the lines of jobs that go well (claimed, started, completed): three a job,
# which a daemon of short jobs writes thousands of a second. [logging] job_events decides
# whether they are logged at info; failures and the rest go to "pgworkerd" as always.
JOB_EVENTS = "pgworkerd.jobs"


def setup(fmt: str = "text", level: str = "info", job_events: str = "problems") -> None:
    """`job_events`: "all" logs the lines of jobs that go well (at info); "problems"
    only at level debug."""
    _skip_unused_record_fields()
    handler = logging.StreamHandler(sys.stderr)
    journald = under_journald(sys.stderr)
    handler.setFormatter(_JsonFormatter(journald) if fmt == "json" else _TextFormatter(journald))
    root = logging.getLogger("pgworkerd")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    # (NOTSET: the level above decides; WARNING: the jobs' info lines are dropped by the
    # logger's first check, before any record is made)
    shown = job_events == "all" or level.lower() == "debug"
    logging.getLogger(JOB_EVENTS).setLevel(logging.NOTSET if shown else logging.WARNING)
