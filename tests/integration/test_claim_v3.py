"""claim_jobs_v3 (schema 31), the daemon's claim, as a worker in any language calls it: its
handlers as JSON objects, each checked (a bad one raises 22023 saying what and why, and
nothing is claimed or changed), each key doing what claim_jobs' argument of that name
does; and the rows it returns: claim_jobs_v2's columns plus what woke a job and a batch
callback's batch, each row with its own. A real daemon starts a resumed job and a
callback from the claim alone: no statement of it reads signals or batches after the
claim (pg_stat_statements on a private cluster)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import leasing
import psycopg
import pytest
from daemon_harness import Daemons, Db
from psycopg.rows import dict_row

import pgworkerd
from pgworkerd import bounds, client, signals
from pgworkerd.client import JobSpec
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue import lease
from pgworkerd.queue.migrate import migrate
from pgworkerd.queue.queries import render

CLAIM = "SELECT * FROM @schema@.claim_jobs_v3(%s, %s, %s, %s)"
ONE = {"name": "h", "lease_seconds": 60, "free": 10}


def claim_v3(
    conn: psycopg.Connection,
    schema: str,
    handlers: Any,
    *,
    worker: Any = "w1",
    queues: Any = ("default",),
    max_jobs: Any = 10,
) -> list[dict[str, Any]]:
    """claim_jobs_v3 called as SQL text with these arguments (`handlers` as JSON text, or
    any value to pass as it is)."""
    text = handlers if isinstance(handlers, str) or handlers is None else json.dumps(handlers)
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            render(CLAIM, schema),
            (worker, None if queues is None else list(queues), max_jobs, text),
        ).fetchall()


def status_of(conn: psycopg.Connection, schema: str, job_id: int) -> tuple[Any, ...]:
    row = conn.execute(
        render("SELECT status::text, attempts FROM @schema@.jobs WHERE id = %s", schema),
        (job_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


# -- every bad argument: 22023 saying what and why, nothing claimed, nothing changed --------

WIDE = [{**ONE, "name": f"h{n}"} for n in range(1001)]
BAD: list[tuple[str, dict[str, Any], str]] = [
    ("worker NULL", {"worker": None}, "worker must name this worker"),
    ("worker empty", {"worker": ""}, "worker must name this worker"),
    ("queues NULL", {"queues": None}, "queues must be an array of queue names"),
    ("queues with NULL", {"queues": ["default", None]}, "queues must be an array"),
    ("1001 queues", {"queues": [f"q{n}" for n in range(1001)]}, "at most 1000 queues"),
    ("max_jobs NULL", {"max_jobs": None}, "max_jobs must be 0 or more"),
    ("max_jobs negative", {"max_jobs": -1}, "max_jobs must be 0 or more"),
    ("handlers NULL", {"handlers": None}, "handlers must be a JSON array"),
    ("handlers an object", {"handlers": {"h": ONE}}, "handlers must be a JSON array"),
    ("1001 handlers", {"handlers": WIDE}, "at most 1000 handlers, not 1001"),
    ("a handler not an object", {"handlers": [ONE, "h2"]}, 'handlers[1] "h2": each handler'),
    (
        "a misspelt key",
        {"handlers": [{**ONE, "max_runing": 1}]},
        "unknown key(s) 'max_runing': a handler object takes name, lease_seconds",
    ),
    ("no name", {"handlers": [{"lease_seconds": 60, "free": 1}]}, '"name" must be'),
    ("empty name", {"handlers": [{**ONE, "name": ""}]}, '"name" must be'),
    ("name a number", {"handlers": [{**ONE, "name": 5}]}, '"name" must be'),
    ("no lease", {"handlers": [{"name": "h", "free": 1}]}, '"lease_seconds" must be'),
    ("lease 0", {"handlers": [{**ONE, "lease_seconds": 0}]}, '"lease_seconds" must be'),
    ("lease negative", {"handlers": [{**ONE, "lease_seconds": -5}]}, '"lease_seconds" must'),
    ("lease a string", {"handlers": [{**ONE, "lease_seconds": "60"}]}, '"lease_seconds" must'),
    ("lease > 100 y", {"handlers": [{**ONE, "lease_seconds": 4e9}]}, '"lease_seconds" must be'),
    ("no free", {"handlers": [{"name": "h", "lease_seconds": 60}]}, '"free" must be'),
    ("free negative", {"handlers": [{**ONE, "free": -1}]}, '"free" must be'),
    ("free fractional", {"handlers": [{**ONE, "free": 1.5}]}, '"free" must be'),
    ("free absurd", {"handlers": [{**ONE, "free": 1e300}]}, '"free" must be'),
    ("free a string", {"handlers": [{**ONE, "free": "2"}]}, '"free" must be'),
    ("max_attempts 0", {"handlers": [{**ONE, "max_attempts": 0}]}, '"max_attempts" must be'),
    ("max_attempts text", {"handlers": [{**ONE, "max_attempts": "3"}]}, '"max_attempts" must'),
    ("queues a string", {"handlers": [{**ONE, "queues": "default"}]}, '"queues" must be null'),
    ("queues of numbers", {"handlers": [{**ONE, "queues": [1]}]}, '"queues" must be null'),
    (
        "1001 handler queues",
        {"handlers": [{**ONE, "queues": [f"q{n}" for n in range(1001)]}]},
        '"queues" must be null',
    ),
    ("max_running 0", {"handlers": [{**ONE, "max_running": 0}]}, '"max_running" must be'),
    ("max_running true", {"handlers": [{**ONE, "max_running": True}]}, '"max_running" must'),
    (
        "per key beyond int4",
        {"handlers": [{**ONE, "max_running_per_key": 1e10}]},
        '"max_running_per_key" must be',
    ),
    (
        "per key negative",
        {"handlers": [{**ONE, "max_running_per_key": -1}]},
        '"max_running_per_key" must be',
    ),
    ("a name twice", {"handlers": [ONE, ONE]}, "handlers must name each handler once, not h, h"),
    # What a jsonpath test in lax mode would take for a good value, were it not written
    # against it (0043: the claim tests well-formed handlers with one jsonpath first):
    # an array where a number, a string or an object is wanted, a handler in an array.
    ("a handler in an array", {"handlers": [ONE, [ONE]]}, "each handler must be a JSON object"),
    ("free in an array", {"handlers": [{**ONE, "free": [5]}]}, '"free" must be'),
    ("lease in an array", {"handlers": [{**ONE, "lease_seconds": [60]}]}, '"lease_seconds"'),
    ("name in an array", {"handlers": [{**ONE, "name": ["h"]}]}, '"name" must be'),
    ("max_attempts []", {"handlers": [{**ONE, "max_attempts": []}]}, '"max_attempts" must'),
    ("queues [null]", {"handlers": [{**ONE, "queues": [None]}]}, '"queues" must be null'),
    ("queues nested", {"handlers": [{**ONE, "queues": [["a"]]}]}, '"queues" must be null'),
    ("fair in an array", {"handlers": [{**ONE, "fair": [True]}]}, '"fair" must be null'),
    ("weights an array", {"handlers": [{**ONE, "weights": [{"a": 1}]}]}, '"weights" must be'),
    ("rate in an array", {"handlers": [{**ONE, "rate": [1]}]}, '"rate" must be null'),
    ("rate 0", {"handlers": [{**ONE, "rate": 0}]}, '"rate" must be null'),
    ("rate per key > 1e6", {"handlers": [{**ONE, "rate_per_key": 1e7}]}, '"rate_per_key" must'),
    (
        "a misspelt key among good ones",
        {"handlers": [ONE, {**ONE, "name": "h2", "max_attempts": 3, "fiar": True}]},
        "unknown key(s) 'fiar'",
    ),
]


@pytest.mark.parametrize(("case", "arguments", "says"), BAD, ids=[b[0] for b in BAD])
def test_a_bad_argument_is_refused_saying_what_and_changes_nothing(
    conn: psycopg.Connection, schema: str, case: str, arguments: dict[str, Any], says: str
) -> None:
    job = client.enqueue(conn, "h", schema=schema)
    # a job past its deadline: a claim that ran would end it (expired) before claiming
    expired = client.enqueue(conn, "h", schema=schema)
    conn.execute(
        render(
            "UPDATE @schema@.jobs SET expires_at = now() - interval '1 s' WHERE id = %s", schema
        ),
        (expired,),
    )
    kwargs = {"handlers": [ONE], **arguments}
    with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
        claim_v3(conn, schema, **kwargs)
    message = str(raised.value).splitlines()[0]
    assert message.startswith("pgworkerd: claim_jobs_v3: "), message
    assert says in message, message
    assert status_of(conn, schema, job) == ("pending", 0)
    assert status_of(conn, schema, expired) == ("pending", 0)


def test_nothing_to_claim_for_is_not_an_error(conn: psycopg.Connection, schema: str) -> None:
    client.enqueue(conn, "h", schema=schema)
    assert claim_v3(conn, schema, []) == []
    assert claim_v3(conn, schema, [ONE], queues=[]) == []
    assert claim_v3(conn, schema, [{**ONE, "free": 0}]) == []
    assert claim_v3(conn, schema, [ONE], max_jobs=0) == []


@pytest.mark.parametrize("handler", [ONE, {**ONE, "rate": 1000}], ids=["plain", "rate-limited"])
@pytest.mark.parametrize("kind", ["pending", "running"])
def test_an_expired_job_ends_before_the_claim_and_is_never_started(
    conn: psycopg.Connection, schema: str, handler: dict[str, Any], kind: str
) -> None:
    """Since 0043 the claim ends expired jobs only when it finds one: it must find each
    kind alone (a pending job past its deadline; a running one whose lease ran out after
    it), whichever claim follows (claim_v3, or claim_v4 for a rate-limited handler)."""
    expired = client.enqueue(conn, "h", schema=schema)
    past = "expires_at = now() - interval '1 s'"
    if kind == "running":
        [claimed] = claim_v3(conn, schema, [ONE])
        assert claimed["id"] == expired
        past += ", locked_until = now() - interval '1 s'"
    conn.execute(render(f"UPDATE @schema@.jobs SET {past} WHERE id = %s", schema), (expired,))
    due = client.enqueue(conn, "h", schema=schema)
    assert [r["id"] for r in claim_v3(conn, schema, [handler])] == [due]
    row = conn.execute(
        render("SELECT status::text, last_error FROM @schema@.jobs WHERE id = %s", schema),
        (expired,),
    ).fetchone()
    assert row is not None and row[0] == "cancelled"
    assert row[1].startswith(
        "expired: its lease ran out after its expires_at"
        if kind == "running"
        else "expired: not started by its expires_at "
    )


# -- each key does what claim_jobs' argument of that name does -------------------------------


def test_each_handler_key_is_applied(conn: psycopg.Connection, schema: str) -> None:
    mail = client.enqueue(conn, "send", queue="mail", schema=schema)
    client.enqueue(conn, "send", queue="default", schema=schema)
    queues = ["default", "mail"]
    send = {"name": "send", "lease_seconds": 120, "free": 5, "queues": ["mail"]}
    [row] = claim_v3(conn, schema, [{**send, "max_attempts": 9}], queues=queues)
    assert (row["id"], row["queue"], row["max_attempts"]) == (mail, "mail", 9)
    lease_left = conn.execute("SELECT %s - now()", (row["locked_until"],)).fetchone()
    assert lease_left is not None and 110 < lease_left[0].total_seconds() <= 120

    # max_running: fleet-wide, across workers; max_running_per_key: per key
    for key in ("a", "a", "b"):
        client.enqueue(conn, "export", concurrency_key=key, schema=schema)
    export = {"name": "export", "lease_seconds": 60, "free": 5, "max_running_per_key": 1}
    first = claim_v3(conn, schema, [export], worker="w1")
    assert sorted(r["handler"] for r in first) == ["export", "export"]  # one of "a", "b"
    assert claim_v3(conn, schema, [export], worker="w2") == []
    client.enqueue(conn, "export", schema=schema)
    assert claim_v3(conn, schema, [{**export, "max_running": 2}], worker="w3") == []
    [free] = claim_v3(conn, schema, [{**export, "max_running": 3}], worker="w3")
    assert free["handler"] == "export"


def test_an_optional_key_given_as_null_is_one_left_out(
    conn: psycopg.Connection, schema: str
) -> None:
    """docs/guide/other-languages.md: absent or null is "none" for the optional keys. A
    worker in another language may send null (before schema 41 each such key failed the
    claim: "cannot cast jsonb null to type integer"), also beside a handler that sets it."""
    nulls = dict.fromkeys(
        ("max_attempts", "queues", "max_running", "max_running_per_key", "fair", "weights",
         "rate", "rate_per_key"),
    )  # fmt: skip
    jobs = [client.enqueue(conn, "h", schema=schema) for _ in range(2)]
    other = client.enqueue(conn, "other", schema=schema)
    limited = {"name": "other", "lease_seconds": 60, "free": 1, "max_running": 5, "rate": 100}
    rows = claim_v3(conn, schema, [{**ONE, **nulls}, limited])
    assert sorted(r["id"] for r in rows) == sorted([*jobs, other])


# -- what comes with each claimed job ---------------------------------------------------------


def test_one_claim_gives_each_job_its_own_parents_wakeup_and_batch(
    conn: psycopg.Connection, schema: str
) -> None:
    def hold(handler: str) -> list[lease.ClaimedJob]:
        served = {handler: lease.HandlerCapacity(lease_seconds=60, free=1000)}
        return leasing.claim(
            conn, "w0", queues=["default"], handlers=served, limit=1000, schema=schema
        )

    # a job whose wait a signal ends, and one whose wait times out
    woken, timed_out = (client.enqueue(conn, "h", schema=schema) for _ in range(2))
    for job in hold("h"):
        timeout = 3600 if job.id == woken else 0.1
        lease.suspend(conn, "w0", job.id, job.token, "go", timeout, schema=schema)
    time.sleep(0.2)
    assert lease.waits_expire(conn, schema=schema) == 1
    assert signals.signal(conn, woken, "go", [1, 2], schema=schema).outcome == "resumed"
    # a parent and its child, a batch of 101 members and its callback: the parent and the
    # members run (handler p) and complete, which releases the child and the callback
    parent = client.enqueue(conn, "p", schema=schema)
    [child] = client.enqueue_many(conn, [JobSpec("h", after=[parent])], schema=schema)
    batch = pgworkerd.batch(
        conn, [JobSpec("p", {"n": n}) for n in range(101)], then=JobSpec("h"), schema=schema
    )
    for job in hold("p"):
        leasing.complete(conn, "w0", job.id, job.token, {"done": job.id}, schema=schema)
    plain = client.enqueue(conn, "h", schema=schema)

    rows = {r["id"]: r for r in claim_v3(conn, schema, [ONE], max_jobs=100)}
    assert set(rows) == {woken, timed_out, child, batch.callback_id, plain}
    extras = ("parents", "wait_for", "wait_ended", "signal_payload", "signal_sent_at", "batch")
    assert [rows[plain][k] for k in extras] == [None] * 6
    assert rows[child]["parents"] == {str(parent): {"done": parent}}
    assert [rows[child][k] for k in extras[1:]] == [None] * 5
    w = rows[woken]
    assert (w["wait_for"], w["wait_ended"], w["signal_payload"]) == ("go", "signal", [1, 2])
    assert w["signal_sent_at"] is not None and w["parents"] is None and w["batch"] is None
    t = rows[timed_out]
    assert [t[k] for k in extras] == [None, "go", "timeout", None, None, None]
    seen = rows[batch.callback_id]["batch"]
    assert (seen["id"], seen["members"], seen["completed"]) == (batch.batch_id, 101, 101)
    assert (seen["dead"], seen["cancelled"], seen["outcomes_complete"]) == (0, 0, False)
    assert len(seen["outcomes"]) == bounds.BATCH_OUTCOMES
    assert [o["id"] for o in seen["outcomes"]] == sorted(batch.member_ids)[:100]
    first = seen["outcomes"][0]
    assert first == {
        "id": first["id"],
        "status": "completed",
        "result": {"done": first["id"]},
        "error": None,
    }
    assert [rows[batch.callback_id][k] for k in extras[:5]] == [None] * 5


def test_the_claim_commits_durably(conn: psycopg.Connection, schema: str) -> None:
    client.enqueue(conn, "h", schema=schema)
    conn.execute("SET synchronous_commit = off")  # as a lax server default
    with conn.transaction():
        assert len(claim_v3(conn, schema, [ONE])) == 1
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)


# -- the daemon: a resumed job and a callback start from the claim alone --------------------


def test_the_daemon_reads_nothing_after_a_claim(tmp_path: Path) -> None:
    """pg_stat_statements counts each statement the daemon sends (top level): the claim
    reads what woke a job and a callback's batch, and no other statement reads signals
    or batches; the handlers see both (job.signal, job.batch)."""
    settings = {"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track": "top"}
    with LocalPostgres(settings=settings) as pg:
        dsn = pg.dsn()
        migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements SCHEMA public")
            db = Db.prepare(conn, "pgworkerd")
            daemons = Daemons(tmp_path, dsn, "pgworkerd")
            try:
                daemons.start(
                    {
                        "approver": {"target": "waithandlers:wait_once"},
                        "work": {"target": "jobhandlers:work"},
                        "seen": {"target": "jobhandlers:batch_seen"},
                    },
                    {"slots": 3},
                )
                waiting = db.enqueue("approver", {"name": "approval"}, max_attempts=1)
                db.wait_status(waiting, "suspended")
                conn.execute("SELECT public.pg_stat_statements_reset()")
                signals.signal(conn, waiting, "approval", {"by": "ana"})
                ids = pgworkerd.batch(
                    conn, [JobSpec("work", {"result": n}) for n in range(3)], then=JobSpec("seen")
                )
                resumed = db.wait_status(waiting, "completed", "dead")
                callback = db.wait_status(ids.callback_id, "completed", "dead")
            finally:
                daemons.stop_all()
            assert resumed["status"] == "completed", resumed["last_error"]
            assert resumed["result"]["signal"]["payload"] == {"by": "ana"}
            assert callback["status"] == "completed", callback["last_error"]
            seen = callback["result"]["batch"]
            assert (seen["members"], seen["completed"]) == (3, 3)
            assert sorted(o["result"] for o in seen["outcomes"]) == [0, 1, 2]
            ran = conn.execute(
                "SELECT query, calls FROM public.pg_stat_statements s"
                " JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = current_database()"
            ).fetchall()
    claims = [calls for query, calls in ran if "claim_jobs_v3(" in query]
    assert claims and sum(claims) >= 2  # the resumed job's claim and the callback's
    readers = [
        query
        for query, _ in ran
        if "claim_jobs_v3(" not in query
        and re.search(r"\b(signals|batches|wait_ended)\b", query)
        and "signal_send" not in query  # (this test's own signal)
    ]
    assert readers == [], readers


def test_the_claim_is_not_planned_anew_at_every_call() -> None:
    """Schema 42: PostgreSQL re-planned the claim's last statement (the claimed rows read
    through an array of ids) at every call, a custom plan each time, 0.45 ms of an idle
    claim; claim_jobs_v3 now keeps generic plans. pg_stat_statements (nested statements,
    planning tracked) on a private cluster counts the plans of each of its statements
    over 12 claims of one job each in one session."""
    settings = {
        "shared_preload_libraries": "pg_stat_statements",
        "pg_stat_statements.track": "all",
        "pg_stat_statements.track_planning": "on",
    }
    with LocalPostgres(settings=settings) as pg:
        dsn = pg.dsn()
        migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements SCHEMA public")
            conn.execute("SELECT public.pg_stat_statements_reset()")
            for n in range(12):
                client.enqueue(conn, "h", {"n": n})
                rows = conn.execute(
                    render(CLAIM, "pgworkerd"), ("w1", ["default"], 1, json.dumps([ONE]))
                ).fetchall()
                assert len(rows) == 1
            planned = conn.execute(
                "SELECT query, calls, plans FROM public.pg_stat_statements"
                " WHERE query LIKE '%%FROM unnest(claimed_ids, claimed_rescued)%%'"
            ).fetchall()
    assert len(planned) == 1 and planned[0][1] == 12, planned
    assert planned[0][2] <= 6, f"planned {planned[0][2]} times in 12 calls"


def test_a_claim_planned_on_an_empty_queue_reads_a_backlog_through_its_indexes(
    conn: psycopg.Connection, schema: str
) -> None:
    """Schema 43: a daemon's first claims on an empty, vacuumed queue made plans that were
    then kept (0042) and, once a backlog came, read every job at every claim (seq scans,
    and the `buried` join from the whole table): a claim of 40 took 33 ms instead of 3.
    The plans are made here on an empty table, then 3,000 jobs come; auto_explain (in
    this session only) shows each statement of the next claim: none reads jobs other
    than through an index, and no read of jobs returns more rows than the claim wants."""
    conn.execute(render("VACUUM ANALYZE @schema@.jobs", schema))
    for _ in range(6):
        assert claim_v3(conn, schema, [ONE]) == []
    conn.execute(
        render(
            "INSERT INTO @schema@.jobs (queue, handler, payload)"
            " SELECT 'default', 'h', '{}' FROM generate_series(1, 3000)",
            schema,
        )
    )
    plans: list[str] = []
    conn.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_nested_statements = on",
        "SET auto_explain.log_analyze = on",
        "SET client_min_messages = log",
    ):
        conn.execute(setting)
    try:
        assert len(claim_v3(conn, schema, [ONE])) == 10
    finally:
        conn.execute("RESET client_min_messages")
        conn.execute("SET auto_explain.log_min_duration = -1")
    text = "\n".join(plans)
    assert "claim_v3" in text and "jobs_pending_order_idx" in text, text[:2000]
    assert not re.search(r"Seq Scan on jobs", text), text
    reads = re.findall(r"Scan[^\n]* on jobs \w+ .*actual time=[\d.]+\.\.[\d.]+ rows=(\d+)", text)
    assert reads and max(map(int, reads)) <= 10, (reads, text)
