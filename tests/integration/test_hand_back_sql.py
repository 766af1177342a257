"""The hand-back drain in SQL (migration 0017): drain_request's checks and how requests
combine, what the heartbeat hands the daemon, resume, and a release racing a completion
under the lease token."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import leasing
import psycopg
import pytest
from psycopg.rows import dict_row

from pgworkerd import client
from pgworkerd.queue import fleet, lease, registry

# a daemon's registry secret (schema 24), the same for every row of these tests
SECRET = "test-registry-secret-" + "x" * 32

INFO = registry.WorkerInfo(
    id="host:1:abc", host="host", pid=1, version="t", queues=["default"], handlers=["h"], slots=4
)
CAPACITY = {"h": lease.HandlerCapacity(lease_seconds=30, free=4)}


def row(conn: psycopg.Connection, schema: str) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(f"SELECT * FROM {schema}.workers WHERE id = %s", (INFO.id,)).fetchone()
    assert found is not None
    return found


def hand_back(conn: psycopg.Connection, schema: str, **kw: Any) -> list[dict[str, Any]]:
    return fleet.request_hand_back(conn, schema, worker_id=INFO.id, **kw)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("NULL, NULL, true, interval '-1 second'", "the grace must be from 0 to 1 day"),
        ("NULL, NULL, true, interval '10 years'", "the grace must be from 0 to 1 day"),
        ("NULL, NULL, true, interval '1 day 1 second'", "the grace must be from 0 to 1 day"),
        ("'x', 'host', true", "give a daemon id or a host, not both"),
        ("NULL, NULL, NULL", "hand_back must be true or false"),
        ("NULL, NULL, false, interval '5 seconds'", "apply to a hand-back only"),
        ("NULL, NULL, false, NULL, ARRAY['q']", "apply to a hand-back only"),
        ("NULL, NULL, true, NULL, ARRAY[]::text[]", "queues must be 1 to 100"),
        ("NULL, NULL, true, NULL, ARRAY[NULL]::text[]", "queues must be 1 to 100"),
        ("NULL, NULL, true, NULL, ARRAY[E'a\\x1bb']", "queues must be 1 to 100"),
        ("NULL, NULL, true, NULL, ARRAY[repeat('q', 129)]", "queues must be 1 to 100"),
        ("NULL, NULL, true, NULL, array_fill('q'::text, ARRAY[101])", "queues must be 1 to 100"),
        ("NULL, NULL, true, NULL, ARRAY[['a'], ['b']]", "queues must be 1 to 100"),
        ("NULL, NULL, true, NULL, NULL, ARRAY['']", "handlers must be 1 to 100"),
    ],
)
def test_drain_request_refuses_bad_values_and_changes_nothing(
    conn: psycopg.Connection, schema: str, args: str, message: str
) -> None:
    registry.register(conn, INFO, "running", schema, secret=SECRET)
    before = row(conn, schema)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        conn.execute(f"SELECT * FROM {schema}.drain_request({args})")
    assert row(conn, schema) == before


def test_grace_bounds_are_inclusive(conn: psycopg.Connection, schema: str) -> None:
    registry.register(conn, INFO, "running", schema, secret=SECRET)
    assert hand_back(conn, schema, grace=0.0)
    assert hand_back(conn, schema, grace=86400.0)
    assert row(conn, schema)["hand_back_grace"] == timedelta(0)  # the shorter one is kept


def test_no_live_daemon_no_change(conn: psycopg.Connection, schema: str) -> None:
    registry.register(conn, INFO, "running", schema, secret=SECRET)
    assert fleet.request_hand_back(conn, schema, grace=1.0, worker_id="nobody") == []
    registry.deregister(conn, INFO.id, schema, secret=SECRET)
    assert hand_back(conn, schema, grace=1.0) == []  # gone
    assert row(conn, schema)["hand_back_requested_at"] is None


def test_requests_combine_and_the_heartbeat_hands_them_over(
    conn: psycopg.Connection, schema: str
) -> None:
    registry.register(conn, INFO, "running", schema, secret=SECRET)
    # a plain drain, then a filtered hand-back: the plain drain stays (claim nothing)
    fleet.request_drain(conn, schema, drain=True, worker_id=INFO.id)
    [asked] = hand_back(conn, schema, grace=60.0, queues=["b", "a"])
    assert asked["id"] == INFO.id
    r = row(conn, schema)
    assert r["drain_requested"] is True
    assert r["hand_back_queues"] == ["a", "b"] and r["hand_back_handlers"] is None
    assert r["hand_back_seen_at"] is None
    # a second one: the queues widen, the shorter grace is kept, a handler filter is added
    # where the first had none (NULL: every handler, so it stays NULL)
    hand_back(conn, schema, grace=5.0, queues=["c"], handlers=["h"])
    r = row(conn, schema)
    assert r["hand_back_queues"] == ["a", "b", "c"]
    assert r["hand_back_handlers"] is None
    assert r["hand_back_grace"] == timedelta(seconds=5)
    hand_back(conn, schema, grace=30.0)  # longer: the grace stays; no filter: every queue
    r = row(conn, schema)
    assert r["hand_back_grace"] == timedelta(seconds=5) and r["hand_back_queues"] is None

    request = registry.heartbeat(conn, INFO, "draining", [], schema, secret=SECRET)
    assert request is not None and request.drain is True
    hb = request.hand_back
    assert hb is not None and hb.grace == 5.0 and hb.everything
    assert hb.requested_at == r["hand_back_requested_at"]
    assert row(conn, schema)["hand_back_seen_at"] == r["hand_back_requested_at"]

    # without --grace: NULL (each handler's stop_grace) replaces a given grace
    hand_back(conn, schema, grace=None)
    request = registry.heartbeat(conn, INFO, "draining", [], schema, secret=SECRET)
    assert request is not None and request.hand_back is not None
    assert request.hand_back.grace is None

    # resume lifts both drains
    fleet.request_drain(conn, schema, drain=False, worker_id=INFO.id)
    assert (
        registry.heartbeat(conn, INFO, "running", [], schema, secret=SECRET)
        == registry.DrainRequest()
    )
    r = row(conn, schema)
    assert r["drain_requested"] is False and r["hand_back_grace"] is None


def test_an_unfiltered_hand_back_binds_the_claim_a_filtered_one_does_not(
    conn: psycopg.Connection, schema: str
) -> None:
    registry.register(conn, INFO, "running", schema, secret=SECRET)
    client.enqueue_many(conn, [client.JobSpec("h") for _ in range(2)], schema=schema)
    hand_back(conn, schema, grace=1.0, handlers=["other"])
    assert row(conn, schema)["drain_requested"] is False  # the daemon leaves "other" out
    assert (
        len(
            leasing.claim(
                conn, INFO.id, queues=["default"], handlers=CAPACITY, limit=1, schema=schema
            )
        )
        == 1
    )
    hand_back(conn, schema, grace=1.0)
    assert row(conn, schema)["drain_requested"] is True  # older daemons stop claiming too
    assert (
        leasing.claim(conn, INFO.id, queues=["default"], handlers=CAPACITY, limit=1, schema=schema)
        == []
    )


def test_a_hand_back_wakes_the_daemons_and_a_release_wakes_the_peers(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    registry.register(conn, INFO, "running", schema, secret=SECRET)
    [job_id] = client.enqueue_many(conn, [client.JobSpec("h", queue="q")], schema=schema)
    [claimed] = leasing.claim(
        conn, INFO.id, queues=["q"], handlers=CAPACITY, limit=1, schema=schema
    )
    with psycopg.connect(test_db_dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{schema}.wake"')
        hand_back(conn, schema, grace=1.0)
        lease.release(conn, INFO.id, job_id, claimed.token, checkpoint={"step": 7}, schema=schema)
        payloads = [n.payload for n in listener.notifies(timeout=2.0, stop_after=2)]
    assert payloads[0] == '{"registry": "drain"}'
    assert payloads[1] == f'{{"q" : "q", "h" : "h", "id" : {job_id}, "n" : 1}}'


@pytest.mark.parametrize("first", ["completion", "release"])
def test_a_release_racing_the_completion_one_wins_whole(
    conn: psycopg.Connection, schema: str, first: str
) -> None:
    registry.register(conn, INFO, "running", schema, secret=SECRET)
    [job_id] = client.enqueue_many(conn, [client.JobSpec("h")], schema=schema)
    [claimed] = leasing.claim(
        conn, INFO.id, queues=["default"], handlers=CAPACITY, limit=1, schema=schema
    )
    saved = lease.renew(
        conn,
        INFO.id,
        [lease.Lease(job_id, claimed.token, 30.0, checkpoint={"step": 3})],
        schema=schema,
    )
    assert saved[0].renewed

    def complete() -> bool:
        return leasing.complete(conn, INFO.id, job_id, claimed.token, {"done": 1}, schema=schema)

    def release() -> str | None:
        return lease.release(
            conn, INFO.id, job_id, claimed.token, checkpoint={"step": 4}, schema=schema
        )

    if first == "completion":
        assert complete() is True
        assert release() is None  # fenced: the lease ended with the completion
        expected = ("completed", 1, {"step": 3})
    else:
        assert release() == "pending"
        assert complete() is False  # fenced: the job went back
        expected = ("pending", 0, {"step": 4})
    [got] = conn.execute(
        f"SELECT status::text, attempts, checkpoint FROM {schema}.jobs WHERE id = %s", (job_id,)
    ).fetchall()
    assert got == expected
