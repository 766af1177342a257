"""Fault tier: the daemon's claims and finishes are durable whatever the server's
synchronous_commit (each runs `set_config('synchronous_commit', 'on', true)`: claim_jobs
and, since schema 22, the fenced functions sql/queries/ calls), seen from outside: a
crash (`pg_ctl stop -m immediate`) of a server running with synchronous_commit = off,
right after a claim and a finish were acknowledged, loses neither, so a second daemon
never runs the job while the first still runs it.

With the server default alone, an async commit sits in the WAL buffers until the WAL
writer writes it (wal_writer_delay, here its maximum, 10 s), and an immediate stop drops
it: the claim rolls back to pending, another daemon claims it again under the same token
number, and two children run one job at once.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from daemon_harness import Daemons, Db, wait_for
from faulthandlers import overlaps, read_executions

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate

WORK = {"target": "faulthandlers:work"}
WORKER = {
    "slots": 2,
    "lease": "6s",
    "renew_interval": "1s",
    "poll_interval": "1s",
    "warm_children": 2,
    # A handler that ignores SIGTERM lives this long after its daemon stops it: long
    # enough that a second start of its job while it runs cannot be missed.
    "kill_grace": "10s",
}


@pytest.fixture(scope="module")
def lax_pg() -> Iterator[LocalPostgres]:
    """A cluster of this module's own (it is crashed) whose default loses commits in a
    crash: synchronous_commit off, and WAL written by the WAL writer only every 10 s."""
    settings = {"synchronous_commit": "off", "wal_writer_delay": "10s"}
    with LocalPostgres(settings=settings) as cluster:
        cluster.create_database("durable")
        yield cluster


def test_acknowledged_claim_and_finish_survive_an_immediate_restart_with_async_commit(
    lax_pg: LocalPostgres, tmp_path: Path
) -> None:
    dsn, schema = lax_pg.dsn("durable"), f"d_{uuid.uuid4().hex[:8]}"
    migrate(dsn, schema=schema)
    execs = tmp_path / "executions.jsonl"
    daemons = Daemons(tmp_path, dsn, schema)
    try:
        config = daemons.config({"work": WORK}, WORKER)
        a = daemons.start(config, tag="A")
        with psycopg.connect(dsn, autocommit=True) as conn:
            # The test's own writes are durable: only the daemon's may be at stake.
            conn.execute("SET synchronous_commit = on")
            conn.execute("CHECKPOINT")
            db = Db(conn, schema)
            # One transaction, so that no durable commit of ours comes after the daemon's
            # claims and finish (it would flush their WAL too).
            with conn.transaction():
                long = db.enqueue("work", {"file": str(execs), "seconds": 12, "ignore_term": True})
                quick = db.enqueue("work", {"file": str(execs), "seconds": 0})
        wait_for(lambda: read_executions(execs, long), what="A to start the long job")
        a.wait_log(rf"job {quick} work attempt 1: completed")
        lax_pg.restart("immediate")  # acknowledged: a running child and a logged completion

        daemons.start(config, tag="B")
        with psycopg.connect(dsn, autocommit=True) as conn:
            db = Db(conn, schema)
            for job_id in (long, quick):
                row = db.wait_status(job_id, "completed", "dead", timeout=60)
                assert (row["status"], row["attempts"]) == ("completed", 1), row
        executions = read_executions(execs)
        assert overlaps(executions) == [], "a second daemon ran the job while A still ran it"
        assert [e.tag for e in executions if e.job == long] == ["A"]
        assert [e.tag for e in executions if e.job == quick] == ["A"], "the finish was lost"
    finally:
        daemons.stop_all()
        lax_pg.start()
