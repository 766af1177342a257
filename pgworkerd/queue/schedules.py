"""Typed wrappers for the schedule statements (periodic jobs: `schedules`,
`schedule_runs`; migration "schedules")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from pgworkerd.queue.queries import query


@dataclass(frozen=True)
class Fired:
    outcome: str  # "fired", "skipped" (overlap) or "taken" (another daemon did it)
    job_id: int | None  # the job created, or the one in the way when skipped


def declare(
    conn: psycopg.Connection, name: str, definition: dict[str, Any], worker_id: str, schema: str
) -> datetime:
    """Record this definition, or, for a role that may not declare schedules (the
    daemon role since schema 22: an operator declares them), check that an operator
    declared it so; returns the tick up to which the schedule is handled (its latest
    run, or when it was first declared). Raises InsufficientPrivilege when the role may
    not declare and the stored definition is missing or differs."""
    stored = conn.execute(query("schedule_declared", schema), {"name": name}).fetchone()
    assert stored is not None
    may_declare, stored_definition, handled_until = stored
    if not may_declare:
        if stored_definition is None:
            raise psycopg.errors.InsufficientPrivilege(
                f"schedule {name!r} is not declared, and this role may not declare it: an "
                "operator runs `pgworkerd --config FILE schedules declare`"
            )
        if stored_definition != definition:
            raise psycopg.errors.InsufficientPrivilege(
                f"schedule {name!r} is declared with another definition than this config's, "
                "and this role may not declare it: an operator runs `pgworkerd --config "
                "FILE schedules declare` (the stored one would be fired)"
            )
        result: datetime = handled_until
        return result
    row = conn.execute(
        query("schedule_declare", schema),
        {"name": name, "definition": Jsonb(definition), "worker": worker_id},
    ).fetchone()
    assert row is not None
    declared: datetime = row[0]
    return declared


def set_declared(
    conn: psycopg.Connection, worker_id: str, names: Sequence[str], schema: str, *, secret: str
) -> None:
    """Record in this daemon's registry row (its `secret`, registry.new_secret) which
    schedules it declares."""
    conn.execute(
        query("worker_schedules_set", schema),
        {"id": worker_id, "secret": secret, "schedules": list(names)},
    )


def fire(
    conn: psycopg.Connection,
    name: str,
    tick: datetime,
    worker_id: str,
    schema: str,
) -> Fired:
    """Fire one tick (its run row and its job in one transaction); the job and the
    overlap policy are the stored definition's (schema 22)."""
    with conn.transaction():
        row = conn.execute(
            query("schedule_fire", schema), {"name": name, "tick": tick, "worker": worker_id}
        ).fetchone()
    assert row is not None
    return Fired(row[0], row[1])


def list_all(conn: psycopg.Connection, schema: str) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query("schedule_list", schema)).fetchall()
