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

from pgworkerd import client
from pgworkerd.cli.schedules import next_run as cli_next_run
from pgworkerd.queue import schedules as schedule_statements


def next_run(definition: Any, now: datetime | None = None) -> datetime | None:
    """The schedule's next tick after now, as `pgworkerd schedules` computes it; None when
    its definition makes no cadence."""
    return cli_next_run(definition, now or datetime.now(UTC))


class CannotTrigger(ValueError):
    """The schedule is unknown, or its definition makes no job (the message says why)."""


def trigger(conn: psycopg.Connection[Any], schema: str, name: str) -> int:
    """Enqueue the job of schedule `name` now (its handler, payload, queue, priority and
    max_attempts as declared); returns the job's id."""
    found = [s for s in schedule_statements.list_all(conn, schema) if s["name"] == name]
    if not found:
        raise CannotTrigger(f"no schedule {name!r}")
    definition = found[0]["definition"]
    if not isinstance(definition, dict) or not isinstance(definition.get("handler"), str):
        raise CannotTrigger(f"schedule {name!r} names no handler")
    payload = definition.get("payload") or {}
    options: dict[str, Any] = {}
    for key in ("queue", "priority", "max_attempts"):
        if definition.get(key) is not None:
            options[key] = definition[key]
    try:
        return client.enqueue(conn, definition["handler"], payload, schema=schema, **options)
    except (ValueError, TypeError) as exc:  # the client's checks of a hostile definition
        raise CannotTrigger(f"schedule {name!r} makes no job: {exc}") from None
