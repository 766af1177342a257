"""Recording what a finished attempt left: one fenced statement per kind of outcome, and
one log line per job event. Every write names the lease token, so an outcome whose lease
was lost and re-claimed changes nothing and is logged as fenced off."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg

from pgworkerd import jobs
from pgworkerd.config import HandlerConfig

log = logging.getLogger("pgworkerd")


@dataclass
class Outcome:
    """What to write for a finished attempt; kept until the database takes it."""

    job: jobs.ClaimedJob
    handler: HandlerConfig
    kind: str  # complete, fail, release, cancel
    duration: float
    result: Any = None
    error: str = ""
    progress: Any = None
    backoff: tuple[float, float] = (10.0, 3600.0)
    failed_writes: int = 0

    @property
    def name(self) -> str:
        return f"job {self.job.id} {self.job.handler} attempt {self.job.attempt}"

    def fields(self, event: str) -> dict[str, Any]:
        return {
            "fields": {
                "job_id": self.job.id,
                "handler": self.job.handler,
                "attempt": self.job.attempt,
                "duration": round(self.duration, 3),
                "event": event,
            }
        }


def write(conn: psycopg.Connection, worker: str, schema: str, batch: list[Outcome]) -> bool:
    """Write a batch: completions (any number, one statement) or one other outcome."""
    if all(o.kind == "complete" for o in batch):
        done = jobs.complete_many(
            conn,
            worker,
            [jobs.Completion(o.job.id, o.job.token, o.result, o.progress) for o in batch],
            schema=schema,
        )
        for o in batch:
            _report(o, o.job.id in done, f"{o.name}: completed in {o.duration:.2f}s")
        return True
    [o] = batch
    j, took = o.job, f"{o.duration:.2f}s"
    if o.kind == "release":
        ok = jobs.release(conn, worker, j.id, j.token, schema=schema) is not None
        message = f"{o.name}: released after {took} (attempt not counted)"
    elif o.kind == "cancel":
        ok = jobs.cancel_running(conn, worker, j.id, j.token, o.error, schema=schema)
        message = f"{o.name}: cancelled after {took}"
    else:
        failed = jobs.fail(
            conn,
            worker,
            j.id,
            j.token,
            o.error,
            backoff_base=o.backoff[0],
            backoff_max=o.backoff[1],
            schema=schema,
        )
        ok = failed is not None
        first = o.error.splitlines()[0] if o.error else "failed"
        message = f"{o.name}: failed after {took}: {first}; " + (
            ""
            if failed is None
            else f"retry at {failed.run_at:%H:%M:%S}"
            if failed.status == "pending"
            else f"now {failed.status}"
        )
    _report(o, ok, message)
    return True


def _report(o: Outcome, ok: bool, message: str) -> None:
    if ok:
        level = logging.WARNING if o.kind == "fail" else logging.INFO
        log.log(level, "%s", message, extra=o.fields(o.kind))
    else:
        log.warning(
            "%s: outcome %s rejected: the lease was lost and the job re-claimed (fenced off)",
            o.name,
            o.kind,
            extra=o.fields("fenced"),
        )
