"""Finishing a claimed job from SQL (renew_lease, complete_job, fail_job, release_job,
snooze_job, give_up_job; one text per transition since migration 0025), as a worker in
another language would: each does to a job what the daemon's own statement does, returns
what it returns (by column name: fail and snooze give run_at and retry_in to both; README
"Finishing a claimed job from SQL"), refuses hostile arguments with a clear error and no
change, and changes nothing once the lease is lost."""

from __future__ import annotations

import dataclasses
import json
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

    def sql_record(self, text: str, params: tuple[Any, ...]) -> dict[str, Any] | None:
        """The one row of a function's result, by column name (None: no row)."""
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(render(text, self.schema), params)  # type: ignore[arg-type]
            rows = cur.fetchall()
        assert len(rows) <= 1
        return rows[0] if rows else None

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
    by_function = twins.sql_record(
        "SELECT * FROM @schema@.fail_job(%s, 'w1', %s, 'boom', 100, 3600, NULL, %s::jsonb)",
        (f.id, f.token, '{"at": 5}'),
    )
    assert by_function is not None
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
    assert failed is not None
    # The results agree: the same columns by name (the daemon's record is fail_job's row),
    # each the run_at it wrote and the retry_in that run_at is from the call's now().
    assert set(by_function) == set(dataclasses.asdict(failed))
    assert by_function["status"] == failed.status == ("pending" if attempts_left else "dead")
    twins.assert_same(ignore=("run_at_offset",))  # the backoff has random jitter
    assert (by_function["run_at"], failed.run_at) == (twins.run_at(f), twins.run_at(s))
    for retry_in in (by_function["retry_in"], failed.retry_in):
        if attempts_left:
            assert retry_in is not None and 70 <= retry_in <= 130
        else:
            assert retry_in is None
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
    by_function = twins.sql_record(
        "SELECT * FROM @schema@.snooze_job(%s, 'w1', %s, 600, 5, NULL, %s::jsonb)",
        (f.id, f.token, '{"at": 3}'),
    )
    assert by_function is not None
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
    assert snoozed is not None
    # the same columns by name (snooze_job leaves out the snooze count, which the daemon
    # logs), the same status, each its own run_at and the retry_in it is from now()
    assert set(by_function) == set(dataclasses.asdict(snoozed)) - {"snoozes"}
    assert (snoozed.status, by_function["status"]) == ("pending", "pending")
    assert (by_function["run_at"], snoozed.run_at) == (twins.run_at(f), twins.run_at(s))
    for retry_in in (by_function["retry_in"], snoozed.retry_in):
        assert retry_in is not None and 590 < retry_in <= 600
    twins.assert_same(ignore=("run_at_offset",))  # now() differs by the statements' gap
    for job in (f, s):
        state = twins.state(job)
        assert state["attempts"] == 0 and 590 < float(state["run_at_offset"]) < 610


def test_snooze_job_past_max_snoozes_is_a_failed_attempt(twins: Twins) -> None:
    f = twins.by_function
    [(status, _, retry_in)] = twins.sql(
        "SELECT * FROM @schema@.snooze_job(%s, 'w1', %s, 0, 0)", (f.id, f.token)
    )
    assert retry_in is not None and retry_in > 0  # fail_job's backoff (10 s ± 25 %)
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


def test_release_job_wakes_the_peers_that_serve_the_job(twins: Twins, test_db_dsn: str) -> None:
    """The wake-up of a released job is release_job's own: a worker in another language
    that hands a job back wakes the daemons as the daemon's own release does."""
    f = twins.by_function
    with psycopg.connect(test_db_dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{twins.schema}.wake"')
        twins.sql("SELECT @schema@.release_job(%s, 'w1', %s)", (f.id, f.token))
        got = [n.payload for n in listener.notifies(timeout=30, stop_after=1)]
    assert [json.loads(p) for p in got] == [{"q": "default", "h": "h", "id": f.id, "n": 1}]


# Hostile arguments: each call is refused with 22023 naming what is wrong, and changes
# nothing. (%s: the job's id, then its token.)
HOSTILE: dict[str, tuple[str, str]] = {
    "renew: NULL token": (
        "SELECT * FROM @schema@.renew_lease(%s, 'w1', NULL::bigint + 0 * %s, 60)",
        "tokens must give each job",
    ),
    "renew: negative lease": (
        "SELECT * FROM @schema@.renew_lease(%s, 'w1', %s, -5)",
        "lease_seconds must give each job its lease",
    ),
    "renew: zero lease": ("SELECT * FROM @schema@.renew_lease(%s, 'w1', %s, 0)", "lease_seconds"),
    "renew: absurd lease": (
        "SELECT * FROM @schema@.renew_lease(%s, 'w1', %s, 1e12)",
        "at most 100 years",
    ),
    "renew: infinite lease": (
        "SELECT * FROM @schema@.renew_lease(%s, 'w1', %s, 'infinity')",
        "lease_seconds",
    ),
    "renew: NaN lease": (
        "SELECT * FROM @schema@.renew_lease(%s, 'w1', %s, 'NaN')",
        "lease_seconds",
    ),
    "renew: NULL lease": (
        "SELECT * FROM @schema@.renew_lease(%s, 'w1', %s, NULL)",
        "lease_seconds",
    ),
    "renew: empty worker": ("SELECT * FROM @schema@.renew_lease(%s, '', %s, 60)", "worker must"),
    "renew many: empty arrays": (
        "SELECT * FROM @schema@.renew_leases('w1', '{}', '{}', '{}', '{}', '{}')"
        " WHERE %s::bigint IS NOT NULL AND %s::bigint IS NOT NULL",
        "ids must be a one-dimensional array of at least one job id",
    ),
    "renew many: unequal arrays": (
        "SELECT * FROM @schema@.renew_leases('w1', ARRAY[%s], ARRAY[%s, 1], '{60}', '{NULL}',"
        " '{NULL}')",
        "tokens must give each job",
    ),
    "renew many: NULL id": (
        "SELECT * FROM @schema@.renew_leases('w1', ARRAY[%s, NULL], ARRAY[%s, 1], '{60,60}',"
        " '{NULL,NULL}', '{NULL,NULL}')",
        "ids must not hold NULL",
    ),
    "renew many: huge arrays": (
        "SELECT * FROM @schema@.renew_leases('w1', array_fill(%s::bigint, '{100001}'),"
        " array_fill(%s::bigint, '{100001}'), array_fill(60::float8, '{100001}'),"
        " array_fill(NULL::jsonb, '{100001}'), array_fill(NULL::jsonb, '{100001}'))",
        "at most 100000 jobs at once",
    ),
    "renew many: 2-D arrays": (
        "SELECT * FROM @schema@.renew_leases('w1', ARRAY[[%s]], ARRAY[[%s]], '{{60}}',"
        " '{{NULL}}', '{{NULL}}')",
        "one-dimensional",
    ),
    "complete: NULL token": (
        "SELECT @schema@.complete_job(%s, 'w1', NULL::bigint + 0 * %s)",
        "tokens must give each job",
    ),
    "complete many: fewer results": (
        "SELECT * FROM @schema@.complete_jobs('w1', ARRAY[%s], ARRAY[%s], '{}', '{NULL}')",
        "every per-job array must have one element per job",
    ),
    "fail: NULL token": (
        "SELECT * FROM @schema@.fail_job(%s, 'w1', NULL::bigint + 0 * %s, 'x')",
        "token must be the lease_token",
    ),
    "fail: NULL worker": (
        "SELECT * FROM @schema@.fail_job(%s, NULL, %s, 'x')",
        "worker must name the worker",
    ),
    "fail: negative backoff": (
        "SELECT * FROM @schema@.fail_job(%s, 'w1', %s, 'x', -1)",
        "backoff_base and backoff_max must be seconds",
    ),
    "fail: infinite backoff": (
        "SELECT * FROM @schema@.fail_job(%s, 'w1', %s, 'x', 10, '-infinity')",
        "backoff_base and backoff_max",
    ),
    "release: NULL job": (
        "SELECT @schema@.release_job(NULL::bigint + 0 * %s, 'w1', %s)",
        "job_id must be the id",
    ),
    "snooze: NULL token": (
        "SELECT * FROM @schema@.snooze_job(%s, 'w1', NULL::bigint + 0 * %s, 5)",
        "token must be",
    ),
    "snooze: negative max_snoozes": (
        "SELECT * FROM @schema@.snooze_job(%s, 'w1', %s, 5, -1)",
        "max_snoozes must be 0 or more",
    ),
    "give up: NULL token": (
        "SELECT @schema@.give_up_job(%s, 'w1', NULL::bigint + 0 * %s, 'x')",
        "token must be",
    ),
    "cancel: NULL token": (
        "SELECT @schema@.cancel_held_job(%s, 'w1', NULL::bigint + 0 * %s, 'x')",
        "token must be",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_argument_is_refused_and_changes_nothing(twins: Twins, case: str) -> None:
    f = twins.by_function
    before = twins.state(f)
    text, message = HOSTILE[case]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message) as refused:
        twins.sql(text, (f.id, f.token))
    assert str(refused.value).startswith("pgworkerd: ")
    assert twins.state(f) == before
