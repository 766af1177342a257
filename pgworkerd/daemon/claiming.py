"""What the daemon claims and where it goes: the claim itself (free slots per handler,
one statement), the wake-up for the next scheduled job, handing claimed jobs to idle
children, and keeping warm children ready. A mixin of Daemon, like Presence: it reads the
daemon's state and adds claimed jobs to in_flight."""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING

from pgworkerd.daemon.outcomes import InFlight, Outcome, fence_margin
from pgworkerd.describe import short_error
from pgworkerd.queue.lease import (
    ClaimedJob,
    HandlerCapacity,
    RefusedJob,
    claim_checked,
    next_run_in,
)
from pgworkerd.worker import wire

if TYPE_CHECKING:
    from pgworkerd.config import Config, HandlerConfig
    from pgworkerd.daemon.dblink import DatabaseLink
    from pgworkerd.daemon.loop import Timers
    from pgworkerd.daemon.supervisor import Supervisor
    from pgworkerd.ops.metrics import NullMetrics

log = logging.getLogger("pgworkerd")

# Claims caused by NOTIFY are at most this frequent: any role may NOTIFY the channel, and
# a flood of notifications must not become a flood of claims (20 ms: at most 50 a second,
# while a single enqueue into an idle daemon still starts at once).
NOTIFY_CLAIM_INTERVAL = 0.02


class Claiming:
    # provided by Daemon
    config: Config
    worker_id: str
    schema: str
    state: str
    db: DatabaseLink
    supervisor: Supervisor
    metrics: NullMetrics
    in_flight: dict[int, InFlight]
    outcomes: deque[Outcome]
    timers: Timers
    drain_requested_in_db: bool
    claim_wanted: bool
    backlog: bool

    def _may_claim(self) -> bool:
        return self.state == "running" and not self.drain_requested_in_db and self.db.ok

    def _free_slots(self) -> int:
        return self.config.worker.slots - len(self.in_flight)

    def _claim_if_wanted(self) -> None:
        now = time.monotonic()
        t = self.timers
        if not self._may_claim():
            return
        if now >= t.poll_at or (t.scheduled_at is not None and now >= t.scheduled_at):
            self.claim_wanted = True
        if t.notified_at is not None and now >= t.notify_claim_at + NOTIFY_CLAIM_INTERVAL:
            t.notified_at, t.notify_claim_at = None, now
            self.claim_wanted = True
        free = self._free_slots()
        if not self.claim_wanted or free <= 0 or not self.config.handlers:
            return
        self.claim_wanted = False
        t.poll_at = now + self.config.worker.poll_interval
        busy_per_handler: dict[str, int] = {}
        for j in self.in_flight.values():
            busy_per_handler[j.job.handler] = busy_per_handler.get(j.job.handler, 0) + 1
        capacity = {
            name: HandlerCapacity(
                lease_seconds=self.config.lease_for(h),
                free=(
                    free if h.slots is None else min(free, h.slots - busy_per_handler.get(name, 0))
                ),
                max_attempts=h.max_attempts,
            )
            for name, h in self.config.handlers.items()
        }
        sent_at = time.monotonic()
        result = self.db.run(
            "claiming jobs",
            lambda c: claim_checked(
                c,
                self.worker_id,
                queues=self.config.queues,
                handlers=capacity,
                limit=free,
                schema=self.schema,
            ),
        )
        if result is None:
            return
        claimed, refused = result
        self.backlog = len(claimed) + len(refused) == free
        for bad in refused:
            # Its row cannot be loaded: finished on its own, the rest of the claim runs.
            self._refuse(bad, self.config.handlers.get(bad.handler), f"cannot run: {bad.reason}")
        for job in claimed:
            self.metrics.claimed(job.handler, rescued=job.rescued)
            handler = self.config.handlers[job.handler]
            lease = self.config.lease_for(handler)
            self.in_flight[job.id] = InFlight(
                job=job,
                handler=handler,
                lease=lease,
                claimed_at=sent_at,
                deadline=sent_at + lease - fence_margin(lease),
            )
            log.info(
                "job %d %s attempt %d: claimed%s",
                job.id,
                job.handler,
                job.attempt,
                " (rescued after its lease expired)" if job.rescued else "",
                extra={
                    "fields": {
                        "job_id": job.id,
                        "handler": job.handler,
                        "attempt": job.attempt,
                        "event": "claimed",
                    }
                },
            )
        self._dispatch()
        if not self.backlog:
            self._schedule_next_run()

    def _refuse(
        self, job: ClaimedJob | RefusedJob, handler: HandlerConfig | None, reason: str
    ) -> None:
        """A claimed job this daemon cannot run at all: dead at once with the reason
        (written like any outcome: fenced, kept while the database is away)."""
        self.in_flight.pop(job.id, None)
        self.outcomes.append(Outcome(job, handler, "bury", 0.0, error=reason))

    def _schedule_next_run(self) -> None:
        wait = self.db.run(
            "looking up scheduled jobs",
            lambda c: next_run_in(c, self.config.queues, self.config.handlers, schema=self.schema),
        )
        self.timers.scheduled_at = None
        if wait is not None:
            self.timers.scheduled_at = time.monotonic() + max(0.0, wait)

    def _dispatch(self) -> None:
        waiting = [j for j in self.in_flight.values() if j.child is None and j.stop_reason is None]
        if not waiting:
            return
        idle = self.supervisor.idle()
        for job in waiting:
            if not idle:
                return
            try:
                frame = wire.encode(
                    {
                        "t": "job",
                        "id": job.job.id,
                        "handler": job.job.handler,
                        "target": job.handler.target,
                        "queue": job.job.queue,
                        "payload": job.job.payload,
                        "attempt": job.job.attempt,
                        "max_attempts": job.job.max_attempts,
                        "checkpoint": job.job.checkpoint,
                        "deadline": job.deadline,
                    }
                )
            except Exception as exc:  # this job's data: too big, too deep, not JSON
                self._refuse(
                    job.job, job.handler, f"cannot be handed to a child: {short_error(exc)}"
                )
                continue
            child = idle.pop(0)
            job.child = child
            if not self.supervisor.assign(child, job.job.id, frame):
                job.child = None
                child.job = None

    def _keep_warm(self) -> None:
        if not self._may_claim():
            # Children that were still starting when a drain began come up idle: retire
            # them, or the daemon would wait for them until its exit deadline.
            for child in self.supervisor.idle():
                self.supervisor.retire(child)
            return
        waiting = sum(1 for j in self.in_flight.values() if j.child is None)
        target = min(self.config.worker.warm_children, self._free_slots()) + waiting
        have = len(self.supervisor.idle()) + self.supervisor.starting()
        for _ in range(target - have):
            if not self.supervisor.spawn():
                break
