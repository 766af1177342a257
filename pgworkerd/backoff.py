"""One jittered exponential backoff for every retry loop of the daemon (reconnecting to
PostgreSQL, restarting the fork server, waiting for the database at start-up).

Why jitter: daemons that lost the same database at the same moment would otherwise
retry in lock-step, every host at once, for the whole outage. The spread is around the
nominal delay (psycopg-pool's `AttemptWithBackoff` does the same, ±10 %), also at the
cap, so a delay may exceed `maximum` by up to `jitter` of it.
"""

from __future__ import annotations

import random


class Backoff:
    """Delays initial, initial*factor, ... capped at maximum, each spread by ±jitter.

    `rng` is the random source (a seeded `random.Random` makes the delays repeatable in
    tests); by default the module's shared one.
    """

    def __init__(
        self,
        initial: float,
        maximum: float,
        *,
        factor: float = 2.0,
        jitter: float = 0.1,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < initial <= maximum:
            raise ValueError(f"backoff: need 0 < initial ({initial}) <= maximum ({maximum})")
        if factor < 1:
            raise ValueError(f"backoff: factor must be at least 1, not {factor}")
        if not 0 <= jitter < 1:
            raise ValueError(f"backoff: jitter must be in [0, 1), not {jitter}")
        self.initial, self.maximum, self.factor, self.jitter = initial, maximum, factor, jitter
        self._rng = rng if rng is not None else random.Random()
        self._nominal = initial

    @property
    def nominal(self) -> float:
        """The next delay before jitter (for messages and deadlines that need no spread)."""
        return self._nominal

    def next_delay(self) -> float:
        """The delay before the next try; each call moves one step up the schedule."""
        delay = self._nominal
        self._nominal = min(self._nominal * self.factor, self.maximum)
        if self.jitter:
            delay *= 1 + self._rng.uniform(-self.jitter, self.jitter)
        return delay

    def reset(self) -> None:
        """Back to the initial delay: the thing being retried works again."""
        self._nominal = self.initial
