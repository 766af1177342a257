"""The handler of bench/chaos_soak.py (imported by the daemons' children).

Every execution is recorded to the file $CHAOS_EXECS, one JSON line per event with
time.time(): `start`, `alive` every step, then how it ended (`done`, `raise`, `crash`,
`interrupted`, `wait`: it raised pgworkerd.WaitFor); a killed execution just stops
writing. File, not table: PostgreSQL is
restarted during the soak, and a record must never depend on it. Each line is one
O_APPEND write, so children of all daemons share the file.

Each execution also starts two `sleep`s that would run for a day, in a session of their
own, one of them double-forked away from the handler (a backgrounded process of a shell
that then execs): argv[0] of both is $CHAOS_MARKER, and the soak checks that none is left
once the run settled, whatever killed their job (containment).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from typing import Any

import pgworkerd
from pgworkerd.worker import JobContext, JobInterrupted

STEP = 0.2
# `exec -a` names the process; the first sleep is orphaned when the shell execs the second.
_LEFTOVERS = 'exec -a "$0" sleep 86400 & exec -a "$0" sleep 86401'


def _record(job: JobContext, event: str, **extra: Any) -> None:
    line = {
        "j": job.id,
        "a": job.attempt,
        "tag": os.environ.get("CHAOS_TAG", ""),
        "pid": os.getpid(),
        "e": event,
        "t": time.time(),
        **extra,
    }
    fd = os.open(os.environ["CHAOS_EXECS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def run(job: JobContext) -> Any:
    """Works payload["d"] seconds with progress heartbeats, then raises with probability
    payload["raise"], dies by os._exit with probability payload["crash"], else returns."""
    rng = random.Random()  # seeded per child: forked children share the parent's state
    p = job.payload
    _record(job, "start")
    subprocess.Popen(
        ["bash", "-c", _LEFTOVERS, os.environ["CHAOS_MARKER"]],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
    )
    end = time.monotonic() + float(p["d"])
    n = 0
    while True:
        n += 1
        _record(job, "alive")
        job.heartbeat(progress={"step": n})
        if job.stop_requested:
            _record(job, "interrupted")
            raise JobInterrupted("stopping early: drain or cancel")
        left = end - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(STEP, left))
    r = rng.random()
    if r < float(p.get("crash", 0)):
        _record(job, "crash")
        os._exit(3)
    if r < float(p.get("crash", 0)) + float(p.get("raise", 0)):
        _record(job, "raise")
        raise RuntimeError(f"chaos: attempt {job.attempt} fails")
    _record(job, "done")
    result = {"attempt": job.attempt, "pid": os.getpid(), "tag": os.environ.get("CHAOS_TAG", "")}
    if "then" in p:  # a fan-out: its follow-ups, inserted with its completion
        return pgworkerd.Done(result, then=follow_ups(job, int(p["then"])))
    return result


def follow_ups(job: JobContext, count: int) -> list[pgworkerd.JobSpec]:
    """Short chaos jobs naming the job that returned them and their position."""
    payload = {"d": 0.05, "raise": 0.05, "crash": 0.01, "follow_up_of": job.id}
    return [pgworkerd.JobSpec("chaos", {**payload, "n": n}, max_attempts=10) for n in range(count)]


def wait(job: JobContext) -> Any:
    """Waits for signal payload["signal"] (its first start), under correlation key
    payload["key"] when there is one, then works as `run` does and returns what woke it:
    the soak checks that every signal it sent woke its job. Each execution after the wait
    records the payload it sees (event `seen`): a keyed job must see its one signal, the
    same on every later attempt, and never wait again."""
    if job.waited_for is None:
        _record(job, "start")
        _record(job, "wait")
        raise pgworkerd.WaitFor(
            job.payload["signal"], timeout=job.payload["timeout"], key=job.payload.get("key")
        )
    seen = None if job.signal is None else job.signal.payload
    _record(job, "seen", payload=seen)
    result = run(job)
    return {**result, "signal": seen}
