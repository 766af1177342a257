"""The application API on psycopg's AsyncConnection: enqueue, enqueue_many, get and wait,
as pgworkerd.client's (same arguments, transaction semantics, checks and messages; the
checking and the statements are client.py's, shared, not copied).

`enqueue` and `enqueue_many` join the caller's current transaction: the jobs commit or
roll back with it. Everything is checked before the database sees it (InvalidJob), so bad
input never aborts the caller's transaction. `wait` needs a connection outside a
transaction, is woken by the "<schema>.finished" notification (a hint: the job is read
again, at least WAIT_REREAD_FLOOR apart) and re-reads every `poll` seconds in case none
comes.

    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        job_id = await pgworkerd.aio.enqueue(conn, "send_mail", {"to": "ana@example.org"})
        await conn.commit()
        result = await pgworkerd.aio.wait(conn, job_id, timeout=60)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from pgworkerd.client import (
    DEFAULT_WAIT_POLL,
    WAIT_REREAD_FLOOR,
    InvalidJob,
    JobFailed,
    JobInfo,
    JobNotFound,
    JobSpec,
    WaitTimeout,
    ambient_trace,
    duplicate_job,
    enqueue_many_statement,
    enqueue_spec,
    enqueue_statement,
    readable_id,
    wait_arguments_check,
    wait_settled,
)
from pgworkerd.model import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE
from pgworkerd.queue import records
from pgworkerd.queue.queries import DEFAULT_SCHEMA, finished_channel, query

__all__ = [
    "InvalidJob",
    "JobFailed",
    "JobInfo",
    "JobNotFound",
    "JobSpec",
    "WaitTimeout",
    "enqueue",
    "enqueue_many",
    "get",
    "wait",
]


async def enqueue(
    conn: psycopg.AsyncConnection[Any],
    handler: str,
    payload: Mapping[str, Any] | None = None,
    *,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    dedupe_key: str | None = None,
    concurrency_key: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    after: Sequence[int] = (),
    on_parent_failure: str | None = None,
    expires_at: datetime | None = None,
    expire_in: float | timedelta | None = None,
    timeout: float | timedelta | None = None,
    dedupe_window: float | timedelta | None = None,
    dedupe_policy: str | None = None,
    debounce: float | timedelta | None = None,
    debounce_max: float | timedelta | None = None,
    trace: Mapping[str, str] | None = None,
) -> int:
    """Enqueue one job inside the caller's current transaction; returns its id
    (pgworkerd.client.enqueue's semantics; dedupe_policy="reject" raises DuplicateJob)."""
    spec = enqueue_spec(
        handler,
        payload,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        max_attempts=max_attempts,
        dedupe_key=dedupe_key,
        concurrency_key=concurrency_key,
        after=after,
        on_parent_failure=on_parent_failure,
        expires_at=expires_at,
        expire_in=expire_in,
        timeout=timeout,
        dedupe_window=dedupe_window,
        dedupe_policy=dedupe_policy,
        debounce=debounce,
        debounce_max=debounce_max,
        trace=ambient_trace() if trace is None else trace,
    )
    if spec.has_extras():
        [job_id] = await enqueue_many(conn, [spec], schema=schema)
        return job_id
    statement, params = enqueue_statement(spec, schema)
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(statement, params)
        row = await cur.fetchone()
    assert row is not None  # the function returns the job's id or raises
    return int(row[0])


async def enqueue_many(
    conn: psycopg.AsyncConnection[Any],
    specs: Iterable[JobSpec],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> list[int]:
    """Enqueue many jobs in one round trip; ids come back in input order."""
    call = enqueue_many_statement(specs, schema)
    if call is None:
        return []
    async with conn.cursor(row_factory=tuple_row) as cur:
        try:
            await cur.execute(*call)
        except psycopg.Error as exc:
            duplicate = duplicate_job(exc)
            if duplicate is None:
                raise
            raise duplicate from exc
        [(ids,)] = await cur.fetchall()
    return list(ids)


async def get(
    conn: psycopg.AsyncConnection[Any], job_id: int, *, schema: str = DEFAULT_SCHEMA
) -> JobInfo | None:
    """The job `job_id`, or None if there is none (or none this role may read), read in
    the caller's current transaction if one is open (pgworkerd.client.get's semantics)."""
    if not readable_id(job_id):
        return None
    async with conn.cursor(row_factory=tuple_row) as cur:
        await cur.execute(query("job_info", schema), {"id": job_id})
        row = await cur.fetchone()
        columns = tuple(c.name for c in cur.description or ())
    return None if row is None else records.build(JobInfo, columns, row)


async def wait(
    conn: psycopg.AsyncConnection[Any],
    job_id: int,
    timeout: float | None = None,
    *,
    poll: float = DEFAULT_WAIT_POLL,
    listen: bool = True,
    schema: str = DEFAULT_SCHEMA,
) -> Any:
    """Wait until job `job_id` is finished; return its result when it completed. Raises
    JobFailed, WaitTimeout or JobNotFound, and leaves the connection as it found it, as
    pgworkerd.client.wait does (read its notes: outside a transaction only; listen=False
    through PgBouncer in transaction mode; other channels' notifications arriving
    meanwhile are consumed)."""
    wait_arguments_check(conn, timeout, poll)
    deadline = None if timeout is None else time.monotonic() + timeout
    channel = finished_channel(schema)
    was_autocommit = conn.autocommit
    await conn.set_autocommit(True)
    listening = False
    try:
        if listen:
            async with conn.cursor(row_factory=tuple_row) as cur:
                await cur.execute(query("session_finished_listening", schema), {"channel": channel})
                [(already,)] = await cur.fetchall()
                if not already:
                    await cur.execute(query("session_finished_listen", schema))
                    listening = True
        while True:
            read_at = time.monotonic()
            job = await get(conn, job_id, schema=schema)
            done, result = wait_settled(job, job_id, schema, deadline, timeout)
            if done:
                return result
            left = None if deadline is None else deadline - time.monotonic()
            nap = poll if left is None else max(0.0, min(poll, left))
            if listen:
                async for note in conn.notifies(timeout=nap):
                    if note.channel == channel and note.payload == str(job_id):
                        break
                # a flood of notifications naming this job makes no more reads than this
                rest = read_at + WAIT_REREAD_FLOOR - time.monotonic()
                if deadline is not None:
                    rest = min(rest, deadline - time.monotonic())
                if rest > 0:
                    await asyncio.sleep(rest)
            else:
                await asyncio.sleep(nap)
    finally:
        if not conn.closed:
            if listening and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                async with conn.cursor() as cur:
                    await cur.execute(query("session_finished_unlisten", schema))
            await conn.set_autocommit(was_autocommit)
