"""What the daemon claims, and when: free slots per handler in one statement, the wake-up
for the next scheduled job, coalesced NOTIFY wake-ups, and the warm children that claimed
jobs go to.

A claim is wanted when something says so through request() / request_at() / notified(),
when the poll interval passes, or when a slot frees while the last claim filled every
slot (a backlog). The claimer claims only while accepting (the daemon runs, no drain is
requested, the database is up) and while a child can be started for what it claims.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pgworkerd.config import Config
from pgworkerd.daemon.jobtable import JobTable
from pgworkerd.daemon.statements import Statements
from pgworkerd.daemon.supervisor import Supervisor
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.queue.lease import HandlerCapacity

log = logging.getLogger("pgworkerd")

# Claims caused by NOTIFY are at most this frequent: any role may NOTIFY the channel, and
# a flood of notifications must not become a flood of claims (20 ms: at most 50 a second,
# while a single enqueue into an idle daemon still starts at once).
NOTIFY_CLAIM_INTERVAL = 0.02


class Claimer:
    def __init__(
        self,
        config: Config,
        statements: Statements,
        table: JobTable,
        supervisor: Supervisor,
        metrics: NullMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.statements = statements
        self.table = table
        self.supervisor = supervisor
        self.metrics = metrics
        self.clock = clock
        self.accepting = False
        self.wanted = True
        self.backlog = False  # the last claim filled every free slot: more may wait
        self.poll_at = 0.0
        self.scheduled_at: float | None = None  # earliest future run_at, or a retry
        self.notified_at: float | None = None  # a NOTIFY came and caused no claim yet
        self.notify_claim_at = 0.0  # the last claim a NOTIFY caused

    def configure(self, config: Config) -> None:
        """After a reload: new handlers, queues and slots, and claim with them at once."""
        self.config = config
        self.request()

    # -- why to claim --------------------------------------------------------------------

    def request(self) -> None:
        """Claim at the next tick."""
        self.wanted = True

    def request_at(self, when: float) -> None:
        """Claim at `when` (a failed job's retry, a scheduled job)."""
        self.scheduled_at = when if self.scheduled_at is None else min(self.scheduled_at, when)

    def notified(self, now: float) -> None:
        """A NOTIFY arrived: claim soon, but at most once per NOTIFY_CLAIM_INTERVAL."""
        self.notified_at = self.notified_at or now

    def slot_freed(self) -> None:
        # With a fleet-wide limit, a short claim says nothing about what waits: jobs may
        # be held back only by the limit, and the slot that just freed here may be the
        # fleet slot they wait for. So claim again, as with a backlog.
        if self.backlog or any(
            h.max_running is not None or h.max_running_per_key is not None
            for h in self.config.handlers.values()
        ):
            self.request()

    def set_accepting(self, accepting: bool) -> None:
        if accepting and not self.accepting:
            self.request()
        self.accepting = accepting

    # -- the tick ------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Claim if wanted, hand claimed jobs to idle children, keep warm children."""
        self._claim_if_wanted(now)
        self.table.dispatch()
        self._keep_warm()

    def next_deadline(self) -> float | None:
        # Claim timers only matter with a free slot and something to claim for; past
        # ones would spin the loop.
        if not self._may_claim() or self.table.free_slots() <= 0 or not self.config.handlers:
            return None
        times = [self.poll_at]
        if self.scheduled_at is not None:
            times.append(self.scheduled_at)
        if self.notified_at is not None:
            times.append(self.notify_claim_at + NOTIFY_CLAIM_INTERVAL)
        return min(times)

    def _may_claim(self) -> bool:
        # A job claimed without a child to run it would only hold its lease while another
        # daemon could run it: no claims while no child can be started.
        return self.accepting and self.supervisor.can_start()

    def _claim_if_wanted(self, now: float) -> None:
        if not self._may_claim():
            return
        if self.scheduled_at is not None and now >= self.scheduled_at:
            self.wanted, self.scheduled_at = True, None  # served: a failed claim must not
            # leave a past deadline behind (the loop would spin on it)
        if now >= self.poll_at:
            self.wanted = True
        if self.notified_at is not None and now >= self.notify_claim_at + NOTIFY_CLAIM_INTERVAL:
            self.notified_at, self.notify_claim_at = None, now
            self.wanted = True
        free = self.table.free_slots()
        if not self.wanted or free <= 0 or not self.config.handlers:
            return
        self.wanted = False
        self.poll_at = now + self.config.worker.poll_interval
        sent_at = self.clock()
        result = self.statements.claim(self.config.queues, self.capacity(free), free)
        if result is None:
            return
        claimed, refused = result
        self.backlog = len(claimed) + len(refused) == free
        for bad in refused:
            # Its row cannot be loaded: finished on its own, the rest of the claim runs.
            self.table.refuse(
                bad, self.config.handlers.get(bad.handler), f"cannot run: {bad.reason}"
            )
        for job in claimed:
            if self.table.has_job(job.id):
                # Only after the database lost acknowledged writes (a failover to an
                # asynchronous standby, or a crash of a server whose own claims were not
                # durable): our claim rolled back and we claimed the job again. One child
                # per job: the running attempt stays, the new lease is left to run out.
                log.warning(
                    "job %d %s: claimed again while its attempt runs here (the database lost "
                    "acknowledged writes); not starting it twice",
                    job.id,
                    job.handler,
                )
                continue
            self.metrics.claimed(job.handler, rescued=job.rescued)
            handler = self.config.handlers[job.handler]
            self.table.add(job, handler, self.config.lease_for(handler), sent_at)
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
        self.table.dispatch()  # start them before the next lookup
        if not self.backlog:
            next_in = self.statements.next_run_in(self.config.queues, list(self.config.handlers))
            self.scheduled_at = None if next_in is None else self.clock() + max(0.0, next_in)

    def capacity(self, free: int) -> dict[str, HandlerCapacity]:
        """What each handler may claim now: the free slots, capped by its own slots."""
        busy = self.table.busy_per_handler()
        return {
            name: HandlerCapacity(
                lease_seconds=self.config.lease_for(h),
                free=free if h.slots is None else min(free, h.slots - busy.get(name, 0)),
                max_attempts=h.max_attempts,
                queues=h.queues or None,
                max_running=h.max_running,
                max_running_per_key=h.max_running_per_key,
            )
            for name, h in self.config.handlers.items()
        }

    def _keep_warm(self) -> None:
        if not self.accepting:
            # Children that were still starting when a drain began come up idle: retire
            # them, or the daemon would wait for them until its exit deadline.
            for child in self.supervisor.idle():
                self.supervisor.retire(child)
            return
        waiting = len(self.table.waiting())
        target = min(self.config.worker.warm_children, self.table.free_slots()) + waiting
        have = len(self.supervisor.idle()) + self.supervisor.starting()
        if target > have:
            self.supervisor.spawn(target - have)  # one request for all of them
