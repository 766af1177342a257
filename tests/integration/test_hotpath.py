"""pgworkerd.queue.hotpath: the queue statements sent below psycopg's cursor must behave exactly
as through a cursor — same rows, same errors, same transactions — on a real PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
from psycopg import errors

from pgworkerd import client
from pgworkerd.client import JobSpec
from pgworkerd.queue import hotpath, lease
from pgworkerd.queue.db import connect
from pgworkerd.queue.lease import HandlerCapacity
from pgworkerd.queue.queries import query

SERVED = {"h": HandlerCapacity(lease_seconds=30.0, free=100)}


def claim(conn: psycopg.Connection, schema: str, limit: int = 10) -> list[lease.ClaimedJob]:
    return lease.claim(conn, "w", queues=["default"], handlers=SERVED, limit=limit, schema=schema)


def our_statements(conn: psycopg.Connection) -> list[str]:
    rows = conn.execute(
        "SELECT name FROM pg_prepared_statements WHERE name LIKE '\\_pgworkerd\\_%%'"
    ).fetchall()
    return sorted(r[0] for r in rows)


def test_each_statement_is_prepared_once_per_connection(schema: str, test_db_dsn: str) -> None:
    with connect(test_db_dsn, prepare=True) as conn:
        client.enqueue_many(conn, [JobSpec("h") for _ in range(30)], schema=schema)
        for _ in range(3):
            for job in claim(conn, schema):
                assert lease.complete(conn, "w", job.id, job.token, schema=schema)
        # claim and complete: two statements of ours, each prepared once (enqueue_many is
        # the application's: psycopg prepares it like any statement of the caller's)
        assert len(our_statements(conn)) == 2


def test_an_unprepared_connection_leaves_no_statement_on_the_server(
    schema: str, test_db_dsn: str
) -> None:
    """database.prepared_statements = false (PgBouncer < 1.21 in transaction mode): nothing
    may outlive a statement on the server session."""
    with connect(test_db_dsn, prepare=False) as conn:
        client.enqueue_many(conn, [JobSpec("h") for _ in range(20)], schema=schema)
        for _ in range(2):
            for job in claim(conn, schema):
                assert lease.complete(conn, "w", job.id, job.token, schema=schema)
        assert conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)


def test_statements_dropped_by_the_session_are_prepared_again(
    schema: str, test_db_dsn: str
) -> None:
    with connect(test_db_dsn, prepare=True) as conn:
        client.enqueue_many(conn, [JobSpec("h") for _ in range(3)], schema=schema)
        [first] = claim(conn, schema, limit=1)
        conn.execute("DEALLOCATE ALL")  # e.g. a pooler's server_reset_query
        [second] = claim(conn, schema, limit=1)  # autocommit: prepared again, no error
        assert second.id != first.id
        conn.execute("DISCARD ALL")
        # Inside a transaction the failed attempt aborted it: the caller sees the error ...
        with pytest.raises(errors.InvalidSqlStatementName), conn.transaction():
            claim(conn, schema, limit=1)
        # ... and the next call prepares afresh.
        [third] = claim(conn, schema, limit=1)
        assert third.id not in (first.id, second.id)


def test_a_partly_deallocated_session_recovers(schema: str, test_db_dsn: str) -> None:
    """One statement dropped behind our back, the others still there: each is prepared
    again or found in place, and no name ever stands for two texts."""
    with connect(test_db_dsn, prepare=True) as conn:
        client.enqueue_many(conn, [JobSpec("h") for _ in range(6)], schema=schema)
        for job in claim(conn, schema, limit=2):
            assert lease.complete(conn, "w", job.id, job.token, schema=schema)
        names = our_statements(conn)
        assert len(names) == 2
        for name in names:
            conn.execute(f"DEALLOCATE {name}")
            client.enqueue_many(conn, [JobSpec("h")], schema=schema)
            for job in claim(conn, schema, limit=1):
                assert lease.complete(conn, "w", job.id, job.token, schema=schema)
            assert our_statements(conn) == names


def test_threads_making_their_first_statements_at_once(schema: str, test_db_dsn: str) -> None:
    with connect(test_db_dsn, prepare=True) as conn:
        start = threading.Barrier(4)
        failures: list[BaseException] = []

        def work() -> None:
            try:
                start.wait()
                for _ in range(20):
                    client.enqueue(conn, "h", schema=schema)
                    for job in claim(conn, schema, limit=1):
                        assert lease.complete(conn, "w", job.id, job.token, schema=schema)
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert len(our_statements(conn)) == 2
        for job in claim(conn, schema, limit=100):  # what the threads' claims did not find
            assert lease.complete(conn, "w", job.id, job.token, schema=schema)
        rows = conn.execute(f'SELECT status, count(*) FROM "{schema}".jobs GROUP BY 1')
        assert dict(rows.fetchall()) == {"completed": 80}


def test_server_errors_are_psycopgs_own_exceptions(conn: psycopg.Connection, schema: str) -> None:
    """Bad input that only the server catches: the same exception class and message as a
    cursor raises, so callers' except clauses keep working."""
    params: dict[str, Any] = {
        "handler": "h",
        "payload": "{}",
        "queue": "default",
        "priority": 0,
        "run_at": None,
        "delay": None,
        "max_attempts": 0,
        "dedupe_key": None,
    }
    with pytest.raises(psycopg.Error) as via_cursor:
        conn.execute(query("job_enqueue", schema), params)
    with pytest.raises(psycopg.Error) as direct:
        hotpath.run(conn, "job_enqueue", params, schema=schema)
    assert type(direct.value) is type(via_cursor.value)
    assert direct.value.sqlstate == via_cursor.value.sqlstate
    assert str(direct.value) == str(via_cursor.value)
    assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection is still usable


def test_a_dead_connection_raises_operational_error(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    """The daemon reconnects on OperationalError and a closed connection: both must show."""
    worker = connect(test_db_dsn, prepare=True)
    client.enqueue(worker, "h", schema=schema)
    [job] = claim(worker, schema)
    pid = worker.info.backend_pid
    conn.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(psycopg.OperationalError):
        lease.complete(worker, "w", job.id, job.token, schema=schema)
    assert worker.closed
    with pytest.raises(psycopg.OperationalError):
        lease.complete(worker, "w", job.id, job.token, schema=schema)
    worker.close()


def test_statements_join_the_callers_transaction(conn: psycopg.Connection, schema: str) -> None:
    client.enqueue(conn, "h", schema=schema)
    [job] = claim(conn, schema)
    with pytest.raises(RuntimeError), conn.transaction():
        assert lease.complete(conn, "w", job.id, job.token, schema=schema)
        raise RuntimeError("the caller changes its mind")
    status = conn.execute(f'SELECT status FROM "{schema}".jobs WHERE id = %s', [job.id]).fetchone()
    assert status == ("running",)  # rolled back with the caller's transaction
    assert lease.complete(conn, "w", job.id, job.token, schema=schema)


def test_pipeline_mode_goes_through_a_cursor(conn: psycopg.Connection, schema: str) -> None:
    with conn.pipeline():
        ids = [client.enqueue(conn, "h", {"n": n}, schema=schema) for n in range(5)]
    assert len(set(ids)) == 5
    assert [j.payload["n"] for j in claim(conn, schema)] == list(range(5))


def test_values_beyond_32_bits_travel_intact(conn: psycopg.Connection, schema: str) -> None:
    """Parameters are sent as text of no declared type: a 64-bit id must not be narrowed."""
    big = 2**40
    conn.execute(f"SELECT setval(pg_get_serial_sequence('\"{schema}\".jobs', 'id'), {big})")
    job_id = client.enqueue(conn, "h", {"big": 2**62}, schema=schema)
    assert job_id > big
    [job] = claim(conn, schema)
    assert job.id == job_id and job.payload == {"big": 2**62}
    assert not lease.complete(conn, "w", job.id + 2**41, job.token, schema=schema)
    assert lease.complete(conn, "w", job.id, job.token, result={"n": 2**63 - 1}, schema=schema)
    result = conn.execute(f'SELECT result FROM "{schema}".jobs WHERE id = %s', [job_id])
    assert result.fetchone() == ({"n": 2**63 - 1},)
