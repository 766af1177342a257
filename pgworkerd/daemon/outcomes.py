"""A job attempt from claim to outcome: what the daemon holds while it runs (InFlight),
what it left (decide), and recording that (write): one fenced statement per kind of
outcome and one log line per job event. Every write names the lease token, so an outcome
whose lease was lost and re-claimed changes nothing and is logged as fenced off (unless
the row shows that an earlier write of the same outcome landed)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from pgworkerd.config import HandlerConfig, WorkerConfig
from pgworkerd.daemon.supervisor import Child
from pgworkerd.durations import format_duration
from pgworkerd.jsontext import storable_text
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.queue import lease

log = logging.getLogger("pgworkerd")

# The child stops itself this long before its lease runs out in the database, leaving
# room for the kill to land and for clock-rate differences.
FENCE_MARGIN_MIN = 1.0
FENCE_MARGIN_FRACTION = 0.1


def fence_margin(lease: float) -> float:
    """How long before the lease's end (as the daemon last renewed it) the job stops."""
    return min(lease / 2, max(FENCE_MARGIN_MIN, lease * FENCE_MARGIN_FRACTION))


@dataclass
class Outcome:
    """What to write for a finished attempt; kept until the database takes it."""

    job: lease.ClaimedJob | lease.RefusedJob
    handler: HandlerConfig | None  # None: a refused row's handler name did not decode
    kind: str  # complete, fail, release, cancel, bury
    duration: float
    result: Any = None
    error: str = ""
    progress: Any = None
    checkpoint: Any = None  # the attempt's latest, if not saved yet (None: keep)
    backoff: tuple[float, float] = (10.0, 3600.0)
    failed_writes: int = 0
    retry_in: float | None = None  # set once written: seconds until the retry is due

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


@dataclass(eq=False)
class InFlight:
    """A claimed job this daemon holds, from claim to recorded outcome."""

    job: lease.ClaimedJob
    handler: HandlerConfig
    lease: float
    claimed_at: float
    deadline: float  # monotonic: stop the child here if no renewal came
    child: Child | None = None
    started_at: float | None = None
    last_beat: float = 0.0
    progress: Any = None
    checkpoint: Any = None
    unsaved: bool = False  # progress or checkpoint not yet in the row
    stop_reason: str | None = None  # drain, terminate, timeout, stuck, cancel, lease lost
    kill_at: float | None = None  # SIGKILL the child's group at this time
    report: dict[str, Any] | None = None
    cancel_seen: bool = False  # the database asked to cancel this job

    @property
    def name(self) -> str:
        return f"job {self.job.id} {self.job.handler} attempt {self.job.attempt}"


def decide(
    job: InFlight,
    report: dict[str, Any] | None,
    exit_description: str,
    draining: bool,
    worker: WorkerConfig,
) -> Outcome:
    """The outcome of a finished attempt, from the child's report (None if it died
    without one) and why the daemon stopped it, if it did. A reported result always wins."""
    duration = time.monotonic() - (job.started_at or job.claimed_at)
    h, reason = job.handler, job.stop_reason
    kind, error, result = "fail", "", None
    # the handler stopped itself (JobInterrupted) after a drain or cancel request
    interrupted = report is not None and report["t"] == "interrupted"
    if report is not None and report["t"] == "done":
        kind, result = "complete", report.get("result")
    elif reason in ("drain", "terminate") or (interrupted and draining):
        kind = "release"
    elif reason == "cancel" or (interrupted and job.cancel_seen):
        kind, error = "cancel", "cancelled while running"
    elif reason == "lease lost":
        error = "stopped: the lease could not be renewed in time"
    elif reason == "timeout":
        error = f"timed out after {format_duration(h.timeout or 0)}"
    elif reason == "stuck":
        error = f"no heartbeat for {format_duration(h.heartbeat_timeout or 0)}: stuck"
    elif report is not None and report["t"] == "error":
        error = report["error"] + ("\n" + report["traceback"] if report["traceback"] else "")
    elif report is not None:
        error = f"interrupted from outside the daemon: {report.get('error')}"
    else:
        error = f"child process {exit_description or 'vanished'}"
    if reason in ("timeout", "stuck") and report is not None and report.get("traceback"):
        error += "\n" + report["traceback"]
    backoff = (
        h.backoff if h.backoff is not None else worker.backoff,
        h.backoff_max if h.backoff_max is not None else worker.backoff_max,
    )
    return Outcome(
        job.job,
        h,
        kind,
        duration,
        result,
        storable_text(error),  # whatever the child sent, text the row can hold
        job.progress,
        job.checkpoint if job.unsaved else None,
        backoff,
    )


def write(
    conn: psycopg.Connection,
    worker: str,
    schema: str,
    batch: list[Outcome],
    metrics: NullMetrics | None = None,
) -> bool:
    """Write a batch: completions (any number, one statement) or one other outcome."""
    if all(o.kind == "complete" for o in batch):
        done = lease.complete_many(
            conn,
            worker,
            [lease.Completion(o.job.id, o.job.token, o.result, o.progress) for o in batch],
            schema=schema,
        )
        for o in batch:
            _report(
                metrics,
                o,
                *_checked(
                    conn, schema, o, o.job.id in done, f"{o.name}: completed in {o.duration:.2f}s"
                ),
            )
        return True
    [o] = batch
    j, took = o.job, f"{o.duration:.2f}s"
    if o.kind == "release":
        released = lease.release(
            conn,
            worker,
            j.id,
            j.token,
            progress=o.progress,
            checkpoint=o.checkpoint,
            schema=schema,
        )
        ok = released is not None
        message = f"{o.name}: released after {took} (attempt not counted)"
    elif o.kind == "cancel":
        ok = lease.cancel_running(
            conn, worker, j.id, j.token, o.error, progress=o.progress, schema=schema
        )
        message = f"{o.name}: cancelled after {took}"
    elif o.kind == "bury":
        ok = lease.bury(conn, worker, j.id, j.token, o.error, schema=schema)
        message = f"{o.name}: dead at once: {o.error}"
    else:
        failed = lease.fail(
            conn,
            worker,
            j.id,
            j.token,
            o.error,
            backoff_base=o.backoff[0],
            backoff_max=o.backoff[1],
            progress=o.progress,
            checkpoint=o.checkpoint,
            schema=schema,
        )
        ok = failed is not None
        o.retry_in = None if failed is None else failed.retry_in
        first = o.error.splitlines()[0] if o.error else "failed"
        message = f"{o.name}: failed after {took}: {first}; " + (
            ""
            if failed is None
            else f"retry at {failed.run_at:%H:%M:%S}"
            if failed.status == "pending"
            else f"now {failed.status}"
        )
    _report(metrics, o, *_checked(conn, schema, o, ok, message))
    return True


def _checked(
    conn: psycopg.Connection, schema: str, o: Outcome, ok: bool, message: str
) -> tuple[bool, str]:
    """(ok, message) of a write, a rejection that had in fact landed earlier counted ok."""
    if not ok and _recorded_earlier(conn, schema, o):
        return True, f"{o.name}: {o.kind} already recorded by an earlier write"
    return ok, message


# What each outcome leaves in the row, under the token it was written with.
_STATUS_AFTER = {
    "complete": {"completed"},
    "release": {"pending", "cancelled"},
    "cancel": {"cancelled"},
    "fail": {"pending", "dead", "cancelled"},
    "bury": {"dead"},
}


def _recorded_earlier(conn: psycopg.Connection, schema: str, o: Outcome) -> bool:
    """Whether a rejected outcome is in the row already: an earlier write committed but
    its reply was lost (the connection died), so the daemon wrote it again. The token is
    still ours (every claim, and every burial of an expired job, bumps it), nobody holds
    the job, and the row is in a state this outcome leaves."""
    row = lease.lease_state(conn, o.job.id, schema=schema)
    return (
        row is not None
        and row.token == o.job.token
        and row.locked_by is None
        and row.status in _STATUS_AFTER[o.kind]
    )


def _report(metrics: NullMetrics | None, o: Outcome, ok: bool, message: str) -> None:
    if metrics is not None:
        metrics.outcome(o.job.handler, o.kind, ok)
    if ok:
        level = (
            logging.ERROR
            if o.kind == "bury"
            else logging.WARNING
            if o.kind == "fail"
            else logging.INFO
        )
        log.log(level, "%s", message, extra=o.fields(o.kind))
    else:
        log.warning(
            "%s: outcome %s rejected: the lease was lost and the job re-claimed (fenced off)",
            o.name,
            o.kind,
            extra=o.fields("fenced"),
        )
