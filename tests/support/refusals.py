"""Asserting what a role may not do, one way for every test of the trust boundaries
(tests/integration/test_roles.py, test_people_roles.py, test_trust_boundaries.py,
test_enqueue_bounds.py): PostgreSQL refuses with a permission error (SQLSTATE 42501,
`InsufficientPrivilege`), and a refused statement changes nothing.

Any other error is no refusal: it propagates and fails the test, so a typo in a probe
never passes for a right the role lacks."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from pgworkerd.queue.queries import query, render


def statement_text(schema: str, statement: str) -> str:
    """`query:<name>` for a named statement of sql/queries/, or SQL text (its @schema@
    placeholders rendered)."""
    if statement.startswith("query:"):
        return query(statement.removeprefix("query:"), schema)
    return render(statement, schema)


def may_run(c: psycopg.Connection, schema: str, statement: str, params: Any = None) -> bool:
    """Whether `c`'s role may run `statement` (see statement_text), in a transaction rolled
    back whatever happens: False when it is refused a right."""
    try:
        with c.transaction(force_rollback=True), c.cursor() as cur:
            cur.execute(statement_text(schema, statement), params or None)
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def runnable(c: psycopg.Connection, schema: str, statements: Iterable[str]) -> list[str]:
    """The statements `c`'s role may run, in their order (`== []` asserts every refusal)."""
    return [s for s in statements if may_run(c, schema, s)]


def queue_state(conn: psycopg.Connection, schema: str) -> tuple[Any, ...]:
    """What a refused statement must leave as it was: every job and attempt row, how many
    job logs, the schedules and the retention floor (read as the owner)."""
    row = conn.execute(
        render(
            "SELECT (SELECT jsonb_agg(j ORDER BY id) FROM @schema@.jobs j),"
            " (SELECT jsonb_agg(a ORDER BY job_id, attempt) FROM @schema@.attempts a),"
            " (SELECT count(*) FROM @schema@.job_logs),"
            " (SELECT jsonb_agg(s ORDER BY name) FROM @schema@.schedules s),"
            " (SELECT min_seconds FROM @schema@.retention_floor)",
            schema,
        )
    ).fetchone()
    assert row is not None
    return tuple(row)


@contextmanager
def refused(
    owner: psycopg.Connection, schema: str, message: str | None = None, match: str | None = None
) -> Iterator[pytest.ExceptionInfo[psycopg.errors.InsufficientPrivilege]]:
    """The block must raise a permission error and change nothing (queue_state, read on
    the owner's connection `owner`). `message`: the error's whole primary message;
    `match`: a regular expression searched in it. Yields the error for more checks."""
    before = queue_state(owner, schema)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=match) as refusal:
        yield refusal
    if message is not None:
        assert refusal.value.diag.message_primary == message
    assert queue_state(owner, schema) == before
