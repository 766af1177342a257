"""Handlers of bench/waits_bench.py (imported by the daemon's children: PYTHONPATH=bench)."""

from __future__ import annotations

import os
import time

import pgworkerd
from pgworkerd.worker import JobContext


def wait_then_record(job: JobContext) -> None:
    """Waits for signal "go"; once resumed, notes when it started (the benchmark compares
    it with the signal's commit)."""
    if job.waited_for is None:
        raise pgworkerd.WaitFor("go", timeout="1h")
    started = time.time()
    with open(os.environ["BENCH_STARTS"], "a") as log:
        log.write(f"{job.id} {started}\n")
