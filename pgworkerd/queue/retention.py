"""Typed wrappers for the fleet's own maintenance: retention (migration 0020:
prune_finished_v2) and the expiry sweep (0032: job_expired_cancel)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from pgworkerd.config import RetentionConfig
from pgworkerd.queue.queries import query


@dataclass(frozen=True)
class PruneResult:
    deleted: int | None  # finished jobs; None: another daemon holds the retention lock
    live_daemons: int  # the registry's daemons not gone
    schedule_runs_deleted: int | None = None
    daemons_deleted: int | None = None  # gone daemons' registry rows

    def most(self) -> int:
        """The largest of the counts (0 when the lock was taken): a full batch of any one
        table means more to do."""
        return max(self.deleted or 0, self.schedule_runs_deleted or 0, self.daemons_deleted or 0)


def prune_finished(
    conn: psycopg.Connection,
    *,
    completed: float | None,
    cancelled: float | None,
    dead: float | None,
    batch: int,
    schema: str,
    schedule_runs: float | None = None,
    gone_daemons: float | None = None,
) -> PruneResult:
    """Delete one batch (at most `batch` rows per table) of finished jobs older than their
    status's retention, schedule runs and gone daemons' rows older than theirs, in seconds
    (None keeps that kind); commits at once on an autocommit connection."""
    row = conn.execute(
        query("job_prune_finished", schema),
        {
            "completed": completed,
            "cancelled": cancelled,
            "dead": dead,
            "schedule_runs": schedule_runs,
            "gone_daemons": gone_daemons,
            "batch": batch,
        },
    ).fetchone()
    assert row is not None  # the function always returns its one row
    jobs, runs, daemons, live = row
    return PruneResult(jobs, int(live), runs, daemons)  # counts: int or None (lock taken)


def prune_batch(conn: psycopg.Connection, config: RetentionConfig, schema: str) -> PruneResult:
    """One batch of `config`'s retentions (prune_finished with its fields)."""
    return prune_finished(
        conn,
        completed=config.completed,
        cancelled=config.cancelled,
        dead=config.dead,
        schedule_runs=config.schedule_runs,
        gone_daemons=config.gone_daemons,
        batch=config.batch,
        schema=schema,
    )


def expired_cancel(conn: psycopg.Connection, max_jobs: int, schema: str) -> int:
    """End jobs past their expires_at as cancelled (at most `max_jobs` pending and as many
    running with a lease run out); returns how many ended."""
    row = conn.execute(query("job_expired_cancel", schema), {"max_jobs": max_jobs}).fetchone()
    return int(row[0]) if row else 0
