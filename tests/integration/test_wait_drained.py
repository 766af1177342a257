"""Integration tests of queue.fleet.wait_drained, the loop behind `pgworkerd drain --wait`:
real PostgreSQL, registry rows written by the test (no daemon runs)."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import TupleRow

from pgworkerd.queue import fleet

Conn = psycopg.Connection[TupleRow]


def add_daemon(
    conn: Conn,
    schema: str,
    worker_id: str,
    state: str,
    in_flight: list[int],
    silent_for: float = 0.0,
) -> None:
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, host, pid, version, slots, state, in_flight, drain_requested,"
            " heartbeat_at) VALUES (%s, 'h1', 10, '0.1', 4, %s, %s, true,"
            " now() - make_interval(secs => %s))"
        ).format(sql.Identifier(schema, "workers")),
        (worker_id, state, in_flight, silent_for),
    )


def set_daemon(conn: Conn, schema: str, worker_id: str, state: str, in_flight: list[int]) -> None:
    conn.execute(
        sql.SQL("UPDATE {} SET state = %s, in_flight = %s WHERE id = %s").format(
            sql.Identifier(schema, "workers")
        ),
        (state, in_flight, worker_id),
    )


def state_of(conn: Conn, schema: str, worker_id: str) -> Any:
    row = conn.execute(
        sql.SQL("SELECT state FROM {} WHERE id = %s").format(sql.Identifier(schema, "workers")),
        (worker_id,),
    ).fetchone()
    assert row is not None
    return row[0]


def test_waits_until_every_daemon_is_drained_and_runs_no_jobs(conn: Conn, schema: str) -> None:
    add_daemon(conn, schema, "a", "draining", [7, 3])
    add_daemon(conn, schema, "b", "draining", [])  # no jobs, but not drained yet either
    add_daemon(conn, schema, "other", "running", [9])  # busy, but not waited for
    looks: list[fleet.DrainProgress] = []

    def on_progress(progress: fleet.DrainProgress) -> None:
        looks.append(progress)
        # The daemons move on between looks, one at a time.
        if len(looks) == 2:
            set_daemon(conn, schema, "b", "drained", [])
        if len(looks) == 3:
            set_daemon(conn, schema, "a", "drained", [])

    last = fleet.wait_drained(conn, schema, ["a", "b"], None, on_progress, interval=0.01)

    assert last.drained and last.busy == [] and last.running_jobs == []
    assert looks[-1] is last and len(looks) == 4
    assert sorted(d["id"] for d in looks[0].busy) == ["a", "b"]
    assert looks[0].running_jobs == [3, 7]
    assert [d["id"] for d in looks[2].busy] == ["a"]
    assert all(not look.marked_gone for look in looks)


def test_a_timeout_returns_the_jobs_still_running(conn: Conn, schema: str) -> None:
    add_daemon(conn, schema, "a", "draining", [5])
    looks: list[fleet.DrainProgress] = []
    started = time.monotonic()

    last = fleet.wait_drained(conn, schema, {"a"}, 0.3, looks.append, interval=0.05)

    elapsed = time.monotonic() - started
    assert not last.drained
    assert last.running_jobs == [5] and [d["id"] for d in last.busy] == ["a"]
    assert looks[-1] is last and len(looks) >= 2
    assert 0.3 <= elapsed < 30  # generous: a loaded 2-core machine
    assert state_of(conn, schema, "a") == "draining"  # waiting changes nothing


def test_a_silent_daemon_is_marked_gone_and_waited_for_no_longer(conn: Conn, schema: str) -> None:
    # Killed while draining: it never reports drained. Silent past STALE_AFTER_SECONDS.
    add_daemon(conn, schema, "dead", "draining", [4], silent_for=61)
    add_daemon(conn, schema, "dead-elsewhere", "running", [8], silent_for=61)
    looks: list[fleet.DrainProgress] = []

    last = fleet.wait_drained(conn, schema, ["dead"], 10, looks.append, interval=0.01)

    assert last.drained and looks == [last]
    assert last.marked_gone == [("dead", "h1", 10)]  # only the daemons waited for
    assert state_of(conn, schema, "dead") == "gone"
    assert state_of(conn, schema, "dead-elsewhere") == "gone"  # as any daemon would
