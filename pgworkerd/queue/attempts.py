"""Attempt history (migration 0012): the daemon's accounting of what each attempt cost,
and a job's attempts as `pgworkerd show` prints them.

The rows themselves are written by a trigger on jobs whatever ended the attempt (see the
migration); the daemon only adds its figures, keyed by job and lease token.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgworkerd.queue import hotpath
from pgworkerd.queue.queries import DEFAULT_SCHEMA, query

log = logging.getLogger("pgworkerd")


@dataclass(frozen=True)
class Usage:
    """What one attempt cost, as its daemon measured it."""

    job_id: int
    token: int
    wall: float  # seconds from the claim to the end of the attempt
    cpu_user: float | None  # seconds, the job's process tree; None: not measured
    cpu_system: float | None
    peak_memory: int | None  # bytes, the tree's peak resident memory


def account(
    conn: psycopg.Connection[Any],
    worker: str,
    usages: Sequence[Usage],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> set[int]:
    """Add the figures to the attempts' rows; returns the job ids whose row was found."""
    if not usages:
        return set()
    rows = hotpath.run(
        conn,
        "attempt_account",
        {
            "worker": worker,
            "ids": [u.job_id for u in usages],
            "tokens": [u.token for u in usages],
            "wall": [u.wall for u in usages],
            "cpu_user": [u.cpu_user for u in usages],
            "cpu_system": [u.cpu_system for u in usages],
            "peak_memory": [u.peak_memory for u in usages],
        },
        schema=schema,
    )
    return {r[0] for r in rows}


def record_usage(
    conn: psycopg.Connection[Any], worker: str, usages: Sequence[Usage], *, schema: str
) -> bool:
    """The daemon's write of its figures (`account`). Accounting never costs an outcome: a
    statement the database refuses (e.g. a role without the grant) is logged and dropped;
    a lost connection is raised like any other."""
    try:
        account(conn, worker, usages, schema=schema)
    except psycopg.Error as exc:
        if conn.broken or conn.closed:
            raise
        log.warning("attempt figures not recorded: %s", str(exc).strip().splitlines()[0])
    return True


def history(
    conn: psycopg.Connection[Any], job_id: int, *, schema: str = DEFAULT_SCHEMA
) -> list[dict[str, Any]]:
    """A job's attempts, oldest first, as dicts of attempt_list's columns."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("attempt_list", schema), {"id": job_id})
        return cur.fetchall()


@dataclass(frozen=True)
class MemoryPeak:
    """A handler's recent peak memory: the percentile of its measured attempts' peaks
    (bytes; None: none measured) and how many attempts it is taken over."""

    peak: int | None
    attempts: int


def memory_peaks(
    conn: psycopg.Connection[Any],
    handlers: Sequence[str],
    *,
    percentile: float,
    last: int,
    jobs: int,
    schema: str = DEFAULT_SCHEMA,
) -> dict[str, MemoryPeak]:
    """Per handler, the `percentile` of the peak memory of its `last` newest measured
    attempts (among those of its newest `jobs` completed and dead jobs)."""
    rows = conn.execute(
        query("attempt_memory_peaks", schema),
        {
            "handlers": list(handlers),
            "percentile": percentile,
            "last": last,
            "jobs": jobs,
        },
    ).fetchall()
    return {name: MemoryPeak(None if peak is None else int(peak), int(n)) for name, peak, n in rows}


# The rollup's bounds per step: attempts counted per statement at most (about), and how
# long after its end an attempt is counted (its row may commit a little after its
# finished_at, which is its transaction's start).
ROLLUP_MAX_ATTEMPTS = 50_000
ROLLUP_LAG_SECONDS = 30.0


@dataclass(frozen=True)
class RollupStep:
    """Where one step of the charts' rollup left the cursor, and whether more is due."""

    rolled_to: Any  # datetime
    behind: bool


def rollup_advance(
    conn: psycopg.Connection[Any],
    schema: str = DEFAULT_SCHEMA,
    *,
    max_attempts: int = ROLLUP_MAX_ATTEMPTS,
    lag_seconds: float = ROLLUP_LAG_SECONDS,
) -> RollupStep | None:
    """One step of the charts' rollup (attempt_rollups_advance); None: another daemon
    is rolling up."""
    row = conn.execute(
        query("attempt_rollups_advance", schema),
        {"max_attempts": max_attempts, "lag_seconds": lag_seconds},
    ).fetchone()
    return None if row is None else RollupStep(row[0], bool(row[1]))
