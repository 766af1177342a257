"""Typed wrapper for the fleet's own retention (migration 0014: prune_finished_v1)."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from pgworkerd.queue.queries import query


@dataclass(frozen=True)
class PruneResult:
    deleted: int | None  # None: another daemon holds the retention lock (it prunes)
    live_daemons: int  # the registry's daemons not gone


def prune_finished(
    conn: psycopg.Connection,
    *,
    completed: float | None,
    cancelled: float | None,
    dead: float | None,
    batch: int,
    schema: str,
) -> PruneResult:
    """Delete one batch (at most `batch` rows) of finished jobs older than their status's
    retention in seconds (None keeps that status); commits at once on an autocommit
    connection."""
    row = conn.execute(
        query("job_prune_finished", schema),
        {"completed": completed, "cancelled": cancelled, "dead": dead, "batch": batch},
    ).fetchone()
    assert row is not None  # the function always returns its one row
    return PruneResult(None if row[0] is None else int(row[0]), int(row[1]))
