"""roles.sql's roles for people (issue 21): the operator and the reader can do what its
comments promise and no more, statement by statement; the enqueuer reads and waits for the
jobs its own login enqueued and no one else's; the script sets no password and runs again
unchanged; and every role a permission error names can run that command."""

from __future__ import annotations

import ast
import re
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import leasing
import psycopg
import pytest
from clirun import invoke
from daemon_harness import PGWORKERD
from psycopg import sql
from refusals import may_run, refused
from roles_harness import ROLE_KINDS, ROLES_SQL, drop_roles, render_roles_sql

import pgworkerd
from pgworkerd import client
from pgworkerd.cli import ROLES_WITH_RIGHT
from pgworkerd.devcluster.localpg import LocalPostgres, find_server_bindir
from pgworkerd.queue import lease
from pgworkerd.queue.queries import render

CLI_DIR = Path(__file__).resolve().parents[2] / "pgworkerd" / "cli"


def as_role(dsns: dict[str, str], schema: str, kind: str) -> psycopg.Connection:
    return psycopg.connect(dsns[f"{schema}_{kind}"], autocommit=True)


# -- the enqueuer reads and waits for its own jobs only ---------------------------------------


@pytest.fixture
def second_app(
    pg: LocalPostgres,
    conn: psycopg.Connection,
    schema: str,
    roles: dict[str, str],
):
    """Another application's login, a member of the enqueuer role (roles.sql's advice for
    applications that must not read each other's jobs); yields its DSN."""
    name = f"{schema}_billing"
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
            sql.Identifier(name), sql.Identifier(f"{schema}_enqueuer")
        )
    )
    pg.grant_login(name)
    yield pg.dsn("pgworkerd_test").replace("user=postgres", f"user={name}")
    drop_roles(conn, [name])


def finish(conn: psycopg.Connection, schema: str, job_id: int, result: Any) -> None:
    """Claim and complete job_id as the owner (as a daemon would)."""
    held = leasing.claim(
        conn,
        "w",
        queues=["default"],
        handlers={"h": lease.HandlerCapacity(30, 10)},
        limit=10,
        schema=schema,
    )
    for job in held:
        if job.id == job_id:
            assert leasing.complete(conn, "w", job.id, job.token, result, schema=schema)
        else:
            assert lease.release(conn, "w", job.id, job.token, schema=schema) == "pending"


def test_the_enqueuer_waits_for_and_reads_its_own_jobs_and_no_one_elses(
    roles: dict[str, str],
    schema: str,
    conn: psycopg.Connection,
    second_app: str,
) -> None:
    enqueuer = f"{schema}_enqueuer"
    with (
        as_role(roles, schema, "enqueuer") as mine,
        psycopg.connect(second_app, autocommit=True) as theirs,
    ):
        own = client.enqueue(mine, "h", {"n": 1}, schema=schema)
        [own_bulk] = client.enqueue_many(mine, [client.JobSpec("h", {"n": 2})], schema=schema)
        other = client.enqueue(theirs, "h", {"secret": 1}, schema=schema)
        # the other application, acting as the enqueuer role: still its own login's job
        theirs.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(enqueuer)))
        other_as_role = client.enqueue(theirs, "h", schema=schema)

        # recorded as the login, not the SECURITY DEFINER function's owner
        recorded = dict(
            conn.execute(
                sql.SQL("SELECT id, enqueued_by FROM {}").format(sql.Identifier(schema, "jobs"))
            ).fetchall()
        )
        billing = f"{schema}_billing"
        assert recorded == {
            own: enqueuer,
            own_bulk: enqueuer,
            other: billing,
            other_as_role: billing,
        }

        job = pgworkerd.get(mine, own, schema=schema)
        assert job is not None and (job.id, job.handler, job.status) == (own, "h", "pending")
        assert pgworkerd.get(mine, own_bulk, schema=schema) is not None
        for hidden in (other, other_as_role):  # another login's job: as if there were none
            assert pgworkerd.get(mine, hidden, schema=schema) is None
            with pytest.raises(pgworkerd.JobNotFound, match="that this role may read"):
                pgworkerd.wait(mine, hidden, timeout=5, schema=schema)
        # SET ROLE does not widen what the other login reads: mine stay hidden from it
        assert pgworkerd.get(theirs, own, schema=schema) is None
        assert pgworkerd.get(theirs, other, schema=schema) is not None
        # and still no right on the table itself
        with refused(conn, schema):
            mine.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(schema, "jobs")))

        # wait() as the enqueuer: woken by the finish, returns the result
        waited: dict[str, Any] = {}

        def waiter() -> None:
            with as_role(roles, schema, "enqueuer") as c:
                waited["result"] = pgworkerd.wait(c, own, timeout=60, schema=schema)

        thread = threading.Thread(target=waiter)
        thread.start()
        try:
            finish(conn, schema, own, {"done": True})
        finally:
            thread.join(90)
        assert waited == {"result": {"done": True}}
        done = pgworkerd.get(mine, own, schema=schema)
        assert done is not None and done.finished and done.result == {"done": True}


def test_jobs_enqueued_before_the_migration_are_read_by_no_enqueuer(
    roles: dict[str, str],
    schema: str,
    conn: psycopg.Connection,
) -> None:
    job = client.enqueue(conn, "h", schema=schema)
    conn.execute(
        sql.SQL("UPDATE {} SET enqueued_by = NULL WHERE id = %s").format(
            sql.Identifier(schema, "jobs")
        ),
        [job],
    )
    with as_role(roles, schema, "enqueuer") as c:
        assert pgworkerd.get(c, job, schema=schema) is None
    with as_role(roles, schema, "reader") as c:
        assert pgworkerd.get(c, job, schema=schema) is not None


# -- each role: what roles.sql promises, and no more -------------------------------------------

# name -> (SQL, or a statement of sql/queries/, and its parameters). Each runs in a transaction
# rolled back: only whether the role may run it matters.
Statement = tuple[str, dict[str, Any]]
IDS = {"ids": [1]}
STATEMENTS: dict[str, Statement] = {
    # reading (reader, operator)
    "select jobs": ("SELECT * FROM @schema@.jobs", {}),
    "select attempts": ("SELECT * FROM @schema@.attempts", {}),
    "select job_logs": ("SELECT * FROM @schema@.job_logs", {}),
    "select workers": ("SELECT * FROM @schema@.workers", {}),
    "select paused": ("SELECT * FROM @schema@.paused", {}),
    "select schedules": ("SELECT * FROM @schema@.schedules", {}),
    "select schedule_runs": ("SELECT * FROM @schema@.schedule_runs", {}),
    "select schema_version": ("SELECT * FROM @schema@.schema_version", {}),
    "job_get_v1": ("SELECT * FROM @schema@.job_get_v1(1)", {}),
    "select enqueue_bounds": ("SELECT * FROM @schema@.enqueue_bounds", {}),
    # enqueueing (enqueuer, operator)
    "enqueue": ("SELECT @schema@.enqueue('h')", {}),
    "enqueue_many": ('SELECT @schema@.enqueue_many(\'[{"handler": "h"}]\')', {}),
    "enqueue_v2": ("SELECT @schema@.enqueue_v2('h', concurrency_key => 'k')", {}),
    "enqueue_many_v2": ('SELECT @schema@.enqueue_many_v2(\'[{"handler": "h"}]\')', {}),
    # the operator's actions, as the CLI runs them (sql/queries/)
    "cancel": ("query:job_cancel", IDS),
    "retry": ("query:job_retry", {"ids": [1], "queue": None, "handler": None}),
    # (schema 38: a pause names who asked, through paused_add, as the CLI's does)
    "pause": (
        "query:paused_set",
        {"pause": True, "kind": "queue", "name": "q", "comment": None, "requested_by": "ann"},
    ),
    "resume": (
        "query:paused_set",
        {"pause": False, "kind": "queue", "name": "q", "comment": None, "requested_by": None},
    ),
    "drain": (
        "query:worker_request_drain",
        {
            "id": None,
            "host": None,
            "hand_back": False,
            "grace": None,
            "queues": None,
            "handlers": None,
        },
    ),
    "hand back": (
        "query:worker_request_drain",
        {
            "id": None,
            "host": None,
            "hand_back": True,
            "grace": 30.0,
            "queues": None,
            "handlers": None,
        },
    ),
    "resume daemons": ("query:worker_lift_drain", {"id": None, "host": None}),
    "prune": (
        "query:job_prune_finished",
        {
            "completed": 0.0,
            "cancelled": 0.0,
            "dead": 0.0,
            "schedule_runs": 0.0,
            "gone_daemons": 0.0,
            "batch": 10,
        },
    ),
    "prune schedule runs (older releases)": ("SELECT @schema@.schedule_runs_prune('0 s')", {}),
    "set an enqueue bound": (
        "INSERT INTO @schema@.enqueue_bounds (queue, priority_min) VALUES ('q', 0)",
        {},
    ),
    "lift enqueue bounds": ("DELETE FROM @schema@.enqueue_bounds", {}),
    # what no person's role may do
    "rewrite a payload": ("UPDATE @schema@.jobs SET payload = '{}'", {}),
    "rewrite a handler": ("UPDATE @schema@.jobs SET handler = 'x'", {}),
    "rewrite a queue": ("UPDATE @schema@.jobs SET queue = 'x'", {}),
    "rewrite a priority": ("UPDATE @schema@.jobs SET priority = -32768", {}),
    "rewrite a checkpoint": ("UPDATE @schema@.jobs SET checkpoint = '{}'", {}),
    "rewrite a dedupe key": ("UPDATE @schema@.jobs SET dedupe_key = 'x'", {}),
    "rewrite who enqueued": ("UPDATE @schema@.jobs SET enqueued_by = 'x'", {}),
    "bump a lease token": ("UPDATE @schema@.jobs SET lease_token = lease_token + 1", {}),
    "insert a job": ("INSERT INTO @schema@.jobs (handler) VALUES ('h')", {}),
    "truncate jobs": ("TRUNCATE @schema@.jobs", {}),
    "forge a log": (
        "INSERT INTO @schema@.job_logs (job_id, lease_token, attempt, worker)"
        " VALUES (1, 1, 1, 'w')",
        {},
    ),
    "erase attempts": ("DELETE FROM @schema@.attempts", {}),
    "rewrite the registry": ("UPDATE @schema@.workers SET state = 'gone'", {}),
    "drain behind the functions": ("UPDATE @schema@.workers SET drain_requested = true", {}),
    "register a daemon": (
        "INSERT INTO @schema@.workers (id, host, pid, version, slots) VALUES ('x', 'h', 1, '0', 1)",
        {},
    ),
    "unpause behind the functions": ("DELETE FROM @schema@.paused", {}),
    "claim": (
        "SELECT * FROM @schema@.claim('w', '{default}', '{h}', '{30}', '{1}', 1)",
        {},
    ),
    "declare a schedule": ("SELECT @schema@.schedule_declare('s', '{}', 'w')", {}),
    "set the retention floor": ("SELECT @schema@.retention_floor_set(3600)", {}),
    "select retention_floor": ("SELECT * FROM @schema@.retention_floor", {}),
    "fleet retention": ("SELECT @schema@.prune_finished_v1(0, 0, 0, 10)", {}),
    # the registry (schema 24): the daemons' own rows through functions, a cap per login
    "select registry_cap": ("SELECT * FROM @schema@.registry_cap", {}),
    "set the registry cap": ("UPDATE @schema@.registry_cap SET max_live_per_login = 50", {}),
    "register through the function": (
        "SELECT @schema@.worker_register_v2('x', repeat('s', 32), 'h', 1, '0', '{}', '{}', 1,"
        " 'running', '{}', 10)",
        {},
    ),
    "read whether a lease holds": ("SELECT * FROM @schema@.job_lease_state_v1(1, 1)", {}),
    # dependencies and deadlines (schema 27)
    "select job_parents": ("SELECT * FROM @schema@.job_parents", {}),
    "enqueue_v3": ("SELECT @schema@.enqueue_v3('h', timeout => '1 minute')", {}),
    "enqueue_many_v3": (
        'SELECT @schema@.enqueue_many_v3(\'[{"handler": "h", "expire_in": 60}]\')',
        {},
    ),
    # dedupe windows and policies (schema 34)
    "enqueue_v4": (
        "SELECT @schema@.enqueue_v4('h', dedupe_key => 'k', dedupe_window => '1 hour')",
        {},
    ),
    # (job 1 is not held: the call is refused with 22023, which counts as allowed)
    "release a held job": (
        "DO $$ BEGIN PERFORM @schema@.job_held_release(1);"
        " EXCEPTION WHEN invalid_parameter_value THEN NULL; END $$",
        {},
    ),
    # the dashboard's bulk priority change (schema 36; job 1 is pending)
    "set priorities": ("SELECT * FROM @schema@.job_priority_set('{1}', 5)", {}),
    # a handler's default dedupe policy (schema 37)
    "select handler_defaults": ("SELECT * FROM @schema@.handler_defaults", {}),
    "set a handler default": ("SELECT @schema@.handler_default_set('h', 'reject')", {}),
    "claim and end expired jobs": (
        "SELECT * FROM @schema@.claim_jobs_v2('w', '{default}', '{h}', '{30}', '{1}', 1)",
        {},
    ),
}

READS = {
    "select jobs",
    "select attempts",
    "select job_logs",
    "select workers",
    "select paused",
    "select schedules",
    "select schedule_runs",
    "select schema_version",
    "select retention_floor",
    "job_get_v1",
    "select enqueue_bounds",
    "select registry_cap",
    "select job_parents",
    "select handler_defaults",
}
ENQUEUES = {
    "enqueue",
    "enqueue_many",
    "enqueue_v2",
    "enqueue_many_v2",
    "enqueue_v3",
    "enqueue_many_v3",
    "enqueue_v4",
}
ACTIONS = {
    "cancel",
    "retry",
    "pause",
    "resume",
    "drain",
    "hand back",
    "resume daemons",
    "prune",
    "prune schedule runs (older releases)",
    "set an enqueue bound",
    "lift enqueue bounds",
    "declare a schedule",  # schema 22: the operator's, daemons fire what it declared
    "set the retention floor",
    "set the registry cap",
    "release a held job",
    "set priorities",
    "set a handler default",
}
# What roles.sql's header promises each role of people, and nothing else.
PROMISED = {
    "reader": READS,
    "operator": READS | ENQUEUES | ACTIONS,
    "enqueuer": ENQUEUES | {"job_get_v1", "select schema_version"},
}


@pytest.mark.parametrize("kind", list(PROMISED))
def test_each_role_can_do_what_roles_sql_promises_and_no_more(
    roles: dict[str, str],
    schema: str,
    conn: psycopg.Connection,
    kind: str,
) -> None:
    client.enqueue(conn, "h", schema=schema)  # job 1, so that the statements touch a row
    with as_role(roles, schema, kind) as c:
        allowed = {name for name, st in STATEMENTS.items() if may_run(c, schema, *st)}
    assert allowed == PROMISED[kind]
    # the owner can run every statement: a refusal above is about rights, not a typo
    assert {name for name, st in STATEMENTS.items() if may_run(conn, schema, *st)} == set(
        STATEMENTS
    )


# -- roles.sql: no password, ever; runs again ----------------------------------------------


def psql_file(dsn: str, path: Path) -> subprocess.CompletedProcess[str]:
    """The README's way: psql with ON_ERROR_STOP, so a failing statement fails the run."""
    return subprocess.run(
        [
            str(find_server_bindir() / "psql"),
            "-X",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-d",
            dsn,
            "-f",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def role_state(conn: psycopg.Connection, schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT a.rolname, a.rolcanlogin, a.rolpassword IS NULL, r.rolconfig, a.rolsuper,"
        "       a.rolcreaterole, a.rolcreatedb, a.rolbypassrls,"
        "       ARRAY(SELECT b.rolname FROM pg_auth_members m JOIN pg_roles b ON b.oid = m.roleid"
        "              WHERE m.member = a.oid ORDER BY 1), a.rolpassword"
        "  FROM pg_authid a JOIN pg_roles r ON r.oid = a.oid"
        " WHERE a.rolname LIKE %s ORDER BY a.rolname",
        [f"{schema}\\_%"],
    ).fetchall()


def grants(conn: psycopg.Connection, schema: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT c.relname, c.relacl::text FROM pg_class c JOIN pg_namespace n"
        "    ON n.oid = c.relnamespace WHERE n.nspname = %s"
        " UNION ALL SELECT p.oid::regprocedure::text, p.proacl::text FROM pg_proc p"
        "  JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s ORDER BY 1",
        [schema, schema],
    ).fetchall()


@pytest.fixture
def roles_file(conn: psycopg.Connection, schema: str, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "roles.sql"
    path.write_text(render_roles_sql(schema))
    yield path
    existing = [
        r[0]
        for r in conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s)",
            [[f"{schema}_{k}" for k in ROLE_KINDS]],
        )
    ]
    if existing:
        drop_roles(conn, existing)


def test_roles_sql_sets_no_password_and_a_second_run_changes_nothing(
    pg: LocalPostgres, conn: psycopg.Connection, schema: str, test_db_dsn: str, roles_file: Path
) -> None:
    first = psql_file(test_db_dsn, roles_file)
    assert first.returncode == 0, first.stderr
    state = role_state(conn, schema)
    assert [(r[0], r[1], r[2]) for r in state] == [
        (f"{schema}_{k}", True, True) for k in sorted(ROLE_KINDS)
    ]  # LOGIN roles without a password: no password logs in until the admin sets one
    assert not any(r[4] or r[5] or r[6] or r[7] for r in state)  # no other attribute
    members = {r[0]: r[8] for r in state}
    assert members[f"{schema}_operator"] == sorted([f"{schema}_enqueuer", f"{schema}_reader"])
    for placeholder in ("change-me", ""):
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(
                pg.tcp_dsn("pgworkerd_test", user=f"{schema}_operator"),
                password=placeholder or "x",
                passfile="/nonexistent",
            )
    before = grants(conn, schema)

    # the admin sets a password (as roles.sql says); running it again keeps it and adds nothing
    pg.grant_login(f"{schema}_daemon")
    with_password = role_state(conn, schema)
    again = psql_file(test_db_dsn, roles_file)
    assert again.returncode == 0, again.stderr
    assert role_state(conn, schema) == with_password
    assert grants(conn, schema) == before


def test_roles_sql_sets_no_password() -> None:
    text = ROLES_SQL.read_text()
    code = "\n".join(line.split("--")[0] for line in text.splitlines())
    # no CREATE/ALTER ROLE ... PASSWORD of any kind (the word is in messages only)
    assert not re.search(r"\b(CREATE|ALTER)\s+ROLE\b[^;]*\bPASSWORD\b", code.upper())
    assert "ALTER ROLE" in code.upper()  # (the pattern would see them)


@pytest.mark.parametrize("encryption", ["scram-sha-256", "md5"])
def test_roles_sql_refuses_to_go_on_while_a_role_has_the_old_placeholder_password(
    conn: psycopg.Connection, schema: str, test_db_dsn: str, roles_file: Path, encryption: str
) -> None:
    """A role an earlier roles.sql created with 'change-me', stored either way the server
    stores passwords: the script stops at once, names it, and says how to fix it."""
    daemon = f"{schema}_daemon"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(daemon)))
    conn.execute("SELECT set_config('password_encryption', %s, false)", [encryption])
    try:
        conn.execute(sql.SQL("ALTER ROLE {} PASSWORD 'change-me'").format(sql.Identifier(daemon)))
    finally:
        conn.execute("RESET password_encryption")
    stored = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s", [daemon])
    assert stored.fetchone()[0].startswith("md5" if encryption == "md5" else "SCRAM-SHA-256$")
    refused = psql_file(test_db_dsn, roles_file)
    assert refused.returncode == 3
    assert (
        f"ERROR:  pgworkerd: role {daemon} still has the placeholder password 'change-me'"
        " of an earlier roles.sql\n"
        f"HINT:  Set a real one first, in psql: \\password {daemon} (then run this file again)."
    ) in refused.stderr
    created = conn.execute(
        "SELECT rolname FROM pg_roles WHERE rolname LIKE %s ORDER BY 1", [f"{schema}\\_%"]
    ).fetchall()
    assert created == [(daemon,)]  # stopped before anything else
    # a real password (the cluster's), and it goes on
    conn.execute(
        sql.SQL("ALTER ROLE {} PASSWORD 'not-the-placeholder'").format(sql.Identifier(daemon))
    )
    done = psql_file(test_db_dsn, roles_file)
    assert done.returncode == 0, done.stderr
    assert len(role_state(conn, schema)) == len(ROLE_KINDS)


# -- permission errors name a role that has the right ------------------------------------------


def needs_in_cli() -> set[str]:
    """Every `needs=` literal passed to database() in pgworkerd/cli."""
    found = set()
    for path in CLI_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "needs":
                assert isinstance(node.value, ast.Constant), f"{path}: needs must be a literal"
                found.add(node.value.value)
    return found


def test_every_needs_of_the_cli_has_its_roles() -> None:
    used = needs_in_cli()
    assert used and used <= set(ROLES_WITH_RIGHT)
    text = ROLES_SQL.read_text()
    for who in ROLES_WITH_RIGHT.values():
        for name in who:
            assert f"'{name}'" in text, f"{name} is not created by roles.sql"


# needs -> a command that needs exactly it (run by every role named for it)
# A daemon's config with one schedule, for `schedules declare` (the --dsn given wins).
SCHEDULES_CONFIG = Path(tempfile.mkdtemp(prefix="pgworkerd-people-roles-")) / "d.toml"
SCHEDULES_CONFIG.write_text(
    '[handlers.h]\ntarget = "pgworkerd.examples:echo"\n\n'
    '[schedules.s]\nhandler = "h"\nevery = "60s"\n'
)

NEEDS_COMMANDS: dict[str, Callable[[int], list[str]]] = {
    "read jobs": lambda job: ["show", str(job)],
    "read schedules": lambda job: ["schedules"],
    "declare schedules": lambda job: ["--config", str(SCHEDULES_CONFIG), "schedules", "declare"],
    "enqueue jobs": lambda job: ["enqueue", "h"],
    "change jobs": lambda job: ["cancel", str(job)],
    "delete jobs": lambda job: ["prune", "--older-than", "1d"],
    "change the daemons' registry": lambda job: ["resume", "--all"],
    "pause queues and handlers": lambda job: ["pause", "--queue", "q"],
    "signal jobs": lambda job: ["signal", str(job), "go"],
    "set handlers' defaults": lambda job: ["handler-default", "h", "--dedupe-policy", "reject"],
    "read handlers' defaults": lambda job: ["handler-default"],
}


@pytest.mark.parametrize("needs", list(NEEDS_COMMANDS))
def test_every_role_a_permission_error_names_can_run_the_command(
    roles: dict[str, str],
    schema: str,
    conn: psycopg.Connection,
    needs: str,
) -> None:
    named = ROLES_WITH_RIGHT[needs]
    assert named
    if needs == "change the daemons' registry":  # a live daemon to drain and resume
        conn.execute(
            render(
                "INSERT INTO @schema@.workers (id, host, pid, version, slots, state)"
                " VALUES ('h:1:a', 'h', 1, '0', 1, 'running')",
                schema,
            )
        )
    for name in named:
        job = client.enqueue(conn, "h", schema=schema)
        dsn = roles[name.replace("pgworkerd_", f"{schema}_")]
        if needs == "signal jobs":  # an enqueuer signals the jobs its own login enqueued
            with psycopg.connect(dsn, autocommit=True) as own:
                job = client.enqueue(own, "h", schema=schema)
        proc = invoke("--dsn", dsn, "--schema", schema, *NEEDS_COMMANDS[needs](job))
        assert proc.returncode == 0, (name, proc.stdout, proc.stderr)
    # (every role named for reading the schema version reads it: see the statements above)
    assert set(NEEDS_COMMANDS) == set(ROLES_WITH_RIGHT) - {
        "read the schema version",
        "create or upgrade the schema",
    }


# -- job_get_v1 is open to every role: its predicate is the check ---------------------------


@pytest.fixture
def plain_role(pg: LocalPostgres, conn: psycopg.Connection, schema: str) -> Iterator[str]:
    """A role of the application's own making, with only USAGE on the schema; yields its
    name."""
    name = f"{schema}_app"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
    conn.execute(
        sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
            sql.Identifier(schema), sql.Identifier(name)
        )
    )
    pg.grant_login(name)
    yield name
    drop_roles(conn, [name])


def test_get_needs_no_grant_and_shows_a_role_only_what_it_may_read(
    pg: LocalPostgres, conn: psycopg.Connection, schema: str, plain_role: str
) -> None:
    job = client.enqueue(conn, "h", {"secret": 1}, schema=schema)
    dsn = pg.dsn("pgworkerd_test", user=plain_role)
    with psycopg.connect(dsn, autocommit=True) as c:
        assert pgworkerd.get(c, job, schema=schema) is None  # neither its job nor SELECT
    # a role that read jobs with get() before schema 18 (SELECT on the table) still does,
    # with no grant of the new function (an upgrade before roles.sql runs again)
    conn.execute(
        sql.SQL("GRANT SELECT ON {} TO {}").format(
            sql.Identifier(schema, "jobs"), sql.Identifier(plain_role)
        )
    )
    with psycopg.connect(dsn, autocommit=True) as c:
        found = pgworkerd.get(c, job, schema=schema)
        assert found is not None and found.id == job


def test_the_documented_schema_rename_is_what_the_tests_apply(schema: str) -> None:
    """roles.sql's header gives a sed line for another schema; the tests render roles.sql
    for theirs the same way (and then prove the result works)."""
    [line] = [ln for ln in ROLES_SQL.read_text().splitlines() if "| sed '" in ln]
    script = line.split("| sed ", 1)[1].split(" | psql")[0].strip().strip("'")
    renamed = subprocess.run(
        ["sed", script.replace("myschema", schema)],
        input=ROLES_SQL.read_text(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for kind in ROLE_KINDS:
        renamed = renamed.replace(f"pgworkerd_{kind}", f"{schema}_{kind}")
    assert renamed == render_roles_sql(schema)


def test_migrating_as_a_role_of_roles_sql_says_only_the_owner_may(
    roles: dict[str, str],
    schema: str,
) -> None:
    reader = f"{schema}_reader"
    proc = subprocess.run(
        [str(PGWORKERD), "--dsn", roles[reader], "--schema", f"{schema}_new", "migrate"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (4, "")
    assert proc.stderr == (
        f"pgworkerd: permission denied: role {reader!r} cannot create or upgrade the schema"
        " (only the schema's owner may, none of the roles of roles.sql)\n"
    )
