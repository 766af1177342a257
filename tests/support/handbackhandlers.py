"""Long checkpointing handlers for the hand-back tests (tests/acceptance/test_hand_back.py)
and bench/handback_bench.py, imported by the daemons' children through PYTHONPATH.

`long_job` works in steps of payload["every"] seconds (default 0.2) up to payload["steps"]
(default 100,000), saving {"step": n} as its checkpoint after each and starting from the
checkpoint it is given. Each start appends a line to payload["file"]: its pid, job id,
attempt, the step it started from, the daemon's tag (JOBHANDLERS_TAG) and the pids of
the process tree it starts (payload["tree"]: a `sleep` in its own process group and one
in a session of its own); with payload["log_checkpoints"] also a line per checkpoint. So
a test can tell where and from what each run started and that nothing of an earlier run
is left. With payload["honour"] true (the default) it raises JobInterrupted as soon as
job.stop_requested is true (a cooperative hand-back); false: it never looks (released
at the end of the grace, stopped by the daemon). With payload["finish_at_stop"] it
returns a result instead, at the first step boundary after it is asked to stop (a
completion racing the release)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from typing import Any

from pgworkerd.worker import JobContext, JobInterrupted

TAG_ENV = "JOBHANDLERS_TAG"


def record(path: str, line: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def recorded(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def long_job(job: JobContext) -> Any:
    p = job.payload
    every = float(p.get("every", 0.2))
    steps = int(p.get("steps", 100_000))
    step = int((job.checkpoint or {}).get("step", 0))
    started_from = step
    tree: list[int] = []
    if p.get("tree", True):
        tree.append(subprocess.Popen(["sleep", "3600"]).pid)
        tree.append(subprocess.Popen(["sleep", "3600"], start_new_session=True).pid)
    record(
        p["file"],
        {
            "pid": os.getpid(),
            "job": job.id,
            "attempt": job.attempt,
            "started_from": started_from,
            "tag": os.environ.get(TAG_ENV, ""),
            "tree": tree,
            "at": time.time(),
        },
    )
    job.heartbeat(progress={"step": step, "started_from": started_from})
    honour = bool(p.get("honour", True))
    finish_at_stop = bool(p.get("finish_at_stop"))
    while step < steps:
        if finish_at_stop and job.stop_requested:  # looked at once a step
            return {"finished_at_step": step, "started_from": started_from}
        end = time.monotonic() + every
        while time.monotonic() < end:
            if honour and not finish_at_stop and job.stop_requested:
                raise JobInterrupted(f"asked to stop at step {step}")
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))
        step += 1
        job.heartbeat(
            progress={"step": step, "started_from": started_from}, checkpoint={"step": step}
        )
        if p.get("log_checkpoints"):
            record(p["file"], {"checkpoint": step, "job": job.id, "at": time.time()})
    return {"finished_at_step": step, "started_from": started_from}
