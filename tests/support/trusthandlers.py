"""Handlers for the trust-boundary tests (tests/fault/test_poison.py): jobs whose own data or
output is hostile, and handlers that leave a checkpoint just before their attempt ends."""

from __future__ import annotations

import os
import time
from typing import Any

from pgworkerd.worker import protocol
from pgworkerd.worker.child import JobContext, JobInterrupted, _check_storable


def deepest_result(job: JobContext) -> Any:
    """Returns the most deeply nested list this child can still encode: the daemon has to
    read it back at whatever stack depth its own loop is at."""
    for depth in range(1000, 0, -10):
        value: Any = 1
        for _ in range(depth):
            value = [value]
        try:
            # what the child does with a result before it sends it
            _check_storable(value)
            protocol.encode(protocol.Done(job.id, value))
        except RecursionError:
            continue
        return value
    return None


def huge_result(job: JobContext) -> str:
    """A result over the parent-child frame limit (64 MiB)."""
    return "x" * (int(job.payload.get("mb", 70)) * 1024 * 1024)


def checkpoint_then_fail(job: JobContext) -> dict[str, Any]:
    """Attempt 1 saves a checkpoint and fails at once; a later attempt returns the
    checkpoint it was handed."""
    if job.checkpoint is None:
        job.heartbeat(progress={"done": 1}, checkpoint={"step": 1})
        raise RuntimeError("failing right after the checkpoint")
    return {"resumed_from": job.checkpoint}


def checkpoint_on_stop(job: JobContext) -> dict[str, Any]:
    """Waits until the daemon asks it to stop, saves a checkpoint and hands the job back;
    a later attempt returns the checkpoint it was handed."""
    if job.checkpoint is not None:
        return {"resumed_from": job.checkpoint}
    deadline = time.monotonic() + 60
    while not job.stop_requested and time.monotonic() < deadline:
        time.sleep(0.02)
    job.heartbeat(checkpoint={"step": "saved on stop"})
    raise JobInterrupted("stopping on request")


def fail_once(job: JobContext) -> dict[str, Any]:
    """Fails attempt 1, succeeds after."""
    if job.attempt == 1:
        raise RuntimeError("first attempt fails")
    return {"attempt": job.attempt}


def unstorable_text(job: JobContext) -> Any:
    """Hands the daemon a string jsonb rejects (a file name that is not UTF-8, decoded with
    surrogateescape) in the place payload["where"] names: "progress" or "result"."""
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")
    if job.payload["where"] == "progress":
        job.heartbeat(progress={"file": name})
        time.sleep(3)
    return {"file": name}


def fail_naming_a_bad_file(job: JobContext) -> None:
    """Fails with an error that quotes a file name that is not UTF-8 (a lone surrogate)."""
    raise FileNotFoundError(f"no such file: {os.fsdecode(b'caf' + bytes([0xE9]))}")


def neighbours(job: JobContext) -> dict[str, Any]:
    """What a job can reach of the daemon that runs it (README "Who can do what"): its
    uid, whether it may signal the daemon (kill with signal 0 checks only the right), the
    daemon's config file and its /proc environ (readable by its own user only)."""
    daemon_pid = int(job.payload["daemon_pid"])
    try:
        os.kill(daemon_pid, 0)
        signal_daemon = True
    except PermissionError:
        signal_daemon = False
    try:
        with open(job.payload["config"]) as config:
            text: str | None = config.read()
    except OSError:
        text = None
    try:
        with open(f"/proc/{daemon_pid}/environ", "rb") as environ:
            daemon_environ = bool(environ.read())
    except OSError:
        daemon_environ = False
    return {
        "uid": os.getuid(),
        "euid": os.geteuid(),
        "signal_daemon": signal_daemon,
        "config": text,
        "daemon_environ": daemon_environ,
    }
