"""Schema migrations: numbered SQL files applied in order under an advisory lock, and the
declared schema (sql/objects/, one file per table or area) a fresh install applies instead.

A schema that does not exist yet is created from the declaration and recorded as having
every migration applied; a schema that exists is brought up to date by the migrations it
lacks. tests/integration/test_migrate.py holds the two paths dump-equal
(docs/development/sql.md).

Rolling upgrades (README "Upgrading"): a migration file may declare in its header
`-- compatible-with-code-of-schema: K`, meaning code that knows only schema K still runs
against the schema after it (an expand migration). `migrate` records it per version, and
`check_current` lets such older code run against the newer schema.

A migration that declares `-- own-transaction: yes` is committed before the next one
starts: PostgreSQL refuses to use an enum value in the transaction that added it
(ALTER TYPE ... ADD VALUE), so the migration adding one must commit before a later one
writes a CHECK, an index or a function that names it.
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from pgworkerd.queue.db import connect
from pgworkerd.queue.queries import DEFAULT_SCHEMA, check_schema_name, query, render

_MIGRATION_RE = re.compile(r"^(\d{4})_(\w+)\.sql$")
_COMPATIBLE_RE = re.compile(r"^-- compatible-with-code-of-schema: *(\d+) *$", re.MULTILINE)
_OWN_TRANSACTION_RE = re.compile(r"^-- own-transaction: *yes *$", re.MULTILINE)

log = logging.getLogger("pgworkerd")

# The declared schema, in the order a fresh install applies it: each file after those
# whose tables and types it names where PostgreSQL checks names at creation (SQL-language
# function bodies, CHECK constraints, column types, triggers). compat.sql holds what only
# older code calls.
DECLARATION = (
    "jobs",
    "job_parents",
    "enqueue",
    "enqueue_bounds",
    "handler_defaults",
    "batches",
    "workers",
    "paused",
    "fair_share",
    "claim",
    "finish",
    "follow_ups",
    "schedules",
    "attempts",
    "job_logs",
    "signals",
    "retention",
    "job_actions",
    "compat",
)


class SchemaError(RuntimeError):
    """The database schema is missing, older or newer than this code."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    # The oldest code (by the latest schema version it knows) that still runs against the
    # schema once this migration is applied: `version` itself unless the file declares less.
    compatible_with: int
    # Committed before the next migration starts (see the module's docstring).
    own_transaction: bool = False


def migrations() -> list[Migration]:
    """Every migration shipped with this version, in order."""
    return list(_shipped_migrations())


@functools.cache
def _shipped_migrations() -> tuple[Migration, ...]:
    # Read once per process: the package's files do not change under it, and every
    # migrate and every check_current (each command, each daemon start) asks.
    found = []
    for entry in resources.files("pgworkerd.queue").joinpath("sql/migrations").iterdir():
        match = _MIGRATION_RE.match(entry.name)
        if match:
            found.append(_parsed(int(match[1]), match[2], entry.read_text()))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise SchemaError(f"migrations are not numbered 1..n without gaps: {versions}")
    return tuple(found)


def _parsed(version: int, name: str, text: str) -> Migration:
    declared = _COMPATIBLE_RE.findall(text)
    if len(declared) > 1:
        raise SchemaError(f"migration {version:04d}_{name} declares its compatibility twice")
    compatible_with = int(declared[0]) if declared else version
    if not 1 <= compatible_with <= version:
        raise SchemaError(
            f"migration {version:04d}_{name}: compatible-with-code-of-schema must be from 1 "
            f"to {version}, not {compatible_with}"
        )
    own_transaction = bool(_OWN_TRANSACTION_RE.search(text))
    return Migration(version, name, text, compatible_with, own_transaction)


def declaration() -> list[tuple[str, str]]:
    """The declared schema's files as (name, text), in DECLARATION's order."""
    folder = resources.files("pgworkerd.queue").joinpath("sql/objects")
    present = sorted(e.name for e in folder.iterdir() if e.name.endswith(".sql"))
    declared = sorted(f"{name}.sql" for name in DECLARATION)
    if present != declared:
        raise SchemaError(
            f"sql/objects/ holds {present}, but DECLARATION lists {declared}: list every "
            "file once, in the order a fresh install applies them"
        )
    return [(name, folder.joinpath(f"{name}.sql").read_text()) for name in DECLARATION]


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
    """Bring `schema` up to date; returns the versions applied.

    A schema without a version table is installed from the declaration (sql/objects/) and
    every migration recorded, in one transaction; an existing one gets the migrations it
    lacks, in order, in one transaction, or in more than one when a migration must commit
    alone (`-- own-transaction: yes`). Several hosts may run this at once: the advisory
    lock makes them queue, and each re-reads the version under the lock in every
    transaction, so every migration runs exactly once.
    """
    check_schema_name(schema)
    # Inside the caller's transaction `conn.transaction()` only makes a savepoint: nothing
    # commits, and a migration could not use what an own-transaction one before it added.
    can_commit = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    applied_now: list[int] = []
    while True:
        applied, more = _migrate_step(conn, schema, can_commit)
        applied_now += applied
        if not more:
            return applied_now


def _migrate_step(
    conn: psycopg.Connection, schema: str, can_commit: bool
) -> tuple[list[int], bool]:
    """One transaction of migrate_conn: (the versions it applied, whether more remain
    because it stopped after an own-transaction migration)."""
    known = latest_version()
    applied_now: list[int] = []
    with conn.transaction():
        conn.execute(query("schema_migrate_lock", schema), {"key": _lock_key(schema)})
        current = _applied(conn, schema)
        if current is None:
            return _install_declared(conn, schema), False
        if current > known:
            if _oldest_compatible_code(conn, schema) <= known:
                return applied_now, False  # newer, and this code still runs against it
            raise SchemaError(_newer_message(schema, current, known))
        if current < known:
            _add_compatibility_column(conn, schema)
        for migration in migrations():
            if migration.version <= current:
                continue
            conn.execute(render(migration.sql, schema))
            conn.execute(
                query("schema_version_insert", schema),
                {"version": migration.version, "name": migration.name},
            )
            _record_compatibility(conn, schema, migration)
            applied_now.append(migration.version)
            if migration.own_transaction and migration.version < known:
                if not can_commit:
                    raise SchemaError(
                        f"migration {migration.version:04d}_{migration.name} must commit "
                        "before the next one: migrate outside a transaction (autocommit)"
                    )
                return applied_now, True
    return applied_now, False


def _install_declared(conn: psycopg.Connection, schema: str) -> list[int]:
    """Create `schema` from the declaration and record every migration as applied (the
    caller holds the migration lock, in a transaction)."""
    conn.execute(query("schema_create", schema))
    conn.execute(query("schema_version_create", schema))
    _add_compatibility_column(conn, schema)
    # Names the declaration binds at creation resolve in pg_catalog, never in a schema of
    # the migrating role's search_path that someone else could create in.
    conn.execute(query("schema_search_path_pin_local", schema))
    for _name, text in declaration():
        conn.execute(render(text, schema))
    # Every migration at once (executemany pipelines them: two round trips, not 2 x 29).
    shipped = migrations()
    with conn.cursor() as cur:
        cur.executemany(
            query("schema_version_insert", schema),
            [{"version": m.version, "name": m.name} for m in shipped],
        )
        cur.executemany(
            query("schema_version_set_compatibility", schema),
            [{"version": m.version, "compatible_with": m.compatible_with} for m in shipped],
        )
    return [m.version for m in shipped]


def migrate(dsn: str, schema: str = DEFAULT_SCHEMA) -> list[int]:
    """Connect to `dsn` and bring `schema` up to date."""
    with connect(dsn) as conn:
        return migrate_conn(conn, schema)


def _newer_message(schema: str, current: int, known: int) -> str:
    return (
        f"schema {schema!r} is at version {current}, newer than this pgworkerd knows "
        f"({known}): upgrade pgworkerd on this host"
    )


def _add_compatibility_column(conn: psycopg.Connection, schema: str) -> None:
    """Version tables created before 0.2.0 lack the column; NULL there means `version`."""
    conn.execute(query("schema_version_add_compatibility", schema))


def _record_compatibility(conn: psycopg.Connection, schema: str, migration: Migration) -> None:
    conn.execute(
        query("schema_version_set_compatibility", schema),
        {"version": migration.version, "compatible_with": migration.compatible_with},
    )


def _oldest_compatible_code(conn: psycopg.Connection, schema: str) -> int:
    """The oldest code (by the latest schema it knows) the database says still runs on it."""
    row = conn.execute(query("schema_version_oldest_compatible_code", schema)).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def check_current(conn: psycopg.Connection, schema: str = DEFAULT_SCHEMA) -> int:
    """Refuse to run against a schema that is missing, older than this code, or newer and
    not compatible with it; a newer compatible schema is accepted with a warning.

    Returns the database's schema version."""
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
        if _oldest_compatible_code(conn, schema) > known:
            raise SchemaError(_newer_message(schema, current, known))
        log.warning(
            "schema %r is at version %d, newer than this pgworkerd knows (%d) but compatible "
            "with it: running; upgrade pgworkerd on this host",
            schema,
            current,
            known,
        )
    return current
