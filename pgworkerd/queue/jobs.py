"""Typed wrappers, one per job statement in sql/queries.sql, and the enqueue API.

Every function takes a psycopg connection owned by the caller: enqueue joins the caller's
transaction (the job commits or rolls back with it); the others are single statements
that commit at once on an autocommit connection.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgworkerd import bounds
from pgworkerd.bounds import MAX_ATTEMPTS_MAX, MAX_ATTEMPTS_MIN, PRIORITY_MAX, PRIORITY_MIN
from pgworkerd.jsontext import storable_json
from pgworkerd.queue import hotpath
from pgworkerd.queue.queries import DEFAULT_SCHEMA, query

STATUSES = ("pending", "running", "completed", "dead", "cancelled")
FINAL_STATUSES = ("completed", "dead", "cancelled")
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_QUEUE = "default"


class InvalidJob(ValueError):
    """A job that cannot be enqueued; nothing was written."""


def json_type_name(value: Any) -> str:
    """What `value` would be in JSON, named as jsonb_typeof names it (for messages that
    read the same from SQL, Python and the CLI)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


@dataclass(frozen=True)
class JobSpec:
    """One job to enqueue. Priority: lower runs sooner (0 is the default)."""

    handler: str
    payload: Mapping[str, Any] = field(default_factory=dict)
    queue: str = DEFAULT_QUEUE
    priority: int = 0
    run_at: datetime | None = None
    delay: float | timedelta | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    dedupe_key: str | None = None

    def as_json(self) -> dict[str, Any]:
        """Validated JSON form, every field spelt out; raises InvalidJob on bad input.

        (enqueue_many sends the shorter form of jobs_json: same jobs, defaults left out.)
        """
        job = self._checked()
        try:
            job["payload"] = json.loads(json.dumps(self.payload, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise InvalidJob(f"payload is not JSON-serialisable: {exc}") from None
        job.setdefault("payload", {})
        job.setdefault("queue", DEFAULT_QUEUE)
        job.setdefault("priority", 0)
        job.setdefault("max_attempts", DEFAULT_MAX_ATTEMPTS)
        return {k: job[k] for k in _JSON_ORDER if k in job}

    def _checked(self) -> dict[str, Any]:
        """The job as enqueue_many's SQL function takes it, checked but not serialised
        (the payload is the caller's object): fields equal to the function's defaults are
        left out, so the server has less JSON to parse.

        The bounds (pgworkerd.bounds) and messages are those of the SQL functions, which
        check again: Python callers and the CLI are refused before any round trip."""
        if not isinstance(self.handler, str) or not self.handler:
            raise InvalidJob("handler must be a non-empty string")
        payload = self.payload
        if not isinstance(payload, Mapping):
            raise InvalidJob(f"payload must be a JSON object, not {json_type_name(payload)}")
        if not isinstance(self.queue, str) or not self.queue:
            raise InvalidJob("queue must be a non-empty string")
        problem = bounds.job_names_problem(self.handler, self.queue)
        if problem is not None:
            raise InvalidJob(problem)
        priority, max_attempts = self.priority, self.max_attempts
        if (
            isinstance(priority, bool)
            or not isinstance(priority, int)
            or not (PRIORITY_MIN <= priority <= PRIORITY_MAX)
        ):
            raise InvalidJob(
                f"priority must be an integer from {PRIORITY_MIN} to "
                f"{PRIORITY_MAX}, not {priority!r}"
            )
        if (
            isinstance(max_attempts, bool)
            or not isinstance(max_attempts, int)
            or not (MAX_ATTEMPTS_MIN <= max_attempts <= MAX_ATTEMPTS_MAX)
        ):
            raise InvalidJob(
                f"max_attempts must be a positive integer up to {MAX_ATTEMPTS_MAX}, "
                f"not {max_attempts!r}"
            )
        if self.run_at is not None and self.delay is not None:
            raise InvalidJob("give run_at or delay, not both")
        if self.dedupe_key is not None:
            if not isinstance(self.dedupe_key, str):
                raise InvalidJob("dedupe_key must be a string")
            if not 1 <= len(self.dedupe_key) <= bounds.DEDUPE_KEY_MAX_CHARS:
                raise InvalidJob(
                    f"dedupe_key must be 1 to {bounds.DEDUPE_KEY_MAX_CHARS} characters, "
                    f"not {len(self.dedupe_key)}"
                )
        job: dict[str, Any] = {"handler": self.handler}
        if payload or type(payload) is not dict:  # {} is the default
            job["payload"] = payload
        if self.queue != DEFAULT_QUEUE:
            job["queue"] = self.queue
        if priority != 0:
            job["priority"] = priority
        if max_attempts != DEFAULT_MAX_ATTEMPTS:
            job["max_attempts"] = max_attempts
        if self.run_at is not None:
            if not isinstance(self.run_at, datetime) or self.run_at.tzinfo is None:
                raise InvalidJob("run_at must be a timezone-aware datetime")
            if not bounds.RUN_AT_MIN <= self.run_at < bounds.RUN_AT_MAX:
                raise InvalidJob(
                    f"run_at must be {bounds.RUN_AT_RANGE}, not {self.run_at.isoformat()}"
                )
            job["run_at"] = self.run_at.isoformat()
        if self.delay is not None:
            # fixed-point: PostgreSQL reads "0.00001 seconds", not Python's "1e-05 seconds"
            job["delay"] = f"{_delay_seconds(self.delay):.6f} seconds"
        if self.dedupe_key is not None:
            job["dedupe_key"] = self.dedupe_key
        return job


_JSON_ORDER = (
    "handler",
    "payload",
    "queue",
    "priority",
    "max_attempts",
    "run_at",
    "delay",
    "dedupe_key",
)


def _delay_seconds(delay: Any) -> float:
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else delay
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise InvalidJob(f"delay must be a non-negative number of seconds, not {delay!r}")
    # The database adds the delay to its own now(); this clock is close enough to refuse
    # what could never fit (the function checks again with its own).
    if seconds >= (bounds.RUN_AT_MAX - datetime.now(UTC)).total_seconds():
        raise InvalidJob(f"delay must keep run_at {bounds.RUN_AT_RANGE}, not {delay!r}")
    return seconds


def enqueue(
    conn: psycopg.Connection,
    handler: str,
    payload: Mapping[str, Any] | None = None,
    *,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    dedupe_key: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> int:
    """Enqueue one job inside the caller's current transaction; returns its id.

    With a dedupe key equal to a pending or running job's, that job's id comes back and
    nothing is inserted.
    """
    spec = JobSpec(
        handler,
        {} if payload is None else payload,
        queue,
        priority,
        run_at,
        delay,
        max_attempts,
        dedupe_key,
    )
    try:
        job = spec._checked()
        payload_json = _dumps(job.get("payload", {}))
    except InvalidJob as exc:
        raise InvalidJob(f"job 1: {exc}") from None
    # The SQL function enqueue: one INSERT, no JSON array to unpack.
    rows = hotpath.run(
        conn,
        "job_enqueue",
        {
            "handler": spec.handler,
            "payload": payload_json,
            "queue": spec.queue,
            "priority": spec.priority,
            "run_at": spec.run_at,
            "delay": None if spec.delay is None else _delay_seconds(spec.delay),
            "max_attempts": spec.max_attempts,
            "dedupe_key": spec.dedupe_key,
        },
        schema=schema,
    )
    return int(rows[0][0])


def _dumps(value: Any) -> str:
    """JSON text of a job or payload; InvalidJob if it cannot be serialised."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"payload is not JSON-serialisable: {exc}") from None


def jobs_json(specs: Iterable[JobSpec]) -> str:
    """The JSON array text enqueue_many sends: every job checked, serialised once.

    Raises InvalidJob naming the job's position (1-based) on bad input.
    """
    jobs = []
    for n, spec in enumerate(specs, 1):
        if not isinstance(spec, JobSpec):
            raise InvalidJob(f"job {n}: expected a JobSpec, not {type(spec).__name__}")
        try:
            jobs.append(spec._checked())
        except InvalidJob as exc:
            raise InvalidJob(f"job {n}: {exc}") from None
    try:
        return json.dumps(jobs, allow_nan=False)
    except (TypeError, ValueError):
        for n, job in enumerate(jobs, 1):  # find the job at fault, for the message
            try:
                _dumps(job.get("payload", {}))
            except InvalidJob as exc:
                raise InvalidJob(f"job {n}: {exc}") from None
        raise


def enqueue_many(
    conn: psycopg.Connection, specs: Iterable[JobSpec], *, schema: str = DEFAULT_SCHEMA
) -> list[int]:
    """Enqueue many jobs in one round trip; ids come back in input order.

    Everything is validated before the database sees it, so bad input never aborts the
    caller's transaction.
    """
    text = jobs_json(specs)
    if text == "[]":
        return []
    # Sent as text, parsed once by the server as jsonb (no second serialisation).
    [(ids,)] = hotpath.run(conn, "job_enqueue_many", {"jobs": text}, schema=schema)
    return list(ids)


@dataclass(frozen=True)
class ClaimedJob:
    """What a child needs to run a job, as the claim returned it."""

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


@dataclass(frozen=True)
class HandlerCapacity:
    """A handler a worker serves in one claim: its lease and how many more it may take."""

    lease_seconds: float
    free: int
    max_attempts: int | None = None  # overrides the job's own when set
    queues: Sequence[str] | None = None  # the queues it claims from; None: all (schema 6)


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
    conn: psycopg.Connection,
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
    served = {name: cap for name, cap in handlers.items() if cap.free > 0}
    if limit <= 0 or not served or not queues:
        return [], []
    params = {
        "worker": worker,
        "queues": list(queues),
        "handlers": list(served),
        "lease_seconds": [cap.lease_seconds for cap in served.values()],
        "handler_free": [cap.free for cap in served.values()],
        "max_attempts": [cap.max_attempts for cap in served.values()],
        "handler_queues": json.dumps([_list_or_none(c.queues) for c in served.values()]),
        "limit": limit,
    }
    claimed: list[ClaimedJob] = []
    refused: list[RefusedJob] = []
    for row in hotpath.run_guarded(conn, "job_claim", params, schema=schema):
        if isinstance(row, hotpath.UnloadableRow):
            refused.append(_refused(row.raw, row.reason, conn.info.encoding))
        else:
            # job_claim returns the columns in ClaimedJob's field order
            claimed.append(ClaimedJob(*row))
    claimed.sort(key=lambda j: (j.priority, j.run_at, j.id))
    return claimed, refused


def _list_or_none(queues: Sequence[str] | None) -> list[str] | None:
    return None if queues is None else list(queues)


def _refused(raw: tuple[bytes | None, ...], reason: str, encoding: str) -> RefusedJob:
    # The columns of job_claim as the server sent them (text format): id, queue, handler,
    # payload, priority, attempts, max_attempts, lease_token, ... Integers and text
    # always load; the bad value is elsewhere in the row.
    def text(i: int) -> str:
        value = raw[i]
        return "" if value is None else value.decode(encoding, errors="replace")

    return RefusedJob(
        id=int(text(0)), token=int(text(7)), handler=text(2), attempt=int(text(5)), reason=reason
    )


def claim(
    conn: psycopg.Connection,
    worker: str,
    *,
    queues: Sequence[str],
    handlers: Mapping[str, HandlerCapacity],
    limit: int,
    schema: str = DEFAULT_SCHEMA,
) -> list[ClaimedJob]:
    """Claim up to `limit` due jobs (and rescue expired leases) in one statement. A job
    whose row cannot be loaded is finished as dead at once, with the reason in
    last_error; the others are returned."""
    claimed, refused = claim_checked(
        conn, worker, queues=queues, handlers=handlers, limit=limit, schema=schema
    )
    for job in refused:
        bury(conn, worker, job.id, job.token, f"cannot run: {job.reason}", schema=schema)
    return claimed


@dataclass(frozen=True)
class Lease:
    """One lease to renew, with progress and checkpoint to save (None: keep)."""

    id: int
    token: int
    lease_seconds: float
    progress: Any = None
    checkpoint: Any = None


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


def _jsonb_or_none(value: Any) -> Jsonb | None:
    if value is None:
        return None
    if isinstance(value, EncodedJson):
        return Jsonb(value, dumps=_as_is)
    return Jsonb(value)


def renew(
    conn: psycopg.Connection, worker: str, leases: Sequence[Lease], *, schema: str = DEFAULT_SCHEMA
) -> list[RenewOutcome]:
    """Renew many leases in one statement; lost leases come back with renewed=False."""
    if not leases:
        return []
    params = {
        "worker": worker,
        "ids": [lease.id for lease in leases],
        "tokens": [lease.token for lease in leases],
        "lease_seconds": [lease.lease_seconds for lease in leases],
        "progress": [_jsonb_or_none(lease.progress) for lease in leases],
        "checkpoints": [_jsonb_or_none(lease.checkpoint) for lease in leases],
    }
    rows = hotpath.run(conn, "job_renew", params, schema=schema)
    return [RenewOutcome(id=r[0], renewed=r[1], cancel_requested=r[2]) for r in rows]


def complete(
    conn: psycopg.Connection,
    worker: str,
    job_id: int,
    token: int,
    result: Any = None,
    *,
    progress: Any = None,
    schema: str = DEFAULT_SCHEMA,
) -> bool:
    """Mark a held job completed. False: the lease was lost, nothing changed."""
    rows = hotpath.run(
        conn,
        "job_complete_one",
        {
            "id": job_id,
            "worker": worker,
            "token": token,
            "result": _jsonb_or_none(result),
            "progress": _jsonb_or_none(progress),
        },
        schema=schema,
    )
    return bool(rows)


@dataclass(frozen=True)
class Completion:
    id: int
    token: int
    result: Any = None
    progress: Any = None


def complete_many(
    conn: psycopg.Connection,
    worker: str,
    done: Sequence[Completion],
    *,
    schema: str = DEFAULT_SCHEMA,
) -> set[int]:
    """Complete many held jobs in one statement; returns the ids whose lease still held."""
    if not done:
        return set()
    rows = hotpath.run(
        conn,
        "job_complete",
        {
            "worker": worker,
            "ids": [d.id for d in done],
            "tokens": [d.token for d in done],
            "results": [_jsonb_or_none(d.result) for d in done],
            "progress": [_jsonb_or_none(d.progress) for d in done],
        },
        schema=schema,
    )
    return {r[0] for r in rows}


@dataclass(frozen=True)
class FailOutcome:
    status: str  # pending (will retry), dead or cancelled
    run_at: datetime
    retry_in: float | None = None  # seconds until the retry is due (pending only)


def fail(
    conn: psycopg.Connection,
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
            "progress": _jsonb_or_none(progress),
            "checkpoint": _jsonb_or_none(checkpoint),
        },
        schema=schema,
    )
    row = rows[0] if rows else None
    return None if row is None else FailOutcome(status=row[1], run_at=row[2], retry_in=row[3])


def release(
    conn: psycopg.Connection,
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
            "progress": _jsonb_or_none(progress),
            "checkpoint": _jsonb_or_none(checkpoint),
        },
        schema=schema,
    )
    row = rows[0] if rows else None
    return None if row is None else str(row[1])


def cancel_running(
    conn: psycopg.Connection,
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
            "progress": _jsonb_or_none(progress),
        },
        schema=schema,
    )
    return bool(rows)


def bury(
    conn: psycopg.Connection,
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


def cancel(
    conn: psycopg.Connection, ids: Sequence[int], *, schema: str = DEFAULT_SCHEMA
) -> dict[int, str]:
    """Cancel jobs: id → 'cancelled', 'cancel requested', 'already <status>' or 'not found'."""
    rows = conn.execute(query("job_cancel", schema), {"ids": list(ids)}).fetchall()
    return {r[0]: r[1] for r in rows}


def retry(
    conn: psycopg.Connection,
    *,
    ids: Sequence[int] | None = None,
    queue: str | None = None,
    handler: str | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[int]:
    """Dead or cancelled jobs back to pending with fresh attempts; returns their ids."""
    if ids is None and queue is None and handler is None:
        raise ValueError("retry needs job ids, a queue or a handler")
    rows = conn.execute(
        query("job_retry", schema),
        {"ids": None if ids is None else list(ids), "queue": queue, "handler": handler},
    ).fetchall()
    return sorted(r[0] for r in rows)


def check_statuses(statuses: Iterable[str]) -> list[str]:
    chosen = list(statuses)
    unknown = [s for s in chosen if s not in STATUSES]
    if unknown:
        raise ValueError(
            f"unknown status {', '.join(map(repr, unknown))}: choose from {', '.join(STATUSES)}"
        )
    return chosen


def prune(
    conn: psycopg.Connection,
    older_than: timedelta,
    *,
    statuses: Iterable[str] = FINAL_STATUSES,
    batch: int = 10_000,
    schema: str = DEFAULT_SCHEMA,
) -> int:
    """Delete finished jobs older than the retention, in batches; returns how many."""
    chosen = check_statuses(statuses)
    live = [s for s in chosen if s not in FINAL_STATUSES]
    if live:
        raise ValueError(f"prune only deletes finished jobs, not {', '.join(live)}")
    total = 0
    while True:
        deleted = conn.execute(
            query("job_prune", schema),
            {"older_than": older_than.total_seconds(), "statuses": chosen, "batch": batch},
        ).rowcount
        total += deleted
        if deleted < batch:
            return total


@dataclass(frozen=True)
class LeaseState:
    status: str
    token: int
    locked_by: str | None


def lease_state(
    conn: psycopg.Connection, job_id: int, *, schema: str = DEFAULT_SCHEMA
) -> LeaseState | None:
    """Who holds a job, under which token (None: no such job); loads nothing else."""
    rows = hotpath.run(conn, "job_lease_state", {"id": job_id}, schema=schema)
    return LeaseState(*rows[0]) if rows else None


def get(conn: psycopg.Connection, job_id: int, *, schema: str = DEFAULT_SCHEMA) -> dict | None:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("job_get", schema), {"id": job_id}).fetchone()


def list_jobs(
    conn: psycopg.Connection,
    *,
    statuses: Iterable[str] | None = None,
    queue: str | None = None,
    handler: str | None = None,
    limit: int = 50,
    schema: str = DEFAULT_SCHEMA,
) -> list[dict[str, Any]]:
    params = {
        "statuses": None if statuses is None else check_statuses(statuses),
        "queue": queue,
        "handler": handler,
        "limit": limit,
    }
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("job_list", schema), params).fetchall()


def counts(conn: psycopg.Connection, *, schema: str = DEFAULT_SCHEMA) -> list[tuple[str, str, int]]:
    return [(r[0], r[1], r[2]) for r in conn.execute(query("job_counts", schema)).fetchall()]
