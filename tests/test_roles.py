"""deploy/roles.sql: the least-privilege roles work, and hold no more than they need."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pgworkerd import jobs
from pgworkerd.localpg import LocalPostgres

ROLES_SQL = Path(__file__).resolve().parent.parent / "deploy" / "roles.sql"


@pytest.fixture
def roles(pg: LocalPostgres, conn: psycopg.Connection, schema: str, test_db_dsn: str):
    """roles.sql rendered for this test's schema and role names; yields their DSNs."""
    daemon, enqueuer = f"{schema}_daemon", f"{schema}_enqueuer"
    text = (
        ROLES_SQL.read_text()
        .replace("pgworkerd_daemon", daemon)
        .replace("pgworkerd_enqueuer", enqueuer)
        .replace("SCHEMA pgworkerd ", f"SCHEMA {schema} ")
        .replace("pgworkerd.", f"{schema}.")
    )
    conn.execute(text)
    # They log in with the cluster's password (its passfile is in the DSN), not roles.sql's.
    for name in (daemon, enqueuer):
        pg.grant_login(name)
    yield {
        name: pg.dsn("pgworkerd_test").replace("user=postgres", f"user={name}")
        for name in (daemon, enqueuer)
    }
    conn.execute(
        sql.SQL("DROP OWNED BY {}, {}").format(sql.Identifier(daemon), sql.Identifier(enqueuer))
    )
    conn.execute(
        sql.SQL("DROP ROLE {}, {}").format(sql.Identifier(daemon), sql.Identifier(enqueuer))
    )


def test_enqueuer_can_only_enqueue(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    with psycopg.connect(roles[f"{schema}_enqueuer"], autocommit=True) as c:
        job_id = jobs.enqueue(c, "h", {"x": 1}, schema=schema)
        [bulk] = jobs.enqueue_many(c, [jobs.JobSpec("h")], schema=schema)
        assert bulk == job_id + 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute(sql.SQL("SELECT payload FROM {}.jobs").format(sql.Identifier(schema)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute(sql.SQL("UPDATE {}.jobs SET priority = 1").format(sql.Identifier(schema)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # claim() is INVOKER
            jobs.claim(
                c, "w", queues=["default"], handlers={"h": jobs.HandlerCapacity(30, 1)},
                limit=1, schema=schema,
            )
    row = conn.execute(
        sql.SQL("SELECT handler, payload FROM {}.jobs WHERE id = %s").format(
            sql.Identifier(schema)
        ),
        [job_id],
    ).fetchone()
    assert row == ("h", {"x": 1})


def test_daemon_role_claims_renews_and_finishes(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    jobs.enqueue_many(conn, [jobs.JobSpec("h") for _ in range(3)], schema=schema)
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        held = jobs.claim(
            c,
            "w",
            queues=["default"],
            handlers={"h": jobs.HandlerCapacity(30, 3)},
            limit=3,
            schema=schema,
        )
        assert len(held) == 3
        assert all(
            r.renewed
            for r in jobs.renew(
                c, "w", [jobs.Lease(j.id, j.token, 30) for j in held], schema=schema
            )
        )
        assert jobs.complete(c, "w", held[0].id, held[0].token, {"ok": 1}, schema=schema)
        assert jobs.fail(c, "w", held[1].id, held[1].token, "boom", schema=schema)
        assert jobs.release(c, "w", held[2].id, held[2].token, schema=schema) == "pending"
        # it cannot delete history (prune is for operators who are granted DELETE)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute(sql.SQL("DELETE FROM {}.jobs").format(sql.Identifier(schema)))


def test_public_cannot_enqueue(pg: LocalPostgres, conn: psycopg.Connection, schema: str) -> None:
    role = f"{schema}_nobody"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    pg.grant_login(role)
    conn.execute(
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(schema), sql.Identifier(role)
        )
    )
    try:
        dsn = pg.dsn("pgworkerd_test").replace("user=postgres", f"user={role}")
        with (
            psycopg.connect(dsn, autocommit=True) as c,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            c.execute(sql.SQL("SELECT {}.enqueue('h')").format(sql.Identifier(schema)))
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
