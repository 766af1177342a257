"""Trust boundaries on the claim path: no row, payload or handler output can stop the
daemon or touch another job. Poison rows are written the way an old row or a direct
INSERT would hold them (enqueue refuses what it can check); each poison kind sits in the
same claim as an innocent job, which must complete on its first attempt."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import leasing
import psycopg
import pytest
from daemon_harness import Daemons, Db, wait_for
from psycopg import sql

from pgworkerd.queue import lease
from pgworkerd.queue.queries import wake_channel

WORK = {"target": "jobhandlers:work"}
DEEP = 5000

# kind -> (payload, run_at, checkpoint, what last_error must say)
POISON: dict[str, tuple[str, str | None, str | None, str]] = {
    "integer of 5,001 digits": ('{"x": 1e5000}', None, None, "payload cannot be loaded"),
    "payload nested 5,000 deep": (
        '{"a":' * DEEP + "1" + "}" * DEEP,
        None,
        None,
        "payload cannot be loaded",
    ),
    "number beyond a float": (
        '{"x": 1' + "0" * 400 + ".5}",
        None,
        None,
        "cannot be handed to a child",
    ),
    "run_at -infinity": ("{}", "-infinity", None, "run_at cannot be loaded"),
    "run_at before year 1": ("{}", "0044-03-15 00:00:00+00 BC", None, "run_at cannot be loaded"),
    "checkpoint nested 5,000 deep": (
        "{}",
        None,
        "[" * DEEP + "]" * DEEP,
        "checkpoint cannot be loaded",
    ),
    "payload over the frame limit once re-encoded (24 MiB of emoji)": (
        '{"s": "' + "\U0001f600" * (6 * 1024 * 1024) + '"}',
        None,
        None,
        "cannot be handed to a child: FrameTooLarge",
    ),
}


def insert_raw(db: Db, payload: str, run_at: str | None, checkpoint: str | None) -> int:
    """A job row as a direct INSERT (or an old row) can hold it: no enqueue checks."""
    [row] = db.rows(
        "INSERT INTO {schema}.jobs (handler, payload, run_at, checkpoint, max_attempts) "
        "VALUES ('work', %s::jsonb, coalesce(%s::timestamptz, now()), %s::jsonb, 1000) "
        "RETURNING id",
        (payload, run_at, checkpoint),
    )
    return int(row["id"])


def raw_state(db: Db, job_id: int) -> dict:
    """Status, attempts and error of a job, read without loading its odd values."""
    [row] = db.rows(
        "SELECT status::text, attempts, last_error FROM {schema}.jobs WHERE id = %s", (job_id,)
    )
    return row


def test_each_poison_row_dies_alone_and_the_job_claimed_beside_it_runs(
    db: Db, daemons: Daemons
) -> None:
    innocent = db.enqueue("work", {"seconds": 0.2, "result": "fine"})
    poison = {kind: insert_raw(db, *spec[:3]) for kind, spec in POISON.items()}
    # One claim takes them all: more slots than jobs.
    daemon = daemons.start({"work": WORK}, {"slots": len(POISON) + 2, "poll_interval": "60s"})

    row = db.wait_status(innocent, "completed", "dead", "cancelled", timeout=60)
    assert (row["status"], row["attempts"], row["result"]) == ("completed", 1, "fine")
    assert [e["attempt"] for e in db.executions(innocent)] == [1]
    for kind, job_id in poison.items():
        state = wait_for(
            lambda job_id=job_id: (s := raw_state(db, job_id))["status"] != "running" and s,
            timeout=60,
            what=f"poison job ({kind}) to finish",
        )
        assert state["status"] == "dead", kind
        assert state["attempts"] == 1, kind  # dead at once, although 999 attempts were left
        assert POISON[kind][3] in state["last_error"], (kind, state["last_error"])
        assert len(state["last_error"]) < 500, kind  # the reason, not the value
    # The daemon never stopped, and still runs new work.
    assert daemon.proc is not None and daemon.proc.poll() is None
    after = db.enqueue("work", {"result": "still running"})
    assert db.wait_status(after, "completed", "dead")["result"] == "still running"
    assert "crashed" not in daemon.log()


def test_never_due_run_ats_do_not_break_the_scheduled_wake_up(db: Db, daemons: Daemons) -> None:
    for run_at in ("infinity", "20000-01-01 00:00:00+00"):
        insert_raw(db, "{}", run_at, None)
    daemon = daemons.start({"work": WORK}, {"poll_interval": "60s"})
    scheduled = db.enqueue("work", {}, delay=2)
    row = db.wait_status(scheduled, "completed", "dead", timeout=20)
    assert row["status"] == "completed"
    assert "looking up scheduled jobs failed" not in daemon.log()


def test_a_failed_attempt_is_retried_when_due_not_at_the_next_poll(
    db: Db, daemons: Daemons
) -> None:
    daemons.start(
        {"fail_once": {"target": "trusthandlers:fail_once", "backoff": "1s"}},
        {"poll_interval": "60s"},
    )
    job_id = db.enqueue("fail_once")
    # backoff 1 s ± 25 %: due within 1.25 s of the failure; the poll is a minute away
    row = db.wait_status(job_id, "completed", "dead", timeout=20)
    assert (row["status"], row["attempts"]) == ("completed", 2)


def test_a_checkpoint_sent_just_before_a_failure_reaches_the_next_attempt(
    db: Db, daemons: Daemons
) -> None:
    daemons.start({"cp": {"target": "trusthandlers:checkpoint_then_fail", "backoff": "0s"}})
    job_id = db.enqueue("cp")
    row = db.wait_status(job_id, "completed", "dead")
    assert row["status"] == "completed"
    assert row["result"] == {"resumed_from": {"step": 1}}
    assert row["progress"] == {"done": 1}


def test_a_checkpoint_sent_while_stopping_is_saved_with_the_release(
    db: Db, daemons: Daemons
) -> None:
    daemon = daemons.start({"cp": {"target": "trusthandlers:checkpoint_on_stop"}})
    job_id = db.enqueue("cp")
    daemon.wait_log(rf"job {job_id} cp attempt 1.*started")
    daemon.send(signal.SIGTERM)
    assert daemon.wait_exit() == 0
    row = db.job(job_id)
    assert (row["status"], row["attempts"]) == ("pending", 0)
    assert row["checkpoint"] == {"step": "saved on stop"}


def test_a_result_too_big_fails_the_attempt_saying_so(db: Db, daemons: Daemons) -> None:
    daemon = daemons.start({"huge": {"target": "trusthandlers:huge_result", "max_attempts": 1}})
    job_id = db.enqueue("huge", {"mb": 70})
    row = db.wait_status(job_id, "dead", "completed", timeout=60)
    assert row["status"] == "dead"
    assert "result is too large to store" in row["last_error"]
    assert "MiB limit" in row["last_error"]
    assert daemon.proc is not None and daemon.proc.poll() is None


def test_a_result_nested_as_deep_as_a_child_can_encode_never_stops_the_daemon(
    db: Db, daemons: Daemons
) -> None:
    daemon = daemons.start(
        {"deep": {"target": "trusthandlers:deepest_result", "max_attempts": 1}, "work": WORK},
        {"slots": 3},
    )
    bystander = db.enqueue("work", {"seconds": 2})
    db.wait_started(bystander)
    job_id = db.enqueue("deep")
    # However it ends (stored, or refused with a reason), it ends alone.
    row = db.wait_status(job_id, "completed", "dead", timeout=60)
    if row["status"] == "dead":
        assert "cannot read" in row["last_error"], row["last_error"]
    assert db.wait_status(bystander, "completed", "dead")["status"] == "completed"
    assert daemon.proc is not None and daemon.proc.poll() is None


def claim_calls(conn: psycopg.Connection, schema: str) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions "
        "WHERE schemaname = %s AND funcname IN ('claim', 'claim_v2', 'claim_v3', 'claim_v4')",
        (schema,),
    ).fetchone()
    return int(row[0]) if row else 0


def test_a_notify_flood_causes_a_bounded_number_of_claims(
    db: Db, daemons: Daemons, test_db_dsn: str, tmp_path: Path
) -> None:
    # Count the daemon's claim() calls: the daemon's sessions track PL/pgSQL calls.
    db.conn.execute(
        sql.SQL("ALTER DATABASE {} SET track_functions = 'pl'").format(
            sql.Identifier(db.conn.info.dbname)
        )
    )
    try:
        daemon = daemons.start({"work": WORK}, {"poll_interval": "60s"})
        # The daemon listens on the wake channel: plain payloads, made-up jobs of its
        # handler, made-up peers coming and going (the list is capped, the rings rebuilt
        # at most once a second) and rescue hints, all mixed.
        channel = wake_channel(db.schema)
        kinds = [
            lambda n: str(n),
            lambda n: json.dumps({"q": "default", "h": "work", "id": n, "n": 1 + n % 50}),
            lambda n: json.dumps(
                {"peer": "up", "id": f"fake{n}", "queues": ["default"], "handlers": ["work"]}
                | {"slots": 1}
            ),
            lambda n: json.dumps({"peer": "down", "id": f"fake{n - 2}"}),
            lambda n: json.dumps(
                {"rescue": n, "q": "default", "h": "work", "holder": "x", "in": 0.01}
            ),
        ]
        # At least 3 s and 3,001 notifications (a loaded machine sends fewer per second);
        # the bound below is per second of flood.
        sent, started = 0, time.monotonic()
        with psycopg.connect(test_db_dsn, autocommit=True) as flooder:
            while sent <= 3000 or time.monotonic() - started < 3.0:
                payload = kinds[sent % len(kinds)](sent)
                flooder.execute("SELECT pg_notify(%s, %s)", (channel, payload))
                sent += 1
        flood_seconds = time.monotonic() - started
        # A real job still starts at once after the flood.
        job_id = db.enqueue("work")
        assert db.wait_status(job_id, "completed", "dead")["status"] == "completed"
        daemon.send(signal.SIGTERM)
        assert daemon.wait_exit() == 0  # its backend exits and reports its statistics
        calls = wait_for(lambda: claim_calls(db.conn, db.schema) or None, what="claim statistics")
    finally:
        db.conn.execute(
            sql.SQL("ALTER DATABASE {} RESET track_functions").format(
                sql.Identifier(db.conn.info.dbname)
            )
        )
    print(f"{sent} notifications in {flood_seconds:.1f}s caused {calls} claims")
    # At most one claim per 20 ms from notifications (150 in 3 s), plus the start-up
    # claim, the job's claim and a few after outcomes; thousands without coalescing.
    bound = 50 * flood_seconds + 50
    assert calls <= bound, f"{calls} claims for {sent} notifications in {flood_seconds:.1f}s"


@pytest.mark.parametrize(
    "payload, run_at, reason",
    [
        ('{"x": 1e5000}', None, "payload cannot be loaded: ValueError"),
        ("{}", "-infinity", "run_at cannot be loaded: DataError"),
    ],
    ids=["integer", "timestamp"],
)
@pytest.mark.parametrize("path", ["direct", "pipeline", "not autocommit"])
def test_the_claim_api_buries_an_unloadable_row_and_returns_the_others(
    conn: psycopg.Connection,
    schema: str,
    path: str,
    payload: str,
    run_at: str | None,
    reason: str,
) -> None:
    """lease.claim for any caller (not just the daemon), on any kind of connection: the
    claim has committed (or will), so the rows it cannot load are finished as dead there
    and then, and the others come back."""
    db = Db(conn, schema)
    good = [db.enqueue("work", {"n": n}) for n in range(2)]
    bad = insert_raw(db, payload, run_at, None)
    capacity = {"work": lease.HandlerCapacity(lease_seconds=30, free=10)}

    def claim() -> list[lease.ClaimedJob]:
        return leasing.claim(
            conn, "w1", queues=["default"], handlers=capacity, limit=10, schema=schema
        )

    if path == "pipeline":
        with conn.pipeline():
            claimed = claim()
    elif path == "not autocommit":  # psycopg begins the caller's transaction: a cursor
        conn.autocommit = False
        claimed = claim()
        conn.commit()
        conn.autocommit = True
    else:
        claimed = claim()
    assert sorted(j.id for j in claimed) == good
    state = raw_state(db, bad)
    assert (state["status"], state["attempts"]) == ("dead", 1)
    assert state["last_error"].startswith(f"cannot run: {reason}"), state["last_error"]


def test_a_string_jsonb_rejects_fails_its_own_job_and_no_lease_is_lost(
    db: Db, daemons: Daemons
) -> None:
    daemon = daemons.start(
        {
            "bad_text": {"target": "trusthandlers:unstorable_text", "max_attempts": 1},
            "work": WORK,
        },
        {"slots": 4},
    )
    # Runs longer than its 6 s lease: it needs every renewal while the others fail.
    bystander = db.enqueue("work", {"seconds": 9})
    db.wait_started(bystander)
    bad = {where: db.enqueue("bad_text", {"where": where}) for where in ("progress", "result")}
    for where, job_id in bad.items():
        row = db.wait_status(job_id, "dead", "completed")
        assert row["status"] == "dead", where
        assert "lone surrogate" in row["last_error"], (where, row["last_error"])
    row = db.wait_status(bystander, "completed", "dead", timeout=60)
    assert (row["status"], row["attempts"]) == ("completed", 1)
    assert "lease not renewed" not in daemon.log()


def test_an_error_quoting_a_name_that_is_not_utf8_is_recorded(db: Db, daemons: Daemons) -> None:
    daemon = daemons.start(
        {"bad_file": {"target": "trusthandlers:fail_naming_a_bad_file", "max_attempts": 1}}
    )
    job_id = db.enqueue("bad_file")
    row = db.wait_status(job_id, "dead", "completed", timeout=20)
    assert row["status"] == "dead" and row["attempts"] == 1
    assert "no such file: caf\\udce9" in row["last_error"], row["last_error"]
    assert "giving up recording" not in daemon.log()
