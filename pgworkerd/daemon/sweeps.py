"""The daemon's sweeps: one statement that moves at most a batch of jobs from one state to
the next when their time has come, on a jittered cadence, one component for each:

- `EXPIRY`: jobs past their expires_at end as cancelled (job_expired_cancel), served by a
  daemon or not (a claim also ends any it meets first). Every daemon may do it (rows
  another holds are skipped), spaced across the fleet like stale-marking
  (daemon/retention.py): each daemon every `look` times the live daemons it knows, so the
  fleet as a whole looks about every `look`, whatever its size.
- `WAIT_TIMEOUTS`: suspended jobs past their wait's timeout become pending again, their
  next attempt seeing no signal (job_waits_expire: rows a signal holds skipped, the peers
  that serve the jobs woken; WaitFor, migration 0028). Each daemon looks every `look` on
  its own, so a wait ends at most about `look * (1 + jitter)` seconds after its timeout
  with one daemon running, sooner with more. A signal needs no sweep: it makes the job
  pending itself, at once.

A full batch means more are due: the next one follows after `batch_pause`. A failed
statement (None) is logged by the link and tried again on the next look, never at once.
Maintenance has the one shape of the daemon's components (daemon/retention.py):
`run_once()` returning what it did, `tick`/`next_deadline` around it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("pgworkerd")


@dataclass(frozen=True)
class SweepCadence:
    """How often a sweep looks, how much one statement moves, and what its log line says."""

    look: float  # seconds between two looks (times the live daemons when fleet-spaced)
    jitter: float  # each gap is look * uniform(1 - jitter, 1 + jitter)
    batch: int  # jobs per statement (of each kind the statement moves)
    batch_pause: float  # after a full batch, the next this soon
    fleet_spaced: bool  # the fleet as a whole looks every `look` (else each daemon does)
    done: str  # the log line when it moved some: one %d, how many


EXPIRY = SweepCadence(
    look=5.0,
    jitter=0.5,
    batch=1000,
    batch_pause=0.2,
    fleet_spaced=True,
    done="expiry: %d job(s) past their expires_at ended as cancelled",
)

WAIT_TIMEOUTS = SweepCadence(
    look=5.0,
    jitter=0.5,
    batch=1000,
    batch_pause=0.2,
    fleet_spaced=False,
    done="waits: %d suspended job(s) timed out and are pending again",
)


class Sweep:
    def __init__(
        self,
        cadence: SweepCadence,
        sweep: Callable[[int], int | None],
        fleet: Callable[[], int],
        *,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.cadence = cadence
        self.sweep = sweep  # one statement of at most this many jobs (None: it failed)
        self.fleet = fleet  # the live daemons this one knows (itself included)
        self.rng = rng if rng is not None else random.Random()
        # a random first look: daemons started together do not look together
        self.due_at = clock() + self.rng.uniform(0.0, cadence.look)

    def run_once(self) -> int | None:
        """One statement: how many jobs it moved (None: it failed)."""
        moved = self.sweep(self.cadence.batch)
        if moved:
            log.info(self.cadence.done, moved)
        return moved

    def next_deadline(self) -> float:
        return self.due_at

    def tick(self, now: float) -> None:
        if now < self.due_at:
            return
        moved = self.run_once()
        if moved is not None and moved >= self.cadence.batch:
            self.due_at = now + self.cadence.batch_pause
        else:
            self.due_at = now + self.spaced_interval()

    def spaced_interval(self) -> float:
        """Until this daemon looks again: `look` (times the live daemons when fleet-spaced),
        jittered."""
        cadence = self.cadence
        spread = self.rng.uniform(1.0 - cadence.jitter, 1.0 + cadence.jitter)
        daemons = max(1, self.fleet()) if cadence.fleet_spaced else 1
        return cadence.look * daemons * spread
