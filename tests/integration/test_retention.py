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
from daemon_harness import Daemons
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
                schedule_runs=config.schedule_runs,
                gone_daemons=config.gone_daemons,
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
        0, 0, 0, 0
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
        ({"completed": -1.0}, "retention must be from 0 to 100 years"),
        ({"dead": float("nan")}, "retention must be from 0 to 100 years"),
        ({"schedule_runs": float("inf")}, "retention must be from 0 to 100 years"),
        ({"gone_daemons": -5.0}, "retention must be from 0 to 100 years"),
        ({"completed": 1e300}, "retention must be from 0 to 100 years"),
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


# -- schedule runs and gone daemons (migration 0020: prune_finished_v2) --------------------


def run_sql(conn: psycopg.Connection, schema: str, text: str, params: Any = None) -> list[Any]:
    cur = conn.execute(sql.SQL(text).format(schema=sql.Identifier(schema)), params)
    return cur.fetchall() if cur.description else []


def add_runs(conn: psycopg.Connection, schema: str, name: str, hours_ago: list[float]) -> None:
    """A schedule and one run (a skipped tick) per age; ticks on whole hours."""
    run_sql(
        conn,
        schema,
        "INSERT INTO {schema}.schedules (name, definition, declared_by, created_at)"
        " VALUES (%s, '{{}}', 'test', now() - interval '30 days')",
        (name,),
    )
    run_sql(
        conn,
        schema,
        "INSERT INTO {schema}.schedule_runs (schedule, tick, skipped, fired_by, fired_at)"
        " SELECT %s, date_trunc('hour', now()) - make_interval(secs => h * 3600),"
        "        'test', 'test', now() - make_interval(secs => h * 3600)"
        "   FROM unnest(%s::float8[]) h",
        (name, hours_ago),
    )


def run_ages(conn: psycopg.Connection, schema: str, name: str) -> list[float]:
    """The schedule's runs, as whole hours before the current hour, oldest first."""
    rows = run_sql(
        conn,
        schema,
        "SELECT extract(epoch FROM date_trunc('hour', now()) - tick) / 3600"
        "  FROM {schema}.schedule_runs WHERE schedule = %s ORDER BY tick",
        (name,),
    )
    return [round(float(r[0])) for r in rows]


def prune_until_short(
    conn: psycopg.Connection, schema: str, field: str, batch: int, **retentions: float | None
) -> list[int]:
    """Call the function as the daemon does until a batch comes back short; returns what
    each call deleted of `field`."""
    counts = []
    while True:
        result = retention.prune_finished(
            conn,
            completed=None,
            cancelled=None,
            dead=None,
            batch=batch,
            schema=schema,
            **retentions,
        )
        counts.append(getattr(result, field))
        if counts[-1] < batch:
            return counts


def test_old_schedule_runs_go_in_bounded_batches_keeping_what_the_schedules_need(
    conn: psycopg.Connection, schema: str
) -> None:
    week = 7 * 24
    # a one-hour schedule over 10 days: 240 runs, 72 of them past a 7-day retention
    add_runs(conn, schema, "hourly", [float(h) for h in range(240)])
    # a schedule whose runs are all old: its latest is where catch-up counts from
    add_runs(conn, schema, "stopped", [float(h) for h in range(200, 240)])
    # a schedule whose job of 9 days ago still waits (a paused queue): overlap finds it
    # through its run, so that run and every later one stay; the older ones go
    add_runs(conn, schema, "long_job", [float(h) for h in range(200, 240)])
    job = client.enqueue(conn, "h", schema=schema)
    run_sql(
        conn,
        schema,
        "UPDATE {schema}.schedule_runs SET job_id = %s, skipped = NULL"
        " WHERE schedule = 'long_job' AND tick = date_trunc('hour', now()) - interval '216 hours'",
        (job,),
    )

    counts = prune_until_short(
        conn, schema, "schedule_runs_deleted", batch=25, schedule_runs=7 * DAY
    )
    assert max(counts) <= 25 and len(counts) > 1, counts  # bounded: several calls
    # hourly: 72 past the week go (ages 168..239 h); runs of the last week stay
    assert sum(counts) == 72 + 39 + 23, counts
    assert run_ages(conn, schema, "hourly") == list(range(week - 1, -1, -1))
    assert run_ages(conn, schema, "stopped") == [200]
    assert run_ages(conn, schema, "long_job") == list(range(216, 199, -1))
    # once the job has finished its run may go too (the latest stays)
    run_sql(
        conn,
        schema,
        "UPDATE {schema}.jobs SET status = 'completed', result = '{{}}', finished_at = now()"
        " WHERE id = %s",
        (job,),
    )
    assert prune_until_short(conn, schema, "schedule_runs_deleted", 25, schedule_runs=7 * DAY)
    assert run_ages(conn, schema, "long_job") == [200]
    # "off" keeps them: nothing deleted, and jobs/daemons untouched too
    add_runs(conn, schema, "off", [300.0, 1.0])
    result = retention.prune_finished(
        conn, completed=None, cancelled=None, dead=None, batch=25, schema=schema
    )
    assert (result.schedule_runs_deleted, result.daemons_deleted) == (0, 0)
    assert run_ages(conn, schema, "off") == [300, 1]


def test_gone_daemons_rows_go_in_bounded_batches_live_ones_never(
    conn: psycopg.Connection, schema: str
) -> None:
    def worker(worker_id: str, state: str, stopped_days: float | None, beat_days: float) -> None:
        run_sql(
            conn,
            schema,
            "INSERT INTO {schema}.workers (id, host, pid, version, slots, state, stopped_at,"
            " heartbeat_at) VALUES (%s, 'h', 1, 'v', 1, %s,"
            " now() - make_interval(secs => %s * 86400),"
            " now() - make_interval(secs => %s * 86400))",
            (worker_id, state, stopped_days, beat_days),
        )

    for n in range(23):
        worker(f"old-{n}", "gone", 8 + n / 10, 8 + n / 10)
    worker("marked-gone", "gone", None, 9)  # marked by a peer: no stop time, silent 9 days
    worker("recent", "gone", 1, 1)
    worker("silent-live", "running", None, 30)  # not (yet) marked gone: never deleted
    worker("draining", "draining", None, 0)
    counts = prune_until_short(conn, schema, "daemons_deleted", batch=10, gone_daemons=7 * DAY)
    assert counts == [10, 10, 4], counts
    left = {r[0] for r in run_sql(conn, schema, "SELECT id FROM {schema}.workers")}
    assert left == {"recent", "silent-live", "draining"}


def test_a_running_daemon_prunes_old_schedule_runs_and_gone_daemons_by_its_config(
    daemons: Daemons, conn: psycopg.Connection, schema: str
) -> None:
    """End to end: `pgworkerd run` with [retention] schedule_runs and gone_daemons."""
    add_runs(conn, schema, "hourly", [float(h) for h in range(48)])  # two days of runs
    run_sql(
        conn,
        schema,
        "INSERT INTO {schema}.workers (id, host, pid, version, slots, state, stopped_at)"
        " VALUES ('long-gone', 'h', 1, 'v', 1, 'gone', now() - interval '3 days')",
    )
    daemon = daemons.start(
        {"echo": {"target": "pgworkerd.examples:echo"}},
        tables={
            "retention": {
                "schedule_runs": "1d",
                "gone_daemons": "2d",
                "interval": "1s",
                "batch": 10,
            }
        },
    )
    daemon.wait_log(r"retention: deleted 24 schedule run\(s\) and 1 gone daemon\(s\)")
    assert run_ages(conn, schema, "hourly") == list(range(23, -1, -1))
    left = {r[0] for r in run_sql(conn, schema, "SELECT id FROM {schema}.workers")}
    assert "long-gone" not in left and left  # the daemon's own row stays
