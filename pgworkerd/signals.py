"""Signalling a job that waits (pgworkerd.signal, `pgworkerd signal`): the application side
of durable waits (a handler's `raise pgworkerd.WaitFor(name, timeout, key=...)`).

Through the SQL functions signal_send and signal_send_by_key_v2 (sql/objects/signals.sql,
granted to pgworkerd_enqueuer), which decide everything (first write wins, a signal sent
before the wait is kept, a finished job takes none); the checks here refuse a bad name,
key or payload early, without a round trip, with the same words.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from pgworkerd import bounds
from pgworkerd.jsontext import storable_json
from pgworkerd.queue import records
from pgworkerd.queue.queries import DEFAULT_SCHEMA, query

# A signal's payload: enqueue's payload bounds (64 MiB as JSON text here, as jsonb there;
# nested at most 255 levels deep).
PAYLOAD_MAX_BYTES = 64 * 1024 * 1024


class SignalRefused(ValueError):
    """A signal that was not delivered, and why (nothing changed): a bad name, key or
    payload, an unknown or finished job, a parked signal over its bounds."""


@records.built_from("signal_send", "signal_send_by_key")
@dataclass(frozen=True)
class SignalSent:
    """What became of a signal: `outcome` is "resumed" (the job waited for it: pending
    now), "kept" (the job does not wait for it yet: its next WaitFor for this name returns
    at once), "ignored" (the job, or the key, had a signal of that name already: first
    write wins, nothing changed; `sent_at` is the first one's time) or, by key only,
    "parked" (no live job of yours holds the key yet: the next one that waits with it
    receives the signal; `job_id` and `status` are None)."""

    job_id: int | None  # None: parked under the key (or ignored there)
    outcome: str
    status: str | None  # the job's status after it; None when no job was reached
    sent_at: datetime


def signal_problem(name: Any, payload: Any, key: Any = None) -> tuple[str | None, str | None]:
    """(why this signal cannot be sent or None, its payload as JSON text or None)."""
    problem = bounds.name_problem("signal name", name)
    if problem is None and key is not None:
        problem = bounds.name_problem("correlation key", key)
    if problem is not None:
        return problem, None
    if payload is None:
        return None, None
    try:
        text = storable_json(payload)
    except (TypeError, ValueError, RecursionError) as exc:
        return f"signal payload cannot be stored as JSON: {exc}", None
    if len(text) > PAYLOAD_MAX_BYTES:
        return f"signal payload must be at most 64 MiB, not {len(text)} bytes", None
    if bounds.payload_too_deep(payload):
        return f"signal payload must be nested at most {bounds.PAYLOAD_DEPTH_MAX} levels deep", None
    return None, text


def signal(
    conn: psycopg.Connection[Any],
    job_id: int | None,
    name: str,
    payload: Any = None,
    *,
    key: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> SignalSent:
    """Send signal `name` with `payload` (any JSON value) to job `job_id`, or to the live
    job whose WaitFor holds correlation key `key` (job_id None). A job waiting for it
    becomes pending at once and its next attempt sees it (`job.signal`); a job not
    waiting for it yet keeps it; by key, with no live job of yours holding the key yet,
    it is parked under the key for the next job that waits with it (outcome "parked").
    Raises SignalRefused (nothing changed) for a bad name, key or payload, an unknown or
    finished job, or a parked signal over its bounds. Runs in the caller's transaction,
    like enqueue: commit to deliver."""
    if (job_id is None) == (key is None):
        raise SignalRefused("give either a job id or a correlation key, not both or neither")
    if job_id is not None and (isinstance(job_id, bool) or not isinstance(job_id, int)):
        raise SignalRefused(f"job_id must be an integer, not {type(job_id).__name__}")
    problem, text = signal_problem(name, payload, key)
    if problem is not None:
        raise SignalRefused(problem)
    statement, params = (
        ("signal_send", {"id": job_id, "name": name, "payload": text})
        if key is None
        else ("signal_send_by_key", {"key": key, "name": name, "payload": text})
    )
    try:
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(query(statement, schema), params)
            row = cur.fetchone()
            columns = tuple(c.name for c in cur.description or ())
    except psycopg.errors.InvalidParameterValue as exc:
        message = (exc.diag.message_primary or str(exc)).removeprefix("pgworkerd: ")
        message = message.removeprefix("signal refused: ")
        raise SignalRefused(message) from None
    assert row is not None
    return records.build(SignalSent, columns, row)
