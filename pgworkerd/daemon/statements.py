"""The daemon's database calls, typed, each run over the link.

Every method returns None when its call failed: the link has logged why, and a lost
connection marks it down until a reconnect. This is the only daemon module that runs
the queue's statements, so the components above it can be driven in-process by a fake
with the same methods (tests/unit).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from pgworkerd.config import RetentionConfig
from pgworkerd.daemon import outcomes
from pgworkerd.daemon.dblink import DatabaseLink
from pgworkerd.daemon.outcomes import Outcome
from pgworkerd.daemon.peers import Wake
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.queue import (
    attempts,
    finish,
    hotpath,
    joblogs,
    lease,
    registry,
    retention,
    schedules,
    session,
)
from pgworkerd.queue.attempts import Usage
from pgworkerd.queue.joblogs import LogWrite

log = logging.getLogger("pgworkerd")

T = TypeVar("T")


# Maintenance (the sweeps of waits' timeouts and expired jobs, retention's prune, the
# scheduler's declarations and fires) waits at most this long for a lock (a migration,
# VACUUM FULL, an operator's LOCK TABLE on jobs, schedules or schedule_runs): it fails,
# is logged and is tried again on its next turn, and the loop (heartbeats, claims,
# outcomes) never stalls behind it. Row locks are skipped by the sweeps and the prune
# themselves (SKIP LOCKED).
MAINTENANCE_LOCK_TIMEOUT_MS = 500


class Statements:
    def __init__(
        self,
        link: DatabaseLink,
        worker_id: str,
        schema: str,
        metrics: NullMetrics,
        *,
        spans: Any = None,
    ) -> None:
        self.link = link
        # tracing.DaemonSpans ([tracing] enabled): claims and outcome writes are spans, and
        # the claimed jobs' trace contexts go to their children; None: neither
        self.spans = spans
        self.worker_id = worker_id
        self.schema = schema
        self.metrics = metrics
        # what this daemon names in every write of its registry row (schema 24): no other
        # session can write the row, nor take the id over; never logged
        self._registry_secret = registry.new_secret()
        # what the loop does while a claim's answer is on its way (hotpath.meanwhile: it
        # reads its children and hands them held jobs); None: it waits
        self.while_claiming: Callable[[int], None] | None = None
        # The connection whose plans were made again at its first claim that filled every
        # slot (see _replan_for_backlog); another one (a reconnect) gets its own.
        self._replanned_on: object | None = None

    @property
    def ok(self) -> bool:
        """The link is up (a call may still fail)."""
        return self.link.ok

    @staticmethod
    def _lock_bounded(conn: Any, call: Callable[[], T]) -> T:
        """Maintenance's `call()` in a transaction whose lock waits end after
        MAINTENANCE_LOCK_TIMEOUT_MS (it then fails, is logged, and is tried again)."""
        return session.lock_bounded(conn, MAINTENANCE_LOCK_TIMEOUT_MS, call)

    def claim(
        self,
        queues: Sequence[str],
        capacity: dict[str, lease.HandlerCapacity],
        limit: int,
        completions: Sequence[Outcome] = (),
    ) -> tuple[list[lease.ClaimedJob], list[lease.RefusedJob]] | None:
        """Claim jobs, writing `completions` (finished attempts) in the same transaction
        first: all or nothing (None: neither happened). Each job comes with all its child
        needs (its parents' results, what woke it, a callback's batch, its enqueuer's trace
        context): the claim returns them (claim_jobs_v3). Traced: a span; untraced, the
        jobs' trace contexts are dropped (a child gets one only while [tracing] is
        enabled: protocol.Job.trace)."""
        if self.spans is None:
            result = self._claim(queues, capacity, limit, completions)
            if result is None:
                return None
            self._replan_for_backlog(len(result[0]) + len(result[1]), limit)
            return [_untraced(j) for j in result[0]], result[1]
        with self.spans.span(
            "pgworkerd claim",
            **{"pgworkerd.claim.limit": limit, "pgworkerd.claim.outcomes": len(completions)},
        ) as span:
            result = self._claim(queues, capacity, limit, completions)
            if result is None:
                span.set_status(tracing_error("the claim failed (the daemon's log says why)"))
                return None
            claimed = result[0]
            self._replan_for_backlog(len(claimed) + len(result[1]), limit)
            span.set_attribute("pgworkerd.claim.jobs", len(claimed))
            self.spans.link_jobs(
                span,
                [(j, {"pgworkerd.job.attempt": j.attempt}) for j in claimed]
                + [(o.job, outcome_link(o)) for o in completions],
            )
            return claimed, result[1]

    def _replan_for_backlog(self, taken: int, limit: int) -> None:
        """At a connection's first claim that filled every slot (of at least two), make its
        plans again. The session keeps the claim's plans (schema 42); made at a daemon's
        first claims, on an empty queue, they read a backlog through the wrong indexes (a
        scan of an index per claimed job: docs/benchmarks/2026-11-27-claim-cost.md) until
        autovacuum's ANALYZE, minutes later, has them made again."""
        conn = self.link.conn
        if taken < limit or limit < 2 or conn is None or conn is self._replanned_on:
            return
        self._replanned_on = conn
        self.link.run(
            "making the claim's plans again", lambda c: session.plans_discard(c, schema=self.schema)
        )

    def _claim(
        self,
        queues: Sequence[str],
        capacity: dict[str, lease.HandlerCapacity],
        limit: int,
        completions: Sequence[Outcome] = (),
    ) -> tuple[list[lease.ClaimedJob], list[lease.RefusedJob]] | None:
        if completions:
            batch = list(completions)
            writes = [o.write() for o in batch]

            def call(c: Any) -> Any:
                with hotpath.meanwhile(c, self.while_claiming):
                    return finish.complete_and_claim(
                        c,
                        self.worker_id,
                        writes,
                        queues=queues,
                        handlers=capacity,
                        limit=limit,
                        schema=self.schema,
                    )

            result = self.link.run("recording outcomes and claiming jobs", call)
            if result is None:
                return None
            recorded, claimed, refused = result
            outcomes.report(batch, recorded, self.metrics)
            return claimed, refused
        return self.link.run(
            "claiming jobs",
            lambda c: lease.claim_checked(
                c,
                self.worker_id,
                queues=queues,
                handlers=capacity,
                limit=limit,
                schema=self.schema,
            ),
        )

    def waits_expire(self, max_jobs: int) -> int | None:
        """Suspended jobs past their timeout become pending, at most `max_jobs` (None: the
        call failed)."""
        return self.link.run(
            "moving timed-out waits back to pending",
            lambda c: self._lock_bounded(
                c, lambda: lease.waits_expire(c, max_jobs, schema=self.schema)
            ),
        )

    def next_wakeups(
        self, queues: Sequence[str], handlers: Sequence[str]
    ) -> lease.NextWakeups | None:
        """The earliest scheduled job this daemon could claim and the running job whose
        lease ends first (None: the lookup failed)."""
        return self.link.run(
            "looking up scheduled jobs",
            lambda c: lease.next_wakeups(c, queues, handlers, schema=self.schema),
        )

    def peers(self, stale_after: float) -> list[tuple[str, list[str], list[str], int]] | None:
        return self.link.run(
            "reading the registry", lambda c: registry.peers(c, stale_after, self.schema)
        )

    def wake_send(self, payload: str) -> bool | None:
        def call(c: Any) -> bool:
            registry.wake_send(c, payload, self.schema)
            return True

        return self.link.run("forwarding a wake-up", call)

    def wake_forward(self, wake: Wake) -> bool | None:
        """Hand a wake-up aimed at this daemon on (wake.skip: the next group's start)."""
        if wake.queue is None or wake.handler is None:
            return False
        queue, handler = wake.queue, wake.handler

        def call(c: Any) -> bool:
            registry.wake_forward(
                c, queue, handler, wake.job_id, wake.count, wake.skip, wake.hops, self.schema
            )
            return True

        return self.link.run("forwarding a wake-up", call)

    def wake_channel_set(self, listening: bool) -> bool | None:
        """Say in this daemon's row whether it listens on its own wake channel; None: the
        call failed, False: the row is not there."""
        return self.link.run(
            "recording the wake channel",
            lambda c: registry.wake_channel_set(
                c, self.worker_id, listening, self.schema, secret=self._registry_secret
            ),
        )

    def renew(self, leases: list[lease.Lease]) -> list[lease.RenewOutcome] | None:
        return self.link.run(
            "renewing leases",
            lambda c: lease.renew(c, self.worker_id, leases, schema=self.schema),
        )

    def write_outcomes(self, batch: list[Outcome]) -> bool | None:
        """Record a batch (completions, or one other outcome; queue.finish.record), then
        log and count what became of it (None: the write failed, nothing is reported).
        Traced: a span linked to the enqueuers of the jobs."""
        if self.spans is None:
            return self._write_outcomes(batch)
        with self.spans.span(
            "pgworkerd record outcomes", **{"pgworkerd.outcomes": len(batch)}
        ) as span:
            self.spans.link_jobs(span, [(o.job, outcome_link(o)) for o in batch])
            written = self._write_outcomes(batch)
            if written is None:
                span.set_status(tracing_error("the write failed (the daemon's log says why)"))
            return written

    def _write_outcomes(self, batch: list[Outcome]) -> bool | None:
        writes = [o.write() for o in batch]
        recorded = self.link.run(
            "recording outcomes",
            lambda c: finish.record(c, self.worker_id, writes, schema=self.schema),
        )
        if recorded is None:
            return None
        outcomes.report(batch, recorded, self.metrics)
        return True

    def write_usage(self, usages: list[Usage]) -> bool | None:
        """What finished attempts cost, to their history rows (written already)."""
        return self.link.run(
            "recording attempt figures",
            lambda c: attempts.record_usage(c, self.worker_id, usages, schema=self.schema),
        )

    def memory_peaks(
        self, handlers: Sequence[str], *, percentile: float, last: int, jobs: int
    ) -> dict[str, attempts.MemoryPeak] | None:
        """Per handler, its recent attempts' peak memory (memory admission; None: the
        read failed)."""
        return self.link.run(
            "reading the handlers' recent peak memory",
            lambda c: attempts.memory_peaks(
                c, handlers, percentile=percentile, last=last, jobs=jobs, schema=self.schema
            ),
        )

    def write_logs(self, entries: list[LogWrite]) -> set[int] | None:
        """What running and ended attempts printed, to job_logs."""
        return self.link.run(
            "storing job output",
            lambda c: joblogs.store(c, self.worker_id, entries, schema=self.schema),
        )

    def register(self, info: registry.WorkerInfo, state: str, heartbeat_interval: float) -> None:
        self.link.run(
            "registering",
            lambda c: registry.register(
                c, info, state, self.schema, heartbeat_interval, secret=self._registry_secret
            ),
        )

    def deregister(self) -> None:
        self.link.run(
            "deregistering",
            lambda c: registry.deregister(
                c, self.worker_id, self.schema, secret=self._registry_secret
            ),
        )

    def heartbeat(
        self,
        info: registry.WorkerInfo,
        state: str,
        job_ids: list[int],
        heartbeat_interval: float,
    ) -> registry.DrainRequest | None:
        """The registry heartbeat, with the most seconds until the next one; returns the
        drain requested of this daemon (None: the call failed, or the row is gone)."""
        return self.link.run(
            "heartbeat",
            lambda c: registry.heartbeat(
                c,
                info,
                state,
                job_ids,
                self.schema,
                heartbeat_interval,
                secret=self._registry_secret,
            ),
        )

    def mark_stale(self, stale_after: float) -> list[tuple[str, str, int]] | None:
        return self.link.run(
            "marking stale daemons",
            lambda c: registry.mark_stale(c, stale_after, self.schema),
        )

    def expired_cancel(self, max_jobs: int) -> int | None:
        """One batch of the fleet's expiry sweep (None: the call failed)."""
        return self.link.run(
            "ending jobs past their expires_at",
            lambda c: self._lock_bounded(
                c, lambda: retention.expired_cancel(c, max_jobs, self.schema)
            ),
        )

    def rollup_attempts(self) -> attempts.RollupStep | None:
        """One step of the charts' rollup (None: the call failed, or another daemon is
        rolling up)."""
        return self.link.run(
            "rolling up ended attempts for the charts",
            lambda c: attempts.rollup_advance(c, self.schema),
        )

    def prune_finished(self, config: RetentionConfig) -> retention.PruneResult | None:
        """One batch of the fleet's retention (None: the call failed)."""
        return self.link.run(
            "pruning finished jobs, schedule runs and gone daemons",
            lambda c: self._lock_bounded(c, lambda: retention.prune_batch(c, config, self.schema)),
        )

    # -- schedules (periodic jobs) ----------------------------------------------------------

    def declare_schedule(self, name: str, definition: dict[str, Any]) -> datetime | None:
        """Record our definition; returns the tick up to which the schedule is handled."""
        return self.link.run(
            f"declaring schedule {name!r}",
            lambda c: self._lock_bounded(
                c, lambda: schedules.declare(c, name, definition, self.worker_id, self.schema)
            ),
        )

    def set_declared_schedules(self, names: Sequence[str]) -> bool | None:
        def call(c: Any) -> bool:
            schedules.set_declared(
                c, self.worker_id, names, self.schema, secret=self._registry_secret
            )
            return True

        return self.link.run(
            "recording declared schedules", lambda c: self._lock_bounded(c, lambda: call(c))
        )

    def fire_schedule(self, name: str, tick: datetime) -> schedules.Fired | None:
        return self.link.run(
            f"firing schedule {name!r}",
            lambda c: self._lock_bounded(
                c, lambda: schedules.fire(c, name, tick, self.worker_id, self.schema)
            ),
        )


# -- tracing helpers (called only with [tracing] enabled: OpenTelemetry is imported) -----


def outcome_link(outcome: Outcome) -> dict[str, Any]:
    """The attributes of the link from an outcome write to the job's enqueuer: the
    attempt, its outcome and its error's first line."""
    from pgworkerd import tracing

    attributes: dict[str, Any] = {"pgworkerd.job.outcome": str(outcome.kind)}
    attempt = getattr(outcome.job, "attempt", None)
    if attempt is not None:
        attributes["pgworkerd.job.attempt"] = attempt
    if outcome.error:
        attributes["pgworkerd.job.error"] = tracing.error_text(outcome.error)
    return attributes


def tracing_error(description: str) -> Any:
    from opentelemetry.trace import Status, StatusCode

    return Status(StatusCode.ERROR, description)


def _untraced(job: lease.ClaimedJob) -> lease.ClaimedJob:
    """The job without its trace context: a daemon that does not trace hands none on."""
    return job if job.trace is None else dataclasses.replace(job, trace=None)
