"""What operators run (the CLI's cancel, retry, prune, jobs and show): plain statements
through psycopg's public API, each on a connection owned by the caller."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgworkerd.model import STATUSES
from pgworkerd.queue.queries import DEFAULT_SCHEMA, query


def cancel(
    conn: psycopg.Connection[Any], ids: Sequence[int], *, schema: str = DEFAULT_SCHEMA
) -> dict[int, str]:
    """Cancel jobs: id → 'cancelled', 'cancel requested', 'already <status>' or 'not found'."""
    rows = conn.execute(query("job_cancel", schema), {"ids": list(ids)}).fetchall()
    return {r[0]: r[1] for r in rows}


class NotHeld(ValueError):
    """release_held: the job is not held for an operator (the message says why)."""


def release_held(
    conn: psycopg.Connection[Any], job_id: int, *, schema: str = DEFAULT_SCHEMA
) -> str:
    """Release a job held after a parent failed (on_parent_failure hold); returns its
    status after ('pending', or 'waiting' for parents not finished yet)."""
    try:
        with conn.transaction():
            [(status,)] = conn.execute(query("job_held_release", schema), {"id": job_id}).fetchall()
    except psycopg.errors.InvalidParameterValue as exc:
        raise NotHeld(str(exc).removeprefix("pgworkerd: ")) from None
    return str(status)


def retry(
    conn: psycopg.Connection[Any],
    *,
    ids: Sequence[int] | None = None,
    queue: str | None = None,
    handler: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[int]:
    """Dead or cancelled jobs back to pending with fresh attempts; returns their ids."""
    if ids is None and queue is None and handler is None:
        raise ValueError("retry needs job ids, a queue or a handler")
    rows = conn.execute(
        query("job_retry", schema),
        {"ids": None if ids is None else list(ids), "queue": queue, "handler": handler},
    ).fetchall()
    return sorted(r[0] for r in rows)


def check_statuses(statuses: Iterable[str]) -> list[str]:
    chosen = list(statuses)
    unknown = [s for s in chosen if s not in STATUSES]
    if unknown:
        raise ValueError(
            f"unknown status {', '.join(map(repr, unknown))}: choose from {', '.join(STATUSES)}"
        )
    return chosen


def get(conn: psycopg.Connection[Any], job_id: int, *, schema: str = DEFAULT_SCHEMA) -> dict | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("job_get", schema), {"id": job_id}).fetchone()


def list_jobs(
    conn: psycopg.Connection[Any],
    *,
    statuses: Iterable[str] | None = None,
    queue: str | None = None,
    handler: str | None = None,
    limit: int = 50,
    schema: str = DEFAULT_SCHEMA,
) -> list[dict[str, Any]]:
    params = {
        "statuses": None if statuses is None else check_statuses(statuses),
        "queue": queue,
        "handler": handler,
        "limit": limit,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("job_list", schema), params).fetchall()


def counts(
    conn: psycopg.Connection[Any], *, schema: str = DEFAULT_SCHEMA
) -> list[tuple[str, str, int]]:
    return [(r[0], r[1], r[2]) for r in conn.execute(query("job_counts", schema)).fetchall()]


def counts_capped(
    conn: psycopg.Connection[Any], served: Sequence[str], top: int, *, schema: str = DEFAULT_SCHEMA
) -> list[tuple[str | None, str, int]]:
    """(queue, status, jobs) for the `served` queues and the `top` biggest others; the rest
    of the queues come summed with queue None. Bounded however many queues enqueuers
    made up (status and the metrics gauge both show it)."""
    rows = conn.execute(
        query("job_counts_capped", schema), {"served": list(served), "top": top}
    ).fetchall()
    return [(r[0], r[1], int(r[2])) for r in rows]
