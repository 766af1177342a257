"""`pgworkerd explain ID`: every reason a pending job is not running, each with its stable
code and facts, and what happened to a job in any other state; from the database alone.

Live, drained and full daemons are real daemons (tests/support/daemon_harness.py); the
other cases write the registry rows as a daemon writes them (registry.register)."""

from __future__ import annotations

import json
from typing import Any

import leasing
import psycopg
import pytest
from support.daemon_harness import Daemons, Db, wait_for

from pgworkerd import client
from pgworkerd.exitcodes import ExitCode
from pgworkerd.queue import admin, explain, fleet, lease, registry

# a daemon's registry secret (schema 24), the same for every row of these tests
SECRET = "test-registry-secret-" + "x" * 32

WORK = "jobhandlers:work"
SETTINGS = {"queues": None, "slots": None, "max_running": None, "max_running_per_key": None}


def codes(conn: psycopg.Connection, schema: str, job_id: int) -> dict[str, dict[str, Any]]:
    found = explain.explain(conn, schema, job_id)
    assert found is not None
    return {r["code"]: r for r in found["reasons"]}


def daemon_row(
    conn: psycopg.Connection,
    schema: str,
    worker_id: str = "host-a:1:x",
    *,
    queues: tuple[str, ...] = ("default",),
    handlers: dict[str, dict[str, Any]] | None = None,
    slots: int = 4,
) -> registry.WorkerInfo:
    """The registry row of a live daemon, as `pgworkerd run` writes it."""
    handlers = handlers if handlers is not None else {"h": SETTINGS}
    info = registry.WorkerInfo(
        worker_id, "host-a", 1, "t", list(queues), list(handlers), slots, handlers
    )
    registry.register(conn, info, "running", schema, secret=SECRET)
    return info


# -- pending jobs, with registry rows ----------------------------------------------------------


def test_nothing_blocks_a_due_job_a_live_daemon_serves(conn: psycopg.Connection, schema: str):
    daemon_row(conn, schema)
    first, second = client.enqueue_many(
        conn, [client.JobSpec("h"), client.JobSpec("h")], schema=schema
    )
    assert list(codes(conn, schema, first)) == ["claimable"]
    [why] = codes(conn, schema, second).values()
    assert why["facts"]["due_ahead"] == 1 and "poll interval" in why["message"]


def test_scheduled_later(conn: psycopg.Connection, schema: str):
    daemon_row(conn, schema)
    job = client.enqueue(conn, "h", delay=3600, schema=schema)
    why = codes(conn, schema, job)
    assert list(why) == ["scheduled"]
    assert 3500 < why["scheduled"]["facts"]["in_seconds"] <= 3600


def test_backing_off_after_a_failed_attempt(conn: psycopg.Connection, schema: str):
    daemon_row(conn, schema)
    job = client.enqueue(conn, "h", schema=schema)
    [claimed] = leasing.claim(
        conn, "host-a:1:x", queues=["default"], handlers={"h": lease.HandlerCapacity(30, 1)},
        limit=1, schema=schema,
    )  # fmt: skip
    lease.fail(conn, "host-a:1:x", job, claimed.token, "Traceback\nOSError: disk full",
               backoff_base=600, schema=schema)  # fmt: skip
    why = codes(conn, schema, job)
    assert list(why) == ["backing_off"]
    facts = why["backing_off"]["facts"]
    assert facts["attempt"] == 1 and facts["in_seconds"] > 300
    assert "OSError: disk full" in why["backing_off"]["message"]


def test_no_live_daemon_serves_its_handler_or_queue(conn: psycopg.Connection, schema: str):
    job = client.enqueue(conn, "h", queue="mail", schema=schema)
    assert list(codes(conn, schema, job)) == ["no_daemon"]
    daemon_row(conn, schema, queues=("default",))  # the handler, another queue
    why = codes(conn, schema, job)["no_daemon"]
    assert why["facts"]["serving_handler_only"] == ["host-a:1:x"]
    # a handler restricted to other queues does not serve it either
    daemon_row(conn, schema, "host-b:2:y", queues=("default", "mail"),
               handlers={"h": {**SETTINGS, "queues": ["default"]}})  # fmt: skip
    assert list(codes(conn, schema, job)) == ["no_daemon"]
    # a daemon gone serves nothing
    daemon_row(conn, schema, "host-c:3:z", queues=("mail",))
    assert list(codes(conn, schema, job)) == ["claimable"]
    registry.deregister(conn, "host-c:3:z", schema, secret=SECRET)
    assert list(codes(conn, schema, job)) == ["no_daemon"]


def test_silent_daemons(conn: psycopg.Connection, schema: str):
    daemon_row(conn, schema)
    job = client.enqueue(conn, "h", schema=schema)
    conn.execute(f"UPDATE {schema}.workers SET heartbeat_at = now() - interval '5 minutes'")
    why = codes(conn, schema, job)
    assert list(why) == ["daemons_silent"]
    assert why["daemons_silent"]["facts"]["daemons"][0]["id"] == "host-a:1:x"


@pytest.mark.parametrize("kind", ["queue", "handler"])
def test_paused_queue_or_handler(conn: psycopg.Connection, schema: str, kind: str):
    daemon_row(conn, schema)
    job = client.enqueue(conn, "h", schema=schema)
    name = "default" if kind == "queue" else "h"
    fleet.set_paused(conn, schema, kind, name, pause=True, comment="db migration\x1b[2J")
    why = codes(conn, schema, job)
    assert list(why) == [f"{kind}_paused"]
    facts = why[f"{kind}_paused"]["facts"]
    assert facts["comment"] == "db migration\x1b[2J" and facts["paused_by"]
    assert facts["name"] == name


def test_every_reason_at_once(conn: psycopg.Connection, schema: str):
    """Later, paused and unserved: all three are listed, not just the first."""
    job = client.enqueue(conn, "h", queue="q", delay=600, schema=schema)
    fleet.set_paused(conn, schema, "queue", "q", pause=True)
    assert list(codes(conn, schema, job)) == ["scheduled", "queue_paused", "no_daemon"]


def test_retried_by_hand(conn: psycopg.Connection, schema: str):
    daemon_row(conn, schema)
    job = client.enqueue(conn, "h", max_attempts=1, schema=schema)
    [claimed] = leasing.claim(
        conn, "host-a:1:x", queues=["default"], handlers={"h": lease.HandlerCapacity(30, 1)},
        limit=1, schema=schema,
    )  # fmt: skip
    lease.fail(conn, "host-a:1:x", job, claimed.token, "boom", schema=schema)
    assert list(codes(conn, schema, job)) == ["dead"]
    assert admin.retry(conn, ids=[job], schema=schema) == [job]
    why = codes(conn, schema, job)
    assert list(why) == ["retried", "claimable"]
    assert why["retried"]["facts"]["earlier_attempts"] == 1


# -- other states ------------------------------------------------------------------------------


def _claim(conn: psycopg.Connection, schema: str, job: int, lease_seconds: float = 30) -> int:
    [claimed] = leasing.claim(
        conn, "host-a:1:x", queues=["default"],
        handlers={"h": lease.HandlerCapacity(lease_seconds, 1)}, limit=1, schema=schema,
    )  # fmt: skip
    assert claimed.id == job
    return claimed.token


def test_running_and_lease_expired(conn: psycopg.Connection, schema: str):
    daemon_row(conn, schema)
    job = client.enqueue(conn, "h", schema=schema)
    _claim(conn, schema, job)
    why = codes(conn, schema, job)
    assert list(why) == ["running"]
    facts = why["running"]["facts"]
    assert (facts["worker"], facts["host"], facts["attempt"]) == ("host-a:1:x", "host-a", 1)
    assert 0 < facts["lease_left_seconds"] <= 30
    conn.execute(f"UPDATE {schema}.jobs SET locked_until = now() - interval '2 minutes'")
    why = codes(conn, schema, job)
    assert list(why) == ["running", "lease_expired"]
    assert why["lease_expired"]["facts"]["expired_seconds"] > 100


def test_snoozed_by_its_handler(conn: psycopg.Connection, schema: str):
    daemon_row(conn, schema)
    job = client.enqueue(conn, "h", schema=schema)
    lease.snooze(conn, "host-a:1:x", job, _claim(conn, schema, job), 900, max_snoozes=5,
                 schema=schema)  # fmt: skip
    why = codes(conn, schema, job)
    assert list(why) == ["snoozed"]
    assert why["snoozed"]["facts"]["snoozes"] == 1 and why["snoozed"]["facts"]["in_seconds"] > 800


def test_cancel_requested_while_running(conn: psycopg.Connection, schema: str):
    daemon_row(conn, schema)
    job = client.enqueue(conn, "h", schema=schema)
    _claim(conn, schema, job)
    assert admin.cancel(conn, [job], schema=schema) == {job: "cancel requested"}
    assert list(codes(conn, schema, job)) == ["running", "cancel_requested"]


def test_completed_dead_cancelled_and_dedupe_held(conn: psycopg.Connection, schema: str):
    daemon_row(conn, schema)
    done = client.enqueue(conn, "h", schema=schema)
    leasing.complete(conn, "host-a:1:x", done, _claim(conn, schema, done), {"ok": 1}, schema=schema)
    assert list(codes(conn, schema, done)) == ["completed"]

    dead = client.enqueue(conn, "h", max_attempts=1, dedupe_key="nightly", schema=schema)
    lease.fail(conn, "host-a:1:x", dead, _claim(conn, schema, dead), "E: x\nKeyError: 'k'",
               schema=schema)  # fmt: skip
    why = codes(conn, schema, dead)
    assert list(why) == ["dead"] and "KeyError: 'k'" in why["dead"]["message"]
    assert why["dead"]["facts"]["attempts"] == 1
    holder = client.enqueue(conn, "h", dedupe_key="nightly", delay=60, schema=schema)
    why = codes(conn, schema, dead)
    assert list(why) == ["dead", "dedupe_held"] and why["dedupe_held"]["facts"]["holder"] == holder

    pending = client.enqueue(conn, "h", delay=600, schema=schema)
    admin.cancel(conn, [pending], schema=schema)
    why = codes(conn, schema, pending)
    assert list(why) == ["cancelled"] and why["cancelled"]["facts"]["while_running"] is False


# -- the command --------------------------------------------------------------------------------

HOSTILE = "h\x1b]0;PWNED\x07\n  [claimable] forged line"


def test_cli_text_json_and_unknown_id(daemons: Daemons, conn: psycopg.Connection, schema: str):
    """Names are printed inert (escaped), one line per reason; --json carries them as
    they are; an unknown id is a one-line error and exit code 1. (`daemons` starts no
    daemon here: it runs the CLI against the test's schema.)"""
    conn.execute(
        f"INSERT INTO {schema}.jobs (handler, queue, run_at) VALUES (%s, %s, 'infinity')",
        [HOSTILE, "q\u202eevil"],
    )
    [(job,)] = conn.execute(f"SELECT id FROM {schema}.jobs").fetchall()
    proc = daemons.cli("explain", str(job))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    lines = out.splitlines()
    assert lines[0].startswith(f"job {job}: pending, handler 'h\\x1b]0;PWNED\\x07\\n")
    assert [ln.split("]")[0].strip() for ln in lines[1:]] == ["[scheduled", "[no_daemon"]
    assert "never" in lines[1]

    proc = daemons.cli("explain", str(job), "--json")
    shown = json.loads(proc.stdout)
    assert set(shown) == {"id", "status", "queue", "handler", "summary", "reasons"}
    assert shown["handler"] == HOSTILE and shown["status"] == "pending"
    for r in shown["reasons"]:
        assert set(r) == {"code", "message", "facts"} and isinstance(r["facts"], dict)

    proc = daemons.cli("explain", "987654321")
    assert proc.returncode == ExitCode.FAILURE
    assert proc.stderr.strip().endswith("job 987654321 not found") and not proc.stdout


# -- with real daemons: live, full, limited, drained ------------------------------------------


def test_real_daemon_running_full_limits_and_drained(
    daemons: Daemons, db: Db, conn: psycopg.Connection, schema: str
) -> None:
    daemon = daemons.start(
        {
            "work": {"target": WORK, "max_running": 1},
            "keyed": {"target": WORK, "max_running_per_key": 1},
        },
        {"slots": 2},
    )
    long = {"seconds": 120}

    def running(job: int) -> None:
        wait_for(lambda: codes(conn, schema, job).get("running"), what=f"job {job} running")

    a = client.enqueue(conn, "work", long, schema=schema)
    running(a)
    facts = codes(conn, schema, a)["running"]["facts"]
    assert facts["worker"] == daemon.worker_id and facts["host"]
    assert facts["daemon_state"] == "running"

    b = client.enqueue(conn, "work", long, schema=schema)
    why = codes(conn, schema, b)
    assert list(why) == ["limit_full"]
    assert why["limit_full"]["facts"] == {"max_running": 1, "running": 1, "running_ids": [a]}

    k1 = client.enqueue(conn, "keyed", long, concurrency_key="tenant-7", schema=schema)
    running(k1)
    k2 = client.enqueue(conn, "keyed", long, concurrency_key="tenant-7", schema=schema)
    why = wait_for(
        lambda: (w := codes(conn, schema, k2)) and "daemons_full" in w and w,
        what="the daemon's heartbeat to show 2/2 busy",
    )
    assert list(why) == ["daemons_full", "key_limit_full"]
    assert why["key_limit_full"]["facts"]["running_ids"] == [k1]
    assert why["key_limit_full"]["facts"]["key"] == "tenant-7"
    assert why["daemons_full"]["facts"]["daemons"][0]["busy"] == 2

    assert daemons.cli("drain", "--worker", daemon.worker_id).returncode == 0
    why = codes(conn, schema, b)
    assert list(why) == ["daemons_drained"]
    assert why["daemons_drained"]["facts"]["daemons"][0]["id"] == daemon.worker_id

    assert daemons.cli("cancel", str(a)).returncode == 0
    wait_for(lambda: codes(conn, schema, a).get("cancelled"), what="job a cancelled")
    assert codes(conn, schema, a)["cancelled"]["facts"]["while_running"] is True
