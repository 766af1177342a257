"""Fleet-wide limits and pauses with real daemons (README "Fleet-wide limits"): every
execution is recorded by the handler (tests/support/jobhandlers.py: start, last sign of
life, end), and the number running at any instant never exceeds the limit; a killed
daemon's slot returns when its lease ends; a paused queue or handler keeps its jobs
pending while the rest runs."""

from __future__ import annotations

import signal
import time
from datetime import datetime

from daemon_harness import Daemons, Db, wait_for

WORK = "jobhandlers:work"


def overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one instant (an end before a start at equal times)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def spans(db: Db) -> list[dict[str, object]]:
    """Every execution with its job's key: from its start to its end, or for a killed
    one to its last sign of life."""
    return db.rows(
        "SELECT e.job_id, e.tag, e.started_at, coalesce(e.ended_at, e.alive_at) AS ended_at, "
        "j.concurrency_key FROM {schema}.executions e JOIN {schema}.jobs j ON j.id = e.job_id "
        "ORDER BY e.id"
    )


def all_completed(db: Db, ids: list[int]) -> bool:
    return all(db.job(i)["status"] == "completed" for i in ids)


def test_three_daemons_never_run_more_than_max_running(db: Db, daemons: Daemons) -> None:
    # one slot each: the limit binds (3 slots, 2 allowed), and 2 at once takes 2 daemons
    handlers = {"rec": {"target": WORK, "max_running": 2}}
    for tag in "ABC":
        daemons.start(handlers, {"slots": 1}, tag=tag)
    ids = [db.enqueue("rec", {"seconds": 0.8}) for _ in range(10)]
    wait_for(lambda: all_completed(db, ids), timeout=40, what="every job to complete")
    runs = spans(db)
    assert len(runs) == 10
    assert overlap([(r["started_at"], r["ended_at"]) for r in runs]) == 2  # type: ignore[misc]


def test_a_killed_daemons_slot_returns_when_its_lease_ends(db: Db, daemons: Daemons) -> None:
    # attempt 1 outlasts the test; its rescue (attempt 2) is quick
    handlers = {"rec": {"target": WORK, "max_running": 1, "lease": "3s"}}
    running = {tag: daemons.start(handlers, {"slots": 2}, tag=tag) for tag in "AB"}
    held = db.enqueue("rec", {"seconds": [120, 0]})
    first = db.wait_started(held)
    waiting = db.enqueue("rec", {"seconds": 0})
    time.sleep(2.5)  # both daemons claimed in the meantime (poll_interval 1s)
    assert db.job(waiting)["status"] == "pending"  # the slot is held
    holder = running[first["tag"]]
    holder.send(signal.SIGKILL)
    holder.wait_exit()
    killed_at = db.now()
    lease_end = db.job(held)["locked_until"]  # no renewal after the kill
    wait_for(lambda: all_completed(db, [held, waiting]), timeout=30, what="both jobs to end")
    runs = spans(db)
    later = [r for r in runs if r["started_at"] > first["started_at"]]  # type: ignore[operator]
    assert len(later) == 2  # the rescued attempt and the waiting job, one at a time
    # nothing started while the lost lease was current, and the slot came back
    assert all(r["started_at"] >= lease_end for r in later)  # type: ignore[operator]
    assert lease_end > killed_at  # the kill happened while the slot was held
    assert overlap([(r["started_at"], r["ended_at"]) for r in runs]) == 1  # type: ignore[misc]


def test_three_daemons_hold_max_running_per_key(db: Db, daemons: Daemons) -> None:
    handlers = {"rec": {"target": WORK, "max_running_per_key": 1}}
    for tag in "ABC":
        daemons.start(handlers, {"slots": 2}, tag=tag)
    ids = [db.enqueue("rec", {"seconds": 0.8}, concurrency_key=key) for key in ["a", "b"] * 3]
    ids += [db.enqueue("rec", {"seconds": 0.8}) for _ in range(3)]  # no key: no limit
    wait_for(lambda: all_completed(db, ids), timeout=40, what="every job to complete")
    runs = spans(db)
    assert len(runs) == 9
    for key in ("a", "b"):
        of_key = [(r["started_at"], r["ended_at"]) for r in runs if r["concurrency_key"] == key]
        assert overlap(of_key) == 1  # type: ignore[arg-type]
    # the keys did not wait for each other, nor the jobs without one
    assert overlap([(r["started_at"], r["ended_at"]) for r in runs]) >= 3  # type: ignore[misc]


def test_a_paused_queue_or_handler_waits_while_the_rest_runs(db: Db, daemons: Daemons) -> None:
    daemons.start(
        {
            "rec": {"target": WORK, "queues": ["q1", "q2"]},
            "other": {"target": WORK, "queue": "q2"},
        },
        {"slots": 4},
    )
    for args in (["--queue", "q1"], ["--handler", "other"]):
        out = daemons.cli("pause", *args)
        assert out.returncode == 0, out.stderr
    in_paused_queue = db.enqueue("rec", {"seconds": 0}, queue="q1")
    of_paused_handler = db.enqueue("other", {"seconds": 0}, queue="q2")
    free = db.enqueue("rec", {"seconds": 0}, queue="q2")
    db.wait_status(free, "completed", timeout=20)
    time.sleep(2.5)  # more claims (poll_interval 1s) that must leave them alone
    assert db.job(in_paused_queue)["status"] == "pending"
    assert db.job(of_paused_handler)["status"] == "pending"
    status = daemons.cli("status")
    assert "queue q1 since" in status.stdout and "handler other since" in status.stdout
    assert daemons.cli("resume", "--queue", "q1").returncode == 0
    db.wait_status(in_paused_queue, "completed", timeout=20)
    assert db.job(of_paused_handler)["status"] == "pending"
    assert daemons.cli("resume", "--handler", "other").returncode == 0
    db.wait_status(of_paused_handler, "completed", timeout=20)
