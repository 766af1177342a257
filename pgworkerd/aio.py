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
import inspect
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Concatenate, ParamSpec, TypeVar

import psycopg
from psycopg.rows import tuple_row

from pgworkerd import client
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
from pgworkerd.queue import records
from pgworkerd.queue.queries import DEFAULT_SCHEMA, finished_channel, query

P = ParamSpec("P")
R = TypeVar("R")

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


def _awaitable_twin_of(
    sync: Callable[Concatenate[psycopg.Connection[Any], P], R],
) -> Callable[
    [Callable[..., Coroutine[Any, Any, R]]],
    Callable[Concatenate[psycopg.AsyncConnection[Any], P], Coroutine[Any, Any, R]],
]:
    """The decorated coroutine function takes `sync`'s arguments, declared once there:
    type checkers see `sync`'s parameters after an AsyncConnection, and help() and
    inspect.signature show them (its defaults and annotations), the connection's
    annotation an AsyncConnection."""
    signature = inspect.signature(sync)
    conn, *rest = signature.parameters.values()
    twin = signature.replace(
        parameters=[conn.replace(annotation="psycopg.AsyncConnection[Any]"), *rest]
    )

    def declare(
        func: Callable[..., Coroutine[Any, Any, R]],
    ) -> Callable[Concatenate[psycopg.AsyncConnection[Any], P], Coroutine[Any, Any, R]]:
        func.__signature__ = twin  # type: ignore[attr-defined]
        return func

    return declare


@_awaitable_twin_of(client.enqueue)
async def enqueue(
    conn: psycopg.AsyncConnection[Any],
    handler: str,
    payload: Mapping[str, Any] | None = None,
    *,
    schema: str = DEFAULT_SCHEMA,
    trace: Mapping[str, str] | None = None,
    **options: Any,
) -> int:
    """Enqueue one job inside the caller's current transaction; returns its id. The
    arguments, their defaults and their semantics are pgworkerd.client.enqueue's
    (dedupe_policy="reject" raises DuplicateJob)."""
    spec = enqueue_spec(
        handler, payload, trace=ambient_trace() if trace is None else trace, **options
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
