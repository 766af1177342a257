"""The charts' rollup (attempt_rollups_advance, migration 0038) on a real PostgreSQL: what
it counts per handler, minute and hour, that a step is bounded and the next goes on where
it stopped (nothing counted twice, nothing missed), that one daemon at a time steps it, and
that hostile arguments are refused. The attempts are written as their triggers write them
(rows of attempts and jobs), at chosen times, so each bucket's expected counts are known."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from daemon_harness import Db

from pgworkerd.queue import attempts, views
from pgworkerd.web import charts


@pytest.fixture
def t0(db: Db) -> datetime:
    """A whole hour, 4 hours ago: within what the rollup keeps of minutes and hours."""
    now = db.now()
    return now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)


def _attempt(
    db: Db,
    handler: str,
    *,
    ended: datetime,
    wall: float,
    outcome: str = "completed",
    waited: float = 0.0,
    last: bool = True,
) -> int:
    """A finished job (status from its outcome) with one attempt: claimed `waited` s after
    its run_at, ended at `ended` after `wall` s. last=False: a retried attempt (its token
    is not the job's any more)."""
    status = {"completed": "completed", "dead": "dead", "cancelled": "cancelled"}.get(
        outcome, "pending"
    )
    started = ended - timedelta(seconds=wall)
    run_at = started - timedelta(seconds=waited)
    [row] = db.rows(
        "INSERT INTO {schema}.jobs (handler, status, run_at, created_at, lease_token,"
        " finished_at) VALUES (%(h)s, %(s)s, %(r)s, %(r)s, 7, %(f)s) RETURNING id",
        {"h": handler, "s": status, "r": run_at, "f": None if status == "pending" else ended},
    )
    db.rows(
        "INSERT INTO {schema}.attempts (job_id, lease_token, attempt, started_at, finished_at,"
        " outcome, wall_seconds) VALUES (%(id)s, %(t)s, 1, %(st)s, %(e)s, %(o)s, %(w)s)",
        {
            "id": row["id"],
            "t": 7 if last else 3,
            "st": started,
            "e": ended,
            "o": outcome,
            "w": wall,
        },
    )
    return int(row["id"])


def _cursor_at(db: Db, when: datetime) -> None:
    db.rows("UPDATE {schema}.attempt_rollup_cursor SET rolled_to = %s", (when,))


def _rollups(db: Db, grain: int) -> dict[tuple[datetime, str], dict[str, Any]]:
    rows = db.rows("SELECT * FROM {schema}.attempt_rollups WHERE grain_seconds = %s", (grain,))
    return {(r["bucket_start"], r["handler"]): r for r in rows}


def _bin(seconds: float) -> int:
    """The histogram element a value lands in (as width_bucket numbers them)."""
    return sum(1 for b in charts_bounds() if seconds >= b)


def charts_bounds() -> list[float]:
    from pgworkerd.ops.metrics import LATENCY_BUCKETS

    return [b for b in LATENCY_BUCKETS if b != float("inf")]


def test_the_rollup_counts_each_handler_per_minute_and_hour(
    db: Db, schema: str, t0: datetime
) -> None:
    """Completed and failed attempts per handler and bucket; runtime of attempts that ran
    to an end; wait time (claim - due) of each job's last attempt only."""
    _cursor_at(db, t0)
    m0 = t0 + timedelta(seconds=10)
    m1 = t0 + timedelta(minutes=1, seconds=5)
    _attempt(db, "mail", ended=m0, wall=0.2, waited=0.03)
    _attempt(db, "mail", ended=m0 + timedelta(seconds=1), wall=3.0, waited=12.0)
    _attempt(db, "mail", ended=m1, wall=0.2, outcome="failed", last=False, waited=500)
    _attempt(db, "mail", ended=m1, wall=40.0, outcome="dead", waited=0.3)
    _attempt(db, "pdf", ended=m1, wall=700.0, waited=0.0)
    _attempt(db, "pdf", ended=m1, wall=1.0, outcome="released")  # no runtime: cut short
    step = attempts.rollup_advance(db.conn, schema, lag_seconds=0)
    assert step is not None and not step.behind and step.rolled_to > m1

    minutes = _rollups(db, 60)
    assert set(minutes) == {
        (t0, "mail"),
        (t0 + timedelta(minutes=1), "mail"),
        (t0 + timedelta(minutes=1), "pdf"),
    }
    first = minutes[(t0, "mail")]
    assert (first["completed"], first["failed"]) == (2, 0)
    expected_run = [0] * 17
    expected_run[_bin(0.2)] += 1
    expected_run[_bin(3.0)] += 1
    assert first["run_counts"] == expected_run
    expected_wait = [0] * 17
    expected_wait[_bin(0.03)] += 1
    expected_wait[_bin(12.0)] += 1
    assert first["wait_counts"] == expected_wait
    second = minutes[(t0 + timedelta(minutes=1), "mail")]
    assert (second["completed"], second["failed"]) == (0, 2)
    # the retried attempt's wait is unknown (its job's run_at moved on): only the dead one's
    assert sum(second["wait_counts"]) == 1 and second["wait_counts"][_bin(0.3)] == 1
    assert sum(second["run_counts"]) == 2
    pdf = minutes[(t0 + timedelta(minutes=1), "pdf")]
    assert (pdf["completed"], pdf["failed"], sum(pdf["run_counts"])) == (1, 0, 1)
    assert pdf["run_counts"][_bin(700.0)] == 1

    hours = _rollups(db, 3600)
    assert set(hours) == {(t0, "mail"), (t0, "pdf")}
    assert (hours[(t0, "mail")]["completed"], hours[(t0, "mail")]["failed"]) == (2, 2)
    # the dashboard's percentiles read the same histograms
    assert charts.percentile(hours[(t0, "mail")]["run_counts"], charts_bounds(), 0.5) == 0.25
    # the 5-minute and 3-hour grains (the 6 h and 7 d charts) hold the same attempts
    five = _rollups(db, 300)
    assert set(five) == {(t0, "mail"), (t0, "pdf")}
    assert five[(t0, "mail")]["run_counts"] == hours[(t0, "mail")]["run_counts"]
    three = _rollups(db, 10800)
    [(start, _)] = {k for k in three if k[1] == "mail"}
    assert start <= t0 < start + timedelta(hours=3) and (start - t0).total_seconds() % 3600 == 0
    for grain_rows in (five, three):
        assert sum(r["completed"] for r in grain_rows.values()) == 3
        assert sum(r["failed"] for r in grain_rows.values()) == 2


def test_a_step_is_bounded_and_the_next_goes_on_where_it_stopped(
    db: Db, schema: str, t0: datetime
) -> None:
    _cursor_at(db, t0)
    ends = [t0 + timedelta(seconds=s) for s in (1, 2, 3, 4, 5)]
    for end in ends:
        _attempt(db, "mail", ended=end, wall=0.2)
    step = attempts.rollup_advance(db.conn, schema, max_attempts=2, lag_seconds=0)
    assert step is not None and step.behind and step.rolled_to == ends[2]
    assert _rollups(db, 60)[(t0, "mail")]["completed"] == 2
    # a late row before the cursor is not counted again; the rest is counted once
    while step is not None and step.behind:
        step = attempts.rollup_advance(db.conn, schema, max_attempts=2, lag_seconds=0)
    assert _rollups(db, 60)[(t0, "mail")]["completed"] == 5
    assert _rollups(db, 3600)[(t0, "mail")]["completed"] == 5
    assert sum(_rollups(db, 60)[(t0, "mail")]["run_counts"]) == 5
    # one instant with more attempts than a step takes: taken whole, not stuck
    same = t0 + timedelta(minutes=3)
    for _ in range(3):
        _attempt(db, "burst", ended=same, wall=0.2)
    _cursor_at(db, same)
    step = attempts.rollup_advance(db.conn, schema, max_attempts=1, lag_seconds=0)
    assert step is not None and step.rolled_to > same
    assert _rollups(db, 60)[(same, "burst")]["completed"] == 3


def test_attempts_within_the_lag_wait_for_the_next_step(db: Db, schema: str) -> None:
    """An attempt's finished_at is its transaction's start: one that ended within the lag
    may still be committing, so it is left for a later step."""
    now = db.now()
    _cursor_at(db, now - timedelta(minutes=5))
    _attempt(db, "mail", ended=now - timedelta(minutes=2), wall=0.2)
    _attempt(db, "mail", ended=now - timedelta(seconds=2), wall=0.2)
    step = attempts.rollup_advance(db.conn, schema, lag_seconds=30)
    assert step is not None and not step.behind
    assert sum(r["completed"] for r in _rollups(db, 3600).values()) == 1
    step = attempts.rollup_advance(db.conn, schema, lag_seconds=0)
    assert sum(r["completed"] for r in _rollups(db, 3600).values()) == 2


def test_one_daemon_at_a_time_steps_the_rollup(db: Db, schema: str, test_db_dsn: str) -> None:
    """A second caller while one step runs returns at once with nothing (SKIP LOCKED)."""
    with psycopg.connect(test_db_dsn) as holder:
        holder.execute(f'SELECT * FROM "{schema}".attempt_rollup_cursor FOR UPDATE')
        done: list[Any] = []
        other = threading.Thread(
            target=lambda: done.append(attempts.rollup_advance(db.conn, schema, lag_seconds=0))
        )
        other.start()
        other.join(timeout=30)
        assert done == [None]
        holder.rollback()


@pytest.mark.parametrize(
    ("max_attempts", "lag", "says"),
    [
        (0, 30.0, "max_attempts must be from 1 to 1000000, not 0"),
        (10_000_000, 30.0, "max_attempts must be from 1 to 1000000, not 10000000"),
        (None, 30.0, "max_attempts must be from 1 to 1000000, not NULL"),
        (10, -1.0, "lag_seconds must be from 0 to 3600, not -1"),
        (10, float("nan"), "lag_seconds must be from 0 to 3600, not NaN"),
        (10, None, "lag_seconds must be from 0 to 3600, not NULL"),
    ],
)
def test_hostile_arguments_are_refused_and_change_nothing(
    db: Db, schema: str, max_attempts: Any, lag: Any, says: str
) -> None:
    before = db.rows("SELECT rolled_to FROM {schema}.attempt_rollup_cursor")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=says):
        attempts.rollup_advance(db.conn, schema, max_attempts=max_attempts, lag_seconds=lag)
    assert db.rows("SELECT rolled_to FROM {schema}.attempt_rollup_cursor") == before


def test_old_buckets_are_dropped_past_their_keeping(db: Db, schema: str) -> None:
    """Minutes are kept a day, hours 35 days: the rollup stays bounded."""
    now = db.now()
    _cursor_at(db, now - timedelta(days=40))
    _attempt(db, "mail", ended=now - timedelta(days=36), wall=0.2)
    _attempt(db, "mail", ended=now - timedelta(days=2), wall=0.2)
    _attempt(db, "mail", ended=now - timedelta(hours=1), wall=0.2)
    step = attempts.rollup_advance(db.conn, schema, lag_seconds=0)
    assert step is not None
    assert len(_rollups(db, 60)) == 1
    assert len(_rollups(db, 3600)) == 2


def test_the_charts_read_a_bounded_range_of_the_rollup(db: Db, schema: str, t0: datetime) -> None:
    """The dashboard's read touches the rollup only (never jobs or attempts), through its
    primary key when the planner is told to avoid a scan of the whole table."""
    db.conn.execute("SET enable_seqscan = off")
    try:
        from pgworkerd.queue.queries import query

        plan = db.conn.execute(
            "EXPLAIN " + query("view_attempt_rollups", schema),
            {"grain": 3600, "since": t0},
        ).fetchall()
    finally:
        db.conn.execute("RESET enable_seqscan")
    text = "\n".join(line for (line,) in plan)
    assert "attempt_rollups_pkey" in text, text
    assert " jobs" not in text and " attempts " not in text, text
    # and the rows read are those of the window: none before `since`
    _cursor_at(db, t0)
    _attempt(db, "mail", ended=t0 + timedelta(minutes=1), wall=0.2)
    _attempt(db, "mail", ended=t0 + timedelta(hours=3), wall=0.2)
    attempts.rollup_advance(db.conn, schema, lag_seconds=0)
    rows = views.rollup_rows(db.conn, schema, grain=3600, since=t0 + timedelta(hours=1))
    assert [r["bucket_start"] for r in rows] == [t0 + timedelta(hours=3)]
    assert views.rollup_cursor(db.conn, schema)["bounds"] == charts_bounds()
