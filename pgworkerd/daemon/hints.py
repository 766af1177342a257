"""What a notification on the wake channel may make this daemon do, and how often.

Any role that can connect to the database may NOTIFY any channel: no grant is needed,
not even USAGE on the schema. So a notification is a hint, never authority, and each
kind may cause at most this (whatever its payload says, however many arrive):

- new jobs, a forwarded wake-up, a plain wake-up, a rescue hint: a claim, coalesced with
  every other notification's into at most one per NOTIFY_CLAIM_INTERVAL (claimer.py). A
  wake-up this daemon is chosen for but cannot take is handed on at most FORWARD_RATE
  times a second (claimer.py); a rescue hint's claim comes when the hint says the lease
  runs out, through the same coalescing;
- a peer up or down: an early read of the registry, at most one per HINTED_REFRESH (and
  less often in a larger fleet: presence.py). The peers are the registry's live rows,
  which only the daemon role writes; a notification never adds or removes one, so the
  poll stretch and the refresh period, computed from the peers, cannot be inflated;
- a drain request: an early heartbeat (which reads drain_requested from the registry),
  at most one a second, as any change of state (presence.py).

Decoding costs ~5 µs a notification; beyond PARSE_RATE a second (a flood: the fleet's
own traffic is one notification per enqueueing statement and handler) the rest are not
decoded and become one plain wake-up per batch, and the daemon logs, at most once per
FLOOD_LOG_EVERY, how many it did not decode. What is left is receiving them (psycopg's
share), which costs the daemon no more than sending them costs the sender.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from pgworkerd.daemon.peers import parse

if TYPE_CHECKING:
    from pgworkerd.daemon.claimer import Claimer

log = logging.getLogger("pgworkerd")

# Notifications decoded per second, in the long run, and in one burst.
PARSE_RATE = 2000.0
PARSE_BURST = 5000.0
FLOOD_LOG_EVERY = 60.0


class RateLimit:
    """A token bucket: `allow()` is true at most `rate` times a second in the long run,
    and `burst` times in a row."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = burst
        self.at = clock()

    def allow(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class WakeHints:
    """Hands each notification to what may act on it, within the bounds above."""

    def __init__(
        self,
        claimer: Claimer,
        peers_changed: Callable[[float], None],
        drain_hinted: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.claimer = claimer
        self.peers_changed = peers_changed  # a rate-limited registry read (Presence)
        self.drain_hinted = drain_hinted  # an early heartbeat, at most one a second
        self.clock = clock
        self.parsing = RateLimit(PARSE_RATE, PARSE_BURST, clock)
        self.undecoded = 0  # not decoded since the last flood warning
        self.flood_logged_at = clock() - FLOOD_LOG_EVERY

    def receive(self, notifications: Iterable[tuple[bool, str]], now: float) -> None:
        """(on this daemon's own channel, payload) each: a wake-up on its own channel is
        one workers_wake aimed at it (still a hint: any role may NOTIFY there too)."""
        undecoded = 0
        for own, payload in notifications:
            if not self.parsing.allow():
                undecoded += 1
                continue
            wake = parse(payload)
            if wake.kind == "jobs":
                self.claimer.woken(wake, now, aimed=own)
            elif wake.kind in ("up", "down"):
                self.peers_changed(now)
            elif wake.kind == "drain":
                self.drain_hinted()
            elif wake.kind == "rescue":
                self.claimer.rescue_hinted(wake, now)
            else:
                self.claimer.notified(now)
        if undecoded:
            self.claimer.notified(now)  # whatever they were: one coalesced claim
            self._flooded(undecoded, now)

    def _flooded(self, count: int, now: float) -> None:
        self.undecoded += count
        if now - self.flood_logged_at >= FLOOD_LOG_EVERY:
            log.warning(
                "wake channel flooded: %d notifications over %d a second were not decoded "
                "(each batch became one plain wake-up); any role that can connect may NOTIFY, "
                "see docs/operations/trust-boundaries.md",
                self.undecoded,
                int(PARSE_RATE),
            )
            self.undecoded, self.flood_logged_at = 0, now
