"""Handlers for tests/fault/test_faults.py, imported by the daemon's children through PYTHONPATH,
and the reader for what they record.

Fault tests cut the daemon off from PostgreSQL or restart it, so executions are recorded
to a file, not to a table: one JSON line per event (`start`, `alive` every step, `end`)
with `time.time()`, appended with a single write (O_APPEND) so children of several
daemons can share the file. A killed attempt has no `end`; its last line says when it was
last seen running.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pgworkerd.worker import JobContext

TAG_ENV = "JOBHANDLERS_TAG"  # the daemon's tag, set by daemon_harness.DaemonProcess


def record(path: str, job: JobContext, event: str) -> None:
    line = {
        "job": job.id,
        "attempt": job.attempt,
        "tag": os.environ.get(TAG_ENV, ""),
        "pid": os.getpid(),
        "event": event,
        "t": time.time(),
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def work(job: JobContext) -> Any:
    """Works for payload["seconds"] (a list gives one value per attempt, the last
    repeating) in steps of payload["step"] (default 0.1), recording itself alive and
    sending a heartbeat each step; records to payload["file"]. With payload["ignore_term"]
    true it ignores SIGTERM, like a handler that takes long to stop: only the daemon's
    SIGKILL after kill_grace ends it early."""
    p = job.payload
    path = p["file"]
    if p.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    seconds = p.get("seconds", 0)
    if isinstance(seconds, list):
        seconds = seconds[min(job.attempt, len(seconds)) - 1]
    record(path, job, "start")
    end = time.monotonic() + float(seconds)
    step = float(p.get("step", 0.1))
    n = 0
    while True:
        n += 1
        record(path, job, "alive")
        job.heartbeat(progress={"step": n})
        left = end - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(step, left))
    record(path, job, "end")
    return {"attempt": job.attempt, "pid": os.getpid(), "tag": os.environ.get(TAG_ENV, "")}


def chatty(job: JobContext) -> Any:
    """Heartbeats with a `kib` KiB checkpoint every `step` seconds (default 0.01) for
    payload["seconds"]: a frozen daemon's socket fills within a second or two."""
    p = job.payload
    record(p["file"], job, "start")
    filler = "x" * (int(p.get("kib", 32)) * 1024)
    end = time.monotonic() + float(p["seconds"])
    n = 0
    while time.monotonic() < end:
        n += 1
        job.heartbeat(progress={"step": n}, checkpoint={"n": n, "filler": filler})
        time.sleep(float(p.get("step", 0.01)))
    record(p["file"], job, "end")
    return {"beats": n, "attempt": job.attempt}


@dataclass
class Execution:
    job: int
    attempt: int
    tag: str
    pid: int
    started: float
    last_seen: float  # the last line it wrote
    ended: bool


def read_executions(path: Path, job: int | None = None) -> list[Execution]:
    """Every execution in the file (of one job, if given), in order of start."""
    found: dict[tuple[int, int], Execution] = {}
    if not path.exists():
        return []
    for text in path.read_text().splitlines():
        line = json.loads(text)
        if job is not None and line["job"] != job:
            continue
        key = (line["job"], line["pid"])
        e = found.get(key)
        if e is None:
            e = found[key] = Execution(
                line["job"], line["attempt"], line["tag"], line["pid"], line["t"], line["t"], False
            )
        e.last_seen = max(e.last_seen, line["t"])
        e.ended = e.ended or line["event"] == "end"
    return sorted(found.values(), key=lambda e: e.started)


def overlaps(executions: list[Execution]) -> list[tuple[Execution, Execution]]:
    """Pairs of executions of one job where the later started before the earlier was
    last seen."""
    by_job: dict[int, list[Execution]] = {}
    for e in executions:
        by_job.setdefault(e.job, []).append(e)
    bad = []
    for runs in by_job.values():
        runs.sort(key=lambda e: e.started)
        for i, later in enumerate(runs):
            bad += [(earlier, later) for earlier in runs[:i] if later.started < earlier.last_seen]
    return bad
