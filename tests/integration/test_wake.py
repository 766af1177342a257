"""Integration tier: the wake channel (schema 13). What the jobs table's trigger sends for
every path that inserts jobs, what the registry and drain statements send, the daemon's
look-ahead (earliest scheduled job and earliest lease expiry in one statement), and that
enqueue's old notification is still sent for daemons of older releases."""

from __future__ import annotations

import json
import time
from typing import Any

import leasing
import psycopg
import pytest
from psycopg import sql

from pgworkerd import client
from pgworkerd.queue import fleet, lease, registry
from pgworkerd.queue.lease import HandlerCapacity
from pgworkerd.queue.queries import notify_channel, wake_channel

# a daemon's registry secret (schema 24), the same for every row of these tests
SECRET = "test-registry-secret-" + "x" * 32


class Listener:
    def __init__(self, dsn: str, schema: str) -> None:
        self.schema = schema
        self.conn = psycopg.connect(dsn, autocommit=True)
        for channel in (wake_channel(schema), notify_channel(schema)):
            self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

    def received(self, sender: psycopg.Connection) -> list[tuple[str, Any]]:
        """(channel kind, payload) up to a marker sent after the events under test."""
        sender.execute("SELECT pg_notify(%s, 'marker')", (wake_channel(self.schema),))
        got: list[tuple[str, Any]] = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            for n in self.conn.notifies(timeout=1.0):
                if n.payload == "marker":
                    return got
                kind = "wake" if n.channel == wake_channel(self.schema) else "old"
                got.append((kind, json.loads(n.payload) if kind == "wake" else n.payload))
        pytest.fail(f"the marker never arrived; got {got}")


@pytest.fixture
def listener(test_db_dsn: str, schema: str) -> Any:
    ear = Listener(test_db_dsn, schema)
    yield ear
    ear.conn.close()


def test_each_insert_names_its_jobs_once_per_queue_and_handler(
    conn: psycopg.Connection, schema: str, listener: Listener
) -> None:
    one = client.enqueue(conn, "h", schema=schema)
    assert sorted(listener.received(conn), key=str) == [
        ("old", "default"),  # enqueue's own, for daemons of older releases
        ("wake", {"q": "default", "h": "h", "id": one, "n": 1}),
    ]
    ids = client.enqueue_many(
        conn,
        [client.JobSpec("h")] * 3 + [client.JobSpec("g", queue="other")] * 2,
        schema=schema,
    )
    wakes = sorted((p for k, p in listener.received(conn) if k == "wake"), key=lambda p: p["h"])
    assert wakes == [
        {"q": "other", "h": "g", "id": ids[3], "n": 2},
        {"q": "default", "h": "h", "id": ids[0], "n": 3},
    ]
    # a direct INSERT (any role that may) and a dedupe hit that inserts nothing
    conn.execute(
        sql.SQL("INSERT INTO {}.jobs (handler) VALUES ('raw')").format(sql.Identifier(schema))
    )
    client.enqueue(conn, "k", dedupe_key="x", schema=schema)
    client.enqueue(conn, "k", dedupe_key="x", schema=schema)
    wakes = [p for k, p in listener.received(conn) if k == "wake"]
    assert [(p["h"], p["n"]) for p in wakes] == [("raw", 1), ("k", 1)]


def test_names_too_long_for_a_payload_leave_the_insert_alone(
    conn: psycopg.Connection, schema: str, listener: Listener
) -> None:
    long_name = "x" * 3000  # only a direct INSERT gets past enqueue's 128 characters
    conn.execute(
        sql.SQL("INSERT INTO {}.jobs (handler, queue) VALUES (%s, %s)").format(
            sql.Identifier(schema)
        ),
        (long_name, long_name),
    )
    [(kind, payload)] = listener.received(conn)
    assert kind == "wake" and set(payload) == {"id", "n"}


def test_peers_hear_of_registrations_departures_stale_marks_and_drains(
    conn: psycopg.Connection, schema: str, listener: Listener
) -> None:
    info = registry.WorkerInfo("w1", "host", 1, "test", ["default"], ["h"], 2)
    registry.register(conn, info, "running", schema, secret=SECRET)
    assert registry.peers(conn, 60.0, schema) == [("w1", ["default"], ["h"], 2)]
    fleet.request_drain(conn, schema, drain=True, worker_id="w1")
    registry.deregister(conn, "w1", schema, secret=SECRET)
    registry.register(
        conn,
        registry.WorkerInfo("w2", "h", 2, "t", ["q"], ["h"], 1),
        "running",
        schema,
        secret=SECRET,
    )
    conn.execute(
        sql.SQL("UPDATE {}.workers SET heartbeat_at = now() - interval '2 minutes'").format(
            sql.Identifier(schema)
        )
    )
    assert registry.peers(conn, 60.0, schema) == []
    assert [r[0] for r in registry.mark_stale(conn, 60.0, schema)] == ["w2"]
    assert [p for _, p in listener.received(conn)] == [
        {"peer": "up", "id": "w1", "queues": ["default"], "handlers": ["h"], "slots": 2},
        {"registry": "drain"},
        {"peer": "down", "id": "w1"},
        {"peer": "up", "id": "w2", "queues": ["q"], "handlers": ["h"], "slots": 1},
        {"peer": "down", "id": "w2"},
    ]


def test_the_look_ahead_finds_the_lease_that_runs_out_first(
    conn: psycopg.Connection, schema: str
) -> None:
    assert lease.next_wakeups(conn, ["default"], ["h"], schema=schema) == lease.NextWakeups(
        None, None
    )
    for seconds in (30.0, 10.0):
        client.enqueue(conn, "h", schema=schema)
        leasing.claim(
            conn,
            f"w{int(seconds)}",
            queues=["default"],
            handlers={"h": HandlerCapacity(lease_seconds=seconds, free=1)},
            limit=1,
            schema=schema,
        )
    client.enqueue(conn, "h", delay=60, schema=schema)
    found = lease.next_wakeups(conn, ["default"], ["h"], schema=schema)
    assert found.run_in is not None and 55 < found.run_in <= 60
    assert found.expiring is not None
    assert found.expiring.holder == "w10" and 5 < found.expiring.expires_in <= 10
    assert lease.next_wakeups(conn, ["default"], ["other"], schema=schema).expiring is None
