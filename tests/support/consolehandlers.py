"""Handlers for the operations console tests (tests/web/test_console_*.py): a long job that
prints and reports its progress as a fraction, and a slow printer past the log cap."""

from __future__ import annotations

import time

from pgworkerd.worker import JobContext


def report(job: JobContext) -> dict[str, int]:
    """`ticks` lines `tick N of job ID`, `every` seconds apart (default 0.3), each
    followed by a heartbeat with progress {"step": N + 1, "of": ticks}."""
    ticks = int(job.payload["ticks"])
    for n in range(ticks):
        print(f"tick {n} of job {job.id}", flush=True)
        job.heartbeat(progress={"step": n + 1, "of": ticks})
        time.sleep(float(job.payload.get("every", 0.3)))
    return {"ticks": ticks}


def scroll(job: JobContext) -> dict[str, int]:
    """`lines` numbered lines of 100 bytes in `bursts` bursts `every` seconds apart, so
    that a follower sees the stored tail move on past the cap between its polls."""
    lines, bursts = int(job.payload["lines"]), int(job.payload["bursts"])
    per = lines // bursts
    for b in range(bursts):
        for i in range(b * per, (b + 1) * per):
            print(f"line {i:05d} ".ljust(99, "x"))
        print(end="", flush=True)
        time.sleep(float(job.payload.get("every", 0.4)))
    return {"lines": per * bursts}
