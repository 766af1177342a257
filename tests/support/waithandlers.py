"""Handlers that wait for signals (pgworkerd.WaitFor), for tests/integration/test_waits.py;
imported by the daemon's children through PYTHONPATH. They raise through the package face,
as users' handlers do."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pgworkerd
from pgworkerd.worker import JobContext


def _seen(job: JobContext) -> dict[str, Any]:
    return {
        "attempt": job.attempt,
        "checkpoint": job.checkpoint,
        "waited_for": job.waited_for,
        "signal": None
        if job.signal is None
        else {
            "name": job.signal.name,
            "payload": job.signal.payload,
            "sent_at": job.signal.sent_at,
        },
        "pid": os.getpid(),
    }


def wait_once(job: JobContext) -> dict[str, Any]:
    """First start: save a checkpoint by heartbeat, start a grandchild that would outlive
    the attempt if anything were kept (its pid in the checkpoint), then wait for
    payload["name"] (timeout payload["timeout"], key payload.get("key")). Any later start:
    return what it sees."""
    if job.waited_for is None:
        sleeper = subprocess.Popen(["sleep", "300"])
        job.heartbeat(checkpoint={"step": 1, "sleeper": sleeper.pid})
        raise pgworkerd.WaitFor(
            job.payload.get("name", "approval"),
            timeout=job.payload.get("timeout", "1h"),
            key=job.payload.get("key"),
        )
    return _seen(job)


def wait_with_checkpoint(job: JobContext) -> dict[str, Any]:
    """Waits with a checkpoint given to WaitFor itself."""
    if job.waited_for is None:
        raise pgworkerd.WaitFor(
            job.payload.get("name", "approval"),
            timeout=job.payload.get("timeout", "1h"),
            checkpoint={"given": "to WaitFor"},
        )
    return _seen(job)


def wait_bad(job: JobContext) -> None:
    """A WaitFor with what payload says: a bad name, timeout or key."""
    raise pgworkerd.WaitFor(
        job.payload.get("name", "approval"),
        timeout=job.payload.get("timeout", "1h"),
        key=job.payload.get("key"),
    )


def wait_twice(job: JobContext) -> dict[str, Any]:
    """Waits for "first", then for "second", then returns both steps' signals."""
    steps = dict(job.checkpoint or {})
    if job.waited_for is not None and job.signal is not None:
        steps[job.signal.name] = job.signal.payload
    for name in ("first", "second"):
        if name not in steps:
            raise pgworkerd.WaitFor(name, timeout="1h", checkpoint=steps or {"started": True})
    return {"steps": steps, "attempt": job.attempt}
