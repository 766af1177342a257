"""Admission by measured memory ([worker] memory_budget; docs/guide/memory-admission.md):
before each claim, how many more jobs of each handler fit in this host's budget.

A job of a handler is expected to use that handler's recent peak: the PERCENTILE of the
peak memory (the whole process tree's, as the daemon measures every attempt) of its
newest HISTORY measured attempts, read from the attempt history every REFRESH seconds.
Fewer than MIN_HISTORY measured attempts: its `memory_estimate`, else its memory limit
(the config refuses a budget without one of them). Whatever it comes from, an expectation
is at least FLOOR (a tiny handler must not be admitted by the thousand) and at most the
handler's memory limit (a job over it is stopped anyway).

The room is the budget minus what the jobs running here are expected to use (each its
handler's expectation); a handler may claim room // its expectation more jobs, within its
slots. One claim can take jobs of several handlers, so the whole claim is also capped at
room // the largest expectation among the handlers it may claim for: what it takes always
fits. A freed slot asks for a claim again (the claimer), so the rest follows.

A job larger than any host (its measured peak above the budget, which the config cannot
see coming): it is admitted only on an idle host, alone, with a warning: it would not fit
better anywhere, and refusing it everywhere would leave it pending for ever.

Visible (state()): the daemon publishes, per handler, its expectation, how it was formed,
the budget and what is free, in its registry row (so `explain` can say a job waits for
memory, or is larger than every host's budget), and exports them as metrics with the
slots admission refused each handler at the last claim.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pgworkerd.config import Config
from pgworkerd.config.checks import size_text
from pgworkerd.queue.attempts import MemoryPeak

log = logging.getLogger("pgworkerd")

PERCENTILE = 0.95
HISTORY = 50  # measured attempts per handler, newest first
HISTORY_JOBS = 200  # newest completed (and as many dead) jobs of a handler searched
MIN_HISTORY = 5  # fewer measured attempts: the configured estimate
FLOOR = 16 << 20  # bytes: an expectation is never below this
REFRESH = 60.0  # seconds between two reads of the history


@dataclass(frozen=True)
class HandlerMemory:
    expected: int  # bytes one job is expected to use
    source: str  # how that was formed
    refused_slots: int  # free slots admission did not offer it at the last claim


@dataclass(frozen=True)
class MemoryState:
    budget: int  # [worker] memory_budget, bytes
    held: int  # what the jobs running here are expected to use, bytes
    handlers: dict[str, HandlerMemory]

    def published(self) -> dict[str, dict[str, Any]]:
        """Per handler, what the registry row carries (handler_settings[h]["memory"])."""
        free = max(0, self.budget - self.held)
        return {
            name: {"expected": h.expected, "from": h.source, "budget": self.budget, "free": free}
            for name, h in self.handlers.items()
        }


# One read of the history: per handler, its recent peak (None: the read failed).
ReadPeaks = Callable[[list[str]], Mapping[str, MemoryPeak] | None]


class MemoryAdmission:
    def __init__(
        self,
        config: Config,
        read_peaks: ReadPeaks,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.read_peaks = read_peaks
        self.clock = clock
        self.peaks: dict[str, MemoryPeak] = {}
        self.refresh_at = 0.0  # read at the first tick
        self.warned: set[str] = set()  # handlers warned about as larger than the budget
        self.refused: dict[str, int] = {}  # per handler: slots refused at the last claim
        self.configure(config)

    def configure(self, config: Config) -> None:
        """After a reload: the budget and the handlers' estimates and limits."""
        self.config = config
        self.budget = config.worker.memory_budget
        self.refresh_at = 0.0

    @property
    def enabled(self) -> bool:
        return self.budget is not None

    def tick(self, now: float) -> None:
        if not self.enabled or now < self.refresh_at or not self.config.handlers:
            return
        self.refresh_at = now + REFRESH
        peaks = self.read_peaks(sorted(self.config.handlers))
        if peaks is not None:
            self.peaks = dict(peaks)

    def next_deadline(self) -> float | None:
        return self.refresh_at if self.enabled else None

    def expected(self, handler: str) -> int:
        """What one job of `handler` is expected to use, in bytes."""
        return self.estimate(handler)[0]

    def estimate(self, handler: str) -> tuple[int, str]:
        """What one job of `handler` is expected to use, in bytes, and how that was formed
        (for `explain`, the registry and the log)."""
        h = self.config.handlers.get(handler)
        limit = None
        configured = None
        if h is not None:
            limit = h.memory_limit or self.config.worker.memory_limit
            configured = h.memory_estimate or limit
        measured = self.peaks.get(handler)
        if measured is not None and measured.peak is not None and measured.attempts >= MIN_HISTORY:
            value = measured.peak
            source = (
                f"the {PERCENTILE:.0%} percentile of the peaks of its last {measured.attempts}"
                " measured attempts"
            )
        elif configured is not None:
            value = configured
            have = 0 if measured is None else measured.attempts
            named = "memory_estimate" if h is not None and h.memory_estimate else "memory_limit"
            source = f"its {named} (fewer than {MIN_HISTORY} measured attempts: {have})"
        else:  # not a handler of this config (a job of an older one): as large as allowed
            value = self.budget or FLOOR
            source = "the whole budget (not a handler of this daemon's config)"
        if limit is not None and value > limit:
            value = limit
            source += f", capped at its memory_limit {size_text(limit)}"
        if value < FLOOR:
            value = FLOOR
            source += f", raised to the floor {size_text(FLOOR)}"
        return value, source

    def room(self, running: Mapping[str, int]) -> int:
        """The budget minus what the jobs running here are expected to use (bytes)."""
        assert self.budget is not None
        return self.budget - sum(n * self.expected(h) for h, n in running.items())

    def admits(self, handler: str, running: Mapping[str, int]) -> int:
        """How many more jobs of `handler` fit (a job larger than the budget: one, on an
        idle host only)."""
        if self.budget is None:
            return 1 << 30
        each = self.expected(handler)
        fits = max(self.room(running), 0) // each
        if fits == 0 and not any(running.values()) and each > self.budget:
            if handler not in self.warned:
                self.warned.add(handler)
                log.warning(
                    "handler %s: its jobs are expected to use %s (their recent peak), more "
                    "than [worker] memory_budget %s: one runs here only alone, on an idle host",
                    handler,
                    size_text(each),
                    size_text(self.budget),
                )
            return 1
        return fits

    def offer(self, handler: str, free: int, running: Mapping[str, int]) -> int:
        """How many of `free` slots the claim offers `handler` (admits(), at most `free`);
        what admission refused is kept for the metrics (refused_slots)."""
        fits = min(free, self.admits(handler, running))
        self.refused[handler] = max(0, free - fits)
        return fits

    def state(self, running: Mapping[str, int]) -> MemoryState | None:
        """The budget, what the jobs running here are expected to hold, and per handler
        of the config its expectation, how it was formed and the slots refused at the
        last claim; None without a budget."""
        if self.budget is None:
            return None
        held = self.budget - self.room(running)
        handlers = {}
        for name in self.config.handlers:
            each, source = self.estimate(name)
            handlers[name] = HandlerMemory(each, source, self.refused.get(name, 0))
        return MemoryState(self.budget, held, handlers)

    def claim_cap(self, handlers: list[str], running: Mapping[str, int]) -> int:
        """At most this many jobs in one claim for `handlers` (those it may claim for), so
        that whatever mix it takes fits: room // the largest expectation among them."""
        if self.budget is None or not handlers:
            return 1 << 30
        largest = max(self.expected(h) for h in handlers)
        fits = max(self.room(running), 0) // largest
        if fits == 0 and not any(running.values()):
            return 1  # an idle host takes one job, whatever its size
        return fits
