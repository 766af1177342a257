"""The application API: describe jobs (JobSpec) and enqueue them on your own connection.

`enqueue` and `enqueue_many` join the caller's current transaction: the jobs commit or roll
back with it. They use only psycopg's public API, one short-lived cursor per call (psycopg
prepares the statement after a few uses, like any other), and keep no state on or about
the caller's connection: its adapters apply as to any query, its row factory is left alone.

Why not one cached cursor per connection: a cursor refers to its connection, so a cache
keyed weakly by connection would still keep every connection alive (and open, if the
application drops it without closing it). Measured, the cached cursor would save ~10 µs
of client CPU per call, against a round trip of ~250 µs on a local server.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from pgworkerd import bounds
from pgworkerd.bounds import MAX_ATTEMPTS_MAX, MAX_ATTEMPTS_MIN, PRIORITY_MAX, PRIORITY_MIN
from pgworkerd.model import DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE
from pgworkerd.queue import records
from pgworkerd.queue.queries import DEFAULT_SCHEMA, finished_channel, query

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_QUEUE",
    "DuplicateJob",
    "InvalidJob",
    "JobFailed",
    "JobInfo",
    "JobNotFound",
    "JobSpec",
    "WaitTimeout",
    "enqueue",
    "enqueue_many",
    "enqueue_typed",
    "get",
    "jobs_json",
    "json_type_name",
    "wait",
]


class InvalidJob(ValueError):
    """A job that cannot be enqueued; nothing was written."""


# The SQLSTATE enqueue_many_v3 raises for a job whose dedupe_policy is "reject" when its
# key is held (schema 34); the detail is JSON naming the holder: {"job_id": N}.
DEDUPE_REJECTED_SQLSTATE = "PGWD1"


class DuplicateJob(Exception):
    """A job enqueued with dedupe_policy="reject" whose dedupe key another job holds (one
    not finished, or finished within its dedupe_window): `job_id` is that job. Raised from
    the database's error, so the caller's transaction is aborted (roll it back); nothing
    of the call was written."""

    def __init__(self, message: str, job_id: int) -> None:
        super().__init__(message)
        self.job_id = job_id


def payload_from_json(text: str) -> dict[str, Any]:
    """A payload given as JSON text (`pgworkerd enqueue --payload`, the dashboard's enqueue
    form); raises ValueError saying why it is not one: not JSON, or not an object."""
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ValueError(f"must be a JSON object, not {json_type_name(payload)}")
    return payload


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
    # Jobs of one key share the key's slots of a handler's max_running_per_key (README
    # "Fleet-wide limits"); None: the job has no key.
    concurrency_key: str | None = None
    # Dependencies (docs/guide/dependencies.md): the job waits ('waiting') until these
    # jobs have finished: ids, or JobSpecs earlier in the same enqueue_many call. What a
    # parent ending dead or cancelled does: "cancel" this job (the default), "run" it
    # anyway, or "hold" it for an operator.
    after: Sequence[int | JobSpec] = ()
    on_parent_failure: str | None = None
    # Deadlines (docs/guide/enqueue.md): not started after expires_at (or now + expire_in,
    # seconds or a timedelta); a timeout (seconds or a timedelta) overriding the handler's.
    expires_at: datetime | None = None
    expire_in: float | timedelta | None = None
    timeout: float | timedelta | None = None
    # Dedupe windows and policies (docs/guide/enqueue.md "Dedupe"), with a dedupe_key:
    # the key stays held dedupe_window (seconds or a timedelta) after the job finished;
    # what an enqueue finding the key held does: "existing" (return the holder's id, the
    # default), "reject" (raise DuplicateJob) or "debounce" (move the pending holder's
    # run time to now + debounce, never past its enqueue + debounce_max).
    dedupe_window: float | timedelta | None = None
    dedupe_policy: str | None = None
    debounce: float | timedelta | None = None
    debounce_max: float | timedelta | None = None
    # Tracing (docs/operations/tracing.md): the enqueuer's W3C trace context,
    # {"traceparent": ..., "tracestate": ...}, which each attempt's span links to. None:
    # the current OpenTelemetry span's, if the application traces (it has imported
    # OpenTelemetry and a span is current); {}: none.
    trace: Mapping[str, str] | None = None

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
        if self.concurrency_key is not None:
            problem = bounds.name_problem("concurrency_key", self.concurrency_key)
            if problem is not None:
                raise InvalidJob(problem)
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
        if self.concurrency_key is not None:
            job["concurrency_key"] = self.concurrency_key
        job.update(self._extras())
        return job

    @classmethod
    def typed(
        cls, func: Any, payload: Any, *, handler: str | None = None, **fields: Any
    ) -> JobSpec:
        """A job of typed handler `func` (pgworkerd.typed: named `handler`, default func's
        __name__), its payload (a value of its payload type, or a mapping) validated first;
        `fields` are the other JobSpec fields. For enqueue_many and Done(then=[...]).
        Raises InvalidJob."""
        from pgworkerd.typed import handler_name

        return cls(handler_name(func, handler), typed_payload(func, payload), **fields)

    def has_extras(self) -> bool:
        """Whether the job needs enqueue_many_v3 (schema 27): parents, deadlines, a dedupe
        window or policy (schema 34), a trace context (schema 35), or a dedupe key at all:
        only v3 applies its handler's default dedupe policy (schema 37, handler_defaults)."""
        return (
            bool(self.after)
            or bool(self.trace)
            or self.dedupe_key is not None
            or any(
                v is not None
                for v in (
                    self.on_parent_failure,
                    self.expires_at,
                    self.expire_in,
                    self.timeout,
                    self.dedupe_window,
                    self.dedupe_policy,
                    self.debounce,
                    self.debounce_max,
                )
            )
        )

    def _extras(self) -> dict[str, Any]:
        """The keys of enqueue_many_v3 (parents by id, deadlines), checked with its bounds
        and messages; JobSpec parents are turned into positions by jobs_json."""
        job: dict[str, Any] = {}
        after = self.after
        if isinstance(after, str | bytes) or not isinstance(after, Sequence):
            raise InvalidJob(
                f"after must be a list of job ids or JobSpecs, not {type(after).__name__}"
            )
        if len(after) > bounds.PARENTS_MAX:
            raise InvalidJob(
                f"a job may have at most {bounds.PARENTS_MAX} parents, not {len(after)}"
            )
        ids = []
        for parent in after:
            if isinstance(parent, JobSpec):
                continue
            if (
                isinstance(parent, bool)
                or not isinstance(parent, int)
                or not (1 <= parent <= 2**63 - 1)
            ):
                raise InvalidJob(f"after must hold job ids (integers from 1), not {parent!r}")
            ids.append(parent)
        if ids:
            job["after"] = ids
        if self.on_parent_failure is not None:
            if self.on_parent_failure not in bounds.ON_PARENT_FAILURE:
                raise InvalidJob(
                    'on_parent_failure must be "cancel", "run" or "hold", not '
                    f"{self.on_parent_failure!r}"
                )
            if not after:
                raise InvalidJob("on_parent_failure needs parents (after)")
            job["on_parent_failure"] = self.on_parent_failure
        if self.expires_at is not None and self.expire_in is not None:
            raise InvalidJob("give expires_at or expire_in, not both")
        if self.expires_at is not None:
            expires = self.expires_at
            if not isinstance(expires, datetime) or expires.tzinfo is None:
                raise InvalidJob("expires_at must be a timezone-aware datetime")
            if expires >= bounds.RUN_AT_MAX:
                raise InvalidJob(f"expires_at must be before 9000-01-01 UTC, not {expires}")
            if expires <= datetime.now(UTC):
                raise InvalidJob(
                    f"expires_at is in the past ({expires.isoformat()}): the job could never start"
                )
            job["expires_at"] = expires.isoformat()
        if self.expire_in is not None:
            seconds = _seconds("expire_in", self.expire_in, bounds.EXPIRE_IN_MAX_SECONDS)
            job["expire_in"] = f"{seconds:.6f} seconds"
        if self.timeout is not None:
            job["timeout"] = _seconds("timeout", self.timeout, bounds.TIMEOUT_MAX_SECONDS)
        if self.trace:
            trace = dict(self.trace) if isinstance(self.trace, Mapping) else self.trace
            problem = bounds.trace_problem(trace)
            if problem is not None:
                raise InvalidJob(problem)
            job["trace"] = trace
        job.update(self._dedupe_extras())
        return job

    def _dedupe_extras(self) -> dict[str, Any]:
        """The dedupe keys of enqueue_many_v3 (schema 34), checked with its bounds and
        messages."""
        job: dict[str, Any] = {}
        most = bounds.DEDUPE_WINDOW_MAX_SECONDS
        for name in ("dedupe_window", "debounce", "debounce_max"):
            value = getattr(self, name)
            if value is not None:
                job[name] = _seconds(name, value, most)
        policy = self.dedupe_policy
        if policy is not None:
            if policy not in bounds.DEDUPE_POLICIES:
                raise InvalidJob(
                    f'dedupe_policy must be "existing", "reject" or "debounce", not {policy!r}'
                )
            job["dedupe_policy"] = policy
        if self.dedupe_key is None and ("dedupe_window" in job or policy is not None):
            raise InvalidJob("dedupe_window and dedupe_policy need a dedupe_key")
        if policy != "debounce":
            if "debounce" in job or "debounce_max" in job:
                raise InvalidJob('debounce and debounce_max go with dedupe_policy "debounce"')
            return job
        if "debounce" not in job:
            raise InvalidJob(
                'dedupe_policy "debounce" needs debounce (how far each enqueue of the key '
                "moves the pending job's run time)"
            )
        if "debounce_max" not in job:
            raise InvalidJob(
                'dedupe_policy "debounce" needs debounce_max (how long after its enqueue the '
                "job may be postponed at most): an uncapped debounce could postpone it forever"
            )
        if job["debounce_max"] < job["debounce"]:
            raise InvalidJob(
                f"debounce_max ({job['debounce_max']:g}) must be at least debounce "
                f"({job['debounce']:g})"
            )
        if self.run_at is not None or self.delay is not None:
            raise InvalidJob(
                'dedupe_policy "debounce" sets the run time (now + debounce): give no run_at '
                "or delay"
            )
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
    "concurrency_key",
    "after",
    "after_index",
    "on_parent_failure",
    "expires_at",
    "expire_in",
    "timeout",
    "dedupe_window",
    "dedupe_policy",
    "debounce",
    "debounce_max",
    "trace",
)


def _seconds(name: str, value: Any, most: float) -> float:
    """A positive duration in seconds (a number or a timedelta) up to `most`."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or not 0 < seconds <= most
    ):
        raise InvalidJob(
            f"{name} must be above 0 and at most {most:.0f} seconds (a number or a "
            f"timedelta), not {value!r}"
        )
    return float(seconds)


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
    conn: psycopg.Connection[Any],
    handler: str,
    payload: Mapping[str, Any] | None = None,
    *,
    queue: str = DEFAULT_QUEUE,
    priority: int = 0,
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    dedupe_key: str | None = None,
    concurrency_key: str | None = None,
    schema: str = DEFAULT_SCHEMA,
    after: Sequence[int] = (),
    on_parent_failure: str | None = None,
    expires_at: datetime | None = None,
    expire_in: float | timedelta | None = None,
    timeout: float | timedelta | None = None,
    dedupe_window: float | timedelta | None = None,
    dedupe_policy: str | None = None,
    debounce: float | timedelta | None = None,
    debounce_max: float | timedelta | None = None,
    trace: Mapping[str, str] | None = None,
) -> int:
    """Enqueue one job inside the caller's current transaction; returns its id.

    With a dedupe key held by another job of the handler (one not finished, or finished
    within its dedupe_window), that job's id comes back and
    nothing is inserted. With `after` (job ids) it waits until those jobs have finished
    (docs/guide/dependencies.md); expires_at/expire_in and timeout: docs/guide/enqueue.md.
    dedupe_window, dedupe_policy, debounce and debounce_max: docs/guide/enqueue.md "Dedupe"
    (dedupe_policy="reject" raises DuplicateJob).
    trace: the W3C trace context its attempts link to (JobSpec.trace: by default the
    current OpenTelemetry span's, if any; docs/operations/tracing.md).
    """
    spec = enqueue_spec(
        handler,
        payload,
        queue=queue,
        priority=priority,
        run_at=run_at,
        delay=delay,
        max_attempts=max_attempts,
        dedupe_key=dedupe_key,
        concurrency_key=concurrency_key,
        after=after,
        on_parent_failure=on_parent_failure,
        expires_at=expires_at,
        expire_in=expire_in,
        timeout=timeout,
        dedupe_window=dedupe_window,
        dedupe_policy=dedupe_policy,
        debounce=debounce,
        debounce_max=debounce_max,
        trace=ambient_trace() if trace is None else trace,
    )
    if spec.has_extras():
        # one job of enqueue_many_v3: its checks and messages ("job 1: ...")
        [job_id] = enqueue_many(conn, [spec], schema=schema)
        return job_id
    statement, params = enqueue_statement(spec, schema)
    with conn.cursor(row_factory=tuple_row) as cur:
        cur.execute(statement, params)
        row = cur.fetchone()
    assert row is not None  # the function returns the job's id or raises
    return int(row[0])


def enqueue_spec(handler: str, payload: Mapping[str, Any] | None = None, **options: Any) -> JobSpec:
    """The JobSpec of enqueue's arguments (shared with pgworkerd.aio.enqueue)."""
    after = options.pop("after", ())
    return JobSpec(
        handler,
        {} if payload is None else payload,
        after=tuple(after) if isinstance(after, list | tuple) else after,
        **options,
    )


def enqueue_statement(spec: JobSpec, schema: str) -> tuple[str, dict[str, Any]]:
    """The statement and parameters enqueue sends for one job without parents or
    deadlines (spec.has_extras() False), checked; InvalidJob says what is wrong. Shared
    with pgworkerd.aio."""
    try:
        job = spec._checked()
        payload_json = _dumps(job.get("payload", {}))
    except InvalidJob as exc:
        raise InvalidJob(f"job 1: {exc}") from None
    # The SQL function enqueue: one INSERT, no JSON array to unpack (enqueue_v2 only
    # with a key: enqueue stays the faster path).
    params: dict[str, Any] = {}
    if spec.concurrency_key is not None:
        params["concurrency_key"] = spec.concurrency_key
    return query("job_enqueue" if not params else "job_enqueue_v2", schema), params | {
        "handler": spec.handler,
        "payload": payload_json,
        "queue": spec.queue,
        "priority": spec.priority,
        "run_at": spec.run_at,
        "delay": None if spec.delay is None else _delay_seconds(spec.delay),
        "max_attempts": spec.max_attempts,
        "dedupe_key": spec.dedupe_key,
    }


def typed_payload(func: Any, payload: Any) -> dict[str, Any]:
    """The checked JSON payload of a job of typed handler `func` (pgworkerd.typed, loaded
    on first use: enqueue's import stays light)."""
    from pgworkerd.typed import payload_json

    try:
        return payload_json(func, payload)
    except ValueError as exc:
        raise InvalidJob(str(exc)) from None


def enqueue_typed(
    conn: psycopg.Connection[Any],
    func: Any,
    payload: Any,
    *,
    handler: str | None = None,
    **options: Any,
) -> int:
    """enqueue() for typed handler `func` (pgworkerd.typed; the job is named `handler`,
    default func's __name__): `payload`, a value of its payload type (or a mapping), is
    validated and written as the handler will read it back, then enqueued in the caller's
    transaction; `options` are enqueue's (queue, priority, delay, ...). Raises InvalidJob
    before the database on a payload that does not validate."""
    from pgworkerd.typed import handler_name

    return enqueue(conn, handler_name(func, handler), typed_payload(func, payload), **options)


def _dumps(value: Any) -> str:
    """JSON text of a job or payload; InvalidJob if it cannot be serialised."""
    try:
        return json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"payload is not JSON-serialisable: {exc}") from None


def ambient_trace() -> dict[str, str] | None:
    """The current OpenTelemetry span's W3C context, for a JobSpec without a trace of its
    own: None unless the application has imported OpenTelemetry (pgworkerd never imports
    it here: an application that does not trace pays one dictionary look-up) and a valid
    span is current, which takes a tracer provider the application set."""
    if "opentelemetry.trace" not in sys.modules:
        return None
    from pgworkerd import tracing

    return tracing.current_trace_context()


def jobs_json(specs: Iterable[JobSpec], trace: Mapping[str, str] | None = None) -> str:
    """The JSON array text enqueue_many sends: every job checked, serialised once; `trace`
    (ambient_trace's) for each job whose own trace is None.

    Raises InvalidJob naming the job's position (1-based) on bad input.
    """
    jobs = []
    # JobSpecs seen so far, by identity -> 0-based position: a JobSpec in `after` must be
    # one of them (an earlier job of this call), sent as its position (after_index)
    positions: dict[int, int] = {}
    for n, spec in enumerate(specs, 1):
        if not isinstance(spec, JobSpec):
            raise InvalidJob(f"job {n}: expected a JobSpec, not {type(spec).__name__}")
        try:
            job = spec._checked()
            earlier = [p for p in spec.after if isinstance(p, JobSpec)]
            if earlier:
                if any(id(p) not in positions for p in earlier):
                    raise InvalidJob(
                        "after names a JobSpec that is not earlier in this call (a job "
                        "cannot wait for itself or a later job)"
                    )
                job["after_index"] = sorted({positions[id(p)] for p in earlier})
            if trace and spec.trace is None:
                job["trace"] = trace
        except InvalidJob as exc:
            raise InvalidJob(f"job {n}: {exc}") from None
        positions.setdefault(id(spec), n - 1)
        jobs.append(job)
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
    conn: psycopg.Connection[Any], specs: Iterable[JobSpec], *, schema: str = DEFAULT_SCHEMA
) -> list[int]:
    """Enqueue many jobs in one round trip; ids come back in input order.

    Everything is validated before the database sees it, so bad input never aborts the
    caller's transaction.
    """
    call = enqueue_many_statement(specs, schema)
    if call is None:
        return []
    with conn.cursor(row_factory=tuple_row) as cur:
        try:
            [(ids,)] = cur.execute(*call).fetchall()
        except psycopg.Error as exc:
            duplicate = duplicate_job(exc)
            if duplicate is None:
                raise
            raise duplicate from exc
    return list(ids)


def enqueue_many_statement(
    specs: Iterable[JobSpec], schema: str
) -> tuple[str, dict[str, Any]] | None:
    """The statement and parameters enqueue_many sends, every job checked (InvalidJob
    names the one at fault); None for no jobs. Shared with pgworkerd.aio."""
    specs = list(specs)
    ambient = ambient_trace()
    text = jobs_json(specs, ambient)
    if text == "[]":
        return None
    # enqueue_many_v2 only when a job has a concurrency key: enqueue_many (which refuses
    # the key) keeps its faster plain path for the rest.
    keyed = any(isinstance(s, JobSpec) and s.concurrency_key is not None for s in specs)
    name = "job_enqueue_many_v2" if keyed else "job_enqueue_many"
    # enqueue_many_v3 (schema 27) only when a job has parents or deadlines
    if any(s.has_extras() or (ambient and s.trace is None) for s in specs):
        name = "job_enqueue_many_v3"
    # Sent as text, parsed once by the server as jsonb (no second serialisation).
    return query(name, schema), {"jobs": text}


def duplicate_job(exc: psycopg.Error) -> DuplicateJob | None:
    """The DuplicateJob of enqueue_many_v3's refusal of a held dedupe key (policy
    "reject"), None for any other error (shared with pgworkerd.aio)."""
    return _duplicate(exc) if exc.sqlstate == DEDUPE_REJECTED_SQLSTATE else None


def _duplicate(exc: psycopg.Error) -> DuplicateJob:
    """The DuplicateJob of enqueue_many_v3's refusal (its detail names the holder)."""
    detail = exc.diag.message_detail or "{}"
    try:
        job_id = int(json.loads(detail)["job_id"])
    except (ValueError, KeyError, TypeError):
        job_id = 0  # not ours to read: a server-side error of this code without the detail
    return DuplicateJob(exc.diag.message_primary or str(exc), job_id)


# -- Waiting for a job: get and wait ------------------------------------------------------

# wait() re-reads the job this often when no notification came (and always through
# PgBouncer in transaction mode, where LISTEN does not reach this session).
DEFAULT_WAIT_POLL = 1.0
# wait's re-reads of its job are at least this far apart: a notification is a hint, and
# any role that may connect can send "<schema>.finished" with any id as often as it likes.
WAIT_REREAD_FLOOR = 0.020
FINAL_STATUSES = frozenset({"completed", "dead", "cancelled"})


@records.built_from("job_info")
@dataclass(frozen=True)
class JobInfo:
    """A job as pgworkerd.get read it. status: pending, running, completed, dead or
    cancelled; result only when completed; attempts counts attempts started (a snooze or
    a hand-back does not count); snoozes how often its handler snoozed it."""

    id: int
    queue: str
    handler: str
    status: str
    priority: int
    attempts: int
    max_attempts: int
    snoozes: int
    result: Any
    progress: Any
    last_error: str | None
    cancel_requested: bool
    run_at: datetime
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        """In a final status: completed, dead or cancelled."""
        return self.status in FINAL_STATUSES


class JobNotFound(LookupError):
    """No job with this id (never enqueued, or pruned), or none this role may read (an
    enqueuer reads only the jobs its login enqueued)."""


class JobFailed(Exception):
    """The job ended dead or cancelled: `status`, `error` (its last_error) and `job`."""

    def __init__(self, job: JobInfo) -> None:
        self.job = job
        self.status = job.status
        self.error = job.last_error
        first = (job.last_error or "").split("\n", 1)[0]
        super().__init__(f"job {job.id} ended {job.status}" + (f": {first}" if first else ""))


class WaitTimeout(TimeoutError):
    """wait() gave up: the job had not finished within its timeout (`job`: as last read)."""

    def __init__(self, job: JobInfo, timeout: float) -> None:
        self.job = job
        super().__init__(f"job {job.id} still {job.status} after {timeout:g}s")


def get(
    conn: psycopg.Connection[Any], job_id: int, *, schema: str = DEFAULT_SCHEMA
) -> JobInfo | None:
    """The job `job_id`, or None if there is none. Reads with the caller's connection, in
    its current transaction if one is open. A role that may read the jobs table (roles.sql:
    pgworkerd_reader, pgworkerd_operator, pgworkerd_daemon) reads every job; any other
    role with EXECUTE on job_get_v1 (pgworkerd_enqueuer) only the jobs its login enqueued:
    another role's job is None, as if there were none."""
    if not readable_id(job_id):
        return None  # no bigint: no such job
    with conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute(query("job_info", schema), {"id": job_id}).fetchone()
        columns = tuple(c.name for c in cur.description or ())
    return None if row is None else records.build(JobInfo, columns, row)


def readable_id(job_id: Any) -> bool:
    """Whether get should read job `job_id` (False: no bigint, so no such job); TypeError
    for what is not an integer. Shared with pgworkerd.aio."""
    if isinstance(job_id, bool) or not isinstance(job_id, int):
        raise TypeError(f"job id must be an integer, not {type(job_id).__name__}")
    return -(2**63) <= job_id < 2**63


def wait_arguments_check(conn: Any, timeout: float | None, poll: float) -> None:
    """wait's checks of its arguments and of the connection's state (sync or async):
    ValueError or RuntimeError saying what is wrong. Shared with pgworkerd.aio."""
    if timeout is not None and not (math.isfinite(timeout) and timeout >= 0):
        raise ValueError(
            f"timeout must be a finite number of seconds >= 0 or None, not {timeout!r}"
        )
    if not (math.isfinite(poll) and poll > 0):
        raise ValueError(f"poll must be a finite number of seconds > 0, not {poll!r}")
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        raise RuntimeError(
            "pgworkerd.wait needs a connection outside a transaction (autocommit, or "
            "idle): commit or roll back first; wait never commits the caller's transaction"
        )


def wait_settled(
    job: JobInfo | None, job_id: int, schema: str, deadline: float | None, timeout: float | None
) -> tuple[bool, Any]:
    """What wait makes of the job as just read: (True, its result) once completed; raises
    JobNotFound, JobFailed or WaitTimeout; (False, None): wait on. Shared with
    pgworkerd.aio."""
    if job is None:
        raise JobNotFound(f"no job {job_id} in schema {schema!r} that this role may read")
    if job.status == "completed":
        return True, job.result
    if job.finished:
        raise JobFailed(job)
    if deadline is not None and deadline - time.monotonic() <= 0:
        raise WaitTimeout(job, timeout or 0.0)
    return False, None


def wait(
    conn: psycopg.Connection[Any],
    job_id: int,
    timeout: float | None = None,
    *,
    poll: float = DEFAULT_WAIT_POLL,
    listen: bool = True,
    schema: str = DEFAULT_SCHEMA,
) -> Any:
    """Wait until job `job_id` is finished; return its result when it completed.

    Raises JobFailed (with the status and last_error) when it ended dead or cancelled,
    WaitTimeout (a TimeoutError) after `timeout` seconds (None: no limit), JobNotFound at
    once for an unknown id.

    Woken by the notification each finished job sends (LISTEN on "<schema>.finished";
    the job is read after LISTEN, so a completion in between is not missed), with a
    re-read every `poll` seconds in case it does not come. A notification is only a hint
    (anyone may send one): re-reads are at least WAIT_REREAD_FLOOR (20 ms) apart, however
    many arrive. listen=False only polls: use
    it through PgBouncer in transaction mode, where LISTEN lands on whichever server
    connection the pool picked (wait stays correct either way, but only a direct
    connection gives the fast wake-up).

    The connection must be outside a transaction (autocommit, or idle): wait never
    commits a caller's transaction, so inside one it raises RuntimeError. It leaves the
    connection as it found it: its autocommit setting, no LISTEN added (UNLISTEN
    afterwards), no transaction open. While it waits it reads the connection's
    notifications with psycopg's notifies(), so those of other channels arriving then are
    consumed; on a connection with notify handlers (add_notify_handler), which psycopg
    warns does not mix with notifies(), pass listen=False.
    """
    wait_arguments_check(conn, timeout, poll)
    deadline = None if timeout is None else time.monotonic() + timeout
    channel = finished_channel(schema)
    was_autocommit = conn.autocommit
    conn.autocommit = True  # every statement of wait's commits at once: nothing held open
    listening = False
    try:
        if listen:
            with conn.cursor(row_factory=tuple_row) as cur:
                [(already,)] = cur.execute(
                    query("session_finished_listening", schema), {"channel": channel}
                ).fetchall()
                if not already:
                    cur.execute(query("session_finished_listen", schema))
                    listening = True
        while True:
            read_at = time.monotonic()
            job = get(conn, job_id, schema=schema)
            done, result = wait_settled(job, job_id, schema, deadline, timeout)
            if done:
                return result
            left = None if deadline is None else deadline - time.monotonic()
            nap = poll if left is None else max(0.0, min(poll, left))
            if listen:
                for note in conn.notifies(timeout=nap):
                    if note.channel == channel and note.payload == str(job_id):
                        break
                # a flood of notifications naming this job makes no more reads than this
                rest = read_at + WAIT_REREAD_FLOOR - time.monotonic()
                if deadline is not None:
                    rest = min(rest, deadline - time.monotonic())
                if rest > 0:
                    time.sleep(rest)
            else:
                time.sleep(nap)
    finally:
        if not conn.closed:
            if listening and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                with conn.cursor() as cur:
                    cur.execute(query("session_finished_unlisten", schema))
            conn.autocommit = was_autocommit
