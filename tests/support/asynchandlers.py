"""Async handlers for tests/acceptance/test_async_handlers.py: `async def` functions the
daemon's children run in an event loop (pgworkerd.worker.aiorun)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from pgworkerd.client import JobSpec
from pgworkerd.worker import Done, JobContext, WaitFor

app_log = logging.getLogger("app.async")


async def echo(job: JobContext) -> dict[str, Any]:
    """Awaits, reports progress, prints and logs; returns its payload and its loop's
    identity (proof it ran in a running event loop)."""
    await asyncio.sleep(0.05)
    job.heartbeat(progress={"half": True})
    print(f"async print of job {job.id}")
    app_log.info("async logging of job %d", job.id)
    loop = asyncio.get_running_loop()
    return {"payload": job.payload, "pid": os.getpid(), "loop": type(loop).__name__}


async def with_follow_up(job: JobContext) -> Done:
    await asyncio.sleep(0)
    return Done({"parent": job.id}, then=[JobSpec("echo", {"from": job.id})])


async def waits_for_signal(job: JobContext) -> Any:
    if job.signal is not None:
        return {"signal": job.signal.payload}
    await asyncio.sleep(0)
    raise WaitFor("go", timeout=600)


async def slow(job: JobContext) -> None:
    """Sleeps `seconds` at an await; says so when it is cancelled (and cleans up)."""
    try:
        await asyncio.sleep(float(job.payload["seconds"]))
    except asyncio.CancelledError:
        print(f"cleaned up job {job.id}", flush=True)
        raise


async def blocking(job: JobContext) -> str:
    """A blocking call in a coroutine: time.sleep holds the event loop."""
    await asyncio.sleep(0)
    time.sleep(float(job.payload["seconds"]))
    return "done blocking"


async def side_by_side(job: JobContext) -> dict[str, Any]:
    """Prints numbered lines between awaits for `seconds`; returns when it ran and where."""
    t0 = time.time()
    steps = int(float(job.payload.get("seconds", 1)) / 0.1)
    for i in range(steps):
        print(f"line {i} of job {job.id}")
        app_log.info("logged %d of job %d", i, job.id)
        job.heartbeat(progress={"step": i})
        await asyncio.sleep(0.1)
    return {"pid": os.getpid(), "t0": t0, "t1": time.time()}


async def stubborn(job: JobContext) -> None:
    """Swallows its cancellation and blocks: only the SIGKILL after kill_grace ends it."""
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        print("ignoring the stop", flush=True)
        time.sleep(600)


async def hog(job: JobContext) -> None:
    """Holds `mib` MiB (touched) at an await, for the watcher's memory limit."""
    block = bytearray(int(job.payload["mib"]) << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    await asyncio.sleep(600)
