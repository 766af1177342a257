"""Recording an attempt's outcome: the fenced write protocol, beside the statements it
chooses among (queue.lease).

One call goes down to the database once and comes back with what happened (`Recorded`);
the caller (the daemon's Statements) logs and counts it afterwards. The protocol:

- which statement: completions in one statement (job_complete, or with the next claim in
  one transaction: complete_and_claim; job_complete_with_follow_ups when a job of the
  batch returned follow-ups); every other kind one job at a time (job_fail,
  job_release, job_cancel_running, job_bury for a burial and a give-up, job_snooze);
- a completion whose follow-ups the database refused (an invalid job, a bound) is left
  running by that statement and written as a failed attempt instead (kind "fail", the
  error saying why);
- a snooze past the handler's max_snoozes, while the job is still ours, is written as a
  failed attempt instead (kind "fail", the error saying why);
- a rejected write (no row: the lease token no longer matches) is read back: when the row
  shows this outcome under our token with nobody holding the job, an earlier write of it
  committed and only its reply was lost (`earlier`: counted as recorded, not fenced off).
  Every claim, and every burial of an expired job, gives the job a new token, so the token
  being ours proves no other attempt came in between (the read-back asks whether the job
  still has our token: the daemon role reads no other, schema 24).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from pgworkerd.jsontext import storable_text
from pgworkerd.queue import lease
from pgworkerd.queue.queries import DEFAULT_SCHEMA

# The outcome kinds (the daemon's states.OutcomeKind values) and the statuses each leaves
# in the row, under the token it was written with.
STATUS_AFTER: Mapping[str, frozenset[str]] = {
    "complete": frozenset({"completed"}),
    "release": frozenset({"pending", "cancelled"}),
    "cancel": frozenset({"cancelled"}),
    "fail": frozenset({"pending", "dead", "cancelled"}),
    "bury": frozenset({"dead"}),
    "give up": frozenset({"dead"}),
    # a snooze past max_snoozes is written as a failed attempt
    "snooze": frozenset({"pending", "dead", "cancelled"}),
    # a WaitFor (0028): suspended, or pending at once when its signal had come; a wait
    # refused (its correlation key held by another live job) is written as a failed attempt
    "wait": frozenset({"suspended", "pending", "dead", "cancelled"}),
}


@dataclass(frozen=True)
class OutcomeWrite:
    """One attempt's outcome to record, under the lease token it was claimed with."""

    kind: str  # a key of STATUS_AFTER
    id: int
    token: int
    handler: str
    result: Any = None  # complete
    error: str = ""  # fail, cancel, bury, give up; a snooze's reason
    progress: Any = None  # None keeps the saved one
    checkpoint: Any = None  # None keeps the saved one (not for complete, cancel, bury)
    backoff_base: float = 10.0  # fail
    backoff_max: float = 3600.0
    delay: float = 0.0  # snooze: seconds until the job runs again
    max_snoozes: int = 0  # snooze: how many the handler allows
    # wait: the signal name, the timeout in seconds and the correlation key (or None)
    wait_name: str = ""
    wait_timeout: float = 0.0
    wait_key: str | None = None
    follow_ups: Any = None  # complete: the follow-up jobs' objects (None: none)

    def __post_init__(self) -> None:
        if self.kind not in STATUS_AFTER:
            raise ValueError(f"no such outcome kind: {self.kind!r}")


@dataclass(frozen=True)
class Recorded:
    """What became of one OutcomeWrite."""

    landed: bool  # the outcome is in the row (now, or by an earlier write: `earlier`)
    kind: str  # what was written: a snooze past max_snoozes is a "fail"
    error: str  # the error written (a snooze turned failure says why)
    earlier: bool = False  # rejected now, but an earlier write of it had landed
    status: str | None = None  # the job's new status, when this write landed
    run_at: datetime | None = None  # fail, snooze: when it runs again
    retry_in: float | None = None  # fail, snooze: seconds until then (pending only)
    snoozes: int | None = None  # snooze: the job's snoozes, this one included
    wait_until: datetime | None = None  # wait: when it times out
    follow_up_ids: list[int] | None = None  # complete: the follow-ups it inserted


def record(
    conn: psycopg.Connection[Any],
    worker: str,
    writes: Sequence[OutcomeWrite],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> list[Recorded]:
    """Record a batch: completions (any number, one statement) or one other outcome."""
    if all(w.kind == "complete" for w in writes):
        if any(w.follow_ups for w in writes):
            return _complete_with_follow_ups(conn, worker, writes, schema)
        done = lease.complete_many(conn, worker, completions(writes), schema=schema)
        return completed(conn, writes, done, schema=schema)
    [w] = writes
    return [_record_one(conn, worker, w, schema)]


def complete_and_claim(
    conn: psycopg.Connection[Any],
    worker: str,
    writes: Sequence[OutcomeWrite],
    *,
    queues: Sequence[str],
    handlers: Mapping[str, lease.HandlerCapacity],
    limit: int,
    schema: str = DEFAULT_SCHEMA,
) -> tuple[list[Recorded], list[lease.ClaimedJob], list[lease.RefusedJob]]:
    """Record completions and claim the next jobs in one transaction (lease.complete_and_
    claim); returns what became of each completion, the jobs claimed and those refused."""
    done, claimed, refused = lease.complete_and_claim(
        conn,
        worker,
        completions(writes),
        queues=queues,
        handlers=handlers,
        limit=limit,
        schema=schema,
    )
    return completed(conn, writes, done, schema=schema), claimed, refused


def completions(writes: Sequence[OutcomeWrite]) -> list[lease.Completion]:
    return [lease.Completion(w.id, w.token, w.result, w.progress, w.follow_ups) for w in writes]


def _complete_with_follow_ups(
    conn: psycopg.Connection[Any], worker: str, writes: Sequence[OutcomeWrite], schema: str
) -> list[Recorded]:
    """Completions of which some carry follow-ups: each completion and its follow-ups in
    one transaction; one whose follow-ups were refused (still ours, nothing changed) is
    written as a failed attempt saying why."""
    outcome = lease.complete_with_follow_ups(conn, worker, completions(writes), schema=schema)
    recorded = []
    for w in writes:
        o = outcome.get(w.id)
        if o is None:
            recorded.append(_rejected(conn, w, w.kind, w.error, schema))
        elif o.refused is None:
            recorded.append(
                Recorded(True, "complete", "", status="completed", follow_up_ids=o.follow_up_ids)
            )
        else:
            failure = OutcomeWrite(
                "fail",
                w.id,
                w.token,
                w.handler,
                error=storable_text(o.refused),
                progress=w.progress,
                backoff_base=w.backoff_base,
                backoff_max=w.backoff_max,
            )
            recorded.append(_record_one(conn, worker, failure, schema))
    return recorded


def completed(
    conn: psycopg.Connection[Any],
    writes: Sequence[OutcomeWrite],
    done: set[int],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> list[Recorded]:
    """What became of completions of which the database took the ids `done`."""
    return [
        Recorded(True, "complete", "", status="completed")
        if w.id in done
        else _rejected(conn, w, w.kind, w.error, schema)
        for w in writes
    ]


def _record_one(
    conn: psycopg.Connection[Any], worker: str, w: OutcomeWrite, schema: str
) -> Recorded:
    kind, error = w.kind, w.error
    if kind == "release":
        status = lease.release(
            conn,
            worker,
            w.id,
            w.token,
            progress=w.progress,
            checkpoint=w.checkpoint,
            schema=schema,
        )
        if status is not None:
            return Recorded(True, kind, error, status=status)
    elif kind == "cancel":
        if lease.cancel_running(
            conn, worker, w.id, w.token, error, progress=w.progress, schema=schema
        ):
            return Recorded(True, kind, error, status="cancelled")
    elif kind in ("bury", "give up"):
        if lease.bury(conn, worker, w.id, w.token, error, schema=schema):
            return Recorded(True, kind, error, status="dead")
    elif kind == "snooze":
        snoozed = lease.snooze(
            conn,
            worker,
            w.id,
            w.token,
            w.delay,
            max_snoozes=w.max_snoozes,
            progress=w.progress,
            checkpoint=w.checkpoint,
            schema=schema,
        )
        if snoozed is not None:
            return Recorded(
                True,
                kind,
                error,
                status=snoozed.status,
                run_at=snoozed.run_at,
                retry_in=snoozed.retry_in,
                snoozes=snoozed.snoozes,
            )
        if not _held(conn, worker, w, schema):
            return _rejected(conn, w, kind, error, schema)  # fenced off, or written earlier
        # Still ours: max_snoozes is used up, and this snooze is a failed attempt.
        kind = "fail"
        error = storable_text(
            f"snoozed {w.max_snoozes} times already (max_snoozes of handler {w.handler}): "
            f"this snooze counts as a failed attempt ({w.error})"
        )
    elif kind == "wait":
        waited = lease.suspend(
            conn,
            worker,
            w.id,
            w.token,
            w.wait_name,
            w.wait_timeout,
            key=w.wait_key,
            progress=w.progress,
            checkpoint=w.checkpoint,
            schema=schema,
        )
        if waited is not None and waited.status != "refused":
            return Recorded(True, kind, error, status=waited.status, wait_until=waited.wait_until)
        if waited is None:
            return _rejected(conn, w, kind, error, schema)  # fenced off, or written earlier
        # Still ours, but the wait was refused (its key is another live job's): a failed
        # attempt that says why.
        kind, error = "fail", storable_text(waited.problem or "WaitFor refused")
    if kind == "fail":
        failed = lease.fail(
            conn,
            worker,
            w.id,
            w.token,
            error,
            backoff_base=w.backoff_base,
            backoff_max=w.backoff_max,
            progress=w.progress,
            checkpoint=w.checkpoint,
            schema=schema,
        )
        if failed is not None:
            return Recorded(
                True,
                kind,
                error,
                status=failed.status,
                run_at=failed.run_at,
                retry_in=failed.retry_in,
            )
    return _rejected(conn, w, kind, error, schema)


def _held(conn: psycopg.Connection[Any], worker: str, w: OutcomeWrite, schema: str) -> bool:
    """The job is running under this worker and the write's token."""
    row = lease.lease_state(conn, w.id, w.token, schema=schema)
    return (
        row is not None
        and row.token == w.token
        and row.locked_by == worker
        and row.status == "running"
    )


def _rejected(
    conn: psycopg.Connection[Any], w: OutcomeWrite, kind: str, error: str, schema: str
) -> Recorded:
    """A write the fence rejected: recorded after all if an earlier write of the same
    outcome landed (its reply was lost), else fenced off."""
    row = lease.lease_state(conn, w.id, w.token, schema=schema)
    earlier = (
        row is not None
        and row.token == w.token
        and row.locked_by is None
        and row.status in STATUS_AFTER[w.kind]
    )
    return Recorded(earlier, kind, error, earlier=earlier)
