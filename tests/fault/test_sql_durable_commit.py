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

import threading
import time
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
        return self.read()

    def read(self) -> dict[str, Any]:
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


def _worker(pg: LocalPostgres, *, claimed: bool, setup_commit: str = "on") -> Worker:
    """The setup commits with synchronous_commit = `setup_commit` (on: durable on its
    own terms, so that only the step under test is at stake)."""
    dsn, schema = pg.dsn("durable"), f"s_{uuid.uuid4().hex[:8]}"
    migrate(dsn, schema=schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        with conn.transaction():
            [(job,)] = conn.execute(
                render("SELECT @schema@.enqueue('transcode', '{\"file\": \"a.mp4\"}')", schema)
            ).fetchall()
            token = None
            if claimed:
                [(_, token)] = conn.execute(render(CLAIM, schema)).fetchall()
            conn.execute(f"SET LOCAL synchronous_commit = {setup_commit}")
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
    # the one texts the daemon's statements call (migration 0025), where the functions
    # above are their one-job wrappers
    "renew_leases": (
        "SELECT * FROM @schema@.renew_leases('sql-worker', ARRAY[%(job)s::bigint],"
        " ARRAY[%(token)s::bigint], '{600}', '{\"{\\\"step\\\": 4}\"}', '{NULL}')",
        {"status": "running", "progress": {"step": 4}},
    ),
    "complete_jobs": (
        "SELECT * FROM @schema@.complete_jobs('sql-worker', ARRAY[%(job)s::bigint],"
        " ARRAY[%(token)s::bigint], '{\"{\\\"ok\\\": 2}\"}', '{NULL}')",
        {"status": "completed", "result": {"ok": 2}, "locked_by": None},
    ),
    "snooze_held_job": (
        "SELECT * FROM @schema@.snooze_held_job(%(job)s, 'sql-worker', %(token)s, 60, 5)",
        {"status": "pending", "attempts": 0, "snoozes": 1},
    ),
    "cancel_held_job": (
        "SELECT @schema@.cancel_held_job(%(job)s, 'sql-worker', %(token)s, 'stopped')",
        {"status": "cancelled", "last_error": "stopped", "locked_by": None},
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


# -- seen directly: each call's COMMIT waits for a synchronous standby ----------------------


@pytest.fixture(scope="module")
def ghost_standby_pg() -> Iterator[LocalPostgres]:
    """A cluster whose synchronous standby never connects: a commit with
    synchronous_commit = on waits for it until cancelled, one with the server's default
    (local) does not."""
    settings = {"synchronous_commit": "local", "synchronous_standby_names": "ghost"}
    with LocalPostgres(settings=settings) as cluster:
        cluster.create_database("durable")
        yield cluster


def _commit_waits_for_the_standby(dsn: str, call: str, params: dict[str, Any]) -> bool:
    """Runs `call` on an autocommit session with the server's defaults; True when its
    COMMIT waited for the standby (it is then cancelled: committed locally only)."""
    with (
        psycopg.connect(dsn, autocommit=True) as worker,
        psycopg.connect(dsn, autocommit=True) as watcher,
    ):
        pid = worker.info.backend_pid
        done = threading.Event()

        def run() -> None:
            try:
                worker.execute(call, params)  # type: ignore[arg-type]
            finally:
                done.set()

        thread = threading.Thread(target=run)
        thread.start()
        waited = False
        deadline = time.monotonic() + 30
        while not done.is_set() and time.monotonic() < deadline:
            [(event,)] = watcher.execute(
                "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchall()
            if event == "SyncRep":
                waited = True
                watcher.execute("SELECT pg_cancel_backend(%s)", (pid,))
                break
            time.sleep(0.05)
        thread.join(timeout=30)
        assert done.is_set(), "the call neither returned nor waited for the standby"
        return waited


@pytest.mark.parametrize("function", ["claim_jobs", *FINISHES])
def test_each_call_s_commit_waits_for_the_synchronous_standby(
    ghost_standby_pg: LocalPostgres, function: str
) -> None:
    worker = _worker(ghost_standby_pg, claimed=function != "claim_jobs", setup_commit="local")
    text = CLAIM if function == "claim_jobs" else FINISHES[function][0]
    call = render(text, worker.schema)
    # the session's own commits do not wait: only the function makes this one wait
    enqueue = render("SELECT @schema@.enqueue('other')", worker.schema)
    assert not _commit_waits_for_the_standby(worker.dsn, enqueue, {})
    assert _commit_waits_for_the_standby(
        worker.dsn, call, {"job": worker.job, "token": worker.token}
    )
    # cancelled while it waited: committed here all the same (the standby never had it)
    expected = {"status": "running"} if function == "claim_jobs" else FINISHES[function][1]
    row = worker.read()
    assert {k: row[k] for k in expected} == expected
