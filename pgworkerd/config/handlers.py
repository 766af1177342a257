"""The named tables: [handlers.NAME] (what runs a job) and [schedules.NAME] (periodic
jobs), each key declared once (`key(...)`), and the import of a handler's function."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgworkerd.config import checks
from pgworkerd.config.spec import ConfigError, key

# A handler's max_snoozes when not set, and the most it may be set to.
DEFAULT_MAX_SNOOZES = 100
MAX_SNOOZES_LIMIT = 1_000_000
# The most jobs one child may run at once as coroutines (concurrency).
MAX_CONCURRENCY = 1000


@dataclass(frozen=True)
class HandlerConfig:
    name: str  # the NAME of [handlers.NAME]: what jobs name in their `handler`
    target: str = key(
        check=checks.target,
        example="pgworkerd.examples:sleep_with_progress",
        help="Required: the function that runs a job.",
    )
    queue: str = key(
        "default",
        check=checks.named("queue"),
        help="A queue to serve. With worker.queues empty, the daemon serves the queues its "
        "handlers name. It does not restrict this handler: the daemon runs its jobs from "
        "every queue it serves (a job of this handler enqueued into another served queue "
        "runs too); use `queues` (or worker.queues and separate daemons) to keep queues "
        "apart. Must be among worker.queues.",
    )
    # claim_v2, schema 6
    queues: tuple[str, ...] = key(
        (),
        check=checks.queue_names,
        example=("mail",),
        help="The queues this handler claims from, when it must not run jobs from the other "
        "served queues; served in place of `queue`, and each among worker.queues. Empty: it "
        "claims from every queue the daemon serves.",
    )
    max_attempts: int | None = key(
        None,
        check=checks.integer(1),
        example=5,
        help="Overrides the attempts the job was enqueued with (default: the job's own, 5 "
        "if unset).",
    )
    backoff: float | None = key(
        None,
        check=checks.duration,
        example=10.0,
        help="Backoff base of this handler's retries (default: worker.backoff).",
    )
    backoff_max: float | None = key(
        None,
        check=checks.duration,
        example=3600.0,
        help="Backoff cap of this handler's retries (default: worker.backoff_max).",
    )
    lease: float | None = key(
        None,
        check=checks.positive_duration,
        example=60.0,
        help="Lease for this handler's jobs (default: worker.lease).",
    )
    timeout: float | None = key(
        None,
        check=checks.positive_duration,
        example=3600.0,
        help="Whole-attempt limit: SIGTERM, then SIGKILL after kill_grace; a failed attempt. "
        "Unset: no limit.",
    )
    heartbeat_timeout: float | None = key(
        None,
        check=checks.positive_duration,
        example=300.0,
        help="A job that does not call job.heartbeat() for this long is stuck: stopped, "
        "failed attempt. Unset: not watched.",
    )
    slots: int | None = key(
        None,
        check=checks.integer(1),
        example=2,
        help="At most this many of this handler's jobs at once on this host (default: "
        "worker.slots).",
    )
    # Enforced by the claim (claim_v3).
    max_running: int | None = key(
        None,
        check=checks.integer(1, checks.INT4_MAX),
        example=10,
        help="Fleet-wide: at most this many of this handler's jobs running at once, on all "
        "hosts together, held by the claim itself (default: none). A slot is a running "
        "attempt with a current lease: freed by its finish or when its lease runs out (a "
        "killed host frees it within `lease`). Each daemon's claim applies its own setting: "
        'give every daemon the same one (README "Fleet-wide limits").',
    )
    max_running_per_key: int | None = key(
        None,
        check=checks.integer(1, checks.INT4_MAX),
        example=2,
        help="Fleet-wide: at most this many at once per concurrency key (`pgworkerd enqueue "
        "--concurrency-key`, concurrency_key= in Python); jobs without a key are not "
        "limited by it (default: none).",
    )
    # Enforced by the claim (claim_v4, schema 33; docs/guide/limits.md).
    fair: bool = key(
        False,
        check=checks.boolean,
        help="Serve this handler's due jobs by concurrency key in turns (round robin over "
        "the keys with due jobs, within a priority level; jobs without a key take their "
        "turn as one key), instead of oldest first. Work-conserving: a key with nothing "
        "due loses its turn, never a slot.",
    )
    weights: dict[str, int] = key(  # noqa: RUF009 (a field, from its factory)
        factory=dict,
        check=checks.fair_weights,
        example={"big-customer": 3},
        help="With fair: jobs per turn of these concurrency keys (1 to 1000; other keys 1).",
    )
    rate: checks.Rate | None = key(  # noqa: RUF009 (None by default; a Rate is frozen)
        None,
        check=checks.rate,
        example=checks.Rate(20, "m"),
        help='Fleet-wide start rate: at most this many starts per unit ("20/m"), spaced '
        "evenly (one every 3 s), on all hosts together, held by the claim itself; a "
        "rescue of a lost job is a start too (default: none). Give every daemon the same.",
    )
    rate_per_key: checks.Rate | None = key(  # noqa: RUF009 (None by default; a Rate is frozen)
        None,
        check=checks.rate,
        example=checks.Rate(2, "m"),
        help="Fleet-wide start rate per concurrency key; jobs without a key are not "
        "limited by it (default: none).",
    )
    max_snoozes: int = key(
        DEFAULT_MAX_SNOOZES,
        check=checks.integer(0, MAX_SNOOZES_LIMIT),
        help='Handler-controlled outcomes (README "Outcomes of an attempt"): a job may '
        "snooze (`raise pgworkerd.Snooze(seconds)`: back to pending, the attempt not "
        "counted) this many times in all; a snooze beyond it counts as a failed attempt.",
    )
    no_retry: tuple[str, ...] = key(
        (),
        check=checks.exception_type_names,
        example=("ValueError", "myapp.errors.PermanentError"),
        help="Exception types that end the job as dead at once (no retry), by qualified "
        "name, matched along the raised exception's class hierarchy (so subclasses match "
        "too); builtins by their bare name.",
    )
    memory_limit: int | None = key(
        None,
        check=checks.size,
        example=2 << 30,
        help="Memory limit of this handler's jobs (their whole process tree); default "
        "worker.memory_limit.",
    )
    stop_grace: float | None = key(
        None,
        check=checks.stop_grace,
        example=30.0,
        help="Hand-back grace of this handler's jobs (default: worker.stop_grace; --grace "
        "overrides).",
    )
    memory_estimate: int | None = key(
        None,
        check=checks.size,
        example=512 << 20,
        help="With worker.memory_budget: what one of its jobs is expected to use until 5 "
        "of its attempts have a measured peak (default: its memory_limit).",
    )
    concurrency: int = key(
        1,
        check=checks.integer(1, MAX_CONCURRENCY),
        example=8,
        help="An async def handler only: one child runs up to this many of its jobs at once, "
        'as coroutines of one event loop (docs/guide/handlers.md, "Async handlers"). Each '
        "job still takes one of the handler's slots. A plain def handler must keep 1.",
    )

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]


@dataclass(frozen=True)
class ScheduleConfig:
    """A periodic job: `cron` in `timezone`, or `every` (whole seconds, ticking on
    multiples of it since the Unix epoch so that every host computes the same ticks)."""

    name: str  # the NAME of [schedules.NAME]
    handler: str = key(
        check=checks.named("handler"),
        example="echo",
        help="Required: the handler the job names; it needs no [handlers.NAME] table on this host.",
    )
    cron: str = key(
        "",
        unset=True,
        check=checks.cron,
        example="0 3 * * *",
        help="A cron expression (5 fields, or 6 with seconds first), read in `timezone`; "
        "DST as Debian cron: a time skipped by spring-forward runs at the jump, a time "
        "repeated in autumn runs once. Exactly one of cron and every.",
    )
    timezone: str = key(
        "UTC",
        check=checks.timezone,
        example="Europe/Berlin",
        help="The IANA time zone `cron` is read in; an interval has none.",
    )
    every: float | None = key(
        None,
        check=checks.every,
        example=900.0,
        help="Or an interval in whole seconds, ticking on its multiples since the Unix epoch.",
    )
    payload: dict[str, Any] = key(  # noqa: RUF009 (a field, from its factory)
        factory=dict,
        check=checks.payload,
        example={"kind": "full"},
        help="The job's payload (what enqueue refuses, such as a date, a NUL character or "
        "nesting deeper than 255 levels, is refused here).",
    )
    # resolved by parse_config when empty: the handler's queue, else "default"
    queue: str = key(
        "",
        unset=True,
        check=checks.named("queue"),
        example="default",
        help="The job's queue. Default: the handler's queue when the handler is declared "
        'here, else "default".',
    )
    priority: int = key(0, check=checks.priority, help="The job's priority.")
    max_attempts: int | None = key(
        None,
        check=checks.max_attempts,
        example=5,
        help="The job's attempts. Default: enqueue's (5).",
    )
    overlap: str = key(
        "skip",
        check=checks.choice("skip", "allow", "queue_one"),
        help='"skip": no new job while the previous one is pending or running (the tick is '
        'recorded as skipped); "queue_one": at most one waiting beside a running one; '
        '"allow".',
    )
    catch_up: str = key(
        "last",
        check=checks.choice("last", "none"),
        help='After every daemon declaring it was down across ticks: "last" fires the '
        'latest missed tick once; "none" fires nothing late. Never one job per missed tick.',
    )
    # Keys of the jobs it fires (schema 34): per-key limits and dedupe apply to them.
    concurrency_key: str | None = key(
        None,
        check=checks.named("concurrency_key"),
        example="reports",
        help="The jobs' concurrency key: they share its slots of the handler's "
        "max_running_per_key with every other job of the key.",
    )
    dedupe_key: str | None = key(
        None,
        check=checks.dedupe_key,
        example="nightly-report",
        help="The jobs' dedupe key: a tick that finds it held (by a job not finished, or "
        "one within its dedupe_window, enqueued by this schedule or anyone) is recorded as "
        "skipped, naming that job.",
    )
    dedupe_window: float | None = key(
        None,
        check=checks.dedupe_window,
        example=3600.0,
        help="With dedupe_key: the key stays held this long after the job finished.",
    )

    # added in schema 34: left out of the stored definition while unset, so that a
    # definition declared before stays equal to this config's
    _LATER_KEYS = ("concurrency_key", "dedupe_key", "dedupe_window")

    def definition(self) -> dict[str, Any]:
        """What the database keeps of it (schedules.definition) and `schedules` shows."""
        data = dataclasses.asdict(self)
        del data["name"]
        for name in self._LATER_KEYS:
            if data[name] is None:
                del data[name]
        return data

    def job(self) -> dict[str, Any]:
        """The job object a tick enqueues (enqueue_many's form)."""
        job: dict[str, Any] = {
            "handler": self.handler,
            "payload": self.payload,
            "queue": self.queue,
            "priority": self.priority,
        }
        if self.max_attempts is not None:
            job["max_attempts"] = self.max_attempts
        for name in self._LATER_KEYS:
            if getattr(self, name) is not None:
                job[name] = getattr(self, name)
        return job


def import_handler(handler: HandlerConfig) -> Callable[..., Any]:
    """Import a handler's function; ConfigError explains what went wrong."""
    module_name, _, function = handler.target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code is a config error
        raise ConfigError(
            f"handler {handler.name!r}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    func = getattr(module, function, None)
    if not callable(func):
        raise ConfigError(f"handler {handler.name!r}: {module_name!r} has no function {function!r}")
    from pgworkerd.typed import check_declaration

    try:
        check_declaration(func)  # a typed payload's declaration (pgworkerd.typed)
    except TypeError as exc:
        raise ConfigError(f"handler {handler.name!r}: {exc}") from None
    if handler.concurrency > 1 and not inspect.iscoroutinefunction(func):
        raise ConfigError(
            f"handler {handler.name!r}: concurrency = {handler.concurrency} needs an async def "
            f"handler, and {handler.target} is a plain function (a sync handler runs one job "
            "per child: leave concurrency at 1, or make the handler async def)"
        )
    return func
