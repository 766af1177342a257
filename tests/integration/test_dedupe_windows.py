"""Dedupe windows and policies (schema 34, docs/guide/enqueue.md "Dedupe"), against a real
server: waiting and suspended jobs hold their key; a dedupe_window holds it after the job
finished, exactly (an enqueue releases a window that has passed) and retention keeps the
holder and sweeps expired holds; the policies existing, reject (SQLSTATE PGWD1,
pgworkerd.DuplicateJob with the holder's id) and debounce (capped); many connections
enqueueing one key at once under each policy; hostile values refused, nothing written."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from typing import Any

import leasing
import psycopg
import pytest
from psycopg.rows import dict_row

from pgworkerd import client, signals
from pgworkerd.client import DuplicateJob, InvalidJob
from pgworkerd.queue import admin, lease
from pgworkerd.queue.queries import render

SERVED = {"h": lease.HandlerCapacity(lease_seconds=60, free=100)}


def sql(conn: psycopg.Connection, schema: str, text: str, *params: Any) -> list[tuple[Any, ...]]:
    cur = conn.execute(render(text, schema), params)  # type: ignore[arg-type]
    return cur.fetchall() if cur.description else []


def row(conn: psycopg.Connection, schema: str, job_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        found = cur.execute(
            render("SELECT *, status::text AS status FROM @schema@.jobs WHERE id = %s", schema),
            (job_id,),
        ).fetchone()
    assert found is not None
    return found


def count_jobs(conn: psycopg.Connection, schema: str) -> int:
    [(n,)] = sql(conn, schema, "SELECT count(*) FROM @schema@.jobs")
    return int(n)


def many(conn: psycopg.Connection, schema: str, jobs: list[dict[str, Any]]) -> list[int]:
    [(ids,)] = sql(conn, schema, "SELECT @schema@.enqueue_many_v3(%s::jsonb)", json.dumps(jobs))
    return list(ids)


def finish(conn: psycopg.Connection, schema: str, job_id: int, ago: float = 0.0) -> None:
    """End a job as any finishing path does, `ago` seconds in the past."""
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET status = 'completed', finished_at = now() - "
        "make_interval(secs => %s), locked_by = NULL, locked_until = NULL WHERE id = %s",
        ago,
        job_id,
    )


def claim(conn: psycopg.Connection, schema: str) -> list[lease.ClaimedJob]:
    return leasing.claim(conn, "w1", queues=["default"], handlers=SERVED, limit=10, schema=schema)


# -- waiting and suspended jobs hold their key (issue 24's leftover) -----------------------


def test_a_suspended_job_holds_its_dedupe_key_and_wakes_without_a_twin(
    conn: psycopg.Connection, schema: str
) -> None:
    first = client.enqueue(conn, "h", dedupe_key="k", schema=schema)
    [job] = claim(conn, schema)
    done = lease.suspend(conn, "w1", job.id, job.token, "go", 3600.0, schema=schema)
    assert done is not None and done.status == "suspended"
    # an enqueue of the key returns the suspended job: no second job
    assert client.enqueue(conn, "h", dedupe_key="k", schema=schema) == first
    assert count_jobs(conn, schema) == 1
    # and its signal makes it pending again (before 0034 the twin made that a unique
    # violation)
    signals.signal(conn, first, "go", schema=schema)
    assert row(conn, schema, first)["status"] == "pending"


def test_a_waiting_job_holds_its_dedupe_key(conn: psycopg.Connection, schema: str) -> None:
    parent = client.enqueue(conn, "p", schema=schema)
    child = client.enqueue(conn, "h", dedupe_key="k", after=[parent], schema=schema)
    assert row(conn, schema, child)["status"] == "waiting"
    assert client.enqueue(conn, "h", dedupe_key="k", schema=schema) == child
    # a hit with parents inserts no job and no edge
    assert client.enqueue(conn, "h", dedupe_key="k", after=[parent], schema=schema) == child
    assert count_jobs(conn, schema) == 2
    [(edges,)] = sql(conn, schema, "SELECT count(*) FROM @schema@.job_parents")
    assert edges == 1


# -- windows ---------------------------------------------------------------------------


def test_a_window_holds_the_key_after_the_job_finished_and_then_releases_it(
    conn: psycopg.Connection, schema: str
) -> None:
    first = client.enqueue(conn, "h", dedupe_key="k", dedupe_window=600, schema=schema)
    finish(conn, schema, first, ago=300)  # finished 5 minutes ago: 5 minutes left
    for enqueue in (
        lambda: client.enqueue(conn, "h", dedupe_key="k", schema=schema),  # plain path
        lambda: client.enqueue(conn, "h", dedupe_key="k", concurrency_key="c", schema=schema),
        lambda: client.enqueue_many(conn, [client.JobSpec("h", dedupe_key="k")], schema=schema)[0],
        lambda: many(conn, schema, [{"handler": "h", "dedupe_key": "k"}])[0],
    ):
        assert enqueue() == first
    # another handler's key of the same text is not held (keys are per handler)
    assert client.enqueue(conn, "other", dedupe_key="k", schema=schema) != first
    assert count_jobs(conn, schema) == 2
    # once the window has passed, the key is free again at once (no sweep needed)
    finish(conn, schema, first, ago=601)
    second = client.enqueue(conn, "h", dedupe_key="k", schema=schema)
    assert second != first
    assert row(conn, schema, first)["dedupe_window_seconds"] is None  # released


def test_without_a_window_a_finished_job_holds_nothing(
    conn: psycopg.Connection, schema: str
) -> None:
    first = client.enqueue(conn, "h", dedupe_key="k", schema=schema)
    finish(conn, schema, first)
    assert client.enqueue(conn, "h", dedupe_key="k", schema=schema) != first


def test_retention_keeps_a_holder_and_sweeps_expired_holds(
    conn: psycopg.Connection, schema: str
) -> None:
    held = client.enqueue(conn, "h", dedupe_key="a", dedupe_window=3600, schema=schema)
    lapsed = client.enqueue(conn, "h", dedupe_key="b", dedupe_window=60, schema=schema)
    plain = client.enqueue(conn, "h", dedupe_key="c", schema=schema)
    for job_id in (held, lapsed, plain):
        finish(conn, schema, job_id, ago=120)
    # a retention of 10 s for completed jobs: the plain one and the lapsed holder go; the
    # job whose window still runs stays, and its key stays held
    [(deleted,)] = sql(
        conn,
        schema,
        "SELECT deleted FROM @schema@.prune_finished_v2(10, NULL, NULL, NULL, NULL, 100)",
    )
    assert deleted == 2
    assert row(conn, schema, held)["status"] == "completed"
    assert client.enqueue(conn, "h", dedupe_key="a", schema=schema) == held
    # kept forever (no retention): the sweep still releases a lapsed hold, bounded
    keep = [
        client.enqueue(conn, "h", dedupe_key=f"s{i}", dedupe_window=1, schema=schema)
        for i in range(3)
    ]
    for job_id in keep:
        finish(conn, schema, job_id, ago=5)
    sql(conn, schema, "SELECT * FROM @schema@.prune_finished_v2(NULL, NULL, NULL, NULL, NULL, 2)")
    [(still,)] = sql(
        conn,
        schema,
        "SELECT count(*) FROM @schema@.jobs WHERE id = ANY(%s) AND dedupe_window_seconds "
        "IS NOT NULL",
        keep,
    )
    assert still == 1  # two released by a batch of 2
    assert row(conn, schema, held)["dedupe_window_seconds"] == 3600


def test_a_retried_holder_keeps_its_key(conn: psycopg.Connection, schema: str) -> None:
    first = client.enqueue(conn, "h", dedupe_key="k", dedupe_window=600, schema=schema)
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET status = 'dead', finished_at = now() WHERE id = %s",
        first,
    )
    # a dead holder retried comes back with its key (it does not collide with itself)
    assert admin.retry(conn, ids=[first], schema=schema) == [first]
    assert row(conn, schema, first)["status"] == "pending"
    assert client.enqueue(conn, "h", dedupe_key="k", schema=schema) == first


# -- policies --------------------------------------------------------------------------


def test_reject_raises_a_distinct_error_naming_the_holder_and_writes_nothing(
    test_db_dsn: str, conn: psycopg.Connection, schema: str
) -> None:
    first = client.enqueue(conn, "h", dedupe_key="k", schema=schema)
    with psycopg.connect(test_db_dsn) as tx:
        with pytest.raises(DuplicateJob) as err:
            client.enqueue(tx, "h", {"x": 1}, dedupe_key="k", dedupe_policy="reject", schema=schema)
        assert err.value.job_id == first
        assert f"held by job {first}" in str(err.value)
        tx.rollback()
    # in SQL: SQLSTATE PGWD1, the holder in the detail as JSON; a batch with a rejected
    # job writes none of its jobs
    with pytest.raises(psycopg.Error) as sqlerr:
        many(
            conn,
            schema,
            [
                {"handler": "h", "dedupe_key": "new"},
                {"handler": "h", "dedupe_key": "k", "dedupe_policy": "reject"},
            ],
        )
    assert sqlerr.value.sqlstate == "PGWD1"
    assert json.loads(sqlerr.value.diag.message_detail or "") == {"job_id": first}
    assert "job 2 of 2" in str(sqlerr.value)
    assert count_jobs(conn, schema) == 1
    # a finished holder within its window is refused the same way; without one, a new job
    finish(conn, schema, first)
    assert client.enqueue(conn, "h", dedupe_key="k", dedupe_policy="reject", schema=schema) > first


def test_reject_within_a_window(conn: psycopg.Connection, schema: str) -> None:
    first = client.enqueue(conn, "h", dedupe_key="k", dedupe_window=60, schema=schema)
    finish(conn, schema, first)
    with pytest.raises(DuplicateJob) as err:
        client.enqueue(conn, "h", dedupe_key="k", dedupe_policy="reject", schema=schema)
    assert err.value.job_id == first


def test_debounce_moves_the_pending_job_forward_never_past_its_cap(
    conn: psycopg.Connection, schema: str
) -> None:
    def enqueue() -> int:
        return client.enqueue(
            conn,
            "h",
            dedupe_key="k",
            dedupe_policy="debounce",
            debounce=60,
            debounce_max=timedelta(minutes=5),
            schema=schema,
        )

    def run_in() -> float:
        [(seconds,)] = sql(
            conn,
            schema,
            "SELECT extract(epoch FROM run_at - now())::float8 FROM @schema@.jobs WHERE id = %s",
            first,
        )
        return float(seconds)

    first = enqueue()
    assert 55 < run_in() <= 60  # the first enqueue runs debounce from now
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET run_at = now() + interval '10 s' WHERE id = %s",
        first,
    )
    assert enqueue() == first
    assert 55 < run_in() <= 60  # moved forward again
    # enqueued 280 s ago: the cap (enqueue + 300 s) allows 20 s more, not 60
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET created_at = now() - interval '280 s', "
        "run_at = now() + interval '5 s' WHERE id = %s",
        first,
    )
    assert enqueue() == first
    assert 15 < run_in() <= 20
    # past the cap it does not move, and never moves earlier
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET created_at = now() - interval '1 day', "
        "run_at = now() + interval '1 hour' WHERE id = %s",
        first,
    )
    assert enqueue() == first
    assert 3590 < run_in() <= 3600
    assert count_jobs(conn, schema) == 1
    # a running holder is returned as it is
    sql(conn, schema, "UPDATE @schema@.jobs SET run_at = now() WHERE id = %s", first)
    [job] = claim(conn, schema)
    before = row(conn, schema, first)["run_at"]
    assert enqueue() == first
    assert row(conn, schema, first)["run_at"] == before
    assert job.id == first


# -- many connections, one key, each policy ---------------------------------------------


@pytest.mark.parametrize("policy", ["existing", "reject", "debounce"])
def test_many_connections_enqueueing_one_key_at_once_make_one_job(
    test_db_dsn: str, schema: str, conn: psycopg.Connection, policy: str
) -> None:
    callers = 12
    barrier = threading.Barrier(callers)
    results: list[Any] = [None] * callers
    extra: dict[str, Any] = {"dedupe_policy": policy}
    if policy == "debounce":
        extra |= {"debounce": 30, "debounce_max": 600}

    def run(i: int) -> None:
        with psycopg.connect(test_db_dsn) as c:
            barrier.wait(timeout=60)
            try:
                results[i] = client.enqueue(
                    c, "h", {"i": i}, dedupe_key="same", dedupe_window=60, schema=schema, **extra
                )
                c.commit()
            except DuplicateJob as exc:
                c.rollback()
                results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert count_jobs(conn, schema) == 1
    [(job_id,)] = sql(conn, schema, "SELECT id FROM @schema@.jobs")
    ids = [r for r in results if isinstance(r, int)]
    refused = [r for r in results if isinstance(r, DuplicateJob)]
    assert len(ids) + len(refused) == callers
    assert set(ids) == {job_id}
    if policy == "reject":
        assert len(ids) == 1
        assert {r.job_id for r in refused} == {job_id}
    else:
        assert refused == []
    if policy == "debounce":
        [(run_in,)] = sql(
            conn, schema, "SELECT extract(epoch FROM run_at - now()) FROM @schema@.jobs"
        )
        assert 0 < run_in <= 30


# -- hostile values ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job", "message"),
    [
        ({"dedupe_key": "k", "dedupe_window": 0}, "dedupe_window must be above 0"),
        ({"dedupe_key": "k", "dedupe_window": -1}, "dedupe_window must be above 0"),
        ({"dedupe_key": "k", "dedupe_window": 1e12}, "at most 365 days"),
        ({"dedupe_key": "k", "dedupe_window": "2 years"}, "at most 365 days"),
        ({"dedupe_key": "k", "dedupe_window": "forever"}, "dedupe_window must be seconds"),
        ({"dedupe_key": "k", "dedupe_window": [1]}, "dedupe_window must be seconds"),
        ({"dedupe_window": 60}, "need a dedupe_key"),
        ({"dedupe_policy": "reject"}, "need a dedupe_key"),
        ({"dedupe_key": "k", "dedupe_policy": "ignore"}, 'dedupe_policy must be "existing"'),
        ({"dedupe_key": "k", "dedupe_policy": 1}, 'dedupe_policy must be "existing"'),
        ({"dedupe_key": "k", "debounce": 5}, 'go with dedupe_policy "debounce"'),
        ({"dedupe_key": "k", "dedupe_policy": "debounce"}, "needs debounce ("),
        (
            {"dedupe_key": "k", "dedupe_policy": "debounce", "debounce": 5},
            "an uncapped debounce could postpone it forever",
        ),
        (
            {"dedupe_key": "k", "dedupe_policy": "debounce", "debounce": 50, "debounce_max": 5},
            "debounce_max (5) must be at least debounce (50)",
        ),
        (
            {
                "dedupe_key": "k",
                "dedupe_policy": "debounce",
                "debounce": 5,
                "debounce_max": "infinity",
            },
            "debounce_max must be",
        ),
        (
            {
                "dedupe_key": "k",
                "dedupe_policy": "debounce",
                "debounce": 5,
                "debounce_max": 9,
                "delay": 3,
            },
            "give no run_at or delay",
        ),
    ],
)
def test_hostile_dedupe_values_are_refused_and_write_nothing(
    conn: psycopg.Connection, schema: str, job: dict[str, Any], message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
        many(conn, schema, [{"handler": "h"} | job])
    assert message in str(err.value)
    assert "job 1 of 1" in str(err.value)
    assert count_jobs(conn, schema) == 0


def test_python_refuses_the_same_before_any_round_trip(
    conn: psycopg.Connection, schema: str
) -> None:
    for kwargs, message in [
        ({"dedupe_key": "k", "dedupe_window": 0}, "dedupe_window must be above 0"),
        ({"dedupe_key": "k", "dedupe_window": float("nan")}, "dedupe_window must be above 0"),
        ({"dedupe_key": "k", "dedupe_window": timedelta(days=400)}, "at most 31536000"),
        ({"dedupe_window": 60}, "need a dedupe_key"),
        ({"dedupe_key": "k", "dedupe_policy": "ignore"}, "dedupe_policy must be"),
        ({"dedupe_key": "k", "debounce": 5}, 'go with dedupe_policy "debounce"'),
        ({"dedupe_key": "k", "dedupe_policy": "debounce", "debounce": 5}, "uncapped"),
        (
            {"dedupe_key": "k", "dedupe_policy": "debounce", "debounce": 9, "debounce_max": 5},
            "must be at least debounce",
        ),
        (
            {
                "dedupe_key": "k",
                "dedupe_policy": "debounce",
                "debounce": 5,
                "debounce_max": 9,
                "delay": 1,
            },
            "give no run_at or delay",
        ),
    ]:
        with pytest.raises(InvalidJob, match=message):
            client.enqueue(conn, "h", schema=schema, **kwargs)  # type: ignore[arg-type]
    assert count_jobs(conn, schema) == 0


def test_an_enqueuer_debounces_only_its_own_logins_jobs_within_a_year(
    conn: psycopg.Connection, schema: str, roles: dict[str, str]
) -> None:
    """It holds a dedupe key for at most 365 days after its job finished (`dedupe_window`),
    and its debounce moves only a pending job its own login enqueued, never past that job's
    enqueue + the `debounce_max` it gives (at most 365 days): another login's job holding
    the key is returned unchanged."""
    debounce = {"dedupe_policy": "debounce", "debounce": 3600, "debounce_max": 86400}
    theirs = client.enqueue(conn, "h", dedupe_key="theirs", schema=schema)  # the owner's
    before = row(conn, schema, theirs)["run_at"]
    with psycopg.connect(roles[f"{schema}_enqueuer"], autocommit=True) as mine:
        assert client.enqueue(mine, "h", dedupe_key="theirs", schema=schema, **debounce) == theirs
        own = client.enqueue(mine, "h", dedupe_key="mine", schema=schema)
        assert client.enqueue(mine, "h", dedupe_key="mine", schema=schema, **debounce) == own
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="at most 365 days"):
            many(mine, schema, [{"handler": "h", "dedupe_key": "x", "dedupe_window": "366 days"}])
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="at most 365 days"):
            many(
                mine,
                schema,
                [
                    {
                        "handler": "h",
                        "dedupe_key": "x",
                        "dedupe_policy": "debounce",
                        "debounce": 1,
                        "debounce_max": "400 days",
                    }
                ],
            )
    assert row(conn, schema, theirs)["run_at"] == before  # not postponed
    assert row(conn, schema, own)["run_at"] > row(conn, schema, own)["created_at"] + timedelta(
        minutes=59
    )


# -- schedules carry keys ------------------------------------------------------------------


def test_a_schedule_fires_jobs_with_its_keys_and_skips_a_tick_whose_key_is_held(
    conn: psycopg.Connection, schema: str
) -> None:
    from datetime import UTC, datetime

    from pgworkerd.config import ConfigError, parse_config
    from pgworkerd.queue import registry, schedules

    [schedule] = parse_config(
        '[schedules.n]\nevery = "60s"\nhandler = "report"\nconcurrency_key = "tenant-7"\n'
        'dedupe_key = "nightly"\ndedupe_window = "1h"\n'
    ).schedules.values()
    schedules.declare(conn, "n", schedule.definition(), "operator", schema)
    info = registry.WorkerInfo("w", "host", 1, "t", ["default"], ["report"], 1)
    registry.register(conn, info, "running", schema, secret="test-registry-secret-" + "x" * 32)
    minute = int(datetime.now(UTC).timestamp()) // 60 * 60
    fired = schedules.fire(conn, "n", datetime.fromtimestamp(minute, UTC), "w", schema)
    assert fired.outcome == "fired" and fired.job_id is not None
    job = row(conn, schema, fired.job_id)
    assert (job["concurrency_key"], job["dedupe_key"], job["dedupe_window_seconds"]) == (
        "tenant-7",
        "nightly",
        3600,
    )
    # the job finished a minute ago: its window still holds the key, so the next tick is
    # skipped naming it (overlap "skip" alone would have fired it)
    finish(conn, schema, fired.job_id, ago=60)
    nxt = schedules.fire(conn, "n", datetime.fromtimestamp(minute + 60, UTC), "w", schema)
    assert nxt.outcome == "skipped" and nxt.job_id == fired.job_id
    [(skipped,)] = sql(
        conn, schema, "SELECT skipped FROM @schema@.schedule_runs WHERE job_id IS NULL"
    )
    assert skipped == f"dedupe key 'nightly' is held by job {fired.job_id}"
    # a definition without the new keys stays as it was stored before (no new keys)
    [plain] = parse_config('[schedules.p]\nevery = "60s"\nhandler = "h"\n').schedules.values()
    assert not {"concurrency_key", "dedupe_key", "dedupe_window"} & set(plain.definition())
    with pytest.raises(ConfigError, match='needs "dedupe_key"'):
        parse_config('[schedules.p]\nevery = "60s"\nhandler = "h"\ndedupe_window = "1h"\n')
    with pytest.raises(ConfigError, match="at most 365d"):
        parse_config(
            '[schedules.p]\nevery = "60s"\nhandler = "h"\ndedupe_key = "k"\n'
            'dedupe_window = "400d"\n'
        )


def test_enqueue_v4_takes_the_same_keys_one_job_at_a_time(
    conn: psycopg.Connection, schema: str
) -> None:
    text = (
        "SELECT @schema@.enqueue_v4('h', dedupe_key => 'k', dedupe_window => '1 hour', "
        "dedupe_policy => %s)"
    )
    [(first,)] = sql(conn, schema, text, "existing")
    assert row(conn, schema, first)["dedupe_window_seconds"] == 3600
    [(again,)] = sql(conn, schema, text, "existing")
    assert again == first
    with pytest.raises(psycopg.Error) as err:
        sql(conn, schema, text, "reject")
    assert err.value.sqlstate == "PGWD1" and "job 1 of 1" in str(err.value)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="uncapped debounce"):
        sql(
            conn,
            schema,
            "SELECT @schema@.enqueue_v4('h', dedupe_key => 'd', dedupe_policy => 'debounce', "
            "debounce => '1 minute')",
        )
    assert count_jobs(conn, schema) == 1
