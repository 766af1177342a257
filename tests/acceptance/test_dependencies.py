"""Dependencies and deadlines with real daemons (docs/guide/dependencies.md): chains and
fan-ins run in order, a parent's failure applies each policy, the resolution survives a
kill -9 of the daemon right after the parent's completion, a job's own timeout and
expiry hold. The SQL side (concurrent finishes, hostile input): tests/integration/
test_dependencies_sql.py."""

from __future__ import annotations

import signal
import time

from daemon_harness import Daemons, Db

from pgworkerd import client
from pgworkerd.client import JobSpec

WORK = {"target": "jobhandlers:work"}
PARENTS = {"target": "jobhandlers:parents"}


def execution(db: Db, job_id: int) -> dict:
    [row] = db.executions(job_id)
    return row


def test_a_chain_runs_in_order(daemons: Daemons, db: Db) -> None:
    daemons.start({"work": WORK}, {"slots": 3})
    a = JobSpec("work", {"seconds": 0.5})
    b = JobSpec("work", {"seconds": 0.3}, after=[a])
    c = JobSpec("work", {"seconds": 0.1}, after=[b])
    ids = client.enqueue_many(db.conn, [a, b, c], schema=db.schema)
    for job_id in ids:
        assert db.wait_status(job_id, "completed", "dead", "cancelled")["status"] == "completed"
    ea, eb, ec = (execution(db, j) for j in ids)
    assert ea["ended_at"] <= eb["started_at"]
    assert eb["ended_at"] <= ec["started_at"]


def test_a_fan_in_child_starts_after_its_last_parent_and_reads_their_results(
    daemons: Daemons, db: Db
) -> None:
    daemons.start({"work": WORK, "parents": PARENTS}, {"slots": 4})
    parents = [
        db.enqueue("work", {"seconds": s, "result": {"n": n}})
        for n, s in enumerate((0.2, 0.6, 1.2))
    ]
    child = db.enqueue("parents", after=parents)
    row = db.wait_status(child, "completed", "dead", "cancelled")
    assert row["status"] == "completed"
    assert row["result"] == {"parents": {str(p): {"n": n} for n, p in enumerate(parents)}}
    last_end = max(execution(db, p)["ended_at"] for p in parents)
    assert execution(db, child)["started_at"] >= last_end


def test_a_dead_parent_applies_each_childs_policy(daemons: Daemons, db: Db) -> None:
    daemons.start(
        {"fail": {"target": "jobhandlers:fail", "max_attempts": 1}, "parents": PARENTS},
        {"slots": 3},
    )
    parent = db.enqueue("fail")
    cancel = db.enqueue("parents", after=[parent])
    run = db.enqueue("parents", after=[parent], on_parent_failure="run")
    hold = db.enqueue("parents", after=[parent], on_parent_failure="hold")
    assert db.wait_status(parent, "dead", "completed")["status"] == "dead"
    row = db.wait_status(cancel, "cancelled", "completed")
    assert row["last_error"] == f"cancelled: parent job {parent} ended dead"
    assert db.wait_status(run, "completed", "dead")["result"] == {"parents": {str(parent): None}}
    assert db.job(hold)["status"] == "waiting"
    explained = daemons.cli("explain", str(hold))
    assert f"held for an operator: job {parent} ended dead" in explained.stdout
    released = daemons.cli("release", str(hold))
    assert released.returncode == 0, released.stderr
    assert released.stdout.strip() == f"{hold}: released (pending)"
    assert db.wait_status(hold, "completed", "dead")["status"] == "completed"
    assert db.executions(cancel) == []


def test_a_daemon_killed_right_after_a_parents_completion_still_releases_the_child(
    daemons: Daemons, db: Db
) -> None:
    """The child is released in the transaction that completes its parent (a trigger),
    not by a daemon afterwards: kill -9 of the daemon the moment the parent's completion
    is committed leaves the child pending, and another daemon runs it."""
    # A does not serve the child's handler: whatever A does after the parent's completion,
    # the child can only have been released by the database (a daemon that could run it
    # claims it with the completion and may finish it before the kill)
    first = daemons.start({"work": WORK}, tag="A")
    parent = db.enqueue("work", {"seconds": 0.3})
    child = db.enqueue("next", {"seconds": 0}, after=[parent])
    assert db.job(child)["status"] == "waiting"
    db.wait_status(parent, "completed")
    first.send(signal.SIGKILL)
    first.wait_exit()
    assert db.job(child)["status"] == "pending"
    daemons.start({"next": WORK}, tag="B")
    assert db.wait_status(child, "completed", "dead")["status"] == "completed"


def test_a_jobs_own_timeout_overrides_its_handlers(daemons: Daemons, db: Db) -> None:
    daemons.start({"work": {**WORK, "max_attempts": 1}})
    job_id = db.enqueue("work", {"seconds": 60}, timeout=1)
    row = db.wait_status(job_id, "dead", "completed")
    assert row["status"] == "dead"
    assert row["last_error"].startswith("timed out after 1s")


def test_an_expired_job_is_never_started(daemons: Daemons, db: Db) -> None:
    job_id = db.enqueue("work", expire_in=0.5)
    fresh = db.enqueue("work", expire_in=3600)
    db.wait_status(fresh, "pending")
    time.sleep(1.0)
    daemons.start({"work": WORK})
    assert db.wait_status(fresh, "completed", "dead")["status"] == "completed"
    row = db.wait_status(job_id, "cancelled")
    assert row["last_error"].startswith("expired: not started by its expires_at")
    assert db.executions(job_id) == []
    assert "expired" in daemons.cli("explain", str(job_id)).stdout


def test_an_expired_job_no_daemon_serves_ends_by_the_sweep(daemons: Daemons, db: Db) -> None:
    """A daemon whose slots are all busy claims nothing, so no claim ends a job of a
    handler no daemon serves: the fleet's expiry sweep (job_expired_cancel, about every
    5 s with one daemon) ends it at its deadline, long before the busy slot frees."""
    daemons.start({"work": WORK}, {"slots": 1})
    busy = db.enqueue("work", {"seconds": 120})
    db.wait_status(busy, "running")
    job_id = db.enqueue("nobody-serves-this", expire_in=1)
    waiting = db.enqueue("nobody-serves-this", expire_in=3600)
    row = db.wait_status(job_id, "cancelled", timeout=60)
    assert row["last_error"].startswith("expired: not started by its expires_at")
    assert db.executions(job_id) == []
    assert db.job(waiting)["status"] == "pending"
    said = daemons.cli("explain", str(job_id))
    assert said.returncode == 0 and "expired" in said.stdout, said


def test_an_expired_job_of_a_served_handler_ends_by_the_sweep_while_every_slot_is_busy(
    daemons: Daemons, db: Db
) -> None:
    """Two daemons whose every slot is busy claim nothing: a job of a handler they both
    serve, expiring meanwhile, ends cancelled as expired by the sweep at its deadline (its
    slot would free two minutes later), never started; one expiring later stays pending."""
    for tag in ("A", "B"):
        daemons.start({"work": WORK}, {"slots": 1}, tag=tag)
    busy = [db.enqueue("work", {"seconds": 120}) for _ in range(2)]
    for job_id in busy:
        db.wait_status(job_id, "running")
    job_id = db.enqueue("work", expire_in=1)
    later = db.enqueue("work", expire_in=3600)
    row = db.wait_status(job_id, "cancelled", timeout=60)
    assert row["last_error"].startswith("expired: not started by its expires_at")
    assert db.executions(job_id) == []
    assert [db.job(b)["status"] for b in busy] == ["running", "running"]
    assert db.job(later)["status"] == "pending"


def test_the_cli_enqueues_children_and_shows_them(daemons: Daemons, db: Db) -> None:
    first = daemons.cli("enqueue", "work", "--delay", "1h")
    second = daemons.cli("enqueue", "work", "--delay", "1h")
    parents = [int(first.stdout), int(second.stdout)]
    made = daemons.cli(
        "enqueue",
        "work",
        "--after",
        str(parents[0]),
        "--after",
        str(parents[1]),
        "--on-parent-failure",
        "hold",
        "--expire-in",
        "1d",
        "--timeout",
        "90s",
    )
    assert made.returncode == 0, made.stderr
    child = int(made.stdout)
    row = db.job(child)
    assert (row["status"], row["on_parent_failure"], row["timeout_seconds"]) == (
        "waiting",
        "hold",
        90,
    )
    listed = daemons.cli("jobs", "--status", "waiting")
    assert listed.returncode == 0, listed.stderr
    assert str(child) in listed.stdout and str(parents[0]) not in listed.stdout
    shown = daemons.cli("show", str(child)).stdout
    assert f"parents: {parents[0]} pending work, {parents[1]} pending work" in shown
    assert f"children: {child} waiting work" in daemons.cli("show", str(parents[0])).stdout
    explained = daemons.cli("explain", str(child)).stdout
    assert f"waiting for 2 of its parents to finish: {parents[0]} (pending)" in explained
    bad = daemons.cli("enqueue", "work", "--after", "999999")
    assert bad.returncode != 0
    assert "after names job 999999, which does not exist" in bad.stderr
    not_held = daemons.cli("release", str(child))
    assert not_held.returncode == 1
    assert f"{child}: job {child} is not held for an operator" in not_held.stdout
    cancelled = daemons.cli("cancel", str(child))
    assert cancelled.stdout.strip() == f"{child}: cancelled"


def test_a_child_is_claimed_in_the_transaction_that_completes_its_parent(
    daemons: Daemons, db: Db
) -> None:
    """The daemon knows from the claim that a job has children: its completion goes with a
    claim, so the trigger releases the child and the claim takes it in one transaction
    (the child's started_at is the parent's finished_at: one transaction's now())."""
    daemons.start({"work": WORK}, {"slots": 2})
    first = JobSpec("work", {"seconds": 0.5})
    # one call: the parent has its child before any claim can see it
    parent, child = client.enqueue_many(
        db.conn, [first, JobSpec("work", {"seconds": 0}, after=[first])], schema=db.schema
    )
    assert db.wait_status(child, "completed", "dead")["status"] == "completed"
    assert db.job(child)["started_at"] == db.job(parent)["finished_at"]
