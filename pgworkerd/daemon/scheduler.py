"""Periodic jobs: fires the ticks of the schedules this daemon's config declares.

Any number of daemons may declare one schedule; each fires every tick it sees, and the
database keeps exactly one: schedule_fire records (schedule, tick) and enqueues the job in
one transaction, and a daemon that comes second finds the tick taken (migration
"schedules"). So there is no leader to elect or lose: a tick is fired as long as one
daemon that declares it is up.

The schedules are declared (definition upserted, and the tick up to which they are
handled read back) at start and after every reconnect: what other daemons fired while
this one was cut off is not fired again, and what nobody fired is caught up by the
schedule's catch_up policy (pgworkerd.cadence.to_fire), never in a burst. A failed fire
is logged and tried again on a later turn; it never stops the daemon.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from pgworkerd.cadence import Cadence, to_fire
from pgworkerd.config import Config, ScheduleConfig
from pgworkerd.queue.schedules import Fired

log = logging.getLogger("pgworkerd")

# After a fire or declare failed while the database answers (a bad job, a timeout).
RETRY_AFTER_ERROR = 5.0
TICK_SLACK = 0.005
# The longest the Scheduler sleeps before reading the wall clock again (no database work
# unless a tick is due): the monotonic clock it sleeps on stands still while the host is
# suspended, and the wall clock may be stepped, so a tick hours away is not waited for
# blindly. Well within a tick's grace (cadence.MAX_GRACE), so such a tick is still on time.
MAX_SLEEP = 30.0


class ScheduleStatements(Protocol):
    """The database calls the scheduler makes (daemon.statements.Statements; None: the
    call failed)."""

    @property
    def ok(self) -> bool: ...

    def declare_schedule(self, name: str, definition: dict[str, Any]) -> datetime | None: ...

    def set_declared_schedules(self, names: Sequence[str]) -> bool | None: ...

    def fire_schedule(self, name: str, tick: datetime) -> Fired | None: ...


class Scheduler:
    def __init__(
        self,
        config: Config,
        statements: ScheduleStatements,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        # Ticks are wall-clock times; the loop's `now` (monotonic) only says when to look.
        self.statements = statements
        self.wall_clock = wall_clock
        self.schedules: dict[str, ScheduleConfig] = {}
        self.cadences: dict[str, Cadence] = {}
        self.handled_until: dict[str, datetime] = {}  # every tick up to it was handled
        self.declared = True  # nothing to declare yet
        self.ready: set[str] = set()  # the schedules declared as configured: fired
        self.due_at = 0.0  # monotonic
        self.configure(config)

    def configure(self, config: Config) -> None:
        """At start and on reload: a schedule left out of the config stops firing here."""
        if config.schedules == self.schedules:
            return
        self.schedules = dict(config.schedules)
        self.cadences = {n: Cadence(s.definition()) for n, s in self.schedules.items()}
        self.handled_until = {n: t for n, t in self.handled_until.items() if n in self.schedules}
        self.redeclare()

    def redeclare(self) -> None:
        """After a reconnect: declare again, and learn what others fired meanwhile."""
        self.declared = False
        self.due_at = 0.0

    def next_deadline(self) -> float | None:
        if self.declared and not self.schedules:
            return None
        return self.due_at if self.statements.ok else None

    def tick(self, now: float) -> None:
        if not self.statements.ok or now < self.due_at:
            return
        if not self.declared and not self._declare():
            self.due_at = now + RETRY_AFTER_ERROR
            return
        wall = datetime.fromtimestamp(self.wall_clock(), UTC)
        failed = not self.declared  # one is not declared yet: declare again soon
        for name, schedule in self.schedules.items():
            if name in self.ready and not self._fire_due(name, schedule, wall):
                failed = True
        self.due_at = now + RETRY_AFTER_ERROR if failed else self._next_due(now, wall)

    def _declare(self) -> bool:
        """Declare every schedule (or, for the daemon role, check that an operator
        declared it as configured: schema 22); False when none could be. One that could
        not (logged: not declared by an operator, declared otherwise, a failure) is left
        out and tried again later, and the others fire meanwhile."""
        self.ready = set()
        for name, schedule in self.schedules.items():
            handled = self.statements.declare_schedule(name, schedule.definition())
            if handled is None:
                continue
            known = self.handled_until.get(name)
            self.handled_until[name] = handled if known is None else max(known, handled)
            self.ready.add(name)
        if self.schedules and not self.ready:
            return False
        if self.statements.set_declared_schedules(sorted(self.ready)) is None:
            return False
        self.declared = self.ready == set(self.schedules)
        return True

    def _fire_due(self, name: str, schedule: ScheduleConfig, wall: datetime) -> bool:
        """Fire what is due of one schedule; False when a fire failed (tried again)."""
        ticks, latest = to_fire(
            self.cadences[name], self.handled_until[name], wall, schedule.catch_up
        )
        for tick in ticks:
            fired = self.statements.fire_schedule(name, tick)
            if fired is None:
                return False
            self.handled_until[name] = tick
            if fired.outcome == "fired":
                log.info(
                    "schedule %s: tick %s enqueued job %s", name, tick.isoformat(), fired.job_id
                )
            elif fired.outcome == "skipped":
                log.info(
                    "schedule %s: tick %s skipped (overlap %s: job %s not finished)",
                    name,
                    tick.isoformat(),
                    schedule.overlap,
                    fired.job_id,
                )
        if latest is not None and latest > self.handled_until[name]:
            log.info(
                "schedule %s: missed tick %s not fired (catch_up = none)", name, latest.isoformat()
            )
            self.handled_until[name] = latest
        return True

    def _next_due(self, now: float, wall: datetime) -> float:
        """The monotonic time of the earliest next tick of any schedule."""
        waits = []
        for name, cadence in self.cadences.items():
            following = cadence.next_after(max(self.handled_until[name], wall))
            if following is not None:
                waits.append((following - wall).total_seconds())
        # a little late rather than early: the wall clock and the monotonic one drift apart
        wait = min(waits, default=MAX_SLEEP)
        if wait > MAX_SLEEP:
            return now + MAX_SLEEP  # only a look at the wall clock
        return now + max(0.0, wait) + TICK_SLACK
