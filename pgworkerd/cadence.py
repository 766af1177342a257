"""When a schedule ticks: cron expressions in a time zone, or fixed intervals.

Cron times come from cronsim (https://github.com/cuu508/cronsim): a small library with no
dependencies, written for healthchecks.io, that follows Debian cron on daylight saving
time: in the zone's spring-forward gap a job at a wall time that does not exist runs when
the clocks jump (02:30 -> 03:00), and in the autumn overlap it runs once, at the first of
the two times (fold=0). Expressions that name every hour or minute (`*/15 * * * *`)
follow the UTC instants instead, as cron does. An interval (`every`) ticks on multiples
of its length since the Unix epoch, so every host computes the same ticks, whenever it
started.

A tick is identified by its instant (UTC): `(schedule, tick)` is unique in the database.
This module has no database and no psycopg: the daemon's Scheduler and the CLI share it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

# A tick counts as on time until the next one is due, and at most this long: a tick
# reached later is missed, and the schedule's catch_up policy decides about it.
MAX_GRACE = 60.0
# Short schedules get at least this much slack for a loaded host's late loop turn.
MIN_GRACE = 2.0


def cron_problem(expr: str) -> str | None:
    """Why cronsim refuses `expr` (5 fields, or 6 with seconds first), or None."""
    try:
        it = CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
        next(it)
    except CronSimError as exc:
        return str(exc)
    except StopIteration:
        return "it never matches"
    except (ValueError, OverflowError) as exc:  # cronsim parses numbers with int()
        return str(exc)
    return None


def zone_problem(name: str) -> str | None:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return f"unknown time zone {name!r} (an IANA name such as 'Europe/Berlin' or 'UTC')"
    return None


class Cadence:
    """The ticks of one schedule definition (as ScheduleConfig.definition() gives it, or
    as the database stored it)."""

    def __init__(self, definition: Mapping[str, Any]) -> None:
        every = definition.get("every")
        self.every = float(every) if every else None
        self.cron = str(definition.get("cron") or "")
        self.zone = ZoneInfo(str(definition.get("timezone") or "UTC"))
        if self.every is None and not self.cron:
            raise ValueError("a schedule needs cron or every")

    def previous(self, at: datetime) -> datetime | None:
        """The latest tick at or before `at`."""
        if self.every is not None:
            seconds = math.floor(at.timestamp() / self.every) * self.every
            return datetime.fromtimestamp(seconds, UTC)
        # cronsim's reverse walk starts strictly before a whole second: step past `at`
        start = at.astimezone(self.zone).replace(microsecond=0) + timedelta(seconds=1)
        try:
            return next(CronSim(self.cron, start, reverse=True)).astimezone(UTC)
        except StopIteration:
            return None

    def next_after(self, after: datetime) -> datetime | None:
        """The first tick strictly after `after`."""
        if self.every is not None:
            seconds = (math.floor(after.timestamp() / self.every) + 1) * self.every
            return datetime.fromtimestamp(seconds, UTC)
        start = after.astimezone(self.zone).replace(microsecond=0)
        try:
            tick = next(CronSim(self.cron, start)).astimezone(UTC)
        except StopIteration:
            return None
        return tick if tick > after else self.next_after(tick)

    def due(self, after: datetime, until: datetime) -> list[datetime]:
        """The ticks in (after, until], oldest first (callers keep the span short)."""
        if self.every is not None:
            first = math.floor(after.timestamp() / self.every) + 1
            last = math.floor(until.timestamp() / self.every)
            return [datetime.fromtimestamp(n * self.every, UTC) for n in range(first, last + 1)]
        ticks: list[datetime] = []
        tick = self.next_after(after)
        while tick is not None and tick <= until:
            ticks.append(tick)
            tick = self.next_after(tick)
        return ticks

    def grace(self, tick: datetime) -> float:
        """How long after `tick` it still counts as on time."""
        following = self.next_after(tick)
        spacing = (following - tick).total_seconds() if following else MAX_GRACE
        return min(MAX_GRACE, max(MIN_GRACE, spacing))


def to_fire(
    cadence: Cadence, after: datetime, now: datetime, catch_up: str
) -> tuple[list[datetime], datetime | None]:
    """The ticks to fire now, given that every tick up to `after` was handled, and the
    latest due tick (handled once these are fired; None: nothing is due).

    On time (each due tick still within its grace): all of them, oldest first (more than
    one only when a loop turn came late). Otherwise ticks were missed (the whole fleet was
    down, or this daemon could not reach the database): "last" fires the most recent due
    tick, once; "none" fires it only if it is still on time. Never a burst.
    """
    first = cadence.next_after(after)
    if first is None or first > now:
        return [], None

    def on_time(tick: datetime) -> bool:
        return (now - tick).total_seconds() <= cadence.grace(tick)

    if on_time(first):
        # within the grace of the first, so a short walk (at most 60 s of ticks)
        due = cadence.due(after, now)
        return due, due[-1]
    # missed: only the latest due tick matters, however long the outage
    latest = cadence.previous(now) or first
    if catch_up == "last" or on_time(latest):
        return [latest], latest
    return [], latest
