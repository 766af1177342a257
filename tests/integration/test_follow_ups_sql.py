"""Follow-ups atomic with the finish, and the lease in the handler's hands, from SQL
(schema 29: jobs_complete_with_follow_ups, job_complete_with_follow_ups, job_lease_assert):
against a real PostgreSQL, with real concurrent transactions for the races.

- a completion and its follow-ups commit together; a holder whose lease was lost inserts
  nothing, and a completion written twice inserts its follow-ups once;
- a bad follow-up list (not an array, an invalid job, too many, a bound) leaves its own job
  running and held, says why, and touches no other job of the batch;
- job_lease_assert refuses a stale token with SQLSTATE PGWL1 (so the application's
  transaction rolls back), and while it is held no rescue takes the lease, though the
  holder's own renewals go on.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import leasing
import psycopg
import pytest
from daemon_harness import PGWORKERD
from doctext import block_after
from psycopg import sql

from pgworkerd import client
from pgworkerd.queue import explain, finish, lease, views
from pgworkerd.queue.queries import render

WORKER = "host-a:1:aaaa"
RESCUER = "host-b:2:bbbb"


def claim(
    conn: psycopg.Connection, schema: str, worker: str = WORKER, *, lease_seconds: float = 60
) -> list[lease.ClaimedJob]:
    return leasing.claim(
        conn,
        worker,
        queues=["default"],
        handlers={"h": lease.HandlerCapacity(lease_seconds, 10)},
        limit=10,
        schema=schema,
    )


def rows(conn: psycopg.Connection, schema: str, text: str, params: Any = None) -> list[Any]:
    cur = conn.execute(render(text, schema), params)  # type: ignore[arg-type]
    return cur.fetchall() if cur.description else []


def job_count(conn: psycopg.Connection, schema: str) -> int:
    return int(rows(conn, schema, "SELECT count(*) FROM @schema@.jobs")[0][0])


def status(conn: psycopg.Connection, schema: str, job_id: int) -> str:
    return str(
        rows(conn, schema, "SELECT status FROM @schema@.jobs WHERE id = %s", (job_id,))[0][0]
    )


def specs(*handlers: str) -> list[dict[str, Any]]:
    return [
        client.JobSpec(h, {"from": "follow-up", "n": n}).as_json() for n, h in enumerate(handlers)
    ]


def complete_one(
    conn: psycopg.Connection,
    schema: str,
    job: lease.ClaimedJob,
    follow_ups: Any,
    worker: str = WORKER,
    token: int | None = None,
) -> dict[int, lease.FollowUpsOutcome]:
    done = lease.Completion(
        job.id, job.token if token is None else token, {"ok": 1}, None, follow_ups
    )
    return lease.complete_with_follow_ups(conn, worker, [done], schema=schema)


def test_a_completion_inserts_its_follow_ups_in_its_own_transaction(
    conn: psycopg.Connection, schema: str
) -> None:
    parent = client.enqueue(conn, "h", schema=schema)
    [job] = claim(conn, schema)
    out = complete_one(conn, schema, job, specs("next", "other"))
    ids = out[parent].follow_up_ids
    assert out[parent].refused is None and ids is not None and len(ids) == 2
    assert status(conn, schema, parent) == "completed"
    inserted = rows(
        conn,
        schema,
        "SELECT handler, payload, status::text FROM @schema@.jobs WHERE id = ANY(%s) ORDER BY id",
        (ids,),
    )
    assert inserted == [
        ("next", {"from": "follow-up", "n": 0}, "pending"),
        ("other", {"from": "follow-up", "n": 1}, "pending"),
    ]
    # recorded in the handler's order, with the job that inserted them
    assert rows(
        conn,
        schema,
        "SELECT position, follow_up_id FROM @schema@.job_follow_ups WHERE job_id = %s "
        "ORDER BY position",
        (parent,),
    ) == [(1, ids[0]), (2, ids[1])]
    # the follow-ups are inserted by the completion's statement: a failure after them in
    # the same transaction takes both back (one transaction, not two)
    client.enqueue(conn, "h", schema=schema)
    [job2] = claim(conn, schema)
    before = job_count(conn, schema)
    with pytest.raises(psycopg.errors.DivisionByZero), conn.transaction():
        complete_one(conn, schema, job2, specs("next"))
        conn.execute("SELECT 1 / 0")
    assert status(conn, schema, job2.id) == "running" and job_count(conn, schema) == before


@pytest.mark.parametrize("with_a_bad_list", [False, True])
def test_a_batch_of_lists_maps_each_follow_up_to_its_job_in_order(
    conn: psycopg.Connection, schema: str, with_a_bad_list: bool
) -> None:
    """All lists of a batch go in one enqueue (or, when one is refused, job by job): each
    job gets its own follow-ups, in its handler's order."""
    for _ in range(4):
        client.enqueue(conn, "h", schema=schema)
    a, b, lost, c = claim(conn, schema)
    bad: Any = [{"handler": ""}] if with_a_bad_list else None
    done = [
        lease.Completion(a.id, a.token, None, None, specs("a0", "a1")),
        lease.Completion(b.id, b.token, None, None, bad),
        lease.Completion(lost.id, lost.token + 1, None, None, specs("lost")),
        lease.Completion(c.id, c.token, None, None, specs("c0", "c1", "c2")),
    ]
    out = lease.complete_with_follow_ups(conn, WORKER, done, schema=schema)
    assert lost.id not in out
    assert (out[b.id].refused is not None) == with_a_bad_list
    for job, handlers in ((a, ["a0", "a1"]), (c, ["c0", "c1", "c2"])):
        ids = out[job.id].follow_up_ids or []
        got = rows(
            conn,
            schema,
            "SELECT f.position, j.handler FROM @schema@.job_follow_ups f"
            " JOIN @schema@.jobs j ON j.id = f.follow_up_id"
            " WHERE f.job_id = %s ORDER BY f.position",
            (job.id,),
        )
        assert got == list(enumerate(handlers, 1))
        assert [
            h
            for (h,) in rows(
                conn,
                schema,
                "SELECT handler FROM @schema@.jobs WHERE id = ANY(%s) ORDER BY id",
                (ids,),
            )
        ] == handlers
    assert rows(conn, schema, "SELECT count(*) FROM @schema@.jobs WHERE handler = 'lost'") == [(0,)]


def test_follow_ups_that_wait_for_each_other_link_within_their_own_list(
    conn: psycopg.Connection, schema: str
) -> None:
    """A fan-out/fan-in as follow-ups (enqueue_many_v3's after_index: positions in the
    job's own list), two jobs of one batch each with such a list: each stitch waits for
    its own list's segments, not the other list's, and is released when they complete."""
    for _ in range(2):
        client.enqueue(conn, "h", schema=schema)
    a, b = claim(conn, schema)

    def fan(tag: str) -> list[dict[str, Any]]:
        segs = [client.JobSpec("seg", {"of": tag, "n": n}) for n in range(2)]
        stitch = client.JobSpec("stitch", {"of": tag}, after=segs)
        return [dict(j) for j in json.loads(client.jobs_json([*segs, stitch]))]

    done = [
        lease.Completion(a.id, a.token, None, None, fan("a")),
        lease.Completion(b.id, b.token, None, None, fan("b")),
    ]
    out = lease.complete_with_follow_ups(conn, WORKER, done, schema=schema)
    for job in (a, b):
        outcome = out[job.id]
        assert outcome.refused is None and outcome.follow_up_ids is not None
        seg1, seg2, stitch = outcome.follow_up_ids
        assert status(conn, schema, stitch) == "waiting"
        parents = rows(
            conn,
            schema,
            "SELECT parent_id FROM @schema@.job_parents WHERE child_id = %s ORDER BY 1",
            (stitch,),
        )
        assert parents == [(seg1,), (seg2,)]
        assert {status(conn, schema, s) for s in (seg1, seg2)} == {"pending"}
    # a's segments complete: a's stitch is released, b's still waits
    a_seg1, a_seg2, a_stitch = out[a.id].follow_up_ids or []
    segs = rows(conn, schema, "SELECT id FROM @schema@.jobs WHERE handler = 'seg' ORDER BY id")
    held = {
        j.id: j
        for j in leasing.claim(
            conn,
            WORKER,
            queues=["default"],
            handlers={"seg": lease.HandlerCapacity(60, 10)},
            limit=10,
            schema=schema,
        )
    }
    assert set(held) == {i for (i,) in segs}
    for seg in (a_seg1, a_seg2):
        leasing.complete(conn, WORKER, seg, held[seg].token, schema=schema)
    assert status(conn, schema, a_stitch) == "pending"
    assert status(conn, schema, (out[b.id].follow_up_ids or [])[2]) == "waiting"


def test_a_lost_lease_inserts_nothing_and_a_repeated_completion_inserts_once(
    conn: psycopg.Connection, schema: str
) -> None:
    client.enqueue(conn, "h", schema=schema)
    [first] = claim(conn, schema, lease_seconds=0.2)
    wait_expired(conn, schema, first.id)
    [rescued] = claim(conn, schema, RESCUER)  # the claim rescues it: a new token
    assert rescued.id == first.id and rescued.token != first.token
    before = job_count(conn, schema)
    # the first holder's completion, with follow-ups: fenced off, nothing inserted, and it
    # learns no reason (no row at all)
    assert complete_one(conn, schema, first, specs("next")) == {}
    assert job_count(conn, schema) == before and status(conn, schema, first.id) == "running"
    # the new holder's completion inserts them
    out = complete_one(conn, schema, rescued, specs("next"), worker=RESCUER)
    assert len(out[rescued.id].follow_up_ids or []) == 1
    assert job_count(conn, schema) == before + 1
    # written again (the reply was lost, the daemon retries): nothing more
    assert complete_one(conn, schema, rescued, specs("next"), worker=RESCUER) == {}
    assert job_count(conn, schema) == before + 1
    # and the daemon's protocol counts that retry as the earlier write (not fenced off)
    write = finish.OutcomeWrite(
        "complete", rescued.id, rescued.token, "h", follow_ups=specs("next")
    )
    [recorded] = finish.record(conn, RESCUER, [write], schema=schema)
    assert recorded.landed and recorded.earlier
    assert job_count(conn, schema) == before + 1


@contextlib.contextmanager
def lease_lost() -> Iterator[None]:
    """The block raises job_lease_assert's SQLSTATE PGWL1 (pgworkerd's own class)."""
    with pytest.raises(psycopg.Error) as raised:
        yield
    assert raised.value.sqlstate == "PGWL1", raised.value


def wait_expired(conn: psycopg.Connection, schema: str, job_id: int) -> None:
    deadline = time.monotonic() + 30
    while rows(
        conn,
        schema,
        "SELECT locked_until >= clock_timestamp() FROM @schema@.jobs WHERE id = %s",
        (job_id,),
    )[0][0]:
        assert time.monotonic() < deadline, "the lease did not run out"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("follow_ups", "why"),
    [
        ({"handler": "next"}, "follow-ups must be a JSON array of job objects, not a JSON object"),
        ("next", "follow-ups must be a JSON array of job objects, not a JSON string"),
        ([{"handler": "next"}] * 1001, "at most 1000 follow-ups per job, not 1001"),
        ([{"handler": "next"}, 7], "job 2 of 2"),
        ([{"handler": "next"}, {"handler": ""}], "job 2 of 2"),
        ([{"handler": "next", "payload": []}], "job 1 of 1"),
        ([{"handler": "next", "priority": 99999}], "job 1 of 1"),
        ([{"handler": "next", "bogus": 1}], 'unknown key "bogus"'),
        ([{"handler": "next", "run_at": "infinity"}], "job 1 of 1"),
    ],
)
def test_a_bad_follow_up_list_leaves_its_job_held_says_why_and_touches_no_other(
    conn: psycopg.Connection, schema: str, follow_ups: Any, why: str
) -> None:
    for _ in range(3):
        client.enqueue(conn, "h", schema=schema)
    bad, plain, good = claim(conn, schema)
    before = job_count(conn, schema)
    done = [
        lease.Completion(bad.id, bad.token, {"r": 1}, None, follow_ups),
        lease.Completion(plain.id, plain.token, {"r": 2}),
        lease.Completion(good.id, good.token, {"r": 3}, None, specs("next")),
    ]
    out = lease.complete_with_follow_ups(conn, WORKER, done, schema=schema)
    refused = out[bad.id].refused
    assert refused is not None and refused.startswith("follow-ups refused: ") and why in refused
    assert out[bad.id].follow_up_ids is None
    # the bad job is still running under its lease, unchanged; the others completed
    assert rows(
        conn,
        schema,
        "SELECT status::text, locked_by, result FROM @schema@.jobs WHERE id = %s",
        (bad.id,),
    ) == [("running", WORKER, None)]
    assert status(conn, schema, plain.id) == "completed"
    assert status(conn, schema, good.id) == "completed"
    assert job_count(conn, schema) == before + 1  # only the good job's follow-up
    # the daemon's protocol writes it as a failed attempt, saying why (retried)
    write = finish.OutcomeWrite("complete", bad.id, bad.token, "h", follow_ups=follow_ups)
    [recorded] = finish.record(conn, WORKER, [write], schema=schema)
    assert recorded.landed and recorded.kind == "fail" and why in recorded.error
    assert rows(
        conn,
        schema,
        "SELECT status::text, last_error FROM @schema@.jobs WHERE id = %s",
        (bad.id,),
    ) == [("pending", recorded.error)]


def test_a_bound_refuses_a_follow_up_like_an_enqueue(conn: psycopg.Connection, schema: str) -> None:
    rows(
        conn,
        schema,
        "INSERT INTO @schema@.enqueue_bounds (role_name, priority_min, priority_max) "
        "VALUES (NULL, 0, 10)",
    )
    client.enqueue(conn, "h", schema=schema)
    [job] = claim(conn, schema)
    bad = [client.JobSpec("next", priority=-5).as_json()]
    out = complete_one(conn, schema, job, bad)
    assert "priority" in (out[job.id].refused or "")
    assert status(conn, schema, job.id) == "running"


def test_hostile_arguments_are_refused_with_22023_and_change_nothing(
    conn: psycopg.Connection, schema: str
) -> None:
    client.enqueue(conn, "h", schema=schema)
    [job] = claim(conn, schema)
    calls = [
        (
            "SELECT * FROM @schema@.jobs_complete_with_follow_ups(NULL, ARRAY[%s]::bigint[], "
            "ARRAY[%s]::bigint[], ARRAY[NULL]::jsonb[], ARRAY[NULL]::jsonb[], "
            "ARRAY['[]']::jsonb[])",
            "worker must name",
        ),
        (
            "SELECT * FROM @schema@.jobs_complete_with_follow_ups('"
            + WORKER
            + "', ARRAY[%s]::bigint[], "
            "ARRAY[%s]::bigint[], ARRAY[NULL]::jsonb[], ARRAY[NULL]::jsonb[], '{}'::jsonb[])",
            "one element per job",
        ),
        (
            "SELECT * FROM @schema@.job_complete_with_follow_ups(%s, '" + WORKER + "', NULL, NULL, "
            "'[]') WHERE %s IS NOT NULL",
            "token must be",
        ),
        ("SELECT @schema@.job_lease_assert(%s, NULL) WHERE %s IS NOT NULL", "not NULL"),
    ]
    for text, message in calls:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
            rows(conn, schema, text, (job.id, job.token))
    assert status(conn, schema, job.id) == "running"


def test_one_job_function_for_other_languages(conn: psycopg.Connection, schema: str) -> None:
    """The SQL docs/guide/follow-ups.md prints for other languages, as printed: completed
    with its follow-ups; a refused list says why and leaves the job held; a second call
    (or a lost lease) returns no row."""
    text = block_after("guide/follow-ups.md", "sql", "## From other languages")
    code = "\n".join(line for line in text.splitlines() if not line.startswith("--"))
    text = re.sub(r"\$\d", "%s", code.replace("pgworkerd.", "@schema@."))
    for _ in range(2):
        client.enqueue(conn, "h", schema=schema)
    job, bad = claim(conn, schema)
    [(ids, refused)] = rows(
        conn, schema, text, (job.id, WORKER, job.token, '{"r": 1}', json.dumps(specs("next")))
    )
    assert refused is None and len(ids) == 1 and status(conn, schema, job.id) == "completed"
    again = (job.id, WORKER, job.token, None, json.dumps(specs("next")))
    assert rows(conn, schema, text, again) == []
    [(ids, refused)] = rows(conn, schema, text, (bad.id, WORKER, bad.token, None, '"no"'))
    assert ids is None and "must be a JSON array" in refused
    assert status(conn, schema, bad.id) == "running"


# -- the lease in the handler's hands ------------------------------------------------------


def effects_table(conn: psycopg.Connection, schema: str) -> sql.Composable:
    table = sql.Identifier(schema, "effects")
    conn.execute(sql.SQL("CREATE TABLE {} (job_id bigint, by text)").format(table))
    return table


def effects(conn: psycopg.Connection, table: sql.Composable) -> list[tuple[Any, ...]]:
    return conn.execute(sql.SQL("SELECT job_id, by FROM {} ORDER BY by").format(table)).fetchall()


def test_a_stale_holders_write_rolls_back_and_the_new_holders_commits(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    """The race of a paused holder: attempt 1 writes in its own transaction, its lease runs
    out and another worker rescues the job meanwhile; attempt 1's job_lease_assert before
    COMMIT refuses (PGWL1), so its write rolls back; the new holder's write commits."""
    table = effects_table(conn, schema)
    client.enqueue(conn, "h", schema=schema)
    [first] = claim(conn, schema, lease_seconds=0.5)
    with psycopg.connect(test_db_dsn) as app1, psycopg.connect(test_db_dsn) as app2:
        app1.execute(sql.SQL("INSERT INTO {} VALUES (%s, 'attempt 1')").format(table), (first.id,))
        wait_expired(conn, schema, first.id)
        [second] = claim(conn, schema, RESCUER)
        assert second.id == first.id
        # the new holder: assert, write, commit
        rows(app2, schema, "SELECT @schema@.job_lease_assert(%s, %s)", (second.id, second.token))
        app2.execute(sql.SQL("INSERT INTO {} VALUES (%s, 'attempt 2')").format(table), (second.id,))
        app2.commit()
        # the paused holder wakes up and asserts before its COMMIT
        with pytest.raises(psycopg.Error) as raised:
            rows(app1, schema, "SELECT @schema@.job_lease_assert(%s, %s)", (first.id, first.token))
        assert raised.value.sqlstate == "PGWL1"
        assert str(first.token) not in str(raised.value)  # a token is never in an error
        app1.rollback()
    assert effects(conn, table) == [(first.id, "attempt 2")]


def test_an_asserted_lease_is_not_rescued_until_the_transaction_ends_and_renewals_go_on(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    """FOR KEY SHARE: while an application's transaction holds the assert, a claim cannot
    rescue the job even after its lease ran out (it skips the row), and the holder's own
    renewal (one statement for all its leases) is not blocked; after the COMMIT the rescue
    takes it, and the committed write was made under a lease no one else held."""
    table = effects_table(conn, schema)
    client.enqueue(conn, "h", schema=schema)
    [held] = claim(conn, schema, lease_seconds=1)
    with psycopg.connect(test_db_dsn) as app:
        rows(app, schema, "SELECT @schema@.job_lease_assert(%s, %s)", (held.id, held.token))
        app.execute(sql.SQL("INSERT INTO {} VALUES (%s, 'holder')").format(table), (held.id,))
        # the holder renews while the application's transaction is open: not blocked
        with psycopg.connect(test_db_dsn, autocommit=True) as daemon:
            daemon.execute("SET lock_timeout = '2s'")
            [renewed] = lease.renew(
                daemon, WORKER, [lease.Lease(held.id, held.token, 0.3)], schema=schema
            )
            assert renewed.renewed
        wait_expired(conn, schema, held.id)
        assert claim(conn, schema, RESCUER) == []  # held: skipped, not taken
        app.commit()
    [rescued] = claim(conn, schema, RESCUER)
    assert rescued.id == held.id and rescued.token != held.token
    assert effects(conn, table) == [(held.id, "holder")]


def test_an_assert_during_a_rescue_refuses_at_once(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    """The other order: a rescue has the row (its transaction still open); the old holder's
    assert refuses at once (its lease ran out: it does not queue behind the rescue), and
    after the rescue commits, too (the token it names is gone)."""
    client.enqueue(conn, "h", schema=schema)
    [held] = claim(conn, schema, lease_seconds=0.3)
    wait_expired(conn, schema, held.id)
    assert_sql = "SELECT @schema@.job_lease_assert(%s, %s)"
    with psycopg.connect(test_db_dsn) as rescuer, psycopg.connect(test_db_dsn) as app:
        [rescued] = claim(rescuer, schema, RESCUER)  # open: the row locked, re-tokened
        assert rescued.id == held.id
        app.execute("SET lock_timeout = '5s'")
        with lease_lost():
            rows(app, schema, assert_sql, (held.id, held.token))
        app.rollback()
        rescuer.commit()
        with lease_lost():
            rows(app, schema, assert_sql, (held.id, held.token))
        app.rollback()
        rows(app, schema, assert_sql, (rescued.id, rescued.token))  # the new holder's holds


def test_the_assert_refuses_a_finished_job_an_unknown_one_and_a_guessed_token(
    conn: psycopg.Connection, schema: str
) -> None:
    client.enqueue(conn, "h", schema=schema)
    [job] = claim(conn, schema)
    rows(conn, schema, "SELECT @schema@.job_lease_assert(%s, %s)", (job.id, job.token))
    for job_id, token in ((job.id, job.token + 1), (job.id + 1000, job.token)):
        with lease_lost():
            rows(conn, schema, "SELECT @schema@.job_lease_assert(%s, %s)", (job_id, token))
    assert leasing.complete(conn, WORKER, job.id, job.token, schema=schema)
    with lease_lost():
        rows(conn, schema, "SELECT @schema@.job_lease_assert(%s, %s)", (job.id, job.token))


# -- who may do it (docs/operations/trust-boundaries.md) ----------------------------------


def test_the_daemon_enqueues_follow_ups_only_for_a_job_it_holds(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It enqueues follow-up jobs only with the fenced completion of a job it holds (its
    worker, lease token and `running`), in that completion's transaction, each list
    through the enqueue checks and the bounds of its own login: without the job's lease it
    inserts nothing and learns nothing, and a completed job's follow-ups are never
    inserted again."""
    client.enqueue(conn, "h", schema=schema)
    # one job held by another host (the owner claims it as that host's daemon)
    [other] = claim(conn, schema, RESCUER)
    client.enqueue(conn, "h", schema=schema)
    with psycopg.connect(roles[f"{schema}_daemon"], autocommit=True) as daemon:
        [held] = claim(daemon, schema)
        before = job_count(conn, schema)
        tries = [
            (WORKER, other.id, held.token),  # another host's job, a guessed token
            (RESCUER, other.id, held.token),  # in that host's name, still no token
            (WORKER, held.id, held.token + 1),  # its own job, a wrong token
            ("someone-else", held.id, held.token),  # its own token in another name
        ]
        for worker, job_id, token in tries:
            done = lease.Completion(job_id, token, None, None, specs("next"))
            assert lease.complete_with_follow_ups(daemon, worker, [done], schema=schema) == {}
        # and a refused list tells no one but the holder why
        bad = lease.Completion(other.id, held.token, None, None, [{"handler": ""}])
        assert lease.complete_with_follow_ups(daemon, WORKER, [bad], schema=schema) == {}
        assert job_count(conn, schema) == before
        for statement in (
            "INSERT INTO @schema@.jobs (handler) VALUES ('h')",
            "INSERT INTO @schema@.job_follow_ups VALUES (1, 1, 1)",
            'SELECT @schema@.enqueue_many_v2(\'[{"handler": "h"}]\')',
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                rows(daemon, schema, statement)
        # the holder's completion inserts them, once
        out = complete_one(daemon, schema, held, specs("next"))
        assert len(out[held.id].follow_up_ids or []) == 1
        assert complete_one(daemon, schema, held, specs("next")) == {}
        assert job_count(conn, schema) == before + 1
    assert status(conn, schema, other.id) == "running"
    # an application (enqueuer) cannot complete anything, with or without follow-ups
    with (
        psycopg.connect(roles[f"{schema}_enqueuer"], autocommit=True) as app,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        complete_one(app, schema, other, specs("next"), worker=RESCUER)


def test_the_enqueuer_asserts_a_lease_only_with_its_token(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """It can make its own transaction's writes conditional on a job's lease
    (`job_lease_assert`) only with the lease token that job's running attempt was given:
    any other token, a finished job or an unknown id is refused (SQLSTATE `PGWL1`, naming
    no token), and with the token it holds the job's row until that transaction ends (no
    rescue takes the lease meanwhile; keep the transaction short)."""
    client.enqueue(conn, "h", schema=schema)
    client.enqueue(conn, "h", schema=schema)
    held, done = claim(conn, schema, lease_seconds=1)
    assert leasing.complete(conn, WORKER, done.id, done.token, schema=schema)
    assert_sql = "SELECT @schema@.job_lease_assert(%s, %s)"
    with psycopg.connect(roles[f"{schema}_enqueuer"]) as app:
        for job_id, token in (
            (held.id, held.token ^ 1),
            (done.id, done.token),
            (held.id + done.id + 1000, held.token),
        ):
            with pytest.raises(psycopg.Error) as raised:
                rows(app, schema, assert_sql, (job_id, token))
            assert raised.value.sqlstate == "PGWL1"
            assert str(token) not in str(raised.value) and str(held.token) not in str(raised.value)
            app.rollback()
        rows(app, schema, assert_sql, (held.id, held.token))  # holds the row from here
        wait_expired(conn, schema, held.id)
        assert claim(conn, schema, RESCUER) == []  # no rescue while the app's transaction runs
        app.rollback()
    [rescued] = claim(conn, schema, RESCUER)
    assert rescued.id == held.id
    # the reader (a dashboard) may not call it
    with (
        psycopg.connect(roles[f"{schema}_reader"], autocommit=True) as reader,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        rows(reader, schema, assert_sql, (rescued.id, rescued.token))


def test_show_never_prints_a_lease_token(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    """`pgworkerd show` of a running job (text and --json) names no lease token."""
    client.enqueue(conn, "h", schema=schema)
    [job] = claim(conn, schema)
    for extra in ([], ["--json"]):
        out = subprocess.run(
            [str(PGWORKERD), "--dsn", test_db_dsn, "--schema", schema, "show", str(job.id), *extra],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert f"id: {job.id}" in out or f'"id": {job.id}' in out
        assert "lease_token" not in out and str(job.token) not in out


def test_show_and_explain_name_a_jobs_follow_ups_and_their_job(
    conn: psycopg.Connection, schema: str
) -> None:
    parent = client.enqueue(conn, "h", schema=schema)
    [job] = claim(conn, schema)
    ids = complete_one(conn, schema, job, specs("next", "other"))[parent].follow_up_ids or []
    shown = views.job(conn, schema, parent)
    assert shown is not None and shown["follow_ups"] == ids and shown["follow_up_of"] == []
    assert shown["follow_up_statuses"] == {str(i): "pending" for i in ids}
    child = views.job(conn, schema, ids[0])
    assert child is not None and child["follow_up_of"] == [parent] and child["follow_ups"] == []
    why = explain.explain(conn, schema, parent)
    assert why is not None
    [done, then] = why["reasons"]
    assert done["code"] == "completed" and then["code"] == "follow_ups"
    assert then["facts"]["ids"] == ids and f"{ids[0]}, {ids[1]}" in then["message"]
    # a follow-up, once finished, says which completion enqueued it
    rows(
        conn,
        schema,
        "UPDATE @schema@.jobs SET status = 'cancelled', finished_at = now() WHERE id = %s",
        (ids[0],),
    )
    why = explain.explain(conn, schema, ids[0])
    assert why is not None
    assert [r["code"] for r in why["reasons"]] == ["cancelled", "follow_up_of"]
    assert why["reasons"][1]["message"] == f"enqueued by the completion of job {parent}"
