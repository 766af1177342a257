"""Example handlers, used by `pgworkerd demo` and the tests. A handler is a plain function
that takes a JobContext and returns a JSON-serialisable result. Config files name them by
their older path, `pgworkerd.examples:NAME` (pgworkerd/examples.py re-exports them)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from pgworkerd.worker import JobContext, JobInterrupted

__all__ = ["crash", "echo", "flaky", "hang", "noop", "sleep_with_progress"]


def sleep_with_progress(job: JobContext) -> dict[str, Any]:
    """Work for payload["seconds"] (default 3) in steps, reporting progress and saving a
    checkpoint so a retried attempt resumes where the last one stopped."""
    seconds = float(job.payload.get("seconds", 3))
    steps = max(1, int(job.payload.get("steps", 10)))
    start = int((job.checkpoint or {}).get("step", 0))
    for step in range(start, steps):
        if job.stop_requested:  # drain or cancel: the checkpoint lets a later attempt resume
            raise JobInterrupted(f"stopping early at step {step} of {steps}")
        time.sleep(seconds / steps)
        job.heartbeat(progress={"step": step + 1, "of": steps}, checkpoint={"step": step + 1})
    return {"slept": seconds, "resumed_from": start}


def flaky(job: JobContext) -> str:
    """Fails its first payload["failures"] (default 1) attempts, then succeeds."""
    failures = int(job.payload.get("failures", 1))
    # what `pgworkerd logs ID` shows (the demo points at it)
    print(f"flaky: attempt {job.attempt}, failing the first {failures}", flush=True)
    if job.attempt <= failures:
        raise RuntimeError(f"simulated failure on attempt {job.attempt}")
    return f"succeeded on attempt {job.attempt}"


def echo(job: JobContext) -> Any:
    """Returns its payload."""
    return job.payload


def noop(job: JobContext) -> None:
    return None


def crash(job: JobContext) -> None:
    """Dies the way payload["how"] says: "exit" (os._exit(3)), "kill" (SIGKILL), "segv"."""
    how = job.payload.get("how", "exit")
    if how == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSEGV)
    time.sleep(10)


def hang(job: JobContext) -> None:
    """Sleeps payload["seconds"] (default 3600) without heartbeats."""
    time.sleep(float(job.payload.get("seconds", 3600)))
