"""Test-only calls on the queue, kept out of the runtime package (the daemon claims with
lease.claim_checked/complete_and_claim and finishes many jobs at once): claim jobs and
bury the ones that cannot be loaded, complete one job, the seconds until the next job.
The integration tests and the benchmarks (bench/ puts tests/support on sys.path) hold
jobs through these."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import psycopg

from pgworkerd.queue import hotpath
from pgworkerd.queue.lease import (
    ClaimedJob,
    HandlerCapacity,
    bury,
    claim_checked,
    jsonb_or_none,
    next_wakeups,
)
from pgworkerd.queue.queries import DEFAULT_SCHEMA


def claim(
    conn: psycopg.Connection[Any],
    worker: str,
    *,
    queues: Sequence[str],
    handlers: Mapping[str, HandlerCapacity],
    limit: int,
    schema: str = DEFAULT_SCHEMA,
) -> list[ClaimedJob]:
    """Claim up to `limit` due jobs (and rescue expired leases) in one statement. A job
    whose row cannot be loaded is finished as dead at once, with the reason in
    last_error; the others are returned."""
    claimed, refused = claim_checked(
        conn, worker, queues=queues, handlers=handlers, limit=limit, schema=schema
    )
    for job in refused:
        bury(conn, worker, job.id, job.token, f"cannot run: {job.reason}", schema=schema)
    return claimed


def complete(
    conn: psycopg.Connection[Any],
    worker: str,
    job_id: int,
    token: int,
    result: Any = None,
    *,
    progress: Any = None,
    schema: str = DEFAULT_SCHEMA,
) -> bool:
    """Mark a held job completed. False: the lease was lost, nothing changed."""
    rows = hotpath.run(
        conn,
        "job_complete_one",
        {
            "id": job_id,
            "worker": worker,
            "token": token,
            "result": jsonb_or_none(result),
            "progress": jsonb_or_none(progress),
        },
        schema=schema,
    )
    return bool(rows)


def next_run_in(
    conn: psycopg.Connection[Any],
    queues: Iterable[str],
    handlers: Iterable[str],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> float | None:
    """Seconds until the earliest scheduled (future) job this worker could claim, by the
    server's clock; None when there is none."""
    return next_wakeups(conn, queues, handlers, schema=schema).run_in
