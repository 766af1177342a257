"""Registry statements: a drain requested through the database binds the claim at once,
and a daemon that re-registers (after being marked gone) stays drained."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import leasing
import psycopg
import pytest
from pruning import prune
from psycopg import sql

from pgworkerd import client
from pgworkerd.queue import fleet, lease, registry

# a daemon's registry secret (schema 24), the same for every row of these tests
SECRET = "test-registry-secret-" + "x" * 32

PGWORKERD = Path(sys.executable).with_name("pgworkerd")

INFO = registry.WorkerInfo(
    id="host:1:abc", host="host", pid=1, version="t", queues=["default"], handlers=["h"], slots=4
)
CAPACITY = {"h": lease.HandlerCapacity(lease_seconds=30, free=4)}


def test_drained_worker_claims_nothing(conn: psycopg.Connection, schema: str) -> None:
    registry.register(conn, INFO, "running", schema, secret=SECRET)
    client.enqueue_many(conn, [client.JobSpec("h") for _ in range(3)], schema=schema)
    fleet.request_drain(conn, schema, drain=True, worker_id=INFO.id)
    assert (
        leasing.claim(conn, INFO.id, queues=["default"], handlers=CAPACITY, limit=4, schema=schema)
        == []
    )
    # another worker is not affected
    assert (
        len(
            leasing.claim(
                conn, "other", queues=["default"], handlers=CAPACITY, limit=1, schema=schema
            )
        )
        == 1
    )
    fleet.request_drain(conn, schema, drain=False, worker_id=INFO.id)
    assert (
        len(
            leasing.claim(
                conn, INFO.id, queues=["default"], handlers=CAPACITY, limit=4, schema=schema
            )
        )
        == 2
    )


def test_drain_survives_re_registration(conn: psycopg.Connection, schema: str) -> None:
    registry.register(conn, INFO, "running", schema, secret=SECRET)
    fleet.request_drain(conn, schema, drain=True, worker_id=INFO.id)
    conn.execute(f"UPDATE {schema}.workers SET heartbeat_at = now() - interval '1 hour'")
    assert [w[0] for w in registry.mark_stale(conn, 60, schema)] == [INFO.id]
    assert (
        registry.heartbeat(conn, INFO, "running", [], schema, secret=SECRET) is None
    )  # gone: re-register
    registry.register(conn, INFO, "running", schema, secret=SECRET)
    request = registry.heartbeat(conn, INFO, "running", [], schema, secret=SECRET)
    assert request == registry.DrainRequest(drain=True)  # still drained


# -- maintenance: stale marking by one daemon at a time, an index, pruning -----------------


def add_workers(conn: psycopg.Connection, schema: str, prefix: str, n: int, **row: str) -> None:
    """n registry rows; `row` gives SQL expressions for state, heartbeat_at, stopped_at."""
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.workers (id, host, pid, version, slots, state, heartbeat_at,"
            " stopped_at) SELECT %s || g, 'h', g, 'v', 4, {}, {}, {} FROM generate_series(1, %s) g"
        ).format(
            sql.Identifier(schema),
            sql.SQL(row.get("state", "'running'")),
            sql.SQL(row.get("heartbeat_at", "now()")),
            sql.SQL(row.get("stopped_at", "NULL")),
        ),
        [prefix, n],
    )


def test_mark_stale_is_done_by_one_caller_at_a_time(
    conn: psycopg.Connection, test_db_dsn: str, schema: str
) -> None:
    add_workers(conn, schema, "silent-", 2, heartbeat_at="now() - interval '1 hour'")
    with psycopg.connect(test_db_dsn) as other, other.transaction():
        # another daemon in the middle of its own mark_stale
        other.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            [f"pgworkerd.registry.mark_stale:{schema}"],
        )
        assert registry.mark_stale(conn, 60, schema) == []
    assert sorted(w[0] for w in registry.mark_stale(conn, 60, schema)) == ["silent-1", "silent-2"]
    assert registry.mark_stale(conn, 60, schema) == []


def test_mark_stale_reads_the_live_daemons_through_an_index(
    conn: psycopg.Connection, schema: str
) -> None:
    add_workers(conn, schema, "gone-", 20_000, state="'gone'", stopped_at="now()")
    add_workers(conn, schema, "live-", 3)
    conn.execute(sql.SQL("ANALYZE {}.workers").format(sql.Identifier(schema)))
    # the statement runs inside worker_mark_stale_v2 (schema 24): the index's own
    # statistics tell whether the call read it
    scans = sql.SQL(
        "SELECT pg_stat_clear_snapshot(), (SELECT idx_scan FROM pg_stat_user_indexes"
        " WHERE schemaname = %s AND indexrelname = 'workers_live_idx')"
    )

    def index_scans() -> int:
        conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(scans, [schema]).fetchone()
        assert row is not None
        return int(row[1])

    before = index_scans()
    assert registry.mark_stale(conn, 60, schema) == []
    deadline = time.monotonic() + 30
    while index_scans() == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert index_scans() > before


def test_prune_gone_deletes_only_daemons_gone_longer_than_the_retention(
    conn: psycopg.Connection, schema: str
) -> None:
    add_workers(conn, schema, "old-", 3, state="'gone'", stopped_at="now() - interval '8 days'")
    add_workers(conn, schema, "recent-", 2, state="'gone'", stopped_at="now() - interval '1 day'")
    add_workers(conn, schema, "silent-", 1, heartbeat_at="now() - interval '30 days'")
    week = 7 * 86400.0
    assert prune(conn, gone_daemons_older_than=week, schema=schema).daemons == 3
    assert prune(conn, gone_daemons_older_than=week, schema=schema).daemons == 0
    left = conn.execute(
        sql.SQL("SELECT id FROM {}.workers ORDER BY id").format(sql.Identifier(schema))
    ).fetchall()
    # a silent daemon not yet marked gone is never pruned: it is marked first
    assert [r[0] for r in left] == ["recent-1", "recent-2", "silent-1"]
    assert prune(conn, gone_daemons_older_than=3600.0, schema=schema).daemons == 2


def test_cli_prune_deletes_gone_daemons_after_their_retention(
    conn: psycopg.Connection, test_db_dsn: str, schema: str
) -> None:
    add_workers(conn, schema, "old-", 2, state="'gone'", stopped_at="now() - interval '8 days'")
    add_workers(conn, schema, "recent-", 1, state="'gone'", stopped_at="now() - interval '1 day'")
    command = [str(PGWORKERD), "--dsn", test_db_dsn, "--schema", schema, "prune"]
    proc = subprocess.run([*command, "--older-than", "30d"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "deleted 0 job(s)\ndeleted 2 gone daemon(s) from the registry\n"
    proc = subprocess.run(
        [*command, "--older-than", "30d", "--gone-daemons-older-than", "1h"],
        capture_output=True,
        text=True,
    )
    assert proc.stdout == "deleted 0 job(s)\ndeleted 1 gone daemon(s) from the registry\n"


def test_a_heartbeat_in_the_future_makes_no_peer(conn: psycopg.Connection, schema: str) -> None:
    """Daemons write now(): a row whose heartbeat lies ahead was planted by hand (a role
    with the daemon's rights), and would never go stale; it is no peer to wake."""
    live = registry.WorkerInfo("h:1:a", "h", 1, "t", ["default"], ["h"], 2)
    registry.register(conn, live, "running", schema, secret=SECRET)
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (id, host, pid, version, slots, state, heartbeat_at)"
            " VALUES ('fake:1:b', 'h', 2, 't', 1000000, 'running', now() + interval '1 day')"
        ).format(sql.Identifier(schema, "workers"))
    )
    assert [p[0] for p in registry.peers(conn, 60.0, schema)] == ["h:1:a"]


def test_a_registry_row_is_bounded_and_a_bad_one_changes_nothing(
    conn: psycopg.Connection, schema: str
) -> None:
    """Schema 24: what a daemon writes into its row is checked (every peer reads it):
    names, how many queues, handlers and in-flight jobs, the settings' size."""
    bad = [
        registry.WorkerInfo("w:1:a", "", 1, "t", ["default"], ["h"], 1),
        registry.WorkerInfo("w:1:a", "h", 1, "t", [f"q{n}" for n in range(10_001)], ["h"], 1),
        registry.WorkerInfo("w:1:a", "h", 1, "t", ["default"], ["x" * 256], 1),
        registry.WorkerInfo("w:1:a", "h", 1, "t", ["default"], ["h"], 1, {"h": {"x": "y" * 2**21}}),
    ]
    for info in bad:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="pgworkerd: a daemon"):
            registry.register(conn, info, "running", schema, secret=SECRET)
    assert registry.peers(conn, 60.0, schema) == []
    good = registry.WorkerInfo("w:1:a", "h", 1, "t", ["default"], ["h"], 1)
    registry.register(conn, good, "running", schema, secret=SECRET)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="10,000"):
        registry.heartbeat(conn, good, "running", list(range(10_001)), schema, secret=SECRET)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="cannot mark a daemon gone"):
        registry.heartbeat(conn, good, "gone", [], schema, secret=SECRET)
    assert registry.peers(conn, 60.0, schema) == [("w:1:a", ["default"], ["h"], 1)]
