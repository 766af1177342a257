"""Registry statements: a drain requested through the database binds the claim at once,
and a daemon that re-registers (after being marked gone) stays drained."""

from __future__ import annotations

import psycopg

from pgworkerd import client
from pgworkerd.queue import fleet, lease, registry

INFO = registry.WorkerInfo(
    id="host:1:abc", host="host", pid=1, version="t", queues=["default"], handlers=["h"], slots=4
)
CAPACITY = {"h": lease.HandlerCapacity(lease_seconds=30, free=4)}


def test_drained_worker_claims_nothing(conn: psycopg.Connection, schema: str) -> None:
    registry.register(conn, INFO, "running", schema)
    client.enqueue_many(conn, [client.JobSpec("h") for _ in range(3)], schema=schema)
    fleet.request_drain(conn, schema, drain=True, worker_id=INFO.id)
    assert (
        lease.claim(conn, INFO.id, queues=["default"], handlers=CAPACITY, limit=4, schema=schema)
        == []
    )
    # another worker is not affected
    assert (
        len(
            lease.claim(
                conn, "other", queues=["default"], handlers=CAPACITY, limit=1, schema=schema
            )
        )
        == 1
    )
    fleet.request_drain(conn, schema, drain=False, worker_id=INFO.id)
    assert (
        len(
            lease.claim(
                conn, INFO.id, queues=["default"], handlers=CAPACITY, limit=4, schema=schema
            )
        )
        == 2
    )


def test_drain_survives_re_registration(conn: psycopg.Connection, schema: str) -> None:
    registry.register(conn, INFO, "running", schema)
    fleet.request_drain(conn, schema, drain=True, worker_id=INFO.id)
    conn.execute(f"UPDATE {schema}.workers SET heartbeat_at = now() - interval '1 hour'")
    assert [w[0] for w in registry.mark_stale(conn, 60, schema)] == [INFO.id]
    assert registry.heartbeat(conn, INFO, "running", [], schema) is None  # gone: re-register
    registry.register(conn, INFO, "running", schema)
    assert registry.heartbeat(conn, INFO, "running", [], schema) is True  # still drained
