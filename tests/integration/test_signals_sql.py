"""Durable waits in SQL (migration 0028), as the daemon and workers in other languages call
them: job_suspend (fenced), signal_send and signal_send_by_key(_v2), job_waits_expire.
Hostile input gets a clear error and changes nothing; a signal raced against a wait is
never lost, in either order; signals go with their job."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import leasing
import psycopg
import pytest
from psycopg.rows import dict_row

from pgworkerd import client, signals
from pgworkerd.queue import lease
from pgworkerd.queue.queries import render, wake_channel

SERVED = {"h": lease.HandlerCapacity(lease_seconds=60, free=100)}


def claim(conn: psycopg.Connection, schema: str, n: int = 1) -> list[lease.ClaimedJob]:
    return leasing.claim(conn, "w1", queues=["default"], handlers=SERVED, limit=n, schema=schema)


def row(conn: psycopg.Connection, schema: str, job_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(
            render("SELECT *, status::text AS status FROM @schema@.jobs WHERE id = %s", schema),
            (job_id,),
        ).fetchone()
    assert found is not None
    return found


def signal_rows(conn: psycopg.Connection, schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        render("SELECT job_id, name, payload FROM @schema@.signals ORDER BY 1, 2", schema)
    ).fetchall()


def suspend(
    conn: psycopg.Connection, schema: str, job: lease.ClaimedJob, name: str = "go", **kw: Any
) -> lease.SuspendOutcome | None:
    return lease.suspend(
        conn, "w1", job.id, job.token, name, kw.pop("timeout", 3600.0), schema=schema, **kw
    )


def test_suspend_then_signal_then_the_claim_reads_what_woke_it(
    conn: psycopg.Connection, schema: str
) -> None:
    job_id = client.enqueue(conn, "h", {}, max_attempts=1, schema=schema)
    [job] = claim(conn, schema)
    done = suspend(conn, schema, job, checkpoint={"at": 3}, progress={"p": 1})
    assert done is not None and done.status == "suspended" and done.problem is None
    r = row(conn, schema, job_id)
    assert (r["status"], r["attempts"], r["locked_by"], r["checkpoint"]) == (
        "suspended",
        0,
        None,
        {"at": 3},
    )
    assert claim(conn, schema) == []  # the claim never takes a suspended job
    # the fence: a second suspend under the same (now spent) lease changes nothing
    assert suspend(conn, schema, job) is None

    sent = signals.signal(conn, job_id, "go", {"ok": 1}, schema=schema)
    assert (sent.job_id, sent.outcome, sent.status) == (job_id, "resumed", "pending")
    [again] = claim(conn, schema)  # the claim returns what woke it (claim_jobs_v3)
    assert again.id == job_id and again.attempt == 1 and again.checkpoint == {"at": 3}
    assert (again.wait_for, again.wait_ended, again.signal_payload) == ("go", "signal", {"ok": 1})
    assert again.woken is not None and again.signal_sent_at is not None
    assert again.woken["name"] == "go" and again.woken["ended"] == "signal"
    assert again.woken["payload"] == {"ok": 1}
    assert again.woken["sent_at"] == again.signal_sent_at.isoformat()


def test_jobs_that_never_waited_are_claimed_with_no_wakeup(
    conn: psycopg.Connection, schema: str
) -> None:
    for _ in range(3):
        client.enqueue(conn, "h", {}, schema=schema)
    claimed = claim(conn, schema, 3)
    assert len(claimed) == 3
    for job in claimed:
        assert job.woken is None
        assert (job.wait_for, job.wait_ended, job.signal_payload, job.signal_sent_at) == (
            (None,) * 4
        )


def test_a_signal_before_the_wait_makes_the_wait_return_at_once(
    conn: psycopg.Connection, schema: str
) -> None:
    job_id = client.enqueue(conn, "h", {}, schema=schema)
    assert signals.signal(conn, job_id, "go", [1], schema=schema).outcome == "kept"
    # first write wins
    dup = signals.signal(conn, job_id, "go", [2], schema=schema)
    assert (dup.outcome, dup.status) == ("ignored", "pending")
    [job] = claim(conn, schema)
    with conn.cursor() as cur:
        cur.execute(f'LISTEN "{wake_channel(schema)}"')
    done = suspend(conn, schema, job)
    assert done is not None and done.status == "pending"
    notes = list(conn.notifies(timeout=5, stop_after=1))
    assert notes and f'"id" : {job_id}' in notes[0].payload
    r = row(conn, schema, job_id)
    assert (r["status"], r["wait_ended"], r["attempts"]) == ("pending", "signal", 0)
    [again] = claim(conn, schema)
    assert again.woken is not None and again.woken["payload"] == [1]


def test_a_timed_out_wait_is_made_pending_by_the_sweep_without_a_signal(
    conn: psycopg.Connection, schema: str
) -> None:
    job_id = client.enqueue(conn, "h", {}, schema=schema)
    other = client.enqueue(conn, "h", {}, schema=schema)
    one, two = claim(conn, schema, 2)
    suspend(conn, schema, one, timeout=0.2)
    suspend(conn, schema, two, timeout=3600)
    time.sleep(0.3)
    assert lease.waits_expire(conn, schema=schema) == 1
    assert lease.waits_expire(conn, schema=schema) == 0
    r = row(conn, schema, job_id)
    assert (r["status"], r["wait_ended"]) == ("pending", "timeout")
    assert row(conn, schema, other)["status"] == "suspended"
    [again] = claim(conn, schema)
    assert again.woken == {"name": "go", "ended": "timeout", "payload": None, "sent_at": None}
    # a signal after the timeout is kept (the job is pending, not waiting)
    assert signals.signal(conn, job_id, "go", schema=schema).outcome == "kept"


def test_a_cancel_requested_while_running_cancels_a_job_that_asks_to_wait(
    conn: psycopg.Connection, schema: str
) -> None:
    job_id = client.enqueue(conn, "h", {}, schema=schema)
    [job] = claim(conn, schema)
    conn.execute(
        render("UPDATE @schema@.jobs SET cancel_requested = true WHERE id = %s", schema),
        (job_id,),
    )
    done = suspend(conn, schema, job)
    assert done is not None and done.status == "cancelled"
    assert row(conn, schema, job_id)["finished_at"] is not None


def test_a_suspended_job_can_be_cancelled(conn: psycopg.Connection, schema: str) -> None:
    from pgworkerd.queue import admin

    job_id = client.enqueue(conn, "h", {}, schema=schema)
    [job] = claim(conn, schema)
    suspend(conn, schema, job)
    assert admin.cancel(conn, [job_id], schema=schema)[job_id] == "cancelled"
    with pytest.raises(signals.SignalRefused, match="is cancelled: a finished job takes no"):
        signals.signal(conn, job_id, "go", schema=schema)


def test_hostile_signals_are_refused_with_a_clear_error_and_change_nothing(
    conn: psycopg.Connection, schema: str
) -> None:
    job_id = client.enqueue(conn, "h", {}, schema=schema)
    done = client.enqueue(conn, "h", {}, schema=schema)
    conn.execute(
        render(
            "UPDATE @schema@.jobs SET status = 'completed', finished_at = now() WHERE id = %s",
            schema,
        ),
        (done,),
    )
    before = (row(conn, schema, job_id), signal_rows(conn, schema))
    deep: Any = 1
    for _ in range(300):
        deep = [deep]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"job_id": job_id + 1000, "name": "go"}, f"no job {job_id + 1000}"),
        ({"job_id": done, "name": "go"}, f"job {done} is completed: a finished job takes no"),
        ({"job_id": job_id, "name": ""}, "signal name must be a non-empty string"),
        ({"job_id": job_id, "name": "a\x07b"}, "signal name must not contain control"),
        ({"job_id": job_id, "name": " go"}, "must not begin or end with whitespace"),
        ({"job_id": job_id, "name": "n" * 129}, "at most 128 characters"),
        ({"job_id": job_id, "name": "go", "payload": {"a": "x\x00y"}}, "NUL character"),
        ({"job_id": job_id, "name": "go", "payload": deep}, "nested at most 255 levels"),
        ({"job_id": job_id, "name": "go", "payload": float("nan")}, "cannot be stored as JSON"),
        ({"job_id": None, "name": "go", "key": "k\n"}, "correlation key must not contain"),
        ({"job_id": job_id, "name": "go", "key": "both"}, "either a job id or a correlation"),
    ]
    for kw, message in cases:
        with pytest.raises(signals.SignalRefused, match=message):
            signals.signal(
                conn, kw["job_id"], kw["name"], kw.get("payload"), key=kw.get("key"), schema=schema
            )
    # straight to SQL too: the function refuses what Python did not check first
    for text, params, message in (
        ("SELECT * FROM @schema@.signal_send(%s, %s)", (job_id, "a\tb"), "a signal name must"),
        ("SELECT * FROM @schema@.signal_send(%s, %s)", (None, "go"), "job_id must be a job id"),
        ("SELECT * FROM @schema@.signal_send(%s, NULL)", (job_id,), "a signal name must"),
        (
            "SELECT * FROM @schema@.signal_send(%s, 'go', repeat('[', 300)::text::jsonb)",
            (job_id,),
            None,
        ),
        ("SELECT * FROM @schema@.signal_send_by_key(NULL, 'go')", (), "a correlation key must"),
    ):
        if message is None:
            continue  # (jsonb refuses that text itself)
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            conn.execute(render(text, schema), params)
    deep_sql = "SELECT * FROM @schema@.signal_send(%s, 'go', %s::jsonb)"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="nested at most 255"):
        conn.execute(render(deep_sql, schema), (job_id, "[" * 300 + "]" * 300))
    with pytest.raises(psycopg.errors.UntranslatableCharacter):
        conn.execute(render(deep_sql, schema), (job_id, '{"a": "\\u0000"}'))
    assert (row(conn, schema, job_id), signal_rows(conn, schema)) == before


def test_a_signal_payload_over_64_mib_is_refused_and_changes_nothing(
    conn: psycopg.Connection, schema: str
) -> None:
    """The payload bound (enqueue's: 64 MiB): Python refuses before any round trip, by id
    and by key; signal_send refuses it too (a caller of SQL); the job, waiting for the
    signal, stays suspended without it."""
    job_id = client.enqueue(conn, "h", {}, schema=schema)
    [job] = claim(conn, schema)
    assert suspend(conn, schema, job) is not None
    before = (row(conn, schema, job_id), signal_rows(conn, schema))
    huge = "x" * (64 * 1024 * 1024)  # 64 MiB of text; as JSON, two quotes more
    for target, key in ((job_id, None), (None, "order-1")):
        with pytest.raises(signals.SignalRefused, match="signal payload must be at most 64 MiB"):
            signals.signal(conn, target, "go", huge, key=key, schema=schema)
    del huge
    text = "SELECT * FROM @schema@.signal_send(%s, 'go', jsonb_build_array(repeat('x', %s)))"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="at most 64 MiB, not"):
        conn.execute(render(text, schema), (job_id, 64 * 1024 * 1024))
    assert (row(conn, schema, job_id), signal_rows(conn, schema)) == before
    assert before[0]["status"] == "suspended"


def test_job_suspend_refuses_hostile_arguments_and_a_key_claimed_twice(
    conn: psycopg.Connection, schema: str
) -> None:
    first = client.enqueue(conn, "h", {}, schema=schema)
    second = client.enqueue(conn, "h", {}, schema=schema)
    one, two = claim(conn, schema, 2)
    text = "SELECT * FROM @schema@.job_suspend(%s, %s, %s, %s, %s, %s)"
    for args, message in (
        ((one.id, "w1", one.token, "go", 0.0, None), "timeout_seconds must be above 0"),
        ((one.id, "w1", one.token, "go", float("nan"), None), "not NaN"),
        ((one.id, "w1", one.token, "go", 31622401.0, None), "at most 31622400"),
        ((one.id, "w1", one.token, "go", None, None), "not NULL"),
        ((one.id, "w1", one.token, "a\nb", 10.0, None), "signal_name must be"),
        ((one.id, "w1", one.token, None, 10.0, None), "signal_name must be"),
        ((one.id, "w1", one.token, "go", 10.0, "k\x01"), "wait_key must be NULL or"),
        ((one.id, "", one.token, "go", 10.0, None), "worker must name the worker"),
        ((one.id, "w1", None, "go", 10.0, None), "token must be the lease_token"),
    ):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            conn.execute(render(text, schema), args)
    assert row(conn, schema, first)["status"] == "running"
    # a lost lease: no row, nothing changed
    assert (
        conn.execute(render(text, schema), (one.id, "w2", one.token, "go", 10.0, None)).fetchall()
        == []
    )

    held = suspend(conn, schema, one, key="order-42")
    assert held is not None and held.status == "suspended"
    refused = suspend(conn, schema, two, key="order-42")
    assert refused is not None and refused.status == "refused"
    assert refused.problem == (
        f"WaitFor: correlation key 'order-42' is held by live job {first} (a key names one "
        "live job)"
    )
    r = row(conn, schema, second)
    assert (r["status"], r["wait_key"], r["attempts"]) == ("running", None, 1)
    # by key: reaches the job that holds it
    sent = signals.signal(conn, None, "go", {"n": 1}, key="order-42", schema=schema)
    assert (sent.job_id, sent.outcome) == (first, "resumed")


@pytest.mark.parametrize("signal_first", [True, False])
def test_a_signal_raced_against_the_wait_is_never_lost(
    conn: psycopg.Connection, schema: str, test_db_dsn: str, signal_first: bool
) -> None:
    """Rounds of job_suspend and signal_send of the same job at once, one side given a head
    start each round: whichever commits first, the job ends pending with the signal
    (never suspended with its signal present, never lost)."""
    rounds = 60
    ids = [client.enqueue(conn, "h", {}, schema=schema) for _ in range(rounds)]
    jobs = claim(conn, schema, rounds)
    assert sorted(j.id for j in jobs) == sorted(ids)
    rng = random.Random(7)
    with (
        psycopg.connect(test_db_dsn, autocommit=True) as a,
        psycopg.connect(test_db_dsn, autocommit=True) as b,
    ):
        for job in jobs:
            go = threading.Barrier(2)
            lead = rng.uniform(0, 0.003)
            errors: list[BaseException] = []

            def waiter(
                job: lease.ClaimedJob = job,
                go: threading.Barrier = go,
                lead: float = lead,
                errors: list[BaseException] = errors,
            ) -> None:
                try:
                    go.wait()
                    if not signal_first:
                        time.sleep(lead)
                    suspend(a, schema, job)
                except BaseException as exc:  # reported below
                    errors.append(exc)

            t = threading.Thread(target=waiter)
            t.start()
            go.wait()
            if signal_first:
                time.sleep(lead)
            sent = signals.signal(b, job.id, "go", job.id, schema=schema)
            t.join()
            assert not errors, errors
            assert sent.outcome in ("kept", "resumed")
            r = row(conn, schema, job.id)
            assert (r["status"], r["wait_ended"]) == ("pending", "signal"), (job.id, sent)


def test_signals_go_with_their_job(conn: psycopg.Connection, schema: str) -> None:
    kept = client.enqueue(conn, "h", {}, schema=schema)
    gone = client.enqueue(conn, "h", {}, schema=schema)
    for job_id in (kept, gone):
        signals.signal(conn, job_id, "a", schema=schema)
        signals.signal(conn, job_id, "b", schema=schema)
    conn.execute(render("DELETE FROM @schema@.jobs WHERE id = %s", schema), (gone,))
    assert [r[0] for r in signal_rows(conn, schema)] == [kept, kept]
    conn.execute(render("TRUNCATE @schema@.jobs", schema))
    assert signal_rows(conn, schema) == []


# -- signals by key before the wait (0032: parked_signals) ----------------------------------


def parked(conn: psycopg.Connection, schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        render(
            "SELECT wait_key, name, payload, sent_by FROM @schema@.parked_signals ORDER BY 1, 2",
            schema,
        )
    ).fetchall()


def test_a_signal_by_key_before_the_wait_is_parked_and_handed_to_the_wait(
    conn: psycopg.Connection, schema: str
) -> None:
    job_id = client.enqueue(conn, "h", {}, schema=schema)
    [job] = claim(conn, schema)
    sent = signals.signal(conn, None, "go", {"by": "ana"}, key="order-7", schema=schema)
    assert (sent.job_id, sent.outcome, sent.status) == (None, "parked", None)
    # first write wins under the key too: a second one of the name is ignored
    again = signals.signal(conn, None, "go", {"by": "bob"}, key="order-7", schema=schema)
    assert (again.job_id, again.outcome, again.sent_at) == (None, "ignored", sent.sent_at)
    other = signals.signal(conn, None, "later", 5, key="order-7", schema=schema)
    assert other.outcome == "parked"
    assert row(conn, schema, job_id)["status"] == "running"  # no job was touched
    done = suspend(conn, schema, job, key="order-7")
    # the wait returns at once: the job is pending with the parked signal, which is its own
    assert done is not None and (done.status, done.problem) == ("pending", None)
    r = row(conn, schema, job_id)
    assert (r["status"], r["wait_ended"], r["wait_key"]) == ("pending", "signal", "order-7")
    assert signal_rows(conn, schema) == [(job_id, "go", {"by": "ana"}), (job_id, "later", 5)]
    assert parked(conn, schema) == []
    [again] = claim(conn, schema)
    # the claim itself carries what woke it (claim_jobs_v3)
    assert again.id == job_id and again.woken is not None
    assert (again.woken["name"], again.woken["payload"]) == ("go", {"by": "ana"})
    # the job holds the key now: a signal by key reaches it, as by id
    kept = signals.signal(conn, None, "more", key="order-7", schema=schema)
    assert (kept.job_id, kept.outcome) == (job_id, "kept")


def test_the_jobs_own_signal_wins_over_a_parked_one_and_old_ones_are_not_handed_over(
    conn: psycopg.Connection, schema: str
) -> None:
    job_id = client.enqueue(conn, "h", {}, schema=schema)
    [job] = claim(conn, schema)
    assert signals.signal(conn, None, "go", "parked", key="k1", schema=schema).outcome == "parked"
    assert signals.signal(conn, job_id, "go", "by id", schema=schema).outcome == "kept"
    # a parked signal past its 7 days is neither handed over nor kept by the sweep
    signals.signal(conn, None, "stale", "old", key="k1", schema=schema)
    conn.execute(
        render(
            "UPDATE @schema@.parked_signals SET sent_at = now() - interval '7 days 1 second' "
            "WHERE name = 'stale'",
            schema,
        )
    )
    done = suspend(conn, schema, job, "stale", key="k1")
    assert done is not None and done.status == "suspended"
    assert signal_rows(conn, schema) == [(job_id, "go", "by id")]
    assert [p[1] for p in parked(conn, schema)] == ["stale"]
    assert lease.waits_expire(conn, schema=schema) == 0
    assert parked(conn, schema) == []
    # (the sender may park the name again: the old one is gone)


def test_parked_signals_are_bounded_per_key_and_a_refusal_changes_nothing(
    conn: psycopg.Connection, schema: str
) -> None:
    for n in range(16):
        assert signals.signal(conn, None, f"s{n}", n, key="full", schema=schema).outcome == "parked"
    before = parked(conn, schema)
    with pytest.raises(signals.SignalRefused, match="at most 16 names per key"):
        signals.signal(conn, None, "s16", key="full", schema=schema)
    big = "x" * (600 * 1024)
    assert signals.signal(conn, None, "a", big, key="big", schema=schema).outcome == "parked"
    with pytest.raises(signals.SignalRefused, match=r"at most 1 MiB per key"):
        signals.signal(conn, None, "b", big, key="big", schema=schema)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="nested at most 255 levels"):
        conn.execute(
            render("SELECT * FROM @schema@.signal_send_by_key_v2('k', 'n', %s::jsonb)", schema),
            ("[" * 300 + "]" * 300,),
        )
    conn.rollback()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="a signal name must"):
        conn.execute(render("SELECT * FROM @schema@.signal_send_by_key_v2('k', 'a\tb')", schema))
    conn.rollback()
    assert [p for p in parked(conn, schema) if p[0] == "full"] == before


def test_the_old_signal_by_key_still_refuses_a_key_no_live_job_holds(
    conn: psycopg.Connection, schema: str
) -> None:
    """signal_send_by_key (compat.sql) keeps its meaning for older code."""
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="no live job waits with"):
        conn.execute(render("SELECT * FROM @schema@.signal_send_by_key('nobody', 'go')", schema))
    conn.rollback()
    assert parked(conn, schema) == []


@pytest.mark.parametrize("signal_first", [True, False])
def test_a_signal_by_key_raced_against_the_wait_with_that_key_is_never_lost(
    conn: psycopg.Connection, schema: str, test_db_dsn: str, signal_first: bool
) -> None:
    """Rounds of job_suspend(key=K) and a signal by K at once, one side given a head start
    each round: whichever commits first, the job ends pending with the signal, and nothing
    stays parked (never suspended with its signal parked, never lost)."""
    rounds = 60
    ids = [client.enqueue(conn, "h", {}, schema=schema) for _ in range(rounds)]
    jobs = claim(conn, schema, rounds)
    assert sorted(j.id for j in jobs) == sorted(ids)
    rng = random.Random(11)
    outcomes: set[str] = set()
    with (
        psycopg.connect(test_db_dsn, autocommit=True) as a,
        psycopg.connect(test_db_dsn, autocommit=True) as b,
    ):
        for job in jobs:
            go = threading.Barrier(2)
            lead = rng.uniform(0, 0.003)
            errors: list[BaseException] = []

            def waiter(
                job: lease.ClaimedJob = job,
                go: threading.Barrier = go,
                lead: float = lead,
                errors: list[BaseException] = errors,
            ) -> None:
                try:
                    go.wait()
                    if signal_first:
                        time.sleep(lead)
                    suspend(a, schema, job, key=f"key-{job.id}")
                except BaseException as exc:  # reported below
                    errors.append(exc)

            t = threading.Thread(target=waiter)
            t.start()
            go.wait()
            if not signal_first:
                time.sleep(lead)
            sent = signals.signal(b, None, "go", job.id, key=f"key-{job.id}", schema=schema)
            t.join()
            assert not errors, errors
            outcomes.add(sent.outcome)
            assert sent.outcome in ("parked", "resumed"), sent
            r = row(conn, schema, job.id)
            assert (r["status"], r["wait_ended"]) == ("pending", "signal"), (job.id, sent)
            assert parked(conn, schema) == [], (job.id, sent)
    assert (job.id, "go", job.id) in signal_rows(conn, schema)
    assert len(signal_rows(conn, schema)) == rounds
