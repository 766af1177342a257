"""The Schedules page's next run (the one `pgworkerd schedules` prints), and "trigger
now": enqueue the job a schedule's tick would, at once, as the operator (the schedule's
own ticks are unchanged; nothing is recorded in schedule_runs, so its catch-up and
overlap are not affected).

A definition is as the database stored it (a daemon declared it; anyone with the owner's
rights could have written it): anything that does not make a cadence or a job is shown
as "-" or refused with the reason, never raised."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from pgworkerd.cadence import Cadence
from pgworkerd.queue.queries import query


def next_run(definition: Any, now: datetime | None = None) -> datetime | None:
    """The schedule's next tick after now (as `pgworkerd schedules` prints it); None when
    its definition makes no cadence."""
    try:
        return Cadence(definition).next_after(now or datetime.now(UTC))
    except Exception:  # a definition this version cannot read is shown as "-", not fatal
        return None


class CannotTrigger(ValueError):
    """The schedule is unknown, or its definition makes no job (the message says why)."""


def trigger(conn: psycopg.Connection[Any], schema: str, name: str) -> int:
    """Enqueue the job of schedule `name` now (statement schedule_trigger); its id."""
    try:
        with conn.transaction():
            row = conn.execute(query("schedule_trigger", schema), {"name": name}).fetchone()
    except (psycopg.errors.InvalidParameterValue, psycopg.errors.DataException) as exc:
        first = str(exc).strip().splitlines()[0].removeprefix("pgworkerd: ")
        raise CannotTrigger(f"schedule {name!r} makes no job: {first}") from None
    if row is None:
        raise CannotTrigger(f"no schedule {name!r}")
    return int(row[0])
