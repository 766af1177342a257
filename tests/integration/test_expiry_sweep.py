"""The expiry sweep in SQL (migration 0032: job_expired_cancel, run by every daemon on a
fleet-spaced cadence, daemon/sweeps.EXPIRY): jobs past their expires_at end as
cancelled with "expired: ..." without a claim, whatever their handler; bounded per call;
jobs before their deadline untouched; explain and status show them."""

from __future__ import annotations

import json
from typing import Any

import leasing
import psycopg
import pytest

from pgworkerd import client
from pgworkerd.queue import explain, lease, retention
from pgworkerd.queue.queries import render


def overdue(conn: psycopg.Connection, schema: str, *ids: int) -> None:
    conn.execute(
        render(
            "UPDATE @schema@.jobs SET expires_at = now() - interval '1 second' WHERE id = ANY(%s)",
            schema,
        ),
        (list(ids),),
    )


def state(conn: psycopg.Connection, schema: str, job_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        render(
            "SELECT status::text, last_error, finished_at IS NOT NULL, locked_by "
            "FROM @schema@.jobs WHERE id = %s",
            schema,
        ),
        (job_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_expired_jobs_end_without_a_claim_whatever_their_handler(
    conn: psycopg.Connection, schema: str
) -> None:
    unserved = client.enqueue(conn, "nobody-serves-this", expire_in=3600, schema=schema)
    later = client.enqueue(conn, "nobody-serves-this", expire_in=3600, schema=schema)
    plain = client.enqueue(conn, "nobody-serves-this", schema=schema)
    held_job = client.enqueue(conn, "h", expire_in=3600, schema=schema)
    [held] = leasing.claim(
        conn,
        "w1",
        queues=["default"],
        handlers={"h": lease.HandlerCapacity(lease_seconds=60, free=1)},
        limit=1,
        schema=schema,
    )
    assert held.id == held_job
    overdue(conn, schema, unserved, held_job)
    # the running one keeps its lease: only a lease that ran out ends it
    assert retention.expired_cancel(conn, 100, schema) == 1
    status, error, finished, _ = state(conn, schema, unserved)
    assert (status, finished) == ("cancelled", True)
    assert error.startswith("expired: not started by its expires_at ")
    assert state(conn, schema, later)[0] == "pending"
    assert state(conn, schema, plain)[0] == "pending"
    assert state(conn, schema, held_job)[:1] == ("running",)
    conn.execute(
        render(
            "UPDATE @schema@.jobs SET locked_until = now() - interval '1s' WHERE id = %s", schema
        ),
        (held_job,),
    )
    assert retention.expired_cancel(conn, 100, schema) == 1
    status, error, finished, locked_by = state(conn, schema, held_job)
    assert (status, finished, locked_by) == ("cancelled", True, None)
    assert error.startswith("expired: its lease ran out after its expires_at ")
    # explain says why
    said = explain.explain(conn, schema, unserved)
    assert said is not None and said["reasons"][0]["code"] == "expired", said
    assert "not started by its expires_at" in said["summary"]
    assert retention.expired_cancel(conn, 100, schema) == 0


def test_the_sweep_is_bounded_per_call_and_counts_for_batches(
    conn: psycopg.Connection, schema: str
) -> None:
    [(bid, callback, members)] = conn.execute(
        render("SELECT * FROM @schema@.batch_enqueue(%s::jsonb, %s::jsonb)", schema),
        (json.dumps([{"handler": "gone"}] * 5), json.dumps({"handler": "collect"})),
    ).fetchall()
    overdue(conn, schema, *members)
    assert retention.expired_cancel(conn, 3, schema) == 3
    assert retention.expired_cancel(conn, 3, schema) == 2
    [(cancelled, released)] = conn.execute(
        render(
            "SELECT cancelled, released_at IS NOT NULL FROM @schema@.batches WHERE id = %s", schema
        ),
        (bid,),
    ).fetchall()
    assert (cancelled, released) == (5, True)
    assert state(conn, schema, callback)[0] == "pending"  # a batch's callback always runs


@pytest.mark.parametrize("bad", [0, -1, 100001, None])
def test_a_hostile_batch_size_is_refused_and_changes_nothing(
    conn: psycopg.Connection, schema: str, bad: int | None
) -> None:
    job_id = client.enqueue(conn, "h", expire_in=3600, schema=schema)
    overdue(conn, schema, job_id)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="max_jobs must be from 1"):
        conn.execute(render("SELECT @schema@.job_expired_cancel(%s)", schema), (bad,))
    conn.rollback()
    assert state(conn, schema, job_id)[0] == "pending"
