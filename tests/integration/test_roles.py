"""deploy/roles.sql: the least-privilege roles work, and hold no more than they need."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import leasing
import psycopg
import pytest
from clirun import invoke
from daemon_harness import PGWORKERD, Daemons, Db, wait_for
from psycopg import sql
from psycopg.conninfo import make_conninfo
from refusals import queue_state, refused
from roles_harness import drop_roles

import pgworkerd
from pgworkerd import client
from pgworkerd.config import DatabaseConfig
from pgworkerd.daemon.dblink import DatabaseLink
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue import admin, lease, registry
from pgworkerd.queue.db import connect
from pgworkerd.queue.queries import render

# a daemon's registry secret (schema 24), the same for every row of these tests
SECRET = "test-registry-secret-" + "x" * 32

MIGRATIONS = Path(pgworkerd.__file__).resolve().parent / "queue" / "sql" / "migrations"


def test_enqueuer_can_only_enqueue(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    with psycopg.connect(roles[f"{schema}_enqueuer"], autocommit=True) as c:
        job_id = client.enqueue(c, "h", {"x": 1}, schema=schema)
        [bulk] = client.enqueue_many(c, [client.JobSpec("h")], schema=schema)
        assert bulk == job_id + 1
        with refused(conn, schema):
            c.execute(sql.SQL("SELECT payload FROM {}.jobs").format(sql.Identifier(schema)))
        with refused(conn, schema):
            c.execute(sql.SQL("UPDATE {}.jobs SET priority = 1").format(sql.Identifier(schema)))
        with refused(conn, schema):  # no EXECUTE on claim_jobs
            leasing.claim(
                c,
                "w",
                queues=["default"],
                handlers={"h": lease.HandlerCapacity(30, 1)},
                limit=1,
                schema=schema,
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
    client.enqueue_many(conn, [client.JobSpec("h") for _ in range(3)], schema=schema)
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        held = leasing.claim(
            c,
            "w",
            queues=["default"],
            handlers={"h": lease.HandlerCapacity(30, 3)},
            limit=3,
            schema=schema,
        )
        assert len(held) == 3
        assert all(
            r.renewed
            for r in lease.renew(
                c, "w", [lease.Lease(j.id, j.token, 30) for j in held], schema=schema
            )
        )
        assert leasing.complete(c, "w", held[0].id, held[0].token, {"ok": 1}, schema=schema)
        assert lease.fail(c, "w", held[1].id, held[1].token, "boom", schema=schema)
        assert lease.release(c, "w", held[2].id, held[2].token, schema=schema) == "pending"
        # it cannot delete history (prune is for operators who are granted DELETE)
        with refused(conn, schema):
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
            refused(conn, schema),
        ):
            c.execute(sql.SQL("SELECT {}.enqueue('h')").format(sql.Identifier(schema)))
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# -- column rights: the daemon cannot change what a job runs -----------------------------------


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("payload", '{"tampered": 1}'),
        ("handler", "big_result"),
        ("queue", "elsewhere"),
        ("priority", "-32768"),
        ("dedupe_key", "squatted"),
    ],
)
def test_daemon_role_cannot_update_what_a_job_runs(
    roles: dict[str, str], schema: str, conn: psycopg.Connection, column: str, value: str
) -> None:
    job_id = client.enqueue(conn, "h", {"x": 1}, schema=schema)
    before = admin.get(conn, job_id, schema=schema)
    with (
        psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c,
        refused(conn, schema, match="permission denied"),
    ):
        c.execute(
            sql.SQL("UPDATE {}.jobs SET {} = %s WHERE id = %s").format(
                sql.Identifier(schema), sql.Identifier(column)
            ),
            [value, job_id],
        )
    assert admin.get(conn, job_id, schema=schema) == before


def test_enqueuer_role_has_a_statement_timeout(roles: dict[str, str], schema: str) -> None:
    with psycopg.connect(roles[f"{schema}_enqueuer"], autocommit=True) as c:
        assert c.execute("SHOW statement_timeout").fetchone() == ("30s",)


def test_daemon_runs_jobs_end_to_end_with_its_role(
    roles: dict[str, str], schema: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    """A real `pgworkerd run` as the daemon role: claim, complete, fail, retry, and the
    read commands (jobs, status); cancel and retry are the operator role's, `logs` and
    `show` (they show lease tokens, which the daemon role no longer reads: schema 24) the
    reader's."""
    daemon_dsn, enqueuer_dsn = roles[f"{schema}_daemon"], roles[f"{schema}_enqueuer"]
    with psycopg.connect(enqueuer_dsn, autocommit=True) as c:
        done = client.enqueue(c, "echo", {"n": 1}, schema=schema)
        chatty = client.enqueue(c, "chatter", schema=schema)
        crashed, later = client.enqueue_many(
            c,
            [
                client.JobSpec("crash", max_attempts=2),
                client.JobSpec("echo", {"n": 2}, delay=3600),
            ],
            schema=schema,
        )
    daemons = Daemons(tmp_path, daemon_dsn, schema)
    try:
        daemons.start(
            {
                "echo": {"target": "pgworkerd.examples:echo"},
                "crash": {"target": "pgworkerd.examples:crash"},
                "chatter": {"target": "loghandlers:chatter"},
            }
        )
        db = Db(conn, schema)
        assert db.wait_status(done, "completed")["result"] == {"n": 1}
        # the role stores what its jobs print (roles.sql) and `logs` reads it
        db.wait_status(chatty, "completed")
        wait_for(
            lambda: db.rows(
                "SELECT 1 FROM {schema}.job_logs WHERE job_id = %s AND finished", (chatty,)
            ),
            what="the chatty job's stored output",
        )
        reader = Daemons(tmp_path, roles[f"{schema}_reader"], schema)
        printed = reader.cli("logs", str(chatty))
        assert "stdout line of attempt 1\n" in printed.stdout, printed.stderr
        # the role may add its figures to the attempt history (roles.sql) and show them
        wait_for(
            lambda: db.rows(
                "SELECT 1 FROM {schema}.attempts WHERE job_id = %s AND peak_memory > 0",
                (done,),
            ),
            what="the completed attempt's figures",
        )
        shown = reader.cli("show", str(done))
        assert shown.returncode == 0 and "#1 completed" in shown.stdout, shown.stderr
        refused = daemons.cli("show", str(done))
        assert refused.returncode != 0 and "cannot read jobs" in refused.stderr, refused
        dead = db.wait_status(crashed, "dead")
        assert dead["attempts"] == 2 and "exited with code 3" in dead["last_error"]
        for command in (["jobs"], ["status"]):
            proc = daemons.cli(*command)
            assert proc.returncode == 0, (command, proc.stderr)
            assert "Traceback" not in proc.stderr
        # cancel and retry are the operator's (schema 22: the daemon role changes jobs
        # only through the fenced functions): refused to the daemon role, and done by
        # the operator role
        for command in (["cancel", str(later)], ["retry", str(crashed)]):
            proc = daemons.cli(*command)
            assert proc.returncode != 0 and "permission denied" in proc.stderr, command
            proc = invoke("--dsn", roles[f"{schema}_operator"], "--schema", schema, *command)
            assert proc.returncode == 0, (command, proc.stderr)
        assert db.job(later)["status"] == "cancelled"
        assert db.job(crashed)["status"] in ("pending", "running", "dead")
        assert db.wait_status(crashed, "dead")["attempts"] == 2
    finally:
        daemons.stop_all()


# -- search_path: overloads planted in public hijack nothing -----------------------------------

# The audit's finding 5: where any role may create objects in a schema on the search_path
# (`public` up to PostgreSQL 14), exact-type overloads beat the polymorphic built-ins that
# claim() (`text || integer`) and job_fail (`power(2, int)`) rely on, and would run as the
# daemon. Each records that it ran, and as whom: from there, rewriting payloads is one
# UPDATE away (it would also abort the daemon's statement, so these do not try).
HOSTILE = """
CREATE FUNCTION public.pwn_concat(text, integer) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.{log} VALUES (current_user, '||');
    RETURN $1 OPERATOR(pg_catalog.||) $2::text;
END $$;
CREATE OPERATOR public.|| (leftarg = text, rightarg = integer, function = public.pwn_concat);
CREATE FUNCTION public.power(integer, integer) RETURNS double precision LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.{log} VALUES (current_user, 'power');
    RETURN pg_catalog.power($1::float8, $2::float8);
END $$;
"""


@pytest.fixture
def hostile_public(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> Iterator[sql.Identifier]:
    """PostgreSQL <= 14's default (everyone may CREATE in public), the enqueuer's overloads
    planted there, and a log table they write to; yields the log table's name."""
    log = f"{schema}_hijacks"
    conn.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    try:
        conn.execute(
            sql.SQL("CREATE TABLE public.{} (who text, what text)").format(sql.Identifier(log))
        )
        conn.execute(sql.SQL("GRANT INSERT ON public.{} TO PUBLIC").format(sql.Identifier(log)))
        with psycopg.connect(roles[f"{schema}_enqueuer"], autocommit=True) as c:
            c.execute(HOSTILE.format(log=log))  # type: ignore[arg-type]
        yield sql.Identifier(log)
    finally:
        conn.execute("DROP OPERATOR IF EXISTS public.|| (text, integer)")
        conn.execute("DROP FUNCTION IF EXISTS public.pwn_concat(text, integer)")
        conn.execute("DROP FUNCTION IF EXISTS public.power(integer, integer)")
        conn.execute(sql.SQL("DROP TABLE IF EXISTS public.{}").format(sql.Identifier(log)))
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")


def test_planted_overloads_are_live_for_a_careless_session(
    roles: dict[str, str],
    schema: str,
    conn: psycopg.Connection,
    hostile_public: sql.Identifier,
) -> None:
    """The trap works: a superuser session with public on its path runs the overload.
    (Otherwise the test below would pass for the wrong reason.)"""
    conn.execute("SET search_path = public, pg_catalog")
    try:
        assert conn.execute("SELECT 'a' || 1").fetchone() == ("a1",)
        assert conn.execute("SELECT power(2, 3)").fetchone() == (8.0,)
    finally:
        conn.execute("RESET search_path")
    hits = conn.execute(sql.SQL("SELECT what FROM public.{}").format(hostile_public)).fetchall()
    assert sorted(hits) == [("power",), ("||",)]
    conn.execute(sql.SQL("DELETE FROM public.{}").format(hostile_public))


def test_planted_overloads_in_public_hijack_nothing(
    roles: dict[str, str],
    schema: str,
    conn: psycopg.Connection,
    hostile_public: sql.Identifier,
) -> None:
    """claim (with a rescue of an expired lease and a burial), renew, fail, complete,
    release, enqueue and enqueue_many, as the daemon and the enqueuer connect (through
    pgworkerd.queue.db.connect): the planted overloads never run and no payload changes. And
    claim() itself is safe whatever its caller's search_path."""
    daemon_dsn, enqueuer_dsn = roles[f"{schema}_daemon"], roles[f"{schema}_enqueuer"]
    with connect(enqueuer_dsn) as c:
        ids = [client.enqueue(c, "h", {"n": 0}, schema=schema)]
        ids += client.enqueue_many(
            c,
            [client.JobSpec("h", {"n": n}, max_attempts=1 if n == 5 else 3) for n in range(1, 6)],
            schema=schema,
        )
    short = {"h": lease.HandlerCapacity(lease_seconds=0.2, free=10)}
    served = {"h": lease.HandlerCapacity(lease_seconds=30, free=10)}
    with connect(daemon_dsn, prepare=True) as c:
        first = leasing.claim(c, "w1", queues=["default"], handlers=short, limit=10, schema=schema)
        assert len(first) == 6

        def all_expired() -> bool:
            row = conn.execute(
                sql.SQL("SELECT bool_and(locked_until < clock_timestamp()) FROM {}.jobs").format(
                    sql.Identifier(schema)
                )
            ).fetchone()
            return bool(row and row[0])

        wait_for(all_expired, what="the short leases to run out")
        # the rescue path builds last_error with text || integer; job 5 (no attempts left)
        # is buried by the same branch
        held = leasing.claim(c, "w2", queues=["default"], handlers=served, limit=10, schema=schema)
        assert sorted(j.id for j in held) == ids[:5] and all(j.rescued for j in held)
        assert all(
            r.renewed
            for r in lease.renew(
                c, "w2", [lease.Lease(j.id, j.token, 30) for j in held], schema=schema
            )
        )
        assert lease.fail(c, "w2", held[0].id, held[0].token, "boom", schema=schema)  # power()
        assert leasing.complete(c, "w2", held[1].id, held[1].token, {"ok": 1}, schema=schema)
        assert lease.release(c, "w2", held[2].id, held[2].token, schema=schema) == "pending"
    # claim() pins its own search_path: even a session that puts public first is safe
    with psycopg.connect(daemon_dsn, autocommit=True) as c:
        c.execute("SET search_path = public, pg_catalog")
        conn.execute(
            sql.SQL("UPDATE {}.jobs SET locked_until = now() - interval '1s' WHERE id = %s").format(
                sql.Identifier(schema)
            ),
            [held[3].id],
        )
        again = leasing.claim(c, "w3", queues=["default"], handlers=served, limit=10, schema=schema)
        assert held[3].id in {j.id for j in again if j.rescued}

    hits = conn.execute(sql.SQL("SELECT who, what FROM public.{}").format(hostile_public))
    assert hits.fetchall() == []
    payloads = conn.execute(
        sql.SQL("SELECT id, payload FROM {}.jobs ORDER BY id").format(sql.Identifier(schema))
    ).fetchall()
    assert payloads == [(job_id, {"n": n}) for n, job_id in enumerate(ids)]
    rows = {r["id"]: r for r in admin.list_jobs(conn, schema=schema)}
    assert rows[ids[5]]["status"] == "dead"
    assert "expired during attempt 1 of 1" in rows[ids[5]]["last_error"]
    assert "expired during attempt 2" in rows[held[3].id]["last_error"]


@pytest.mark.parametrize("options", [None, "-c work_mem=2MB"], ids=["plain-dsn", "dsn-options"])
def test_pgworkerd_sessions_pin_search_path_whatever_the_role(
    test_db_dsn: str, options: str | None
) -> None:
    """Without roles.sql (say the daemon runs as the application's owner), the CLI's and
    the daemon's own connections still resolve names in pg_catalog only; options the DSN
    gives are kept."""
    dsn = test_db_dsn if options is None else make_conninfo(test_db_dsn, options=options)
    link = DatabaseLink(DatabaseConfig(statement_timeout=7.0), dsn, "pgworkerd", None)  # type: ignore[arg-type]
    with connect(dsn) as cli_conn, link.connect() as daemon_conn:
        for c in (cli_conn, daemon_conn):
            [(path,)] = c.execute("SHOW search_path").fetchall()
            assert path.replace(" ", "") == "pg_catalog,pg_temp"
        assert daemon_conn.execute("SHOW statement_timeout").fetchone() == ("7s",)
        if options is not None:
            assert cli_conn.execute("SHOW work_mem").fetchone() == ("2MB",)


# -- fleet-wide limits, concurrency keys, pauses (migration 0009) ---------------------------


def test_roles_for_concurrency_keys_limits_and_pauses(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    from pgworkerd.queue import fleet, views

    with psycopg.connect(roles[f"{schema}_enqueuer"], autocommit=True) as c:
        keyed = client.enqueue(c, "h", concurrency_key="k", schema=schema)
        [many] = client.enqueue_many(c, [client.JobSpec("h", concurrency_key="k")], schema=schema)
        for kind in ("queue", "handler"):  # only operators (and the daemon role) pause
            with refused(conn, schema):
                fleet.set_paused(c, schema, kind, "x", pause=True)
        with refused(conn, schema):
            views.paused(c, schema)
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        assert fleet.set_paused(c, schema, "handler", "other", pause=True, comment="c")
        assert [p["paused_by"] for p in views.paused(c, schema)] == [f"{schema}_daemon"]
        limited = lease.HandlerCapacity(30, 5, max_running=5, max_running_per_key=1)
        claimed = leasing.claim(
            c, "w", queues=["default"], handlers={"h": limited}, limit=5, schema=schema
        )
        assert [j.id for j in claimed] == [keyed]  # one per key
        assert fleet.set_paused(c, schema, "handler", "other", pause=False)
        with refused(conn, schema):  # only through the functions
            c.execute(sql.SQL("DELETE FROM {}.paused").format(sql.Identifier(schema)))
    assert many == keyed + 1


def test_daemon_role_fires_schedules_and_enqueuer_cannot(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    from datetime import UTC, datetime, timedelta

    from pgworkerd.queue import schedules

    # a tick of the schedule (every minute), due (schema 24 checks both)
    tick = datetime.fromtimestamp(int(datetime.now(UTC).timestamp()) // 60 * 60, UTC)
    info = registry.WorkerInfo("w", "hostx", 1, "t", ["default"], ["h"], 1)
    registry.register(conn, info, "running", schema, secret=SECRET)  # a live daemon fires
    definition = {
        "handler": "h",
        "every": 60.0,
        "payload": {"from": "the operator"},
        "queue": "default",
        "priority": 0,
        "overlap": "allow",
    }
    # the daemon role may not declare (schema 22): an operator does
    with (
        psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c,
        refused(conn, schema, match="not declared"),
    ):
        schedules.declare(c, "s", definition, "w", schema)
    with psycopg.connect(roles[f"{schema}_operator"], autocommit=True) as c:
        schedules.declare(c, "s", definition, "alice", schema)
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        schedules.declare(c, "s", definition, "w", schema)  # the same: accepted, read only
        with refused(conn, schema, match="another definition"):
            schedules.declare(c, "s", {**definition, "handler": "other"}, "w", schema)
        fired = schedules.fire(c, "s", tick, "w", schema)
        assert fired.outcome == "fired"
        job = admin.get(conn, fired.job_id, schema=schema)
        assert (job["handler"], job["payload"]) == ("h", {"from": "the operator"})
        assert schedules.list_all(c, schema)[0]["last_job_id"] == fired.job_id
        with refused(conn, schema):  # only through the functions
            c.execute(sql.SQL("DELETE FROM {}.schedule_runs").format(sql.Identifier(schema)))
    with (
        psycopg.connect(roles[f"{schema}_enqueuer"], autocommit=True) as c,
        refused(conn, schema),
    ):
        schedules.fire(c, "s", tick + timedelta(seconds=1), "w", schema)


def test_the_operator_role_prunes_jobs_gone_daemons_and_schedule_runs(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    proc = subprocess.run(
        [
            str(PGWORKERD),
            "--dsn",
            roles[f"{schema}_operator"],
            "--schema",
            schema,
            "prune",
            "--older-than",
            "1d",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


# -- handler-controlled outcomes and waiting (issue 11) -------------------------------------


def test_daemon_role_snoozes_and_gives_up_and_can_wait(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    ids = client.enqueue_many(conn, [client.JobSpec("h") for _ in range(2)], schema=schema)
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        held = leasing.claim(
            c,
            "w",
            queues=["default"],
            handlers={"h": lease.HandlerCapacity(30, 2)},
            limit=2,
            schema=schema,
        )
        snoozed = lease.snooze(c, "w", held[0].id, held[0].token, 60, max_snoozes=5, schema=schema)
        assert snoozed is not None and (snoozed.status, snoozed.snoozes) == ("pending", 1)
        assert lease.bury(c, "w", held[1].id, held[1].token, "gave up", schema=schema)
        with pytest.raises(pgworkerd.JobFailed, match="gave up"):
            pgworkerd.wait(c, held[1].id, timeout=5, schema=schema)
        assert sorted(ids) == sorted(j.id for j in held)


def test_daemon_role_prunes_finished_jobs_through_the_function_only(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    from pgworkerd.queue import retention

    old, live = client.enqueue(conn, "h", schema=schema), client.enqueue(conn, "h", schema=schema)
    conn.execute(
        sql.SQL(
            "UPDATE {}.jobs SET status = 'dead', finished_at = now() - interval '2 days'"
            " WHERE id = %s"
        ).format(sql.Identifier(schema)),
        (old,),
    )
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        # below the operator's floor (1 day until changed, schema 22): refused, nothing gone
        with refused(conn, schema, match="floor"):
            retention.prune_finished(
                c, completed=0.0, cancelled=0.0, dead=86400.0, batch=10, schema=schema
            )
        with refused(conn, schema):  # the floor is not its own
            c.execute(render("SELECT @schema@.retention_floor_set(0)", schema))
        result = retention.prune_finished(
            c, completed=86400.0, cancelled=86400.0, dead=86400.0, batch=10, schema=schema
        )
        assert result.deleted == 1
    with psycopg.connect(roles[f"{schema}_operator"], autocommit=True) as c:
        c.execute(render("SELECT @schema@.retention_floor_set(60)", schema))
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        assert (
            retention.prune_finished(
                c, completed=60.0, cancelled=60.0, dead=60.0, batch=10, schema=schema
            ).deleted
            == 0
        )
        with refused(conn, schema):  # still no DELETE
            c.execute(sql.SQL("DELETE FROM {}.jobs").format(sql.Identifier(schema)))
    ids = {
        r[0] for r in conn.execute(sql.SQL("SELECT id FROM {}.jobs").format(sql.Identifier(schema)))
    }
    assert ids == {live}  # a pending job is never pruned, whatever the retention


def test_daemon_role_drains_and_hands_back_through_the_functions_and_enqueuer_cannot(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    from pgworkerd.queue import fleet, registry

    info = registry.WorkerInfo("w:1:a", "hostx", 1, "t", ["default"], ["h"], 2)
    registry.register(conn, info, "running", schema, secret=SECRET)
    with psycopg.connect(roles[f"{schema}_enqueuer"], autocommit=True) as c:
        with refused(conn, schema):
            fleet.request_hand_back(c, schema, grace=1.0, worker_id=info.id)
        with refused(conn, schema):
            fleet.request_drain(c, schema, drain=False, worker_id=info.id)
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        assert fleet.request_drain(c, schema, drain=True, worker_id=info.id)
        [asked] = fleet.request_hand_back(c, schema, grace=2.0, handlers=["h"], worker_id=info.id)
        assert asked["id"] == info.id
        request = registry.heartbeat(c, info, "draining", [], schema, secret=SECRET)
        assert request is not None and request.drain and request.hand_back is not None
        assert request.hand_back.handlers == frozenset({"h"})
        assert fleet.request_drain(c, schema, drain=False, worker_id=info.id)
        assert (
            registry.heartbeat(c, info, "running", [], schema, secret=SECRET)
            == registry.DrainRequest()
        )


def test_the_daemon_role_prunes_runs_and_daemons_only_through_the_function(
    roles: dict[str, str], conn: psycopg.Connection, schema: str
) -> None:
    """Migration 0020: the daemon role runs prune_finished_v2 (roles.sql), which deletes
    old schedule runs and gone daemons' rows; it still has no DELETE on either table."""
    from pgworkerd.queue import retention

    day = 86400.0
    conn.execute(
        sql.SQL(
            "INSERT INTO {s}.schedules (name, definition, declared_by)"
            " VALUES ('hourly', '{{}}', 't');"
            "INSERT INTO {s}.schedule_runs (schedule, tick, skipped, fired_by)"
            " SELECT 'hourly', now() - make_interval(secs => h * 3600), 't', 't'"
            " FROM generate_series(0, 199) h"
        ).format(s=sql.Identifier(schema))
    )
    conn.execute(
        sql.SQL(
            "INSERT INTO {}.workers (id, host, pid, version, slots, state, stopped_at)"
            " VALUES ('old', 'h', 1, 'v', 1, 'gone', now() - interval '8 days')"
        ).format(sql.Identifier(schema))
    )
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        result = retention.prune_finished(
            c,
            completed=None,
            cancelled=None,
            dead=None,
            batch=100,
            schema=schema,
            schedule_runs=7 * day,
            gone_daemons=7 * day,
        )
        assert (result.schedule_runs_deleted, result.daemons_deleted) == (32, 1)
        for table in ("schedule_runs", "workers"):
            with refused(conn, schema):  # still no DELETE
                c.execute(
                    sql.SQL("DELETE FROM {}.{}").format(
                        sql.Identifier(schema), sql.Identifier(table)
                    )
                )


# -- the audit's daemon_role_probe.sql (security review 2026-11-26, N4), statement by statement

# Each statement of security-2026-11-26-repro/daemon_role_probe.sql, as pgworkerd_daemon
# runs it (`:job` is a completed job), and what else the daemon role must not do: all of
# them succeeded on the audited commit; every one must be refused now.
DAEMON_PROBE: dict[str, str] = {
    "1a. declare a schedule": (
        'SELECT @schema@.schedule_declare(\'zz-injected\', \'{"handler":"x","every":86400}\','
        " 'attacker')"
    ),
    "1b. fire a job object of its choosing": (
        "SELECT * FROM @schema@.schedule_fire('s', now(),"
        ' \'{"handler":"printer","payload":{"text":"by the daemon role"}}\','
        " 'allow', 'attacker')"
    ),
    "2. run a finished job again": (
        "UPDATE @schema@.jobs SET status = 'pending', run_at = now(), attempts = 0,"
        " finished_at = NULL, result = NULL WHERE id = %(job)s RETURNING id"
    ),
    "3. rewrite a checkpoint": (
        "UPDATE @schema@.jobs SET checkpoint = '{\"step\": 999}'"
        " WHERE id = (SELECT min(id) FROM @schema@.jobs WHERE status = 'pending')"
    ),
    "4. forge any job's captured output": (
        "INSERT INTO @schema@.job_logs (job_id, lease_token, attempt, worker, head, finished)"
        " VALUES (%(job)s, 987654321, 1, 'some-other-host:1:abc', 'FORGED', true)"
    ),
    "4b. forge it through the daemon's function": (
        "SELECT * FROM @schema@.job_log_write_v1('some-other-host:1:abc', ARRAY[%(job)s]::bigint[],"
        " '{987654321}', '{1}', '{FORGED}', '{x}', '{6}', '{0}', '{true}')"
    ),
    "4c. rewrite a running job's outcome (and its attempt row)": (
        "UPDATE @schema@.jobs SET status = 'dead', last_error = 'forged by the daemon role'"
        " WHERE id = %(running)s"
    ),
    "4d. rewrite attempt history": "UPDATE @schema@.attempts SET error = 'forged'",
    "4e. rewrite attempt figures": "UPDATE @schema@.attempts SET wall_seconds = 0",
    "5. delete every finished job now (retention 0)": (
        "SELECT * FROM @schema@.prune_finished_v1(0, 0, 0, 10)"
    ),
    "5b. the same through v2": "SELECT * FROM @schema@.prune_finished_v2(0, 0, 0, 0, 0, 10)",
    "5c. lower the retention floor": "SELECT @schema@.retention_floor_set(0)",
    "5d. lower it behind the function": "UPDATE @schema@.retention_floor SET min_seconds = 0",
    "rewrite a result": "UPDATE @schema@.jobs SET result = '{}' WHERE id = %(job)s",
    "reset attempts": "UPDATE @schema@.jobs SET attempts = 0 WHERE id = %(running)s",
    "insert a job": "INSERT INTO @schema@.jobs (handler) VALUES ('printer')",
    "enqueue": 'SELECT @schema@.enqueue_many(\'[{"handler": "printer"}]\')',
    "rewrite a schedule": "UPDATE @schema@.schedules SET definition = '{}'",
    # schema 24 (lease): another host's running attempt, and the registry
    "6a. read running attempts' lease tokens": (
        "SELECT locked_by, lease_token FROM @schema@.jobs WHERE status = 'running'"
    ),
    "6b. read them from the logs of running attempts": (
        "SELECT worker, lease_token FROM @schema@.job_logs"
    ),
    "6c. read every column": "SELECT * FROM @schema@.jobs",
    "7a. plant a peer": (
        "INSERT INTO @schema@.workers (id, host, pid, version, slots, state)"
        " VALUES ('fake:1:x', 'h', 1, '0', 64, 'running')"
    ),
    "7b. keep planted peers fresh": "UPDATE @schema@.workers SET heartbeat_at = now()",
    "7c. remove the other daemons": "DELETE FROM @schema@.workers",
    "7d. raise the registry cap": "UPDATE @schema@.registry_cap SET max_live_per_login = 100000",
}


def test_the_audits_daemon_role_probe_is_refused_statement_by_statement(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    done, running = client.enqueue_many(
        conn, [client.JobSpec("h"), client.JobSpec("h")], schema=schema
    )
    client.enqueue(conn, "h", schema=schema)  # a pending job (statement 3)
    with psycopg.connect(roles[f"{schema}_operator"], autocommit=True) as c:
        c.execute(
            render(
                'SELECT @schema@.schedule_declare(\'s\', \'{"handler": "h", '
                "\"every\": 60}', 'alice')",
                schema,
            )
        )
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        held = leasing.claim(
            c,
            "w",
            queues=["default"],
            handlers={"h": lease.HandlerCapacity(30, 2)},
            limit=2,
            schema=schema,
        )
        assert sorted(j.id for j in held) == [done, running]
        token = {j.id: j.token for j in held}
        assert leasing.complete(c, "w", done, token[done], {"ok": 1}, schema=schema)
    before = queue_state(conn, schema)
    allowed = []
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        for name, statement in DAEMON_PROBE.items():
            try:
                with c.transaction(), c.cursor() as cur:
                    cur.execute(render(statement, schema), {"job": done, "running": running})
                    rows = cur.fetchall() if cur.description else []
                # a fenced function may run: it must change nothing (no row back)
                if rows or not name.startswith("4b"):
                    allowed.append(name)
            except psycopg.errors.InsufficientPrivilege:
                pass
    assert allowed == []
    after = queue_state(conn, schema)
    assert after == before
    # and what a daemon does still works: its own attempt, fenced
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        assert not leasing.complete(c, "other", running, token[running], None, schema=schema)
        assert leasing.complete(c, "w", running, token[running], None, schema=schema)


def test_a_daemon_as_its_role_fires_only_what_an_operator_declared(
    roles: dict[str, str], schema: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    """The README's schedules path with roles.sql (schema 22): the daemon role cannot
    declare its config's schedules, says so, and fires them once the operator declared
    them from the same config (`schedules declare`)."""
    daemons = Daemons(tmp_path, roles[f"{schema}_daemon"], schema)
    config = daemons.config(
        {"echo": {"target": "pgworkerd.examples:echo"}},
        tables={"schedules.tick": {"handler": "echo", "every": "1s", "overlap": "allow"}},
    )
    db = Db(conn, schema)
    try:
        daemon = daemons.start(config)
        daemon.wait_log(r"declaring schedule 'tick' failed: .*not declared.*schedules declare")
        assert db.rows("SELECT 1 FROM {schema}.schedules") == []
        declared = subprocess.run(
            [
                str(PGWORKERD),
                "--dsn",
                roles[f"{schema}_operator"],
                "--schema",
                schema,
                "--config",
                str(config),
                "schedules",
                "declare",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert declared.returncode == 0, declared.stderr
        assert "declared schedule tick" in declared.stdout
        [row] = db.rows("SELECT declared_by FROM {schema}.schedules WHERE name = 'tick'")
        assert row["declared_by"] == f"{schema}_operator"
        wait_for(
            lambda: db.rows(
                "SELECT 1 FROM {schema}.schedule_runs r JOIN {schema}.jobs j ON j.id = r.job_id"
                " WHERE r.schedule = 'tick' AND j.status = 'completed' AND j.handler = 'echo'"
            ),
            what="a declared schedule's job, fired and run by the daemon role",
        )
    finally:
        daemons.stop_all()


def test_the_migration_lets_the_old_daemon_role_run_both_releases_until_roles_sql(
    pg: LocalPostgres, schema: str, conn: psycopg.Connection
) -> None:
    """Schema 22's rolling upgrade: a role with the daemon's rights of an earlier
    roles.sql (UPDATE of jobs' columns, lease_token among them) gets EXECUTE on what the
    new release calls when the migration runs (its last block, run here again as the
    migration ran it), so old and new daemons work side by side; a role that may change
    a job's status but not its lease (the operator's) gets nothing."""
    block = (MIGRATIONS / "0022_lockdown.sql").read_text()
    block = block[block.rindex("DO $$") :]
    # schema 27 hands the old daemon role claim_jobs' successor the same way
    successors = (MIGRATIONS / "0027_dependencies.sql").read_text()
    block += "\n" + successors[successors.rindex("DO $$") :]
    # and schema 31 claim_jobs_v2's (the claim the new daemon calls: claim_jobs_v3)
    successors = (MIGRATIONS / "0031_claim_jobs_v3.sql").read_text()
    block += "\n" + successors[successors.rindex("DO $$") :]
    old, operator_like = f"{schema}_old_daemon", f"{schema}_old_operator"
    for name in (old, operator_like):
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        pg.grant_login(name)
        conn.execute(
            render(
                "GRANT USAGE ON SCHEMA @schema@ TO {0}; GRANT SELECT ON @schema@.jobs TO {0}",
                schema,
            ).replace("{0}", f'"{name}"')
        )
    conn.execute(
        render(
            f"GRANT UPDATE (status, locked_by, locked_until, lease_token, attempts, result, "
            f"progress, checkpoint, cancel_requested, started_at, finished_at, updated_at, "
            f'last_error, run_at) ON @schema@.jobs TO "{old}";'
            f"GRANT UPDATE (status, attempts, run_at, finished_at, cancel_requested, "
            f'updated_at) ON @schema@.jobs TO "{operator_like}"',
            schema,
        )
    )
    try:
        conn.execute(render(block, schema))
        job = client.enqueue(conn, "h", schema=schema)
        dsn = pg.dsn("pgworkerd_test").replace("user=postgres", f"user={old}")
        with psycopg.connect(dsn, autocommit=True) as c:
            [held] = leasing.claim(
                c,
                "w",
                queues=["default"],
                handlers={"h": lease.HandlerCapacity(30, 1)},
                limit=1,
                schema=schema,
            )
            assert leasing.complete(c, "w", job, held.token, {"new": True}, schema=schema)
            # and the previous release's way, a column UPDATE, still works too
            c.execute(
                render("UPDATE @schema@.jobs SET progress = '1' WHERE id = %s", schema), [job]
            )
        dsn = pg.dsn("pgworkerd_test").replace("user=postgres", f"user={operator_like}")
        with (
            psycopg.connect(dsn, autocommit=True) as c,
            refused(conn, schema),
        ):
            leasing.claim(
                c,
                "w",
                queues=["default"],
                handlers={"h": lease.HandlerCapacity(30, 1)},
                limit=1,
                schema=schema,
            )
    finally:
        drop_roles(conn, [old, operator_like])


def test_the_lease_migration_grants_its_functions_to_the_roles_that_claim(
    pg: LocalPostgres, schema: str, conn: psycopg.Connection
) -> None:
    """Schema 24's rolling upgrade: a role that may claim (EXECUTE on claim_jobs, the
    daemon role of roles.sql of schemas 22 and 23) gets EXECUTE on the registry functions
    and the lease check when the migration runs (its last block, run here again), so a
    daemon of this release runs before roles.sql is applied again; a role that may not
    claim gets nothing."""
    block = (MIGRATIONS / "0024_lease_fence.sql").read_text()
    block = block[block.rindex("DO $$") :]
    claimer, other = f"{schema}_claimer", f"{schema}_other"
    for name in (claimer, other):
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    conn.execute(
        render(
            "GRANT EXECUTE ON FUNCTION @schema@.claim_jobs(text, text[], text[], float8[],"
            " integer[], integer, integer[], jsonb, integer[], integer[]) TO {0}",
            schema,
        ).replace("{0}", f'"{claimer}"')
    )
    try:
        conn.execute(render(block, schema))
        may = render(
            "SELECT has_function_privilege(%s, '@schema@.worker_register_v2(text, text, text,"
            " integer, text, text[], text[], integer, text, jsonb, float8)', 'EXECUTE'),"
            " has_function_privilege(%s, '@schema@.job_lease_state_v1(bigint, bigint)',"
            " 'EXECUTE')",
            schema,
        )
        assert conn.execute(may, [claimer, claimer]).fetchone() == (True, True)
        assert conn.execute(may, [other, other]).fetchone() == (False, False)
    finally:
        drop_roles(conn, [claimer, other])


def test_a_restarted_daemon_rescues_its_attempt_without_reading_tokens(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """Schema 24: the daemon role reads no lease token, yet a daemon started again (a new
    id) takes over the attempt its predecessor held once that lease ran out (the claim
    returns the new token), finishes it, and the predecessor's token is fenced off."""
    job = client.enqueue(conn, "h", schema=schema)
    capacity = {"h": lease.HandlerCapacity(0.5, 1)}
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as c:
        [before] = leasing.claim(
            c, "host:1:a", queues=["default"], handlers=capacity, limit=1, schema=schema
        )

        def rescue() -> list[lease.ClaimedJob]:
            return leasing.claim(
                c,
                "host:2:b",
                queues=["default"],
                handlers={"h": lease.HandlerCapacity(60, 1)},
                limit=1,
                schema=schema,
            )

        [after] = wait_for(rescue, what="the expired attempt to be rescued")
        assert (after.id, after.rescued) == (job, True) and after.token != before.token
        assert not leasing.complete(c, "host:1:a", job, before.token, None, schema=schema)
        assert leasing.complete(c, "host:2:b", job, after.token, {"ok": 1}, schema=schema)
    assert admin.get(conn, job, schema=schema)["result"] == {"ok": 1}
