"""Follow-ups atomic with the finish, and the lease token in the handler's hands, with real
daemons, real children and real signals (handlers: tests/support/followuphandlers.py).

- kill -9 of the daemon between the handler's return and the completion's write (the
  child exited with its result; the daemon dies before writing it): another daemon
  rescues the job, reruns it, and its follow-ups are inserted exactly once in all;
- a holder frozen (SIGSTOP) after its handler returned, past its lease: another daemon
  rescues and completes the job with its follow-ups; the thawed holder's completion is
  fenced off and inserts none;
- a bad follow-up list fails the attempt with the reason, changes no other job;
- job.lease_token handed to a writer outside the job: after the job is rescued, that
  writer's write under the old token rolls back and the new holder's commits; no token
  appears in the daemon's log.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from daemon_harness import (
    DaemonProcess,
    Daemons,
    Db,
    is_gone,
    process_title,
    wait_for,
)
from doctext import block_after
from proctree import descendants
from psycopg import sql

HANDLERS = {
    "fan_out": {"target": "followuphandlers:fan_out"},
    "leaf": {"target": "followuphandlers:leaf"},
    "bad_then": {"target": "followuphandlers:bad_then"},
    "hand_token_out": {"target": "followuphandlers:hand_token_out"},
}
# Short leases: a lost daemon's job is rescued within seconds.
LEASE = {"lease": "4s", "renew_interval": "1s", "poll_interval": "1s", "backoff": "0s"}


def follow_ups_of(db: Db, job_id: int) -> list[dict[str, Any]]:
    return db.rows(
        "SELECT f.position, j.id, j.handler, j.payload FROM {schema}.job_follow_ups f "
        "JOIN {schema}.jobs j ON j.id = f.follow_up_id WHERE f.job_id = %s ORDER BY f.position",
        (job_id,),
    )


def leaves(db: Db) -> list[dict[str, Any]]:
    return db.rows("SELECT id, payload, status::text FROM {schema}.jobs WHERE handler = 'leaf'")


def ready_pid(folder: Path, attempt: int) -> int:
    path = folder / f"ready-{attempt}"
    return int(wait_for(lambda: path.exists() and path.read_text(), what=f"attempt {attempt}"))


def assert_follow_ups_once(db: Db, job_id: int, n: int) -> None:
    """The job completed once, with exactly n follow-ups, each of them once."""
    row = db.wait_status(job_id, "completed", "dead")
    assert row["status"] == "completed", row
    ups = follow_ups_of(db, job_id)
    assert [u["position"] for u in ups] == list(range(1, n + 1))
    assert sorted(u["payload"]["n"] for u in ups) == list(range(n))
    all_leaves = leaves(db)
    assert len(all_leaves) == n, all_leaves  # no follow-up inserted twice, nor one stray
    assert {leaf["id"] for leaf in all_leaves} == {u["id"] for u in ups}


def test_kill_9_between_the_handlers_return_and_the_write_follow_ups_exactly_once(
    db: Db, daemons: Daemons, tmp_path: Path
) -> None:
    """The child returned its result and follow-ups and exited; the daemon, frozen so that
    it cannot write them, is killed -9. Another daemon rescues the job after its lease,
    reruns it, and the follow-ups exist exactly once."""
    config = daemons.config(HANDLERS, LEASE)
    a = daemons.start(config, tag="A")
    job_id = db.enqueue("fan_out", {"dir": str(tmp_path), "n": 3, "gate": [1]})
    child = ready_pid(tmp_path, 1)
    a.send(signal.SIGSTOP)  # it reads nothing from here on
    (tmp_path / "go").write_text("")
    wait_for(lambda: is_gone(child), what="the child to return and exit")
    a.send(signal.SIGKILL)
    a.wait_exit()
    assert db.job(job_id)["status"] == "running"  # nothing written
    assert leaves(db) == []
    b = daemons.start(config, tag="B")
    assert_follow_ups_once(db, job_id, 3)
    row = db.job(job_id)
    assert row["attempts"] == 2 and row["result"] == {"attempt": 2}
    # and the follow-ups run, each once
    for leaf in leaves(db):
        db.wait_status(leaf["id"], "completed")
    b.wait_log(rf"job {job_id} fan_out attempt 2: completed in .*; follow-ups ")


def test_a_frozen_holder_past_its_lease_inserts_no_follow_up_the_rescuer_inserts_them_once(
    db: Db, daemons: Daemons, tmp_path: Path
) -> None:
    """SIGSTOP of the daemon after its handler returned, past the lease; another daemon
    rescues and completes the job with its follow-ups; SIGCONT: the first daemon's
    completion is fenced off and inserts nothing."""
    config = daemons.config(HANDLERS, LEASE)
    a = daemons.start(config, tag="A")
    job_id = db.enqueue("fan_out", {"dir": str(tmp_path), "n": 2, "gate": [1]})
    child = ready_pid(tmp_path, 1)
    a.send(signal.SIGSTOP)
    try:
        (tmp_path / "go").write_text("")
        wait_for(lambda: is_gone(child), what="the child to return and exit")
        b = daemons.start(config, tag="B")
        assert_follow_ups_once(db, job_id, 2)
        assert db.job(job_id)["result"] == {"attempt": 2}
    finally:
        a.send(signal.SIGCONT)
    a.wait_log(rf"job {job_id} fan_out attempt 1: outcome complete rejected: .*\(fenced off\)")
    assert_follow_ups_once(db, job_id, 2)
    assert "follow-ups" not in "".join(
        line for line in a.log().splitlines() if f"job {job_id} " in line and "completed" in line
    )
    assert b.proc is not None and b.proc.poll() is None


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("text", "Done(then=...) must be a list of pgworkerd.JobSpec, not str"),
        ("dicts", "follow-up 1 of 1 must be a pgworkerd.JobSpec, not dict"),
        ("too_many", "Done(then=...) holds 1001 follow-ups; at most 1000"),
        ("bound", "follow-ups refused: "),
    ],
)
def test_a_bad_follow_up_list_fails_the_attempt_saying_why_and_touches_no_other_job(
    db: Db, daemons: Daemons, tmp_path: Path, kind: str, reason: str
) -> None:
    if kind == "bound":  # what enqueue would refuse, the completion refuses
        db.rows(
            "INSERT INTO {schema}.enqueue_bounds (role_name, priority_min, priority_max) "
            "VALUES (NULL, 0, 10)"
        )
    daemons.start(HANDLERS, LEASE)
    bad = db.enqueue("bad_then", {"kind": kind}, max_attempts=2)
    good = db.enqueue("fan_out", {"dir": str(tmp_path), "n": 1})
    row = db.wait_status(bad, "dead")
    assert reason in row["last_error"] and row["attempts"] == 2  # retried, then dead
    assert row["result"] is None
    assert follow_ups_of(db, bad) == []
    assert_follow_ups_once(db, good, 1)
    assert len(leaves(db)) == 1


def test_a_token_handed_out_is_fenced_after_a_rescue_and_never_logged(
    db: Db, daemons: Daemons, tmp_path: Path, test_db_dsn: str
) -> None:
    """job.lease_token given to a writer outside the job's processes (which no watcher
    stops): A freezes, its child stops itself, B rescues the job and runs attempt 2. Now a
    transaction that wrote under attempt 1's token is refused by job_lease_assert (PGWL1,
    no token in the error) and rolls back; one under attempt 2's token commits. No token
    appears in either daemon's log."""
    table = sql.Identifier(db.schema, "effects")
    db.conn.execute(sql.SQL("CREATE TABLE {} (job_id bigint, attempt int)").format(table))
    config = daemons.config(HANDLERS, LEASE)
    a = daemons.start(config, tag="A")
    job_id = db.enqueue("hand_token_out", {"dir": str(tmp_path), "gate": [1, 2]})
    ready_pid(tmp_path, 1)
    first = json.loads((tmp_path / "token-1").read_text())
    a.send(signal.SIGSTOP)
    b: DaemonProcess | None = None
    try:
        b = daemons.start(config, tag="B")
        ready_pid(tmp_path, 2)  # attempt 2 runs on B, held at its gate
        second = json.loads((tmp_path / "token-2").read_text())
        assert db.job(job_id)["locked_by"] == b.worker_id
        titles = [process_title(pid) for pid in descendants(b.pid)]
        assert any(f"job {job_id} " in t for t in titles), titles
        assert not any(str(second["token"]) in t for t in titles), titles
        assert_sql = sql.SQL("SELECT {}.job_lease_assert(%s, %s)").format(sql.Identifier(db.schema))
        insert = sql.SQL("INSERT INTO {} VALUES (%s, %s)").format(table)
        with psycopg.connect(test_db_dsn) as old:
            old.execute(insert, (job_id, 1))  # written before it learns: must roll back
            with pytest.raises(psycopg.Error) as raised:
                old.execute(assert_sql, (first["id"], first["token"]))
            assert raised.value.sqlstate == "PGWL1"
            assert str(first["token"]) not in str(raised.value)
        with psycopg.connect(test_db_dsn) as new:
            new.execute(assert_sql, (second["id"], second["token"]))
            new.execute(insert, (job_id, 2))
        (tmp_path / "go").write_text("")
        db.wait_status(job_id, "completed")
    finally:
        a.send(signal.SIGCONT)
    rows = db.conn.execute(sql.SQL("SELECT job_id, attempt FROM {}").format(table)).fetchall()
    assert rows == [(job_id, 2)]
    for daemon in (a, b):
        assert daemon is not None
        log = daemon.log()
        assert str(first["token"]) not in log and str(second["token"]) not in log


def test_the_exactly_once_recipe_charges_once_across_a_retry(
    db: Db,
    daemons: Daemons,
    tmp_path: Path,
    roles: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """docs/guide/exactly-once.md's handler, as printed, run by a real daemon as the
    application's enqueuer login: its first attempt charges and then fails (the receipt
    service is down); the retry asserts the new lease, finds the charge recorded, and does
    not charge again."""
    schema = db.schema
    app = sql.Identifier(f"{schema}_app")
    enqueuer = sql.Identifier(f"{schema}_enqueuer")
    for statement in (
        "CREATE SCHEMA {app}",
        "CREATE TABLE {app}.accounts (id int PRIMARY KEY, balance int NOT NULL)",
        "CREATE TABLE {app}.charges (job_id bigint PRIMARY KEY, account int, cents int)",
        "INSERT INTO {app}.accounts VALUES (1, 1000)",
        "GRANT USAGE ON SCHEMA {app} TO {enqueuer}",
        "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA {app} TO {enqueuer}",
    ):
        db.conn.execute(sql.SQL(statement).format(app=app, enqueuer=enqueuer))
    code = block_after("guide/exactly-once.md", "python", "## The recipe")
    code = code.replace("pgworkerd.job_lease_assert", f"{schema}.job_lease_assert")
    code = code.replace("myapp.", f"{schema}_app.")
    # the receipt service is down once
    code += (
        "\n\ndef send_receipt(account: int, cents: int) -> None:\n"
        "    from pathlib import Path\n"
        "    down = Path(os.environ['RECEIPT_DIR']) / 'down-once'\n"
        "    if not down.exists():\n"
        "        down.write_text('')\n"
        "        raise RuntimeError('the receipt service is down')\n"
    )
    (tmp_path / "myapp_recipe.py").write_text(code)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("MYAPP_DSN", roles[f"{schema}_enqueuer"])
    monkeypatch.setenv("RECEIPT_DIR", str(tmp_path))
    daemons.start({"charge": {"target": "myapp_recipe:charge"}}, LEASE)
    job_id = db.enqueue("charge", {"account": 1, "cents": 250}, max_attempts=3)
    row = db.wait_status(job_id, "completed", "dead")
    assert row["status"] == "completed", row["last_error"]
    assert row["attempts"] == 2 and "the receipt service is down" in row["last_error"]
    assert row["result"] == {"charged": 250, "first_time": False}
    balance = db.conn.execute(sql.SQL("SELECT balance FROM {}.accounts").format(app)).fetchall()
    assert balance == [(750,)]
    charges = db.conn.execute(sql.SQL("SELECT job_id, cents FROM {}.charges").format(app))
    assert charges.fetchall() == [(job_id, 250)]
