"""Dependencies and deadlines in SQL (schema 27, docs/guide/dependencies.md): enqueue with
parents, the resolution of children in the parent's own transaction, the policies of
on_parent_failure, the refusals at enqueue, claim_jobs_v2's end of expired jobs and what it
hands the daemon (a job's timeout, its parents' results). Against a real server; the
daemon's side is in tests/acceptance/test_dependencies.py."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from pruning import prune
from psycopg.rows import dict_row

from pgworkerd import client
from pgworkerd.client import InvalidJob, JobSpec
from pgworkerd.queue import admin
from pgworkerd.queue.queries import render


def sql(conn: psycopg.Connection, schema: str, text: str, *params: Any) -> list[tuple[Any, ...]]:
    cur = conn.execute(render(text, schema), params)  # type: ignore[arg-type]
    return cur.fetchall() if cur.description else []


def job(conn: psycopg.Connection, schema: str, job_id: int) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            render("SELECT * FROM @schema@.jobs WHERE id = %s", schema), (job_id,)
        ).fetchone()
    assert row is not None
    return row


def status(conn: psycopg.Connection, schema: str, job_id: int) -> str:
    return str(job(conn, schema, job_id)["status"])


def finish(conn: psycopg.Connection, schema: str, job_id: int, how: str = "completed") -> None:
    """End a job as any path does (a daemon's fenced finish, a worker in another language,
    an operator): the resolution is a trigger on the row, whatever wrote it."""
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET status = %s::@schema@.job_status, finished_at = now(), "
        "result = CASE WHEN %s = 'completed' THEN jsonb_build_object('from', id) END "
        "WHERE id = %s",
        how,
        how,
        job_id,
    )


def many(conn: psycopg.Connection, schema: str, jobs: list[dict[str, Any]]) -> list[int]:
    [(ids,)] = sql(conn, schema, "SELECT @schema@.enqueue_many_v3(%s::jsonb)", json.dumps(jobs))
    return list(ids)


def count_jobs(conn: psycopg.Connection, schema: str) -> int:
    [(n,)] = sql(conn, schema, "SELECT count(*) FROM @schema@.jobs")
    return int(n)


def refused(conn: psycopg.Connection, schema: str, jobs: list[dict[str, Any]]) -> str:
    """enqueue_many_v3 refuses `jobs` with 22023 and writes nothing; returns the message."""
    before = (
        count_jobs(conn, schema),
        sql(conn, schema, "SELECT count(*) FROM @schema@.job_parents"),
    )
    with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
        many(conn, schema, jobs)
    after = (
        count_jobs(conn, schema),
        sql(conn, schema, "SELECT count(*) FROM @schema@.job_parents"),
    )
    assert after == before
    return str(err.value)


def test_a_child_waits_for_its_parent_and_is_pending_when_it_completes(
    conn: psycopg.Connection, schema: str
) -> None:
    parent = client.enqueue(conn, "a", schema=schema)
    child = client.enqueue(conn, "b", after=[parent], schema=schema)
    row = job(conn, schema, child)
    assert (row["status"], row["parents_unfinished"], row["parents_failed"]) == ("waiting", 1, 0)
    assert row["on_parent_failure"] == "cancel"
    assert job(conn, schema, parent)["has_children"] is True
    assert sql(conn, schema, "SELECT child_id, parent_id FROM @schema@.job_parents") == [
        (child, parent)
    ]

    listener = psycopg.connect(conn.info.dsn, autocommit=True)
    try:
        listener.execute(f'LISTEN "{schema}.wake"')
        finish(conn, schema, parent)
        assert status(conn, schema, child) == "pending"
        payloads = [json.loads(n.payload) for n in listener.notifies(timeout=5, stop_after=1)]
    finally:
        listener.close()
    assert payloads == [{"q": "default", "h": "b", "id": child, "n": 1}]


def test_a_parent_completed_before_the_enqueue_leaves_the_child_pending_at_once(
    conn: psycopg.Connection, schema: str
) -> None:
    parent = client.enqueue(conn, "a", schema=schema)
    finish(conn, schema, parent)
    child = client.enqueue(conn, "b", after=[parent], schema=schema)
    row = job(conn, schema, child)
    assert (row["status"], row["parents_unfinished"], row["parents_failed"]) == ("pending", 0, 0)


def test_a_fan_in_child_starts_only_after_its_last_parent(
    conn: psycopg.Connection, schema: str
) -> None:
    parents = [client.enqueue(conn, "a", schema=schema) for _ in range(3)]
    child = client.enqueue(conn, "b", after=[*parents, parents[0]], schema=schema)  # dup: once
    assert job(conn, schema, child)["parents_unfinished"] == 3
    for n, parent in enumerate(parents, 1):
        assert status(conn, schema, child) == "waiting"
        finish(conn, schema, parent)
        assert job(conn, schema, child)["parents_unfinished"] == 3 - n
    assert status(conn, schema, child) == "pending"


def test_a_chain_in_one_call_refers_to_earlier_jobs_by_position(
    conn: psycopg.Connection, schema: str
) -> None:
    a, b, c = many(
        conn,
        schema,
        [
            {"handler": "a"},
            {"handler": "b", "after_index": [0]},
            {"handler": "c", "after_index": [0, 1]},
        ],
    )
    assert [status(conn, schema, j) for j in (a, b, c)] == ["pending", "waiting", "waiting"]
    assert sorted(sql(conn, schema, "SELECT child_id, parent_id FROM @schema@.job_parents")) == [
        (b, a),
        (c, a),
        (c, b),
    ]
    finish(conn, schema, a)
    assert [status(conn, schema, j) for j in (b, c)] == ["pending", "waiting"]
    finish(conn, schema, b)
    assert status(conn, schema, c) == "pending"


def test_python_enqueue_many_names_earlier_jobspecs_as_parents(
    conn: psycopg.Connection, schema: str
) -> None:
    probe = JobSpec("probe")
    segments = [JobSpec("segment", {"n": n}, after=[probe]) for n in range(3)]
    stitch = JobSpec("stitch", after=segments)
    ids = client.enqueue_many(conn, [probe, *segments, stitch], schema=schema)
    assert [status(conn, schema, j) for j in ids] == ["pending"] + ["waiting"] * 4
    assert job(conn, schema, ids[-1])["parents_unfinished"] == 3
    with pytest.raises(InvalidJob, match="job 1: after names a JobSpec that is not earlier"):
        client.enqueue_many(conn, [JobSpec("x", after=[stitch]), stitch], schema=schema)


def test_cancel_policy_cancels_the_child_and_its_own_children(
    conn: psycopg.Connection, schema: str
) -> None:
    parent = client.enqueue(conn, "a", schema=schema)
    child = client.enqueue(conn, "b", after=[parent], schema=schema)
    grandchild = client.enqueue(conn, "c", after=[child], on_parent_failure="run", schema=schema)
    finish(conn, schema, parent, "dead")
    row = job(conn, schema, child)
    assert row["status"] == "cancelled" and row["finished_at"] is not None
    assert row["last_error"] == f"cancelled: parent job {parent} ended dead"
    # the grandchild runs anyway (its policy), now that its parent is final
    assert status(conn, schema, grandchild) == "pending"


def test_run_policy_runs_the_child_once_every_parent_has_finished(
    conn: psycopg.Connection, schema: str
) -> None:
    p1, p2 = (client.enqueue(conn, "a", schema=schema) for _ in range(2))
    child = client.enqueue(conn, "b", after=[p1, p2], on_parent_failure="run", schema=schema)
    finish(conn, schema, p1, "cancelled")
    assert status(conn, schema, child) == "waiting"
    finish(conn, schema, p2)
    row = job(conn, schema, child)
    assert (row["status"], row["parents_failed"]) == ("pending", 1)


def test_hold_policy_keeps_the_child_waiting_until_an_operator_releases_it(
    conn: psycopg.Connection, schema: str
) -> None:
    parent = client.enqueue(conn, "a", schema=schema)
    child = client.enqueue(conn, "b", after=[parent], on_parent_failure="hold", schema=schema)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="is not held"):
        sql(conn, schema, "SELECT @schema@.job_held_release(%s)", child)  # not failed yet
    finish(conn, schema, parent, "dead")
    row = job(conn, schema, child)
    assert (row["status"], row["parents_unfinished"], row["parents_failed"]) == ("waiting", 0, 1)
    assert sql(conn, schema, "SELECT @schema@.job_held_release(%s)", child) == [("pending",)]
    assert status(conn, schema, child) == "pending"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="no such job"):
        sql(conn, schema, "SELECT @schema@.job_held_release(%s)", 10**12)


def test_a_parent_already_failed_at_enqueue_applies_the_policy_at_once(
    conn: psycopg.Connection, schema: str
) -> None:
    parent = client.enqueue(conn, "a", schema=schema)
    finish(conn, schema, parent, "dead")
    cancelled = client.enqueue(conn, "b", after=[parent], schema=schema)
    run = client.enqueue(conn, "b", after=[parent], on_parent_failure="run", schema=schema)
    held = client.enqueue(conn, "b", after=[parent], on_parent_failure="hold", schema=schema)
    row = job(conn, schema, cancelled)
    assert row["status"] == "cancelled"
    assert f"parent job {parent} had ended dead or cancelled" in row["last_error"]
    assert [status(conn, schema, j) for j in (run, held)] == ["pending", "waiting"]


def test_a_retried_parent_counts_as_unfinished_again(conn: psycopg.Connection, schema: str) -> None:
    parent = client.enqueue(conn, "a", schema=schema)
    child = client.enqueue(conn, "b", after=[parent], on_parent_failure="hold", schema=schema)
    finish(conn, schema, parent, "dead")
    # an operator's retry puts the parent back (job_retry): the child waits for it again
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET status = 'pending', finished_at = NULL WHERE id = %s",
        parent,
    )
    row = job(conn, schema, child)
    assert (row["status"], row["parents_unfinished"], row["parents_failed"]) == ("waiting", 1, 0)
    finish(conn, schema, parent)
    assert status(conn, schema, child) == "pending"


@pytest.mark.parametrize(
    ("jobs", "message"),
    [
        (
            [{"handler": "b", "after": [999999999]}],
            "job 1 of 1: after names job 999999999, which does not exist",
        ),
        (
            [{"handler": "b", "after_index": [0]}],
            "job 1 of 1: after_index may name only jobs earlier",
        ),
        (
            [{"handler": "a"}, {"handler": "b", "after_index": [1]}],
            "cannot wait for itself or a later job",
        ),
        (
            [{"handler": "a"}, {"handler": "b", "after_index": [2]}],
            "cannot wait for itself or a later job",
        ),
        ([{"handler": "b", "after_index": [-1]}], "after_index may name only jobs earlier"),
        ([{"handler": "b", "after": list(range(1, 100_001))}], "at most 1000 parents, not 100000"),
        ([{"handler": "b", "after": list(range(1, 1002))}], "at most 1000 parents, not 1001"),
        ([{"handler": "b", "after": "1"}], "after must be an array of job ids, not string"),
        ([{"handler": "b", "after": [1.5]}], "after must hold job ids (integers from 1), not 1.5"),
        ([{"handler": "b", "after": [0]}], "after must hold job ids (integers from 1), not 0"),
        ([{"handler": "b", "after": ["1"]}], "after must hold job ids"),
        (
            [{"handler": "b", "after": [1], "on_parent_failure": "retry"}],
            'on_parent_failure must be "cancel", "run" or "hold"',
        ),
        ([{"handler": "b", "on_parent_failure": "run"}], "on_parent_failure needs parents"),
        (
            [{"handler": "a", "dedupe_key": "k"}, {"handler": "b", "after_index": [0]}],
            "which has a dedupe_key",
        ),
        ([{"handler": "b", "afterr": [1]}], 'unknown key "afterr"'),
        ([{"handler": "b", "expires_at": "2000-01-01T00:00:00Z"}], "expires_at is in the past"),
        ([{"handler": "b", "expires_at": "infinity"}], "expires_at must be before 9000-01-01"),
        ([{"handler": "b", "expires_at": "tomorrow-ish"}], "expires_at must be a timestamp"),
        ([{"handler": "b", "expire_in": "-5 minutes"}], "expire_in must be above 0"),
        (
            [{"handler": "b", "expire_in": "1000000 years"}],
            "expire_in must be above 0 and at most 100 years",
        ),
        ([{"handler": "b", "expire_in": 60, "expires_at": "2999-01-01T00:00:00Z"}], "not both"),
        ([{"handler": "b", "expire_in": 60, "delay": 120}], "the job could never start"),
        ([{"handler": "b", "timeout": 0}], "timeout must be above 0 and at most 365 days"),
        ([{"handler": "b", "timeout": "NaN"}], "timeout must be"),
        ([{"handler": "b", "timeout": [1]}], "timeout must be seconds or an interval"),
    ],
)
def test_hostile_dependencies_and_deadlines_are_refused_and_write_nothing(
    conn: psycopg.Connection, schema: str, jobs: list[dict[str, Any]], message: str
) -> None:
    client.enqueue(conn, "existing", schema=schema)  # job 1: a parent that exists
    assert message in refused(conn, schema, jobs)


def test_a_pruned_parent_is_unknown(conn: psycopg.Connection, schema: str) -> None:
    parent = client.enqueue(conn, "a", schema=schema)
    finish(conn, schema, parent)
    sql(conn, schema, "DELETE FROM @schema@.jobs WHERE id = %s", parent)
    message = refused(conn, schema, [{"handler": "b", "after": [parent]}])
    assert f"after names job {parent}, which does not exist (never enqueued, or pruned)" in message


def test_python_refuses_the_same_before_any_round_trip(
    conn: psycopg.Connection, schema: str
) -> None:
    for kwargs, message in [
        ({"after": list(range(1, 100_001))}, "at most 1000 parents, not 100000"),
        ({"after": [True]}, "after must hold job ids"),
        ({"after": [1], "on_parent_failure": "never"}, "on_parent_failure must be"),
        ({"on_parent_failure": "run"}, "on_parent_failure needs parents"),
        ({"expires_at": datetime(2000, 1, 1, tzinfo=UTC)}, "expires_at is in the past"),
        ({"expires_at": datetime(2100, 1, 1)}, "timezone-aware"),
        ({"expire_in": float("inf")}, "expire_in must be above 0"),
        ({"expire_in": 60, "expires_at": datetime(2100, 1, 1, tzinfo=UTC)}, "not both"),
        ({"timeout": -1}, "timeout must be above 0"),
        ({"timeout": timedelta(days=400)}, "timeout must be above 0"),
    ]:
        with pytest.raises(InvalidJob, match=message):
            client.enqueue(conn, "b", schema=schema, **kwargs)  # type: ignore[arg-type]
    assert count_jobs(conn, schema) == 0


def test_enqueue_v3_takes_the_same_arguments_one_job_at_a_time(
    conn: psycopg.Connection, schema: str
) -> None:
    parent = client.enqueue(conn, "a", schema=schema)
    [(child,)] = sql(
        conn,
        schema,
        "SELECT @schema@.enqueue_v3('b', after => ARRAY[%s]::bigint[], "
        "on_parent_failure => 'hold', expire_in => '1 hour', timeout => '90 seconds')",
        parent,
    )
    row = job(conn, schema, child)
    assert (row["status"], row["on_parent_failure"], row["timeout_seconds"]) == (
        "waiting",
        "hold",
        90,
    )
    assert timedelta(minutes=59) < row["expires_at"] - row["created_at"] <= timedelta(hours=1)
    with pytest.raises(
        psycopg.errors.InvalidParameterValue, match="at most 1000 parents, not 100000"
    ):
        sql(
            conn,
            schema,
            "SELECT @schema@.enqueue_v3('b', after => (SELECT array_agg(g) FROM "
            "generate_series(1, 100000) g)::bigint[])",
        )


def test_a_parent_finishing_while_its_child_is_enqueued_is_never_missed(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    """The child's enqueue holds its parents' rows until it commits: a parent that
    finishes meanwhile waits for it, then sees (and releases) the child."""
    parent = client.enqueue(conn, "a", schema=schema)
    with psycopg.connect(test_db_dsn) as enqueuer:  # a transaction left open
        child = client.enqueue(enqueuer, "b", after=[parent], schema=schema)
        finished = threading.Event()

        def finish_parent() -> None:
            with psycopg.connect(test_db_dsn, autocommit=True) as other:
                finish(other, schema, parent)
            finished.set()

        thread = threading.Thread(target=finish_parent)
        thread.start()
        time.sleep(0.5)
        assert not finished.is_set()  # blocked on the child's enqueue
        enqueuer.commit()
    thread.join(timeout=30)
    assert finished.is_set()
    assert status(conn, schema, child) == "pending"


def test_parents_finishing_concurrently_release_the_child_exactly_once(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    """Each parent's finish updates the child's row: concurrent finishes serialise there,
    so no count is lost and the child is pending only when both have committed."""
    for _ in range(5):
        p1, p2 = (client.enqueue(conn, "a", schema=schema) for _ in range(2))
        child = client.enqueue(conn, "b", after=[p1, p2], schema=schema)
        with psycopg.connect(test_db_dsn) as c1, psycopg.connect(test_db_dsn) as c2:
            finish(c1, schema, p1)
            # the second finish waits for c1's lock on the child's row
            thread = threading.Thread(target=finish, args=(c2, schema, p2))
            thread.start()
            time.sleep(0.2)
            assert status(conn, schema, child) == "waiting"
            c1.commit()
            thread.join(timeout=30)
            assert not thread.is_alive()
            assert status(conn, schema, child) == "waiting"  # c2 not committed yet
            c2.commit()
        row = job(conn, schema, child)
        assert (row["status"], row["parents_unfinished"]) == ("pending", 0)


def test_an_enqueuer_cannot_name_another_logins_job_as_a_parent(
    conn: psycopg.Connection, schema: str, roles: dict[str, str]
) -> None:
    """It cannot make a child of another login's job (which would hand it that job's
    result): such a parent is refused as unknown, and nothing is written."""
    enqueuer = roles[f"{schema}_enqueuer"]
    theirs = client.enqueue(conn, "secret", schema=schema)  # the owner's job
    with psycopg.connect(enqueuer, autocommit=True) as mine:
        own = client.enqueue(mine, "a", schema=schema)
        child = client.enqueue(mine, "b", after=[own], schema=schema)
        with pytest.raises(
            psycopg.errors.InvalidParameterValue, match="not readable by this login"
        ):
            client.enqueue(mine, "b", after=[theirs], schema=schema)
    assert status(conn, schema, child) == "waiting"
    assert job(conn, schema, theirs)["has_children"] is False


# -- claim_jobs_v2 ---------------------------------------------------------------------------


def claim(
    conn: psycopg.Connection, schema: str, handlers: list[str], **kw: Any
) -> list[dict[str, Any]]:
    args = {
        "worker": "w1",
        "queues": ["default"],
        "handlers": handlers,
        "lease_seconds": [60.0] * len(handlers),
        "free_slots": [10] * len(handlers),
        "max_jobs": 10,
    } | kw
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            render(
                "SELECT * FROM @schema@.claim_jobs_v2(%(worker)s, %(queues)s, %(handlers)s, "
                "%(lease_seconds)s::float8[], %(free_slots)s, %(max_jobs)s)",
                schema,
            ),
            args,
        ).fetchall()


def test_claim_hands_over_the_jobs_timeout_and_its_parents_results(
    conn: psycopg.Connection, schema: str
) -> None:
    plain = client.enqueue(conn, "a", schema=schema)
    p1, p2 = (client.enqueue(conn, "p", schema=schema) for _ in range(2))
    child = client.enqueue(
        conn, "b", after=[p1, p2], on_parent_failure="run", timeout=7.5, schema=schema
    )
    finish(conn, schema, p1)
    finish(conn, schema, p2, "dead")
    rows = {r["id"]: r for r in claim(conn, schema, ["a", "b"])}
    assert rows[plain]["timeout_seconds"] is None and rows[plain]["parents"] is None
    assert rows[child]["timeout_seconds"] == 7.5
    assert rows[child]["parents"] == {str(p1): {"from": p1}, str(p2): None}


def test_an_expired_job_is_never_claimed_and_ends_with_its_reason(
    conn: psycopg.Connection, schema: str
) -> None:
    soon = client.enqueue(conn, "a", expire_in=0.2, schema=schema)
    later = client.enqueue(conn, "a", expire_in=3600, schema=schema)
    time.sleep(0.4)
    claimed = [r["id"] for r in claim(conn, schema, ["a"])]
    assert claimed == [later]
    row = job(conn, schema, soon)
    assert (row["status"], row["attempts"], row["started_at"]) == ("cancelled", 0, None)
    assert row["last_error"].startswith("expired: not started by its expires_at ")


def test_an_expired_job_whose_lease_ran_out_is_not_started_again(
    conn: psycopg.Connection, schema: str
) -> None:
    job_id = client.enqueue(conn, "a", expire_in=0.5, schema=schema)
    assert [r["id"] for r in claim(conn, schema, ["a"])] == [job_id]
    time.sleep(0.7)
    sql(conn, schema, "UPDATE @schema@.jobs SET locked_until = now() - interval '1s'")
    assert claim(conn, schema, ["a"]) == []
    row = job(conn, schema, job_id)
    assert (row["status"], row["locked_by"]) == ("cancelled", None)
    assert row["last_error"].startswith("expired: its lease ran out after its expires_at")


def test_claim_jobs_v2_refuses_absurd_arrays(conn: psycopg.Connection, schema: str) -> None:
    client.enqueue(conn, "a", schema=schema)
    handlers = [f"h{n}" for n in range(1001)]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="at most 1000 handlers"):
        claim(conn, schema, handlers)
    with pytest.raises(
        psycopg.errors.InvalidParameterValue, match="at most 1000 handlers and 1000 queues"
    ):
        claim(conn, schema, ["a"], queues=[f"q{n}" for n in range(5000)])
    assert status(conn, schema, 1) == "pending"


def age_finished(conn: psycopg.Connection, schema: str) -> None:
    """Every finished job finished two days ago."""
    sql(
        conn,
        schema,
        "UPDATE @schema@.jobs SET finished_at = now() - interval '2 days' "
        "WHERE finished_at IS NOT NULL",
    )


def test_retention_keeps_a_parent_until_its_children_have_finished(
    conn: psycopg.Connection, schema: str
) -> None:
    """A completed parent whose child has not finished (its result is read at each claim
    of the child) is not pruned; once the child has finished, it is."""
    parent = client.enqueue(conn, "a", schema=schema)
    child = client.enqueue(conn, "b", after=[parent], schema=schema)
    lone = client.enqueue(conn, "a", schema=schema)
    finish(conn, schema, parent)
    finish(conn, schema, lone)
    age_finished(conn, schema)
    assert prune(conn, jobs_older_than=86400, schema=schema).jobs == 1  # the lone job only
    assert status(conn, schema, parent) == "completed"
    finish(conn, schema, child)
    age_finished(conn, schema)
    assert prune(conn, jobs_older_than=86400, schema=schema).jobs == 2
    assert count_jobs(conn, schema) == 0
    assert sql(conn, schema, "SELECT count(*) FROM @schema@.job_parents") == [(0,)]


def test_only_the_operator_releases_a_held_job(
    conn: psycopg.Connection, schema: str, roles: dict[str, str]
) -> None:
    """It releases a job held after a parent failed (`pgworkerd release`), and only such a
    job: any other id is refused with 22023 and nothing changes; the enqueuer and the
    daemon cannot release at all."""
    parent = client.enqueue(conn, "a", schema=schema)
    held = client.enqueue(conn, "b", after=[parent], on_parent_failure="hold", schema=schema)
    waiting = client.enqueue(conn, "b", after=[parent], on_parent_failure="run", schema=schema)
    other = client.enqueue(conn, "c", after=[held], schema=schema)
    finish(conn, schema, parent, "dead")
    release = "SELECT @schema@.job_held_release(%s)"
    for kind in ("enqueuer", "daemon"):
        with (
            psycopg.connect(roles[f"{schema}_{kind}"], autocommit=True) as c,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            sql(c, schema, release, held)
    with psycopg.connect(roles[f"{schema}_operator"], autocommit=True) as operator:
        for job_id in (waiting, other, parent):
            before = job(conn, schema, job_id)
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="is not held"):
                sql(operator, schema, release, job_id)
            assert job(conn, schema, job_id) == before
        assert status(conn, schema, held) == "waiting"
        assert sql(operator, schema, release, held) == [("pending",)]


def test_a_parent_dying_while_another_completes_never_runs_the_child_early(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    """One parent completes while the other dies, in concurrent transactions, in either
    order: the child (cancel policy) ends cancelled and is never pending; with the run
    policy it is pending only once both have committed; a parent with many children
    releases every one of them while one child is cancelled by an operator meanwhile."""
    for first, second in (("completed", "dead"), ("dead", "completed")):
        p1, p2 = (client.enqueue(conn, "a", schema=schema) for _ in range(2))
        cancel = client.enqueue(conn, "b", after=[p1, p2], schema=schema)
        run = client.enqueue(conn, "b", after=[p1, p2], on_parent_failure="run", schema=schema)
        with psycopg.connect(test_db_dsn) as c1, psycopg.connect(test_db_dsn) as c2:
            finish(c1, schema, p1, first)
            thread = threading.Thread(target=finish, args=(c2, schema, p2, second))
            thread.start()
            time.sleep(0.2)
            c1.commit()
            thread.join(timeout=30)
            assert not thread.is_alive()
            assert status(conn, schema, run) == "waiting"
            c2.commit()
        assert status(conn, schema, cancel) == "cancelled"
        assert status(conn, schema, run) == "pending"

    parent = client.enqueue(conn, "a", schema=schema)
    children = client.enqueue_many(
        conn, [JobSpec("b", {"n": n}, after=[parent]) for n in range(300)], schema=schema
    )
    with psycopg.connect(test_db_dsn) as operator:
        cancelled = client_cancel(operator, schema, children[150])
        thread = threading.Thread(target=finish, args=(conn, schema, parent))
        thread.start()
        time.sleep(0.2)
        operator.commit()
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert cancelled == "cancelled"
    statuses = [status(conn, schema, c) for c in children]
    assert statuses.count("pending") == 299 and statuses[150] == "cancelled"


def client_cancel(c: psycopg.Connection, schema: str, job_id: int) -> str:
    """`pgworkerd cancel`'s statement, in `c`'s open transaction."""
    return admin.cancel(c, [job_id], schema=schema)[job_id]


def test_a_bulk_delete_keeps_what_retention_keeps(conn: psycopg.Connection, schema: str) -> None:
    """The dashboard's bulk delete (admin.delete_finished) deletes finished jobs, but, like
    retention, not a completed parent whose child has not finished (the child reads the
    parent's result when it starts) nor a batch member whose callback has not (it reads
    the members' outcomes): those are left and not counted; once the child has finished,
    the parent goes too."""
    parent = client.enqueue(conn, "a", schema=schema)
    other_parent = client.enqueue(conn, "a", schema=schema)
    child = client.enqueue(conn, "b", after=[parent, other_parent], schema=schema)
    lone = client.enqueue(conn, "a", schema=schema)
    [(_batch_id, callback, members)] = sql(
        conn,
        schema,
        "SELECT * FROM @schema@.batch_enqueue(%s::jsonb, %s::jsonb)",
        json.dumps([{"handler": "m"}, {"handler": "m"}]),
        json.dumps({"handler": "cb"}),
    )
    finish(conn, schema, parent)
    finish(conn, schema, lone)
    finish(conn, schema, members[0])
    assert status(conn, schema, child) == "waiting"  # on other_parent
    asked = [parent, lone, members[0], child]
    assert admin.delete_finished(conn, asked, schema=schema) == [lone]
    assert job(conn, schema, parent)["status"] == "completed"
    assert job(conn, schema, members[0])["status"] == "completed"
    finish(conn, schema, other_parent)
    finish(conn, schema, child)
    finish(conn, schema, members[1])
    finish(conn, schema, callback)
    assert admin.delete_finished(conn, asked, schema=schema) == sorted([parent, members[0], child])
