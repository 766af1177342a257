"""[worker] prefetch (issue 26, item 5) with a real daemon: claimed jobs held ready beyond
the slots run one slot at a time and no more children run than slots, every job ends
once; a drain hands the held ones back at once, their attempt not counted, while the
running one finishes."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from daemon_harness import Daemons, Db, wait_for

WORK = {"target": "jobhandlers:work"}


def overlapping(rows: list[dict]) -> int:
    """The most executions running at one instant."""
    events = sorted(
        [(r["started_at"], 1) for r in rows] + [(r["ended_at"], -1) for r in rows],
        key=lambda e: (e[0], e[1]),
    )
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize("per_child", [100, 1])
def test_held_jobs_run_as_slots_free_and_no_more_at_once_than_slots(
    db: Db, daemons: Daemons, per_child: int
) -> None:
    """Children reused, and a fresh process per job (each exiting child's slot gets a new
    child for the next held job)."""
    daemons.start({"work": WORK}, {"slots": 2, "prefetch": 6, "max_jobs_per_child": per_child})
    jobs = [db.enqueue("work", {"seconds": 0.05}) for _ in range(24)]
    for job_id in jobs:
        assert db.wait_status(job_id, "completed", "dead")["status"] == "completed"
    rows = db.executions()
    assert sorted(r["job_id"] for r in rows) == sorted(jobs)  # each ran once
    assert all(r["ended_at"] is not None for r in rows)
    assert overlapping(rows) <= 2


def test_a_drain_hands_held_jobs_back_at_once_and_the_running_one_finishes(
    db: Db, daemons: Daemons
) -> None:
    daemon = daemons.start({"work": WORK}, {"slots": 1, "prefetch": 4, "max_jobs_per_child": 100})
    jobs = [db.enqueue("work", {"seconds": 3}) for _ in range(5)]
    first = db.wait_started(jobs[0])["job_id"]
    # all five are this daemon's: one runs, four wait for its slot
    wait_for(
        lambda: sum(db.job(j)["status"] == "running" for j in jobs) == 5,
        what="five jobs claimed",
    )
    assert len(db.executions()) == 1
    assert daemon.proc is not None
    title = Path(f"/proc/{daemon.proc.pid}/cmdline")
    wait_for(
        lambda: "running: 1/1 busy, 4 held" in title.read_bytes().decode(errors="replace"),
        what="the title telling held jobs from busy slots",
    )
    daemon.send(signal.SIGTERM)
    asked = time.monotonic()
    held = [j for j in jobs if j != first]
    wait_for(
        lambda: all(db.job(j)["status"] == "pending" for j in held), what="held jobs handed back"
    )
    assert time.monotonic() - asked < 2.5  # at once, not after the running job
    assert all(db.job(j)["attempts"] == 0 for j in held)  # never started: not counted
    assert db.wait_status(first, "completed")["attempts"] == 1
    assert daemon.wait_exit() == 0
    assert [r["job_id"] for r in db.executions()] == [first]
