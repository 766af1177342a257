"""Fault tier: a worker in another language, speaking only SQL (claim_jobs and the
finishing functions, README "Finishing a claimed job from SQL"), gets the daemon's
durability (tests/fault/test_durable_commit.py) whatever the server's synchronous_commit:
a crash (`pg_ctl stop -m immediate`) right after the call was acknowledged loses nothing.

The server here runs with synchronous_commit = off and the WAL writer's longest delay
(10 s), so a commit that relies on the server default sits in the WAL buffers and the
crash drops it (the claim rolls back to pending: another worker would run the job a
second time under the same token). The worker's session sets nothing: the functions
themselves make their commit wait for the WAL flush.

Each step gets a crash of its own: a later durable commit would flush the earlier
commits' WAL too, and hide a step that is not durable by itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate
from pgworkerd.queue.queries import render

CLAIM = """
SELECT id, lease_token FROM @schema@.claim_jobs(
    worker => 'sql-worker', queues => '{default}', handlers => '{transcode}',
    lease_seconds => '{300}', free_slots => '{1}', max_jobs => 1)
"""


@pytest.fixture(scope="module")
def lax_pg() -> Iterator[LocalPostgres]:
    """A cluster of this module's own (it is crashed) whose default loses commits in a
    crash: synchronous_commit off, and WAL written by the WAL writer only every 10 s."""
    settings = {"synchronous_commit": "off", "wal_writer_delay": "10s"}
    with LocalPostgres(settings=settings) as cluster:
        cluster.create_database("durable")
        yield cluster


@dataclass
class Worker:
    """One job of handler `transcode` (claimed by 'sql-worker' unless `claimed` is false)
    set up durably, and the worker's own session, which keeps the server's defaults."""

    pg: LocalPostgres
    dsn: str
    schema: str
    job: int
    token: int | None

    def sql(self, text: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        """One statement as the worker sends it: autocommit, acknowledged on return."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
            cur = conn.execute(render(text, self.schema), params)  # type: ignore[arg-type]
            return cur.fetchall()

    def crash_and_read(self) -> dict[str, Any]:
        self.pg.crash()
        self.pg.start()
        with psycopg.connect(self.dsn, autocommit=True, row_factory=dict_row) as conn:
            row = conn.execute(
                render(
                    "SELECT status::text AS status, locked_by, lease_token, attempts, snoozes,"
                    " result, progress, checkpoint, last_error FROM @schema@.jobs WHERE id = %s",
                    self.schema,
                ),
                (self.job,),
            ).fetchone()
        assert row is not None
        return row


def _worker(pg: LocalPostgres, *, claimed: bool) -> Worker:
    dsn, schema = pg.dsn("durable"), f"s_{uuid.uuid4().hex[:8]}"
    migrate(dsn, schema=schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # The setup is durable on its own terms: only the step under test is at stake.
        conn.execute("SET synchronous_commit = on")
        [(job,)] = conn.execute(
            render("SELECT @schema@.enqueue('transcode', '{\"file\": \"a.mp4\"}')", schema)
        ).fetchall()
        token = None
        if claimed:
            [(_, token)] = conn.execute(render(CLAIM, schema)).fetchall()
        conn.execute("CHECKPOINT")  # a short recovery after the crash
    return Worker(pg, dsn, schema, job, token)


def test_an_acknowledged_claim_survives_a_crash(lax_pg: LocalPostgres) -> None:
    worker = _worker(lax_pg, claimed=False)
    [(job, token)] = worker.sql(CLAIM)
    assert job == worker.job
    row = worker.crash_and_read()
    assert (row["status"], row["locked_by"], row["lease_token"], row["attempts"]) == (
        "running",
        "sql-worker",
        token,
        1,
    ), "the claim was lost: another worker would run the job again under the same token"


# Each finishing function: its call, and what the row must say after the crash.
FINISHES: dict[str, tuple[str, dict[str, Any]]] = {
    "renew_lease": (
        "SELECT * FROM @schema@.renew_lease(%(job)s, 'sql-worker', %(token)s, 600,"
        " progress => '{\"step\": 3}', checkpoint => '{\"at\": 3}')",
        {"status": "running", "progress": {"step": 3}, "checkpoint": {"at": 3}},
    ),
    "complete_job": (
        "SELECT @schema@.complete_job(%(job)s, 'sql-worker', %(token)s, '{\"ok\": true}')",
        {"status": "completed", "result": {"ok": True}, "locked_by": None},
    ),
    "fail_job": (
        "SELECT * FROM @schema@.fail_job(%(job)s, 'sql-worker', %(token)s, 'codec missing')",
        {"status": "pending", "last_error": "codec missing", "locked_by": None},
    ),
    "release_job": (
        "SELECT @schema@.release_job(%(job)s, 'sql-worker', %(token)s,"
        " checkpoint => '{\"at\": 7}')",
        {"status": "pending", "attempts": 0, "checkpoint": {"at": 7}},
    ),
    "snooze_job": (
        "SELECT * FROM @schema@.snooze_job(%(job)s, 'sql-worker', %(token)s, 60)",
        {"status": "pending", "attempts": 0, "snoozes": 1},
    ),
    "give_up_job": (
        "SELECT @schema@.give_up_job(%(job)s, 'sql-worker', %(token)s, 'file deleted')",
        {"status": "dead", "last_error": "file deleted"},
    ),
}


@pytest.mark.parametrize("function", list(FINISHES))
def test_an_acknowledged_finish_survives_a_crash(lax_pg: LocalPostgres, function: str) -> None:
    worker = _worker(lax_pg, claimed=True)
    call, expected = FINISHES[function]
    rows = worker.sql(call, {"job": worker.job, "token": worker.token})
    assert rows not in ([], [(None,)], [(False,)]), f"{function} found no lease: {rows}"
    row = worker.crash_and_read()
    assert {k: row[k] for k in expected} == expected, f"{function}'s commit was lost"
