"""The timeout sweep of durable waits (WaitFor, migration 0028): suspended jobs past their
timeout become pending again, their next attempt seeing no signal (job.signal None).

Every daemon runs it on its own cadence, one statement (job_waits_expire: at most
`BATCH` jobs, rows a signal holds skipped, the peers that serve the jobs woken), so a
wait ends at most about SWEEP_INTERVAL * (1 + JITTER) seconds after its timeout with
one daemon running, sooner with more (each looks on its own). A full batch means more
are due: the next one follows after BATCH_PAUSE. A signal needs no sweep: it makes the
job pending itself, at once.

Maintenance has the one shape of the daemon's components (daemon/retention.py):
`run_once()` returning what it did, `tick`/`next_deadline` around it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

log = logging.getLogger("pgworkerd")

# Seconds between two looks of one daemon (jittered by +-JITTER).
SWEEP_INTERVAL = 5.0
JITTER = 0.5
# Jobs moved per statement; a full batch is followed by the next after BATCH_PAUSE.
BATCH = 1000
BATCH_PAUSE = 0.2


class WaitTimeouts:
    def __init__(
        self,
        expire: Callable[[], int | None],
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.expire = expire  # one job_waits_expire of at most BATCH jobs (None: failed)
        self.clock = clock
        self.rng = rng if rng is not None else random.Random()
        self.due_at = clock() + self.rng.uniform(0.0, SWEEP_INTERVAL)

    def run_once(self) -> int | None:
        """One statement: how many suspended jobs became pending (None: it failed)."""
        moved = self.expire()
        if moved:
            log.info("waits: %d suspended job(s) timed out and are pending again", moved)
        return moved

    def next_deadline(self) -> float:
        return self.due_at

    def tick(self, now: float) -> None:
        if now < self.due_at:
            return
        moved = self.run_once()
        if moved is not None and moved >= BATCH:
            self.due_at = now + BATCH_PAUSE
        else:
            self.due_at = now + SWEEP_INTERVAL * self.rng.uniform(1.0 - JITTER, 1.0 + JITTER)
