"""The daemon's maintenance: one component per kind of work, each on its own cadence, one
daemon of the fleet at a time.

- `Retention` deletes old rows: finished jobs (completed, cancelled, dead) older than the
  configured retention ([retention]), with their history (attempts and logs go with
  them), old schedule runs and the registry rows of daemons gone long ago (each kind
  bounded by `batch` rows per call). The daemons run it on their own cadence (`tick`) —
  no cron job to forget; `pgworkerd prune` runs the same component to the end at once
  (`run_to_end`), so both delete through the one statement (prune_finished_v2) under the
  one lock.
- `StaleMarking` marks gone the daemons silent past stale_after (worker_mark_stale_v2):
  `status` shows them gone and their peers drop them (the statement notifies).
- `RollupSweep` counts ended attempts per handler and minute or hour for the dashboard's
  charts (attempt_rollups_advance), spaced across the fleet like stale-marking.
  (The sweeps that move jobs when their time has come, expiry and waits' timeouts, are
  daemon/sweeps.py.)

Maintenance has one shape here: its settings (config.RetentionConfig; stale_after),
`run_once()` (one batch, one statement; returns what it did) and thin loops around it
(`tick`/`next_deadline`, like every component of the parent; `run_to_end` for the CLI).

- One daemon at a time: each statement takes a transaction-level advisory lock and
  returns at once without deleting when another daemon holds it.
- Small batches (`batch` rows, each its own short transaction: row locks never held
  long, rows locked by anyone else skipped), one after another with a short pause while
  full batches come back, so a backlog drains without holding up this daemon's loop.
- No idle load to speak of: with nothing to delete, each daemon looks again after
  `interval` times the number of live daemons (from the same statement), jittered, so
  the fleet as a whole sends about one statement per `interval`, whatever its size.
  Stale-marking is spaced the same way: each daemon every quarter of stale_after times
  the number of live daemons it knows, so the fleet looks about every quarter.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg

from pgworkerd.config import RetentionConfig
from pgworkerd.queue.attempts import RollupStep
from pgworkerd.queue.retention import PruneResult, prune_batch

log = logging.getLogger("pgworkerd")

# Between two full batches: the loop's other work (renewals, dispatch) goes first.
BATCH_PAUSE = 0.2
# Jitter of the spaced interval: a fleet started at once does not look at once.
JITTER = 0.5
# How long `run_to_end` waits for a daemon's batch (one short transaction) to let go of
# the retention lock before it gives up.
LOCK_WAIT = 60.0


class RetentionBusy(Exception):
    """The retention lock stayed taken (another caller pruning) for LOCK_WAIT seconds."""


@dataclass
class Pruned:
    """Rows deleted by consecutive batches: finished jobs, schedule runs, gone daemons."""

    jobs: int = 0
    schedule_runs: int = 0
    daemons: int = 0

    def add(self, result: PruneResult) -> None:
        self.jobs += result.deleted or 0
        self.schedule_runs += result.schedule_runs_deleted or 0
        self.daemons += result.daemons_deleted or 0


class Retention:
    def __init__(
        self,
        config: RetentionConfig,
        prune: Callable[[RetentionConfig], PruneResult | None],
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.prune = prune
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self.config = config
        self.live_daemons = 1
        # rows deleted by the consecutive batches of this run
        self.run = Pruned()
        # The first look comes at a random point of the first interval.
        self.due_at = clock() + self.rng.uniform(0.0, config.interval)

    def configure(self, config: RetentionConfig) -> None:
        """After a reload: an interval made shorter applies at once."""
        if config.interval < self.config.interval:
            self.due_at = min(self.due_at, self.clock() + config.interval)
        self.config = config

    def run_once(self) -> PruneResult | None:
        """Delete one batch; None when retention is off or the statement failed."""
        if not self.config.enabled:
            return None
        return self.prune(self.config)

    def run_to_end(self, *, sleep: Callable[[float], None] = time.sleep) -> Pruned:
        """Batch after batch until one comes back short of `batch` rows (what
        `pgworkerd prune` does); waits while another caller holds the lock, up to
        LOCK_WAIT seconds (then RetentionBusy). Errors of the statement propagate."""
        total = Pruned()
        waited = 0.0
        while True:
            result = self.run_once()
            if result is None:  # retention off: nothing to delete
                return total
            if result.deleted is None:  # a daemon is pruning: its batch is short
                if waited >= LOCK_WAIT:
                    raise RetentionBusy(
                        f"another pgworkerd kept the retention lock for {LOCK_WAIT:.0f}s; try again"
                    )
                sleep(BATCH_PAUSE)
                waited += BATCH_PAUSE
                continue
            total.add(result)
            if result.most() < self.config.batch:
                return total

    def next_deadline(self) -> float | None:
        return self.due_at if self.config.enabled else None

    def tick(self, now: float) -> None:
        if not self.config.enabled or now < self.due_at:
            return
        result = self.run_once()
        if result is not None:
            self.live_daemons = max(1, result.live_daemons)
        if result is not None and result.deleted is not None:
            self.run.add(result)
            if result.most() >= self.config.batch:
                self.due_at = now + BATCH_PAUSE  # more to do: the next batch soon
                return
            self.log_run()
        self.run = Pruned()
        self.due_at = now + self.spaced_interval()

    def log_run(self) -> None:
        """One line for the run's consecutive batches, naming what they deleted."""
        if self.run.jobs:
            log.info("retention: deleted %d finished job(s) past their retention", self.run.jobs)
        if self.run.schedule_runs or self.run.daemons:
            log.info(
                "retention: deleted %d schedule run(s) and %d gone daemon(s) from the registry",
                self.run.schedule_runs,
                self.run.daemons,
            )

    def spaced_interval(self) -> float:
        """Until this daemon looks again: the fleet's interval times its live daemons."""
        spread = self.rng.uniform(1.0 - JITTER, 1.0 + JITTER)
        return self.config.interval * self.live_daemons * spread


# A silent peer is looked for about this often (a fraction of stale_after) by the fleet
# as a whole; a peer is thus marked gone at most about stale_after x (1 + this) after its
# last heartbeat, whatever the fleet's size.
STALE_LOOK = 0.25
# The spaced interval of stale-marking is jittered by this much either way.
STALE_JITTER = 0.5


class StaleMarking:
    """Peers silent past stale_after are marked gone. Every daemon may do it, one at a
    time (the statement takes an advisory lock), and the fleet as a whole about every
    quarter of stale_after: each daemon every quarter times the number of live daemons it
    knows (`fleet`, this one included), jittered (a lone daemon every quarter), so a peer
    is noticed about that much later however large the fleet, and the looks do not grow
    with it. The first look comes at the first tick (a daemon that starts notices the
    peers that died while it was away)."""

    def __init__(
        self,
        mark_stale: Callable[[float], Sequence[tuple[str, str, int]] | None],
        stale_after: Callable[[], float],
        fleet: Callable[[], int],
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.mark_stale = mark_stale
        self.stale_after = stale_after  # read at each look: a reload may change it
        self.fleet = fleet
        self.rng = rng if rng is not None else random.Random()
        self.due_at = clock()

    def run_once(self) -> Sequence[tuple[str, str, int]] | None:
        """Mark the silent peers gone, one statement; returns them (id, host, pid),
        None when the statement failed. Each is logged."""
        gone = self.mark_stale(self.stale_after())
        for worker_id, host, pid in gone or []:
            log.warning(
                "daemon %s (host %s pid %d) stopped heartbeating: marked gone", worker_id, host, pid
            )
        return gone

    def next_deadline(self) -> float:
        return self.due_at

    def tick(self, now: float) -> None:
        if now < self.due_at:
            return
        self.due_at = now + self.spaced_interval()
        self.run_once()

    def spaced_interval(self) -> float:
        """Until this daemon looks again: a quarter of stale_after times the live daemons."""
        spread = self.rng.uniform(1.0 - STALE_JITTER, 1.0 + STALE_JITTER)
        return self.stale_after() * STALE_LOOK * max(1, self.fleet()) * spread


# The fleet as a whole rolls up ended attempts for the charts about this often (seconds):
# each daemon every ROLLUP_LOOK times the live daemons it knows, jittered like the expiry
# sweep; a step that leaves attempts due behind it is followed by the next after
# BATCH_PAUSE.
ROLLUP_LOOK = 20.0
ROLLUP_JITTER = 0.5


class RollupSweep:
    """The charts' rollup (attempt_rollups_advance): ended attempts counted per handler
    and minute or hour, so the dashboard's charts read a bounded number of rows however
    many jobs there are. Every daemon may step it, one at a time (the statement skips
    the cursor row another holds), the fleet as a whole about every ROLLUP_LOOK
    seconds; a step with more due behind it (a backlog, or a burst over its bound) is
    followed by the next after BATCH_PAUSE."""

    def __init__(
        self,
        advance: Callable[[], RollupStep | None],
        fleet: Callable[[], int],
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.advance = advance
        self.fleet = fleet
        self.rng = rng if rng is not None else random.Random()
        self.due_at = clock() + self.rng.uniform(0.0, ROLLUP_LOOK)

    def next_deadline(self) -> float:
        return self.due_at

    def tick(self, now: float) -> None:
        if now < self.due_at:
            return
        step = self.advance()
        if step is not None and step.behind:
            self.due_at = now + BATCH_PAUSE
        else:
            spread = self.rng.uniform(1.0 - ROLLUP_JITTER, 1.0 + ROLLUP_JITTER)
            self.due_at = now + ROLLUP_LOOK * max(1, self.fleet()) * spread


def prune_to_end(
    conn: psycopg.Connection,
    config: RetentionConfig,
    schema: str,
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> Pruned:
    """What `pgworkerd prune` runs: this component to the end at once, each batch its own
    short transaction on the caller's autocommit connection."""
    return Retention(config, lambda c: prune_batch(conn, c, schema)).run_to_end(sleep=sleep)
