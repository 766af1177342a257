"""Handlers for bench/daemon_bench.py (imported by the daemon's children)."""

from __future__ import annotations

import os
import time

from pgworkerd.worker import JobContext


def record_start(job: JobContext) -> None:
    """Notes when the handler started; the benchmark compares it with the enqueue time."""
    started = time.time()
    with open(os.environ["BENCH_STARTS"], "a") as log:
        log.write(f"{job.id} {started}\n")


def noop(job: JobContext) -> None:
    """Does nothing (bench/retention_soak.py: the load is the job rows, not the work)."""


def record_end(job: JobContext) -> None:
    """Notes when the handler returns (bench/dependencies_bench.py: a parent's end, which
    its child's start is measured from)."""
    with open(os.environ["BENCH_STARTS"], "a") as log:
        log.write(f"end:{job.id} {time.time()}\n")


async def async_noop(job: JobContext) -> None:
    """An async handler that does nothing (bench/daemon_bench.py: concurrency = 8)."""
