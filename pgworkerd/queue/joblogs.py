"""Job logs (migration 0015): what each attempt printed, bounded to a head and a tail.

One query layer for every reader (`pgworkerd logs`, the dashboard) and the daemon's one
write. The text is stored as PostgreSQL can hold it (`storable`); readers show it inert
(`pgworkerd.describe.printable`), since a job's output is the job's to choose.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgworkerd.queue.queries import query

log = logging.getLogger("pgworkerd")


@dataclass(frozen=True)
class LogWrite:
    """One attempt's captured output as the daemon holds it now."""

    job_id: int
    token: int
    attempt: int
    head: str | None  # None: unchanged since the last write (the stored one is kept)
    tail: str
    total_bytes: int
    omitted_bytes: int
    finished: bool


def storable(data: bytes) -> str:
    """Bytes a job wrote as text PostgreSQL holds: invalid UTF-8 replaced (U+FFFD), NULs
    removed."""
    return data.decode("utf-8", "replace").replace("\x00", "")


def write(
    conn: psycopg.Connection[Any], worker: str, entries: Sequence[LogWrite], *, schema: str
) -> set[int]:
    """Upsert the attempts' logs in one statement; returns the job ids written (an attempt
    of a job deleted meanwhile is not)."""
    if not entries:
        return set()
    rows = conn.execute(
        query("job_log_write", schema),
        {
            "worker": worker,
            "ids": [e.job_id for e in entries],
            "tokens": [e.token for e in entries],
            "attempts": [e.attempt for e in entries],
            "heads": [e.head for e in entries],
            "tails": [e.tail for e in entries],
            "totals": [e.total_bytes for e in entries],
            "omitted": [e.omitted_bytes for e in entries],
            "finished": [e.finished for e in entries],
        },
    ).fetchall()
    return {r[0] for r in rows}


def store(
    conn: psycopg.Connection[Any], worker: str, entries: Sequence[LogWrite], *, schema: str
) -> set[int]:
    """The daemon's write of the logs (`write`). Logs never cost more: a statement the
    database refuses (a role without the grant) is logged and dropped; a lost connection is
    raised like any other."""
    try:
        return write(conn, worker, entries, schema=schema)
    except psycopg.Error as exc:
        if conn.broken or conn.closed:
            raise
        log.warning("job output not stored: %s", str(exc).strip().splitlines()[0])
    return set()


def read_logs(
    conn: psycopg.Connection[Any], schema: str, job_id: int, attempt: int | None = None
) -> dict[str, Any] | None:
    """A job's logs: {"job_id", "status", "attempts" (the job's count), "lease_token"
    (its current attempt's), "logs": [one dict per attempt that printed something, oldest
    first: attempt, lease_token, worker, head, tail, total_bytes, omitted_bytes,
    truncated, finished, updated_at]}; only attempt number `attempt`'s if given (more
    than one when that number ran again after a release). None: no such job."""
    with conn.cursor(row_factory=dict_row) as cur:
        state = cur.execute(query("job_log_state", schema), {"id": job_id}).fetchone()
        if state is None:
            return None
        rows = cur.execute(
            query("job_log_list", schema), {"id": job_id, "attempt": attempt}
        ).fetchall()
    for row in rows:
        row["truncated"] = row["omitted_bytes"] > 0
    return {
        "job_id": job_id,
        "status": state["status"],
        "attempts": state["attempts"],
        "lease_token": state["lease_token"],
        "logs": rows,
    }


def omitted_marker(count: int) -> str:
    return f"[... {count} bytes omitted ...]"


def text_of(entry: dict[str, Any]) -> str:
    """One attempt's log as one text: the head, a marker line saying how much was left
    out (when anything was), the tail."""
    head, tail = entry["head"], entry["tail"]
    if not entry["omitted_bytes"]:
        return head + tail
    if head and not head.endswith("\n"):
        head += "\n"
    return f"{head}{omitted_marker(entry['omitted_bytes'])}\n{tail}"


def _raw_length(text: str) -> int:
    """The job's bytes a stored text stands for, as near as can be told: each U+FFFD
    was (most often) one invalid byte, a removed NUL cannot be counted."""
    return len(text.encode()) - 2 * text.count("\ufffd")


def _held_back(text: str, finished: bool) -> int:
    """How many characters at the end of a growing text to hold back: a U+FFFD there may
    be a character the daemon read half of (its next write completes it)."""
    return 1 if not finished and text.endswith("\ufffd") else 0


@dataclass
class Follower:
    """What `pgworkerd logs -f` printed of one attempt, counted in stored characters.

    The stored text is the job's bytes with invalid UTF-8 replaced (U+FFFD: three bytes
    for one) and NULs removed, so the job's byte counts (total_bytes, omitted_bytes)
    cannot index it: a follower counting bytes printed some output twice after invalid
    UTF-8. The head grows at its end only; so does the tail while omitted_bytes stays the
    same (its start has not moved). When the tail's start moved on, the part of it
    already printed is found again from how far it moved."""

    head_shown: int = 0  # characters of the stored head printed
    tail_printed: str = ""  # the stored tail as far as printed
    omitted: int = 0  # the tail's start (omitted_bytes) when tail_printed was read

    def next_text(self, entry: dict[str, Any]) -> str:
        """The output not printed yet (with an omitted marker where output was lost)."""
        head, tail, finished = entry["head"], entry["tail"], entry["finished"]
        out = ""
        end = len(head) - (0 if tail else _held_back(head, finished))
        if end > self.head_shown:
            out, self.head_shown = head[self.head_shown : end], end
        if not tail:
            return out
        omitted = entry["omitted_bytes"]
        start = len(self.tail_printed)
        if omitted != self.omitted:
            moved = omitted - self.omitted  # job bytes the tail's start moved on
            missed = moved - _raw_length(self.tail_printed)
            if missed > 0:  # it moved past what was printed: that much was never seen
                newline = "" if not out or out.endswith("\n") else "\n"
                out += f"{newline}{omitted_marker(missed)}\n"
                start = 0
            else:
                start = _overlap(self.tail_printed, tail, moved)
            self.omitted = omitted
        end = len(tail) - _held_back(tail, finished)
        if end > start:
            out += tail[start:end]
            self.tail_printed = tail[:end]
        else:
            self.tail_printed = tail[:start]
        return out


def _overlap(printed: str, tail: str, moved: int) -> int:
    """How many characters at the start of `tail` are the end of `printed`, the tail
    having moved on by `moved` job bytes: the cut that many bytes in (by _raw_length),
    checked against the text, and the nearest cut that matches if the count was off."""
    cut, skipped = 0, 0
    while cut < len(printed) and skipped < moved:
        skipped += _raw_length(printed[cut])
        cut += 1
    for offset in sorted(range(-8, 9), key=abs):
        at = cut + offset
        if 0 <= at <= len(printed) and tail.startswith(printed[at:]):
            return len(printed) - at
    return len(printed) - cut
