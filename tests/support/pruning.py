"""What `pgworkerd prune` runs (pgworkerd.daemon.retention.prune_to_end), with the
retentions of the CLI's flags: one age for the chosen final statuses, others kept."""

from __future__ import annotations

from collections.abc import Iterable

import psycopg

from pgworkerd.config import RetentionConfig
from pgworkerd.daemon.retention import Pruned, prune_to_end
from pgworkerd.model import FINAL_STATUSES


def prune(
    conn: psycopg.Connection,
    *,
    jobs_older_than: float | None = None,
    statuses: Iterable[str] = FINAL_STATUSES,
    schedule_runs_older_than: float | None = None,
    gone_daemons_older_than: float | None = None,
    batch: int = 10_000,
    schema: str,
) -> Pruned:
    chosen = set(statuses)
    assert chosen <= set(FINAL_STATUSES), chosen

    def age(status: str) -> float | None:
        return jobs_older_than if status in chosen else None

    config = RetentionConfig(
        completed=age("completed"),
        cancelled=age("cancelled"),
        dead=age("dead"),
        schedule_runs=schedule_runs_older_than,
        gone_daemons=gone_daemons_older_than,
        batch=batch,
    )
    return prune_to_end(conn, config, schema)
