"""Schema migrations: numbered SQL files applied in order under an advisory lock."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from pgworkerd.queue.db import connect
from pgworkerd.queue.queries import DEFAULT_SCHEMA, check_schema_name, query, render

_MIGRATION_RE = re.compile(r"^(\d{4})_(\w+)\.sql$")


class SchemaError(RuntimeError):
    """The database schema is missing, older or newer than this code."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration shipped with this version, in order."""
    found = []
    for entry in resources.files("pgworkerd.queue").joinpath("sql/migrations").iterdir():
        match = _MIGRATION_RE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise SchemaError(f"migrations are not numbered 1..n without gaps: {versions}")
    return found


def latest_version() -> int:
    return migrations()[-1].version


def _lock_key(schema: str) -> str:
    return f"pgworkerd.queue.migrate:{schema}"


def _applied(conn: psycopg.Connection, schema: str) -> int | None:
    """Highest applied version, or None when the schema or its version table is absent."""
    row = conn.execute(query("schema_version_table_exists", schema)).fetchone()
    if not row or not row[0]:
        return None
    found = conn.execute(query("schema_version_get", schema)).fetchone()
    return int(found[0]) if found else 0


def migrate_conn(conn: psycopg.Connection, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Apply the missing migrations in one transaction; returns the versions applied.

    Several hosts may run this at once: the advisory lock makes them queue, and each
    re-reads the version under the lock, so every migration runs exactly once.
    """
    check_schema_name(schema)
    known = latest_version()
    applied_now: list[int] = []
    with conn.transaction():
        conn.execute(query("schema_migrate_lock", schema), {"key": _lock_key(schema)})
        current = _applied(conn, schema)
        if current is None:
            conn.execute(query("schema_create", schema))
            conn.execute(query("schema_version_create", schema))
            current = 0
        if current > known:
            raise SchemaError(_newer_message(schema, current, known))
        for migration in migrations():
            if migration.version <= current:
                continue
            conn.execute(render(migration.sql, schema))
            conn.execute(
                query("schema_version_insert", schema),
                {"version": migration.version, "name": migration.name},
            )
            applied_now.append(migration.version)
    return applied_now


def migrate(dsn: str, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Connect to `dsn` and bring `schema` up to date."""
    with connect(dsn) as conn:
        return migrate_conn(conn, schema)


def _newer_message(schema: str, current: int, known: int) -> str:
    return (
        f"schema {schema!r} is at version {current}, newer than this pgworkerd knows "
        f"({known}): upgrade pgworkerd on this host"
    )


def check_current(conn: psycopg.Connection, schema: str = DEFAULT_SCHEMA) -> int:
    """Refuse to run against a schema that is missing, older or newer than this code."""
    current = _applied(conn, schema)
    known = latest_version()
    if current is None:
        raise SchemaError(
            f"schema {schema!r} does not exist in this database: run `pgworkerd migrate`"
        )
    if current < known:
        raise SchemaError(
            f"schema {schema!r} is at version {current}, older than this pgworkerd "
            f"expects ({known}): run `pgworkerd migrate`"
        )
    if current > known:
        raise SchemaError(_newer_message(schema, current, known))
    return current
