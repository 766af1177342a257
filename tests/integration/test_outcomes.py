"""Recording outcomes (pgworkerd.queue.finish.record, reported by daemon.outcomes.report,
as the daemon's Statements runs them) against real PostgreSQL: a write repeated
because the reply to the first was lost is reported as recorded, not as fenced off; an
outcome of a lease that was really lost is fenced off, burial included."""

from __future__ import annotations

import logging

import leasing
import psycopg
import pytest

from pgworkerd import client
from pgworkerd.config import HandlerConfig
from pgworkerd.daemon import outcomes
from pgworkerd.daemon.outcomes import Outcome
from pgworkerd.queue import admin, finish, lease
from pgworkerd.queue.lease import HandlerCapacity

HANDLER = HandlerConfig(name="h", target="jobhandlers:work")


def claim(
    conn: psycopg.Connection, schema: str, worker: str, lease_seconds: float = 30.0
) -> lease.ClaimedJob:
    [job] = leasing.claim(
        conn,
        worker,
        queues=["default"],
        handlers={"h": HandlerCapacity(lease_seconds=lease_seconds, free=1)},
        limit=1,
        schema=schema,
    )
    return job


def write(conn: psycopg.Connection, schema: str, worker: str, outcome: Outcome) -> None:
    recorded = finish.record(conn, worker, [outcome.write()], schema=schema)
    outcomes.report([outcome], recorded)


def expire_lease(conn: psycopg.Connection, schema: str, job_id: int) -> None:
    conn.execute(
        f"UPDATE \"{schema}\".jobs SET locked_until = now() - interval '1 second' WHERE id = %s",
        [job_id],
    )


@pytest.mark.parametrize("kind", ["complete", "fail", "release", "cancel", "snooze", "give up"])
def test_an_outcome_written_again_is_already_recorded_not_fenced(
    conn: psycopg.Connection, schema: str, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    client.enqueue(conn, "h", schema=schema)
    job = claim(conn, schema, "w1")
    outcome = Outcome(job, HANDLER, kind, 0.5, error="" if kind == "complete" else "boom")
    caplog.set_level(logging.INFO, logger="pgworkerd")
    write(conn, schema, "w1", outcome)
    before = admin.get(conn, job.id, schema=schema)
    write(conn, schema, "w1", outcome)  # the first reply was lost: the daemon writes again
    assert admin.get(conn, job.id, schema=schema) == before  # nothing changed twice
    messages = [r.getMessage() for r in caplog.records]
    assert messages[-1] == f"job {job.id} h attempt 1: {kind} already recorded by an earlier write"
    assert not any("fenced off" in m for m in messages), messages


def test_an_outcome_after_the_job_was_re_claimed_is_fenced_off(
    conn: psycopg.Connection, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    client.enqueue(conn, "h", schema=schema)
    old = claim(conn, schema, "w1")
    expire_lease(conn, schema, old.id)
    new = claim(conn, schema, "w2")
    assert (new.id, new.rescued) == (old.id, True)
    caplog.set_level(logging.INFO, logger="pgworkerd")
    write(conn, schema, "w1", Outcome(old, HANDLER, "complete", 0.5))
    assert "outcome complete rejected" in caplog.records[-1].getMessage()
    assert admin.get(conn, old.id, schema=schema)["locked_by"] == "w2"


@pytest.mark.parametrize("kind", ["complete", "fail", "release", "cancel", "snooze", "give up"])
@pytest.mark.parametrize("cancel_requested", [False, True], ids=["dead", "cancelled"])
def test_an_outcome_after_burial_is_fenced_off(
    conn: psycopg.Connection,
    schema: str,
    caplog: pytest.LogCaptureFixture,
    kind: str,
    cancel_requested: bool,
) -> None:
    """Another daemon's claim buries an expired job without attempts left (dead) or with a
    cancel requested (cancelled), the state the old holder's own outcome could also have
    left: its late outcome must not pass for an earlier write of its own."""
    client.enqueue(conn, "h", max_attempts=1, schema=schema)
    old = claim(conn, schema, "w1")
    if cancel_requested:
        assert admin.cancel(conn, [old.id], schema=schema) == {old.id: "cancel requested"}
    expected = "cancelled" if cancel_requested else "dead"
    expire_lease(conn, schema, old.id)
    assert (
        leasing.claim(
            conn,
            "w2",
            queues=["default"],
            handlers={"h": HandlerCapacity(30.0, 1)},
            limit=1,
            schema=schema,
        )
        == []
    )
    buried = admin.get(conn, old.id, schema=schema)
    assert (buried["status"], buried["locked_by"]) == (expected, None)
    caplog.set_level(logging.INFO, logger="pgworkerd")
    write(conn, schema, "w1", Outcome(old, HANDLER, kind, 0.5, error="boom"))
    assert f"outcome {kind} rejected" in caplog.records[-1].getMessage()


# -- snoozes (issue 11) --------------------------------------------------------------------


def test_a_late_snooze_of_a_re_claimed_job_changes_nothing(
    conn: psycopg.Connection, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    client.enqueue(conn, "h", schema=schema)
    old = claim(conn, schema, "w1")
    expire_lease(conn, schema, old.id)
    claim(conn, schema, "w2")
    before = admin.get(conn, old.id, schema=schema)
    caplog.set_level(logging.INFO, logger="pgworkerd")
    write(conn, schema, "w1", Outcome(old, HANDLER, "snooze", 0.5, snooze=600.0))
    assert "outcome snooze rejected" in caplog.records[-1].getMessage()
    assert admin.get(conn, old.id, schema=schema) == before


def test_a_snooze_hands_the_attempt_back_and_the_one_past_max_snoozes_fails(
    conn: psycopg.Connection, schema: str
) -> None:
    handler = HandlerConfig(name="h", target="jobhandlers:work", max_snoozes=1)
    job_id = client.enqueue(conn, "h", max_attempts=2, schema=schema)
    job = claim(conn, schema, "w1")
    write(conn, schema, "w1", Outcome(job, handler, "snooze", 0.5, snooze=600.0, error="S"))
    row = admin.get(conn, job_id, schema=schema)
    assert (row["status"], row["attempts"], row["snoozes"], row["last_error"]) == (
        "pending",
        0,
        1,
        None,
    )
    # due in 600 s, by the server's clock
    [(due_in,)] = conn.execute(
        f'SELECT extract(epoch FROM run_at - now()) FROM "{schema}".jobs WHERE id = %s',
        [job_id],
    ).fetchall()
    assert 590 < due_in <= 600
    conn.execute(f'UPDATE "{schema}".jobs SET run_at = now() WHERE id = %s', [job_id])
    job = claim(conn, schema, "w1")
    assert job.attempt == 1  # the snoozed attempt was not counted
    write(conn, schema, "w1", Outcome(job, handler, "snooze", 0.5, snooze=0.0, error="S"))
    row = admin.get(conn, job_id, schema=schema)
    assert (row["status"], row["attempts"], row["snoozes"]) == ("pending", 1, 1)
    assert row["last_error"].startswith("snoozed 1 times already (max_snoozes of handler h)")


def test_a_snooze_past_max_snoozes_is_reported_as_the_failure_it_was_written_as(
    conn: psycopg.Connection, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The kind and error written come back with the record: the daemon's outcome becomes
    that failure, so a write repeated after a lost reply is the failure's, not a snooze's."""
    handler = HandlerConfig(name="h", target="jobhandlers:work", max_snoozes=0)
    client.enqueue(conn, "h", max_attempts=2, schema=schema)
    job = claim(conn, schema, "w1")
    outcome = Outcome(job, handler, "snooze", 0.5, snooze=5.0, error="S")
    caplog.set_level(logging.INFO, logger="pgworkerd")
    write(conn, schema, "w1", outcome)
    assert outcome.kind == "fail" and outcome.error.startswith("snoozed 0 times already")
    assert outcome.retry_in is not None and 5 <= outcome.retry_in <= 15  # 10 s +- 25 %
    assert "failed after 0.50s: snoozed 0 times already" in caplog.records[-1].getMessage()
    write(conn, schema, "w1", outcome)  # the reply was lost: written again
    assert caplog.records[-1].getMessage().endswith("fail already recorded by an earlier write")
