"""The fleet's own retention: finished jobs (completed, cancelled, dead) older than the
configured retention ([retention]) are deleted, with their history, by the daemons
themselves — no cron job to forget; so are old schedule runs and the registry rows of
daemons gone long ago (each kind bounded by `batch` rows per call).

Maintenance has one shape here: the config dataclass (config.RetentionConfig),
`run_once()` (one batch, one statement; returns what it did) and a thin loop around it
(`tick`/`next_deadline`, like every component of the parent).

- One daemon at a time: the statement takes a transaction-level advisory lock and
  returns at once without deleting when another daemon holds it.
- Small batches (`batch` rows, each its own short transaction: row locks never held
  long, rows locked by anyone else skipped), one after another with a short pause while
  full batches come back, so a backlog drains without holding up this daemon's loop.
- No idle load to speak of: with nothing to delete, each daemon looks again after
  `interval` times the number of live daemons (from the same statement), jittered, so
  the fleet as a whole sends about one statement per `interval`, whatever its size.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from pgworkerd.config import RetentionConfig
from pgworkerd.queue.retention import PruneResult

log = logging.getLogger("pgworkerd")

# Between two full batches: the loop's other work (renewals, dispatch) goes first.
BATCH_PAUSE = 0.2
# Jitter of the spaced interval: a fleet started at once does not look at once.
JITTER = 0.5


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
        # rows deleted by the consecutive batches of this run: jobs, schedule runs, daemons
        self.deleted_in_run = self.runs_deleted_in_run = self.daemons_deleted_in_run = 0
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

    def next_deadline(self) -> float | None:
        return self.due_at if self.config.enabled else None

    def tick(self, now: float) -> None:
        if not self.config.enabled or now < self.due_at:
            return
        result = self.run_once()
        if result is not None:
            self.live_daemons = max(1, result.live_daemons)
        if result is not None and result.deleted is not None:
            self.deleted_in_run += result.deleted
            self.runs_deleted_in_run += result.schedule_runs_deleted or 0
            self.daemons_deleted_in_run += result.daemons_deleted or 0
            if result.most() >= self.config.batch:
                self.due_at = now + BATCH_PAUSE  # more to do: the next batch soon
                return
            self.log_run()
        self.deleted_in_run = self.runs_deleted_in_run = self.daemons_deleted_in_run = 0
        self.due_at = now + self.spaced_interval()

    def log_run(self) -> None:
        """One line for the run's consecutive batches, naming what they deleted."""
        if self.deleted_in_run:
            log.info(
                "retention: deleted %d finished job(s) past their retention",
                self.deleted_in_run,
            )
        if self.runs_deleted_in_run or self.daemons_deleted_in_run:
            log.info(
                "retention: deleted %d schedule run(s) and %d gone daemon(s) from the registry",
                self.runs_deleted_in_run,
                self.daemons_deleted_in_run,
            )

    def spaced_interval(self) -> float:
        """Until this daemon looks again: the fleet's interval times its live daemons."""
        spread = self.rng.uniform(1.0 - JITTER, 1.0 + JITTER)
        return self.config.interval * self.live_daemons * spread
