"""pgworkerd.queue.hotpath: the daemon's statements sent below psycopg's cursor must behave
exactly as through a cursor (same rows, same errors, same transactions) on a real
PostgreSQL; with the import-time probe failed they run through a cursor, correctly; and the
application's enqueue leaves nothing of ours on its connection."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import leasing
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
    return leasing.claim(conn, "w", queues=["default"], handlers=SERVED, limit=limit, schema=schema)


@pytest.fixture(params=["direct", "cursor"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run a behaviour test on the direct path and again on the cursor path that a failed
    probe leaves (both must give the same rows, errors and transactions)."""
    if request.param == "cursor":
        monkeypatch.setattr(hotpath, "DIRECT", False)
    elif not hotpath.DIRECT:
        pytest.fail(f"the probe refused this psycopg: {hotpath.UNAVAILABLE}")
    yield request.param


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
                assert leasing.complete(conn, "w", job.id, job.token, schema=schema)
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
                assert leasing.complete(conn, "w", job.id, job.token, schema=schema)
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
            assert leasing.complete(conn, "w", job.id, job.token, schema=schema)
        names = our_statements(conn)
        assert len(names) == 2
        for name in names:
            conn.execute(f"DEALLOCATE {name}")
            client.enqueue_many(conn, [JobSpec("h")], schema=schema)
            for job in claim(conn, schema, limit=1):
                assert leasing.complete(conn, "w", job.id, job.token, schema=schema)
            assert our_statements(conn) == names


def test_threads_making_their_first_statements_at_once(
    schema: str, test_db_dsn: str, path: str
) -> None:
    with connect(test_db_dsn, prepare=True) as conn:
        start = threading.Barrier(4)
        failures: list[BaseException] = []

        def work() -> None:
            try:
                start.wait()
                for _ in range(20):
                    client.enqueue(conn, "h", schema=schema)
                    for job in claim(conn, schema, limit=1):
                        assert leasing.complete(conn, "w", job.id, job.token, schema=schema)
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert len(our_statements(conn)) == (2 if path == "direct" else 0)
        for job in claim(conn, schema, limit=100):  # what the threads' claims did not find
            assert leasing.complete(conn, "w", job.id, job.token, schema=schema)
        rows = conn.execute(f'SELECT status, count(*) FROM "{schema}".jobs GROUP BY 1')
        assert dict(rows.fetchall()) == {"completed": 80}


def test_server_errors_are_psycopgs_own_exceptions(
    conn: psycopg.Connection, schema: str, path: str
) -> None:
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
    conn: psycopg.Connection, schema: str, test_db_dsn: str, path: str
) -> None:
    """The daemon reconnects on OperationalError and a closed connection: both must show."""
    worker = connect(test_db_dsn, prepare=True)
    client.enqueue(worker, "h", schema=schema)
    [job] = claim(worker, schema)
    pid = worker.info.backend_pid
    conn.execute("SELECT pg_terminate_backend(%s)", [pid])
    with pytest.raises(psycopg.OperationalError):
        leasing.complete(worker, "w", job.id, job.token, schema=schema)
    assert worker.closed
    with pytest.raises(psycopg.OperationalError):
        leasing.complete(worker, "w", job.id, job.token, schema=schema)
    worker.close()


def test_statements_join_the_callers_transaction(
    conn: psycopg.Connection, schema: str, path: str
) -> None:
    client.enqueue(conn, "h", schema=schema)
    [job] = claim(conn, schema)
    with pytest.raises(RuntimeError), conn.transaction():
        assert leasing.complete(conn, "w", job.id, job.token, schema=schema)
        raise RuntimeError("the caller changes its mind")
    status = conn.execute(f'SELECT status FROM "{schema}".jobs WHERE id = %s', [job.id]).fetchone()
    assert status == ("running",)  # rolled back with the caller's transaction
    assert leasing.complete(conn, "w", job.id, job.token, schema=schema)


def carry(
    conn: psycopg.Connection,
    schema: str,
    done: list[lease.Completion],
    handlers: dict[str, HandlerCapacity] = SERVED,
    limit: int = 1,
) -> tuple[set[int], list[lease.ClaimedJob], list[lease.RefusedJob]]:
    """Completions carried by a claim of up to `limit` jobs."""
    return lease.complete_and_claim(
        conn, "w", done, queues=["default"], handlers=handlers, limit=limit, schema=schema
    )


def xmin(conn: psycopg.Connection, schema: str, job_id: int) -> str:
    row = conn.execute(f'SELECT xmin::text FROM "{schema}".jobs WHERE id = %s', [job_id])
    return str(row.fetchone()[0])  # type: ignore[index]


def test_completions_and_the_next_claim_commit_in_one_transaction(
    conn: psycopg.Connection, schema: str, path: str
) -> None:
    ids = [client.enqueue(conn, "h", {"n": n}, schema=schema) for n in range(4)]
    first = claim(conn, schema, limit=2)
    done = [lease.Completion(j.id, j.token, {"r": j.payload["n"]}) for j in first]
    finished, claimed, refused = carry(conn, schema, done, limit=2)
    assert finished == set(ids[:2]) and refused == []
    assert [j.id for j in claimed] == ids[2:]
    # one transaction wrote both: the completed rows and the claimed ones share an xmin
    assert len({xmin(conn, schema, i) for i in ids}) == 1
    statuses = conn.execute(
        f'SELECT status::text, result FROM "{schema}".jobs ORDER BY id'
    ).fetchall()
    assert statuses == [("completed", {"r": 0}), ("completed", {"r": 1})] + [("running", None)] * 2
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert conn.pgconn.pipeline_status == psycopg.pq.PipelineStatus.OFF


def test_a_failed_claim_takes_its_completions_back_with_it(
    conn: psycopg.Connection, schema: str, path: str
) -> None:
    """All or nothing: a completion carried by a claim that fails is not written (the
    daemon then writes it alone), and the connection takes the next statement."""
    ids = [client.enqueue(conn, "h", schema=schema) for _ in range(2)]
    [job] = claim(conn, schema, limit=1)
    bad = {"h": HandlerCapacity(lease_seconds=float("inf"), free=1)}  # no such interval
    with pytest.raises(psycopg.DataError):
        carry(conn, schema, [lease.Completion(job.id, job.token)], handlers=bad)
    rows = conn.execute(f'SELECT status::text FROM "{schema}".jobs ORDER BY id').fetchall()
    assert rows == [("running",), ("pending",)]
    finished, claimed, _ = carry(conn, schema, [lease.Completion(job.id, job.token)])
    assert finished == {job.id} and [j.id for j in claimed] == [ids[1]]


def test_a_fenced_completion_does_not_stop_the_claim(
    conn: psycopg.Connection, schema: str, path: str
) -> None:
    ids = [client.enqueue(conn, "h", schema=schema) for _ in range(2)]
    [job] = claim(conn, schema, limit=1)
    lost = lease.Completion(job.id, job.token + 1)  # a lost lease's token
    finished, claimed, _ = carry(conn, schema, [lost])
    assert finished == set() and [j.id for j in claimed] == [ids[1]]


def test_a_deallocated_statement_is_prepared_again_for_the_pipeline(
    schema: str, test_db_dsn: str
) -> None:
    with connect(test_db_dsn, prepare=True) as conn:
        ids = [client.enqueue(conn, "h", schema=schema) for _ in range(3)]
        [job] = claim(conn, schema, limit=1)
        conn.execute("DEALLOCATE ALL")
        finished, claimed, _ = carry(conn, schema, [lease.Completion(job.id, job.token)])
        assert finished == {job.id} and [j.id for j in claimed] == [ids[1]]


def test_pipeline_mode_goes_through_a_cursor(conn: psycopg.Connection, schema: str) -> None:
    with conn.pipeline():
        ids = [client.enqueue(conn, "h", {"n": n}, schema=schema) for n in range(5)]
        claimed = claim(conn, schema)
        done = [leasing.complete(conn, "w", j.id, j.token, schema=schema) for j in claimed]
    assert len(set(ids)) == 5
    assert [j.payload["n"] for j in claimed] == list(range(5))
    assert done == [True] * 5
    assert our_statements(conn) == []


def test_values_beyond_32_bits_travel_intact(
    conn: psycopg.Connection, schema: str, path: str
) -> None:
    """Parameters are sent as text of no declared type: a 64-bit id must not be narrowed."""
    big = 2**40
    conn.execute(f"SELECT setval(pg_get_serial_sequence('\"{schema}\".jobs', 'id'), {big})")
    job_id = client.enqueue(conn, "h", {"big": 2**62}, schema=schema)
    assert job_id > big
    [job] = claim(conn, schema)
    assert job.id == job_id and job.payload == {"big": 2**62}
    assert not leasing.complete(conn, "w", job.id + 2**41, job.token, schema=schema)
    assert leasing.complete(conn, "w", job.id, job.token, result={"n": 2**63 - 1}, schema=schema)
    result = conn.execute(f'SELECT result FROM "{schema}".jobs WHERE id = %s', [job_id])
    assert result.fetchone() == ({"n": 2**63 - 1},)


def test_the_probe_names_a_missing_or_reshaped_internal() -> None:
    assert hotpath.probe() is None  # the psycopg under test is one the pin allows
    missing = hotpath.probe([("psycopg.generators", "execute_v2", "callable")])
    assert missing == f"psycopg {psycopg.__version__} has no psycopg.generators.execute_v2"
    not_callable = hotpath.probe(
        [("psycopg.pq", "ConnStatus", "callable"), ("psycopg", "__version__", "callable")]
    )
    assert not_callable == f"psycopg {psycopg.__version__}: psycopg.__version__ is not callable"
    reshaped = hotpath.probe([("psycopg.Connection", "execute", "wait(gen, ...)")])
    assert reshaped is not None and "Connection.execute takes ['self', 'query'" in reshaped


FALLBACK_SCRIPT = """
import json, logging, sys
import psycopg
import leasing  # tests/support/leasing.py: the calls the tests hold jobs with
from pgworkerd.queue import hotpath, lease
from pgworkerd import client

logging.basicConfig(format="%(levelname)s %(message)s")
dsn, schema = sys.argv[1], sys.argv[2]
out = {"direct": hotpath.DIRECT, "unavailable": hotpath.UNAVAILABLE}
served = {"h": lease.HandlerCapacity(lease_seconds=30.0, free=10)}
with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
    specs = [client.JobSpec("h", {"n": n}) for n in range(5)]
    ids = client.enqueue_many(conn, specs, schema=schema)
    later = client.enqueue(conn, "h", delay=600, schema=schema)
    jobs = leasing.claim(conn, "w", queues=["default"], handlers=served, limit=10, schema=schema)
    out["claimed"] = sorted(j.id for j in jobs)
    out["next_run_in"] = leasing.next_run_in(conn, ["default"], ["h"], schema=schema)
    a, b, c, d, e = sorted(jobs, key=lambda j: j.id)
    held = [lease.Lease(a.id, a.token, 60.0, progress={"p": 1})]
    renewed = lease.renew(conn, "w", held, schema=schema)
    out["renewed"] = [(r.id, r.renewed, r.cancel_requested) for r in renewed]
    out["complete"] = leasing.complete(conn, "w", a.id, a.token, {"r": 1}, schema=schema)
    out["complete_lost"] = leasing.complete(conn, "w", a.id, a.token + 1, schema=schema)
    done = lease.complete_many(conn, "w", [lease.Completion(b.id, b.token, "ok")], schema=schema)
    out["complete_many"] = sorted(done)
    failed = lease.fail(conn, "w", c.id, c.token, "boom", schema=schema)
    out["fail"] = failed.status if failed else None
    out["release"] = lease.release(conn, "w", d.id, d.token, schema=schema)
    out["bury"] = lease.bury(conn, "w", e.id, e.token, "unusable", schema=schema)
    state = lease.lease_state(conn, e.id, e.token, schema=schema)
    out["lease_state"] = state.status if state else None
    out["ours"] = conn.execute(
        "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE '\\_pgworkerd\\_%%'"
    ).fetchone()[0]
    out["ids"] = ids + [later]
print(json.dumps(out))
"""


def test_with_the_probe_failed_the_lease_statements_run_through_a_cursor(
    schema: str, test_db_dsn: str
) -> None:
    """PGWORKERD_HOTPATH=off fails the import-time probe the way a psycopg without one of
    the internals would: import works, every lease statement gives its right answer, no
    statement of ours is prepared, and the fallback is logged once."""
    support = str(Path(__file__).resolve().parents[1] / "support")  # for leasing
    env = {**os.environ, "PGWORKERD_HOTPATH": "off", "PYTHONPATH": support}
    proc = subprocess.run(
        [sys.executable, "-c", FALLBACK_SCRIPT, test_db_dsn, schema],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    ids = out["ids"]
    assert out["direct"] is False and out["unavailable"] == "PGWORKERD_HOTPATH=off"
    assert out["claimed"] == ids[:5]
    assert 500 < out["next_run_in"] <= 600
    assert out["renewed"] == [[ids[0], True, False]]
    assert out["complete"] is True and out["complete_lost"] is False
    assert out["complete_many"] == [ids[1]]
    assert out["fail"] == "pending" and out["release"] == "pending"
    assert out["bury"] is True and out["lease_state"] == "dead"
    assert out["ours"] == 0
    warnings = [ln for ln in proc.stderr.splitlines() if "plain cursor" in ln]
    assert warnings == [
        "WARNING queue statements run through a plain cursor (PGWORKERD_HOTPATH=off)"
    ], proc.stderr


def test_enqueue_leaves_no_state_on_the_applications_connection(
    schema: str, test_db_dsn: str
) -> None:
    """The application's connection is the application's: enqueue sets no attribute on
    it, and nothing of pgworkerd's is kept about it."""
    with connect(test_db_dsn, prepare=True) as conn:
        before = dict(vars(conn))
        for _ in range(10):  # past psycopg's prepare threshold
            client.enqueue(conn, "h", {"n": 1}, schema=schema)
            client.enqueue_many(conn, [JobSpec("h"), JobSpec("h")], schema=schema)
        added = sorted(set(vars(conn)) - set(before))
        assert added == []
        assert our_statements(conn) == []


def test_the_daemons_connection_is_not_kept_alive_by_what_is_known_about_it(
    schema: str, test_db_dsn: str
) -> None:
    conn = connect(test_db_dsn, prepare=True)
    client.enqueue(conn, "h", schema=schema)
    for job in claim(conn, schema):
        assert leasing.complete(conn, "w", job.id, job.token, schema=schema)
    assert len(our_statements(conn)) == 2
    ref = weakref.ref(conn)
    conn.close()
    del conn, job
    gc.collect()
    assert ref() is None
