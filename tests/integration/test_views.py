"""The read-side query layer (pgworkerd/queue/views.py) that `status`, `jobs`, `show`,
`explain` and the dashboard share: keyset pages, filters (hostile text included), the
overview's counts and throughput, limits as the daemons declare them."""

from __future__ import annotations

from typing import Any

import leasing
import psycopg
import pytest

from pgworkerd import client
from pgworkerd.queue import fleet, lease, registry, views

# a daemon's registry secret (schema 24), the same for every row of these tests
SECRET = "test-registry-secret-" + "x" * 32

HOSTILE = "%_\\'\"; DROP TABLE x; --\x1b[2J\u202e"


def _enqueue(conn: psycopg.Connection, schema: str, specs: list[client.JobSpec]) -> list[int]:
    return client.enqueue_many(conn, specs, schema=schema)


def _finish(conn: psycopg.Connection, schema: str, status: str, ids: list[int], error: str = ""):
    # Finished as a daemon would leave them (the attempts trigger records each).
    conn.execute(
        f"UPDATE {schema}.jobs SET status = 'running', locked_by = 'w', attempts = 1,"
        " locked_until = now() + interval '1 minute', started_at = now(),"
        " lease_token = lease_token + 1 WHERE id = ANY(%s)",
        [ids],
    )
    conn.execute(
        f"UPDATE {schema}.jobs SET status = %s, locked_by = NULL, locked_until = NULL,"
        " finished_at = now(), last_error = nullif(%s, '') WHERE id = ANY(%s)",
        [status, error, ids],
    )


def ids(page: dict[str, Any]) -> list[int]:
    return [r["id"] for r in page["jobs"]]


def test_pages_walk_every_job_newest_first_both_ways(conn: psycopg.Connection, schema: str):
    all_ids = _enqueue(conn, schema, [client.JobSpec("h") for _ in range(23)])
    newest_first = sorted(all_ids, reverse=True)

    seen: list[int] = []
    page = views.jobs_page(conn, schema, limit=10)
    assert page["newer"] is None
    pages = [page]
    while True:
        seen += ids(page)
        if page["older"] is None:
            break
        page = views.jobs_page(conn, schema, before=page["older"], limit=10)
        pages.append(page)
    assert seen == newest_first
    assert [len(p["jobs"]) for p in pages] == [10, 10, 3]

    # and back up from the last page: the same pages, newest first each
    back = views.jobs_page(conn, schema, after=pages[-1]["newer"], limit=10)
    assert ids(back) == ids(pages[1])
    top = views.jobs_page(conn, schema, after=back["newer"], limit=10)
    assert ids(top) == ids(pages[0])
    assert ids(views.jobs_page(conn, schema, after=top["newer"], limit=10)) == []


def test_pages_walk_every_job_oldest_first_both_ways(conn: psycopg.Connection, schema: str):
    """sort=oldest: the same statements and indexes read upwards from the oldest."""
    all_ids = _enqueue(conn, schema, [client.JobSpec("h") for _ in range(23)])
    _finish(conn, schema, "completed", all_ids[:7])
    oldest_first = sorted(all_ids)
    seen: list[int] = []
    page = views.jobs_page(conn, schema, limit=10, oldest_first=True)
    assert page["older"] is None
    pages = [page]
    while True:
        seen += ids(page)
        if page["newer"] is None:
            break
        page = views.jobs_page(conn, schema, after=page["newer"], limit=10, oldest_first=True)
        pages.append(page)
    assert seen == oldest_first
    assert [len(p["jobs"]) for p in pages] == [10, 10, 3]
    # and back down from the last page: the same pages, oldest first each
    back = views.jobs_page(conn, schema, before=pages[-1]["older"], limit=10, oldest_first=True)
    assert ids(back) == ids(pages[1])
    first = views.jobs_page(conn, schema, before=back["older"], limit=10, oldest_first=True)
    assert ids(first) == ids(pages[0])
    before_first = views.jobs_page(conn, schema, before=first["older"], limit=10, oldest_first=True)
    assert ids(before_first) == []
    # with a status and a queue filter, through their indexes, still oldest first
    done = views.jobs_page(conn, schema, statuses=["completed"], limit=5, oldest_first=True)
    assert ids(done) == sorted(all_ids[:7])[:5]


def test_filters_by_status_queue_handler_and_text(conn: psycopg.Connection, schema: str):
    a, b, c, d = _enqueue(
        conn,
        schema,
        [
            client.JobSpec("mail", {"to": "Alice@example.org"}, queue="q1"),
            client.JobSpec("mail", {"to": "bob"}, queue="q2"),
            client.JobSpec("export", {"file": "x"}, queue="q1"),
            client.JobSpec("export", {"file": HOSTILE}, queue="q2"),
        ],
    )
    _finish(conn, schema, "dead", [c], error="Traceback\nValueError: disk FULL")

    assert ids(views.jobs_page(conn, schema, statuses=["dead"])) == [c]
    assert ids(views.jobs_page(conn, schema, statuses=["pending", "dead"])) == [d, c, b, a]
    assert ids(views.jobs_page(conn, schema, queue="q1")) == [c, a]
    assert ids(views.jobs_page(conn, schema, handler="mail")) == [b, a]
    assert ids(views.jobs_page(conn, schema, handler="mail", queue="q2")) == [b]
    # text: case-insensitive substring of the payload's JSON or the last error
    assert ids(views.jobs_page(conn, schema, text="alice@")) == [a]
    assert ids(views.jobs_page(conn, schema, text="disk full")) == [c]
    # hostile text is a plain substring: no pattern characters, no SQL
    assert ids(views.jobs_page(conn, schema, text="%")) == [d]
    assert ids(views.jobs_page(conn, schema, text="_")) == [d]
    assert ids(views.jobs_page(conn, schema, text="DROP TABLE x; --")) == [d]
    assert ids(views.jobs_page(conn, schema, queue=HOSTILE)) == []
    assert ids(views.jobs_page(conn, schema, handler=HOSTILE, text=HOSTILE)) == []
    assert len(ids(views.jobs_page(conn, schema))) == 4  # the table is intact

    row = views.jobs_page(conn, schema, statuses=["dead"])["jobs"][0]
    assert set(row) == {
        "id", "queue", "handler", "status", "priority", "attempts", "max_attempts", "run_at",
        "locked_by", "locked_until", "progress", "last_error", "created_at", "started_at",
        "finished_at", "concurrency_key",
    }  # fmt: skip


def test_page_size_and_status_are_checked(conn: psycopg.Connection, schema: str):
    for limit in (0, views.MAX_PAGE_SIZE + 1):
        with pytest.raises(ValueError, match="limit"):
            views.jobs_page(conn, schema, limit=limit)
    with pytest.raises(ValueError, match="unknown status"):
        views.jobs_page(conn, schema, statuses=["pending'; --"])
    with pytest.raises(ValueError, match="before or after"):
        views.jobs_page(conn, schema, before=1, after=1)


def test_text_search_is_bounded_by_a_statement_timeout(conn: psycopg.Connection, schema: str):
    conn.execute(
        f"INSERT INTO {schema}.jobs (handler, payload)"
        " SELECT 'h', jsonb_build_object('n', g, 'pad', repeat('x', 500))"
        " FROM generate_series(1, 200000) g"
    )
    with pytest.raises(views.TextSearchTimeout, match="narrow it"):
        views.jobs_page(conn, schema, text="not there at all", text_timeout=0.001)
    # the connection is fine afterwards, and the timeout did not outlive the search
    assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)
    assert len(ids(views.jobs_page(conn, schema, limit=5))) == 5


def test_job_shows_columns_and_attempts(conn: psycopg.Connection, schema: str):
    [j] = _enqueue(conn, schema, [client.JobSpec("h", {"k": 1}, dedupe_key="once")])
    _finish(conn, schema, "dead", [j], error="boom")
    shown = views.job(conn, schema, j)
    assert shown is not None
    assert shown["payload"] == {"k": 1} and shown["dedupe_key"] == "once"
    assert [(a["attempt"], a["outcome"]) for a in shown["attempt_history"]] == [(1, "dead")]
    assert shown["attempts"] == 1  # the count, not overwritten by the history
    assert views.job(conn, schema, j + 1000) is None


def test_overview_counts_throughput_and_oldest_due(conn: psycopg.Connection, schema: str):
    info = registry.WorkerInfo("w1", "host", 1, "t", ["q1"], ["h"], 3)
    registry.register(conn, info, "running", schema, secret=SECRET)
    done = _enqueue(conn, schema, [client.JobSpec("h", queue="q1") for _ in range(4)])
    _finish(conn, schema, "completed", done[:3])
    _finish(conn, schema, "dead", done[3:], error="x")
    _enqueue(conn, schema, [client.JobSpec("h", queue="q1"), client.JobSpec("h", queue="q9")])
    conn.execute(f"UPDATE {schema}.jobs SET run_at = now() - interval '90 seconds'")
    _enqueue(conn, schema, [client.JobSpec("h", queue="q1")])
    conn.execute(
        f"UPDATE {schema}.jobs SET finished_at = now() - interval '2 hours' WHERE id = %s",
        [done[0]],
    )

    view = views.overview(conn, schema)
    assert view["counts"]["q1"] == {"pending": 2, "completed": 2, "dead": 1}  # last hour
    assert views.status(conn, schema)["counts"]["q1"] == {"pending": 2, "completed": 3, "dead": 1}
    by_queue = {q["queue"]: q for q in view["queues"]}
    assert 85 < by_queue["q1"]["oldest_due_seconds"] < 200
    assert by_queue["q9"]["counts"] == {"pending": 1}
    assert len(view["throughput"]) == 60
    recent = view["throughput"][-2:]  # the test may straddle a minute
    assert [sum(m[k] for m in recent) for k in ("completed", "dead", "failed_total")] == [3, 1, 1]
    [d] = view["daemons"]
    assert (d["id"], d["busy"], d["slots"], d["drained"]) == ("w1", 0, 3, False)
    assert view["unserved"][0]["queue"] == "q9"


def test_limits_as_live_daemons_declare_them(conn: psycopg.Connection, schema: str):
    settings = {"h": {"queues": None, "slots": None, "max_running": 2, "max_running_per_key": 1}}
    info = registry.WorkerInfo("w1", "host", 1, "t", ["default"], ["h", "free"], 3, settings)
    registry.register(conn, info, "running", schema, secret=SECRET)
    _enqueue(conn, schema, [client.JobSpec("h", concurrency_key=k) for k in "aab"])
    cap = {"h": lease.HandlerCapacity(30, 3, max_running=2, max_running_per_key=1)}
    leasing.claim(conn, "w1", queues=["default"], handlers=cap, limit=3, schema=schema)
    [row] = views.limits(conn, schema)
    assert row["handler"] == "h" and (row["max_running"], row["max_running_per_key"]) == (2, 1)
    assert row["running"] == 2 and row["daemons"] == 1
    assert sorted(k["key"] for k in row["busiest_keys"]) == ["a", "b"]
    # a daemon gone declares nothing any more
    fleet.request_drain(conn, schema, drain=True, worker_id="w1")
    registry.deregister(conn, "w1", schema, secret=SECRET)
    assert views.limits(conn, schema) == []


def test_text_search_over_every_status_stops_at_the_page_not_at_the_end_of_a_status(
    conn: psycopg.Connection, schema: str
):
    # Most of a real table is completed jobs the text does not match; the matches are
    # dead jobs among the newest. Reading status by status, the completed ones were read
    # to their end before the page could close: on 10 M rows the search always timed out.
    conn.execute(
        f"INSERT INTO {schema}.jobs (queue, handler, payload, status, attempts, finished_at)"
        " SELECT 'default', 'h', jsonb_build_object('n', g), 'completed', 1, now()"
        " FROM generate_series(1, 400000) g"
    )
    dead = _enqueue(conn, schema, [client.JobSpec("h", {"n": i}) for i in range(60)])
    _finish(conn, schema, "dead", dead, error="ValueError: bad row")
    with conn.transaction():  # the rows the search read, counted in its transaction
        page = views.jobs_page(conn, schema, text="BAD ROW", limit=50)
        [(read,)] = conn.execute(
            "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)"
            " FROM pg_stat_xact_user_tables WHERE schemaname = %s AND relname = 'jobs'",
            [schema],
        ).fetchall()
    assert read < 1000, f"read {read} rows for a page of 50"
    assert ids(page) == sorted(dead, reverse=True)[:50]
    assert page["older"] == sorted(dead, reverse=True)[49]
    up = views.jobs_page(conn, schema, text="bad row", after=page["older"], limit=5)
    assert ids(up) == sorted(dead, reverse=True)[44:49]  # the matches just above, both ways
    # narrowed to the rare statuses, it reads those statuses only, as before
    page = views.jobs_page(conn, schema, statuses=["dead"], text="bad row", limit=10)
    assert ids(page) == sorted(dead, reverse=True)[:10]


@pytest.mark.parametrize("name", ["queue", "handler", "text"])
def test_a_filter_with_a_nul_is_refused_before_the_database(
    conn: psycopg.Connection, schema: str, name: str
):
    with pytest.raises(ValueError, match=f"{name} cannot contain a NUL"):
        views.jobs_page(conn, schema, **{name: "a\x00b"})
    assert views.jobs_page(conn, schema)["jobs"] == []  # the connection is fine
