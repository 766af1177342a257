"""Job logs (migration 0015) against a real PostgreSQL: the daemon's upsert keeps a full
head without rewriting it, skips jobs deleted meanwhile, and the logs go with their job
(prune, the fleet's retention, TRUNCATE); read_logs is what `logs` and the dashboard see."""

from __future__ import annotations

import logging
from typing import Any

import leasing
import psycopg
import pytest
from pruning import prune

from pgworkerd import client
from pgworkerd.config import RetentionConfig
from pgworkerd.queue import joblogs, lease, retention, views
from pgworkerd.queue.joblogs import LogWrite
from pgworkerd.queue.queries import render

SERVED = {"h": lease.HandlerCapacity(lease_seconds=60, free=10)}


def claim(conn: psycopg.Connection, schema: str) -> lease.ClaimedJob:
    [job] = leasing.claim(conn, "w1", queues=["default"], handlers=SERVED, limit=1, schema=schema)
    return job


def sql(conn: psycopg.Connection, schema: str, text: str, *params: Any) -> list[tuple[Any, ...]]:
    cur = conn.execute(render(text, schema), params)  # type: ignore[arg-type]
    return cur.fetchall() if cur.description else []


def entry(job: lease.ClaimedJob, head: str | None, tail: str = "", **kw: Any) -> LogWrite:
    values: dict[str, Any] = {"total_bytes": 0, "omitted_bytes": 0, "finished": False, **kw}
    return LogWrite(job.id, job.token, job.attempt, head, tail, **values)


def test_upserts_keep_the_head_once_full_and_attempts_apart(
    conn: psycopg.Connection, schema: str
) -> None:
    job_id = client.enqueue(conn, "h", max_attempts=3, schema=schema)
    first = claim(conn, schema)
    assert joblogs.write(conn, "w1", [entry(first, "hello\n", total_bytes=6)], schema=schema) == {
        job_id
    }
    later = entry(first, None, "tail\n", total_bytes=900, omitted_bytes=889, finished=True)
    joblogs.write(conn, "w1", [later], schema=schema)
    lease.fail(conn, "w1", job_id, first.token, "boom", backoff_base=0, schema=schema)
    second = claim(conn, schema)
    joblogs.write(conn, "w1", [entry(second, "again\n", total_bytes=6)], schema=schema)

    logs = joblogs.read_logs(conn, schema, job_id)
    assert logs is not None
    assert (logs["status"], logs["attempts"], logs["lease_token"]) == (
        "running",
        2,
        second.token,
    )
    one, two = logs["logs"]
    assert (one["attempt"], one["head"], one["tail"], one["total_bytes"]) == (
        1,
        "hello\n",
        "tail\n",
        900,
    )
    assert one["truncated"] and one["finished"] and one["worker"] == "w1"
    assert joblogs.text_of(one) == "hello\n[... 889 bytes omitted ...]\ntail\n"
    assert (two["attempt"], two["head"], two["truncated"], two["finished"]) == (
        2,
        "again\n",
        False,
        False,
    )
    assert joblogs.text_of(two) == "again\n"
    only = joblogs.read_logs(conn, schema, job_id, attempt=2)
    assert only is not None and [e["attempt"] for e in only["logs"]] == [2]
    assert joblogs.read_logs(conn, schema, job_id + 1000) is None


def test_attempts_written_in_one_statement_list_in_attempt_order(
    conn: psycopg.Connection, schema: str
) -> None:
    """The daemon flushes every attempt's output in one statement, so two attempts of a job
    can share updated_at; tokens are random, so they cannot break the tie. The list (what
    `logs` prints last, the dashboard) is by attempt number, whatever the tokens are."""
    job_id = client.enqueue(conn, "h", max_attempts=3, schema=schema)
    first = claim(conn, schema)
    lease.fail(conn, "w1", job_id, first.token, "boom", backoff_base=0, schema=schema)
    second = claim(conn, schema)
    both = [entry(first, "one\n", finished=True), entry(second, "two\n")]
    assert joblogs.write(conn, "w1", both, schema=schema) == {job_id}
    # the later attempt's token below the earlier one's, the same updated_at for both
    sql(
        conn,
        schema,
        "UPDATE @schema@.job_logs SET lease_token = -lease_token WHERE job_id = %s AND attempt = 2",
        job_id,
    )
    sql(
        conn,
        schema,
        "UPDATE @schema@.job_logs SET lease_token = abs(lease_token) + 1, "
        "updated_at = '2026-01-01' WHERE job_id = %s AND attempt = 1",
        job_id,
    )
    sql(
        conn,
        schema,
        "UPDATE @schema@.job_logs SET updated_at = '2026-01-01' WHERE job_id = %s",
        job_id,
    )
    logs = joblogs.read_logs(conn, schema, job_id)
    assert logs is not None
    assert [(e["attempt"], e["head"]) for e in logs["logs"]] == [(1, "one\n"), (2, "two\n")]
    shown = views.logs_shown(conn, schema, job_id, shown=100, limit=10)
    assert shown is not None and [e["attempt"] for e in shown] == [1, 2]


def test_a_job_deleted_meanwhile_gets_no_log(conn: psycopg.Connection, schema: str) -> None:
    client.enqueue(conn, "h", schema=schema)
    job = claim(conn, schema)
    sql(conn, schema, "DELETE FROM @schema@.jobs WHERE id = %s", job.id)
    assert joblogs.write(conn, "w1", [entry(job, "late\n")], schema=schema) == set()
    assert sql(conn, schema, "SELECT count(*) FROM @schema@.job_logs") == [(0,)]


def test_storable_text_holds_no_nul_and_only_valid_utf8() -> None:
    assert joblogs.storable(b"a\x00b\xff\xfec\xe2\x82") == "ab\ufffd\ufffdc\ufffd"


def finished_with_log(conn: psycopg.Connection, schema: str, days_ago: float) -> int:
    client.enqueue(conn, "h", schema=schema)
    job = claim(conn, schema)
    joblogs.write(conn, "w1", [entry(job, "out\n", total_bytes=4)], schema=schema)
    leasing.complete(conn, "w1", job.id, job.token, schema=schema)
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET finished_at = now() - make_interval(days => %s) WHERE id = %s",
        days_ago,
        job.id,
    )
    return job.id


def logged_jobs(conn: psycopg.Connection, schema: str) -> list[int]:
    return [r[0] for r in sql(conn, schema, "SELECT job_id FROM @schema@.job_logs ORDER BY 1")]


def test_prune_and_retention_remove_the_logs_with_their_jobs(
    conn: psycopg.Connection, schema: str
) -> None:
    kept = finished_with_log(conn, schema, 0)
    pruned = finished_with_log(conn, schema, 2)
    expired = finished_with_log(conn, schema, 10)
    assert logged_jobs(conn, schema) == [kept, pruned, expired]
    policy = RetentionConfig(completed=5 * 86400.0, batch=100)
    result = retention.prune_finished(
        conn, completed=policy.completed, cancelled=None, dead=None, batch=100, schema=schema
    )
    assert result.deleted == 1
    assert logged_jobs(conn, schema) == [kept, pruned]
    assert prune(conn, jobs_older_than=86400.0, schema=schema).jobs == 1
    assert logged_jobs(conn, schema) == [kept]
    sql(conn, schema, "TRUNCATE @schema@.jobs")
    assert logged_jobs(conn, schema) == []


def test_the_daemons_store_drops_a_refused_statement_raises_a_lost_connection(
    conn: psycopg.Connection, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Logs never cost more: the database refusing the statement (here: no such function
    in that schema, as for a role without the grant) is logged and nothing counts as
    stored; a lost connection is the caller's to handle."""
    job_id = client.enqueue(conn, "h", schema=schema)
    job = claim(conn, schema)
    assert job.id == job_id
    with caplog.at_level(logging.WARNING, logger="pgworkerd"):
        assert joblogs.store(conn, "w1", [entry(job, "out\n")], schema=f"{schema}_gone") == set()
    assert "job output not stored" in caplog.text
    assert joblogs.store(conn, "w1", [entry(job, "out\n")], schema=schema) == {job_id}
    conn.close()
    with pytest.raises(psycopg.OperationalError):
        joblogs.store(conn, "w1", [entry(job, "out\n")], schema=schema)
