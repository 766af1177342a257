"""Acceptance tier: `async def` handlers (issue 26 item 1) with the real daemon and real
children (tests/support/asynchandlers.py): run in an event loop of the child, with the
same outcomes, progress, log capture, stops and follow-ups as a sync handler; a blocking
call inside a coroutine is reported in the job's log."""

from __future__ import annotations

from daemon_harness import Daemons, Db, wait_for


def log_of(db: Db, job_id: int) -> str:
    rows = wait_for(
        lambda: (
            (r := db.rows("SELECT * FROM {schema}.job_logs WHERE job_id = %s", (job_id,)))
            and r[0]["finished"]
            and r
        ),
        what=f"the finished log of job {job_id}",
    )
    return str(rows[0]["head"]) + str(rows[0]["tail"] or "")


def test_an_async_handler_runs_in_an_event_loop_with_progress_logs_and_follow_ups(
    db: Db, daemons: Daemons
) -> None:
    daemons.start(
        {
            "echo": {"target": "asynchandlers:echo"},
            "follow": {"target": "asynchandlers:with_follow_up"},
        }
    )
    job_id = db.enqueue("echo", {"n": 1})
    row = db.wait_status(job_id, "completed", "dead")
    assert row["status"] == "completed", row["last_error"]
    assert row["result"]["payload"] == {"n": 1}
    assert row["result"]["loop"].endswith("EventLoop")
    assert row["progress"] == {"half": True}
    text = log_of(db, job_id)
    assert f"async print of job {job_id}\n" in text
    assert f"INFO app.async: async logging of job {job_id}" in text

    parent = db.enqueue("follow")
    assert db.wait_status(parent, "completed", "dead")["result"] == {"parent": parent}
    [child] = db.rows(
        "SELECT id FROM {schema}.jobs WHERE handler = 'echo' AND payload = %s::jsonb",
        (f'{{"from": {parent}}}',),
    )
    done = db.wait_status(child["id"], "completed", "dead")
    assert done["result"]["payload"] == {"from": parent}


def test_an_async_handler_may_wait_for_a_signal(db: Db, daemons: Daemons) -> None:
    daemons.start({"waiter": {"target": "asynchandlers:waits_for_signal"}})
    job_id = db.enqueue("waiter")
    db.wait_status(job_id, "suspended")
    sent = daemons.cli("signal", str(job_id), "go", "--payload", '{"ok": 1}')
    assert sent.returncode == 0, sent.stderr
    row = db.wait_status(job_id, "completed", "dead")
    assert row["result"] == {"signal": {"ok": 1}}, row["last_error"]


def test_a_timeout_cancels_the_coroutine_which_cleans_up(db: Db, daemons: Daemons) -> None:
    daemons.start({"slow": {"target": "asynchandlers:slow", "timeout": "2s", "max_attempts": 1}})
    job_id = db.enqueue("slow", {"seconds": 60})
    row = db.wait_status(job_id, "dead", "completed")
    assert row["last_error"].startswith("timed out after 2s\n"), row["last_error"]
    assert "JobInterrupted: stopped by the daemon (SIGTERM)" in row["last_error"]
    assert f"cleaned up job {job_id}\n" in log_of(db, job_id)


def test_cancel_of_a_running_async_job(db: Db, daemons: Daemons) -> None:
    daemons.start({"slow": {"target": "asynchandlers:slow"}})
    job_id = db.enqueue("slow", {"seconds": 60})
    db.wait_status(job_id, "running")
    wait_for(
        lambda: db.job(job_id)["started_at"] is not None and db.job(job_id)["locked_by"],
        what="the job to start",
    )
    out = daemons.cli("cancel", str(job_id))
    assert out.returncode == 0, out.stderr
    row = db.wait_status(job_id, "cancelled", "completed", "dead")
    assert (row["status"], row["last_error"]) == ("cancelled", "cancelled while running")
    assert f"cleaned up job {job_id}\n" in log_of(db, job_id)


def test_a_blocking_call_in_a_coroutine_is_reported_in_the_jobs_log(
    db: Db, daemons: Daemons
) -> None:
    daemons.start({"blocking": {"target": "asynchandlers:blocking"}})
    job_id = db.enqueue("blocking", {"seconds": 3})
    row = db.wait_status(job_id, "completed", "dead")
    assert row["result"] == "done blocking", row["last_error"]
    text = log_of(db, job_id)
    assert "the event loop has been blocked for" in text, text
    assert "time.sleep(float(job.payload" in text  # where it blocked
    assert "the event loop was blocked for " in text and "s in all" in text


def test_a_sync_handler_is_unchanged_beside_async_ones(db: Db, daemons: Daemons) -> None:
    daemons.start(
        {"echo": {"target": "asynchandlers:echo"}, "work": {"target": "jobhandlers:work"}},
        {"max_jobs_per_child": 10, "slots": 1},
    )
    ids = [db.enqueue("echo"), db.enqueue("work", {"seconds": 0.1, "result": 7})]
    ids.append(db.enqueue("echo"))
    rows = [db.wait_status(j, "completed", "dead") for j in ids]
    assert [r["status"] for r in rows] == ["completed"] * 3, [r["last_error"] for r in rows]
    assert rows[1]["result"] == 7
    # one reused child ran all three: a loop per attempt leaves nothing behind
    assert rows[0]["result"]["pid"] == rows[2]["result"]["pid"]


# -- concurrency: one child runs up to N jobs of an async handler as coroutines ----------

SIDE = {"target": "asynchandlers:side_by_side", "concurrency": 4}


def test_one_child_runs_n_jobs_at_once_each_with_its_own_outcome_progress_and_log(
    db: Db, daemons: Daemons
) -> None:
    daemons.start({"side": SIDE}, {"slots": 4, "warm_children": 1})
    ids = [db.enqueue("side", {"seconds": 1.5}) for _ in range(4)]
    rows = [db.wait_status(j, "completed", "dead") for j in ids]
    assert [r["status"] for r in rows] == ["completed"] * 4, [r["last_error"] for r in rows]
    results = [r["result"] for r in rows]
    assert len({r["pid"] for r in results}) == 1  # one child ran the four
    assert max(r["t0"] for r in results) < min(r["t1"] for r in results)  # all at once
    for job_id, row in zip(ids, rows, strict=True):
        assert row["progress"] == {"step": 14}
        text = log_of(db, job_id)
        assert f"line 0 of job {job_id}\n" in text and f"line 14 of job {job_id}\n" in text
        assert f"INFO app.async: logged 14 of job {job_id}" in text
        others = [o for o in ids if o != job_id]
        assert not any(f"of job {o}\n" in text for o in others), text


def test_a_sync_handler_with_concurrency_is_refused_at_config_time(daemons: Daemons) -> None:
    config = daemons.config({"work": {"target": "jobhandlers:work", "concurrency": 2}})
    out = daemons.cli("--config", str(config), "check-config")
    assert out.returncode != 0
    assert "handler 'work': concurrency = 2 needs an async def handler" in out.stderr


def test_a_timeout_stops_one_coroutine_and_leaves_its_siblings_running(
    db: Db, daemons: Daemons
) -> None:
    daemons.start({"side": SIDE}, {"slots": 4, "warm_children": 1})
    siblings = [db.enqueue("side", {"seconds": 4}) for _ in range(2)]
    late = db.enqueue("side", {"seconds": 60}, timeout=2, max_attempts=1)
    row = db.wait_status(late, "dead", "completed")
    assert row["last_error"].startswith("timed out after 2s\n"), row["last_error"]
    assert "JobInterrupted: stopped by the daemon" in row["last_error"]
    done = [db.wait_status(j, "completed", "dead") for j in siblings]
    assert [(r["status"], r["attempts"]) for r in done] == [("completed", 1)] * 2
    assert done[0]["result"]["pid"] == done[1]["result"]["pid"]


def test_a_blocking_coroutine_is_named_in_its_log_and_its_siblings_logs(
    db: Db, daemons: Daemons
) -> None:
    daemons.start(
        {
            "side": SIDE,
            "blocking": {"target": "asynchandlers:blocking", "concurrency": 4},
        },
        {"slots": 4, "warm_children": 1},
    )
    sibling = db.enqueue("blocking", {"seconds": 0})
    blocker = db.enqueue("blocking", {"seconds": 3})
    for job_id in (sibling, blocker):
        assert db.wait_status(job_id, "completed", "dead")["status"] == "completed"
    text = log_of(db, blocker)
    assert "the event loop has been blocked for" in text and "time.sleep(" in text, text


def test_a_coroutine_that_ignores_its_stop_is_killed_and_its_siblings_are_handed_back(
    db: Db, daemons: Daemons
) -> None:
    daemons.start(
        {
            "side": SIDE,
            "stubborn": {
                "target": "asynchandlers:stubborn",
                "concurrency": 4,
                "timeout": "2s",
                "max_attempts": 1,
            },
        },
        {"slots": 4, "warm_children": 1, "kill_grace": "1s"},
    )
    stubborn = db.enqueue("stubborn")
    row = db.wait_status(stubborn, "dead", "completed")
    assert row["last_error"].startswith("timed out after 2s"), row["last_error"]
    # its siblings: handed back (attempt not counted), then run again to completion
    siblings = [db.enqueue("side", {"seconds": 3}) for _ in range(2)]
    for job_id in siblings:
        assert db.wait_status(job_id, "completed", "dead")["attempts"] == 1


def test_a_memory_stop_fails_every_job_of_the_child_saying_why(db: Db, daemons: Daemons) -> None:
    daemons.start(
        {
            "hog": {
                "target": "asynchandlers:hog",
                "concurrency": 4,
                "memory_limit": "150MiB",
                "max_attempts": 1,
            }
        },
        {"slots": 4, "warm_children": 1},
    )
    quiet = db.enqueue("hog", {"mib": 1})
    wait_for(lambda: db.job(quiet)["status"] == "running", what="the quiet job to run")
    greedy = db.enqueue("hog", {"mib": 400})
    for job_id in (quiet, greedy):
        row = db.wait_status(job_id, "dead", "completed")
        assert row["status"] == "dead"
        assert "memory" in row["last_error"] and "side by side" in row["last_error"], row


def test_side_by_side_jobs_wait_for_signals_and_return_follow_ups(db: Db, daemons: Daemons) -> None:
    daemons.start(
        {
            "waiter": {"target": "asynchandlers:waits_for_signal", "concurrency": 4},
            "follow": {"target": "asynchandlers:with_follow_up", "concurrency": 4},
            "echo": {"target": "asynchandlers:echo"},
        },
        {"slots": 4, "warm_children": 1},
    )
    waiters = [db.enqueue("waiter") for _ in range(2)]
    for job_id in waiters:
        db.wait_status(job_id, "suspended")
    parents = [db.enqueue("follow") for _ in range(2)]
    for n, job_id in enumerate(waiters):
        sent = daemons.cli("signal", str(job_id), "go", "--payload", f'{{"n": {n}}}')
        assert sent.returncode == 0, sent.stderr
    for n, job_id in enumerate(waiters):
        row = db.wait_status(job_id, "completed", "dead")
        assert row["result"] == {"signal": {"n": n}}, row["last_error"]
    for parent in parents:
        assert db.wait_status(parent, "completed", "dead")["result"] == {"parent": parent}
        [child] = db.rows(
            "SELECT id FROM {schema}.jobs WHERE handler = 'echo' AND payload = %s::jsonb",
            (f'{{"from": {parent}}}',),
        )
        assert db.wait_status(child["id"], "completed", "dead")["status"] == "completed"
