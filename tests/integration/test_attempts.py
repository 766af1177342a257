"""Attempt history (migration 0012): every way a running attempt ends leaves one row, by
the daemon's statements and by SQL workers alike; a rescue by another claim says whose
lease expired; the daemon's figures land on their own attempt only; prune removes the
history with its job."""

from __future__ import annotations

import logging
from typing import Any

import leasing
import psycopg
import pytest
from pruning import prune

from pgworkerd import client
from pgworkerd.queue import admin, attempts, lease, registry
from pgworkerd.queue.queries import render

# a daemon's registry secret (schema 24), the same for every row of these tests
SECRET = "test-registry-secret-" + "x" * 32

SERVED = {"h": lease.HandlerCapacity(lease_seconds=60, free=10)}


def claim(conn: psycopg.Connection, schema: str, worker: str = "w1", **kw: Any) -> lease.ClaimedJob:
    served = {"h": lease.HandlerCapacity(**{"lease_seconds": 60, "free": 10, **kw})}
    [job] = leasing.claim(conn, worker, queues=["default"], handlers=served, limit=1, schema=schema)
    return job


def history(conn: psycopg.Connection, schema: str, job_id: int) -> list[dict[str, Any]]:
    return attempts.history(conn, job_id, schema=schema)


def sql(conn: psycopg.Connection, schema: str, text: str, *params: Any) -> list[tuple[Any, ...]]:
    cur = conn.execute(render(text, schema), params)  # type: ignore[arg-type]
    return cur.fetchall() if cur.description else []


def expire(conn: psycopg.Connection, schema: str) -> None:
    """Every lease runs out now (as a dead daemon's would)."""
    sql(conn, schema, "UPDATE @schema@.jobs SET locked_until = now() - interval '1s'")


def test_each_ending_of_the_daemons_statements_leaves_one_row(
    conn: psycopg.Connection, schema: str
) -> None:
    job_id = client.enqueue(conn, "h", max_attempts=3, schema=schema)
    j = claim(conn, schema)
    assert history(conn, schema, job_id) == []  # a claim of a pending job records nothing
    lease.renew(conn, "w1", [lease.Lease(j.id, j.token, 60)], schema=schema)
    assert history(conn, schema, job_id) == []  # nor does a renewal
    assert lease.release(conn, "w1", j.id, j.token, schema=schema) == "pending"
    j = claim(conn, schema)
    assert lease.fail(conn, "w1", j.id, j.token, "boom\nTraceback: here", schema=schema)
    sql(conn, schema, "UPDATE @schema@.jobs SET run_at = now() WHERE id = %s", job_id)
    j = claim(conn, schema)
    assert leasing.complete(conn, "w1", j.id, j.token, {"r": 1}, schema=schema)
    rows = history(conn, schema, job_id)
    assert [(r["attempt"], r["outcome"], r["error"]) for r in rows] == [
        (1, "released", None),
        (1, "failed", "boom\nTraceback: here"),
        (2, "completed", None),
    ]
    assert all(r["worker"] == "w1" and r["wall_seconds"] >= 0 for r in rows)
    assert all(r["cpu_user_seconds"] is None for r in rows)  # nobody measured them


def test_an_sql_workers_finishes_are_recorded_too(conn: psycopg.Connection, schema: str) -> None:
    ids = [client.enqueue(conn, "h", {"n": n}, max_attempts=1, schema=schema) for n in range(4)]
    jobs = {
        j.id: j
        for j in leasing.claim(
            conn, "sqlw", queues=["default"], handlers=SERVED, limit=4, schema=schema
        )
    }
    a, b, c, d = (jobs[i] for i in ids)
    sql(conn, schema, "SELECT @schema@.complete_job(%s, 'sqlw', %s, NULL)", a.id, a.token)
    sql(conn, schema, "SELECT * FROM @schema@.fail_job(%s, 'sqlw', %s, 'it broke')", b.id, b.token)
    sql(conn, schema, "SELECT * FROM @schema@.snooze_job(%s, 'sqlw', %s, 60)", c.id, c.token)
    sql(
        conn,
        schema,
        "SELECT @schema@.give_up_job(%s, 'sqlw', %s, 'no such customer')",
        d.id,
        d.token,
    )
    got = {i: [(r["outcome"], r["error"]) for r in history(conn, schema, i)] for i in ids}
    assert got == {
        a.id: [("completed", None)],
        b.id: [("dead", "it broke")],
        c.id: [("snoozed", None)],
        d.id: [("dead", "no such customer")],
    }


@pytest.mark.parametrize("attempts_left", [True, False], ids=["rescued", "buried"])
def test_a_lease_that_ran_out_says_whose_it_was(
    conn: psycopg.Connection, schema: str, attempts_left: bool
) -> None:
    info = registry.WorkerInfo("host-a:1:x", "host-a", 1, "test", ["default"], ["h"], 2)
    registry.register(conn, info, "running", schema, secret=SECRET)
    job_id = client.enqueue(conn, "h", max_attempts=2 if attempts_left else 1, schema=schema)
    claim(conn, schema, worker=info.id)
    expire(conn, schema)
    rescued = leasing.claim(conn, "w2", queues=["default"], handlers=SERVED, limit=1, schema=schema)
    assert [j.id for j in rescued] == ([job_id] if attempts_left else [])
    [row] = admin.list_jobs(conn, schema=schema)
    expected = "lease expired: daemon host-a:1:x on host-a stopped renewing (lease of host-a:1:x"
    assert row["last_error"].startswith(expected)
    [attempt] = history(conn, schema, job_id)
    assert (attempt["attempt"], attempt["outcome"], attempt["host"]) == (
        1,
        "lease expired",
        "host-a",
    )
    assert attempt["error"] == row["last_error"]


def test_a_lease_of_an_unregistered_worker_names_the_worker_only(
    conn: psycopg.Connection, schema: str
) -> None:
    client.enqueue(conn, "h", max_attempts=2, schema=schema)
    claim(conn, schema, worker="sqlw")
    expire(conn, schema)
    claim(conn, schema, worker="w2")
    [row] = admin.list_jobs(conn, schema=schema)
    assert row["last_error"].startswith("lease expired: daemon sqlw stopped renewing (")


def test_the_daemons_figures_land_on_their_own_attempt_only(
    conn: psycopg.Connection, schema: str
) -> None:
    job_id = client.enqueue(conn, "h", max_attempts=3, schema=schema)
    first = claim(conn, schema)
    lease.fail(conn, "w1", first.id, first.token, "boom", schema=schema)
    sql(conn, schema, "UPDATE @schema@.jobs SET run_at = now() WHERE id = %s", job_id)
    second = claim(conn, schema)
    leasing.complete(conn, "w1", second.id, second.token, schema=schema)
    usage = attempts.Usage(job_id, second.token, 1.5, 0.9, 0.1, 200 << 20)
    assert attempts.account(conn, "w1", [usage], schema=schema) == {job_id}
    # another worker's figures, or a token no attempt had, change nothing
    assert attempts.account(conn, "w9", [usage], schema=schema) == set()
    stray = attempts.Usage(job_id, second.token + 7, 9.0, 9.0, 9.0, 1)
    assert attempts.account(conn, "w1", [stray], schema=schema) == set()
    one, two = history(conn, schema, job_id)
    assert one["cpu_user_seconds"] is None and one["peak_memory"] is None
    assert (two["wall_seconds"], two["cpu_user_seconds"], two["cpu_system_seconds"]) == (
        1.5,
        0.9,
        0.1,
    )
    assert two["peak_memory"] == 200 << 20


def test_prune_removes_the_history_with_its_job(conn: psycopg.Connection, schema: str) -> None:
    kept = client.enqueue(conn, "h", schema=schema)
    pruned = client.enqueue(conn, "h", schema=schema)
    for _ in range(2):
        j = claim(conn, schema)
        leasing.complete(conn, "w1", j.id, j.token, schema=schema)
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET finished_at = now() - interval '2 days' WHERE id = %s",
        pruned,
    )
    count = "SELECT job_id, count(*) FROM @schema@.attempts GROUP BY job_id ORDER BY job_id"
    assert sql(conn, schema, count) == [(kept, 1), (pruned, 1)]
    assert prune(conn, jobs_older_than=86400.0, schema=schema).jobs == 1
    assert sql(conn, schema, count) == [(kept, 1)]


def test_truncating_the_jobs_truncates_the_history(conn: psycopg.Connection, schema: str) -> None:
    client.enqueue(conn, "h", schema=schema)
    j = claim(conn, schema)
    leasing.complete(conn, "w1", j.id, j.token, schema=schema)
    assert sql(conn, schema, "SELECT count(*) FROM @schema@.attempts") == [(1,)]
    sql(conn, schema, "TRUNCATE @schema@.jobs")
    assert sql(conn, schema, "SELECT count(*) FROM @schema@.attempts") == [(0,)]


def test_the_daemons_write_of_figures_drops_a_refused_statement_raises_a_lost_connection(
    conn: psycopg.Connection, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Accounting never costs an outcome: the database refusing the statement (here: no
    such function in that schema, as for a role without the grant) is logged and dropped,
    the connection stays usable; a lost connection is the caller's to handle."""
    usage = attempts.Usage(1, 1, 1.0, None, None, None)
    with caplog.at_level(logging.WARNING, logger="pgworkerd"):
        assert attempts.record_usage(conn, "w1", [usage], schema=f"{schema}_gone") is True
    assert "attempt figures not recorded" in caplog.text
    assert conn.execute("SELECT 1").fetchone() == (1,)
    conn.close()
    with pytest.raises(psycopg.OperationalError):
        attempts.record_usage(conn, "w1", [usage], schema=schema)
