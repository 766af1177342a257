"""Finishing a claimed job from SQL (migrations 0005, 0011 and 0019: renew_lease,
complete_job, fail_job, release_job, snooze_job, give_up_job), as a worker in another
language would: each does to a job what the daemon's own statement does, returns what it
returns (the daemon's retry_in aside: README "Finishing a claimed job from SQL"), and
changes nothing once the lease is lost."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import leasing
import psycopg
import pytest
from psycopg.rows import dict_row

from pgworkerd import client
from pgworkerd.queue import lease
from pgworkerd.queue.queries import render

# What a finishing statement leaves in the row (run_at and timestamps compared apart).
COMPARED = (
    "status::text AS status, attempts, last_error, result, progress, checkpoint, locked_by,"
    " cancel_requested, finished_at IS NULL AS unfinished, locked_until IS NULL AS unleased,"
    " extract(epoch FROM run_at - created_at) AS run_at_offset"
)


class Twins:
    """Two equal jobs claimed by worker w1: one finished by the SQL function, the other
    by the daemon's statement."""

    def __init__(self, conn: psycopg.Connection, schema: str) -> None:
        self.conn, self.schema = conn, schema
        for n in range(2):
            client.enqueue(conn, "h", {"n": n}, max_attempts=2, schema=schema)
        served = {"h": lease.HandlerCapacity(lease_seconds=60, free=2)}
        self.by_function, self.by_statement = leasing.claim(
            conn, "w1", queues=["default"], handlers=served, limit=2, schema=schema
        )

    def sql(self, text: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        cur = self.conn.execute(render(text, self.schema), params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []

    def state(self, job: lease.ClaimedJob) -> dict[str, Any]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            row = cur.execute(
                render(f"SELECT {COMPARED} FROM @schema@.jobs WHERE id = %s", self.schema),
                (job.id,),
            ).fetchone()
        assert row is not None
        return row

    def run_at(self, job: lease.ClaimedJob) -> Any:
        [(run_at,)] = self.sql("SELECT run_at FROM @schema@.jobs WHERE id = %s", (job.id,))
        return run_at

    def assert_same(self, *, ignore: tuple[str, ...] = ()) -> None:
        a, b = self.state(self.by_function), self.state(self.by_statement)
        for key in ignore:
            a.pop(key), b.pop(key)
        assert a == b


@pytest.fixture
def twins(conn: psycopg.Connection, schema: str) -> Twins:
    return Twins(conn, schema)


def test_complete_job(twins: Twins) -> None:
    f, s = twins.by_function, twins.by_statement
    assert twins.sql(
        "SELECT @schema@.complete_job(%s, 'w1', %s, %s::jsonb, %s::jsonb)",
        (f.id, f.token, '{"ok": 1}', '{"p": 9}'),
    ) == [(True,)]
    assert leasing.complete(
        twins.conn, "w1", s.id, s.token, {"ok": 1}, progress={"p": 9}, schema=twins.schema
    )
    twins.assert_same()
    assert twins.state(f)["status"] == "completed"


def test_renew_lease(twins: Twins) -> None:
    f, s = twins.by_function, twins.by_statement
    [(cancel, until)] = twins.sql(
        "SELECT * FROM @schema@.renew_lease(%s, 'w1', %s, 300, %s::jsonb, %s::jsonb)",
        (f.id, f.token, '{"step": 2}', '{"at": 2}'),
    )
    assert cancel is False and until > f.locked_until
    [renewed] = lease.renew(
        twins.conn,
        "w1",
        [lease.Lease(s.id, s.token, 300, {"step": 2}, {"at": 2})],
        schema=twins.schema,
    )
    assert renewed.renewed
    twins.assert_same()


@pytest.mark.parametrize("attempts_left", [True, False], ids=["retried", "dead"])
def test_fail_job(twins: Twins, attempts_left: bool) -> None:
    f, s = twins.by_function, twins.by_statement
    if not attempts_left:
        twins.sql("UPDATE @schema@.jobs SET max_attempts = 1 WHERE id IN (%s, %s)", (f.id, s.id))
    [(status, run_at)] = twins.sql(
        "SELECT * FROM @schema@.fail_job(%s, 'w1', %s, 'boom', 100, 3600, NULL, %s::jsonb)",
        (f.id, f.token, '{"at": 5}'),
    )
    failed = lease.fail(
        twins.conn,
        "w1",
        s.id,
        s.token,
        "boom",
        backoff_base=100,
        backoff_max=3600,
        checkpoint={"at": 5},
        schema=twins.schema,
    )
    assert failed is not None and failed.status == status
    assert status == ("pending" if attempts_left else "dead")
    twins.assert_same(ignore=("run_at_offset",))  # the backoff has random jitter
    # The results agree too: each returns the run_at it wrote; the daemon's retry_in is
    # that run_at as seconds from the statement's now(), which a SQL worker computes.
    assert (run_at, failed.run_at) == (twins.run_at(f), twins.run_at(s))
    if attempts_left:
        assert failed.retry_in is not None and 70 <= failed.retry_in <= 130
    else:
        assert failed.retry_in is None
    offsets = [twins.state(j)["run_at_offset"] for j in (f, s)]
    if attempts_left:  # 100 s ± 25 % after the failure
        assert all(70 <= float(o) <= 130 for o in offsets), offsets


def test_release_job(twins: Twins) -> None:
    f, s = twins.by_function, twins.by_statement
    assert twins.sql(
        "SELECT @schema@.release_job(%s, 'w1', %s, NULL, %s::jsonb)",
        (f.id, f.token, '{"at": 7}'),
    ) == [("pending",)]
    assert (
        lease.release(twins.conn, "w1", s.id, s.token, checkpoint={"at": 7}, schema=twins.schema)
        == "pending"
    )
    twins.assert_same()
    assert twins.state(f)["attempts"] == 0


CALLS: dict[str, tuple[str, Callable[[list[tuple[Any, ...]]], bool]]] = {
    "renew_lease": ("SELECT * FROM @schema@.renew_lease(%s, %s, %s, 60)", lambda r: r == []),
    "complete_job": ("SELECT @schema@.complete_job(%s, %s, %s)", lambda r: r == [(False,)]),
    "fail_job": ("SELECT * FROM @schema@.fail_job(%s, %s, %s, 'x')", lambda r: r == []),
    "release_job": ("SELECT @schema@.release_job(%s, %s, %s)", lambda r: r == [(None,)]),
}


@pytest.mark.parametrize("function", list(CALLS))
@pytest.mark.parametrize("who", ["stale token", "other worker"])
def test_a_lost_lease_changes_nothing_and_says_so(twins: Twins, function: str, who: str) -> None:
    job = twins.by_function
    before = twins.state(job)
    worker, token = ("w1", job.token - 1) if who == "stale token" else ("w2", job.token)
    text, lost = CALLS[function]
    assert lost(twins.sql(text, (job.id, worker, token)))
    assert twins.state(job) == before


# -- the outcomes a handler chooses (schema 11) --------------------------------------------


def test_snooze_job(twins: Twins) -> None:
    f, s = twins.by_function, twins.by_statement
    [(status, run_at)] = twins.sql(
        "SELECT * FROM @schema@.snooze_job(%s, 'w1', %s, 600, 5, NULL, %s::jsonb)",
        (f.id, f.token, '{"at": 3}'),
    )
    snoozed = lease.snooze(
        twins.conn,
        "w1",
        s.id,
        s.token,
        600,
        max_snoozes=5,
        checkpoint={"at": 3},
        schema=twins.schema,
    )
    assert snoozed is not None and (snoozed.status, status) == ("pending", "pending")
    assert (run_at, snoozed.run_at) == (twins.run_at(f), twins.run_at(s))
    assert snoozed.retry_in is not None and 590 < snoozed.retry_in <= 600
    twins.assert_same(ignore=("run_at_offset",))  # now() differs by the statements' gap
    for job in (f, s):
        state = twins.state(job)
        assert state["attempts"] == 0 and 590 < float(state["run_at_offset"]) < 610


def test_snooze_job_past_max_snoozes_is_a_failed_attempt(twins: Twins) -> None:
    f = twins.by_function
    [(status, _)] = twins.sql(
        "SELECT * FROM @schema@.snooze_job(%s, 'w1', %s, 0, 0)", (f.id, f.token)
    )
    state = twins.state(f)
    assert (status, state["attempts"]) == ("pending", 1)
    assert state["last_error"].startswith("snoozed 0 times already (max_snoozes)")


@pytest.mark.parametrize("delay", ["-1", "2592001", "'NaN'", "NULL"])
def test_snooze_job_refuses_a_bad_delay(twins: Twins, delay: str) -> None:
    f = twins.by_function
    before = twins.state(f)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="a snooze must be"):
        twins.sql(f"SELECT * FROM @schema@.snooze_job(%s, 'w1', %s, {delay})", (f.id, f.token))
    assert twins.state(f) == before


def test_give_up_job(twins: Twins) -> None:
    f, s = twins.by_function, twins.by_statement
    assert twins.sql(
        "SELECT @schema@.give_up_job(%s, 'w1', %s, 'customer deleted')", (f.id, f.token)
    ) == [(True,)]
    assert lease.bury(twins.conn, "w1", s.id, s.token, "customer deleted", schema=twins.schema)
    twins.assert_same()
    assert twins.state(f)["status"] == "dead"


@pytest.mark.parametrize(
    "call",
    [
        "SELECT * FROM @schema@.snooze_job(%s, %s, %s, 60)",
        "SELECT @schema@.give_up_job(%s, %s, %s, 'x')",
    ],
)
def test_a_lost_lease_snoozes_and_gives_up_nothing(twins: Twins, call: str) -> None:
    f = twins.by_function
    before = twins.state(f)
    rows = twins.sql(call, (f.id, "w1", f.token + 1))
    assert rows in ([], [(False,)])
    assert twins.state(f) == before
