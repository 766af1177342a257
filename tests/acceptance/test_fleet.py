"""Acceptance tests of `pgworkerd drain`, `resume` and `status` against two real daemons
(both on this host, each with its own `[worker] name`), through the `workers` registry.

Every wait is on a condition (registry rows, job rows, executions, process exits); daemons
notice a drain or resume at their next heartbeat, within about a second.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from typing import Any

import pytest
from daemon_harness import (
    DEADLINE,
    PGWORKERD,
    DaemonProcess,
    Daemons,
    Db,
    is_gone,
    wait_for,
    write_config,
)

from pgworkerd import client

WORK = {"target": "jobhandlers:work"}
# Only the daemon named alpha serves "solo": its jobs show whether alpha claims.
ALPHA_HANDLERS = {"work": WORK, "solo": WORK}
BETA_HANDLERS = {"work": WORK}
STATUS_KEYS = {
    "daemons",
    "running_jobs",
    "counts",
    "other_queues",
    "oldest_pending_seconds",
    "unserved",
    "paused",  # queues and handlers paused fleet-wide (migration 0009)
}
DAEMON_KEYS = {
    "id",
    "host",
    "pid",
    "state",
    "slots",
    "busy",
    "uptime_seconds",
    "heartbeat_age_seconds",
}


def start_named(
    daemons: Daemons, name: str, handlers: dict[str, dict[str, Any]], *, tag: str
) -> DaemonProcess:
    """A daemon whose worker id starts with `name` (ids are name:pid:random)."""
    config = write_config(daemons.tmp_path / f"{name}.toml", handlers, name=name)
    daemon = daemons.start(config, tag=tag)
    assert daemon.worker_id.startswith(f"{name}:{daemon.pid}:"), daemon.worker_id
    return daemon


def worker_row(db: Db, daemon: DaemonProcess) -> dict[str, Any]:
    rows = db.rows("SELECT * FROM {schema}.workers WHERE id = %s", (daemon.worker_id,))
    return rows[0] if rows else {}


def wait_state(
    db: Db, daemon: DaemonProcess, state: str, timeout: float = DEADLINE, **expect: Any
) -> dict[str, Any]:
    return wait_for(
        lambda: (
            (row := worker_row(db, daemon)).get("state") == state
            and all(row[k] == v for k, v in expect.items())
            and row
        ),
        what=f"daemon {daemon.tag} to be {state} {expect or ''} in the registry",
        timeout=timeout,
    )


def tags(db: Db, job_id: int) -> list[str]:
    return [e["tag"] for e in db.executions(job_id)]


def cli_popen(daemons: Daemons, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(PGWORKERD), "--dsn", daemons.dsn, "--schema", daemons.schema, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def status_json(daemons: Daemons) -> tuple[int, dict[str, Any]]:
    proc = daemons.cli("status", "--json")
    assert proc.stderr == "", proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def by_id(snapshot: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["id"]: d for d in snapshot["daemons"]}


# -- drain one daemon, the other works on; resume ----------------------------------------


def test_drain_one_daemon_while_the_other_works_on_then_resume(db: Db, daemons: Daemons) -> None:
    a = start_named(daemons, "alpha", ALPHA_HANDLERS, tag="A")
    long_job = db.enqueue("solo", {"seconds": 15})
    db.wait_started(long_job)
    b = start_named(daemons, "beta", BETA_HANDLERS, tag="B")
    wait_state(db, b, "running")

    drain = cli_popen(daemons, "drain", "--worker", a.worker_id, "--wait")
    try:
        # Alpha noticed (its next heartbeat) and lets its job finish.
        draining = wait_state(db, a, "draining", drain_requested=True)
        assert draining["in_flight"] == [long_job]
        assert not worker_row(db, b)["drain_requested"]

        # status while a drain is in place: loud, and exit 1 (human and JSON alike).
        human = daemons.cli("status")
        assert human.returncode == 1, human.stdout + human.stderr
        assert "daemons (2 live):" in human.stdout
        assert a.worker_id in human.stdout and b.worker_id in human.stdout
        assert f"WARNING: daemon {a.worker_id} on {socket.gethostname()} is DRAINED" in (
            human.stderr
        )
        assert f"resume --worker {a.worker_id}" in human.stderr
        assert b.worker_id not in human.stderr
        code, snap = status_json(daemons)
        assert code == 1
        assert set(snap) == STATUS_KEYS
        daemons_seen = by_id(snap)
        assert set(daemons_seen) == {a.worker_id, b.worker_id}
        for d in daemons_seen.values():
            assert set(d) >= DAEMON_KEYS, set(d)
            assert d["host"] == socket.gethostname() and d["slots"] == 2
            assert d["uptime_seconds"] >= 0 and 0 <= d["heartbeat_age_seconds"] < 10
        assert daemons_seen[a.worker_id]["pid"] == a.pid
        assert daemons_seen[b.worker_id]["pid"] == b.pid
        assert daemons_seen[a.worker_id]["state"] in ("draining", "drained")
        assert daemons_seen[a.worker_id]["drain_requested"] is True
        assert daemons_seen[b.worker_id]["state"] == "running"
        assert daemons_seen[b.worker_id]["busy"] == 0
        [running] = snap["running_jobs"]
        assert running["id"] == long_job and running["locked_by"] == a.worker_id
        assert snap["counts"] == {"default": {"running": 1}}
        assert snap["unserved"] == []

        # Jobs enqueued during the drain: all run by beta. Alpha's own handler waits.
        during = [db.enqueue("work", {"seconds": 0.2}) for _ in range(6)]
        solo = db.enqueue("solo")
        for job_id in during:
            assert db.wait_status(job_id, "completed", "dead")["status"] == "completed"
            assert tags(db, job_id) == ["B"], job_id

        out, err = drain.communicate(timeout=DEADLINE)
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.communicate()
    assert drain.returncode == 0, out + err
    assert f"drain requested for 1 daemon(s): {a.worker_id}" in out
    assert f"waiting for 1 daemon(s), 1 job(s) running: {long_job}" in out
    assert f"drained: no jobs running on daemon {a.worker_id}" in out
    assert db.job(long_job)["status"] == "completed" and tags(db, long_job) == ["A"]

    # Drained: alpha stays up, heartbeating, and takes nothing.
    drained = wait_state(db, a, "drained", in_flight=[])
    wait_for(
        lambda: worker_row(db, a)["heartbeat_at"] > drained["heartbeat_at"],
        what="the drained daemon to keep heartbeating",
    )
    assert a.proc is not None and a.proc.poll() is None
    assert db.job(solo)["status"] == "pending" and db.executions(solo) == []
    assert db.job(solo)["status"] == "pending"

    resumed = daemons.cli("resume", "--worker", a.worker_id)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == f"resumed 1 daemon(s): {a.worker_id}"
    assert db.wait_status(solo, "completed", "dead")["status"] == "completed"
    assert tags(db, solo) == ["A"]
    wait_state(db, a, "running", drain_requested=False)
    a.wait_log(r"drain lifted through the database")

    ok = daemons.cli("status")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "DRAINED" not in ok.stdout + ok.stderr
    code, snap = status_json(daemons)
    assert code == 0 and {d["state"] for d in snap["daemons"]} == {"running"}


# -- --wait --timeout; this host's daemons; a restart comes back undrained ---------------


def test_drain_wait_timeout_lists_the_running_job_and_a_restart_starts_undrained(
    db: Db, daemons: Daemons
) -> None:
    a = start_named(daemons, "alpha", ALPHA_HANDLERS, tag="A")
    long_job = db.enqueue("solo", {"seconds": 120})
    db.wait_started(long_job)
    b = start_named(daemons, "beta", BETA_HANDLERS, tag="B")

    # No --worker/--all: this host's daemons, which are both.
    proc = daemons.cli("drain", "--wait", "--timeout", "1s")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "drain requested for 2 daemon(s)" in proc.stdout
    assert a.worker_id in proc.stdout and b.worker_id in proc.stdout
    assert f"timed out; still running: {long_job} " in proc.stderr
    assert "pgworkerd resume" in proc.stderr
    wait_state(db, a, "draining", drain_requested=True)
    wait_state(db, b, "drained", drain_requested=True)
    human = daemons.cli("status")
    assert human.returncode == 1
    assert human.stderr.count("is DRAINED") == 2, human.stderr
    assert db.job(long_job)["status"] == "running"  # the drain stopped nothing

    # A drained daemon stopped and started again comes back undrained and claims.
    b.send(signal.SIGTERM)
    assert b.wait_exit() == 0
    wait_state(db, b, "gone")
    b2 = start_named(daemons, "beta", BETA_HANDLERS, tag="B2")
    assert b2.worker_id != b.worker_id
    row = wait_state(db, b2, "running")
    assert row["drain_requested"] is False
    job_id = db.enqueue("work")
    assert db.wait_status(job_id, "completed", "dead")["status"] == "completed"
    assert tags(db, job_id) == ["B2"]
    human = daemons.cli("status")
    assert human.stderr.count("is DRAINED") == 1 and a.worker_id in human.stderr
    assert "daemons (2 live):" in human.stdout
    assert b.worker_id in human.stdout  # gone within the hour: still listed, as gone

    # resume (this host) lifts the drain that is left: alpha claims again.
    resumed = daemons.cli("resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed 2 daemon(s)" in resumed.stdout and b.worker_id not in resumed.stdout
    wait_state(db, a, "running", drain_requested=False)
    solo = db.enqueue("solo")
    db.wait_started(solo)
    assert tags(db, solo) == ["A"]

    unknown = daemons.cli("drain", "--worker", b.worker_id)  # gone: matches nothing
    assert unknown.returncode == 1
    assert f"no live daemon matches (daemon {b.worker_id})" in unknown.stderr
    both = daemons.cli("drain", "--all", "--worker", a.worker_id)
    assert both.returncode == 2 and "not both" in both.stderr
    # --timeout without --wait would silently not wait: a usage error, and no drain.
    no_wait = daemons.cli("drain", "--worker", a.worker_id, "--timeout", "1s")
    assert no_wait.returncode == 2 and "--timeout only applies with --wait" in no_wait.stderr
    assert worker_row(db, a)["drain_requested"] is False


# -- a daemon killed with -9 is marked gone by the other ---------------------------------


def test_a_killed_daemon_is_marked_gone_by_the_other(db: Db, daemons: Daemons) -> None:
    a = start_named(daemons, "alpha", ALPHA_HANDLERS, tag="A")
    b = start_named(daemons, "beta", BETA_HANDLERS, tag="B")
    wait_state(db, a, "running")
    wait_state(db, b, "running")
    a.send(signal.SIGKILL)
    a.wait_exit()
    wait_for(lambda: is_gone(a.pid), what="alpha to be dead")
    # Alive as far as the registry knows until it has been silent for stale_after,
    # max(60 s, 6 x renew_interval): not within a few heartbeats of beta.
    beats = worker_row(db, b)["heartbeat_at"]
    wait_for(lambda: worker_row(db, b)["heartbeat_at"] > beats, what="a heartbeat of beta")
    assert worker_row(db, a)["state"] == "running"
    # Waiting those 60 s would make this test slow: age alpha's last heartbeat instead.
    db.rows(
        "UPDATE {schema}.workers SET heartbeat_at = now() - interval '61 seconds' WHERE id = %s",
        (a.worker_id,),
    )
    # The fleet looks for silent peers about every stale_after / 4 in all: beta, with two
    # peers in its list (alpha counts until it is marked), every 15 to 45 s.
    gone = wait_state(db, a, "gone", timeout=90)
    assert gone["stopped_at"] is not None
    b.wait_log(
        rf"daemon {a.worker_id} \(host {socket.gethostname()} pid {a.pid}\) stopped "
        "heartbeating: marked gone"
    )
    assert worker_row(db, b)["state"] == "running"

    code, snap = status_json(daemons)
    assert by_id(snap)[a.worker_id]["state"] == "gone"
    # The solo handler was alpha's alone: its jobs are now reported unserved.
    solo = db.enqueue("solo")
    human = daemons.cli("status")
    assert human.returncode == 1
    assert "daemons (1 live):" in human.stdout
    assert "pending job(s) of handler 'solo' on queue 'default' have no live daemon" in (
        human.stderr
    )
    code, snap = status_json(daemons)
    assert code == 1
    assert [(u["handler"], u["jobs"]) for u in snap["unserved"]] == [("solo", 1)]
    assert db.job(solo)["status"] == "pending"
    # drain/resume ignore gone daemons.
    proc = daemons.cli("resume", "--worker", a.worker_id)
    assert proc.returncode == 1 and "no live daemon matches" in proc.stderr


def test_drain_wait_does_not_wait_forever_for_a_killed_daemon(db: Db, daemons: Daemons) -> None:
    """The only daemon is killed -9 with a job in hand: nobody else is left to mark it gone,
    so `drain --wait` (no --timeout, as an operator types it) must do so itself once the
    daemon has been silent for 60 s, and report that nothing runs any more."""
    a = start_named(daemons, "alpha", ALPHA_HANDLERS, tag="A")
    job_id = db.enqueue("work", {"seconds": 600})
    db.wait_started(job_id)
    a.send(signal.SIGKILL)
    a.wait_exit()
    waiting = cli_popen(daemons, "drain", "--wait")
    try:
        # It must wait while the heartbeat is recent: the daemon might only be slow.
        wait_for(lambda: worker_row(db, a).get("drain_requested"), what="the drain request")
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=3)
        # Waiting the real 60 s would make the test slow: age the last heartbeat instead.
        db.rows(
            "UPDATE {schema}.workers SET heartbeat_at = now() - interval '61 seconds'"
            " WHERE id = %s",
            (a.worker_id,),
        )
        out, err = waiting.communicate(timeout=DEADLINE)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, out + err
    assert f"daemon {a.worker_id} (host {socket.gethostname()} pid {a.pid}) has been silent" in out
    assert "drained: no jobs running" in out
    assert worker_row(db, a)["state"] == "gone"
    assert db.job(job_id)["status"] == "running"  # until its lease expires, then rescued


def test_a_drain_survives_being_marked_gone_and_re_registering(db: Db, daemons: Daemons) -> None:
    a = start_named(daemons, "alpha", ALPHA_HANDLERS, tag="A")
    drained = daemons.cli("drain", "--worker", a.worker_id, "--wait")
    assert drained.returncode == 0, drained.stderr
    # What worker_mark_stale (run by any other daemon) does after a long heartbeat gap.
    db.rows(
        "UPDATE {schema}.workers SET state = 'gone', stopped_at = now() WHERE id = %s",
        (a.worker_id,),
    )
    back = wait_for(
        lambda: (row := worker_row(db, a))["state"] != "gone" and row,
        what="alpha to re-register",
    )
    wait_for(
        lambda: worker_row(db, a)["heartbeat_at"] > back["heartbeat_at"],
        what="a heartbeat after re-registering",
    )
    assert worker_row(db, a)["drain_requested"] is True
    assert "drain lifted" not in a.log()


def test_status_stays_short_whatever_queues_enqueuers_make_up(db: Db, daemons: Daemons) -> None:
    """5,000 queues of one job each (any enqueuer can make them up): status names the
    busiest 20 and sums the rest; jobs no daemon serves are listed 50 groups at most."""
    specs = [client.JobSpec("nobody_serves_this", queue=f"q{n}") for n in range(5000)]
    specs += [client.JobSpec("nobody_serves_this", queue="busy") for _ in range(3)]
    client.enqueue_many(db.conn, specs, schema=db.schema)
    _, snap = status_json(daemons)
    assert len(snap["counts"]) == 20 and snap["counts"]["busy"] == {"pending": 3}
    assert snap["other_queues"] == {"pending": 5000 - 19}
    assert len(snap["unserved"]) == 50 and snap["unserved"][0]["queue"] == "busy"
    human = daemons.cli("status")
    assert len(human.stdout.splitlines()) + len(human.stderr.splitlines()) < 120
    assert "(all other queues): pending 4981" in human.stdout
    assert "and 4951 more handler and queue pair(s) with unserved jobs" in human.stderr


def test_status_always_shows_the_queues_daemons_serve(db: Db, daemons: Daemons) -> None:
    """An enqueuer who makes up 30 queues busier than the fleet's own cannot push the
    queues live daemons serve out of `status`."""
    daemons.start({"work": WORK}, {"queues": ["default"]})
    specs = [
        client.JobSpec("nobody_serves_this", queue=f"loud{n}") for n in range(30) for _ in range(3)
    ]
    client.enqueue_many(
        db.conn, [*specs, client.JobSpec("work", {"seconds": 60})], schema=db.schema
    )
    _, snap = status_json(daemons)
    assert "default" in snap["counts"]
