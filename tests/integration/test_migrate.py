"""Migration tier: the migrations equal the declared schema (sql/objects/, what a fresh
install applies), run once, and guard the code."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.exitcodes import ExitCode
from pgworkerd.queue import migrate
from pgworkerd.queue.migrate import (
    SchemaError,
    check_current,
    latest_version,
    migrate_conn,
    migrations,
)
from pgworkerd.queue.queries import query, render

PGWORKERD = Path(sys.executable).with_name("pgworkerd")

# pg_dump lines that differ between two dumps of identical schemas: comments (names, OIDs,
# versions), session settings, and the random key of \restrict (PostgreSQL 15.14+).
_DUMP_NOISE = re.compile(r"^(--|SET |SELECT pg_catalog\.set_config|\\restrict |\\unrestrict )")


@pytest.fixture
def fresh_dbs(pg: LocalPostgres) -> Iterator[tuple[str, str]]:
    """Two databases of their own, dropped afterwards; yields their DSNs."""
    names = [f"m_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    try:
        for name in names:
            pg.create_database(name)
        yield pg.dsn(names[0]), pg.dsn(names[1])
    finally:
        with psycopg.connect(pg.dsn(), autocommit=True) as c:
            for name in names:
                c.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )


@pytest.fixture
def schema_name(test_db_dsn: str) -> Iterator[str]:
    """A schema name that does not exist yet in the test database, dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:8]}"
    yield name
    with psycopg.connect(test_db_dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def schema_dump(pg: LocalPostgres, dsn: str, schema: str) -> list[str]:
    proc = subprocess.run(
        [str(pg.bindir / "pg_dump"), "--schema-only", f"--schema={schema}", "--dbname", dsn],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [ln.rstrip() for ln in proc.stdout.splitlines() if not _DUMP_NOISE.match(ln)]
    # Blank-line runs depend on what was stripped around them; they mean nothing.
    return [ln for ln in lines if ln]


def versions(dsn: str, schema: str) -> list[tuple[int, str]]:
    with psycopg.connect(dsn) as c:
        rows = c.execute(
            sql.SQL("SELECT version, name FROM {}.schema_version ORDER BY version").format(
                sql.Identifier(schema)
            )
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def migrate_through_every_migration(dsn: str, schema: str) -> list[int]:
    """The upgrade path from nothing: a schema whose version table is empty is at version 0,
    so `migrate` applies every migration (a missing schema would get the declaration)."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(query("schema_create", schema))
        c.execute(query("schema_version_create", schema))
    return migrate.migrate(dsn, schema)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKERD_", "PG"))}
    return subprocess.run(
        [str(PGWORKERD), *args], capture_output=True, text=True, env=env, timeout=timeout
    )


# -- migrations == the declared schema (sql/objects/) --------------------------------------


def test_migrations_yield_exactly_the_declared_schema(
    pg: LocalPostgres, fresh_dbs: tuple[str, str]
) -> None:
    migrated_db, declared_db = fresh_dbs
    schema = "mig_vs_decl"
    every = [m.version for m in migrations()]
    assert migrate_through_every_migration(migrated_db, schema) == every
    assert migrate.migrate(declared_db, schema) == every  # a fresh install: the declaration

    migrated = schema_dump(pg, migrated_db, schema)
    declared = schema_dump(pg, declared_db, schema)

    # The comparison means something only if the dump shows the objects users rely on.
    text = "\n".join(migrated)
    for needle in (
        "CREATE TABLE mig_vs_decl.schema_version",
        "CREATE TYPE mig_vs_decl.job_status",
        "CREATE SEQUENCE mig_vs_decl.jobs_id_seq",
        "CREATE TABLE mig_vs_decl.jobs",
        "CREATE FUNCTION mig_vs_decl.enqueue_many(jobs jsonb)",
        "CREATE FUNCTION mig_vs_decl.enqueue(",
        "CREATE TABLE mig_vs_decl.workers",
        "CREATE INDEX jobs_pending_order_idx",
        "CONSTRAINT jobs_running_has_lease CHECK",
    ):
        assert needle in text
    assert migrated == declared, (
        "sql/objects/ does not match the migrations: update the objects' files with the new "
        "migration (docs/development/sql.md)"
    )


def test_declared_schema_records_every_migration(fresh_dbs: tuple[str, str]) -> None:
    """A database created from the declaration is current: check_current accepts it, migrate
    is a no-op, and its version rows (with their compatibility) are the migrations'."""
    migrated_db, declared_db = fresh_dbs
    schema = "decl"
    migrate_through_every_migration(migrated_db, schema)
    migrate.migrate(declared_db, schema)
    with psycopg.connect(declared_db, autocommit=True) as c:
        assert check_current(c, schema) == latest_version()
        assert migrate_conn(c, schema) == []
    expected = [(m.version, m.name) for m in migrations()]
    assert versions(declared_db, schema) == expected
    assert versions(migrated_db, schema) == expected
    compatibility = [(m.version, m.compatible_with) for m in migrations()]
    for dsn in (declared_db, migrated_db):
        with psycopg.connect(dsn) as c:
            rows = c.execute(
                sql.SQL("SELECT version, compatible_with FROM {}.schema_version ORDER BY 1").format(
                    sql.Identifier(schema)
                )
            ).fetchall()
        assert rows == compatibility


def test_a_fresh_install_fills_the_declared_rows(
    fresh_dbs: tuple[str, str], pg: LocalPostgres
) -> None:
    """The dump compares no data: the rows a migration inserts (the retention floor) are
    there after a fresh install as after the migrations."""
    migrated_db, declared_db = fresh_dbs
    schema = "rows"
    migrate_through_every_migration(migrated_db, schema)
    migrate.migrate(declared_db, schema)
    floors = []
    for dsn in (migrated_db, declared_db):
        with psycopg.connect(dsn) as c:
            floors.append(
                c.execute(
                    sql.SQL("SELECT min_seconds, set_by FROM {}.retention_floor").format(
                        sql.Identifier(schema)
                    )
                ).fetchall()
            )
    assert floors[0] == floors[1] == [(86400.0, "pgworkerd migrate")]


def test_every_declared_file_is_applied_in_the_declared_order() -> None:
    names = [name for name, _ in migrate.declaration()]
    assert names == list(migrate.DECLARATION)
    assert len(set(names)) == len(names)


# -- idempotence and concurrency ------------------------------------------------------------


def test_migrate_applies_everything_once_then_nothing(test_db_dsn: str, schema_name: str) -> None:
    every = [m.version for m in migrations()]
    assert migrate.migrate(test_db_dsn, schema_name) == every
    assert migrate.migrate(test_db_dsn, schema_name) == []
    assert [v for v, _ in versions(test_db_dsn, schema_name)] == every
    with psycopg.connect(test_db_dsn) as c:
        assert check_current(c, schema_name) == latest_version()


def test_concurrent_migrate_processes_apply_each_migration_once(
    test_db_dsn: str, schema_name: str
) -> None:
    n = 4
    # Hold the migration lock so that all four processes are provably waiting at once, then
    # let them race for it.
    key = migrate._lock_key(schema_name)
    with psycopg.connect(test_db_dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", [key])
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PGWORKERD_", "PG"))}
        procs = [
            subprocess.Popen(
                [str(PGWORKERD), "--dsn", test_db_dsn, "--schema", schema_name, "migrate"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            for _ in range(n)
        ]
        try:
            deadline = time.monotonic() + 60
            waiting = 0
            while time.monotonic() < deadline:
                row = holder.execute(
                    "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database"
                    " WHERE l.locktype = 'advisory' AND NOT l.granted"
                    " AND d.datname = current_database()"
                ).fetchone()
                waiting = row[0] if row else 0
                if waiting >= n or any(p.poll() is not None for p in procs):
                    break
                time.sleep(0.05)
            assert waiting == n, f"only {waiting} of {n} migrate processes reached the lock"
        finally:
            holder.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", [key])
        outputs = [p.communicate(timeout=60) for p in procs]

    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    applied = [out for out, _ in outputs if "applied migrations" in out]
    every = ", ".join(str(m.version) for m in migrations())
    assert applied == [f"schema {schema_name}: applied migrations {every}\n"]
    assert sum("up to date" in out for out, _ in outputs) == n - 1
    assert versions(test_db_dsn, schema_name) == [(m.version, m.name) for m in migrations()]


# -- refusing a schema the code does not match ----------------------------------------------


def test_check_current_refuses_a_missing_schema(conn: psycopg.Connection, schema_name: str) -> None:
    with pytest.raises(SchemaError, match="does not exist") as info:
        check_current(conn, schema_name)
    assert schema_name in str(info.value)
    assert "pgworkerd migrate" in str(info.value)


def test_check_current_refuses_an_older_schema(conn: psycopg.Connection, schema: str) -> None:
    latest = latest_version()
    conn.execute(
        sql.SQL("DELETE FROM {}.schema_version WHERE version = %s").format(sql.Identifier(schema)),
        [latest],
    )
    with pytest.raises(SchemaError) as info:
        check_current(conn, schema)
    message = str(info.value)
    assert f"at version {latest - 1}, older" in message
    assert f"({latest})" in message
    assert "run `pgworkerd migrate`" in message


def test_check_current_and_migrate_refuse_a_newer_schema(
    conn: psycopg.Connection, schema: str
) -> None:
    newer = latest_version() + 1
    conn.execute(
        sql.SQL("INSERT INTO {}.schema_version (version, name) VALUES (%s, 'future')").format(
            sql.Identifier(schema)
        ),
        [newer],
    )
    with pytest.raises(SchemaError) as info:
        check_current(conn, schema)
    assert f"at version {newer}, newer" in str(info.value)
    assert "upgrade pgworkerd" in str(info.value)
    with pytest.raises(SchemaError, match="newer"):
        migrate_conn(conn, schema)


def assert_schema_refusal(proc: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert proc.returncode == ExitCode.SCHEMA, proc.stderr
    assert "Traceback" not in proc.stderr
    for text in expected:
        assert text in proc.stderr


def test_cli_exits_5_on_a_missing_schema(test_db_dsn: str, schema_name: str) -> None:
    proc = run_cli("--dsn", test_db_dsn, "--schema", schema_name, "jobs")
    assert_schema_refusal(proc, f"schema {schema_name!r} does not exist", "pgworkerd migrate")


def test_cli_exits_5_on_an_older_schema(
    test_db_dsn: str, conn: psycopg.Connection, schema: str
) -> None:
    conn.execute(
        sql.SQL("DELETE FROM {}.schema_version WHERE version = %s").format(sql.Identifier(schema)),
        [latest_version()],
    )
    proc = run_cli("--dsn", test_db_dsn, "--schema", schema, "enqueue", "h")
    assert_schema_refusal(proc, "older than this pgworkerd expects", "pgworkerd migrate")
    with psycopg.connect(test_db_dsn) as c:
        row = c.execute(sql.SQL("SELECT count(*) FROM {}.jobs").format(sql.Identifier(schema)))
        assert row.fetchone() == (0,)


def test_cli_exits_5_on_a_newer_schema_for_commands_and_migrate(
    test_db_dsn: str, conn: psycopg.Connection, schema: str
) -> None:
    conn.execute(
        sql.SQL("INSERT INTO {}.schema_version (version, name) VALUES (%s, 'future')").format(
            sql.Identifier(schema)
        ),
        [latest_version() + 1],
    )
    for command in ("jobs", "migrate"):
        proc = run_cli("--dsn", test_db_dsn, "--schema", schema, command)
        assert_schema_refusal(proc, "newer than this pgworkerd knows", "upgrade pgworkerd")


# -- rolling upgrades: a newer schema that says it is compatible ----------------------------


def add_future_version(
    conn: psycopg.Connection, schema: str, version: int, compatible_with: int | None
) -> None:
    """Record a migration this code does not know, as newer code's `migrate` would."""
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.schema_version (version, name, compatible_with)"
            " VALUES (%s, 'future', %s)"
        ).format(sql.Identifier(schema)),
        [version, compatible_with],
    )


def test_migrate_records_what_older_code_each_migration_is_compatible_with(
    test_db_dsn: str, schema_name: str
) -> None:
    migrate.migrate(test_db_dsn, schema_name)
    with psycopg.connect(test_db_dsn) as c:
        rows = c.execute(
            sql.SQL("SELECT version, compatible_with FROM {}.schema_version ORDER BY 1").format(
                sql.Identifier(schema_name)
            )
        ).fetchall()
    assert rows == [(m.version, m.compatible_with) for m in migrations()]


def test_a_migration_header_declares_its_compatibility() -> None:
    text = "-- 0009: an expand migration\n-- compatible-with-code-of-schema: 7\nSELECT 1;\n"
    assert migrate._parsed(9, "x", text).compatible_with == 7
    assert migrate._parsed(9, "x", "SELECT 1;\n").compatible_with == 9
    with pytest.raises(SchemaError, match="from 1 to 9, not 10"):
        migrate._parsed(9, "x", "-- compatible-with-code-of-schema: 10\n")


def test_check_current_runs_against_a_newer_compatible_schema_with_a_warning(
    conn: psycopg.Connection, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    known = latest_version()
    add_future_version(conn, schema, known + 1, known)
    add_future_version(conn, schema, known + 2, known - 1)
    with caplog.at_level("WARNING", logger="pgworkerd"):
        assert check_current(conn, schema) == known + 2
    [record] = [r for r in caplog.records if "compatible" in r.getMessage()]
    assert record.getMessage() == (
        f"schema {schema!r} is at version {known + 2}, newer than this pgworkerd knows "
        f"({known}) but compatible with it: running; upgrade pgworkerd on this host"
    )
    # `pgworkerd migrate` of the older code has nothing to do there, and says so
    assert migrate_conn(conn, schema) == []


def test_a_newer_schema_with_one_incompatible_migration_is_refused(
    conn: psycopg.Connection, schema: str
) -> None:
    known = latest_version()
    add_future_version(conn, schema, known + 1, known)
    add_future_version(conn, schema, known + 2, known + 1)  # a contract migration
    with pytest.raises(SchemaError, match=f"at version {known + 2}, newer"):
        check_current(conn, schema)
    with pytest.raises(SchemaError, match="upgrade pgworkerd"):
        migrate_conn(conn, schema)


def test_cli_runs_against_a_newer_compatible_schema(
    test_db_dsn: str, conn: psycopg.Connection, schema: str
) -> None:
    add_future_version(conn, schema, latest_version() + 1, latest_version())
    proc = run_cli("--dsn", test_db_dsn, "--schema", schema, "jobs")
    assert proc.returncode == 0, proc.stderr
    assert "but compatible with it" in proc.stderr


def test_migrate_adds_the_compatibility_column_to_an_older_version_table(
    test_db_dsn: str, schema_name: str
) -> None:
    """A schema migrated by pgworkerd 0.1 has a version table without the column."""
    ident = sql.Identifier(schema_name)
    with psycopg.connect(test_db_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        c.execute(
            sql.SQL(
                "CREATE TABLE {}.schema_version (version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident)
        )
    assert migrate.migrate(test_db_dsn, schema_name) == [m.version for m in migrations()]
    with psycopg.connect(test_db_dsn, autocommit=True) as c:
        assert migrate._oldest_compatible_code(c, schema_name) == max(
            m.compatible_with for m in migrations()
        )
        # read without the column, every version is compatible only with itself
        c.execute(
            sql.SQL("ALTER TABLE {}.schema_version DROP COLUMN compatible_with").format(ident)
        )
        assert migrate._oldest_compatible_code(c, schema_name) == latest_version()


# -- enqueue's checks, written once ----------------------------------------------------------


def test_enqueue_checks_are_written_once_and_cost_no_call(
    conn: psycopg.Connection, schema: str
) -> None:
    """enqueue_many's two paths call one helper for a job's validity, enqueue shares its
    name check, and PostgreSQL inlines both helpers (no function call per job)."""

    def definition(signature: str) -> str:
        row = conn.execute(
            "SELECT pg_get_functiondef(%s::regprocedure)", [f"{schema}.{signature}"]
        ).fetchone()
        assert row is not None
        return str(row[0])

    many = definition("enqueue_many(jsonb)")
    assert many.count(".enqueue_valid(e)") == 2
    assert "name_ok" not in many and "jsonb_typeof(e) = 'object'" not in many
    one = definition("enqueue(text, jsonb, text, integer, timestamptz, interval, integer, text)")
    assert one.count(".enqueue_name_ok(") == 2 and "name_ok constant" not in one
    plan = "\n".join(
        r[0]
        for r in conn.execute(
            sql.SQL(
                "EXPLAIN VERBOSE SELECT {}.enqueue_valid(e)"
                """ FROM jsonb_array_elements('[{{"handler": "h"}}]') AS t(e)"""
            ).format(sql.Identifier(schema))
        ).fetchall()
    )
    assert "enqueue_valid" not in plan and "enqueue_name_ok" not in plan, plan
    assert "jsonb_typeof(e) = 'object'" in plan


def test_the_inlined_helpers_bind_built_ins_whatever_the_migrators_search_path(
    test_db_dsn: str, schema_name: str
) -> None:
    """The helpers bind their names when created: a migration run without pgworkerd's
    search_path option (behind PgBouncer, say) must not bind a planted look-alike."""
    planted = f"planted_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(test_db_dsn, autocommit=True) as c:
        try:
            c.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(planted)))
            c.execute(
                sql.SQL(
                    "CREATE FUNCTION {}.jsonb_path_exists(jsonb, text) RETURNS boolean"
                    " LANGUAGE sql AS 'SELECT true'"
                ).format(sql.Identifier(planted))
            )
            c.execute(sql.SQL("SET search_path = {}, public").format(sql.Identifier(planted)))
            migrate_conn(c, schema_name)
            c.execute("RESET search_path")
            row = c.execute(
                sql.SQL("""SELECT {}.enqueue_many('[{{"handler": "h"}}]')""").format(
                    sql.Identifier(schema_name)
                )
            ).fetchone()
            assert row is not None and len(row[0]) == 1
        finally:
            c.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(planted)))


# -- a migration that must commit before the next (enum values) ----------------------------


def schema_at(dsn: str, schema: str, version: int) -> None:
    """`schema` as the migrations up to `version` leave it."""
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(query("schema_create", schema))
        c.execute(query("schema_version_create", schema))
        with c.transaction():
            for m in migrations()[:version]:
                c.execute(render(m.sql, schema))
                c.execute(
                    query("schema_version_insert", schema), {"version": m.version, "name": m.name}
                )


def test_the_migration_adding_job_states_commits_before_the_next_uses_them(
    test_db_dsn: str, schema_name: str
) -> None:
    """0026 adds enum values; PostgreSQL refuses them in the transaction that added them
    (55P04), so migrate commits it alone, and a later statement can name the states."""
    [adding] = [m for m in migrations() if m.name == "job_states"]
    assert adding.own_transaction
    assert [m.version for m in migrations() if m.own_transaction] == [adding.version]
    schema_at(test_db_dsn, schema_name, adding.version - 1)
    with psycopg.connect(test_db_dsn) as c:  # not autocommit: the caller's transaction
        c.execute("SELECT 1")
        with pytest.raises(SchemaError, match=rf"{adding.version:04d}_job_states must commit"):
            migrate_conn(c, schema_name)
        c.rollback()
    assert versions(test_db_dsn, schema_name)[-1][0] == adding.version - 1
    with psycopg.connect(test_db_dsn, autocommit=True) as c:
        assert migrate_conn(c, schema_name) == list(range(adding.version, latest_version() + 1))
        # What a later migration may now write: a CHECK naming the new states.
        c.execute(
            sql.SQL(
                "ALTER TABLE {}.jobs ADD CONSTRAINT probe CHECK (status <> 'waiting' "
                "OR status <> 'suspended')"
            ).format(sql.Identifier(schema_name))
        )
    with psycopg.connect(test_db_dsn) as c, pytest.raises(psycopg.errors.UnsafeNewEnumValueUsage):
        # why: what the own transaction avoids (the value used where it was added)
        c.execute(
            sql.SQL("ALTER TYPE {}.job_status ADD VALUE 'probe_state'").format(
                sql.Identifier(schema_name)
            )
        )
        c.execute(
            sql.SQL(
                "ALTER TABLE {}.jobs ADD CONSTRAINT probe2 CHECK (status <> 'probe_state')"
            ).format(sql.Identifier(schema_name))
        )


def test_a_migration_header_may_ask_for_its_own_transaction() -> None:
    assert migrate._parsed(9, "x", "-- own-transaction: yes\nSELECT 1;").own_transaction
    assert not migrate._parsed(9, "x", "-- own-transaction: no\nSELECT 1;").own_transaction
    assert not migrate._parsed(9, "x", "SELECT 1;").own_transaction
