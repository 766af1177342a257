"""The schedule functions against real PostgreSQL: one run row per (schedule, tick) with
its job created in the same transaction, the overlap policies, the enqueue checks a
scheduled job goes through, retention, and the daemon role's grants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import leasing
import psycopg
import pytest
from pruning import prune
from psycopg import sql

from pgworkerd.queue import admin, lease, registry, schedules

# a daemon's registry secret (schema 24), the same for every row of these tests
SECRET = "test-registry-secret-" + "x" * 32

JOB = {"handler": "h", "payload": {"n": 1}, "queue": "default", "priority": 0}
# ticks after the schedules are declared (earlier ones are before their time), and due
# within a minute (schema 24 refuses ticks further ahead): set by each test
T0 = datetime.now(UTC)


@pytest.fixture(autouse=True)
def base_tick() -> None:
    global T0
    T0 = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=20)


def tick(n: int) -> datetime:
    return T0 + timedelta(seconds=n)


def live(conn: psycopg.Connection, worker: str, schema: str) -> None:
    """Register `worker` (schema 24: a tick is fired by a live daemon only)."""
    info = registry.WorkerInfo(worker, "host", 1, "t", ["default"], ["h"], 1)
    registry.register(conn, info, "running", schema, secret=SECRET)


def fire(
    conn: psycopg.Connection,
    name: str,
    at: datetime,
    job: dict,
    overlap: str,
    worker: str,
    schema: str,
) -> schedules.Fired:
    """Fire a tick of a declared schedule whose stored definition is `job` and `overlap`
    (schema 22: the job is the stored one's): the definition is declared again first."""
    if conn.execute(
        sql.SQL("SELECT 1 FROM {}.schedules WHERE name = %s").format(sql.Identifier(schema)),
        (name,),
    ).fetchone():
        schedules.declare(conn, name, {**job, "every": 1.0, "overlap": overlap}, worker, schema)
    live(conn, worker, schema)
    return schedules.fire(conn, name, at, worker, schema)


def runs(conn: psycopg.Connection, schema: str) -> list[tuple]:
    return conn.execute(
        sql.SQL(
            "SELECT tick, job_id, skipped, fired_by FROM {}.schedule_runs ORDER BY tick"
        ).format(sql.Identifier(schema))
    ).fetchall()


def claim_one(conn: psycopg.Connection, schema: str) -> int:
    [job] = leasing.claim(
        conn,
        "w",
        queues=["default"],
        handlers={"h": lease.HandlerCapacity(30, 10)},
        limit=1,
        schema=schema,
    )
    return job.id


def test_a_tick_is_fired_once_and_its_job_created_with_it(
    conn: psycopg.Connection, schema: str
) -> None:
    handled = schedules.declare(conn, "s", {"every": 1.0}, "a", schema)
    assert handled <= datetime.now(UTC)
    first = fire(conn, "s", tick(1), JOB, "allow", "a", schema)
    again = fire(conn, "s", tick(1), JOB, "allow", "b", schema)
    assert first.outcome == "fired" and first.job_id is not None
    assert again == schedules.Fired("taken", None)
    job = admin.get(conn, first.job_id, schema=schema)
    assert job is not None and (job["handler"], job["payload"]) == ("h", {"n": 1})
    assert runs(conn, schema) == [(tick(1), first.job_id, None, "a")]
    # the declaration now says the schedule is handled up to that tick
    assert schedules.declare(conn, "s", {"every": 1.0}, "b", schema) == tick(1)


def test_an_invalid_job_is_refused_and_records_nothing(
    conn: psycopg.Connection, schema: str
) -> None:
    schedules.declare(conn, "s", {"every": 1.0}, "a", schema)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        fire(conn, "s", tick(1), {**JOB, "handler": "bad\nname"}, "allow", "a", schema)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        fire(conn, "s", tick(1), {**JOB, "priority": 10**6}, "allow", "a", schema)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        fire(conn, "undeclared", tick(1), JOB, "allow", "a", schema)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        fire(conn, "s", tick(1), JOB, "sometimes", "a", schema)
    assert runs(conn, schema) == []
    assert admin.counts(conn, schema=schema) == []


def test_overlap_skip_waits_for_the_last_job_to_finish(
    conn: psycopg.Connection, schema: str
) -> None:
    schedules.declare(conn, "s", {"every": 1.0}, "a", schema)
    fired = fire(conn, "s", tick(1), JOB, "skip", "a", schema)
    skipped = fire(conn, "s", tick(2), JOB, "skip", "a", schema)  # pending
    assert skipped == schedules.Fired("skipped", fired.job_id)
    assert claim_one(conn, schema) == fired.job_id
    assert fire(conn, "s", tick(3), JOB, "skip", "a", schema).outcome == "skipped"
    conn.execute(
        sql.SQL(
            "UPDATE {}.jobs SET status = 'completed', locked_by = NULL, locked_until = NULL, "
            "finished_at = now() WHERE id = %s"
        ).format(sql.Identifier(schema)),
        [fired.job_id],
    )
    assert fire(conn, "s", tick(4), JOB, "skip", "a", schema).outcome == "fired"
    [_, (_, _, reason, _), _, _] = runs(conn, schema)
    assert reason == f"overlap skip: job {fired.job_id} is not finished"


def test_overlap_queue_one_keeps_one_waiting_beside_a_running_one(
    conn: psycopg.Connection, schema: str
) -> None:
    schedules.declare(conn, "s", {"every": 1.0}, "a", schema)
    first = fire(conn, "s", tick(1), JOB, "queue_one", "a", schema)
    assert fire(conn, "s", tick(2), JOB, "queue_one", "a", schema).outcome == "skipped"
    assert claim_one(conn, schema) == first.job_id  # running now: one more may wait
    second = fire(conn, "s", tick(3), JOB, "queue_one", "a", schema)
    assert second.outcome == "fired"
    assert fire(conn, "s", tick(4), JOB, "queue_one", "a", schema) == (
        schedules.Fired("skipped", second.job_id)
    )


def test_overlap_allow_always_fires(conn: psycopg.Connection, schema: str) -> None:
    schedules.declare(conn, "s", {"every": 1.0}, "a", schema)
    outcomes = [fire(conn, "s", tick(n), JOB, "allow", "a", schema) for n in range(5)]
    assert [f.outcome for f in outcomes] == ["fired"] * 5
    assert len({f.job_id for f in outcomes}) == 5


def finish_all(conn: psycopg.Connection, schema: str) -> None:
    conn.execute(
        sql.SQL(
            "UPDATE {}.jobs SET status = 'completed', locked_by = NULL, locked_until = NULL, "
            "finished_at = now() WHERE status IN ('pending', 'running')"
        ).format(sql.Identifier(schema))
    )


def backdate_ticks(conn: psycopg.Connection, schema: str, by: str) -> None:
    """Runs of ticks long past (retention goes by tick)."""
    conn.execute(
        sql.SQL("UPDATE {}.schedule_runs SET tick = tick - %s::interval").format(
            sql.Identifier(schema)
        ),
        [by],
    )


def prune_runs(conn: psycopg.Connection, older_than: float, schema: str) -> int:
    """`pgworkerd prune`'s schedule runs, nothing else."""
    return prune(conn, schedule_runs_older_than=older_than, schema=schema).schedule_runs


def test_prune_keeps_each_schedules_latest_run(conn: psycopg.Connection, schema: str) -> None:
    schedules.declare(conn, "s", {"every": 1.0}, "a", schema)
    for n in range(3):
        fire(conn, "s", tick(n), JOB, "allow", "a", schema)
    finish_all(conn, schema)
    backdate_ticks(conn, schema, "2 days")
    assert prune_runs(conn, 7 * 86400, schema) == 0
    assert prune_runs(conn, 0, schema) == 2
    assert [r[0] for r in runs(conn, schema)] == [tick(2) - timedelta(days=2)]


def test_prune_keeps_the_run_of_a_job_not_finished_so_skip_still_sees_it(
    conn: psycopg.Connection, schema: str
) -> None:
    # a week-long job (or one held pending by a paused queue): its run is older than the
    # retention, the ticks since were skipped; pruning its run must not let the next
    # tick start a second one beside it
    schedules.declare(conn, "s", {"every": 1.0}, "a", schema)
    long = fire(conn, "s", tick(1), JOB, "skip", "a", schema)
    for n in (2, 3):
        assert fire(conn, "s", tick(n), JOB, "skip", "a", schema).outcome == "skipped"
    backdate_ticks(conn, schema, "8 days")
    prune_runs(conn, 7 * 86400, schema)
    assert runs(conn, schema)[0][1] == long.job_id
    assert fire(conn, "s", tick(4), JOB, "skip", "a", schema) == schedules.Fired(
        "skipped", long.job_id
    )
    # once it is finished, its run goes like any other (each schedule's latest stays)
    finish_all(conn, schema)
    assert prune_runs(conn, 7 * 86400, schema) == 3
    assert [r[0] for r in runs(conn, schema)] == [tick(4)]


def test_a_removed_schedule_is_not_declared_by_live_daemons(
    conn: psycopg.Connection, schema: str
) -> None:
    info = registry.WorkerInfo("w1", "host", 1, "t", ["default"], ["h"], 1)
    registry.register(conn, info, "running", schema, secret=SECRET)
    schedules.declare(conn, "s", {"every": 60.0}, "w1", schema)
    schedules.set_declared(conn, "w1", ["s"], schema, secret=SECRET)
    [row] = schedules.list_all(conn, schema)
    assert row["declared_now"] is True and row["last_tick"] is None
    schedules.set_declared(conn, "w1", [], schema, secret=SECRET)
    [row] = schedules.list_all(conn, schema)
    assert row["declared_now"] is False


@pytest.mark.parametrize("max_attempts", ["max_attempts = 2\n", ""])
def test_a_fired_tick_enqueues_the_stored_definitions_job(
    conn: psycopg.Connection, schema: str, max_attempts: str
) -> None:
    """schedule_fire_v2 (schema 22) builds the job from the stored definition, as
    ScheduleConfig.job() describes it (handler, payload, queue, priority, max_attempts
    when given); the caller names only the schedule and the tick."""
    from pgworkerd.config import parse_config

    [schedule] = parse_config(
        '[schedules.n]\nevery = "60s"\nhandler = "report"\nqueue = "reports"\n'
        f'priority = -5\npayload = {{ kind = "full", days = [1, 2] }}\n{max_attempts}'
    ).schedules.values()
    schedules.declare(conn, "n", schedule.definition(), "operator", schema)
    live(conn, "w", schema)
    minute = datetime.fromtimestamp(int(datetime.now(UTC).timestamp()) // 60 * 60, UTC)
    fired = schedules.fire(conn, "n", minute, "w", schema)
    job = admin.get(conn, fired.job_id, schema=schema)
    expected = schedule.job()
    assert {k: job[k] for k in expected} == expected


# cron_matches (schema 24) against cronsim, the daemon's own reading of an expression:
# every whole minute of two days around each of Berlin's clock changes of 2026 (and of a
# quiet week for the day fields), in SQL, against the ticks pgworkerd.cadence computes.
CRON_CASES = [
    ("30 2 * * *", "Europe/Berlin"),
    ("0 3 * * *", "Europe/Berlin"),
    ("*/15 * * * *", "Europe/Berlin"),
    ("0 9-17/2 * * MON-FRI", "Europe/Berlin"),
    ("5 0 1,15 * SUN", "UTC"),
    ("0 12 * JAN,MAR,OCT *", "America/New_York"),
    ("59 23 * * 7", "UTC"),
]
SPANS = [
    datetime(2026, 3, 28, tzinfo=UTC),  # spring forward in Berlin on the 29th
    datetime(2026, 10, 24, tzinfo=UTC),  # fall back on the 25th
    datetime(2026, 3, 8, tzinfo=UTC),  # spring forward in New York; a Sunday the 15th
]


@pytest.mark.parametrize(("expression", "zone"), CRON_CASES)
def test_cron_matches_says_what_cronsim_fires(
    conn: psycopg.Connection, schema: str, expression: str, zone: str
) -> None:
    from pgworkerd.cadence import Cadence

    cadence = Cadence({"cron": expression, "timezone": zone})
    for start in SPANS:
        end = start + timedelta(days=9)
        ticks = set(cadence.due(start - timedelta(seconds=1), end))
        matched = {
            r[0]
            for r in conn.execute(
                sql.SQL(
                    "SELECT m FROM generate_series(%s::timestamptz, %s, '1 minute') m"
                    " WHERE {}.cron_matches(%s, %s, m)"
                ).format(sql.Identifier(schema)),
                [start, end, expression, zone],
            )
        }
        # cronsim fires a wall time of the autumn's repeated hour once (the first); SQL
        # accepts both instants (README "Who can do what"): an hour later, the same wall
        repeated = {
            m
            for m in matched - ticks
            if (m - timedelta(hours=1)) in ticks
            and (m - timedelta(hours=1)).astimezone(cadence.zone).replace(tzinfo=None)
            == m.astimezone(cadence.zone).replace(tzinfo=None)
        }
        assert ticks <= matched, sorted(ticks - matched)
        assert matched - ticks == repeated, sorted(matched - ticks)
