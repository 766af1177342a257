"""Silent daemons (migration 0021) from the registry rows alone: one definition
(daemon_silent: a heartbeat older than twice the interval the daemon recorded) behind
`explain`, the read layer (`status`, `show`, the dashboard) and the metric's count.

The daemons here are registry rows written as a daemon writes them (registry.register,
lease.claim); tests/acceptance/test_silent.py kills and freezes real daemons."""

from __future__ import annotations

from typing import Any

import leasing
import psycopg
import pytest

from pgworkerd import client
from pgworkerd.queue import explain, lease, registry, views

# a daemon's registry secret (schema 24), the same for every row of these tests
SECRET = "test-registry-secret-" + "x" * 32

SETTINGS = {"queues": None, "slots": None, "max_running": None, "max_running_per_key": None}


def live_daemon(
    conn: psycopg.Connection, schema: str, worker_id: str, *, interval: float = 5.0
) -> registry.WorkerInfo:
    info = registry.WorkerInfo(worker_id, "host-a", 1, "t", ["default"], ["h"], 4, {"h": SETTINGS})
    registry.register(conn, info, "running", schema, interval, secret=SECRET)
    return info


def running_job(conn: psycopg.Connection, schema: str, worker_id: str, lease_s: float) -> int:
    job = client.enqueue(conn, "h", schema=schema)
    [claimed] = leasing.claim(
        conn,
        worker_id,
        queues=["default"],
        handlers={"h": lease.HandlerCapacity(lease_s, 1)},
        limit=1,
        schema=schema,
    )
    assert claimed.id == job
    # the daemon's next heartbeat lists it (what the metric's read goes by)
    conn.execute(
        f"UPDATE {schema}.workers SET in_flight = in_flight || %s::bigint WHERE id = %s",
        (job, worker_id),
    )
    return job


def age_heartbeat(conn: psycopg.Connection, schema: str, worker_id: str, seconds: float) -> None:
    conn.execute(
        f"UPDATE {schema}.workers SET heartbeat_at = now() - make_interval(secs => %s)"
        " WHERE id = %s",
        (seconds, worker_id),
    )


def reasons(conn: psycopg.Connection, schema: str, job_id: int) -> dict[str, dict[str, Any]]:
    found = explain.explain(conn, schema, job_id)
    assert found is not None
    return {r["code"]: r for r in found["reasons"]}


def test_a_running_job_of_a_silent_daemon_is_flagged_everywhere_and_left_to_its_lease(
    conn: psycopg.Connection, schema: str
) -> None:
    live_daemon(conn, schema, "host-a:1:x", interval=5.0)
    job = running_job(conn, schema, "host-a:1:x", 600)
    assert list(reasons(conn, schema, job)) == ["running"]
    [row] = views.running_jobs(conn, schema)
    assert row["daemon_silent"] is False
    assert views.silent_jobs(conn, schema) == {"jobs": 0, "daemons": 0}

    age_heartbeat(conn, schema, "host-a:1:x", 11)  # past 2 x 5 s
    why = reasons(conn, schema, job)
    assert list(why) == ["running", "daemon_silent"]
    facts = why["daemon_silent"]["facts"]
    assert facts["worker"] == "host-a:1:x" and facts["host"] == "host-a"
    assert 11 <= facts["heartbeat_age_seconds"] < 60
    assert facts["heartbeat_interval_seconds"] == 5.0
    assert 500 < facts["lease_left_seconds"] <= 600
    assert facts["locked_until"] == why["running"]["facts"]["locked_until"]
    message = why["daemon_silent"]["message"]
    assert "not taken from it early" in message and "cut off" in message

    [row] = views.running_jobs(conn, schema)
    assert row["daemon_silent"] is True and row["daemon_host"] == "host-a"
    assert row["daemon_heartbeat_age_seconds"] >= 11 and row["locked_until"] is not None
    [daemon] = views.daemons(conn, schema)
    assert daemon["silent"] is True and daemon["heartbeat_interval_seconds"] == 5.0
    shown = views.job(conn, schema, job)
    assert shown is not None and shown["daemon"]["silent"] is True
    assert shown["daemon"]["id"] == "host-a:1:x" and shown["daemon"]["lease_left_seconds"] > 500
    assert views.silent_jobs(conn, schema) == {"jobs": 1, "daemons": 1}
    # nothing ends the lease: the job is still the silent daemon's
    assert views.job(conn, schema, job)["status"] == "running"  # type: ignore[index]
    assert leasing.claim(
        conn, "host-b:2:y", queues=["default"], handlers={"h": lease.HandlerCapacity(60, 1)},
        limit=1, schema=schema,
    ) == []  # fmt: skip

    # a heartbeat and it is live again
    registry.heartbeat(
        conn, live_daemon(conn, schema, "host-a:1:x"), "running", [job], schema, 5.0, secret=SECRET
    )
    assert list(reasons(conn, schema, job)) == ["running"]
    assert views.silent_jobs(conn, schema) == {"jobs": 0, "daemons": 0}


def test_silence_is_measured_against_the_interval_each_daemon_recorded(
    conn: psycopg.Connection, schema: str
) -> None:
    live_daemon(conn, schema, "slow:1:x", interval=30.0)
    live_daemon(conn, schema, "fast:1:y", interval=2.0)
    slow = running_job(conn, schema, "slow:1:x", 600)
    fast = running_job(conn, schema, "fast:1:y", 600)
    for worker in ("slow:1:x", "fast:1:y"):
        age_heartbeat(conn, schema, worker, 8)
    assert "daemon_silent" not in reasons(conn, schema, slow)  # 8 s < 2 x 30 s
    assert "daemon_silent" in reasons(conn, schema, fast)  # 8 s > 2 x 2 s
    assert {r["id"]: r["daemon_silent"] for r in views.running_jobs(conn, schema)} == {
        slow: False,
        fast: True,
    }
    assert views.silent_jobs(conn, schema) == {"jobs": 1, "daemons": 1}


def test_an_older_daemon_without_an_interval_gets_its_longest_gap(
    conn: psycopg.Connection, schema: str
) -> None:
    """Code before schema 21 writes no interval: the default is the longest gap it leaves
    between heartbeats (10 s idle), so it is not flagged before 20 s of silence."""
    conn.execute(
        f"INSERT INTO {schema}.workers (id, host, pid, version, queues, handlers, slots, state)"
        " VALUES ('old:1:x', 'old', 1, '0.2.0', '{default}', '{h}', 2, 'running')"
    )
    job = running_job(conn, schema, "old:1:x", 600)
    age_heartbeat(conn, schema, "old:1:x", 15)
    assert "daemon_silent" not in reasons(conn, schema, job)
    age_heartbeat(conn, schema, "old:1:x", 21)
    assert reasons(conn, schema, job)["daemon_silent"]["facts"]["heartbeat_interval_seconds"] == 10


def test_a_holder_without_a_registry_row_promises_nothing_and_is_not_flagged(
    conn: psycopg.Connection, schema: str
) -> None:
    """A worker in another language claims through SQL and has no registry row."""
    job = running_job(conn, schema, "sql-worker-1", 600)
    assert list(reasons(conn, schema, job)) == ["running"]
    [row] = views.running_jobs(conn, schema)
    assert row["daemon_silent"] is False and row["daemon_host"] is None
    assert views.job(conn, schema, job)["daemon"] is None  # type: ignore[index]
    assert views.silent_jobs(conn, schema) == {"jobs": 0, "daemons": 0}


def test_a_silent_daemon_whose_lease_ran_out_says_both(
    conn: psycopg.Connection, schema: str
) -> None:
    live_daemon(conn, schema, "host-a:1:x")
    job = running_job(conn, schema, "host-a:1:x", 1)
    conn.execute(
        f"UPDATE {schema}.jobs SET locked_until = now() - interval '5 seconds' WHERE id = %s",
        (job,),
    )
    age_heartbeat(conn, schema, "host-a:1:x", 30)
    why = reasons(conn, schema, job)
    assert list(why) == ["running", "daemon_silent", "lease_expired"]
    assert why["daemon_silent"]["facts"]["lease_left_seconds"] < 0
    assert "lease ended at" in why["daemon_silent"]["message"]


def test_pending_jobs_use_the_same_definition(conn: psycopg.Connection, schema: str) -> None:
    """daemons_silent (pending) and daemon_silent (running) cannot disagree."""
    live_daemon(conn, schema, "host-a:1:x", interval=5.0)
    job = client.enqueue(conn, "h", schema=schema)
    age_heartbeat(conn, schema, "host-a:1:x", 9)
    assert list(reasons(conn, schema, job)) == ["claimable"]
    age_heartbeat(conn, schema, "host-a:1:x", 11)
    why = reasons(conn, schema, job)
    assert list(why) == ["daemons_silent"]
    assert why["daemons_silent"]["facts"]["daemons"][0]["heartbeat_interval_seconds"] == 5.0


@pytest.mark.parametrize("interval", [0.0, 0.5, -1.0, 7200.0, float("inf"), float("nan")])
def test_the_registry_refuses_an_interval_that_would_hide_or_fake_silence(
    conn: psycopg.Connection, schema: str, interval: float
) -> None:
    info = registry.WorkerInfo("bad:1:x", "host-a", 1, "t", ["default"], ["h"], 4, {})
    # out of bounds: the CHECK; not a finite number: make_interval itself
    with pytest.raises((psycopg.errors.CheckViolation, psycopg.errors.DataError)):
        registry.register(conn, info, "running", schema, interval, secret=SECRET)
    assert conn.execute(f"SELECT count(*) FROM {schema}.workers").fetchone() == (0,)


def test_the_metric_counts_only_jobs_still_held_by_the_silent_daemon(
    conn: psycopg.Connection, schema: str
) -> None:
    """A silent daemon's last heartbeat still lists a job another daemon has taken since
    (its lease ran out): that one is no longer the silent daemon's."""
    live_daemon(conn, schema, "host-a:1:x")
    kept = running_job(conn, schema, "host-a:1:x", 600)
    taken = running_job(conn, schema, "host-a:1:x", 600)
    conn.execute(f"UPDATE {schema}.jobs SET locked_by = 'host-b:2:y' WHERE id = %s", (taken,))
    age_heartbeat(conn, schema, "host-a:1:x", 30)
    assert views.silent_jobs(conn, schema) == {"jobs": 1, "daemons": 1}
    assert {r["id"]: r["daemon_silent"] for r in views.running_jobs(conn, schema)} == {
        kept: True,
        taken: False,
    }
