"""Dependencies under faults with real daemons (issue 24, "Done when": a parent dying while
its children are being resolved). The resolution runs in the transaction that ends the
parent (a trigger on jobs, job_parents.sql), so:

- a parent that dies (its last attempt fails, on one daemon) while its sibling parent
  completes (on another), in rounds at nearly the same instant, each with hundreds of
  children to resolve: a child with the cancel policy ends cancelled and never runs; one
  with the run policy runs exactly once, after both parents ended; none runs early;
- the daemon completing a parent with thousands of children is killed -9 at moments
  around the completion: the children are released all or none (never some), and
  whichever it was, another daemon finishes the job and runs every child exactly once.

The SQL side of the same race (concurrent transactions, without daemons):
tests/integration/test_dependencies_sql.py::
test_a_parent_dying_while_another_completes_never_runs_the_child_early."""

from __future__ import annotations

import signal
import time
from collections import Counter
from typing import Any

from daemon_harness import Daemons, Db, wait_for

from pgworkerd import client
from pgworkerd.client import JobSpec

WORK = {"target": "jobhandlers:work"}
FAIL = {"target": "jobhandlers:fail", "max_attempts": 1}
LEASE = {"lease": "3s", "renew_interval": "1s", "poll_interval": "1s", "backoff": "0s"}


def children_rows(db: Db, ids: list[int]) -> list[dict[str, Any]]:
    return db.rows(
        "SELECT id, status::text, last_error, on_parent_failure FROM {schema}.jobs"
        " WHERE id = ANY(%s) ORDER BY id",
        (ids,),
    )


def executions_of(db: Db, ids: list[int]) -> list[dict[str, Any]]:
    return db.rows(
        "SELECT job_id, started_at, ended_at FROM {schema}.executions WHERE job_id = ANY(%s)",
        (ids,),
    )


def test_a_parent_dying_while_its_sibling_completes_never_runs_a_child_early(
    daemons: Daemons, db: Db
) -> None:
    """Two daemons: A runs the parent that completes, B the one that dies (its only
    attempt fails). Each round both are enqueued together (woken by the same enqueue),
    the completing one a little later each round, with 300 cancel-policy children (not
    served: only their resolution counts) and 15 run-policy ones."""
    daemons.start({"ok": WORK, "child": WORK}, {**LEASE, "slots": 4}, tag="A")
    daemons.start({"bad": FAIL, "child": WORK}, {**LEASE, "slots": 4}, tag="B")
    cancel_children: list[int] = []
    parents_of: dict[int, tuple[int, int]] = {}  # run-policy child -> its parents
    for n in range(5):
        ok = JobSpec("ok", {"seconds": 0.01 * n})
        bad = JobSpec("bad", max_attempts=1)
        specs = [ok, bad]
        specs += [JobSpec("never", {"n": i}, after=[ok, bad]) for i in range(300)]
        specs += [
            JobSpec("child", {"n": i}, after=[ok, bad], on_parent_failure="run") for i in range(15)
        ]
        ids = client.enqueue_many(db.conn, specs, schema=db.schema)
        cancel_children += ids[2:302]
        parents_of |= dict.fromkeys(ids[302:], (ids[0], ids[1]))
        # (each round's parents end before the next is enqueued)
        assert db.wait_status(ids[0], "completed", "dead")["status"] == "completed"
        assert db.wait_status(ids[1], "completed", "dead")["status"] == "dead"
    run_children = list(parents_of)
    wait_for(
        lambda: all(r["status"] in ("completed", "dead") for r in children_rows(db, run_children)),
        timeout=180,
        what="every run-policy child to finish",
    )
    cancelled = children_rows(db, cancel_children)
    assert Counter(r["status"] for r in cancelled) == {"cancelled": len(cancel_children)}
    assert all("parent" in (r["last_error"] or "") for r in cancelled), cancelled[:3]
    ran = children_rows(db, run_children)
    assert Counter(r["status"] for r in ran) == {"completed": len(run_children)}
    runs = executions_of(db, run_children)
    assert sorted(Counter(r["job_id"] for r in runs).values()) == [1] * len(run_children)
    # none started before both its parents had ended
    ended = {
        r["id"]: r["finished_at"]
        for r in db.rows(
            "SELECT id, finished_at FROM {schema}.jobs WHERE id = ANY(%s)",
            ([p for pair in parents_of.values() for p in pair],),
        )
    }
    early = [r for r in runs if r["started_at"] < max(ended[p] for p in parents_of[r["job_id"]])]
    assert early == []


def test_a_daemon_killed_9_while_it_completes_a_parent_releases_its_children_all_or_none(
    daemons: Daemons, db: Db
) -> None:
    """A serves only the parents; each round A is killed -9 a few milliseconds after the
    parent's handler returned (from before its completion is written to after its 2,000
    children are released), then another A is started. Right after each kill the
    children are all waiting (the completion rolled back: the parent is rescued and runs
    again) or all pending, never some of each; once every parent has completed each child
    is pending with no unfinished parent (released once: a second release would count
    below 0). The children's handler is served by no daemon: their release is the point."""
    config = daemons.config({"parent": WORK}, LEASE)
    rounds: list[tuple[int, list[int]]] = []
    seen: list[tuple[float, str, list[str]]] = []
    for delay in (0.0, 0.005, 0.02, 0.06):
        a = daemons.start(config, tag=f"A{len(rounds)}")
        parent = JobSpec("parent", {"seconds": 0})
        children = [JobSpec("child", {"n": i}, after=[parent]) for i in range(2000)]
        ids = client.enqueue_many(db.conn, [parent, *children], schema=db.schema)
        parent_id, child_ids = ids[0], ids[1:]
        # the handler returned (its execution ended): the completion is on its way
        wait_for(
            lambda p=parent_id: any(r["ended_at"] for r in db.executions(p)),
            what=f"parent {parent_id}'s handler to return",
        )
        time.sleep(delay)
        a.send(signal.SIGKILL)
        a.wait_exit()
        # (the killed daemon's backend notices its closed socket: let it end its work)
        time.sleep(1.0)
        statuses = sorted({r["status"] for r in children_rows(db, child_ids)})
        parent_status = db.job(parent_id)["status"]
        seen.append((delay, parent_status, statuses))
        assert statuses in (["waiting"], ["pending"]), seen[-1]
        assert (parent_status == "completed") == (statuses == ["pending"]), seen[-1]
        rounds.append((parent_id, child_ids))
    print("after each kill (delay, parent, children):", seen)
    daemons.start(config, tag="A")  # reruns, after its lease, a parent whose write was lost
    for parent_id, _ in rounds:
        assert db.wait_status(parent_id, "completed", "dead")["status"] == "completed"
    every_child = [c for _, child_ids in rounds for c in child_ids]
    released = db.rows(
        "SELECT status::text, parents_unfinished, parents_failed, count(*) AS n"
        " FROM {schema}.jobs WHERE id = ANY(%s) GROUP BY 1, 2, 3",
        (every_child,),
    )
    assert released == [
        {"status": "pending", "parents_unfinished": 0, "parents_failed": 0, "n": len(every_child)}
    ]
