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


# -- wake-ups aimed at daemons (schema 40, issue 26 item 6) ------------------------------


def register(
    conn: psycopg.Connection,
    schema: str,
    worker_id: str,
    *,
    slots: int = 1,
    listening: bool = True,
    handlers: tuple[str, ...] = ("h",),
) -> str | None:
    """A running daemon's row, saying it listens on its own channel; returns the channel."""
    info = registry.WorkerInfo(worker_id, "host", 1, "test", ["default"], list(handlers), slots)
    registry.register(conn, info, "running", schema, secret=SECRET)
    assert registry.wake_channel_set(conn, worker_id, listening, schema, secret=SECRET)
    row = conn.execute(
        sql.SQL("SELECT wake_channel FROM {}.workers WHERE id = %s").format(sql.Identifier(schema)),
        (worker_id,),
    ).fetchone()
    assert row is not None
    return row[0]


class Ears:
    """One session listening on the fleet's channel and on daemons' own channels."""

    def __init__(self, dsn: str, schema: str, own: dict[str, str]) -> None:
        self.schema, self.own = schema, {channel: name for name, channel in own.items()}
        self.conn = psycopg.connect(dsn, autocommit=True)
        for channel in [wake_channel(schema), *self.own]:
            self.conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))

    def received(self, sender: psycopg.Connection) -> list[tuple[str, Any]]:
        """(daemon name, or "fleet"; payload) up to a marker sent after the events."""
        sender.execute("SELECT pg_notify(%s, 'marker')", (wake_channel(self.schema),))
        got: list[tuple[str, Any]] = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            for n in self.conn.notifies(timeout=1.0):
                if n.payload == "marker":
                    return got
                got.append((self.own.get(n.channel, "fleet"), json.loads(n.payload)))
        pytest.fail(f"the marker never arrived; got {got}")


def test_a_new_job_wakes_one_daemon_on_its_own_channel_and_each_gets_a_share(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    own = {name: register(conn, schema, name) for name in ("w1", "w2", "w3")}
    assert all(own.values()) and len(set(own.values())) == 3
    assert all(len(c.encode()) <= 63 for c in own.values() if c)  # a channel name's limit
    ears = Ears(test_db_dsn, schema, {n: c for n, c in own.items() if c})
    try:
        jobs = [client.enqueue(conn, "h", schema=schema) for _ in range(30)]
        got = ears.received(conn)
    finally:
        ears.conn.close()
    assert [p["id"] for _, p in got] == jobs  # one wake-up per job, none twice
    assert all(who != "fleet" for who, _ in got), got  # the fleet's channel heard none
    assert got[0][1] == {
        "q": "default", "h": "h", "id": jobs[0], "n": 1, "skip": 0, "next": 1, "hops": 0
    }  # fmt: skip
    shares = {name: sum(1 for who, _ in got if who == name) for name in own}
    assert min(shares.values()) >= 3, shares  # rendezvous hashing: a share each


def test_a_batch_wakes_as_many_daemons_as_hold_it_and_a_forward_the_next_ones(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    own = {name: register(conn, schema, name, slots=2) for name in ("w1", "w2", "w3", "w4")}
    ears = Ears(test_db_dsn, schema, {n: c for n, c in own.items() if c})
    try:
        client.enqueue_many(conn, [client.JobSpec("h") for _ in range(3)], schema=schema)
        first = ears.received(conn)
        assert len(first) == 2 and {p["next"] for _, p in first} == {2}  # 2 slots each
        group = {who for who, _ in first}
        body = first[0][1]
        # a daemon of the group that cannot take it hands it on: the next two daemons
        # (the function is the daemon role's; the test's session is the schema's owner)
        conn.execute(
            sql.SQL("SELECT {}.workers_wake(%s, %s, %s, %s, %s, %s)").format(
                sql.Identifier(schema)
            ),
            ("default", "h", body["id"], 3, 2, 1),
        )
        handed_on = ears.received(conn)
        assert {who for who, _ in handed_on} == set(own) - group
        assert {(p["skip"], p["next"], p["hops"]) for _, p in handed_on} == {(2, 4, 1)}
        # past the last daemon: nobody, not the fleet (the last ones keep it)
        conn.execute(
            sql.SQL("SELECT {}.workers_wake(%s, %s, %s, %s, %s, %s)").format(
                sql.Identifier(schema)
            ),
            ("default", "h", body["id"], 3, 4, 2),
        )
        assert ears.received(conn) == []
    finally:
        ears.conn.close()


def test_only_daemons_that_listen_serve_and_keep_to_their_heartbeat_are_aimed_at(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    """A daemon without a channel of its own (older, or its LISTEN is down) gets its share
    through the fleet's channel, in the payload of before schema 40; a draining, a silent
    and another handler's daemon get none; with no daemon at all, the fleet's channel."""
    ears = Ears(test_db_dsn, schema, {})
    try:
        client.enqueue(conn, "h", schema=schema)
        [(who, body)] = ears.received(conn)
        assert who == "fleet" and set(body) == {"q", "h", "id", "n"}  # nobody registered
    finally:
        ears.conn.close()
    own = {
        "listening": register(conn, schema, "listening"),
        "draining": register(conn, schema, "draining"),
        "silent": register(conn, schema, "silent"),
        "other": register(conn, schema, "other", handlers=("other",)),
    }
    assert register(conn, schema, "older", listening=False) is None
    fleet.request_drain(conn, schema, drain=True, worker_id="draining")
    conn.execute(
        sql.SQL(
            "UPDATE {}.workers SET heartbeat_at = now() - 3 * heartbeat_interval"
            " WHERE id = 'silent'"
        ).format(sql.Identifier(schema))
    )
    ears = Ears(test_db_dsn, schema, {n: c for n, c in own.items() if c})
    try:
        for _ in range(20):
            client.enqueue(conn, "h", schema=schema)
        got = [(who, body) for who, body in ears.received(conn) if "id" in body]
    finally:
        ears.conn.close()
    assert len(got) == 20
    assert {who for who, _ in got} == {"listening", "fleet"}, got
    assert all(set(body) == {"q", "h", "id", "n"} for who, body in got if who == "fleet")


def test_the_registry_is_not_the_enqueuers_and_aiming_is_the_daemons(
    roles: dict[str, str], schema: str, conn: psycopg.Connection, test_db_dsn: str
) -> None:
    """The trigger reads the registry for whatever role inserted the jobs (SECURITY
    DEFINER); workers_wake and the channel flag are the daemon role's only."""
    channel = register(conn, schema, "w1")
    assert channel is not None
    ears = Ears(test_db_dsn, schema, {"w1": channel})
    try:
        with psycopg.connect(roles[f"{schema}_enqueuer"], autocommit=True) as c:
            job_id = client.enqueue(c, "h", schema=schema)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(
                    sql.SQL("SELECT {}.workers_wake('default', 'h', 1, 1, 0, 0)").format(
                        sql.Identifier(schema)
                    )
                )
        assert ears.received(conn) == [("w1", {
            "q": "default", "h": "h", "id": job_id, "n": 1, "skip": 0, "next": 1, "hops": 0
        })]  # fmt: skip
    finally:
        ears.conn.close()
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        c.execute(
            sql.SQL("SELECT {}.workers_wake('default', 'h', 1, 1, 0, 0)").format(
                sql.Identifier(schema)
            )
        )
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            c.execute(
                sql.SQL("SELECT {}.workers_wake('default', 'h', 1, 0, 0, 0)").format(
                    sql.Identifier(schema)
                )
            )
        # another daemon's row: the secret names the row
        assert not registry.wake_channel_set(
            c, "w1", False, schema, secret="not-its-secret-" + "y" * 32
        )
