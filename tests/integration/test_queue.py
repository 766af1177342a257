"""Integration tier: the queue's statements against real PostgreSQL, through pgworkerd.client
(and the enqueue SQL functions), pgworkerd.queue.lease and pgworkerd.queue.admin, one freshly
migrated schema per test."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import leasing
import psycopg
import pytest
from daemon_harness import wait_for
from pruning import prune
from psycopg import sql
from psycopg.rows import dict_row

from pgworkerd import client, model
from pgworkerd.client import InvalidJob, JobSpec
from pgworkerd.config import ConfigError, parse_config
from pgworkerd.queue import admin, lease, session
from pgworkerd.queue.db import connect
from pgworkerd.queue.lease import ClaimedJob, HandlerCapacity, Lease, RenewOutcome
from pgworkerd.queue.queries import notify_channel, query, render

T = TypeVar("T")


@dataclass
class Queue:
    """The client, lease and admin statements bound to one connection and test schema;
    handler "h" and queue "default" unless a test says otherwise."""

    conn: psycopg.Connection
    schema: str

    def enqueue(self, handler: str = "h", payload: dict[str, Any] | None = None, **kw: Any) -> int:
        return client.enqueue(self.conn, handler, payload, schema=self.schema, **kw)

    def claim(
        self,
        worker: str = "w1",
        *,
        handlers: Sequence[str] | dict[str, HandlerCapacity] = ("h",),
        queues: Sequence[str] = ("default",),
        limit: int = 10,
        lease_seconds: float = 30.0,
    ) -> list[ClaimedJob]:
        served = (
            handlers
            if isinstance(handlers, dict)
            else {h: HandlerCapacity(lease_seconds=lease_seconds, free=100) for h in handlers}
        )
        return leasing.claim(
            self.conn, worker, queues=queues, handlers=served, limit=limit, schema=self.schema
        )

    def claim_one(self, worker: str = "w1", **kw: Any) -> ClaimedJob:
        claimed = self.claim(worker, limit=1, **kw)
        assert len(claimed) == 1, claimed
        return claimed[0]

    def row(self, job_id: int) -> dict[str, Any]:
        found = admin.get(self.conn, job_id, schema=self.schema)
        assert found is not None, f"job {job_id} does not exist"
        return found

    def sql(self, text: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run SQL with @schema@ rendered; returns the rows (empty when there are none)."""
        cur = self.conn.execute(render(text, self.schema), params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []

    def one(self, text: str, params: Any = None) -> Any:
        rows = self.sql(text, params)
        assert len(rows) == 1, rows
        return rows[0][0]

    def count(self, where: str = "true", params: Any = None) -> int:
        return int(self.one(f"SELECT count(*) FROM @schema@.jobs WHERE {where}", params))

    def now(self) -> datetime:
        return self.one("SELECT clock_timestamp()")

    def lease_expired(self, job_id: int) -> bool:
        return bool(
            self.one(
                "SELECT locked_until < clock_timestamp() FROM @schema@.jobs WHERE id = %s", [job_id]
            )
        )


@pytest.fixture
def q(conn: psycopg.Connection, schema: str) -> Queue:
    return Queue(conn, schema)


def served(**free: int) -> dict[str, HandlerCapacity]:
    return {h: HandlerCapacity(lease_seconds=30.0, free=n) for h, n in free.items()}


# -- enqueue --------------------------------------------------------------------------------


def test_enqueue_stores_the_options_given(q: Queue) -> None:
    run_at = q.now() + timedelta(hours=2)
    job_id = q.enqueue(
        "mail.send",
        {"to": "a@example.org", "n": [1, 2]},
        queue="mail",
        priority=-3,
        run_at=run_at,
        max_attempts=7,
        dedupe_key="mail-1",
    )
    row = q.row(job_id)
    assert row["handler"] == "mail.send"
    assert row["payload"] == {"to": "a@example.org", "n": [1, 2]}
    assert row["queue"] == "mail"
    assert row["priority"] == -3
    assert row["run_at"] == run_at
    assert row["max_attempts"] == 7
    assert row["dedupe_key"] == "mail-1"
    assert row["status"] == "pending"
    assert row["attempts"] == 0
    assert row["lease_token"] == 0
    assert row["locked_by"] is None and row["finished_at"] is None

    delayed = q.enqueue(delay=timedelta(minutes=10))
    row = q.row(delayed)
    assert row["run_at"] - row["created_at"] == timedelta(minutes=10)
    defaults = q.row(q.enqueue())
    assert (defaults["queue"], defaults["priority"], defaults["max_attempts"]) == ("default", 0, 5)
    assert defaults["payload"] == {}
    assert defaults["run_at"] == defaults["created_at"]


def test_sql_enqueue_function_stores_the_options_given(q: Queue) -> None:
    job_id = q.one(
        "SELECT @schema@.enqueue('report', '{\"day\": 3}', queue => 'reports', priority => 4,"
        " delay => interval '5 minutes', max_attempts => 2, dedupe_key => 'r3')"
    )
    row = q.row(job_id)
    assert (row["handler"], row["payload"], row["queue"]) == ("report", {"day": 3}, "reports")
    assert (row["priority"], row["max_attempts"], row["dedupe_key"]) == (4, 2, "r3")
    assert row["run_at"] - row["created_at"] == timedelta(minutes=5)
    at = q.one("SELECT @schema@.enqueue('report', run_at => '2031-05-06 07:08:09+00')")
    assert q.row(at)["run_at"] == datetime.fromisoformat("2031-05-06T07:08:09+00:00")
    # The named statement wraps the same function.
    named = q.one(
        query("job_enqueue", q.schema),
        {
            "handler": "h",
            "payload": psycopg.types.json.Jsonb({"x": 1}),
            "queue": "named",
            "priority": 1,
            "run_at": None,
            "delay": None,
            "max_attempts": 3,
            "dedupe_key": None,
        },
    )
    row = q.row(named)
    assert (row["queue"], row["payload"], row["max_attempts"]) == ("named", {"x": 1}, 3)


def test_bulk_enqueue_of_5000_jobs_returns_ids_in_input_order(q: Queue) -> None:
    specs = [
        JobSpec("bulk", {"n": n}, queue=f"q{n % 3}", priority=(n * 7919) % 11 - 5)
        for n in range(5000)
    ]
    ids = client.enqueue_many(q.conn, specs, schema=q.schema)
    assert len(ids) == 5000
    assert len(set(ids)) == 5000
    stored = {
        job_id: (n, queue, priority)
        for job_id, n, queue, priority in q.sql(
            "SELECT id, (payload->>'n')::int, queue, priority FROM @schema@.jobs"
        )
    }
    assert len(stored) == 5000
    for n, (job_id, spec) in enumerate(zip(ids, specs, strict=True)):
        assert stored[job_id] == (n, spec.queue, spec.priority)
    assert client.enqueue_many(q.conn, [], schema=q.schema) == []


def test_enqueue_joins_the_callers_transaction(q: Queue, test_db_dsn: str) -> None:
    with psycopg.connect(test_db_dsn) as tx_conn:  # not autocommit: one open transaction
        rolled_back = client.enqueue(tx_conn, "h", {"n": 1}, schema=q.schema)
        assert q.count() == 0, "an uncommitted job is visible to others"
        tx_conn.rollback()
        assert q.count() == 0
        assert admin.get(q.conn, rolled_back, schema=q.schema) is None

        committed = client.enqueue(tx_conn, "h", {"n": 2}, schema=q.schema)
        assert q.count() == 0
        tx_conn.commit()
    assert q.row(committed)["payload"] == {"n": 2}
    assert q.count() == 1
    assert q.claim_one().id == committed


def test_notify_is_sent_on_commit_only(q: Queue, test_db_dsn: str) -> None:
    channel = sql.Identifier(notify_channel(q.schema))
    with (
        psycopg.connect(test_db_dsn, autocommit=True) as listener,
        psycopg.connect(test_db_dsn) as producer,
    ):
        listener.execute(sql.SQL("LISTEN {}").format(channel))

        def received_until(marker: str) -> list[str]:
            """Notifications up to (excluding) `marker`, which this test sends after the
            events under test, so nothing relies on a quiet period."""
            q.conn.execute(
                sql.SQL("SELECT pg_notify({}, {})").format(
                    sql.Literal(notify_channel(q.schema)), sql.Literal(marker)
                )
            )
            got: list[str] = []
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                for n in listener.notifies(timeout=1.0):
                    if n.payload == marker:
                        return got
                    got.append(n.payload)
            pytest.fail(f"marker {marker!r} never arrived; got {got}")

        client.enqueue(producer, "h", queue="rolled", schema=q.schema)
        assert received_until("m1") == []
        producer.rollback()
        assert received_until("m2") == []

        client.enqueue(producer, "h", queue="mail", schema=q.schema)
        client.enqueue_many(
            producer,
            [JobSpec("h", queue="mail"), JobSpec("h", queue="sms")],
            schema=q.schema,
        )
        assert received_until("m3") == []
        producer.commit()
        got = received_until("m4")
        assert set(got) == {"mail", "sms"}
        assert all(isinstance(p, str) for p in got)


# -- dedupe ---------------------------------------------------------------------------------


def test_dedupe_returns_the_live_job_while_pending_or_running(q: Queue) -> None:
    first = q.enqueue(payload={"v": 1}, dedupe_key="k")
    assert q.enqueue(payload={"v": 2}, dedupe_key="k") == first
    other = q.enqueue(dedupe_key="other")
    assert other != first
    assert q.count() == 2
    assert q.row(first)["payload"] == {"v": 1}, "the duplicate must not overwrite the job"

    held = q.claim_one()
    assert held.id == first
    assert q.enqueue(dedupe_key="k") == first
    assert q.one("SELECT @schema@.enqueue('h', dedupe_key => 'k')") == first
    assert q.count() == 2

    assert leasing.complete(q.conn, "w1", held.id, held.token, schema=q.schema)
    again = q.enqueue(payload={"v": 3}, dedupe_key="k")
    assert again not in (first, other)
    assert q.row(again)["status"] == "pending"
    assert q.count() == 3


def test_dedupe_after_dead_or_cancelled_creates_a_new_job(q: Queue) -> None:
    dead = q.enqueue(dedupe_key="k", max_attempts=1)
    held = q.claim_one()
    failed = lease.fail(q.conn, "w1", held.id, held.token, "x", schema=q.schema)
    assert failed is not None and failed.status == "dead"
    cancelled = q.enqueue(dedupe_key="k")
    assert cancelled != dead
    assert admin.cancel(q.conn, [cancelled], schema=q.schema) == {cancelled: "cancelled"}
    fresh = q.enqueue(dedupe_key="k")
    assert fresh not in (dead, cancelled)


def test_dedupe_within_one_bulk_batch_and_against_existing_jobs(q: Queue) -> None:
    existing = q.enqueue(dedupe_key="live")
    ids = client.enqueue_many(
        q.conn,
        [
            JobSpec("h", {"n": 0}, dedupe_key="a"),
            JobSpec("h", {"n": 1}),
            JobSpec("h", {"n": 2}, dedupe_key="a"),
            JobSpec("h", {"n": 3}, dedupe_key="live"),
            JobSpec("h", {"n": 4}, dedupe_key="b"),
            JobSpec("h", {"n": 5}, dedupe_key="a"),
        ],
        schema=q.schema,
    )
    assert ids[0] == ids[2] == ids[5]
    assert ids[3] == existing
    assert len({ids[0], ids[1], ids[4], existing}) == 4
    assert q.count() == 4
    assert q.row(ids[0])["payload"] == {"n": 0}, "the first of equal keys wins"


def test_dedupe_keys_are_scoped_per_handler_so_a_key_cannot_be_squatted(q: Queue) -> None:
    """The audit's finding 8: a client parks a job for a handler nobody serves under
    another application's key; the application's real job must still be created."""
    squat = q.one(
        "SELECT @schema@.enqueue('no_such_handler', '{}', run_at => '8999-01-01+00',"
        " dedupe_key => 'welcome:42')"
    )
    real = q.one(
        "SELECT @schema@.enqueue('send_email', '{\"to\": \"a@example.com\"}',"
        " dedupe_key => 'welcome:42')"
    )
    assert real != squat
    assert (q.row(real)["handler"], q.row(real)["status"]) == ("send_email", "pending")
    # the same handler and key still dedupes, through every path
    assert q.one("SELECT @schema@.enqueue('send_email', dedupe_key => 'welcome:42')") == real
    assert q.enqueue("send_email", dedupe_key="welcome:42") == real
    ids = client.enqueue_many(
        q.conn,
        [
            JobSpec("send_email", dedupe_key="welcome:42"),
            JobSpec("third", dedupe_key="welcome:42"),
            JobSpec("third", dedupe_key="welcome:42"),
            JobSpec("no_such_handler", dedupe_key="welcome:42"),
        ],
        schema=q.schema,
    )
    assert ids[0] == real and ids[3] == squat
    assert ids[1] == ids[2] and ids[1] not in (real, squat)
    assert q.count() == 3


def test_sql_enqueue_dedupes(q: Queue) -> None:
    first = q.one("SELECT @schema@.enqueue('h', dedupe_key => 'sql')")
    assert q.one("SELECT @schema@.enqueue('h', '{\"x\": 1}', dedupe_key => 'sql')") == first
    assert q.enqueue(dedupe_key="sql") == first
    assert q.count() == 1


# -- bad input writes nothing ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"payload": [1, 2]}, "payload must be a JSON object"),
        ({"payload": "text"}, "payload must be a JSON object"),
        ({"payload": {"f": float("nan")}}, "not JSON-serialisable"),
        ({"max_attempts": 0}, "max_attempts must be a positive integer"),
        ({"max_attempts": -1}, "max_attempts must be a positive integer"),
        ({"run_at": datetime(2030, 1, 1, tzinfo=UTC), "delay": 5}, "give run_at or delay"),
        ({"handler": ""}, "handler must be a non-empty string"),
        ({"queue": ""}, "queue must be a non-empty string"),
        ({"priority": 1.5}, "priority must be an integer"),
        ({"delay": -1}, "delay must be a non-negative number"),
        ({"run_at": datetime(2030, 1, 1)}, "run_at must be a timezone-aware datetime"),
    ],
)
def test_invalid_job_is_refused_and_nothing_is_written(
    q: Queue, kwargs: dict[str, Any], message: str
) -> None:
    handler = kwargs.pop("handler", "h")
    with pytest.raises(InvalidJob, match=message):
        q.enqueue(handler, **kwargs)
    assert q.count() == 0


def test_one_bad_job_in_a_batch_writes_nothing_and_keeps_the_transaction(
    q: Queue, test_db_dsn: str
) -> None:
    with psycopg.connect(test_db_dsn) as tx_conn:
        kept = client.enqueue(tx_conn, "h", {"n": 1}, schema=q.schema)
        with pytest.raises(InvalidJob, match="job 2: max_attempts"):
            client.enqueue_many(
                tx_conn,
                [JobSpec("h", {"n": 2}), JobSpec("h", max_attempts=0), JobSpec("h")],
                schema=q.schema,
            )
        tx_conn.commit()  # the caller's transaction was not aborted by the bad batch
    assert q.count() == 1
    assert q.row(kept)["payload"] == {"n": 1}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("@schema@.enqueue('h', '[1]')", "payload must be a JSON object, not array"),
        ("@schema@.enqueue('h', NULL)", "payload must be a JSON object, not NULL"),
        ("@schema@.enqueue('h', max_attempts => 0)", "max_attempts must be a positive integer"),
        ("@schema@.enqueue('h', max_attempts => -1)", "max_attempts must be a positive integer"),
        ("@schema@.enqueue('')", 'needs a non-empty "handler"'),
        ("@schema@.enqueue('h', queue => '')", "queue must be a non-empty string"),
        (
            "@schema@.enqueue('h', run_at => now(), delay => interval '1 second')",
            "give run_at or delay, not both",
        ),
        ('@schema@.enqueue_many(\'{"handler": "h"}\')', "expects a JSON array"),
        (
            '@schema@.enqueue_many(\'[{"handler": "h"}, {"handler": "h", "payload": 1}]\')',
            "job 2 of 2: payload must be a JSON object",
        ),
        ('@schema@.enqueue_many(\'[{"handler": "h", "priority": 1.5}]\')', "priority"),
    ],
)
def test_sql_functions_refuse_bad_input_and_write_nothing(
    q: Queue, call: str, message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
        q.sql(f"SELECT {call}")
    assert message in (info.value.diag.message_primary or "")
    assert q.count() == 0


def test_unknown_status_filter_is_refused_naming_the_valid_ones(q: Queue) -> None:
    with pytest.raises(ValueError, match="unknown status 'bogus'") as info:
        admin.list_jobs(q.conn, statuses=["pending", "bogus"], schema=q.schema)
    for status in model.STATUSES:
        assert status in str(info.value)


# -- CHECK constraints ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "constraint"),
    [
        (
            "INSERT INTO @schema@.jobs (handler, status, started_at)"
            " VALUES ('h', 'running', now())",
            "jobs_running_has_lease",
        ),
        (
            "INSERT INTO @schema@.jobs (handler, locked_by, locked_until)"
            " VALUES ('h', 'w1', now())",
            "jobs_running_has_lease",
        ),
        (
            "INSERT INTO @schema@.jobs (handler, status, locked_by, locked_until)"
            " VALUES ('h', 'running', 'w1', now())",
            "jobs_running_was_started",
        ),
        (
            "INSERT INTO @schema@.jobs (handler, status) VALUES ('h', 'completed')",
            "jobs_finished_when_final",
        ),
        (
            "INSERT INTO @schema@.jobs (handler, finished_at) VALUES ('h', now())",
            "jobs_finished_when_final",
        ),
        (
            "INSERT INTO @schema@.jobs (handler, result) VALUES ('h', '1')",
            "jobs_result_only_when_completed",
        ),
        (
            "INSERT INTO @schema@.jobs (handler, payload) VALUES ('h', '[]')",
            "jobs_payload_is_object",
        ),
        (
            "INSERT INTO @schema@.jobs (handler, attempts, max_attempts) VALUES ('h', 3, 2)",
            "jobs_attempts_in_range",
        ),
        (
            "INSERT INTO @schema@.jobs (handler, max_attempts) VALUES ('h', 0)",
            "jobs_max_attempts_positive",
        ),
        ("INSERT INTO @schema@.jobs (handler) VALUES ('')", "jobs_handler_not_empty"),
        ("INSERT INTO @schema@.jobs (handler, queue) VALUES ('h', '')", "jobs_queue_not_empty"),
    ],
)
def test_check_constraints_reject_an_inconsistent_row(
    q: Queue, statement: str, constraint: str
) -> None:
    with pytest.raises(psycopg.errors.CheckViolation) as info:
        q.sql(statement)
    assert info.value.diag.constraint_name == constraint
    assert q.count() == 0


def test_check_constraints_reject_an_inconsistent_update(q: Queue) -> None:
    job_id = q.enqueue()
    held = q.claim_one()
    before = q.row(job_id)
    for statement, constraint in [
        ("UPDATE @schema@.jobs SET locked_by = NULL WHERE id = %s", "jobs_running_has_lease"),
        ("UPDATE @schema@.jobs SET status = 'pending' WHERE id = %s", "jobs_running_has_lease"),
        ("UPDATE @schema@.jobs SET finished_at = now() WHERE id = %s", "jobs_finished_when_final"),
        ("UPDATE @schema@.jobs SET result = '{}' WHERE id = %s", "jobs_result_only_when_completed"),
    ]:
        with pytest.raises(psycopg.errors.CheckViolation) as info:
            q.sql(statement, [held.id])
        assert info.value.diag.constraint_name == constraint
    assert q.row(job_id) == before


# -- claim ----------------------------------------------------------------------------------


def test_claim_orders_by_priority_then_run_at_then_id(q: Queue) -> None:
    now = q.now()
    a = q.enqueue(priority=0, run_at=now - timedelta(seconds=10))
    b = q.enqueue(priority=-5, run_at=now - timedelta(seconds=1))
    c = q.enqueue(priority=0, run_at=now - timedelta(seconds=20))
    d = q.enqueue(priority=0, run_at=now - timedelta(seconds=10))  # ties with a: id decides
    e = q.enqueue(priority=10, run_at=now - timedelta(seconds=100))
    f = q.enqueue(priority=-5, run_at=now - timedelta(seconds=1))  # ties with b
    expected = [b, f, c, a, d, e]

    # The statement itself picks the best jobs: claiming two at a time gets them pairwise.
    picked = [sorted(j.id for j in q.claim(limit=2)) for _ in range(3)]
    assert picked == [sorted(expected[i : i + 2]) for i in (0, 2, 4)]

    for job_id in expected:
        q.sql(
            "UPDATE @schema@.jobs SET status = 'pending', locked_by = NULL,"
            " locked_until = NULL, attempts = 0 WHERE id = %s",
            [job_id],
        )
    assert [q.claim_one().id for _ in expected] == expected
    assert q.claim() == []


def test_claim_returns_what_a_child_needs(q: Queue) -> None:
    job_id = q.enqueue("h", {"k": "v"}, queue="default", priority=2, max_attempts=4)
    before = q.now()
    job = q.claim_one("w9", lease_seconds=45)
    assert job.id == job_id
    assert (job.handler, job.queue, job.payload, job.priority) == ("h", "default", {"k": "v"}, 2)
    assert (job.attempt, job.max_attempts, job.rescued) == (1, 4, False)
    assert job.token >= 1 << 60  # drawn at random (schema 24)
    assert job.checkpoint is None
    row = q.row(job_id)
    assert row["status"] == "running"
    assert row["locked_by"] == "w9"
    assert row["locked_until"] == job.locked_until
    assert timedelta(seconds=44) < job.locked_until - before < timedelta(seconds=60)
    assert row["started_at"] is not None
    assert q.claim("w2") == [], "a running job with a live lease is not claimed again"


def test_other_languages_claim_with_one_select_as_the_readme_shows(q: Queue) -> None:
    ids = [q.enqueue("h", {"n": n}) for n in range(3)] + [q.enqueue("other")]
    rows = q.sql(
        "SELECT id, handler, attempts, lease_token, rescued"
        " FROM @schema@.claim('worker-1', '{default}', '{h}', '{300}', '{2}', 4)"
    )
    # h's 2 slots; tokens drawn at random (schema 24)
    assert [(r[0], r[1], r[2], r[4]) for r in rows] == [
        (ids[0], "h", 1, False),
        (ids[1], "h", 1, False),
    ]
    assert all(r[3] >= 1 << 60 for r in rows) and rows[0][3] != rows[1][3]
    [(until,)] = q.sql("SELECT locked_until - now() FROM @schema@.jobs WHERE id = %s", [ids[0]])
    assert timedelta(seconds=290) < until <= timedelta(seconds=300)
    # ... and finish them with the same fencing as the Python API.
    assert leasing.complete(q.conn, "worker-1", ids[0], rows[0][3], schema=q.schema)
    assert not leasing.complete(q.conn, "worker-2", ids[1], rows[1][3], schema=q.schema)


def test_scheduled_jobs_are_invisible_until_due(q: Queue) -> None:
    later = q.enqueue(payload={"when": "later"}, run_at=q.now() + timedelta(hours=1))
    soon = q.enqueue(payload={"when": "soon"}, delay=1.5)
    run_at = q.row(soon)["run_at"]
    # Claim as often as we can from the moment it is enqueued: it must not come out early.
    [job] = wait_for(q.claim, what="the delayed job to become due")
    assert job.id == soon
    assert q.row(soon)["started_at"] >= run_at, "claimed before its run_at"
    assert job.payload == {"when": "soon"}
    assert q.claim() == []
    assert q.row(later)["status"] == "pending"


def next_run_at(q: Queue, queues: Sequence[str], handlers: Sequence[str]) -> datetime | None:
    """The wake-up as a time: lease.next_run_in gives seconds from the server's now(),
    which is fixed within a transaction."""
    params = {"queues": list(queues), "handlers": list(handlers)}
    with q.conn.transaction():
        now = q.one("SELECT now()")
        rows = q.sql(query("job_next_run_at", q.schema), params)
        wait = leasing.next_run_in(q.conn, queues, handlers, schema=q.schema)
    assert len(rows) <= 1, rows
    assert wait == (rows[0][0] if rows else None)
    return now + timedelta(seconds=wait) if wait is not None else None


def test_next_run_at_is_the_earliest_future_job_the_worker_serves(q: Queue) -> None:
    """What the daemon sleeps until: future jobs only, any priority, its queues and
    handlers only."""
    now = q.now()
    assert next_run_at(q, ["default"], ["h"]) is None
    q.enqueue(run_at=now - timedelta(minutes=1))  # due already: not a wake-up
    assert next_run_at(q, ["default"], ["h"]) is None
    q.enqueue(run_at=now + timedelta(hours=3), priority=-5)
    q.enqueue(run_at=now + timedelta(hours=2), priority=7)
    q.enqueue(run_at=now + timedelta(hours=4))
    q.enqueue("other", run_at=now + timedelta(hours=1))
    q.enqueue(run_at=now + timedelta(minutes=30), queue="elsewhere")
    assert next_run_at(q, ["default"], ["h"]) == now + timedelta(hours=2)
    assert next_run_at(q, ["default"], ["h", "other"]) == now + timedelta(hours=1)
    assert next_run_at(q, ["default", "elsewhere"], ["h"]) == now + timedelta(minutes=30)
    assert next_run_at(q, ["default"], ["nobody"]) is None


@pytest.mark.parametrize("priorities", [1, 1000, 1001])
def test_next_run_at_with_many_distinct_priorities(q: Queue, priorities: int) -> None:
    """Up to 1,000 distinct priorities per handler are walked one index probe each; beyond
    that the handler is looked up the plain way. Either way the answer is the earliest,
    here the job of the last priority walked, next to a handler with one priority."""
    q.sql(
        "INSERT INTO @schema@.jobs (handler, priority, run_at)"
        " SELECT 'h', k, now() + make_interval(secs => 10000 - k)"
        " FROM generate_series(1, %s) k",
        [priorities],
    )
    q.sql("INSERT INTO @schema@.jobs (handler, run_at) VALUES ('few', now() + interval '5h')")
    earliest = q.one("SELECT min(run_at) FROM @schema@.jobs WHERE handler = 'h'")
    assert next_run_at(q, ["default"], ["h"]) == earliest
    assert next_run_at(q, ["default"], ["few", "h"]) == earliest
    assert next_run_at(q, ["default"], ["few"]) == q.one(
        "SELECT run_at FROM @schema@.jobs WHERE handler = 'few'"
    )
    assert next_run_at(q, ["elsewhere"], ["few", "h"]) is None


def test_next_run_at_reads_a_few_index_pages_not_every_scheduled_job(q: Queue) -> None:
    """The daemon asks after every claim that leaves it idle: with 100,000 scheduled jobs
    it must probe the index per priority, not read them all."""
    q.sql(
        "INSERT INTO @schema@.jobs (handler, priority, run_at)"
        " SELECT 'h', n % 3, now() + make_interval(secs => 3600 + n)"
        " FROM generate_series(1, 100000) n"
    )
    q.sql("VACUUM ANALYZE @schema@.jobs")
    explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query("job_next_run_at", q.schema)
    [plan] = q.one(explain, {"queues": ["default"], "handlers": ["h"]})
    buffers = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"]["Shared Read Blocks"]
    assert buffers < 100, json.dumps(plan, indent=1)  # a full scan reads thousands
    assert next_run_at(q, ["default"], ["h"]) == q.one(
        "SELECT min(run_at) FROM @schema@.jobs WHERE run_at > now()"
    )


def test_claim_respects_limit_queues_and_handlers(q: Queue) -> None:
    for n in range(4):
        q.enqueue("h1", {"n": n}, queue="qa")
        q.enqueue("h2", {"n": n}, queue="qa")
        q.enqueue("h1", {"n": n}, queue="qb")
    got = q.claim(handlers=["h1", "h2"], queues=["qa", "qb"], limit=3)
    assert len(got) == 3
    only_qb = q.claim(handlers=["h1", "h2"], queues=["qb"])
    assert {(j.queue, j.handler) for j in only_qb} == {("qb", "h1")}
    only_h2 = q.claim(handlers=["h2"], queues=["qa", "qb"])
    assert {(j.queue, j.handler) for j in only_h2} == {("qa", "h2")}
    assert q.claim(handlers=["h3"], queues=["qa", "qb"]) == []
    assert q.claim(handlers=["h1"], queues=["qc"]) == []
    assert q.claim(handlers=["h1", "h2"], queues=["qa", "qb"], limit=0) == []
    claimed = {j.id for j in got + only_qb + only_h2}
    rest = q.claim(handlers=["h1", "h2"], queues=["qa", "qb"], limit=100)
    assert claimed.isdisjoint(j.id for j in rest)
    assert len(claimed) + len(rest) == 12
    assert q.count("status = 'running'") == 12


def test_claim_respects_per_handler_free_slots(q: Queue) -> None:
    for n in range(5):
        q.enqueue("h1", {"n": n}, priority=n)
        q.enqueue("h2", {"n": n}, priority=n)
        q.enqueue("h3", {"n": n}, priority=n)
    got = q.claim(handlers=served(h1=2, h2=1, h3=0), limit=10)
    by_handler = {h: [j.payload["n"] for j in got if j.handler == h] for h in ("h1", "h2", "h3")}
    assert by_handler == {"h1": [0, 1], "h2": [0], "h3": []}
    assert q.claim(handlers=served(h1=0, h2=0), limit=10) == []
    assert q.count("status = 'running'") == 3


def test_a_capped_handler_does_not_hide_other_handlers_jobs(q: Queue) -> None:
    for n in range(20):
        q.enqueue("busy", {"n": n}, priority=0)
    for n in range(5):
        q.enqueue("other", {"n": n}, priority=1)
    got = q.claim(handlers=served(busy=1, other=5), limit=10)
    assert sorted(j.handler for j in got) == ["busy"] + ["other"] * 5


# -- renew and complete ---------------------------------------------------------------------


def test_renew_extends_the_lease_and_saves_progress_and_checkpoint(q: Queue) -> None:
    job_id = q.enqueue()
    held = q.claim_one(lease_seconds=5)
    out = lease.renew(
        q.conn,
        "w1",
        [Lease(held.id, held.token, 120, progress={"done": 10}, checkpoint={"offset": 3})],
        schema=q.schema,
    )
    assert out == [RenewOutcome(id=job_id, renewed=True, cancel_requested=False)]
    row = q.row(job_id)
    assert row["locked_until"] - q.now() > timedelta(seconds=100)
    assert (row["progress"], row["checkpoint"]) == ({"done": 10}, {"offset": 3})
    # None keeps what was saved.
    lease.renew(q.conn, "w1", [Lease(held.id, held.token, 120)], schema=q.schema)
    row = q.row(job_id)
    assert (row["progress"], row["checkpoint"]) == ({"done": 10}, {"offset": 3})
    assert lease.renew(q.conn, "w1", [], schema=q.schema) == []

    assert leasing.complete(
        q.conn, "w1", held.id, held.token, {"sent": 3}, progress={"done": 11}, schema=q.schema
    )
    row = q.row(job_id)
    assert row["status"] == "completed"
    assert row["result"] == {"sent": 3}
    assert row["progress"] == {"done": 11}
    assert row["finished_at"] is not None
    assert row["locked_by"] is None and row["locked_until"] is None
    assert row["attempts"] == 1
    # A completed job is final: finishing it again changes nothing.
    assert not leasing.complete(q.conn, "w1", held.id, held.token, schema=q.schema)
    assert q.claim() == []


def test_a_checkpoint_survives_into_the_next_attempt(q: Queue) -> None:
    q.enqueue()
    held = q.claim_one()
    lease.renew(
        q.conn, "w1", [Lease(held.id, held.token, 30, checkpoint={"page": 7})], schema=q.schema
    )
    assert lease.release(q.conn, "w1", held.id, held.token, schema=q.schema) == "pending"
    again = q.claim_one("w2")
    assert again.checkpoint == {"page": 7}


# -- failures, backoff, release -------------------------------------------------------------


def backoff_seconds(q: Queue, job_id: int) -> float:
    # The fail statement sets run_at = now() + backoff and updated_at = now() together.
    row = q.row(job_id)
    return (row["run_at"] - row["updated_at"]).total_seconds()


def test_fail_backs_off_exponentially_with_jitter_then_goes_dead(q: Queue) -> None:
    base, cap = 0.3, 0.5
    job_id = q.enqueue(max_attempts=3)

    held = q.claim_one()
    outcome = lease.fail(
        q.conn,
        "w1",
        held.id,
        held.token,
        "boom 1",
        backoff_base=base,
        backoff_max=cap,
        schema=q.schema,
    )
    assert outcome is not None and outcome.status == "pending"
    row = q.row(job_id)
    assert (row["status"], row["attempts"], row["last_error"]) == ("pending", 1, "boom 1")
    assert row["locked_by"] is None and row["finished_at"] is None
    assert outcome.run_at == row["run_at"]
    assert base * 0.75 <= backoff_seconds(q, job_id) <= base * 1.25

    held = wait_for(lambda: q.claim(), what="the first retry to become due")[0]
    assert held.attempt == 2
    outcome = lease.fail(
        q.conn,
        "w1",
        held.id,
        held.token,
        "boom 2",
        backoff_base=base,
        backoff_max=cap,
        schema=q.schema,
    )
    assert outcome is not None and outcome.status == "pending"
    # base * 2 = 0.6 is capped at 0.5
    assert cap * 0.75 <= backoff_seconds(q, job_id) <= cap * 1.25

    held = wait_for(lambda: q.claim(), what="the second retry to become due")[0]
    assert held.attempt == 3
    run_at_before = q.row(job_id)["run_at"]
    outcome = lease.fail(
        q.conn,
        "w1",
        held.id,
        held.token,
        "boom 3",
        backoff_base=base,
        backoff_max=cap,
        schema=q.schema,
    )
    assert outcome is not None and outcome.status == "dead"
    row = q.row(job_id)
    assert row["status"] == "dead"
    assert row["attempts"] == 3
    assert row["last_error"] == "boom 3"
    assert row["finished_at"] is not None
    assert row["locked_by"] is None and row["locked_until"] is None
    assert row["run_at"] == run_at_before
    assert q.claim() == []


def test_backoff_uses_the_base_and_spreads_retries(q: Queue) -> None:
    ids = client.enqueue_many(q.conn, [JobSpec("h", {"n": n}) for n in range(20)], schema=q.schema)
    for held in q.claim(limit=20):
        lease.fail(q.conn, "w1", held.id, held.token, "x", backoff_base=10, schema=q.schema)
    delays = [backoff_seconds(q, job_id) for job_id in ids]
    assert all(7.5 <= d <= 12.5 for d in delays), delays
    assert len({round(d, 3) for d in delays}) > 1, "no jitter: every retry at the same time"
    assert q.claim(limit=20) == [], "retries must wait for their backoff"


def test_backoff_is_capped_for_any_attempt_number(q: Queue) -> None:
    job_id = q.enqueue(max_attempts=1000)  # the most enqueue accepts
    q.sql("UPDATE @schema@.jobs SET attempts = 998 WHERE id = %s", [job_id])
    held = q.claim_one()
    outcome = lease.fail(
        q.conn, "w1", held.id, held.token, "x", backoff_base=10, backoff_max=60, schema=q.schema
    )
    assert outcome is not None and outcome.status == "pending"
    assert 45 <= backoff_seconds(q, job_id) <= 75


def test_release_hands_the_job_back_without_counting_the_attempt(q: Queue) -> None:
    job_id = q.enqueue(max_attempts=1)
    held = q.claim_one()
    newer = q.enqueue()
    assert lease.release(q.conn, "w1", held.id, held.token, schema=q.schema) == "pending"
    row = q.row(job_id)
    assert (row["status"], row["attempts"]) == ("pending", 0)
    assert row["locked_by"] is None and row["finished_at"] is None
    assert row["run_at"] == held.run_at  # its old place in the queue: before `newer`
    again = q.claim_one("w2")
    assert q.row(newer)["status"] == "pending"
    assert (again.id, again.attempt, again.rescued) == (job_id, 1, False)
    assert again.token != held.token
    # With max_attempts=1, a counted release would have made this attempt impossible.
    assert leasing.complete(q.conn, "w2", again.id, again.token, schema=q.schema)


# -- fencing: expired leases ----------------------------------------------------------------


# The same worker name rescuing its own job is a daemon whose hung child's lease ran out:
# then only the token tells the old holder from the new one.
@pytest.mark.parametrize("rescuer", ["w2", "w1"], ids=["other-worker", "same-worker"])
def test_an_expired_lease_is_rescued_and_the_old_holder_is_fenced_off(
    q: Queue, rescuer: str
) -> None:
    job_id = q.enqueue(max_attempts=3)
    old = q.claim_one("w1", lease_seconds=30)
    assert q.claim("w2") == [], "a live lease must not be rescued"
    # The holder goes quiet right after this renew: its lease runs out 0.2 s later.
    lease.renew(q.conn, "w1", [Lease(old.id, old.token, 0.2, progress={"p": 1})], schema=q.schema)
    wait_for(lambda: q.lease_expired(job_id), what="the lease to expire")

    new = q.claim_one(rescuer, lease_seconds=30)
    assert new.id == job_id
    assert new.rescued
    assert new.token != old.token and new.token >= 1 << 60  # drawn at random (schema 24)
    assert new.attempt == 2
    rescued = q.row(job_id)
    assert rescued["locked_by"] == rescuer
    assert "lease of w1 expired during attempt 1" in rescued["last_error"]
    assert rescued["progress"] == {"p": 1}

    stale = lease.renew(
        q.conn, "w1", [Lease(old.id, old.token, 30, progress={"p": 99})], schema=q.schema
    )
    assert stale == [RenewOutcome(id=job_id, renewed=False, cancel_requested=False)]
    assert not leasing.complete(q.conn, "w1", old.id, old.token, {"r": 1}, schema=q.schema)
    assert lease.fail(q.conn, "w1", old.id, old.token, "late", schema=q.schema) is None
    assert lease.release(q.conn, "w1", old.id, old.token, schema=q.schema) is None
    assert not lease.cancel_running(q.conn, "w1", old.id, old.token, "x", schema=q.schema)
    # The right token under the wrong name is no better.
    assert not leasing.complete(q.conn, "w3", new.id, new.token, schema=q.schema)
    assert q.row(job_id) == rescued

    [renewed] = lease.renew(q.conn, rescuer, [Lease(new.id, new.token, 30)], schema=q.schema)
    assert renewed.renewed
    assert leasing.complete(q.conn, rescuer, new.id, new.token, {"r": 2}, schema=q.schema)
    assert q.row(job_id)["result"] == {"r": 2}


def test_an_expired_job_without_attempts_left_is_buried_by_the_claim(q: Queue) -> None:
    dead = q.enqueue(max_attempts=1)
    first = q.claim_one("w1", lease_seconds=0.2)
    requested = q.enqueue(max_attempts=3)
    held = q.claim_one("w1", lease_seconds=0.2)
    assert admin.cancel(q.conn, [requested], schema=q.schema) == {requested: "cancel requested"}
    wait_for(
        lambda: q.lease_expired(dead) and q.lease_expired(requested), what="the leases to expire"
    )
    fresh = q.enqueue()

    claimed = q.claim("w2")
    assert [j.id for j in claimed] == [fresh], "an exhausted or cancelled job was run again"
    row = q.row(dead)
    assert row["status"] == "dead"
    assert row["finished_at"] is not None
    assert row["locked_by"] is None and row["locked_until"] is None
    assert "lease of w1 expired during attempt 1 of 1" in row["last_error"]
    # a burial fences the lost holder off like a claim: a new token, drawn (schema 24)
    assert row["lease_token"] != first.token and row["lease_token"] >= 1 << 60
    row = q.row(requested)
    assert row["status"] == "cancelled"
    assert row["finished_at"] is not None
    assert not leasing.complete(q.conn, "w1", held.id, held.token, schema=q.schema)


# -- cancel, retry, prune -------------------------------------------------------------------


def test_cancel_pending_running_finished_and_unknown_jobs(q: Queue) -> None:
    pending = q.enqueue("p")
    running = q.enqueue("r")
    held = q.claim_one(handlers=["r"])
    done = q.enqueue("d")
    d = q.claim_one(handlers=["d"])
    leasing.complete(q.conn, "w1", d.id, d.token, schema=q.schema)
    missing = 10**12

    outcomes = admin.cancel(q.conn, [pending, running, done, missing], schema=q.schema)
    assert outcomes == {
        pending: "cancelled",
        running: "cancel requested",
        done: "already completed",
        missing: "not found",
    }
    row = q.row(pending)
    assert row["status"] == "cancelled" and row["finished_at"] is not None
    assert q.claim(handlers=["p"]) == []
    row = q.row(running)
    assert row["status"] == "running" and row["cancel_requested"]
    assert row["locked_by"] == "w1"
    assert admin.cancel(q.conn, [pending], schema=q.schema) == {pending: "already cancelled"}

    [out] = lease.renew(q.conn, "w1", [Lease(held.id, held.token, 30)], schema=q.schema)
    assert out == RenewOutcome(id=running, renewed=True, cancel_requested=True)
    assert lease.cancel_running(
        q.conn, "w1", held.id, held.token, "cancelled by request", schema=q.schema
    )
    row = q.row(running)
    assert row["status"] == "cancelled"
    assert row["last_error"] == "cancelled by request"
    assert row["finished_at"] is not None and row["locked_by"] is None


def test_fail_or_release_of_a_cancel_requested_job_cancels_it(q: Queue) -> None:
    failing = q.enqueue(max_attempts=5)
    f = q.claim_one()
    releasing = q.enqueue(max_attempts=5)
    r = q.claim_one()
    assert admin.cancel(q.conn, [failing, releasing], schema=q.schema) == {
        failing: "cancel requested",
        releasing: "cancel requested",
    }
    outcome = lease.fail(q.conn, "w1", f.id, f.token, "stopped", schema=q.schema)
    assert outcome is not None and outcome.status == "cancelled"
    assert lease.release(q.conn, "w1", r.id, r.token, schema=q.schema) == "cancelled"
    for job_id in (failing, releasing):
        row = q.row(job_id)
        assert row["status"] == "cancelled"
        assert row["finished_at"] is not None
        assert row["locked_by"] is None
    assert q.claim() == [], "a cancelled job must not be retried"


def make_dead(q: Queue, handler: str = "h", queue: str = "default", **kw: Any) -> int:
    job_id = q.enqueue(handler, queue=queue, max_attempts=1, **kw)
    held = q.claim_one(handlers=[handler], queues=[queue])
    assert held.id == job_id
    outcome = lease.fail(q.conn, "w1", held.id, held.token, "gave up", schema=q.schema)
    assert outcome is not None and outcome.status == "dead"
    return job_id


def test_retry_dead_or_cancelled_jobs_by_id_queue_and_handler(q: Queue) -> None:
    a = make_dead(q, "h1", "qa")
    b = q.enqueue("h2", queue="qb")
    admin.cancel(q.conn, [b], schema=q.schema)
    c = make_dead(q, "h3", "qb")
    f = make_dead(q, "h4", "qc")
    d = q.enqueue("h1", queue="qa")
    held = q.claim_one(handlers=["h1"], queues=["qa"])
    leasing.complete(q.conn, "w1", held.id, held.token, schema=q.schema)
    e = q.enqueue("h1", queue="qa")

    assert admin.retry(q.conn, ids=[a, d, e], schema=q.schema) == [a]
    row = q.row(a)
    assert (row["status"], row["attempts"], row["finished_at"]) == ("pending", 0, None)
    assert row["run_at"] <= q.now()
    assert admin.retry(q.conn, handler="h4", schema=q.schema) == [f]
    assert admin.retry(q.conn, queue="qb", schema=q.schema) == sorted([b, c])
    assert admin.retry(q.conn, queue="qb", schema=q.schema) == []
    assert q.row(d)["status"] == "completed"

    again = q.claim(handlers=["h1", "h2", "h3", "h4"], queues=["qa", "qb", "qc"], limit=10)
    assert sorted(j.id for j in again) == sorted([a, b, c, e, f])
    assert all(j.attempt == 1 for j in again)
    with pytest.raises(ValueError, match="needs job ids, a queue or a handler"):
        admin.retry(q.conn, schema=q.schema)


def test_retry_skips_a_job_whose_dedupe_key_is_live_again(q: Queue) -> None:
    dead = make_dead(q, dedupe_key="k")
    live = q.enqueue(dedupe_key="k")
    assert admin.retry(q.conn, ids=[dead], schema=q.schema) == []
    assert q.row(dead)["status"] == "dead"
    assert q.row(live)["status"] == "pending"


def test_retry_ignores_a_live_job_of_another_handler_with_the_same_key(q: Queue) -> None:
    dead = make_dead(q, "h1", dedupe_key="k")
    other = q.enqueue("h2", dedupe_key="k")
    assert admin.retry(q.conn, ids=[dead], schema=q.schema) == [dead]
    assert q.row(dead)["status"] == "pending"
    assert q.row(other)["status"] == "pending"
    # and now h1's key is live again: enqueueing it dedupes to the retried job
    assert q.enqueue("h1", dedupe_key="k") == dead


def test_retry_of_two_dead_jobs_with_the_same_dedupe_key(q: Queue) -> None:
    first = make_dead(q, dedupe_key="k")
    second = make_dead(q, dedupe_key="k")
    retried = admin.retry(q.conn, queue="default", schema=q.schema)
    assert len(retried) == 1 and retried[0] in (first, second)
    assert q.count("status = 'pending'") == 1


def test_prune_deletes_only_finished_jobs_older_than_the_retention(q: Queue) -> None:
    old_completed = q.enqueue("c")
    held = q.claim_one(handlers=["c"])
    leasing.complete(q.conn, "w1", held.id, held.token, schema=q.schema)
    old_dead = make_dead(q, "d")
    old_cancelled = q.enqueue("x")
    admin.cancel(q.conn, [old_cancelled], schema=q.schema)
    recent = q.enqueue("r")
    held = q.claim_one(handlers=["r"])
    leasing.complete(q.conn, "w1", held.id, held.token, schema=q.schema)
    old_pending = q.enqueue("p")
    old_running = q.enqueue("run")
    q.claim_one(handlers=["run"])
    q.sql(
        "UPDATE @schema@.jobs SET finished_at = now() - interval '2 days' WHERE id = ANY(%s)",
        [[old_completed, old_dead, old_cancelled]],
    )
    q.sql(
        "UPDATE @schema@.jobs SET created_at = now() - interval '3 days',"
        " run_at = now() - interval '3 days', updated_at = now() - interval '3 days'"
        " WHERE id = ANY(%s)",
        [[old_pending, old_running]],
    )

    day = 86400.0
    assert prune(q.conn, jobs_older_than=day, statuses=["dead"], schema=q.schema).jobs == 1
    assert prune(q.conn, jobs_older_than=3 * day, schema=q.schema).jobs == 0
    assert prune(q.conn, jobs_older_than=day, schema=q.schema).jobs == 2
    remaining = {r[0] for r in q.sql("SELECT id FROM @schema@.jobs")}
    assert remaining == {recent, old_pending, old_running}
    # whatever the retention, a job not finished is never deleted
    assert prune(q.conn, jobs_older_than=0.0, schema=q.schema).jobs == 1
    assert {r[0] for r in q.sql("SELECT id FROM @schema@.jobs")} == {old_pending, old_running}


def test_prune_works_through_batches(q: Queue) -> None:
    ids = client.enqueue_many(q.conn, [JobSpec("h") for _ in range(7)], schema=q.schema)
    admin.cancel(q.conn, ids, schema=q.schema)
    q.sql("UPDATE @schema@.jobs SET finished_at = now() - interval '1 hour'")
    assert prune(q.conn, jobs_older_than=1800.0, batch=2, schema=q.schema).jobs == 7
    assert q.count() == 0


def test_list_counts_and_get(q: Queue) -> None:
    a = q.enqueue("h", queue="qa")
    b = q.enqueue("h2", queue="qb")
    admin.cancel(q.conn, [b], schema=q.schema)
    c = q.enqueue("h", queue="qa")
    listed = admin.list_jobs(q.conn, schema=q.schema)
    assert [r["id"] for r in listed] == [c, b, a]
    assert [r["id"] for r in admin.list_jobs(q.conn, statuses=["cancelled"], schema=q.schema)] == [
        b
    ]
    assert [r["id"] for r in admin.list_jobs(q.conn, queue="qa", limit=1, schema=q.schema)] == [c]
    assert [r["id"] for r in admin.list_jobs(q.conn, handler="h2", schema=q.schema)] == [b]
    assert admin.counts(q.conn, schema=q.schema) == [("qa", "pending", 2), ("qb", "cancelled", 1)]
    assert admin.get(q.conn, 10**12, schema=q.schema) is None
    json.dumps(listed, default=str)  # what `jobs --json` prints


# -- the claim stays cheap with a big history -----------------------------------------------


@contextmanager
def explained(conn: psycopg.Connection) -> Iterator[list[dict[str, Any]]]:
    """The plans of every statement run inside the block, nested ones included, exactly as
    sent (real parameters, prepared or not): auto_explain hands them to us as NOTICEs."""
    plans: list[dict[str, Any]] = []

    def keep_plan(diag: psycopg.errors.Diagnostic) -> None:
        text = diag.message_primary or ""
        if text.startswith("duration:") and "{" in text:
            plan = json.loads(text[text.index("{") :])
            # the finished-notification trigger's pg_notify (schema 11) reads no table
            if "|| '.finished'" not in plan.get("Query Text", ""):
                plans.append(plan)

    conn.add_notice_handler(keep_plan)
    conn.execute("LOAD 'auto_explain'")
    conn.execute("SET auto_explain.log_format = json")
    conn.execute("SET auto_explain.log_level = notice")
    conn.execute("SET auto_explain.log_nested_statements = on")
    conn.execute("SET auto_explain.log_min_duration = 0")
    try:
        yield plans
    finally:
        conn.execute("SET auto_explain.log_min_duration = -1")
        conn.remove_notice_handler(keep_plan)


# Statements of claim_jobs_v2 (schema 27) around claim_v3's one statement: the end of
# expired jobs and the look-up of each claimed job's timeout and parents.
CLAIM_V2_OWN = ("expires_at", "timeout_seconds", "job_parents")


def claim_statement(plans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plans of claim_v3's statement among a claim's plans (those that read jobs)."""
    return [
        p
        for p in plans
        if "jobs" in relations(p["Plan"])
        and not any(own in p.get("Query Text", "") for own in CLAIM_V2_OWN)
    ]


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(plan_nodes(child))
    return nodes


def relations(plan: dict[str, Any]) -> set[str]:
    return {n["Relation Name"] for n in plan_nodes(plan) if "Relation Name" in n}


def test_claim_uses_the_partial_indexes_not_a_seq_scan(q: Queue) -> None:
    q.sql(
        "INSERT INTO @schema@.jobs (handler, queue, status, attempts, started_at, finished_at,"
        " created_at, run_at)"
        " SELECT 'h', 'default', 'completed', 1, now() - interval '1 day',"
        "        now() - interval '1 day', now() - interval '2 days', now() - interval '2 days'"
        " FROM generate_series(1, 200000)"
    )
    client.enqueue_many(
        q.conn, [JobSpec("h", {"n": n}, priority=n % 7) for n in range(300)], schema=q.schema
    )
    q.claim(limit=40, lease_seconds=300)
    q.sql("ANALYZE @schema@.jobs")

    with explained(q.conn) as plans:
        claimed = q.claim(limit=10)
    assert len(claimed) == 10

    [plan] = claim_statement(plans)  # claim()'s query
    nodes = plan_nodes(plan["Plan"])
    index_scans = {
        n.get("Index Name")
        for n in nodes
        if n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Index Scan")
    }
    seq_scans = [
        n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"
    ]
    plan_text = json.dumps(plan["Plan"], indent=1)
    assert "jobs_pending_order_idx" in index_scans, plan_text
    assert "jobs_running_lease_idx" in index_scans, plan_text
    assert seq_scans == [], plan_text


@pytest.mark.parametrize("generic", [False, True], ids=["custom-plans", "generic-plans"])
def test_finishing_and_renewing_look_jobs_up_by_primary_key(
    q: Queue, test_db_dsn: str, generic: bool
) -> None:
    """Complete, renew and fail must not scan the partial index of running jobs (its size is
    every worker's running jobs): not with statistics taken while nothing ran, not with
    the generic plans of prepared statements."""
    q.sql(
        "INSERT INTO @schema@.jobs (handler, status, attempts, started_at, finished_at)"
        " SELECT 'h', 'completed', 1, now(), now() FROM generate_series(1, 50000)"
    )
    client.enqueue_many(q.conn, [JobSpec("h") for _ in range(2100)], schema=q.schema)
    q.sql("VACUUM ANALYZE @schema@.jobs")  # statistics from before anything runs
    q.sql("ALTER TABLE @schema@.jobs SET (autovacuum_enabled = false)")  # ...and they stay
    for n in range(20):
        q.claim(f"other{n}", limit=100, lease_seconds=300)
    mine = q.claim("w1", limit=10, lease_seconds=300)
    assert q.count("status = 'running'") == 2010

    conn = connect(test_db_dsn, prepare=True)
    conn.prepare_threshold = 0  # every statement prepared: generic plans are possible
    with conn:
        if generic:
            conn.execute("SET plan_cache_mode = force_generic_plan")
        with explained(conn) as plans:
            renewed = lease.renew(
                conn, "w1", [Lease(j.id, j.token, 60) for j in mine[:5]], schema=q.schema
            )
            done = lease.complete_many(
                conn, "w1", [lease.Completion(j.id, j.token) for j in mine[:5]], schema=q.schema
            )
            one = leasing.complete(conn, "w1", mine[5].id, mine[5].token, {"r": 1}, schema=q.schema)
            failed = lease.fail(conn, "w1", mine[6].id, mine[6].token, "boom", schema=q.schema)
            released = lease.release(conn, "w1", mine[7].id, mine[7].token, schema=q.schema)
    assert all(r.renewed for r in renewed)
    assert done == {j.id for j in mine[:5]} and one and failed and released == "pending"

    # (not the insert into attempts that the trigger of migration 0012 runs inside them)
    plans = [p for p in plans if "INSERT INTO" not in p["Query Text"]]
    # the five UPDATEs, nested in the fenced functions since schema 22
    assert len([p for p in plans if "UPDATE" in p["Query Text"]]) == 5, plans
    for plan in plans:
        nodes = plan_nodes(plan["Plan"])
        on_jobs = [
            n for n in nodes if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]
        ]
        text = json.dumps(plan, indent=1)
        assert on_jobs or "UPDATE" not in plan["Query Text"], text
        assert all(n.get("Index Name") == "jobs_pkey" for n in on_jobs), text


@pytest.mark.parametrize(
    ("jobs_json", "message"),
    [
        ('[{"handler": "h", "dedupe_key": 5}]', "job 1 of 1: dedupe_key must be a string"),
        ('[{"handler": "h"}, {"handler": "h", "priority": "1"}]', "job 2 of 2: priority"),
        ('[{"handler": "h"}, {"handler": "h", "queue": ""}]', "job 2 of 2: queue must be"),
        ('[{"handler": "h"}, {"handler": "h", "max_attempts": 0.5}]', "job 2 of 2: max_attempts"),
        ('[{"handler": "h", "dedupe_key": "k"}, {"handler": 1}]', "job 2 of 2: needs a non-empty"),
        (
            '[{"handler": "h"}, {"handler": "h", "run_at": "2030-01-01", "delay": "1s"}]',
            "job 2 of 2: give run_at or delay",
        ),
    ],
)
def test_enqueue_many_checks_every_job_with_or_without_dedupe_keys(
    q: Queue, jobs_json: str, message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as info:
        q.sql("SELECT @schema@.enqueue_many(%s::jsonb)", [jobs_json])
    assert message in (info.value.diag.message_primary or "")
    assert q.count() == 0


def test_enqueue_many_sends_short_json_and_stores_every_default(q: Queue) -> None:
    text = client.jobs_json([JobSpec("h"), JobSpec("h", {"a": 1}, queue="q", priority=2)])
    assert json.loads(text) == [
        {"handler": "h"},
        {"handler": "h", "payload": {"a": 1}, "queue": "q", "priority": 2},
    ]
    # as_json still spells every field out
    assert JobSpec("h").as_json() == {
        "handler": "h",
        "payload": {},
        "queue": "default",
        "priority": 0,
        "max_attempts": 5,
    }
    [plain, other] = client.enqueue_many(
        q.conn, [JobSpec("h"), JobSpec("h", {"a": 1}, queue="q", priority=2)], schema=q.schema
    )
    row = q.row(plain)
    assert (row["payload"], row["queue"], row["priority"], row["max_attempts"]) == (
        {},
        "default",
        0,
        5,
    )
    assert row["run_at"] == row["created_at"]
    assert q.row(other)["payload"] == {"a": 1}
    # ids in input order without dedupe keys too (the plain INSERT path), across queues
    specs = [JobSpec("h", {"n": n}, queue=f"q{n % 4}") for n in range(300)]
    ids = client.enqueue_many(q.conn, specs, schema=q.schema)
    assert [q.row(i)["payload"]["n"] for i in ids[::37]] == list(range(300))[::37]
    assert ids == sorted(ids)


def test_enqueue_many_refuses_an_unserialisable_payload_naming_the_job(q: Queue) -> None:
    with pytest.raises(InvalidJob, match="job 3: payload is not JSON-serialisable"):
        client.enqueue_many(
            q.conn,
            [JobSpec("h"), JobSpec("h", {"a": 1}), JobSpec("h", {"x": {1, 2}})],
            schema=q.schema,
        )
    with pytest.raises(InvalidJob, match="job 1: payload is not JSON-serialisable"):
        client.enqueue(q.conn, "h", {"x": float("nan")}, schema=q.schema)
    assert q.count() == 0


def test_sql_enqueue_notifies_and_dedupes_in_one_insert(q: Queue, test_db_dsn: str) -> None:
    with psycopg.connect(test_db_dsn, autocommit=True) as listener:
        # the enqueue channel older daemons listen to (this release's listen to the wake
        # channel: session_wake_listen)
        listener.execute(query("session_listen", q.schema))
        first = q.one("SELECT @schema@.enqueue('h', dedupe_key => 'k', queue => 'mail')")
        again = q.one("SELECT @schema@.enqueue('h', dedupe_key => 'k', queue => 'mail')")
        assert first == again and q.count() == 1
        got = {n.payload for n in listener.notifies(timeout=2.0, stop_after=1)}
        assert got == {"mail"}


def test_connect_prepares_only_when_asked(test_db_dsn: str) -> None:
    with connect(test_db_dsn) as plain, connect(test_db_dsn, prepare=True) as prepared:
        assert plain.prepare_threshold is None
        assert prepared.prepare_threshold is not None
    config = parse_config("[database]\nprepared_statements = false\n")
    assert config.database.prepared_statements is False
    assert parse_config("").database.prepared_statements is True
    with pytest.raises(ConfigError, match="prepared_statements: expected true or false"):
        parse_config('[database]\nprepared_statements = "no"\n')


def claim_query_as_prepared_statement(q: Queue) -> str:
    """The query inside the installed claim() function as a PREPARE of its own, arguments
    numbered in declaration order: plans made for it are the function's plans."""
    source, names = q.sql(
        "SELECT prosrc, proargnames FROM pg_proc WHERE oid = %s::regprocedure",
        [
            render(
                "@schema@.claim(text, text[], text[], float8[], integer[], integer, integer[])",
                q.schema,
            )
        ],
    )[0]
    body = source[source.index("RETURN QUERY") + len("RETURN QUERY") : source.rindex(";")]
    for n, name in enumerate(names[:7], 1):
        body = body.replace(f"claim.{name}", f"${n}")
    assert "claim." not in body
    return (
        "PREPARE claim_body(text, text[], text[], float8[], integer[], integer, integer[])"
        f" AS {body}"
    )


def test_the_claims_plan_settles_on_the_generic_plan(q: Queue) -> None:
    """PL/pgSQL keeps claim()'s plan in the session's plan cache: it must settle on the
    generic plan, or every claim is planned again (the planning cost more than running it)."""
    client.enqueue_many(q.conn, [JobSpec("h") for _ in range(500)], schema=q.schema)
    q.sql("VACUUM ANALYZE @schema@.jobs")
    q.sql(claim_query_as_prepared_statement(q))
    for _ in range(20):
        held = q.sql("EXECUTE claim_body('w', '{default}', '{h}', '{30}', '{10}', 10, '{NULL}')")
        assert len(held) == 10
        for job in held:
            assert leasing.complete(q.conn, "w", job[0], job[7], schema=q.schema)
    [(generic, custom)] = q.sql(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'claim_body'"
    )
    assert generic >= 10 and custom <= 5, (generic, custom)


def test_the_claim_never_pays_for_jit_compilation(q: Queue) -> None:
    """A large backlog makes the claim's estimated cost cross jit_above_cost; compiling it
    then took ~60 ms for a 0.2 ms statement. claim() runs with JIT off whatever the
    server's settings; the statement that calls it shows that JIT is otherwise on."""
    client.enqueue_many(q.conn, [JobSpec("h") for _ in range(20)], schema=q.schema)
    q.sql("SET jit = on")
    q.sql("SET jit_above_cost = 0")  # every plan would be compiled...
    q.sql("SET jit_optimize_above_cost = -1")
    q.sql("SET jit_inline_above_cost = -1")
    try:
        with explained(q.conn) as plans:
            assert len(q.claim(limit=5)) == 5
    finally:
        q.sql("RESET jit_above_cost")
    claim_plans = claim_statement(plans)
    callers = [p for p in plans if "jobs" not in relations(p["Plan"])]
    assert len(claim_plans) == 1 and callers, plans
    if not any("JIT" in p for p in callers):
        pytest.skip("this server has no JIT support (llvmjit not installed)")
    # none of the claim's statements (claim_jobs_v2's own included) is compiled
    compiled = [p for p in plans if "jobs" in relations(p["Plan"]) and "JIT" in p]
    assert compiled == [], json.dumps([p["Query Text"] for p in compiled])


def test_threads_sharing_a_connection_get_their_own_results(q: Queue) -> None:
    """The wrappers keep a cursor per connection and thread: threads sharing a connection
    must still each get the answer to their own statement."""
    import threading

    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for k in range(100):
                job_id = client.enqueue(q.conn, "h", {"t": n, "k": k}, schema=q.schema)
                assert q.row(job_id)["payload"] == {"t": n, "k": k}
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert q.count() == 400


def test_the_statuses_the_metrics_and_the_statement_texts_import_no_psycopg() -> None:
    """ops/metrics (and config, through queries) need the statuses and the schema name,
    not the database stack: importing them must not load psycopg (~0.2 s)."""
    code = (
        "import sys\n"
        "import pgworkerd.ops.metrics, pgworkerd.model, pgworkerd.queue.queries\n"
        "from pgworkerd.queue.queries import query\n"
        "assert query('job_claim', 'x').count('\"x\".') > 0\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'psycopg'))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert proc.stdout.strip() == "[]"


def test_enqueue_on_a_connection_whose_rows_are_dicts(test_db_dsn: str, schema: str) -> None:
    """The application's connection keeps its own row factory; enqueue reads its ids anyway."""
    with psycopg.connect(test_db_dsn, autocommit=True, row_factory=dict_row) as conn:
        one = client.enqueue(conn, "h", schema=schema)
        many = client.enqueue_many(conn, [JobSpec("h"), JobSpec("h")], schema=schema)
        with conn.pipeline():
            piped = client.enqueue(conn, "h", schema=schema)
        assert sorted([one, *many, piped]) == list(range(one, one + 4))
        assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}


def test_a_local_statement_timeout_bounds_the_transaction_only(conn: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.QueryCanceled), conn.transaction():
        session.set_local_statement_timeout(conn, 0.05)
        conn.execute("SELECT pg_sleep(5)")
    with conn.transaction():
        session.set_local_statement_timeout(conn, 30)
        assert conn.execute("SHOW statement_timeout").fetchone() == ("30s",)
    assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)


PACKAGE = Path(__file__).resolve().parents[2] / "pgworkerd"


def package_trees() -> Iterator[tuple[str, ast.AST]]:
    """Every module of the runtime package, throwaway-cluster tooling (devcluster/) aside."""
    for path in sorted(PACKAGE.rglob("*.py")):
        if "devcluster" not in path.parts:
            yield str(path.relative_to(PACKAGE)), ast.parse(path.read_text())


def test_every_statement_the_package_runs_comes_from_queries_sql() -> None:
    """No SQL text written in Python: what execute() (or psycopg's sql.SQL) is given is
    a statement looked up by name (or a migration file), never a literal or an f-string."""
    inline = []
    for name, tree in package_trees():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("execute", "executemany", "SQL")
                and node.args
                and isinstance(node.args[0], ast.Constant | ast.JoinedStr)
            ):
                inline.append(f"{name}:{node.lineno}: {ast.unparse(node.args[0])[:50]}")
    assert inline == []


def package_strings() -> set[str]:
    return {
        node.value
        for _, tree in package_trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }


# Statements the runtime package does not run, kept for the tests and benchmarks that do
# (tests/support/leasing.py; bench/queue_bench.py measures the one-job completion), and
# so held to the statement registry like every other.
TEST_AND_BENCH_STATEMENTS = {"job_complete_one", "session_listen"}


def test_every_named_statement_is_run_somewhere() -> None:
    named = [
        name
        for path in sorted((PACKAGE / "queue" / "sql" / "queries").glob("*.sql"))
        for name in re.findall(r"^-- name: (\w+)", path.read_text(), flags=re.MULTILINE)
    ]
    used = package_strings()
    assert len(named) == len(set(named))
    assert sorted(name for name in named if name not in used) == sorted(TEST_AND_BENCH_STATEMENTS)
    assert not TEST_AND_BENCH_STATEMENTS & used  # back in the package: off this list
