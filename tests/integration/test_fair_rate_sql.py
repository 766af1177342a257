"""Fair share and start-rate limits at the SQL level (migration 0033, issue 25 items 1
and 2): claim_v4 serves a fair handler's keys in turns (weights, priorities, work
conservation, bounded whatever the keys), and never starts a rate-limited handler's or
key's jobs faster than its rate, under concurrent claimers too; hostile arguments are
refused with 22023 and claim nothing."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgworkerd import client
from pgworkerd.client import JobSpec
from pgworkerd.queue import explain, registry


def fill(conn: psycopg.Connection, schema: str, specs: list[JobSpec]) -> list[int]:
    return client.enqueue_many(conn, specs, schema=schema)


def claim4(
    conn: psycopg.Connection,
    schema: str,
    limit: int = 1,
    *,
    worker: str = "w",
    fair: bool | None = None,
    weights: dict[str, int] | None = None,
    rate: float | None = None,
    rate_per_key: float | None = None,
    max_running: int | None = None,
    per_key: int | None = None,
) -> list[str | None]:
    """One claim_v4 for handler "h" on queue default; the claimed jobs' keys in claim
    order (by id within the claim)."""
    rows = conn.execute(
        sql.SQL(
            "SELECT c.id, j.concurrency_key FROM {s}.claim_v4("
            "%s, '{{default}}', '{{h}}', '{{60}}', %s, %s, NULL, NULL, %s, %s, %s, %s, %s, %s)"
            " AS c JOIN {s}.jobs j USING (id) ORDER BY c.id"
        ).format(s=sql.Identifier(schema)),
        [
            worker,
            [limit],
            limit,
            [max_running],
            [per_key],
            None if fair is None else [fair],
            None if weights is None else json.dumps([weights]),
            None if rate is None else [rate],
            None if rate_per_key is None else [rate_per_key],
        ],
    ).fetchall()
    return [key for _, key in rows]


def finish_all(conn: psycopg.Connection, schema: str) -> None:
    conn.execute(
        sql.SQL(
            "UPDATE {}.jobs SET status = 'completed', finished_at = now(), locked_by = NULL, "
            "locked_until = NULL WHERE status = 'running'"
        ).format(sql.Identifier(schema))
    )


# -- fair share ---------------------------------------------------------------------------


def test_the_nine_late_keys_start_within_the_first_round(
    conn: psycopg.Connection, schema: str
) -> None:
    """1,000 jobs of key a, then 10 of each of 9 other keys: a fair claim starts each of
    the 9 others' first job within the first 10 starts; FIFO starts 1,000 a's first."""
    others = [f"k{n}" for n in range(1, 10)]
    fill(conn, schema, [JobSpec("h", concurrency_key="a") for _ in range(1000)])
    fill(conn, schema, [JobSpec("h", concurrency_key=k) for k in others for _ in range(10)])
    fifo = [claim4(conn, schema)[0] for _ in range(10)]
    assert fifo == ["a"] * 10
    finish_all(conn, schema)
    fair = [claim4(conn, schema, fair=True)[0] for _ in range(10)]
    assert sorted(set(fair)) == sorted({"a", *others}), fair
    # the next round again serves every key once, a included
    again = [claim4(conn, schema, fair=True)[0] for _ in range(10)]
    assert Counter(again) == Counter({"a": 1, **{k: 1 for k in others}})


def test_one_claim_of_many_jobs_takes_them_in_turns(conn: psycopg.Connection, schema: str) -> None:
    fill(conn, schema, [JobSpec("h", concurrency_key="a") for _ in range(50)])
    fill(conn, schema, [JobSpec("h", concurrency_key=k) for k in "bc" for _ in range(5)])
    fill(conn, schema, [JobSpec("h") for _ in range(5)])  # no key: one more key
    got = claim4(conn, schema, 8, fair=True)
    assert Counter(got) == Counter({"a": 2, "b": 2, "c": 2, None: 2})


def test_weights_give_a_key_that_many_jobs_per_turn(conn: psycopg.Connection, schema: str) -> None:
    fill(conn, schema, [JobSpec("h", concurrency_key=k) for k in "abc" for _ in range(40)])
    got = [claim4(conn, schema, fair=True, weights={"a": 3})[0] for _ in range(25)]
    assert Counter(got) == Counter({"a": 15, "b": 5, "c": 5}), got
    # and in claims of several jobs
    finish_all(conn, schema)
    got = claim4(conn, schema, 10, fair=True, weights={"a": 3, "c": 2})
    counts = Counter(got)
    assert counts["a"] >= counts["c"] >= counts["b"] >= 1, got


def test_a_fair_claim_is_work_conserving(conn: psycopg.Connection, schema: str) -> None:
    """Keys with nothing due, or full, lose their turn, never a slot."""
    fill(conn, schema, [JobSpec("h", concurrency_key="later", delay=3600) for _ in range(5)])
    fill(conn, schema, [JobSpec("h", concurrency_key="full") for _ in range(5)])
    fill(conn, schema, [JobSpec("h", concurrency_key="z") for _ in range(10)])
    assert claim4(conn, schema, 1, fair=True, per_key=1) == ["full"]
    got = claim4(conn, schema, 6, fair=True, per_key=1)
    assert got == ["z"]  # per key 1: one of z; full is full, later not due
    finish_all(conn, schema)
    got = claim4(conn, schema, 6, fair=True)
    assert Counter(got) == Counter({"full": 3, "z": 3})


def test_a_fair_claim_past_its_probe_budget_fills_in_fifo_order(
    conn: psycopg.Connection, schema: str
) -> None:
    """Hundreds of keys whose jobs are all scheduled later cost the claim its probe
    budget, not its slots: the due job behind them is still claimed."""
    fill(
        conn,
        schema,
        [JobSpec("h", concurrency_key=f"a{n:04}", delay=3600) for n in range(500)],
    )
    fill(conn, schema, [JobSpec("h", concurrency_key="zz")])
    assert claim4(conn, schema, 2, fair=True) == ["zz"]


def test_fairness_holds_within_a_priority_level(conn: psycopg.Connection, schema: str) -> None:
    fill(conn, schema, [JobSpec("h", concurrency_key="a", priority=5) for _ in range(10)])
    fill(conn, schema, [JobSpec("h", concurrency_key="b", priority=5) for _ in range(10)])
    fill(conn, schema, [JobSpec("h", concurrency_key="low", priority=9) for _ in range(10)])
    fill(conn, schema, [JobSpec("h", concurrency_key="urgent", priority=0) for _ in range(2)])
    got = claim4(conn, schema, 6, fair=True)
    assert Counter(got) == Counter({"urgent": 2, "a": 2, "b": 2}), got
    assert claim4(conn, schema, 30, fair=True).count("low") == 10


def test_a_paused_fair_handler_claims_nothing(conn: psycopg.Connection, schema: str) -> None:
    fill(conn, schema, [JobSpec("h", concurrency_key="a")])
    conn.execute(sql.SQL("SELECT {}.pause_handler('h')").format(sql.Identifier(schema)))
    assert claim4(conn, schema, 5, fair=True) == []


# -- start-rate limits --------------------------------------------------------------------


def race(
    dsn: str, schema: str, seconds: float, threads: int = 3, **limits: Any
) -> list[tuple[float, str | None]]:
    """`threads` claimers (each its own connection) claim handler h as fast as they can
    for `seconds`; returns each start (started_at as epoch, key), from the database."""
    errors: list[BaseException] = []
    deadline = time.monotonic() + seconds

    def worker(n: int) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as c:
                while time.monotonic() < deadline:
                    if not claim4(c, schema, 4, worker=f"w{n}", **limits):
                        time.sleep(0.01)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors
    with psycopg.connect(dsn) as c:
        return [
            (float(at), key)
            for at, key in c.execute(
                sql.SQL(
                    "SELECT extract(epoch FROM started_at), concurrency_key FROM {}.jobs "
                    "WHERE started_at IS NOT NULL ORDER BY started_at"
                ).format(sql.Identifier(schema))
            )
        ]


def most_in_window(times: list[float], window: float) -> int:
    """The most starts in any half-open window [t, t + window)."""
    times = sorted(times)
    most = 0
    j = 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        most = max(most, i - j + 1)
    return most


def test_concurrent_claimers_never_exceed_the_rate(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    fill(conn, schema, [JobSpec("h") for _ in range(200)])
    starts = race(test_db_dsn, schema, 6.0, rate=5.0)
    times = [t for t, _ in starts]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.2 - 1e-6, min(gaps)
    assert most_in_window(times, 1.0) <= 5
    # and the rate is used, not just respected (a loaded box: a generous bound)
    assert len(times) >= 15, len(times)


def test_concurrent_claimers_never_exceed_the_rate_per_key(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    fill(conn, schema, [JobSpec("h", concurrency_key=k) for _ in range(50) for k in "abc"])
    fill(conn, schema, [JobSpec("h") for _ in range(30)])  # no key: not limited by it
    starts = race(test_db_dsn, schema, 5.0, rate_per_key=2.0)
    for key in "abc":
        times = [t for t, k in starts if k == key]
        assert most_in_window(times, 1.0) <= 2, key
        assert len(times) >= 4, (key, len(times))
    assert sum(1 for _, k in starts if k is None) == 30


def test_a_fair_handler_with_rates(conn: psycopg.Connection, schema: str, test_db_dsn: str) -> None:
    fill(conn, schema, [JobSpec("h", concurrency_key="a") for _ in range(100)])
    fill(conn, schema, [JobSpec("h", concurrency_key=k) for k in "bc" for _ in range(10)])
    starts = race(test_db_dsn, schema, 4.0, fair=True, rate=4.0, rate_per_key=2.0)
    times = [t for t, _ in starts]
    assert most_in_window(times, 1.0) <= 4
    for key in "abc":
        assert most_in_window([t for t, k in starts if k == key], 1.0) <= 2
    assert {k for _, k in starts[:3]} == {"a", "b", "c"}, starts[:3]


def test_the_bucket_commits_with_the_claim(conn: psycopg.Connection, schema: str) -> None:
    """A claim rolled back takes its debit along; a committed one keeps it."""
    fill(conn, schema, [JobSpec("h") for _ in range(3)])
    with conn.transaction(force_rollback=True):
        assert len(claim4(conn, schema, 3, rate=0.01)) == 1
    assert len(claim4(conn, schema, 3, rate=0.01)) == 1
    assert claim4(conn, schema, 3, rate=0.01) == []  # the next token is 100 s away
    next_at = conn.execute(
        sql.SQL(
            "SELECT extract(epoch FROM next_at - now()) FROM {}.rate_buckets "
            "WHERE handler = 'h' AND concurrency_key = ''"
        ).format(sql.Identifier(schema))
    ).fetchone()
    assert next_at is not None and 90 < float(next_at[0]) <= 100


# -- hostile arguments --------------------------------------------------------------------


@pytest.mark.parametrize(
    "limits, named",
    [
        ({"rate": 0.0}, "rate"),
        ({"rate": -1.0}, "rate"),
        ({"rate": float("nan")}, "rate"),
        ({"rate": 1e12}, "rate"),
        ({"rate": float("inf")}, "rate"),
        ({"rate_per_key": 0.0}, "rate_per_key"),
        ({"rate_per_key": float("nan")}, "rate_per_key"),
        ({"weights": {"a": 0}}, "fair_weights"),
        ({"weights": {"a": -2}}, "fair_weights"),
        ({"weights": {"a": 1.5}}, "fair_weights"),
        ({"weights": {"a": 1001}}, "fair_weights"),
        ({"weights": {"a": "3"}}, "fair_weights"),
    ],
)
def test_hostile_limits_are_refused(
    conn: psycopg.Connection, schema: str, limits: dict[str, Any], named: str
) -> None:
    fill(conn, schema, [JobSpec("h", concurrency_key="a")])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=named):
        claim4(conn, schema, 1, fair=True, **limits)
    assert claim4(conn, schema, 1) == ["a"]  # nothing was claimed or changed


def test_arrays_of_the_wrong_length_are_refused(conn: psycopg.Connection, schema: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="fair must be"):
        conn.execute(
            sql.SQL(
                "SELECT * FROM {}.claim_v4('w', '{{default}}', '{{h}}', '{{60}}', '{{1}}', 1, "
                "fair => '{{true,false}}')"
            ).format(sql.Identifier(schema))
        )
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="fair_weights must be"):
        conn.execute(
            sql.SQL(
                "SELECT * FROM {}.claim_v4('w', '{{default}}', '{{h}}', '{{60}}', '{{1}}', 1, "
                "fair_weights => '{{\"a\": 1}}')"
            ).format(sql.Identifier(schema))
        )


# -- explain ------------------------------------------------------------------------------

SECRET = "test-registry-secret-" + "x" * 32


def declare(conn: psycopg.Connection, schema: str, **settings: Any) -> None:
    """A live daemon's registry row serving handler h with these settings (as presence
    writes them)."""
    handlers = {"h": {"queues": None, "slots": None, **settings}}
    info = registry.WorkerInfo("host-a:1:x", "host-a", 1, "t", ["default"], ["h"], 4, handlers)
    registry.register(conn, info, "running", schema, secret=SECRET)


def reasons(conn: psycopg.Connection, schema: str, job_id: int) -> dict[str, dict[str, Any]]:
    found = explain.explain(conn, schema, job_id)
    assert found is not None
    return {r["code"]: r for r in found["reasons"]}


def test_explain_gives_the_time_of_the_next_token(conn: psycopg.Connection, schema: str) -> None:
    declare(conn, schema, rate="1/h", rate_per_key="1/h")
    ids = fill(conn, schema, [JobSpec("h", concurrency_key="a") for _ in range(2)])
    assert claim4(conn, schema, 2, rate=1 / 3600, rate_per_key=1 / 3600) == ["a"]
    why = reasons(conn, schema, ids[1])
    found = explain.explain(conn, schema, ids[1])
    assert found is not None
    limited = [r for r in found["reasons"] if r["code"] == "rate_limited"]
    assert [r["facts"]["key"] for r in limited] == [None, "a"]
    assert all(3500 < r["facts"]["in_seconds"] <= 3600 for r in limited)
    assert "next token is due at" in limited[0]["message"] and "1/h" in limited[0]["message"]
    assert "claimable" not in why


def test_explain_names_the_keys_ahead_of_a_fair_jobs_turn(
    conn: psycopg.Connection, schema: str
) -> None:
    declare(conn, schema, fair=True)
    fill(conn, schema, [JobSpec("h", concurrency_key=k) for k in "abcde" for _ in range(2)])
    assert claim4(conn, schema, 1, fair=True) == ["a"]  # the cursor is at a now
    e = conn.execute(
        sql.SQL(
            "SELECT min(id) FROM {}.jobs WHERE concurrency_key = 'e' AND status = 'pending'"
        ).format(sql.Identifier(schema))
    ).fetchone()
    assert e is not None
    why = reasons(conn, schema, e[0])
    assert why["fair_turn"]["facts"]["keys_ahead"] == ["b", "c", "d"]
    assert "claimable" in why  # informational: nothing holds it back
    b = conn.execute(
        sql.SQL("SELECT min(id) FROM {}.jobs WHERE concurrency_key = 'b'").format(
            sql.Identifier(schema)
        )
    ).fetchone()
    assert b is not None
    assert reasons(conn, schema, b[0])["fair_turn"]["facts"]["keys_ahead"] == []
    # a key before the cursor: the walk wraps around
    a2 = conn.execute(
        sql.SQL(
            "SELECT min(id) FROM {}.jobs WHERE concurrency_key = 'a' AND status = 'pending'"
        ).format(sql.Identifier(schema))
    ).fetchone()
    assert a2 is not None
    assert reasons(conn, schema, a2[0])["fair_turn"]["facts"]["keys_ahead"] == [
        "b",
        "c",
        "d",
        "e",
    ]


# -- through claim_jobs_v3, the daemon's claim ---------------------------------------------


def claim_v3_wrapper(conn: psycopg.Connection, schema: str, handler: dict[str, Any]) -> list[Any]:
    return conn.execute(
        sql.SQL("SELECT id FROM {}.claim_jobs_v3('w', '{{default}}', 5, %s)").format(
            sql.Identifier(schema)
        ),
        [json.dumps([{"name": "h", "lease_seconds": 60, "free": 5, **handler}])],
    ).fetchall()


@pytest.mark.parametrize(
    "keys, named",
    [
        ({"rate": 0}, '"rate"'),
        ({"rate": -1}, '"rate"'),
        ({"rate": 1e12}, '"rate"'),
        ({"rate": "2/s"}, '"rate"'),
        ({"rate_per_key": 0}, '"rate_per_key"'),
        ({"fair": "yes"}, '"fair"'),
        ({"weights": [1]}, '"weights"'),
        ({"fair": True, "weights": {"a": 0}}, "fair_weights"),
        ({"fair": True, "weights": {"a": 2.5}}, "fair_weights"),
        ({"rates": 1}, "unknown key"),
    ],
)
def test_claim_jobs_v3_refuses_hostile_keys(
    conn: psycopg.Connection, schema: str, keys: dict[str, Any], named: str
) -> None:
    fill(conn, schema, [JobSpec("h", concurrency_key="a")])
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=named):
        claim_v3_wrapper(conn, schema, keys)
    assert claim4(conn, schema, 1) == ["a"]  # nothing was claimed


def test_claim_jobs_v3_claims_fair_and_rate_limited(conn: psycopg.Connection, schema: str) -> None:
    fill(conn, schema, [JobSpec("h", concurrency_key="a") for _ in range(20)])
    fill(conn, schema, [JobSpec("h", concurrency_key=k) for k in "bc"])
    got = claim_v3_wrapper(conn, schema, {"fair": True, "weights": {"a": 2}})
    keys = conn.execute(
        sql.SQL("SELECT concurrency_key FROM {}.jobs WHERE id = ANY(%s)").format(
            sql.Identifier(schema)
        ),
        [[r[0] for r in got]],
    ).fetchall()
    assert Counter(k for (k,) in keys) == Counter({"a": 3, "b": 1, "c": 1})
    assert len(claim_v3_wrapper(conn, schema, {"rate": 0.01})) == 1
    assert claim_v3_wrapper(conn, schema, {"rate": 0.01}) == []
