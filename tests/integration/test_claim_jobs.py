"""claim_jobs (migration 0019), the stable claim a worker in another language calls, as
such a worker would call it (SQL text, named arguments): it honours pauses, fleet-wide
limits and per-key limits (the README's old example, claim() v1, did not), refuses bad
arguments with a clear error and claims nothing then, and leaves the calling transaction
with synchronous_commit = on, like every finishing function, so that its COMMIT is
durable whatever the server's default (tests/fault/test_sql_durable_commit.py crashes
the server to prove it)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from doctext import block_after

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate
from pgworkerd.queue.queries import render

CLAIM_JOBS = """
SELECT id, lease_token FROM @schema@.claim_jobs(
    worker => %(worker)s, queues => '{default}', handlers => '{export}',
    lease_seconds => '{300}', free_slots => %(free)s, max_jobs => 10,
    max_running => %(max_running)s, max_running_per_key => %(per_key)s)
"""
# The README's example until schema 19.
CLAIM_V1 = """
SELECT id, lease_token FROM @schema@.claim(%(worker)s, '{default}', '{export}', '{300}',
                                           %(free)s, 10)
"""


def claimed(
    conn: psycopg.Connection,
    schema: str,
    worker: str,
    *,
    free: int = 10,
    max_running: int | None = None,
    per_key: int | None = None,
    text: str = CLAIM_JOBS,
) -> list[int]:
    params = {
        "worker": worker,
        "free": [free],
        "max_running": [max_running],
        "per_key": [per_key],
    }
    return sorted(r[0] for r in conn.execute(render(text, schema), params).fetchall())


def enqueue(conn: psycopg.Connection, schema: str, n: int, key: str | None = None) -> list[int]:
    return [client.enqueue(conn, "export", concurrency_key=key, schema=schema) for _ in range(n)]


@pytest.mark.parametrize("kind", ["queue", "handler"])
def test_a_paused_queue_or_handler_gives_nothing_until_resumed(
    conn: psycopg.Connection, schema: str, kind: str
) -> None:
    [job] = enqueue(conn, schema, 1)
    name = "default" if kind == "queue" else "export"
    conn.execute(render(f"SELECT @schema@.pause_{kind}(%s, 'maintenance')", schema), (name,))
    assert claimed(conn, schema, "w1") == []
    conn.execute(render(f"SELECT @schema@.resume_{kind}(%s)", schema), (name,))
    assert claimed(conn, schema, "w1") == [job]


def test_claim_v1_ignored_the_pause(conn: psycopg.Connection, schema: str) -> None:
    """Why the README's example changed: the old claim hands out a paused queue's job."""
    [job] = enqueue(conn, schema, 1)
    conn.execute(render("SELECT @schema@.pause_queue('default')", schema))
    assert claimed(conn, schema, "w1", text=CLAIM_V1) == [job]


def test_a_fleet_wide_limit_counts_every_worker_s_leases(
    conn: psycopg.Connection, schema: str
) -> None:
    jobs = enqueue(conn, schema, 5)
    assert claimed(conn, schema, "w1", free=1, max_running=2) == jobs[:1]
    # w2 has room for 10, the fleet for one more
    assert claimed(conn, schema, "w2", max_running=2) == jobs[1:2]
    assert claimed(conn, schema, "w3", max_running=2) == []
    # the old claim knew no limits: it takes everything left
    assert claimed(conn, schema, "w4", text=CLAIM_V1) == jobs[2:]


def test_a_per_key_limit_holds_across_workers(conn: psycopg.Connection, schema: str) -> None:
    a = enqueue(conn, schema, 3, key="customer-a")
    b = enqueue(conn, schema, 2, key="customer-b")
    free = enqueue(conn, schema, 1)  # no key: never held back by a per-key limit
    assert claimed(conn, schema, "w1", per_key=1) == sorted([a[0], b[0], free[0]])
    assert claimed(conn, schema, "w2", per_key=1) == []
    # the old claim takes a second job of each key
    assert claimed(conn, schema, "w3", text=CLAIM_V1) == sorted(a[1:] + b[1:])


def test_each_handler_claims_from_its_own_queues(conn: psycopg.Connection, schema: str) -> None:
    export_default = client.enqueue(conn, "export", queue="default", schema=schema)
    export_mail = client.enqueue(conn, "export", queue="mail", schema=schema)
    other = [client.enqueue(conn, "other", queue=q, schema=schema) for q in ("default", "mail")]
    rows = conn.execute(
        render(
            "SELECT id FROM @schema@.claim_jobs(worker => 'w1', queues => '{default,mail}',"
            " handlers => '{export,other}', lease_seconds => '{60,60}', free_slots => '{5,5}',"
            " max_jobs => 10, handler_queues => '[[\"mail\"], null]')",
            schema,
        )
    ).fetchall()
    assert sorted(r[0] for r in rows) == sorted([export_mail, *other])
    assert export_default not in [r[0] for r in rows]


# -- every bad argument: a clear error naming it, and nothing claimed -----------------------

GOOD: dict[str, str] = {
    "worker": "'w1'",
    "queues": "'{default}'",
    "handlers": "'{export}'",
    "lease_seconds": "'{300}'",
    "free_slots": "'{1}'",
    "max_jobs": "1",
}
BAD: list[tuple[str, str]] = [
    ("worker", "NULL"),
    ("worker", "''"),
    ("queues", "NULL"),
    ("queues", "'{default,NULL}'"),
    ("queues", "'{{default},{mail}}'"),
    ("handlers", "NULL"),
    ("handlers", "'{export,export}'"),
    ("handlers", "'{\"\"}'"),
    ("handlers", "'{export,NULL}'"),
    ("lease_seconds", "NULL"),
    ("lease_seconds", "'{}'"),
    ("lease_seconds", "'{300,300}'"),
    ("lease_seconds", "'{0}'"),
    ("lease_seconds", "'{-5}'"),
    ("lease_seconds", "'{NaN}'"),
    ("lease_seconds", "'{Infinity}'"),
    ("lease_seconds", "'{NULL}'"),
    ("free_slots", "'{-1}'"),
    ("free_slots", "'{NULL}'"),
    ("free_slots", "'{1,1}'"),
    ("max_jobs", "NULL"),
    ("max_jobs", "-1"),
    ("handler_max_attempts", "'{0}'"),
    ("handler_max_attempts", "'{1,2}'"),
    ("handler_queues", '\'{"export": ["default"]}\''),
    ("handler_queues", "'[[\"default\"], null]'"),
    ("handler_queues", "'[[1]]'"),
    ("handler_queues", "'[[[\"default\"]]]'"),
    ("handler_queues", "'[\"default\"]'"),
    ("max_running", "'{0}'"),
    ("max_running", "'{}'"),
    ("max_running_per_key", "'{-1}'"),
    ("max_running_per_key", "'{{1}}'"),
]


@pytest.mark.parametrize(("argument", "value"), BAD, ids=[f"{a}={v}" for a, v in BAD])
def test_a_bad_argument_is_refused_by_name_and_claims_nothing(
    conn: psycopg.Connection, schema: str, argument: str, value: str
) -> None:
    [job] = enqueue(conn, schema, 1)
    args = ", ".join(f"{k} => {v}" for k, v in {**GOOD, argument: value}.items())
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        conn.execute(render(f"SELECT * FROM @schema@.claim_jobs({args})", schema))
    assert str(raised.value).startswith(f"pgworkerd: claim_jobs: {argument} must")
    status = conn.execute(
        render("SELECT status::text FROM @schema@.jobs WHERE id = %s", schema), (job,)
    ).fetchone()
    assert status == ("pending",)


def test_nothing_to_claim_for_is_not_an_error(conn: psycopg.Connection, schema: str) -> None:
    enqueue(conn, schema, 1)
    for args in (
        "worker => 'w1', queues => '{}', handlers => '{export}', lease_seconds => '{300}',"
        " free_slots => '{1}', max_jobs => 1",
        "worker => 'w1', queues => '{default}', handlers => '{}', lease_seconds => '{}',"
        " free_slots => '{}', max_jobs => 1",
        "worker => 'w1', queues => '{default}', handlers => '{export}',"
        " lease_seconds => '{300}', free_slots => '{0}', max_jobs => 1",
    ):
        rows = conn.execute(render(f"SELECT * FROM @schema@.claim_jobs({args})", schema))
        assert rows.fetchall() == []


# -- the durable commit: synchronous_commit = on until the caller's COMMIT ------------------

SETUP = """
SELECT id, lease_token FROM @schema@.claim_jobs('w1', '{default}', '{export}', '{300}',
                                                '{1}', 1)
"""
CALLS: dict[str, str] = {
    "claim_jobs": SETUP,
    "renew_lease": "SELECT * FROM @schema@.renew_lease(%(id)s, 'w1', %(token)s, 60)",
    "complete_job": "SELECT @schema@.complete_job(%(id)s, 'w1', %(token)s)",
    "fail_job": "SELECT * FROM @schema@.fail_job(%(id)s, 'w1', %(token)s, 'boom')",
    "release_job": "SELECT @schema@.release_job(%(id)s, 'w1', %(token)s)",
    "snooze_job": "SELECT * FROM @schema@.snooze_job(%(id)s, 'w1', %(token)s, 60)",
    "give_up_job": "SELECT @schema@.give_up_job(%(id)s, 'w1', %(token)s, 'no')",
}


@pytest.mark.parametrize("function", list(CALLS))
def test_each_function_leaves_its_transaction_committing_durably(
    conn: psycopg.Connection, schema: str, function: str
) -> None:
    enqueue(conn, schema, 1)
    params: dict[str, Any] = {}
    if function != "claim_jobs":
        [(params["id"], params["token"])] = conn.execute(render(SETUP, schema)).fetchall()
    conn.execute("SET synchronous_commit = off")  # as a lax server default
    with conn.transaction():
        rows = conn.execute(render(CALLS[function], schema), params).fetchall()
        assert rows not in ([], [(None,)], [(False,)]), rows
        # what the COMMIT will read
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    # for this transaction only: the session's own setting is back after it
    assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)


def test_a_set_clause_would_not_do(conn: psycopg.Connection, schema: str) -> None:
    """The pitfall the functions avoid (0019's header): synchronous_commit in a function's
    SET clause is restored at the function's exit, before the COMMIT reads it."""
    conn.execute(
        render(
            "CREATE FUNCTION @schema@.set_clause_probe() RETURNS void LANGUAGE sql"
            " SET synchronous_commit = on AS 'SELECT'",
            schema,
        )
    )
    with conn.transaction():
        conn.execute("SET LOCAL synchronous_commit = off")
        conn.execute(render("SELECT @schema@.set_clause_probe()", schema))
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)


# -- the docs' example, run as written -------------------------------------------------------------


def test_the_readme_claim_example_runs_as_written(pg: LocalPostgres) -> None:
    claim = block_after("guide/other-languages.md", "sql", "# Other languages")
    assert "claim_jobs(" in claim
    name = f"readme_{uuid.uuid4().hex[:8]}"
    pg.create_database(name)
    try:
        migrate(pg.dsn(name))  # the default schema, as the README has it
        with psycopg.connect(pg.dsn(name), autocommit=True) as c:
            for key in ("img:1", "img:1", "img:2"):
                client.enqueue(c, "resize", {"key": key}, concurrency_key=key)
            rows = c.execute(claim).fetchall()
            # two slots, one job per key: the second job of img:1 waits
            assert [(r[1], r[3]) for r in rows] == [({"key": "img:1"}, 1), ({"key": "img:2"}, 1)]
    finally:
        with psycopg.connect(pg.dsn(), autocommit=True) as c:
            c.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_each_older_claim_says_who_still_calls_it(conn: psycopg.Connection, schema: str) -> None:
    rows = conn.execute(
        "SELECT p.proname, obj_description(p.oid, 'pg_proc') FROM pg_proc p"
        " WHERE p.pronamespace = %s::regnamespace AND p.proname LIKE 'claim%%'",
        (schema,),
    ).fetchall()
    comments = dict(rows)
    assert sorted(comments) == [
        "claim",
        "claim_jobs",
        "claim_jobs_v2",
        "claim_jobs_v3",
        "claim_v2",
        "claim_v3",
        "claim_v4",
    ]
    assert "behind claim_jobs_v3" in comments["claim_v4"]
    assert "expires_at" in comments["claim_jobs_v2"]
    assert "new code calls claim_jobs_v3" in comments["claim_jobs_v2"]
    assert "what the daemon calls" in comments["claim_jobs_v3"]
    assert "release 0.2" in comments["claim"]
    assert "no release" in comments["claim_v2"]
    assert "schemas 9 to 18" in comments["claim_v3"]
    for old in ("claim", "claim_v2", "claim_v3"):
        assert "New code calls claim_jobs" in comments[old], comments[old]
