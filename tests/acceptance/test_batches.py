"""Batches with real daemons (docs/guide/batches.md): a callback runs once, after its last
member, and sees every member's outcome (a dead one too); members finishing on two daemons
at once release it exactly once; a kill -9 of the daemon right after the last member's
completion still leaves the callback to run. The SQL side (concurrent finishes, hostile
input, retention): tests/integration/test_batches_sql.py."""

from __future__ import annotations

import json
import signal

from daemon_harness import Daemons, Db

import pgworkerd
from pgworkerd.client import JobSpec

WORK = {"target": "jobhandlers:work"}
FAIL = {"target": "jobhandlers:fail", "max_attempts": 1}
SEEN = {"target": "jobhandlers:batch_seen"}


def test_a_callback_runs_once_after_its_members_and_sees_each_outcome(
    daemons: Daemons, db: Db
) -> None:
    daemons.start({"work": WORK, "fail": FAIL, "seen": SEEN}, {"slots": 3})
    ids = pgworkerd.batch(
        db.conn,
        [
            JobSpec("work", {"seconds": 0.2, "result": {"n": 1}}),
            JobSpec("fail"),
            JobSpec("work", {"seconds": 0.8, "result": {"n": 3}}),
        ],
        then=JobSpec("seen"),
        schema=db.schema,
    )
    row = db.wait_status(ids.callback_id, "completed", "dead", "cancelled")
    assert row["status"] == "completed"
    seen = row["result"]["batch"]
    assert (seen["id"], seen["members"]) == (ids.batch_id, 3)
    assert (seen["completed"], seen["dead"], seen["cancelled"]) == (2, 1, 0)
    assert seen["outcomes_complete"] is True
    outcomes = {o["id"]: o for o in seen["outcomes"]}
    a, b, c = ids.member_ids
    assert outcomes[a]["status"] == "completed" and outcomes[a]["result"] == {"n": 1}
    assert outcomes[b]["status"] == "dead" and "boom on attempt 1" in outcomes[b]["error"]
    assert outcomes[c]["result"] == {"n": 3}
    [run] = db.executions(ids.callback_id)  # once
    last_end = max(e["ended_at"] for m in ids.member_ids for e in db.executions(m))
    assert run["started_at"] >= last_end


def test_members_finishing_on_two_daemons_release_the_callback_exactly_once(
    daemons: Daemons, db: Db
) -> None:
    handlers = {"work": WORK, "seen": SEEN}
    daemons.start(handlers, {"slots": 4}, tag="A")
    daemons.start(handlers, {"slots": 4}, tag="B")
    ids = pgworkerd.batch(
        db.conn,
        [JobSpec("work", {"seconds": 0.05 * (n % 4)}) for n in range(40)],
        then=JobSpec("seen"),
        schema=db.schema,
    )
    row = db.wait_status(ids.callback_id, "completed", "dead", "cancelled")
    assert row["status"] == "completed"
    assert row["result"]["batch"]["completed"] == 40
    assert len(db.executions(ids.callback_id)) == 1
    ran_on = db.rows(
        "SELECT DISTINCT worker FROM {schema}.attempts WHERE job_id = ANY(%s)",
        (ids.member_ids,),
    )
    assert len(ran_on) == 2, ran_on  # both daemons finished members


def test_a_daemon_killed_right_after_the_last_members_completion_leaves_the_callback_to_run(
    daemons: Daemons, db: Db
) -> None:
    """The release is in the transaction that completes the last member (a trigger), not
    a daemon's later step: daemon A (which does not serve the callback's handler) is killed
    with SIGKILL the moment that completion is committed; the callback is pending, and
    daemon B runs it."""
    first = daemons.start({"work": WORK}, tag="A")
    ids = pgworkerd.batch(
        db.conn,
        [JobSpec("work", {"seconds": 0.1}), JobSpec("work", {"seconds": 0.4})],
        then=JobSpec("seen"),
        schema=db.schema,
    )
    db.wait_status(ids.member_ids[1], "completed")
    first.send(signal.SIGKILL)
    first.wait_exit()
    assert db.job(ids.callback_id)["status"] == "pending"
    daemons.start({"seen": SEEN}, tag="B")
    row = db.wait_status(ids.callback_id, "completed", "dead")
    assert row["status"] == "completed"
    assert row["result"]["batch"]["completed"] == 2


def test_show_and_explain_name_the_batch_and_its_progress(daemons: Daemons, db: Db) -> None:
    daemons.start({"work": WORK}, tag="A")
    ids = pgworkerd.batch(
        db.conn,
        [JobSpec("work"), JobSpec("work", delay=3600)],
        then=JobSpec("seen"),
        schema=db.schema,
    )
    db.wait_status(ids.member_ids[0], "completed")
    shown = daemons.cli("show", str(ids.callback_id))
    assert shown.returncode == 0, shown.stderr
    assert (
        f"batch: the callback of batch {ids.batch_id}: 1 of 2 members finished "
        "(1 completed, 0 dead, 0 cancelled)" in shown.stdout
    )
    member = daemons.cli("show", str(ids.member_ids[1]))
    assert f"batch: a member of batch {ids.batch_id}: 1 of 2" in member.stdout
    explained = daemons.cli("explain", "--json", str(ids.callback_id))
    assert explained.returncode == 0, explained.stderr
    [reason] = json.loads(explained.stdout)["reasons"]
    assert reason["code"] == "waiting_on_batch"
    assert (reason["facts"]["finished"], reason["facts"]["members"]) == (1, 2)
    viewed = daemons.cli("batch", str(ids.batch_id))
    assert viewed.returncode == 0, viewed.stderr
    lines = viewed.stdout.splitlines()
    assert lines[0] == (
        f"batch {ids.batch_id}: 1 of 2 members finished (1 completed, 0 dead, 0 cancelled)"
    )
    assert lines[1] == f"callback: job {ids.callback_id} seen waiting"
    assert [ln.split()[:2] for ln in lines[3:]] == [
        [str(ids.member_ids[0]), "completed"],
        [str(ids.member_ids[1]), "pending"],
    ]
    missing = daemons.cli("batch", str(ids.batch_id + 100))
    assert missing.returncode != 0 and "not found" in missing.stderr
