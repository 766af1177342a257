"""Integration tier: the fleet's own retention (migration 0014, pgworkerd.daemon.retention)
against a real PostgreSQL: what run_once() deletes and keeps, batches, one daemon at a
time, rows locked by others skipped, and the daemon role (roles.sql) pruning through the
function while it still cannot DELETE."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgworkerd import client
from pgworkerd.config import RetentionConfig
from pgworkerd.daemon.retention import BATCH_PAUSE, Retention
from pgworkerd.queue import retention

DAY = 86400.0
POLICY = RetentionConfig(completed=1 * DAY, cancelled=2 * DAY, dead=3 * DAY, batch=500)


def finished(conn: psycopg.Connection, schema: str, status: str, days_ago: float) -> int:
    """A job that reached `status` this many days ago."""
    job_id = client.enqueue(conn, "h", schema=schema)
    conn.execute(
        sql.SQL(
            "UPDATE {}.jobs SET status = %s,"
            " finished_at = now() - make_interval(secs => %s * 86400),"
            " result = CASE WHEN %s = 'completed' THEN '{{}}'::jsonb END WHERE id = %s"
        ).format(sql.Identifier(schema)),
        (status, days_ago, status, job_id),
    )
    return job_id


def existing(conn: psycopg.Connection, schema: str) -> set[int]:
    rows = conn.execute(sql.SQL("SELECT id FROM {}.jobs").format(sql.Identifier(schema)))
    return {r[0] for r in rows}


def pruner(dsn: str, schema: str) -> Callable[[RetentionConfig], retention.PruneResult]:
    def prune(config: RetentionConfig) -> retention.PruneResult:
        with psycopg.connect(dsn, autocommit=True) as c:
            return retention.prune_finished(
                c,
                completed=config.completed,
                cancelled=config.cancelled,
                dead=config.dead,
                batch=config.batch,
                schema=schema,
            )

    return prune


def test_run_once_deletes_finished_jobs_past_their_status_retention_only(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    gone = [
        finished(conn, schema, "completed", 1.5),
        finished(conn, schema, "cancelled", 2.5),
        finished(conn, schema, "dead", 3.5),
    ]
    kept = [
        finished(conn, schema, "completed", 0.5),
        finished(conn, schema, "cancelled", 1.5),
        finished(conn, schema, "dead", 2.5),
        client.enqueue(conn, "h", schema=schema),  # pending
    ]
    result = Retention(POLICY, pruner(test_db_dsn, schema)).run_once()
    assert result is not None and result.deleted == 3
    assert existing(conn, schema) == set(kept)
    assert not set(gone) & existing(conn, schema)
    # "off" (None) keeps that status forever
    keep_dead = dataclasses.replace(POLICY, dead=None)
    old_dead = finished(conn, schema, "dead", 400)
    assert Retention(keep_dead, pruner(test_db_dsn, schema)).run_once() == retention.PruneResult(
        0, 0
    )
    assert old_dead in existing(conn, schema)


def test_batches_follow_each_other_quickly_then_space_out(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    for _ in range(5):
        finished(conn, schema, "completed", 2)
    now = [1000.0]
    policy = dataclasses.replace(POLICY, batch=2, interval=60.0)
    r = Retention(policy, pruner(test_db_dsn, schema), clock=lambda: now[0])
    r.due_at = now[0]
    deleted = []
    for _ in range(3):
        r.tick(now[0])
        deleted.append(5 - len(existing(conn, schema)))
        if r.due_at - now[0] > BATCH_PAUSE + 0.001:
            break
        now[0] = r.due_at
    assert deleted == [2, 4, 5]
    assert r.due_at - now[0] >= 60.0 * 0.5  # the short batch: back to the spaced interval


def test_one_daemon_at_a_time_and_locked_rows_are_skipped_not_waited_for(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    a, b = finished(conn, schema, "completed", 2), finished(conn, schema, "completed", 2)
    prune = pruner(test_db_dsn, schema)
    key = f"pgworkerd.retention:{schema}"
    with psycopg.connect(test_db_dsn) as other, other.transaction():
        other.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))
        assert prune(POLICY).deleted is None  # another daemon prunes: nothing, at once
    with psycopg.connect(test_db_dsn) as other, other.transaction():
        other.execute(
            sql.SQL("SELECT 1 FROM {}.jobs WHERE id = %s FOR UPDATE").format(
                sql.Identifier(schema)
            ),
            (a,),
        )
        with psycopg.connect(test_db_dsn, autocommit=True) as c:
            c.execute("SET lock_timeout = '5s'")  # a wait would fail the test, not hang it
            assert (
                retention.prune_finished(
                    c, completed=DAY, cancelled=None, dead=None, batch=10, schema=schema
                ).deleted
                == 1
            )
    assert existing(conn, schema) == {a}
    assert b not in existing(conn, schema)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch": 0}, "batch must be 1..10000"),
        ({"batch": 10001}, "batch must be 1..10000"),
        ({"completed": -1.0}, "retention must be >= 0"),
        ({"dead": float("nan")}, "retention must be >= 0"),
    ],
)
def test_the_function_refuses_what_no_config_can_ask(
    conn: psycopg.Connection, schema: str, kwargs: dict[str, Any], message: str
) -> None:
    args: dict[str, Any] = {"completed": DAY, "cancelled": DAY, "dead": DAY, "batch": 10}
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        retention.prune_finished(conn, schema=schema, **{**args, **kwargs})


def test_live_daemons_counts_the_registry_rows_not_gone(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    ident = sql.Identifier(schema)
    for worker_id, state in (("w1", "running"), ("w2", "draining"), ("w3", "gone")):
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.workers (id, host, pid, version, queues, handlers, slots, state)"
                " VALUES (%s, 'h', 1, 'v', '{{}}', '{{}}', 1, %s)"
            ).format(ident),
            (worker_id, state),
        )
    assert pruner(test_db_dsn, schema)(POLICY).live_daemons == 2
