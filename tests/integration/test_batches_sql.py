"""Batches in SQL (schema 30, docs/guide/batches.md): batch_enqueue inserts members and a
waiting callback in one transaction; each member's final status counts in its own
transaction and the last one releases the callback, exactly once, whoever finishes it and
in whatever order concurrent finishers commit; hostile input is refused with 22023 and
inserts nothing; retention keeps members until the callback has finished and prunes the
batch whole. The daemons' side: tests/acceptance/test_batches.py."""

from __future__ import annotations

import json
import threading
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pgworkerd.queue.queries import render


def sql(conn: psycopg.Connection, schema: str, text: str, *params: Any) -> list[tuple[Any, ...]]:
    cur = conn.execute(render(text, schema), params)  # type: ignore[arg-type]
    return cur.fetchall() if cur.description else []


def batch(
    conn: psycopg.Connection, schema: str, jobs: Any, then: Any = None
) -> tuple[int, int, list[int]]:
    then = {"handler": "collect"} if then is None else then
    [(bid, cid, ids)] = sql(
        conn,
        schema,
        "SELECT * FROM @schema@.batch_enqueue(%s::jsonb, %s::jsonb)",
        json.dumps(jobs),
        json.dumps(then),
    )
    return bid, cid, list(ids)


def status(conn: psycopg.Connection, schema: str, job_id: int) -> str:
    [(s,)] = sql(conn, schema, "SELECT status::text FROM @schema@.jobs WHERE id = %s", job_id)
    return str(s)


def counts(conn: psycopg.Connection, schema: str, batch_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            render("SELECT * FROM @schema@.batches WHERE id = %s", schema), (batch_id,)
        ).fetchone()
    assert row is not None
    return row


def finish(conn: psycopg.Connection, schema: str, job_id: int, how: str = "completed") -> None:
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET status = %s::@schema@.job_status, finished_at = now(), "
        "result = CASE WHEN %s = 'completed' THEN jsonb_build_object('n', id) END "
        "WHERE id = %s",
        how,
        how,
        job_id,
    )


def test_the_callback_waits_for_every_member_whatever_their_end(
    conn: psycopg.Connection, schema: str
) -> None:
    bid, cid, ids = batch(conn, schema, [{"handler": "work"}] * 3)
    assert len(ids) == 3 and cid not in ids
    assert status(conn, schema, cid) == "waiting"
    finish(conn, schema, ids[0])
    finish(conn, schema, ids[1], "dead")
    assert status(conn, schema, cid) == "waiting"
    c = counts(conn, schema, bid)
    assert (c["completed"], c["dead"], c["cancelled"], c["released_at"]) == (1, 1, 0, None)
    finish(conn, schema, ids[2], "cancelled")
    assert status(conn, schema, cid) == "pending"
    c = counts(conn, schema, bid)
    assert (c["members"], c["completed"], c["dead"], c["cancelled"]) == (3, 1, 1, 1)
    assert c["released_at"] is not None


def test_the_release_wakes_the_fleet(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    _, cid, ids = batch(conn, schema, [{"handler": "work"}], {"handler": "collect", "queue": "q"})
    with psycopg.connect(test_db_dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{schema}.wake"')
        finish(conn, schema, ids[0])
        notes = [n for n in listener.notifies(timeout=5, stop_after=1)]
    assert json.loads(notes[0].payload) == {"q": "q", "h": "collect", "id": cid, "n": 1}


def test_members_finishing_concurrently_release_the_callback_once(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    """Eight connections each finish a share of 400 members at once, each member in its
    own transaction: the counts are exact and the callback is released exactly once."""
    bid, cid, ids = batch(conn, schema, [{"handler": "work"}] * 400)
    sql(
        conn,
        schema,
        "CREATE TABLE @schema@.releases (n int); "
        "CREATE FUNCTION @schema@.note_release() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN INSERT INTO @schema@.releases VALUES (1); RETURN NULL; END $$; "
        "CREATE TRIGGER noted AFTER UPDATE OF status ON @schema@.jobs FOR EACH ROW "
        "WHEN (OLD.status = 'waiting' AND NEW.status = 'pending') "
        "EXECUTE FUNCTION @schema@.note_release()",
    )
    errors: list[BaseException] = []

    def worker(share: list[int]) -> None:
        try:
            with psycopg.connect(test_db_dsn, autocommit=True) as c:
                for job_id in share:
                    finish(c, schema, job_id, "dead" if job_id % 7 == 0 else "completed")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(ids[k::8],)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    c = counts(conn, schema, bid)
    dead = sum(1 for i in ids if i % 7 == 0)
    assert (c["completed"], c["dead"]) == (400 - dead, dead)
    assert status(conn, schema, cid) == "pending"
    assert sql(conn, schema, "SELECT count(*) FROM @schema@.releases") == [(1,)]


def refused(conn: psycopg.Connection, schema: str, jobs: Any, then: Any) -> str:
    before = sql(
        conn,
        schema,
        "SELECT (SELECT count(*) FROM @schema@.jobs), (SELECT count(*) FROM @schema@.batches)",
    )
    with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
        sql(
            conn,
            schema,
            "SELECT * FROM @schema@.batch_enqueue(%s::jsonb, %s::jsonb)",
            None if jobs is None else json.dumps(jobs),
            None if then is None else json.dumps(then),
        )
    after = sql(
        conn,
        schema,
        "SELECT (SELECT count(*) FROM @schema@.jobs), (SELECT count(*) FROM @schema@.batches)",
    )
    assert after == before
    return str(err.value)


@pytest.mark.parametrize(
    ("jobs", "then", "says"),
    [
        ([], {"handler": "collect"}, "at least one member job"),
        ({"handler": "work"}, {"handler": "collect"}, "jobs must be a JSON array"),
        (None, {"handler": "collect"}, "jobs must be a JSON array of job objects, not NULL"),
        ([{"handler": "work"}], [{"handler": "collect"}], "must be one job object, not array"),
        ([{"handler": "work"}], "collect", "must be one job object, not string"),
        ([{"handler": "work"}], None, "must be one job object, not NULL"),
        ([{"handler": "work"}], {"payload": {}}, "then (the callback): "),
        ([{"handler": "work"}], {"handler": "c", "bogus": 1}, "then (the callback): "),
        ([{"handler": "work"}], {"handler": "c", "dedupe_key": "k"}, "may not have dedupe_key"),
        ([{"handler": "work"}], {"handler": "c", "after": [1]}, "may not have dedupe_key"),
        (
            [{"handler": "w"}, {"handler": "w", "dedupe_key": "k"}],
            {"handler": "c"},
            "job 2 of 2: a batch member may not have a dedupe_key",
        ),
        ([{"handler": "w"}, {"handler": ""}], {"handler": "c"}, "job 2 of 2"),
        ([{"handler": "w"}, 5], {"handler": "c"}, "job 2 of 2"),
    ],
)
def test_hostile_batches_are_refused_and_insert_nothing(
    conn: psycopg.Connection, schema: str, jobs: Any, then: Any, says: str
) -> None:
    assert says in refused(conn, schema, jobs, then)


def test_a_batch_of_a_million_members_is_refused_before_anything_is_inserted(
    conn: psycopg.Connection, schema: str
) -> None:
    message = refused(conn, schema, [{"handler": "w"}] * 1_000_000, {"handler": "c"})
    assert "at most 100000 member jobs, not 1000000" in message


def test_members_cancelled_at_insert_count_at_once(conn: psycopg.Connection, schema: str) -> None:
    """A member whose parent had already failed is cancelled as it is inserted: it counts,
    and a batch whose members are all final releases its callback at enqueue."""
    [(parent,)] = sql(conn, schema, "SELECT @schema@.enqueue_v3('p')")
    finish(conn, schema, parent, "dead")
    bid, cid, ids = batch(conn, schema, [{"handler": "w", "after": [parent]}])
    assert status(conn, schema, ids[0]) == "cancelled"
    assert counts(conn, schema, bid)["cancelled"] == 1
    assert status(conn, schema, cid) == "pending"


def prune(conn: psycopg.Connection, schema: str) -> int:
    [(n,)] = sql(
        conn, schema, "SELECT deleted FROM @schema@.prune_finished_v2(0, 0, 0, NULL, NULL, 10000)"
    )
    return int(n)


def test_retention_keeps_members_until_the_callback_has_finished_then_prunes_it_whole(
    conn: psycopg.Connection, schema: str
) -> None:
    bid, cid, ids = batch(conn, schema, [{"handler": "w"}] * 3)
    [(other,)] = sql(conn, schema, "SELECT @schema@.enqueue_v3('w')")
    for job_id in [*ids[:2], other]:
        finish(conn, schema, job_id)
    assert prune(conn, schema) == 1  # the other job; the finished members stay
    assert sql(conn, schema, "SELECT count(*) FROM @schema@.jobs WHERE batch_id = %s", bid) == [
        (3,)
    ]
    finish(conn, schema, ids[2])
    assert prune(conn, schema) == 0  # all members final; the callback has not run
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET status = 'running', locked_by = 'w', "
        "locked_until = now() + interval '1 minute', started_at = now() WHERE id = %s",
        cid,
    )
    assert prune(conn, schema) == 0  # it runs: its members stay
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET status = 'completed', finished_at = now(), "
        "locked_by = NULL, locked_until = NULL WHERE id = %s",
        cid,
    )
    prune(conn, schema)
    assert sql(conn, schema, "SELECT count(*) FROM @schema@.jobs") == [(0,)]
    assert sql(conn, schema, "SELECT count(*) FROM @schema@.batches") == [(0,)]


def test_members_page_for_the_enqueuing_login(conn: psycopg.Connection, schema: str) -> None:
    bid, _, ids = batch(conn, schema, [{"handler": "w"}] * 5)
    finish(conn, schema, ids[0])
    page = sql(conn, schema, "SELECT * FROM @schema@.batch_members_page(%s, 0, 2)", bid)
    assert [r[0] for r in page] == ids[:2]
    assert page[0][1:] == ("completed", {"n": ids[0]}, None)
    rest = sql(
        conn, schema, "SELECT id FROM @schema@.batch_members_page(%s, %s, 1000)", bid, ids[1]
    )
    assert [r[0] for r in rest] == ids[2:]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="1 to 1000"):
        sql(conn, schema, "SELECT * FROM @schema@.batch_members_page(%s, 0, 0)", bid)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="does not exist"):
        sql(conn, schema, "SELECT * FROM @schema@.batch_members_page(%s, 0, 10)", bid + 99)


def test_an_enqueuer_enqueues_batches_and_pages_only_its_own(
    conn: psycopg.Connection, schema: str, roles: dict[str, str]
) -> None:
    """It enqueues a batch (`batch_enqueue`: members and callback in one transaction) and
    pages the members' outcomes of a batch whose callback its own login enqueued; another
    login's batch is refused as unknown, and it reads nothing else of batches."""
    import pgworkerd
    from pgworkerd.client import JobSpec

    theirs, _, _ = batch(conn, schema, [{"handler": "secret"}])
    enqueuer = roles[f"{schema}_enqueuer"]
    with psycopg.connect(enqueuer, autocommit=True) as mine:
        ids = pgworkerd.batch(mine, [JobSpec("a"), JobSpec("b")], then=JobSpec("c"), schema=schema)
        page = pgworkerd.batch_members(mine, ids.batch_id, schema=schema)
        assert [m.id for m in page] == ids.member_ids
        assert page[0].status == "pending"
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="not readable"):
            pgworkerd.batch_members(mine, theirs, schema=schema)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            sql(mine, schema, "SELECT * FROM @schema@.batches")
    assert status(conn, schema, ids.callback_id) == "waiting"
