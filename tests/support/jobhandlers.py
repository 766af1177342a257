"""Handlers for the acceptance tests (tests/acceptance/test_daemon.py), imported by the daemon's
children through PYTHONPATH.

Every handler records its execution in the test schema's `executions` table over its own
connection (DSN, schema and daemon tag come from the environment the test gives the
daemon): the row is written when the attempt starts, `alive_at` moves while it works and
`ended_at` is set when it returns. A killed attempt leaves `ended_at` NULL and its last
`alive_at` says when it was last seen running, so tests can check that two executions of
one job never overlapped.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from psycopg import sql

from pgworkerd.worker import JobContext

DSN_ENV = "JOBHANDLERS_DSN"
SCHEMA_ENV = "JOBHANDLERS_SCHEMA"
TAG_ENV = "JOBHANDLERS_TAG"
# The start and end rows must land even across a database restart.
RECORD_RETRY_FOR = 60.0


class Recorder:
    """One execution's row in `executions`, written over a connection that reconnects."""

    def __init__(self, job: JobContext) -> None:
        self.job = job
        self.table = sql.Identifier(os.environ[SCHEMA_ENV], "executions")
        self.conn: psycopg.Connection | None = None
        row = self._execute(
            sql.SQL(
                "INSERT INTO {} (job_id, attempt, pid, tag, started_at, alive_at) "
                "VALUES (%s, %s, %s, %s, clock_timestamp(), clock_timestamp()) RETURNING id"
            ).format(self.table),
            (job.id, job.attempt, os.getpid(), os.environ.get(TAG_ENV, "")),
            retry=True,
        )
        assert row is not None
        self.id: int = row[0]

    def _execute(self, query: sql.Composed, params: Any, *, retry: bool) -> Any:
        give_up = time.monotonic() + (RECORD_RETRY_FOR if retry else 0.0)
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(
                        os.environ[DSN_ENV], autocommit=True, connect_timeout=2
                    )
                return self.conn.execute(query, params).fetchone()
            except psycopg.OperationalError:
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                if time.monotonic() >= give_up:
                    if retry:
                        raise
                    return None
                time.sleep(0.1)

    def alive(self) -> None:
        """Best effort: a missed beat while the database is down is harmless."""
        self._execute(
            sql.SQL("UPDATE {} SET alive_at = clock_timestamp() WHERE id = %s RETURNING id").format(
                self.table
            ),
            (self.id,),
            retry=False,
        )

    def end(self) -> None:
        self._execute(
            sql.SQL(
                "UPDATE {} SET alive_at = clock_timestamp(), ended_at = clock_timestamp() "
                "WHERE id = %s RETURNING id"
            ).format(self.table),
            (self.id,),
            retry=True,
        )


def work(job: JobContext) -> Any:
    """Works for payload["seconds"] (default 0; a list gives one value per attempt, the
    last repeating) in steps of payload["step"] (default 0.1), marking itself alive and
    sending a heartbeat each step (with progress and, when payload["checkpoint"] is true, a
    checkpoint). Returns payload["result"] if given. With payload["record_end"] false the
    end is not recorded, so the handler can finish while the database is down."""
    p = job.payload
    recorder = Recorder(job)
    seconds = p.get("seconds", 0)
    if isinstance(seconds, list):
        seconds = seconds[min(job.attempt, len(seconds)) - 1]
    end = time.monotonic() + float(seconds)
    step = float(p.get("step", 0.1))
    n = 0
    while True:
        recorder.alive()
        n += 1
        job.heartbeat(progress={"step": n}, checkpoint={"step": n} if p.get("checkpoint") else None)
        left = end - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(step, left))
    if p.get("record_end", True):
        recorder.end()
    return p.get("result", {"job": job.id, "attempt": job.attempt, "steps": n})


def fail(job: JobContext) -> None:
    """Raises on every attempt."""
    recorder = Recorder(job)
    recorder.end()
    raise ValueError(f"boom on attempt {job.attempt}")


def hang(job: JobContext) -> None:
    """Heartbeats for payload["beat_for"] seconds (default 0), then falls silent for an hour."""
    recorder = Recorder(job)
    end = time.monotonic() + float(job.payload.get("beat_for", 0))
    while time.monotonic() < end:
        recorder.alive()
        job.heartbeat(progress={"beating": True})
        time.sleep(0.1)
    time.sleep(3600)


def unstorable(job: JobContext) -> Any:
    """Hands the daemon a NUL character, which PostgreSQL cannot store in text or jsonb,
    in the place payload["where"] names: "result", "error" or "progress"."""
    Recorder(job)
    where = job.payload["where"]
    if where == "error":
        raise ValueError("bad \x00 byte")
    if where == "progress":
        job.heartbeat(progress={"note": "bad \x00 byte"})
        time.sleep(3)
    return {"note": "bad \x00 byte"}


def envdump(job: JobContext) -> dict[str, str]:
    """Returns the child's environment (what a handler and its subprocesses inherit)."""
    return dict(os.environ)


def raise_msg(job: JobContext) -> None:
    """Raises an error whose text is payload["msg"] (e.g. with control characters)."""
    raise ValueError(job.payload["msg"])


def parents(job: JobContext) -> dict[str, Any]:
    """Records its execution and returns its parents' results as it saw them
    (job.parents, docs/guide/dependencies.md), keyed by parent id as text."""
    Recorder(job).end()
    return {"parents": {str(k): v for k, v in job.parents.items()}}


def batch_seen(job: JobContext) -> dict[str, Any]:
    """Records its execution and returns its batch as it saw it (job.batch,
    docs/guide/batches.md): the counts and the members' outcomes."""
    Recorder(job).end()
    return {"batch": job.batch}
