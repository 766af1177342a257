"""Keeps the leases of the jobs in flight: renews them all in one statement every
renew_interval, and saves progress and checkpoints (at most every PROGRESS_SAVE_INTERVAL)
with the same statement. A lease the database refuses stops its job at once; a cancel
request read back with the renewal stops it politely."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from pgworkerd.daemon.jobtable import JobTable
from pgworkerd.daemon.outcomes import fence_margin
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.queue.lease import Lease, RenewOutcome

log = logging.getLogger("pgworkerd")

# Progress and checkpoints reach the job row at most this often.
PROGRESS_SAVE_INTERVAL = 1.0


class LeaseStatements(Protocol):
    """The database calls the lease keeper makes (daemon.statements.Statements; None: the
    call failed)."""

    @property
    def ok(self) -> bool: ...

    def renew(self, leases: list[Lease]) -> list[RenewOutcome] | None: ...


class LeaseKeeper:
    def __init__(
        self,
        statements: LeaseStatements,
        table: JobTable,
        metrics: NullMetrics,
        renew_interval: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.statements = statements
        self.table = table
        self.metrics = metrics
        self.renew_interval = renew_interval
        self.clock = clock
        self.renew_at = 0.0
        self.progress_at = 0.0

    def configure(self, renew_interval: float) -> None:
        """After a reload; the next renewal keeps its time."""
        self.renew_interval = renew_interval

    def renew_now(self) -> None:
        """At the next tick (after a reconnect: leases may be short by now)."""
        self.renew_at = 0.0

    def next_deadline(self) -> float | None:
        if not self.statements.ok:
            return None  # nothing to do until the link is back (the loop waits for that)
        if not self.table.has_unsaved():
            return self.renew_at
        return min(self.renew_at, self.progress_at)

    def tick(self, now: float) -> None:
        due = now >= self.renew_at
        save_progress = self.table.has_unsaved() and now >= self.progress_at
        if not self.statements.ok or not (due or save_progress):
            return
        chosen = [j for j in self.table if due or j.unsaved]
        if due:
            self.renew_at = now + self.renew_interval
        self.progress_at = now + PROGRESS_SAVE_INTERVAL
        if not chosen:
            return
        leases = [
            Lease(
                j.job.id,
                j.job.token,
                j.lease,
                j.progress if j.unsaved else None,
                j.checkpoint if j.unsaved else None,
            )
            for j in chosen
        ]
        sent_at = self.clock()
        results = self.statements.renew(leases)
        saved = True
        if results is None and self.statements.ok and any(j.unsaved for j in chosen):
            # Refused with the database up (a timeout; a value it will not store, which
            # the checks on arrival should make impossible): renew the leases alone at
            # once, so no job loses its lease to one job's progress. The values stay
            # unsaved: they go again at the next save, and with the job's outcome.
            log.warning(
                "renewing leases with the progress or checkpoints of job(s) %s failed; "
                "renewing them without",
                ", ".join(str(j.job.id) for j in chosen if j.unsaved),
            )
            bare = [Lease(lease.id, lease.token, lease.lease_seconds) for lease in leases]
            sent_at, saved = self.clock(), False
            results = self.statements.renew(bare)
        if results is None:
            return
        by_id = {j.job.id: j for j in chosen}
        for r in results:
            job = by_id[r.id]
            if not self.table.holds(job):
                continue  # settled while the statement ran
            if not r.renewed:
                self.table.lease_lost(job, "lease lost (re-claimed elsewhere or cancelled)")
                continue
            self.metrics.lease_renewed()
            self.table.lease_renewed(
                job, sent_at + job.lease - fence_margin(job.lease), saved=saved
            )
            if r.cancel_requested:
                self.table.cancel(job)
