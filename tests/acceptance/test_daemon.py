"""Acceptance tier: the real `pgworkerd run` as a subprocess against real PostgreSQL, with
real signals and kill -9; every assertion is on rows (jobs, workers, and the `executions`
the test handlers in jobhandlers.py record) or on processes and log lines.

Leases are short (seconds) so lost daemons are noticed quickly; every wait is on a
condition with a generous deadline, so a loaded machine makes the suite slower, not red.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from daemon_harness import (
    DEADLINE,
    DaemonProcess,
    Daemons,
    Db,
    children_of,
    is_gone,
    process_title,
    wait_for,
)

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate

WORK = {"target": "jobhandlers:work"}


@pytest.fixture(autouse=True, scope="module")
def no_core_dumps() -> Iterator[None]:
    """Crash tests kill children with SIGSEGV: no core files from that."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    yield
    resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


def seconds_between(earlier: datetime, later: datetime) -> float:
    return (later - earlier).total_seconds()


# -- outcomes of one attempt ------------------------------------------------------------


def test_job_completes_and_its_result_is_stored(db: Db, daemons: Daemons) -> None:
    daemon = daemons.start({"work": WORK})
    job_id = db.enqueue("work", {"seconds": 0.3, "result": {"answer": 42}})

    row = db.wait_status(job_id, "completed", "dead", "cancelled")
    assert row["status"] == "completed"
    assert row["result"] == {"answer": 42}
    assert (row["attempts"], row["last_error"], row["locked_by"]) == (1, None, None)
    [execution] = db.executions(job_id)
    assert execution["tag"] == "A" and execution["ended_at"] is not None
    assert row["finished_at"] >= execution["ended_at"]
    daemon.wait_log(rf"job {job_id} work attempt 1: completed in")


def test_exception_fails_the_attempt_with_traceback_retries_then_dead(
    db: Db, daemons: Daemons
) -> None:
    daemon = daemons.start({"fail": {"target": "jobhandlers:fail", "max_attempts": 3}})
    job_id = db.enqueue("fail")

    row = db.wait_status(job_id, "dead", "completed")
    assert row["status"] == "dead"
    assert row["attempts"] == 3
    error = row["last_error"]
    assert error.startswith("ValueError: boom on attempt 3\n")
    assert "Traceback (most recent call last)" in error and "jobhandlers.py" in error
    executions = db.executions(job_id)
    assert [e["attempt"] for e in executions] == [1, 2, 3]
    for before, after in itertools.pairwise(executions):
        assert before["ended_at"] <= after["started_at"]
    daemon.wait_log(rf"job {job_id} fail attempt 1: failed .*boom on attempt 1; retry at")
    daemon.wait_log(rf"job {job_id} fail attempt 3: failed .*boom on attempt 3; now dead")


def test_child_crash_is_recorded_at_once_naming_signal_or_exit_code(
    db: Db, daemons: Daemons
) -> None:
    # A 30 s lease: a failure seen within seconds came from reaping, not from lease expiry.
    daemons.start({"crash": {"target": "pgworkerd.examples:crash", "lease": "30s"}}, {"slots": 3})
    expected = {
        "kill": "child process killed by SIGKILL",
        "segv": "child process killed by SIGSEGV",
        "exit": "child process exited with code 3",
    }
    ids = {how: db.enqueue("crash", {"how": how}, max_attempts=1) for how in expected}

    for how, job_id in ids.items():
        row = db.wait_status(job_id, "dead", "completed")
        assert row["status"] == "dead", how
        assert row["attempts"] == 1
        assert row["last_error"].startswith(expected[how]), row["last_error"]
        assert seconds_between(row["started_at"], row["finished_at"]) < 10, how


def test_timeout_stops_the_attempt(db: Db, daemons: Daemons) -> None:
    daemons.start({"slow": {**WORK, "timeout": "2s", "max_attempts": 1}})
    job_id = db.enqueue("slow", {"seconds": 60})

    row = db.wait_status(job_id, "dead", "completed")
    assert row["status"] == "dead"
    assert row["last_error"].startswith("timed out after 2s\n")
    assert "JobInterrupted" in row["last_error"]  # where the handler was stopped
    [execution] = db.executions(job_id)
    assert execution["ended_at"] is None
    assert 1.5 <= seconds_between(execution["started_at"], row["finished_at"]) < 15
    wait_for(lambda: is_gone(execution["pid"]), what="the timed-out child to exit")


def test_silent_job_is_stopped_after_heartbeat_timeout(db: Db, daemons: Daemons) -> None:
    daemons.start(
        {"quiet": {"target": "jobhandlers:hang", "heartbeat_timeout": "2s", "max_attempts": 1}}
    )
    # Beats for 1.5 s, then falls silent: only the silence may stop it.
    job_id = db.enqueue("quiet", {"beat_for": 1.5})

    row = db.wait_status(job_id, "dead", "completed")
    assert row["status"] == "dead"
    assert row["last_error"].startswith("no heartbeat for 2s: stuck")
    [execution] = db.executions(job_id)
    assert seconds_between(execution["started_at"], row["finished_at"]) >= 3.0
    wait_for(lambda: is_gone(execution["pid"]), what="the stuck child to exit")


def test_values_postgres_cannot_store_fail_the_job_not_the_daemon(db: Db, daemons: Daemons) -> None:
    daemon = daemons.start(
        {"unstorable": {"target": "jobhandlers:unstorable", "max_attempts": 1}, "work": WORK},
        {"slots": 4},
    )
    bystander = db.enqueue("work", {"seconds": 4})
    db.wait_started(bystander)
    ids = {w: db.enqueue("unstorable", {"where": w}) for w in ("result", "error", "progress")}

    errors = {}
    for where, job_id in ids.items():
        row = db.wait_status(job_id, "dead", "completed")
        assert row["status"] == "dead", where
        errors[where] = row["last_error"]
    assert "NUL" in errors["result"] and "NUL" in errors["progress"]
    assert errors["error"].startswith("ValueError: bad \\x00 byte")
    # The daemon and the job running beside them were not disturbed.
    assert db.wait_status(bystander, "completed", "dead")["status"] == "completed"
    assert daemon.proc is not None and daemon.proc.poll() is None
    assert db.executions(bystander)[0]["attempt"] == 1


# -- stopping jobs from outside ---------------------------------------------------------


def test_cancel_of_a_running_job_stops_its_child(db: Db, daemons: Daemons) -> None:
    daemons.start({"work": WORK})
    job_id = db.enqueue("work", {"seconds": 60})
    execution = db.wait_started(job_id)

    out = daemons.cli("cancel", str(job_id))
    assert (out.returncode, out.stdout.strip()) == (0, f"{job_id}: cancel requested"), out.stderr

    row = db.wait_status(job_id, "cancelled", "completed", "dead")
    assert row["status"] == "cancelled"
    assert row["last_error"] == "cancelled while running"
    assert row["attempts"] == 1 and row["locked_by"] is None
    wait_for(lambda: is_gone(execution["pid"]), what="the cancelled child to exit")
    [execution] = db.executions(job_id)
    assert execution["ended_at"] is None


def test_kill_9_of_a_child_is_a_failed_attempt_and_the_job_is_retried(
    db: Db, daemons: Daemons
) -> None:
    daemons.start({"work": {**WORK, "lease": "30s"}})
    job_id = db.enqueue("work", {"seconds": [60, 0.3]})
    first = db.wait_started(job_id)

    os.kill(first["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    row = wait_for(
        lambda: "killed by SIGKILL" in ((r := db.job(job_id))["last_error"] or "") and r,
        what="the killed attempt to be recorded",
    )
    # Reaped and written at once; the 30 s lease plays no part.
    assert time.monotonic() - killed_at < 5
    assert row["last_error"].startswith("child process killed by SIGKILL")

    row = db.wait_status(job_id, "completed", "dead")
    assert row["status"] == "completed" and row["attempts"] == 2
    first, second = db.executions(job_id)
    assert (first["attempt"], first["ended_at"]) == (1, None)
    assert second["attempt"] == 2 and second["ended_at"] is not None
    assert first["alive_at"] < second["started_at"]


def test_kill_9_of_the_parent_kills_its_children_and_another_daemon_takes_over(
    db: Db, daemons: Daemons
) -> None:
    config = daemons.config({"work": WORK}, {"lease": "4s"})
    a = daemons.start(config, tag="A")
    job_id = db.enqueue("work", {"seconds": [60, 1]})
    first = db.wait_started(job_id)
    processes = children_of(a.pid)  # the job's child, a warm child and the fork server
    assert first["pid"] in processes and len(processes) >= 2

    a.send(signal.SIGKILL)
    a.wait_exit()
    for pid in processes:
        wait_for(lambda pid=pid: is_gone(pid), timeout=10, what=f"A's process {pid} to die")
    held = db.job(job_id)
    assert held["status"] == "running" and held["locked_by"] == a.worker_id

    b = daemons.start(config, tag="B")
    row = db.wait_status(job_id, "completed", "dead")
    assert row["status"] == "completed" and row["attempts"] == 2
    assert f"lease of {a.worker_id} expired during attempt 1" in row["last_error"]
    # the ending in words, in the job row when B rescued it and in the attempt's history
    lost = f"lease expired: daemon {a.worker_id} on {socket.gethostname()} stopped renewing"
    history = db.rows(
        "SELECT attempt, outcome, worker, error FROM {schema}.attempts"
        " WHERE job_id = %s ORDER BY finished_at",
        (job_id,),
    )
    assert [(h["attempt"], h["outcome"], h["worker"]) for h in history] == [
        (1, "lease expired", a.worker_id),
        (2, "completed", b.worker_id),
    ]
    assert history[0]["error"].startswith(lost)
    b.wait_log(rf"job {job_id} work attempt 2: claimed \(rescued after its lease expired\)")
    first, second = db.executions(job_id)
    assert (first["tag"], first["attempt"], first["ended_at"]) == ("A", 1, None)
    assert (second["tag"], second["attempt"]) == ("B", 2)
    # Never two at once: B started only after A's lease ran out, long after A's child died.
    assert second["started_at"] >= held["locked_until"]
    assert first["alive_at"] < second["started_at"]


def test_sigterm_drains_jobs_in_flight_and_releases_the_one_too_long(
    db: Db, daemons: Daemons
) -> None:
    daemon = daemons.start({"work": WORK}, {"slots": 3, "drain_timeout": "4s"})
    short = [db.enqueue("work", {"seconds": 1.5}) for _ in range(2)]
    long = db.enqueue("work", {"seconds": 60})
    started = {job_id: db.wait_started(job_id) for job_id in [*short, long]}

    sent_at = db.now()
    daemon.send(signal.SIGTERM)
    daemon.wait_log(r"draining \(SIGTERM received\)")
    late = db.enqueue("work")  # a draining daemon claims nothing more
    assert daemon.wait_exit() == 0

    drain_deadline = sent_at + timedelta(seconds=4)
    for job_id in short:
        row = db.job(job_id)
        assert row["status"] == "completed" and row["attempts"] == 1
        assert row["finished_at"] < drain_deadline
    row = db.job(long)
    assert row["status"] == "pending"
    assert (row["attempts"], row["last_error"], row["locked_by"]) == (0, None, None)
    assert row["updated_at"] >= drain_deadline - timedelta(seconds=0.5)
    assert db.executions(long)[0]["ended_at"] is None
    assert is_gone(started[long]["pid"])
    assert db.job(late)["status"] == "pending" and db.executions(late) == []
    daemon.wait_log(rf"job {long} work attempt 1: released after .* \(attempt not counted\)")


def test_sigterm_hands_back_a_job_claimed_but_not_yet_started(db: Db, daemons: Daemons) -> None:
    daemon = daemons.start({"work": WORK}, {"warm_children": 0})
    [forkserver] = [
        pid
        for pid in children_of(daemon.pid)
        if "pgworkerd.worker.forkserver" in process_title(pid)
    ]
    os.kill(forkserver, signal.SIGSTOP)  # no child can start: a claimed job waits for one
    try:
        job_id = db.enqueue("work")
        db.wait_status(job_id, "running")
        daemon.send(signal.SIGTERM)
        assert daemon.wait_exit() == 0
    finally:
        # (the daemon kills whatever it still has when it exits: containment)
        with contextlib.suppress(ProcessLookupError):
            os.kill(forkserver, signal.SIGKILL)
    row = db.job(job_id)
    assert row["status"] == "pending"
    assert (row["attempts"], row["last_error"], row["locked_by"]) == (0, None, None)
    assert db.executions(job_id) == []


def test_sighup_adds_a_handler_while_a_job_in_flight_runs_on(db: Db, daemons: Daemons) -> None:
    config = daemons.config({"work": WORK})
    daemon = daemons.start(config)
    in_flight = db.enqueue("work", {"seconds": 8})
    before = db.wait_started(in_flight)

    daemons.config({"work": WORK, "added": WORK}, path=config)
    daemon.send(signal.SIGHUP)
    daemon.wait_log(r"reloaded .*handlers work, added")
    added = db.enqueue("added", {"result": "from the new handler"})

    row = db.wait_status(added, "completed", "dead")
    assert row["status"] == "completed" and row["result"] == "from the new handler"
    assert db.job(in_flight)["status"] == "running"
    row = db.wait_status(in_flight, "completed", "dead")
    assert row["status"] == "completed" and row["attempts"] == 1
    [after] = db.executions(in_flight)
    assert after["pid"] == before["pid"] and after["ended_at"] is not None
    assert "lease lost" not in daemon.log() and "failed" not in daemon.log()


# -- the database and other daemons ------------------------------------------------------


@pytest.fixture
def private_pg() -> Iterator[LocalPostgres]:
    """A cluster of the test's own: restarting the session's would disturb other tests."""
    with LocalPostgres() as cluster:
        cluster.create_database("restart")
        yield cluster


def test_postgres_restart_mid_job_outcome_written_once(
    private_pg: LocalPostgres, tmp_path: Path
) -> None:
    dsn, schema = private_pg.dsn("restart"), "restart_test"
    migrate(dsn, schema=schema)
    daemons = Daemons(tmp_path, dsn, schema)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            db = Db.prepare(conn, schema)
            daemon = daemons.start({"work": {**WORK, "lease": "20s"}}, {"slots": 2})
            # One job ends while the database is down (its outcome waits in memory), the
            # other runs on past the restart (its lease must be renewed again).
            ends_in_outage = db.enqueue("work", {"seconds": 3, "record_end": False})
            spans_restart = db.enqueue("work", {"seconds": 10, "record_end": False})
            first = db.wait_started(ends_in_outage)
            db.wait_started(spans_restart)
        private_pg.stop()
        daemon.wait_log("database connection lost")
        wait_for(lambda: is_gone(first["pid"]), what="the first job to end during the outage")
        private_pg.start()

        with psycopg.connect(dsn, autocommit=True) as conn:
            db = Db(conn, schema)
            for job_id in (ends_in_outage, spans_restart):
                row = db.wait_status(job_id, "completed", "dead")
                assert row["status"] == "completed" and row["attempts"] == 1
                assert len(db.executions(job_id)) == 1
                assert row["result"]["attempt"] == 1
        daemon.send(signal.SIGTERM)  # a clean exit: every log line is written by now
        assert daemon.wait_exit() == 0
        log = daemon.log()
        assert "database connection restored" in log
        for job_id in (ends_in_outage, spans_restart):
            assert len(re.findall(rf"job {job_id} work attempt 1: completed", log)) == 1
        assert "rejected" not in log and "lease not renewed" not in log
    finally:
        daemons.stop_all()


def test_two_daemons_on_one_queue_run_every_job_exactly_once(db: Db, daemons: Daemons) -> None:
    config = daemons.config({"work": WORK}, {"slots": 3, "warm_children": 2})
    daemons.start(config, tag="A")
    daemons.start(config, tag="B")
    ids = client.enqueue_many(
        db.conn,
        [client.JobSpec("work", {"seconds": 0.2 + 0.1 * (n % 3)}) for n in range(40)],
        schema=db.schema,
    )

    wait_for(
        lambda: all(db.job(i)["status"] == "completed" for i in ids),
        timeout=60,
        what="all 40 jobs to complete",
    )
    assert {db.job(i)["attempts"] for i in ids} == {1}
    executions = db.executions()
    assert Counter(e["job_id"] for e in executions) == Counter(ids)
    assert all(e["ended_at"] is not None for e in executions)
    assert {e["tag"] for e in executions} == {"A", "B"}
    for tag in ("A", "B"):  # neither daemon ran more than its 3 slots at once
        events = sorted(
            [(e["started_at"], 1) for e in executions if e["tag"] == tag]
            + [(e["ended_at"], -1) for e in executions if e["tag"] == tag]
        )
        running = peak = 0
        for _, change in events:
            running += change
            peak = max(peak, running)
        assert peak <= 3, tag


def test_progress_and_checkpoint_are_visible_while_running(db: Db, daemons: Daemons) -> None:
    daemons.start({"work": WORK})
    job_id = db.enqueue("work", {"seconds": 5, "step": 0.2, "checkpoint": True})

    row = wait_for(
        lambda: (
            (r := db.job(job_id))["status"] == "running"
            and r["progress"] is not None
            and r["checkpoint"] is not None
            and r
        ),
        what="progress and checkpoint in the running job's row",
    )
    seen = row["progress"]["step"]
    assert row["checkpoint"]["step"] >= 1
    later = wait_for(
        lambda: (r := db.job(job_id))["status"] == "running" and r["progress"]["step"] > seen and r,
        what="progress to move on",
    )
    assert later["checkpoint"]["step"] >= seen
    final = db.wait_status(job_id, "completed", "dead")
    assert final["status"] == "completed"
    assert final["progress"]["step"] >= later["progress"]["step"]


def test_job_of_a_handler_no_daemon_serves_stays_pending(db: Db, daemons: Daemons) -> None:
    daemon = daemons.start({"work": WORK})
    unserved = db.enqueue("nobody", priority=-10)  # first in line, were it claimable
    served = [db.enqueue("work") for _ in range(2)]
    for job_id in served:
        db.wait_status(job_id, "completed")

    row = db.job(unserved)
    assert row["status"] == "pending"
    assert (row["attempts"], row["locked_by"], row["started_at"]) == (0, None, None)
    assert db.executions(unserved) == []
    assert f"job {unserved} " not in daemon.log()


# -- what operators see --------------------------------------------------------------------


def _worker_row(db: Db, daemon: DaemonProcess) -> dict:
    rows = db.rows("SELECT * FROM {schema}.workers WHERE id = %s", (daemon.worker_id,))
    return rows[0] if rows else {}


def test_process_titles_and_registry_row(db: Db, daemons: Daemons) -> None:
    daemon = daemons.start({"work": WORK}, {"drain_timeout": "1s"})
    registered = wait_for(lambda: _worker_row(db, daemon), what="the registry row")
    assert registered["pid"] == daemon.pid and registered["handlers"] == ["work"]
    assert registered["state"] == "running" and registered["stopped_at"] is None

    job_id = db.enqueue("work", {"seconds": 60})
    execution = db.wait_started(job_id)
    title = re.compile(rf"pgworkerd: job {job_id} work attempt 1 (\d+)s")
    wait_for(
        lambda: (m := title.fullmatch(process_title(execution["pid"]))) and int(m[1]) >= 1,
        what="the child's title to show the job and its running time",
    )
    wait_for(
        lambda: process_title(daemon.pid) == f"pgworkerd: running: 1/2 busy [{daemon.worker_id}]",
        what="the parent's title to show its slots",
    )
    wait_for(
        lambda: "pgworkerd: idle child" in map(process_title, children_of(daemon.pid)),
        what="a warm idle child",
    )
    wait_for(
        lambda: _worker_row(db, daemon)["in_flight"] == [job_id],
        what="the registry to list the job in flight",
    )

    daemon.send(signal.SIGTERM)
    assert daemon.wait_exit() == 0
    gone = _worker_row(db, daemon)
    assert gone["state"] == "gone" and gone["stopped_at"] is not None
    assert gone["in_flight"] == []
    assert db.job(job_id)["status"] == "pending"


def test_a_fork_server_whose_daemon_died_during_its_start_exits_quietly() -> None:
    """A daemon killed while its fork server imports the handlers: the fork server finds
    nobody to report to and must leave without a traceback in the daemon's log."""
    parent_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    config = json.dumps({"modules": [], "settings": {}, "daemon_pid": os.getpid()})
    server = subprocess.Popen(
        [sys.executable, "-m", "pgworkerd.worker.forkserver", str(server_end.fileno()), config],
        pass_fds=[server_end.fileno()],
        stderr=subprocess.PIPE,
        text=True,
    )
    server_end.close()
    parent_end.close()  # the daemon is gone before the fork server is ready
    _, err = server.communicate(timeout=DEADLINE)
    assert server.returncode == 0, err
    assert "Traceback" not in err, err


def test_a_child_whose_daemon_is_gone_stops_without_a_traceback() -> None:
    """A child that finds its daemon's end of the socket closed when it reports (here its
    first message; in the chaos soak, an outcome) stops quietly like one whose monitor saw
    the daemon go: a traceback in the daemon's log would read as a crash."""
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    parent_watch, watch_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    parent_end.close()  # the daemon is gone
    parent_watch.close()
    code = (
        "import sys; from pgworkerd.worker import child;"
        " child.main(int(sys.argv[1]), int(sys.argv[2]), {}, int(sys.argv[3]))"
    )
    ends = [child_end.fileno(), watch_end.fileno()]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(ends[0]), str(os.getpid()), str(ends[1])],
        pass_fds=ends,
        stderr=subprocess.PIPE,
        text=True,
    )
    child_end.close()
    watch_end.close()
    _, err = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "the daemon is gone; stopping" in err, err


def test_scheduled_jobs_start_when_due_not_at_the_next_poll(db: Db, daemons: Daemons) -> None:
    """The daemon wakes for the earliest scheduled job it serves, and a sooner one
    enqueued later moves that wake-up forward; the 60 s poll would be far too late."""
    daemon = daemons.start({"work": WORK}, {"poll_interval": "60s"})
    db.wait_status(db.enqueue("work", {"seconds": 0.1}), "completed")  # warmed up
    later = db.enqueue("work", {"seconds": 0.1}, delay=6)
    sooner = db.enqueue("work", {"seconds": 0.1}, delay=2)
    for job_id in (sooner, later):
        row = db.wait_status(job_id, "completed", timeout=30)
        late = seconds_between(row["run_at"], row["started_at"])
        assert 0 <= late < 10, f"job {job_id} started {late:.1f} s after its run_at"
    assert db.job(sooner)["started_at"] < db.job(later)["started_at"]
    daemon.wait_log(rf"job {later} work attempt 1: completed")


def test_a_lost_listen_connection_comes_back(
    db: Db, daemons: Daemons, conn: psycopg.Connection, schema: str
) -> None:
    """Only the LISTEN backend dies: the daemon listens again, so wake-ups stay prompt
    even with a long poll interval."""
    daemon = daemons.start({"work": WORK}, {"poll_interval": "60s"})
    first = db.enqueue("work", {"seconds": 0.1})
    db.wait_status(first, "completed")
    # the LISTEN connection's last statement: LISTEN on its own channel (schema 40)
    listen = "%worker_wake_listen%"
    killed = conn.execute(
        "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE %s",
        [listen],
    ).fetchall()
    assert killed, "no LISTEN backend found"
    daemon.wait_log("LISTEN connection lost")

    def listening_again() -> bool:
        # (a backend other than the one killed: that one may still be listed while it
        # exits, after the daemon saw its socket close)
        rows = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s AND pid <> ALL(%s)",
            [listen, [pid for pid, _ in killed]],
        ).fetchone()
        return bool(rows and rows[0] >= 1)

    wait_for(listening_again, what="a new LISTEN connection")
    job_id = db.enqueue("work", {"seconds": 0.1})
    enqueued = time.monotonic()
    db.wait_status(job_id, "completed", timeout=20)
    assert time.monotonic() - enqueued < 15  # a NOTIFY woke it, not the 60 s poll


def test_a_job_enqueued_while_not_listening_starts_once_listening_again(
    db: Db, daemons: Daemons, conn: psycopg.Connection
) -> None:
    """Its wake-up went to a channel nobody listened on: the daemon claims once when its
    LISTEN connection is back, rather than at the next poll (60 s here)."""
    daemon = daemons.start({"work": WORK}, {"poll_interval": "60s"})
    first = db.enqueue("work", {"seconds": 0.1})
    db.wait_status(first, "completed")
    killed = conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE %s",
        ["%worker_wake_listen%"],
    ).fetchall()
    assert killed, "no LISTEN backend found"
    daemon.wait_log("LISTEN connection lost")
    job_id = db.enqueue("work", {"seconds": 0.1})  # before the daemon listens again
    enqueued = time.monotonic()
    db.wait_status(job_id, "completed", timeout=40)
    assert time.monotonic() - enqueued < 40  # not the 60 s poll


# -- start-up and secrets (issue 9) -----------------------------------------------------------

SECRET_PW = "SECRETpw-Zq9"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env_without_libpq(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.pop("NOTIFY_SOCKET", None)
    return {**env, **extra}


def _start(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("pgworkerd")), *args],
        env=env,
        cwd=log.parent,
        stdin=subprocess.DEVNULL,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill what is left of the process group (the daemon, or whatever it started)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def test_run_without_a_dsn_uses_libpq_defaults_and_never_the_demo(tmp_path: Path) -> None:
    """`dsn = ""` with only PGUSER and PGPASSWORD set (no PGHOST...): libpq's defaults,
    as config.example.toml documents; this used to start the demo's throwaway cluster."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[database]\ndsn = ""\n[handlers.echo]\ntarget = "pgworkerd.examples:echo"\n')
    cfg.chmod(0o666)
    log = tmp_path / "daemon.log"
    proc = _start(
        ["--config", str(cfg), "run"], log, _env_without_libpq(PGUSER="x", PGPASSWORD="y-Pw")
    )
    try:
        line = wait_for(
            lambda: re.search(r".*(database unreachable|demo).*", log.read_text()),
            what="the daemon to try the database",
        )[0]
        assert "database unreachable" in line and "(libpq default host):5432" in line, line
        assert proc.poll() is None  # it keeps retrying, in the process
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE) == 0
    finally:
        _stop(proc)
    text = log.read_text()
    assert "demo" not in text and "y-Pw" not in text
    assert f"WARNING {cfg} is writable by others" in text  # file_warnings reach the log


def test_a_dsn_password_is_masked_in_the_process_title_at_once(tmp_path: Path) -> None:
    """The title is polled from the moment the process exists. argv is the kernel's copy
    of what the caller passed, so it is visible until Python masks it (tens of ms, see
    the README); after that, never again, even while the database is unreachable (it
    used to stay for as long as the daemon retried)."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[handlers.echo]\ntarget = "pgworkerd.examples:echo"\n')
    dsn = f"postgresql://u:{SECRET_PW}@127.0.0.1:{_closed_port()}/x"
    log = tmp_path / "daemon.log"
    started = time.monotonic()
    proc = _start(["--dsn", dsn, "--config", str(cfg), "run"], log)
    seen_at: list[float] = []
    titles: set[str] = set()
    try:
        retrying = False
        while time.monotonic() - started < 4 or not retrying:
            title = process_title(proc.pid)
            titles.add(title)
            if SECRET_PW in title:
                seen_at.append(time.monotonic() - started)
            retrying = retrying or "database unreachable" in log.read_text()
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() - started < DEADLINE, log.read_text()
        wait_for(
            lambda: process_title(proc.pid).startswith("pgworkerd: database unreachable"),
            what="the daemon's own title while it retries",
        )
    finally:
        _stop(proc)
    window = max(seen_at, default=0.0)
    print(f"password visible for {window * 1000:.0f} ms after start; titles: {titles}")
    assert window < 1.0, f"password in the title {window:.2f} s after start: {titles}"
    assert any("u:***@" in t or t.startswith("pgworkerd: ") for t in titles), titles
    assert SECRET_PW not in log.read_text()


def test_job_children_never_see_the_daemons_credentials(
    db: Db, daemons: Daemons, monkeypatch: pytest.MonkeyPatch, pg: LocalPostgres
) -> None:
    # The cluster's real password: libpq prefers PGPASSWORD to the DSN's passfile.
    monkeypatch.setenv("PGPASSWORD", pg.password)
    monkeypatch.setenv("PGWORKERD_DSN", f"postgresql://u:dsn-S3cret@127.0.0.1:{_closed_port()}/x")
    monkeypatch.setenv("PGSERVICEFILE", "/etc/pgworkerd/pg_service.conf")
    monkeypatch.setenv("PGSSLKEY", "/etc/pgworkerd/client.key")
    monkeypatch.setenv("MYAPP_SETTING", "kept")
    daemon = daemons.start({"envdump": {"target": "jobhandlers:envdump"}})
    job = db.enqueue("envdump")
    env = db.wait_status(job, "completed")["result"]
    assert not [k for k in env if k.startswith("PG")], sorted(env)
    assert "S3cret" not in json.dumps(env) and pg.password not in json.dumps(env)
    assert env["MYAPP_SETTING"] == "kept" and "JOBHANDLERS_DSN" in env
    # The fork server's own environment too (children fork from it).
    for pid in children_of(daemon.pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            continue
        assert b"S3cret" not in environ and b"PGPASSWORD" not in environ, process_title(pid)
        assert pg.password.encode() not in environ


def test_the_fork_server_does_not_import_from_the_working_directory(
    db: Db, daemons: Daemons, tmp_path: Path
) -> None:
    """A json.py in the daemon's cwd (the fork server imports json) used to run in it."""
    marker = tmp_path / "IMPORTED-FROM-CWD"
    (tmp_path / "json.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\nraise SystemExit('json.py ran')\n"
    )
    daemon = DaemonProcess(
        daemons.dsn, daemons.schema, daemons.config({"work": WORK}), tmp_path / "d.log", "A"
    )
    daemons.started.append(daemon)
    assert daemon.log_path.parent == tmp_path  # the harness runs daemons in tmp_path
    daemon.start(wait_ready=False)
    wait_for(
        lambda: marker.exists() or "running as" in daemon.log() or daemon.proc.poll() is not None,
        what="the daemon to start",
    )
    assert not marker.exists(), daemon.log()
    # Handler modules still come from PYTHONPATH (tests/support/jobhandlers.py).
    db.wait_status(db.enqueue("work", {"seconds": 0.1}), "completed")
    assert not marker.exists()


def test_a_job_larger_than_a_sockets_buffer_reaches_a_child_that_reads_late(
    db: Db, daemons: Daemons
) -> None:
    """A payload of several MiB (up to the 64 MiB frame limit is allowed) does not fit a
    socket's buffer: the daemon writes the rest as the child reads it, without waiting
    for it. Here the idle child is stopped (SIGSTOP) while its job is handed over, as a
    child is that the scheduler leaves waiting on a loaded machine. (An 8 MiB job
    claimed by a one-slot daemon never started in two runs beside the suite, on the
    code before the daemon kept what a socket did not take; this test passes on that
    code as well, so it guards the hand-off rather than reproducing that failure.)"""
    daemon = daemons.start(
        {"work": WORK, "echo": {"target": "asynchandlers:echo", "concurrency": 2}},
        {"slots": 1, "warm_children": 1},
    )
    wait_for(
        lambda: [p for p in children_of(daemon.pid) if "idle child" in process_title(p)],
        what="the warm child",
    )
    [child] = [p for p in children_of(daemon.pid) if "idle child" in process_title(p)]
    pad = "x" * (8 * 1024 * 1024)
    os.kill(child, signal.SIGSTOP)
    try:
        big = db.enqueue("work", {"pad": pad, "result": "big"})
        wait_for(lambda: db.job(big)["status"] == "running", what="the big job claimed")
        time.sleep(0.5)  # the hand-off has begun (the loop goes on meanwhile)
    finally:
        os.kill(child, signal.SIGCONT)
    row = db.wait_status(big, "completed", "dead", timeout=60)
    assert row["status"] == "completed" and row["result"] == "big", row["last_error"]
    small = db.enqueue("work", {"result": "small"})
    assert db.wait_status(small, "completed", "dead")["result"] == "small"
    big_async = db.enqueue("echo", {"pad": pad})  # (to a concurrent session's child)
    row = db.wait_status(big_async, "completed", "dead", timeout=60)
    assert row["status"] == "completed", row["last_error"]
    assert row["result"]["payload"] == {"pad": pad}
