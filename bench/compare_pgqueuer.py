"""The PgQueuer factory for bench/compare.py, run with PgQueuer's own worker command:

    pgq run compare_pgqueuer:main [--heartbeat-timeout S]

BENCH_PGQ_CONCURRENCY sets every entrypoint's concurrency_limit (0: unlimited).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
from compare_handlers import note_start
from pgqueuer import AsyncpgDriver, Job, PgQueuer


@asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    connection = await asyncpg.connect(os.environ["BENCH_DSN"])
    pgq = PgQueuer(AsyncpgDriver(connection))
    limit = int(os.environ.get("BENCH_PGQ_CONCURRENCY", "0"))

    @pgq.entrypoint("noop", concurrency_limit=limit)
    async def noop(job: Job) -> None:
        return None

    @pgq.entrypoint("record", concurrency_limit=limit)
    async def record(job: Job) -> None:
        note_start((job.payload or b"").decode())

    @pgq.entrypoint("hang", concurrency_limit=limit)
    async def hang(job: Job) -> None:
        note_start((job.payload or b"").decode())
        await asyncio.sleep(3600)

    try:
        yield pgq
    finally:
        await connection.close()
