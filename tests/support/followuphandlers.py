"""Handlers for tests/fault/test_follow_ups_faults.py (follow-ups atomic with the finish,
and job.lease_token), imported by the daemon's children through PYTHONPATH.

They talk to the test through files in payload["dir"] (the database may be the thing a
test is cutting off, and a file needs no connection): `ready-<attempt>` (the attempt's
pid, written when it waits at its gate), `go` (the test lets gated attempts return),
`token-<attempt>` (the attempt's job id and lease token, for a writer outside the job's
process tree).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pgworkerd
from pgworkerd import JobSpec
from pgworkerd.worker import JobContext


def _gate(job: JobContext) -> None:
    """Wait for the test's `go` if payload["gate"] lists this attempt."""
    p = job.payload
    if job.attempt not in p.get("gate", []):
        return
    folder = Path(p["dir"])
    (folder / f"ready-{job.attempt}").write_text(str(os.getpid()))
    while not (folder / "go").exists():
        time.sleep(0.02)


def fan_out(job: JobContext) -> Any:
    """Complete with payload["n"] follow-ups of handler `leaf`, each naming this job and
    its place (waiting at the gate first when asked)."""
    _gate(job)
    n = int(job.payload["n"])
    then = [JobSpec("leaf", {"parent": job.id, "n": i}) for i in range(n)]
    return pgworkerd.Done({"attempt": job.attempt}, then=then)


def leaf(job: JobContext) -> Any:
    return {"leaf": job.payload["n"]}


def bad_then(job: JobContext) -> Any:
    """Return follow-ups of the kind payload["kind"] names: `text` (not a list), `dicts`
    (a list of dicts, not of JobSpec), `too_many` (1001 jobs), `bound` (a job an enqueue
    bound refuses: priority -5)."""
    kind = job.payload["kind"]
    then: Any = {
        "text": "leaf",
        "dicts": [{"handler": "leaf"}],
        "too_many": [JobSpec("leaf", {"n": i}) for i in range(1001)],
        "bound": [JobSpec("leaf", {"n": 0}, priority=-5)],
    }[kind]
    return pgworkerd.Done({"kind": kind}, then=then)


def hand_token_out(job: JobContext) -> Any:
    """Give this attempt's job id and lease token to a writer outside the job (a file the
    test reads), then wait at the gate (attempt 1 is left there until the watcher stops
    it) and return."""
    folder = Path(job.payload["dir"])
    token_file = folder / f"token-{job.attempt}"
    token_file.write_text(json.dumps({"id": job.id, "token": job.lease_token}))
    _gate(job)
    return {"attempt": job.attempt}
