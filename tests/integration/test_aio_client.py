"""pgworkerd.aio (issue 26 item 2): enqueue, enqueue_many, get and wait on psycopg's
AsyncConnection against a real PostgreSQL: the caller's transaction decides (a rollback
removes the job), the checks and messages are the sync client's, and wait is woken by the
finish notification. (asyncio.run per test: no async test plugin needed.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import leasing
import psycopg
import pytest

import pgworkerd
from pgworkerd import aio, client
from pgworkerd.queue import lease
from pgworkerd.queue.lease import HandlerCapacity

WORKER = "tester"


def run(
    make: Callable[[psycopg.AsyncConnection[Any]], Coroutine[Any, Any, Any]], dsn: str, **kw: Any
) -> Any:
    async def main() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, **kw) as conn:
            return await make(conn)

    return asyncio.run(main())


def claim(conn: psycopg.Connection, schema: str) -> lease.ClaimedJob:
    [job] = leasing.claim(
        conn,
        WORKER,
        queues=["default"],
        handlers={"h": HandlerCapacity(lease_seconds=30.0, free=1)},
        limit=1,
        schema=schema,
    )
    return job


def row_of(conn: psycopg.Connection, schema: str, job_id: int) -> dict[str, Any] | None:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(
            f"SELECT handler, queue, payload, priority, max_attempts, dedupe_key, "
            f"concurrency_key, timeout_seconds FROM {schema}.jobs WHERE id = %s",
            (job_id,),
        )
        return cur.fetchone()


def test_enqueue_joins_the_callers_transaction_a_rollback_removes_the_job(
    test_db_dsn: str, conn: psycopg.Connection, schema: str
) -> None:
    async def rolled_back(a: psycopg.AsyncConnection[Any]) -> list[int]:
        one = await aio.enqueue(a, "h", {"n": 1}, schema=schema)
        [two, three] = await aio.enqueue_many(
            a, [aio.JobSpec("h", {"n": 2}), aio.JobSpec("h", {"n": 3})], schema=schema
        )
        assert a.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        await a.rollback()
        return [one, two, three]

    ids = run(rolled_back, test_db_dsn)
    assert len(set(ids)) == 3
    assert [row_of(conn, schema, i) for i in ids] == [None, None, None]

    async def committed(a: psycopg.AsyncConnection[Any]) -> int:
        job_id = await aio.enqueue(a, "h", {"n": 4}, queue="q", priority=3, schema=schema)
        await a.commit()
        return job_id

    job_id = run(committed, test_db_dsn)
    row = row_of(conn, schema, job_id)
    assert row is not None and (row["payload"], row["queue"], row["priority"]) == ({"n": 4}, "q", 3)


def test_the_async_client_writes_the_rows_the_sync_client_writes(
    test_db_dsn: str, conn: psycopg.Connection, schema: str
) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("h", {"payload": {"a": [1, "x"]}, "priority": -5, "max_attempts": 2}),
        ("h", {"dedupe_key": "k1", "concurrency_key": "c1", "queue": "other"}),
        ("h", {"timeout": 30, "expires_at": later}),  # enqueue_many_v3's path
        ("h", {"run_at": later, "delay": None}),
    ]
    for handler, kw in calls:
        sync_id = client.enqueue(conn, handler, schema=schema, **kw)
        sync_row = row_of(conn, schema, sync_id)
        conn.execute(f"DELETE FROM {schema}.jobs WHERE id = %s", (sync_id,))
        async_id = run(
            lambda a, kw=kw, handler=handler: aio.enqueue(a, handler, schema=schema, **kw),
            test_db_dsn,
            autocommit=True,
        )
        assert async_id != sync_id
        assert row_of(conn, schema, async_id) == sync_row


BAD: list[tuple[str, dict[str, Any]]] = [
    ("", {}),
    ("h", {"payload": [1]}),
    ("h", {"payload": {"x": float("nan")}}),
    ("h", {"priority": 10**9}),
    ("h", {"max_attempts": 0}),
    ("h", {"dedupe_key": ""}),
    ("h", {"run_at": datetime(2030, 1, 1)}),  # naive
    ("h", {"after": [0]}),
    ("h", {"timeout": -1}),
    ("h", {"on_parent_failure": "run"}),
]


@pytest.mark.parametrize(("handler", "kw"), BAD)
def test_bad_input_gets_the_sync_clients_message_and_leaves_the_transaction_usable(
    test_db_dsn: str, conn: psycopg.Connection, schema: str, handler: str, kw: dict[str, Any]
) -> None:
    with pytest.raises(client.InvalidJob) as sync_error:
        client.enqueue(conn, handler, schema=schema, **kw)

    async def refused(a: psycopg.AsyncConnection[Any]) -> tuple[str, str, int]:
        first = await aio.enqueue(a, "h", {"before": True}, schema=schema)
        with pytest.raises(aio.InvalidJob) as one:
            await aio.enqueue(a, handler, schema=schema, **kw)
        with pytest.raises(aio.InvalidJob) as many:
            await aio.enqueue_many(
                a, [aio.JobSpec("h"), aio.JobSpec(handler, **_spec_kw(kw))], schema=schema
            )
        await a.commit()  # the transaction was not aborted: the first job commits
        return str(one.value), str(many.value), first

    one, many, first = run(refused, test_db_dsn)
    assert one == str(sync_error.value)
    assert many.startswith("job 2: ") and many[len("job 2: ") :] == one[len("job 1: ") :]
    assert row_of(conn, schema, first) is not None


def _spec_kw(kw: dict[str, Any]) -> dict[str, Any]:
    return {k: tuple(v) if k == "after" else v for k, v in kw.items()}


def test_enqueue_many_with_parents_in_the_call_and_get(
    test_db_dsn: str, conn: psycopg.Connection, schema: str
) -> None:
    async def go(a: psycopg.AsyncConnection[Any]) -> tuple[list[int], Any, Any, Any]:
        parent = aio.JobSpec("h", {"p": 1})
        ids = await aio.enqueue_many(
            a, [parent, aio.JobSpec("h", {"c": 1}, after=[parent])], schema=schema
        )
        assert await aio.enqueue_many(a, [], schema=schema) == []
        info = await aio.get(a, ids[1], schema=schema)
        missing = await aio.get(a, 2**70, schema=schema)
        none = await aio.get(a, ids[1] + 1000, schema=schema)
        await a.commit()
        return ids, info, missing, none

    ids, info, missing, none = run(go, test_db_dsn)
    assert info == client.get(conn, ids[1], schema=schema)
    assert info.status == "waiting"  # its parent has not finished
    assert missing is None and none is None
    with pytest.raises(TypeError, match="job id must be an integer"):
        run(lambda a: aio.get(a, "1", schema=schema), test_db_dsn)  # type: ignore[arg-type]


def test_wait_is_woken_by_the_finish_notification(
    test_db_dsn: str, conn: psycopg.Connection, schema: str
) -> None:
    job_id = client.enqueue(conn, "h", {}, schema=schema)
    job = claim(conn, schema)

    async def waiter(a: psycopg.AsyncConnection[Any]) -> tuple[Any, float, bool, list[str]]:
        task = asyncio.create_task(aio.wait(a, job_id, timeout=60, poll=30, schema=schema))
        await asyncio.sleep(0.5)  # past its first read: asleep on the notification
        assert not task.done()
        # the finishing commit, from another connection (in a thread: the loop runs on)
        await asyncio.to_thread(
            leasing.complete, conn, WORKER, job.id, job.token, {"ok": 1}, schema=schema
        )
        committed = time.monotonic()
        result = await task
        woke = time.monotonic() - committed
        async with a.cursor() as cur:
            await cur.execute("SELECT pg_listening_channels()")
            channels = [r[0] for r in await cur.fetchall()]
        return result, woke, a.autocommit, channels

    result, woke, autocommit, channels = run(waiter, test_db_dsn)
    assert result == {"ok": 1}
    assert woke < 5  # a 30 s poll: only the notification wakes it this soon
    assert autocommit is False and channels == []  # left as found


def test_wait_raises_as_the_sync_one_does(
    test_db_dsn: str, conn: psycopg.Connection, schema: str
) -> None:
    dead = client.enqueue(conn, "h", {}, max_attempts=1, schema=schema)
    job = claim(conn, schema)
    lease.fail(conn, WORKER, job.id, job.token, "KeyError: 'customer'", schema=schema)
    pending = client.enqueue(conn, "h", {}, schema=schema)

    async def outcomes(a: psycopg.AsyncConnection[Any]) -> dict[str, BaseException]:
        seen: dict[str, BaseException] = {}
        for name, call in (
            ("dead", aio.wait(a, dead, timeout=5, schema=schema)),
            ("timeout", aio.wait(a, pending, timeout=0.3, poll=0.1, schema=schema)),
            ("unknown", aio.wait(a, dead + 1000, timeout=5, schema=schema)),
            ("bad poll", aio.wait(a, dead, poll=0, schema=schema)),
        ):
            try:
                await call
            except BaseException as exc:
                seen[name] = exc
        await aio.enqueue(a, "h", schema=schema)  # opens a transaction
        try:
            await aio.wait(a, dead, timeout=1, schema=schema)
        except RuntimeError as exc:
            seen["in transaction"] = exc
        assert a.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        await a.rollback()
        return seen

    seen = run(outcomes, test_db_dsn)
    failed = seen["dead"]
    assert isinstance(failed, pgworkerd.JobFailed)
    assert str(failed) == f"job {dead} ended dead: KeyError: 'customer'"
    assert isinstance(seen["timeout"], pgworkerd.WaitTimeout)
    assert str(seen["timeout"]) == f"job {pending} still pending after 0.3s"
    assert isinstance(seen["unknown"], pgworkerd.JobNotFound)
    assert isinstance(seen["bad poll"], ValueError)
    assert "outside a transaction" in str(seen["in transaction"])
