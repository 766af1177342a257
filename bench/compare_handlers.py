"""pgworkerd handlers for bench/compare.py (imported by the daemon's children).

`record` and `hang` append "TOKEN TIME PID PPID" to $BENCH_STARTS at their first line, like the
peers' tasks in compare_procrastinate.py and compare_pgqueuer.py.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the peers' workers import note_start without loading pgworkerd
    from pgworkerd.worker import JobContext


def note_start(token: str) -> None:
    started = time.time()
    with open(os.environ["BENCH_STARTS"], "a") as log:
        # the parent too: a fresh process per job has exited by the time anyone looks
        log.write(f"{token} {started} {os.getpid()} {os.getppid()}\n")


async def anoop(job: JobContext) -> None:
    """An async def no-op: run side by side in a child's event loop (concurrency)."""


def record(job: JobContext) -> None:
    note_start(str(job.payload["k"]))


def hang(job: JobContext) -> None:
    note_start(str(job.payload["k"]))
    time.sleep(3600)
