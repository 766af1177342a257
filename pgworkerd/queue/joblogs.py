"""Job logs (migration 0015): what each attempt printed, bounded to a head and a tail.

One query layer for every reader (`pgworkerd logs`, the dashboard) and the daemon's one
write. The text is stored as PostgreSQL can hold it (`storable`); readers show it inert
(`pgworkerd.describe.printable`), since a job's output is the job's to choose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgworkerd.queue.queries import query


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
