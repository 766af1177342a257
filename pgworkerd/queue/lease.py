"""The daemon's fenced statements and their records: claim, renew, complete, fail, release,
cancel a running job, bury, and read a job's lease.

Every write names the worker and the lease token it holds: zero rows back means the lease
was lost, and the caller handles that on purpose. These statements are the daemon's own
(the application enqueues through pgworkerd.client, operators through queue.admin), so
they always go through queue.hotpath, which runs them below psycopg's cursor when the
installed psycopg passed hotpath's import-time probe and through a plain cursor otherwise.
Each function takes a connection owned by the caller and commits at once on an autocommit
connection (or joins the caller's transaction).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgworkerd.jsontext import storable_json
from pgworkerd.queue import hotpath, records
from pgworkerd.queue.queries import DEFAULT_SCHEMA


@records.built_from("job_claim")
@dataclass(frozen=True)
class ClaimedJob:
    """What a child needs to run a job, as the claim returned it (job_claim's columns)."""

    id: int
    queue: str
    handler: str
    payload: dict[str, Any]
    priority: int
    attempt: int
    max_attempts: int
    token: int
    checkpoint: Any
    run_at: datetime
    created_at: datetime
    locked_until: datetime
    rescued: bool
    # schema 27 (claim_jobs_v2): the job's own timeout, overriding its handler's (None:
    # the handler's), and its parents' results by parent id (None: it has no parents)
    timeout_seconds: float | None = None
    parents: dict[str, Any] | None = None
    # some job waits for this one (as claimed): the daemon claims with its completion
    has_children: bool = False
    # schema 31 (claim_jobs_v3): what ended the job's last wait (WaitFor), None for a job
    # that never waited: the name it waited for, how it ended ("signal" or "timeout"), and
    # the signal's payload and time (None unless a signal ended it)
    wait_for: str | None = None
    wait_ended: str | None = None
    signal_payload: Any = None
    signal_sent_at: datetime | None = None
    # a batch's callback: its batch (the counts and its first 100 members' outcomes, as
    # the child's Job message carries it: protocol.Job.batch); None for any other job
    batch: Any = None
    # schema 39: the enqueuer's W3C trace context ({"traceparent", "tracestate"}: the
    # child's Job message carries it while [tracing] is enabled, protocol.Job.trace);
    # None: enqueued outside a trace
    trace: Any = None

    @property
    def woken(self) -> dict[str, Any] | None:
        """What woke the job, as the child's Job message carries it (protocol.Job.woken);
        None: it never waited."""
        if self.wait_for is None:
            return None
        sent_at = self.signal_sent_at
        return {
            "name": self.wait_for,
            "ended": self.wait_ended,
            "payload": self.signal_payload,
            "sent_at": sent_at.isoformat() if sent_at is not None else None,
        }


@dataclass(frozen=True)
class HandlerCapacity:
    """A handler a worker serves in one claim: its lease and how many more it may take."""

    lease_seconds: float
    free: int
    max_attempts: int | None = None  # overrides the job's own when set
    queues: Sequence[str] | None = None  # the queues it claims from; None: all (schema 6)
    # fleet-wide: at most this many current leases in all, and per concurrency key
    # (claim_v3, migration 0009); None: no limit
    max_running: int | None = None
    max_running_per_key: int | None = None
    # fair share and start-rate limits (claim_v4, schema 33): served by concurrency key in
    # turns, with jobs per turn by key; starts per second fleet-wide and per key (None: none)
    fair: bool = False
    weights: Mapping[str, int] | None = None
    rate: float | None = None
    rate_per_key: float | None = None


@dataclass(frozen=True)
class RefusedJob:
    """A claimed job the claimer cannot run because its row cannot be loaded or handed to
    a child (a number too long for Python, JSON nested too deep, a timestamp out of
    range, a payload over the frame limit): it is finished as dead with `reason`."""

    id: int
    token: int
    handler: str
    attempt: int
    reason: str


def claim_checked(
    conn: psycopg.Connection[Any],
    worker: str,
    *,
    queues: Sequence[str],
    handlers: Mapping[str, HandlerCapacity],
    limit: int,
    schema: str = DEFAULT_SCHEMA,
) -> tuple[list[ClaimedJob], list[RefusedJob]]:
    """Claim up to `limit` due jobs (and rescue expired leases) in one statement; returns
    the jobs to run and those whose rows could not be loaded. The claim has committed:
    the caller must finish every refused job (bury) or its lease runs out."""
    params = _claim_params(worker, queues, handlers, limit)
    if params is None:
        return [], []
    return _claimed(conn, hotpath.run_guarded(conn, "job_claim", params, schema=schema))


def complete_and_claim(
    conn: psycopg.Connection[Any],
    worker: str,
    done: Sequence[Completion],
    *,
    queues: Sequence[str],
    handlers: Mapping[str, HandlerCapacity],
    limit: int,
    schema: str = DEFAULT_SCHEMA,
) -> tuple[set[int], list[ClaimedJob], list[RefusedJob]]:
    """complete_many, then claim_checked, in one transaction and (on the direct path) one
    round trip: a busy worker's finished jobs and its next ones cost one commit, not two.
    The completions come first, so the claim sees the slots they freed (max_running).
    Returns the ids completed, the jobs claimed and the refused ones; all or nothing."""
    params = _claim_params(worker, queues, handlers, limit)
    if params is None:
        return complete_many(conn, worker, done, schema=schema), [], []
    if not done:
        return set(), *claim_checked(
            conn, worker, queues=queues, handlers=handlers, limit=limit, schema=schema
        )
    finished, claim_rows = hotpath.run_together(
        conn,
        [
            hotpath.Step("job_complete", _complete_params(worker, done)),
            hotpath.Step("job_claim", params, guarded=True),
        ],
        schema=schema,
    )
    return {r[0] for r in finished}, *_claimed(conn, claim_rows)  # job_complete: ids only


def _claim_params(
    worker: str, queues: Sequence[str], handlers: Mapping[str, HandlerCapacity], limit: int
) -> dict[str, Any] | None:
    """job_claim's parameters; None when there is nothing to claim for."""
    served = {name: cap for name, cap in handlers.items() if cap.free > 0}
    if limit <= 0 or not served or not queues:
        return None
    return {
        "worker": worker,
        "queues": list(queues),
        "handlers": json.dumps([_handler_object(name, cap) for name, cap in served.items()]),
        "limit": limit,
    }


def _handler_object(name: str, cap: HandlerCapacity) -> dict[str, Any]:
    """One handler of claim_jobs_v3's `handlers`: what is unset is left out (none)."""
    found: dict[str, Any] = {"name": name, "lease_seconds": cap.lease_seconds, "free": cap.free}
    optional = {
        "max_attempts": cap.max_attempts,
        "queues": _list_or_none(cap.queues),
        "max_running": cap.max_running,
        "max_running_per_key": cap.max_running_per_key,
        # schema 33 (claim_v4): fair share and start rates (starts per second)
        "fair": cap.fair or None,
        "weights": dict(cap.weights) if cap.weights else None,
        "rate": cap.rate,
        "rate_per_key": cap.rate_per_key,
    }
    found.update((key, value) for key, value in optional.items() if value is not None)
    return found


def _claimed(
    conn: psycopg.Connection[Any], rows: hotpath.Rows[tuple[Any, ...] | hotpath.UnloadableRow]
) -> tuple[list[ClaimedJob], list[RefusedJob]]:
    claimed: list[ClaimedJob] = []
    refused: list[RefusedJob] = []
    for row in rows:
        if isinstance(row, hotpath.UnloadableRow):
            refused.append(_refused(rows.columns, row.raw, row.reason, conn.info.encoding))
        else:
            claimed.append(records.build(ClaimedJob, rows.columns, row))
    claimed.sort(key=lambda j: (j.priority, j.run_at, j.id))
    return claimed, refused


def _list_or_none(queues: Sequence[str] | None) -> list[str] | None:
    return None if queues is None else list(queues)


def _refused(
    columns: Sequence[str], raw: tuple[bytes | None, ...], reason: str, encoding: str
) -> RefusedJob:
    # The columns of job_claim as the server sent them (text format), by name. Integers
    # and text always load; the bad value is elsewhere in the row.
    def text(name: str) -> str:
        value = records.column(columns, raw, name)
        return "" if value is None else value.decode(encoding, errors="replace")

    return RefusedJob(
        id=int(text("id")),
        token=int(text("token")),
        handler=text("handler"),
        attempt=int(text("attempt")),
        reason=reason,
    )


@dataclass(frozen=True)
class Lease:
    """One lease to renew, with progress and checkpoint to save (None: keep)."""

    id: int
    token: int
    lease_seconds: float
    progress: Any = None
    checkpoint: Any = None


@records.built_from("job_renew")
@dataclass(frozen=True)
class RenewOutcome:
    id: int
    renewed: bool
    cancel_requested: bool


class EncodedJson(str):
    """JSON text encoded (and so checked) already, e.g. when a child's message arrived:
    sent as it is, never encoded again inside a statement."""


def encode_json(value: Any) -> EncodedJson:
    """`value` as JSON text that jsonb accepts; raises ValueError (or TypeError,
    RecursionError) if there is none (see jsontext.storable_json)."""
    return EncodedJson(storable_json(value))


def _as_is(text: str) -> str:
    return text


def jsonb_or_none(value: Any) -> Jsonb | None:
    if value is None:
        return None
    if isinstance(value, EncodedJson):
        return Jsonb(value, dumps=_as_is)
    return Jsonb(value)


def renew(
    conn: psycopg.Connection[Any],
    worker: str,
    leases: Sequence[Lease],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> list[RenewOutcome]:
    """Renew many leases in one statement; lost leases come back with renewed=False."""
    if not leases:
        return []
    params = {
        "worker": worker,
        "ids": [lease.id for lease in leases],
        "tokens": [lease.token for lease in leases],
        "lease_seconds": [lease.lease_seconds for lease in leases],
        "progress": [jsonb_or_none(lease.progress) for lease in leases],
        "checkpoints": [jsonb_or_none(lease.checkpoint) for lease in leases],
    }
    rows = hotpath.run(conn, "job_renew", params, schema=schema)
    return [records.build(RenewOutcome, rows.columns, r) for r in rows]


@dataclass(frozen=True)
class Completion:
    id: int
    token: int
    result: Any = None
    progress: Any = None
    # follow-up jobs to enqueue with the completion (enqueue_many_v3's job objects);
    # None: none (complete_with_follow_ups)
    follow_ups: Any = None


def complete_many(
    conn: psycopg.Connection[Any],
    worker: str,
    done: Sequence[Completion],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> set[int]:
    """Complete many held jobs in one statement; returns the ids whose lease still held."""
    if not done:
        return set()
    rows = hotpath.run(conn, "job_complete", _complete_params(worker, done), schema=schema)
    return {r[0] for r in rows}


def _complete_params(worker: str, done: Sequence[Completion]) -> dict[str, Any]:
    return {
        "worker": worker,
        "ids": [d.id for d in done],
        "tokens": [d.token for d in done],
        "results": [jsonb_or_none(d.result) for d in done],
        "progress": [jsonb_or_none(d.progress) for d in done],
    }


@records.built_from("job_complete_with_follow_ups")
@dataclass(frozen=True)
class FollowUpsOutcome:
    """One job of complete_with_follow_ups: completed with the follow-ups inserted
    (follow_up_ids, None: it had none), or left running because its follow-ups were
    refused (refused: why)."""

    id: int
    follow_up_ids: list[int] | None
    refused: str | None


def complete_with_follow_ups(
    conn: psycopg.Connection[Any],
    worker: str,
    done: Sequence[Completion],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> dict[int, FollowUpsOutcome]:
    """Complete many held jobs and insert their follow-ups in one transaction
    (jobs_complete_with_follow_ups, schema 29): by id, what became of each job whose lease
    held; a missing id lost its lease (nothing of it changed, nothing inserted)."""
    if not done:
        return {}
    params = {
        **_complete_params(worker, done),
        "follow_ups": [jsonb_or_none(d.follow_ups) for d in done],
    }
    rows = hotpath.run(conn, "job_complete_with_follow_ups", params, schema=schema)
    outcomes = (records.build(FollowUpsOutcome, rows.columns, r) for r in rows)
    return {o.id: o for o in outcomes}


@records.built_from("job_fail")
@dataclass(frozen=True)
class FailOutcome:
    status: str  # pending (will retry), dead or cancelled
    run_at: datetime
    # seconds until the retry is due, by the server's clock (pending only): fail_job's
    # own figure, the same for every language's worker
    retry_in: float | None = None


def fail(
    conn: psycopg.Connection[Any],
    worker: str,
    job_id: int,
    token: int,
    error: str,
    *,
    backoff_base: float = 10.0,
    backoff_max: float = 3600.0,
    progress: Any = None,
    checkpoint: Any = None,
    schema: str = DEFAULT_SCHEMA,
) -> FailOutcome | None:
    """Record a failed attempt, with its latest progress and checkpoint (None keeps the
    saved ones). None: the lease was lost, nothing changed."""
    rows = hotpath.run(
        conn,
        "job_fail",
        {
            "id": job_id,
            "worker": worker,
            "token": token,
            "error": error,
            "backoff_base": backoff_base,
            "backoff_max": backoff_max,
            "progress": jsonb_or_none(progress),
            "checkpoint": jsonb_or_none(checkpoint),
        },
        schema=schema,
    )
    return records.build(FailOutcome, rows.columns, rows[0]) if rows else None


def release(
    conn: psycopg.Connection[Any],
    worker: str,
    job_id: int,
    token: int,
    *,
    progress: Any = None,
    checkpoint: Any = None,
    schema: str = DEFAULT_SCHEMA,
) -> str | None:
    """Hand a held job back without counting the attempt, with its latest progress and
    checkpoint (None keeps the saved ones); returns its new status."""
    rows = hotpath.run(
        conn,
        "job_release",
        {
            "id": job_id,
            "worker": worker,
            "token": token,
            "progress": jsonb_or_none(progress),
            "checkpoint": jsonb_or_none(checkpoint),
        },
        schema=schema,
    )
    return str(records.column(rows.columns, rows[0], "status")) if rows else None


def cancel_running(
    conn: psycopg.Connection[Any],
    worker: str,
    job_id: int,
    token: int,
    reason: str,
    *,
    progress: Any = None,
    schema: str = DEFAULT_SCHEMA,
) -> bool:
    """The holder stopped a job whose cancel was requested: mark it cancelled."""
    rows = hotpath.run(
        conn,
        "job_cancel_running",
        {
            "id": job_id,
            "worker": worker,
            "token": token,
            "error": reason,
            "progress": jsonb_or_none(progress),
        },
        schema=schema,
    )
    return bool(rows)


def bury(
    conn: psycopg.Connection[Any],
    worker: str,
    job_id: int,
    token: int,
    reason: str,
    *,
    schema: str = DEFAULT_SCHEMA,
) -> bool:
    """The holder cannot run a claimed job at all (its data is unusable): dead at once,
    whatever attempts are left, with the reason. False: the lease was lost."""
    rows = hotpath.run(
        conn,
        "job_bury",
        {"id": job_id, "worker": worker, "token": token, "error": reason},
        schema=schema,
    )
    return bool(rows)


@records.built_from("job_snooze")
@dataclass(frozen=True)
class SnoozeOutcome:
    status: str  # pending (runs again at run_at), or cancelled (a cancel was requested)
    run_at: datetime
    snoozes: int  # the job's snoozes, this one included
    retry_in: float | None = None  # seconds until it is due (pending only)


def snooze(
    conn: psycopg.Connection[Any],
    worker: str,
    job_id: int,
    token: int,
    delay: float,
    *,
    max_snoozes: int,
    progress: Any = None,
    checkpoint: Any = None,
    schema: str = DEFAULT_SCHEMA,
) -> SnoozeOutcome | None:
    """The handler snoozed a held job: pending again in `delay` seconds, the attempt not
    counted (schema 11). None: the lease was lost, or the job has snoozed `max_snoozes`
    times already; nothing changed either way (lease_state tells them apart)."""
    rows = hotpath.run(
        conn,
        "job_snooze",
        {
            "id": job_id,
            "worker": worker,
            "token": token,
            "delay": delay,
            "max_snoozes": max_snoozes,
            "progress": jsonb_or_none(progress),
            "checkpoint": jsonb_or_none(checkpoint),
        },
        schema=schema,
    )
    return records.build(SnoozeOutcome, rows.columns, rows[0]) if rows else None


@records.built_from("job_lease_state")
@dataclass(frozen=True)
class LeaseState:
    status: str
    token: int | None  # the token asked about if the job still has it, else None
    locked_by: str | None


def lease_state(
    conn: psycopg.Connection[Any], job_id: int, token: int, *, schema: str = DEFAULT_SCHEMA
) -> LeaseState | None:
    """Who holds a job, and whether under `token` (None: no such job); loads nothing else,
    and never learns another token (schema 24: the daemon role reads none)."""
    rows = hotpath.run(conn, "job_lease_state", {"id": job_id, "token": token}, schema=schema)
    return records.build(LeaseState, rows.columns, rows[0]) if rows else None


@dataclass(frozen=True)
class Expiring:
    """The running job whose lease runs out first (a rescue, if its holder is dead)."""

    id: int
    queue: str
    handler: str
    holder: str
    expires_in: float  # seconds, by the server's clock (negative: expired already)


@records.built_from("job_next_run_at")
@dataclass(frozen=True)
class WakeupFacts:
    """job_next_run_at's row: the earliest scheduled job, and the running job whose lease
    ends first (all NULL when there is none)."""

    wait_seconds: float | None
    id: int | None
    queue: str | None
    handler: str | None
    locked_by: str | None
    expires_in: float | None
    token_in: float | None = None  # the next start-rate token of these handlers (schema 33)


@dataclass(frozen=True)
class NextWakeups:
    run_in: float | None  # seconds until the earliest scheduled job or rate token; None: none
    expiring: Expiring | None


def next_wakeups(
    conn: psycopg.Connection[Any],
    queues: Iterable[str],
    handlers: Iterable[str],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> NextWakeups:
    """When this worker should look again, in one round trip: the earliest scheduled job
    it could claim, and the running job of its queues and handlers whose lease ends
    first."""
    rows = hotpath.run(
        conn,
        "job_next_run_at",
        {"queues": list(queues), "handlers": list(handlers)},
        schema=schema,
    )
    if not rows:
        return NextWakeups(None, None)
    f = records.build(WakeupFacts, rows.columns, rows[0])
    expiring = None
    if f.id is not None and f.expires_in is not None:
        expiring = Expiring(
            int(f.id), str(f.queue), str(f.handler), str(f.locked_by), float(f.expires_in)
        )
    # a job held back by a rate is due when the token is: a wake like a scheduled job's
    due = [float(t) for t in (f.wait_seconds, f.token_in) if t is not None]
    return NextWakeups(min(due) if due else None, expiring)


# -- durable waits (migration 0028) ------------------------------------------------------


@records.built_from("job_suspend")
@dataclass(frozen=True)
class SuspendOutcome:
    # suspended (until a signal or wait_until), pending (the signal had come already),
    # cancelled (a cancel was requested), or refused (`problem`: nothing changed)
    status: str
    wait_until: datetime | None
    problem: str | None


def suspend(
    conn: psycopg.Connection[Any],
    worker: str,
    job_id: int,
    token: int,
    name: str,
    timeout: float,
    *,
    key: str | None = None,
    progress: Any = None,
    checkpoint: Any = None,
    schema: str = DEFAULT_SCHEMA,
) -> SuspendOutcome | None:
    """The handler raised WaitFor for a held job: suspended until signal `name` or
    `timeout` seconds, the attempt not counted. None: the lease was lost, nothing changed."""
    rows = hotpath.run(
        conn,
        "job_suspend",
        {
            "id": job_id,
            "worker": worker,
            "token": token,
            "name": name,
            "timeout": timeout,
            "key": key,
            "progress": jsonb_or_none(progress),
            "checkpoint": jsonb_or_none(checkpoint),
        },
        schema=schema,
    )
    return records.build(SuspendOutcome, rows.columns, rows[0]) if rows else None


def waits_expire(
    conn: psycopg.Connection[Any], max_jobs: int = 1000, *, schema: str = DEFAULT_SCHEMA
) -> int:
    """The timeout sweep: suspended jobs past their timeout become pending (at most
    `max_jobs`); returns how many."""
    rows = hotpath.run(conn, "job_waits_expire", {"max_jobs": max_jobs}, schema=schema)
    return int(rows[0][0]) if rows else 0
