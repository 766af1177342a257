"""The procrastinate app for bench/compare.py, run with procrastinate's own worker command:

    procrastinate --app=compare_procrastinate.app worker -c N

With BENCH_RESCUE set, the app adds the documented "retry stalled jobs" periodic task
(procrastinate has no automatic rescue of a dead worker's jobs: the user schedules one) and
shorter heartbeat settings, BENCH_HEARTBEAT / BENCH_STALLED seconds.
"""

from __future__ import annotations

import asyncio
import os

from compare_handlers import note_start
from procrastinate import App, PsycopgConnector

RESCUE = bool(os.environ.get("BENCH_RESCUE"))
HEARTBEAT = float(os.environ.get("BENCH_HEARTBEAT", "10"))
STALLED = float(os.environ.get("BENCH_STALLED", "30"))

app = App(
    connector=PsycopgConnector(conninfo=os.environ.get("BENCH_DSN", "")),
    worker_defaults=(
        {"update_heartbeat_interval": HEARTBEAT, "stalled_worker_timeout": STALLED}
        if RESCUE
        else {}
    ),
)


@app.task(name="noop")
async def noop() -> None:
    return None


@app.task(name="record")
async def record(k: str) -> None:
    note_start(k)


@app.task(name="hang")
async def hang(k: str) -> None:
    note_start(k)
    await asyncio.sleep(3600)


if RESCUE:
    # The recipe of procrastinate's "retry stalled jobs" how-to, every 2 s instead of every
    # 10 min (croniter's sixth field is seconds).
    @app.periodic(cron="* * * * * */2")
    @app.task(name="retry_stalled_jobs", queueing_lock="retry_stalled_jobs", pass_context=True)
    async def retry_stalled_jobs(context: object, timestamp: int) -> None:
        stalled = await app.job_manager.get_stalled_jobs(seconds_since_heartbeat=STALLED)
        for job in stalled:
            await app.job_manager.retry_job(job)
