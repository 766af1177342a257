"""Handlers for tests/acceptance/test_deploy.py and bench/deploy_bench.py: jobs longer than
any drain timeout, as a busy host runs them."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from pgworkerd.worker import JobContext, JobInterrupted


def stubborn(job: JobContext) -> None:
    """Never checks job.stop_requested and runs a subprocess (a transcoder that cannot be
    asked to stop): `sleep payload["marker"]`, a number of seconds that tells this job's
    process apart in `ps`. Only stopping the job's process tree ends it."""
    proc = subprocess.Popen(["sleep", str(int(job.payload["marker"]))])
    job.heartbeat(progress={"sleep_pid": proc.pid})
    proc.wait()


def transcode(job: JobContext) -> dict[str, Any]:
    """payload["steps"] steps of payload["step_seconds"] (default 1) each, a checkpoint
    after every step; returns when done, or stops at the next step once asked to (the
    checkpoint lets the next attempt resume)."""
    steps = int(job.payload["steps"])
    pause = float(job.payload.get("step_seconds", 1))
    start = int((job.checkpoint or {}).get("step", 0))
    for step in range(start, steps):
        if job.stop_requested:
            raise JobInterrupted(f"stopping at step {step} of {steps}")
        time.sleep(pause)
        job.heartbeat(progress={"step": step + 1, "of": steps}, checkpoint={"step": step + 1})
    return {"steps": steps, "resumed_from": start}
