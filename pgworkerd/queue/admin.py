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


# -- a selection of jobs (the dashboard's bulk actions) -------------------------------------

# Jobs one bulk action changes at most (job_priority_set holds the same bound).
BULK_MAX = 1000


class BadSelection(ValueError):
    """A selection of jobs a bulk action refuses (the message says why)."""


def _selection(ids: Sequence[int]) -> list[int]:
    chosen = sorted(set(ids))
    if not chosen:
        raise BadSelection("no job selected")
    if len(chosen) > BULK_MAX:
        raise BadSelection(f"at most {BULK_MAX} jobs per action, not {len(chosen)}")
    return chosen


def run_now(
    conn: psycopg.Connection[Any], ids: Sequence[int], *, schema: str = DEFAULT_SCHEMA
) -> list[int]:
    """Pending jobs due later made due now; returns the ids moved."""
    rows = conn.execute(query("job_run_now", schema), {"ids": _selection(ids)}).fetchall()
    return sorted(r[0] for r in rows)


def delete_finished(
    conn: psycopg.Connection[Any], ids: Sequence[int], *, schema: str = DEFAULT_SCHEMA
) -> list[int]:
    """Finished jobs (completed, dead, cancelled) deleted; returns the ids deleted."""
    rows = conn.execute(query("job_delete_finished", schema), {"ids": _selection(ids)}).fetchall()
    return sorted(r[0] for r in rows)


def set_priority(
    conn: psycopg.Connection[Any],
    ids: Sequence[int],
    priority: int,
    *,
    schema: str = DEFAULT_SCHEMA,
) -> dict[int, str]:
    """The priority of pending, waiting and suspended jobs: id -> 'priority set', 'is
    <status>' or 'not found'."""
    rows = conn.execute(
        query("job_priority_set", schema), {"ids": _selection(ids), "priority": priority}
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def dead_ids(
    conn: psycopg.Connection[Any],
    *,
    queue: str | None = None,
    handler: str | None = None,
    limit: int = BULK_MAX,
    schema: str = DEFAULT_SCHEMA,
) -> list[int]:
    """The newest `limit` dead jobs of a queue or a handler (one of them given)."""
    if queue is None and handler is None:
        raise BadSelection("name a queue or a handler")
    params = {"queue": queue, "handler": handler, "limit": limit}
    return [r[0] for r in conn.execute(query("job_dead_ids", schema), params).fetchall()]
