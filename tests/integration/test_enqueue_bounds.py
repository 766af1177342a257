"""Enqueue bounds (schema 23, issue 22 N11): what an operator allows an enqueuer to ask, per
role and queue (a priority range, prefixes for dedupe and concurrency keys). A refused
enqueue raises a clear error naming the bound and writes nothing, through every enqueue
function; only the operator writes bounds, and a bound that could not work is refused."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from daemon_harness import PGWORKERD
from psycopg import sql
from refusals import refused
from roles_harness import drop_roles

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.queries import render

# One job through each enqueue function, as the enqueuer calls them in SQL. Every
# statement takes the same four values, so a bound refuses each the same way.
ENQUEUE_CALLS = {
    "enqueue": "SELECT @schema@.enqueue('h', queue => %(queue)s, priority => %(priority)s,"
    " dedupe_key => %(dedupe_key)s)",
    "enqueue_v2": "SELECT @schema@.enqueue_v2('h', queue => %(queue)s, priority => %(priority)s,"
    " dedupe_key => %(dedupe_key)s, concurrency_key => %(concurrency_key)s)",
    "enqueue_many": "SELECT @schema@.enqueue_many(jsonb_build_array(jsonb_strip_nulls("
    "jsonb_build_object('handler', 'h', 'queue', %(queue)s::text,"
    " 'priority', %(priority)s::int, 'dedupe_key', %(dedupe_key)s::text))))",
    "enqueue_many_v2": "SELECT @schema@.enqueue_many_v2(jsonb_build_array(jsonb_strip_nulls("
    "jsonb_build_object('handler', 'h', 'queue', %(queue)s::text,"
    " 'priority', %(priority)s::int, 'dedupe_key', %(dedupe_key)s::text,"
    " 'concurrency_key', %(concurrency_key)s::text))))",
}


def job(
    queue: str = "default",
    priority: int = 0,
    dedupe_key: str | None = None,
    concurrency_key: str | None = None,
) -> dict[str, Any]:
    return {
        "queue": queue,
        "priority": priority,
        "dedupe_key": dedupe_key,
        "concurrency_key": concurrency_key,
    }


def enqueue(c: psycopg.Connection, schema: str, function: str, values: dict[str, Any]) -> int:
    row = c.execute(render(ENQUEUE_CALLS[function], schema), values).fetchone()
    assert row is not None
    result = row[0]
    return int(result[0] if isinstance(result, list) else result)


def set_bound(c: psycopg.Connection, schema: str, **bound: Any) -> int:
    """INSERT a bound as `c`'s role; returns its id."""
    names = list(bound)
    row = c.execute(
        sql.SQL("INSERT INTO {} ({}) VALUES ({}) RETURNING id").format(
            sql.Identifier(schema, "enqueue_bounds"),
            sql.SQL(", ").join(map(sql.Identifier, names)),
            sql.SQL(", ").join(sql.Placeholder(n) for n in names),
        ),
        bound,
    ).fetchone()
    assert row is not None
    return int(row[0])


def job_count(conn: psycopg.Connection, schema: str) -> int:
    row = conn.execute(render("SELECT count(*) FROM @schema@.jobs", schema)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def billing(
    pg: LocalPostgres, conn: psycopg.Connection, schema: str, roles: dict[str, str]
) -> Iterator[tuple[str, str]]:
    """An application's own login, a member of the enqueuer role (roles.sql's advice);
    yields its name and DSN."""
    name = f"{schema}_billing"
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
            sql.Identifier(name), sql.Identifier(f"{schema}_enqueuer")
        )
    )
    pg.grant_login(name)
    yield name, pg.dsn("pgworkerd_test").replace("user=postgres", f"user={name}")
    drop_roles(conn, [name])


def connect(dsn: str) -> psycopg.Connection:
    return psycopg.connect(dsn, autocommit=True)


@pytest.mark.parametrize("function", list(ENQUEUE_CALLS))
def test_a_priority_outside_the_bound_is_refused_naming_the_bound_and_writes_nothing(
    roles: dict[str, str], schema: str, conn: psycopg.Connection, function: str
) -> None:
    enqueuer = f"{schema}_enqueuer"
    with connect(roles[f"{schema}_operator"]) as op:
        bound = set_bound(op, schema, role_name=enqueuer, priority_min=0, priority_max=100)
    with connect(roles[enqueuer]) as c:
        enqueue(c, schema, function, job(priority=100))  # the bound's ends are inside
        enqueue(c, schema, function, job(priority=0))
        message = (
            f"pgworkerd: job 1 of 1: priority -32768 is outside 0..100, the priorities enqueue"
            f" bound {bound} (role {enqueuer}, every queue) allows"
        )
        with refused(conn, schema, message) as refusal:
            enqueue(c, schema, function, job(priority=-32768))
    assert refusal.value.diag.message_hint == (
        'An operator sets enqueue bounds in the enqueue_bounds table (README "Trust boundaries").'
    )


@pytest.mark.parametrize("function", ["enqueue", "enqueue_v2", "enqueue_many", "enqueue_many_v2"])
def test_a_dedupe_key_outside_the_prefix_is_refused_even_when_a_live_job_holds_it(
    roles: dict[str, str], schema: str, conn: psycopg.Connection, function: str
) -> None:
    """Before: the enqueuer got the id of another application's live job with that key.
    With a prefix it learns nothing: the call is refused before the key is looked up."""
    enqueuer = f"{schema}_enqueuer"
    theirs = enqueue(conn, schema, "enqueue", job(dedupe_key="welcome:43"))
    with connect(roles[enqueuer]) as c:
        assert enqueue(c, schema, function, job(dedupe_key="welcome:43")) == theirs  # today
        with connect(roles[f"{schema}_operator"]) as op:
            bound = set_bound(op, schema, role_name=enqueuer, dedupe_key_prefix="shop:")
        message = (
            f"pgworkerd: job 1 of 1: dedupe_key must start with 'shop:'"
            f" (enqueue bound {bound} (role {enqueuer}, every queue))"
        )
        with refused(conn, schema, message):
            enqueue(c, schema, function, job(dedupe_key="welcome:43"))
        mine = enqueue(c, schema, function, job(dedupe_key="shop:welcome:43"))
        assert mine != theirs
        assert enqueue(c, schema, function, job()) > 0  # no key: nothing to bound


@pytest.mark.parametrize("function", ["enqueue_v2", "enqueue_many_v2"])
def test_a_concurrency_key_outside_the_prefix_is_refused(
    roles: dict[str, str], schema: str, conn: psycopg.Connection, function: str
) -> None:
    enqueuer = f"{schema}_enqueuer"
    with connect(roles[f"{schema}_operator"]) as op:
        bound = set_bound(op, schema, role_name=enqueuer, concurrency_key_prefix="shop:")
    with connect(roles[enqueuer]) as c:
        before = job_count(conn, schema)
        message = (
            f"pgworkerd: job 1 of 1: concurrency_key must start with 'shop:'"
            f" (enqueue bound {bound} (role {enqueuer}, every queue))"
        )
        with refused(conn, schema, message):
            enqueue(c, schema, function, job(concurrency_key="customer:42"))
        enqueue(c, schema, function, job(concurrency_key="shop:customer:42"))
    assert job_count(conn, schema) == before + 1


def test_one_refused_job_refuses_the_whole_batch_and_is_named(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    enqueuer = f"{schema}_enqueuer"
    with connect(roles[f"{schema}_operator"]) as op:
        set_bound(op, schema, role_name=enqueuer, priority_min=-10)
    batch = [{"handler": "h"}, {"handler": "h", "priority": -10}, {"handler": "h", "priority": -11}]
    with connect(roles[enqueuer]) as c:
        for function in ("enqueue_many", "enqueue_many_v2"):
            with refused(
                conn, schema, match=r"^pgworkerd: job 3 of 3: priority -11 is outside -10\.\.32767"
            ):
                c.execute(
                    render(f"SELECT @schema@.{function}(%s)", schema),
                    [psycopg.types.json.Jsonb(batch)],
                )
    assert job_count(conn, schema) == 0


def test_a_bound_on_a_group_role_binds_its_member_logins_and_a_queue_bound_its_queue_only(
    roles: dict[str, str],
    schema: str,
    conn: psycopg.Connection,
    billing: tuple[str, str],
) -> None:
    name, dsn = billing
    enqueuer = f"{schema}_enqueuer"
    with connect(roles[f"{schema}_operator"]) as op:
        set_bound(op, schema, role_name=enqueuer, priority_min=0)  # every enqueuer
        set_bound(op, schema, role_name=name, queue="payments", priority_max=5)
    with connect(dsn) as c:
        with refused(conn, schema, match=f"role {enqueuer}, every"):
            enqueue(c, schema, "enqueue", job(priority=-1))
        # SET ROLE changes nothing: the login is what is bound
        c.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(enqueuer)))
        with refused(conn, schema, match="priority 6 is outside"):
            enqueue(c, schema, "enqueue", job(queue="payments", priority=6))
        c.execute("RESET ROLE")
        enqueue(c, schema, "enqueue", job(queue="other", priority=6))  # not that queue
        enqueue(c, schema, "enqueue", job(queue="payments", priority=5))
    # both bounds hold at once: the narrowest of each
    with connect(dsn) as c, refused(conn, schema):
        enqueue(c, schema, "enqueue", job(queue="payments", priority=-1))
    # the owner (a superuser here, and no member of the role) is not bound by it
    enqueue(conn, schema, "enqueue", job(priority=-32768))


def test_a_bound_for_every_login_binds_the_owner_too(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    with connect(roles[f"{schema}_operator"]) as op:
        set_bound(op, schema, queue="default", priority_min=0)
    with refused(conn, schema, match="every login, queue 'default'"):
        enqueue(conn, schema, "enqueue", job(priority=-1))
    with connect(roles[f"{schema}_operator"]) as op:
        op.execute(render("DELETE FROM @schema@.enqueue_bounds", schema))
    enqueue(conn, schema, "enqueue", job(priority=-1))


def test_schedules_fired_by_the_daemon_role_are_bound_like_any_enqueue(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    daemon = f"{schema}_daemon"
    with connect(roles[f"{schema}_operator"]) as op:
        set_bound(op, schema, role_name=daemon, priority_min=0)
        # the operator declares the schedule (schema 22); the daemon fires its stored job
        op.execute(
            render(
                "SELECT @schema@.schedule_declare('s',"
                ' \'{"handler": "h", "priority": -5, "every": 1}\', \'operator\')',
                schema,
            )
        )
    # a live daemon (schema 24), at a tick of the schedule
    conn.execute(
        render(
            "INSERT INTO @schema@.workers (id, host, pid, version, slots, state)"
            " VALUES ('w', 'h', 1, '0', 1, 'running')",
            schema,
        )
    )
    with connect(roles[daemon]) as c, refused(conn, schema, match="priority -5 is outside"):
        c.execute(
            render(
                "SELECT * FROM @schema@.schedule_fire_v2('s', date_trunc('second', now()), 'w')",
                schema,
            )
        )
    assert job_count(conn, schema) == 0


@pytest.mark.parametrize("kind", ["enqueuer", "daemon", "reader"])
def test_only_the_operator_writes_bounds_and_the_reader_reads_them(
    roles: dict[str, str], schema: str, conn: psycopg.Connection, kind: str
) -> None:
    with connect(roles[f"{schema}_operator"]) as op:
        set_bound(op, schema, role_name=f"{schema}_enqueuer", priority_min=0)
        op.execute(render("UPDATE @schema@.enqueue_bounds SET priority_min = 1", schema))
    with connect(roles[f"{schema}_{kind}"]) as c:
        for statement in (
            "INSERT INTO @schema@.enqueue_bounds (role_name) VALUES (NULL)",
            "UPDATE @schema@.enqueue_bounds SET priority_min = -32768",
            "DELETE FROM @schema@.enqueue_bounds",
        ):
            with refused(conn, schema):
                c.execute(render(statement, schema))
        read = render("SELECT priority_min FROM @schema@.enqueue_bounds", schema)
        if kind == "reader":
            assert c.execute(read).fetchall() == [(1,)]
        else:
            with refused(conn, schema):
                c.execute(read)


HOSTILE_BOUNDS: dict[str, tuple[dict[str, Any], str]] = {
    "inverted range": ({"priority_min": 10, "priority_max": 5}, "enqueue_bounds_priority_range"),
    "below the priorities": ({"priority_min": -40000}, "enqueue_bounds_priority_range"),
    "above the priorities": ({"priority_max": 40000}, "enqueue_bounds_priority_range"),
    "NULL priority_min": ({"priority_min": None}, "priority_min"),
    "NULL priority_max": ({"priority_max": None}, "priority_max"),
    "empty dedupe prefix": ({"dedupe_key_prefix": ""}, "enqueue_bounds_dedupe_key_prefix"),
    "huge dedupe prefix": ({"dedupe_key_prefix": "x" * 65}, "enqueue_bounds_dedupe_key_prefix"),
    "control character in a prefix": (
        {"concurrency_key_prefix": "a\x1b[2J"},
        "enqueue_bounds_concurrency_key_prefix",
    ),
    "huge concurrency prefix": (
        {"concurrency_key_prefix": "x" * 10_000},
        "enqueue_bounds_concurrency_key_prefix",
    ),
    "a queue no job can have": ({"queue": " padded"}, "enqueue_bounds_queue_name"),
    "a role that does not exist": ({"role_name": "no_such_role"}, "enqueue_bounds_role_exists"),
    "a huge comment": ({"comment": "x" * 501}, "enqueue_bounds_comment"),
}


@pytest.mark.parametrize("case", list(HOSTILE_BOUNDS))
def test_a_bound_that_could_not_work_is_refused(
    roles: dict[str, str], schema: str, conn: psycopg.Connection, case: str
) -> None:
    values, named = HOSTILE_BOUNDS[case]
    bound = {"role_name": f"{schema}_enqueuer", **values}
    with (
        connect(roles[f"{schema}_operator"]) as op,
        pytest.raises(
            (psycopg.errors.CheckViolation, psycopg.errors.NotNullViolation), match=named
        ),
    ):
        set_bound(op, schema, **bound)
    assert conn.execute(
        render("SELECT count(*) FROM @schema@.enqueue_bounds", schema)
    ).fetchone() == (0,)


def test_a_second_bound_for_the_same_role_and_queue_is_refused_and_who_set_it_cannot_be_forged(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    operator = f"{schema}_operator"
    with connect(roles[operator]) as op:
        set_bound(op, schema, role_name=None, queue=None, priority_min=0)
        with pytest.raises(psycopg.errors.UniqueViolation):
            set_bound(op, schema, role_name=None, queue=None, priority_min=5)
        with refused(conn, schema):
            set_bound(op, schema, queue="q", set_by="someone else")
        with refused(conn, schema):
            op.execute(render("UPDATE @schema@.enqueue_bounds SET set_by = 'x'", schema))
    rows = conn.execute(render("SELECT set_by, priority_min FROM @schema@.enqueue_bounds", schema))
    assert rows.fetchall() == [(operator, 0)]


def test_a_dropped_role_leaves_its_bound_harmless(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """A bound naming a role dropped later must not break every enqueue (pg_has_role of a
    missing name would raise)."""
    gone = f"{schema}_gone"
    conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(gone)))
    with connect(roles[f"{schema}_operator"]) as op:
        set_bound(op, schema, role_name=gone, priority_min=0)
    conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(gone)))
    with connect(roles[f"{schema}_enqueuer"]) as c:
        enqueue(c, schema, "enqueue", job(priority=-5))


def test_the_cli_says_which_bound_refused_the_job(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """Not "permission denied: role cannot enqueue jobs" (the role may): the bound."""
    enqueuer = f"{schema}_enqueuer"
    with connect(roles[f"{schema}_operator"]) as op:
        bound = set_bound(op, schema, role_name=enqueuer, priority_min=0)
    proc = subprocess.run(
        [
            str(PGWORKERD),
            "--dsn",
            roles[enqueuer],
            "--schema",
            schema,
            "enqueue",
            "h",
            "--priority",
            "-5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (proc.returncode, proc.stdout) == (4, "")
    assert proc.stderr == (
        f"pgworkerd: job 1 of 1: priority -5 is outside 0..32767, the priorities"
        f" enqueue bound {bound} (role {enqueuer}, every queue) allows\n"
    )
    assert job_count(conn, schema) == 0
