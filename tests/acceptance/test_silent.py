"""Silent daemons with real daemons and real signals: a daemon killed with SIGKILL, or
frozen with SIGSTOP, while it runs a job is flagged by `explain`, `status`, `show` (and
their JSON) and the metric within 2 x its busy heartbeat interval (+1 s), while the job
stays `running` and is handed to nobody before its lease ends; a live daemon busy on a
loaded machine is never flagged.

Leases are 30 s or 60 s here (renewed every second), so the flag (about 10 s) comes long
before the lease could free the job."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from daemon_harness import DEADLINE, Daemons, Db, is_gone, wait_for

from pgworkerd.daemon.presence import HEARTBEAT_BUSY
from pgworkerd.queue import explain, views

WORK = {"work": {"target": "jobhandlers:work"}}
LEASE = {"lease": "30s", "renew_interval": "1s"}
DEFAULT_LEASE = {"lease": "60s", "renew_interval": "1s"}
# The goal: flagged within 2 x the busy heartbeat interval + 1 s of the kill. The flag is
# the database's own comparison (now() against the last heartbeat, which came before
# the kill), so only reading it takes longer: see seconds_until_flagged.
GOAL = 2 * HEARTBEAT_BUSY + 1


def silent_reason(db: Db, job_id: int) -> dict[str, Any] | None:
    found = explain.explain(db.conn, db.schema, job_id)
    assert found is not None
    return next((r for r in found["reasons"] if r["code"] == "daemon_silent"), None)


def seconds_until_flagged(db: Db, job_id: int, since: float) -> tuple[float, float]:
    """Seconds from `since` until a look saw the flag, and until the last look that did
    not see it began. The flag came between the two. Only the second bounds when: a look
    that began past the goal and saw no flag is a miss however slow the machine, while a
    look slowed by load that saw the flag says nothing of when it came."""
    last_miss = 0.0

    def look() -> dict[str, Any] | None:
        nonlocal last_miss
        began = time.monotonic()
        found = silent_reason(db, job_id)
        if found is None:
            last_miss = began - since
        return found

    wait_for(look, timeout=GOAL + 30, what="the daemon_silent flag")
    return time.monotonic() - since, last_miss


def start_busy(
    daemons: Daemons, db: Db, tag: str, step: float = 0.1, lease: dict[str, str] = LEASE
) -> tuple[Any, int]:
    daemon = daemons.start(WORK, lease, tag=tag)
    job = db.enqueue("work", {"seconds": 600, "step": step})
    db.wait_started(job)
    assert db.job(job)["locked_by"] == daemon.worker_id
    # its heartbeat with the job in flight has gone (within a second of the claim)
    wait_for(
        lambda: db.rows(
            "SELECT 1 FROM {schema}.workers WHERE id = %s AND in_flight = %s::bigint[]"
            " AND heartbeat_interval = make_interval(secs => %s)",
            (daemon.worker_id, [job], HEARTBEAT_BUSY),
        ),
        what="the busy heartbeat",
    )
    return daemon, job


def test_a_killed_daemons_job_is_flagged_within_the_bound_and_left_to_its_lease(
    db: Db, daemons: Daemons
) -> None:
    # The default lease: the CLI calls below take seconds each on a loaded machine, and
    # all of them must see the job still held by the killed daemon.
    a, job = start_busy(daemons, db, "A", lease=DEFAULT_LEASE)
    port = _free_port()
    # B serves the same handler: it must not take the job before the lease ends
    b_config = daemons.config(WORK, DEFAULT_LEASE)
    b_config.write_text(
        b_config.read_text() + f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n'
        'queue_depth_interval = "1s"\n'
    )
    b = daemons.start(b_config, tag="B")
    assert silent_reason(db, job) is None
    held = db.job(job)

    killed_at = time.monotonic()
    a.send(signal.SIGKILL)
    a.wait_exit()
    took, missed = seconds_until_flagged(db, job, killed_at)
    print(f"kill -9 -> daemon_silent seen at {took:.2f} s, not seen at {missed:.2f} s")
    assert missed <= GOAL, (missed, took)

    row = db.job(job)
    assert row["status"] == "running" and row["locked_by"] == a.worker_id
    assert row["lease_token"] == held["lease_token"]
    facts = silent_reason(db, job)["facts"]  # type: ignore[index]
    assert facts["worker"] == a.worker_id and facts["pid"] == a.pid
    assert facts["heartbeat_interval_seconds"] == HEARTBEAT_BUSY
    assert facts["heartbeat_age_seconds"] > 2 * HEARTBEAT_BUSY
    assert facts["lease_left_seconds"] > 0

    # the CLI, as an operator types it
    out = daemons.cli("explain", str(job))
    assert out.returncode == 0, out.stderr
    assert "[daemon_silent]" in out.stdout and a.worker_id in out.stdout
    assert "not taken from it early" in out.stdout
    as_json = json.loads(daemons.cli("explain", str(job), "--json").stdout)
    [flag] = [r for r in as_json["reasons"] if r["code"] == "daemon_silent"]
    assert flag["facts"]["worker"] == a.worker_id and flag["facts"]["locked_until"]

    status = daemons.cli("status")
    assert status.returncode == 1  # something needs a look
    assert f"WARNING: daemon {a.worker_id} on" in status.stderr and "SILENT" in status.stderr
    [line] = [ln for ln in status.stdout.splitlines() if ln.strip().startswith(str(job))]
    assert "DAEMON SILENT" in line
    [daemon_line] = [ln for ln in status.stdout.splitlines() if ln.startswith(f"  {a.worker_id}")]
    assert "SILENT" in daemon_line
    snap = json.loads(daemons.cli("status", "--json").stdout)
    [running] = snap["running_jobs"]
    assert running["daemon_silent"] is True and running["locked_until"]
    silent = {d["id"]: d["silent"] for d in snap["daemons"]}
    assert silent == {a.worker_id: True, b.worker_id: False}

    show = daemons.cli("show", str(job))
    assert show.returncode == 0 and "SILENT" in show.stdout
    assert f"daemon: {a.worker_id}" in show.stdout and "not taken from it early" in show.stdout
    shown = json.loads(daemons.cli("show", str(job), "--json").stdout)
    assert shown["daemon"]["silent"] is True and shown["status"] == "running"

    # the metric, from the live daemon B (a fleet-wide count)
    def scraped() -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return "pgworkerd_silent_daemon_jobs 1.0" in text and "pgworkerd_silent_daemons 1.0" in text

    wait_for(scraped, what="the silent-daemon gauges")

    # not handed out before its lease ends; then B rescues it
    lease_end = db.job(job)["locked_until"]
    rescued = wait_for(
        lambda: (r := db.job(job))["locked_by"] == b.worker_id and r,
        timeout=90 + DEADLINE,
        what="B to take the job after the lease",
    )
    assert rescued["started_at"] >= lease_end
    assert silent_reason(db, job) is None  # B is alive
    db.wait_started(job, 2)
    assert [e["attempt"] for e in db.executions(job)] == [1, 2]


def test_a_frozen_daemon_is_flagged_and_unflagged_when_it_thaws(db: Db, daemons: Daemons) -> None:
    # A heartbeat a second: a child that sends more than its socket buffer holds while
    # its parent is frozen dies of the send's timeout (child.py: the monitor's 0.2 s
    # socket timeout applies to sendall as well), which is not what this test is about.
    a, job = start_busy(daemons, db, "A", step=1.0)
    held = db.job(job)
    stopped_at = time.monotonic()
    a.send(signal.SIGSTOP)
    try:
        took, missed = seconds_until_flagged(db, job, stopped_at)
        print(f"SIGSTOP -> daemon_silent seen at {took:.2f} s, not seen at {missed:.2f} s")
        assert missed <= GOAL, (missed, took)
        status = json.loads(daemons.cli("status", "--json").stdout)
        assert [j["daemon_silent"] for j in status["running_jobs"]] == [True]
        row = db.job(job)
        assert row["status"] == "running" and row["lease_token"] == held["lease_token"]
    finally:
        a.send(signal.SIGCONT)
    # thawed before its lease ran out: it heartbeats again, and the job is still its own
    wait_for(lambda: silent_reason(db, job) is None, what="the flag to clear")
    row = db.job(job)
    assert row["status"] == "running" and row["lease_token"] == held["lease_token"]
    assert len(db.executions(job)) == 1


@pytest.mark.slow
def test_a_live_busy_daemon_on_a_loaded_machine_is_never_flagged(db: Db, daemons: Daemons) -> None:
    daemon = daemons.start(WORK, {**LEASE, "slots": 2}, tag="A")
    jobs = [db.enqueue("work", {"seconds": 600}) for _ in range(2)]
    for job in jobs:
        db.wait_started(job)
    # load on top of whatever else this machine runs: a CPU burner per core
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    ages: list[float] = []
    try:
        watch_until = time.monotonic() + 6 * HEARTBEAT_BUSY  # several busy heartbeats
        while time.monotonic() < watch_until:
            running = views.running_jobs(db.conn, db.schema)
            assert {j["id"] for j in running} == set(jobs)
            flagged = [j["id"] for j in running if j["daemon_silent"]]
            [row] = [d for d in views.daemons(db.conn, db.schema) if d["id"] == daemon.worker_id]
            ages.append(row["heartbeat_age_seconds"])
            assert not flagged and not row["silent"], f"flagged while alive: ages {ages}"
            time.sleep(0.2)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait(10)
    print(f"busy heartbeat ages under load: max {max(ages):.2f} s over {len(ages)} samples")
    assert max(ages) < 2 * HEARTBEAT_BUSY
    assert all(silent_reason(db, job) is None for job in jobs)
    daemon.send(signal.SIGTERM)
    daemon.wait_exit()
    wait_for(lambda: is_gone(daemon.pid), what="the daemon to exit")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
