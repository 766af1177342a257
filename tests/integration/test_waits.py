"""Durable waits against real daemons and a real PostgreSQL (issue 24 item 4): a handler's
`raise pgworkerd.WaitFor(...)` suspends its job (checkpoint saved, attempt not counted,
lease and slot let go, no process kept); `pgworkerd signal` makes it pending at once and
its next attempt sees the signal's payload with its checkpoint; a signal sent before the
wait makes the wait return at once; a timeout makes it pending without a signal; a
daemon killed -9 or drained while the job waits changes nothing, and another daemon
resumes it."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path

import pytest
from daemon_harness import Daemons, Db, wait_for

H = "waithandlers"


def _descendants(root: int) -> list[int]:
    """Every process below `root` (the machine is shared: other tests' jobs have ids too)."""
    parent_of = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent_of[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [p for p, parent in parent_of.items() if parent == pid]
        found += children
        frontier += children
    return found


def _processes_of_job(daemon_pid: int, job_id: int) -> list[int]:
    """Pids below the daemon whose title names the job (a child running it shows
    "pgworkerd: job ID handler attempt N")."""
    found = []
    for pid in _descendants(daemon_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if f"pgworkerd: job {job_id} ".encode() in cmdline:
            found.append(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _waited_attempts(db: Db, job_id: int) -> int:
    [row] = db.rows(
        "SELECT count(*) AS n FROM {schema}.attempts WHERE job_id = %s AND outcome = 'waited'",
        (job_id,),
    )
    return int(row["n"])


def test_a_wait_then_a_signal_resumes_the_job_with_its_checkpoint_and_the_payload(
    daemons: Daemons, db: Db
) -> None:
    daemon = daemons.start({"approver": {"target": f"{H}:wait_once"}})
    job_id = db.enqueue("approver", {"name": "approval", "timeout": "2d"}, max_attempts=1)
    row = db.wait_status(job_id, "suspended")
    # the checkpoint of its last heartbeat saved, the attempt not counted, no lease held
    assert row["checkpoint"]["step"] == 1
    assert (row["attempts"], row["locked_by"], row["locked_until"]) == (0, None, None)
    assert row["wait_for"] == "approval" and row["wait_ended"] is None
    assert 2 * 86400 - 60 < (row["wait_until"] - row["wait_since"]).total_seconds() <= 2 * 86400
    assert _waited_attempts(db, job_id) == 1
    # no process is kept for it: no child shows the job, and what the handler started
    # (a `sleep 300`) was killed with the attempt
    wait_for(lambda: not _processes_of_job(daemon.pid, job_id), what="no process to show the job")
    wait_for(lambda: not _alive(row["checkpoint"]["sleeper"]), what="the grandchild to be gone")

    sent = daemons.cli("signal", str(job_id), "approval", "--payload", '{"by": "ana", "ok": true}')
    assert sent.returncode == 0, sent
    assert "delivered: the job was waiting for it and is pending now" in sent.stdout

    row = db.wait_status(job_id, "completed", "dead")
    assert row["status"] == "completed", row["last_error"]
    seen = row["result"]
    # max_attempts = 1: a wait that counted its attempt would have left none to resume
    assert (seen["attempt"], row["attempts"]) == (1, 1)
    assert seen["checkpoint"]["step"] == 1
    assert seen["waited_for"] == "approval"
    assert seen["signal"]["name"] == "approval"
    assert seen["signal"]["payload"] == {"by": "ana", "ok": True}
    assert seen["signal"]["sent_at"]

    again = daemons.cli("signal", str(job_id), "approval")
    assert again.returncode == 1 and "is completed: a finished job takes no signal" in again.stderr


def test_a_checkpoint_given_to_wait_for_is_the_one_saved(daemons: Daemons, db: Db) -> None:
    daemons.start({"approver": {"target": f"{H}:wait_with_checkpoint"}})
    job_id = db.enqueue("approver", {"name": "go"})
    row = db.wait_status(job_id, "suspended")
    assert row["checkpoint"] == {"given": "to WaitFor"}
    assert daemons.cli("signal", str(job_id), "go").returncode == 0
    row = db.wait_status(job_id, "completed")
    assert row["result"]["checkpoint"] == {"given": "to WaitFor"}
    assert row["result"]["signal"]["payload"] is None


def test_a_signal_sent_before_the_wait_is_kept_and_the_wait_returns_at_once(
    daemons: Daemons, db: Db
) -> None:
    job_id = db.enqueue("approver", {"name": "approval"}, max_attempts=1)
    early = daemons.cli("signal", str(job_id), "approval", "--payload", "[1, 2]", "--json")
    assert early.returncode == 0, early
    assert json.loads(early.stdout)["outcome"] == "kept"
    # a second signal of the same name: first write wins, reported as ignored
    dup = daemons.cli("signal", str(job_id), "approval", "--payload", "3")
    assert dup.returncode == 0 and "ignored" in dup.stdout and "first signal wins" in dup.stdout

    daemons.start({"approver": {"target": f"{H}:wait_once"}})
    row = db.wait_status(job_id, "completed", "dead")
    assert row["status"] == "completed", row["last_error"]
    assert row["result"]["signal"]["payload"] == [1, 2]
    assert row["wait_ended"] == "signal"
    # it waited (one 'waited' attempt), but never stayed suspended: pending at once
    assert _waited_attempts(db, job_id) == 1
    assert row["attempts"] == 1


def test_a_timed_out_wait_runs_again_without_a_signal(daemons: Daemons, db: Db) -> None:
    daemons.start({"approver": {"target": f"{H}:wait_once"}})
    job_id = db.enqueue("approver", {"name": "approval", "timeout": "1s"})
    db.wait_status(job_id, "suspended")
    # the daemons' sweep looks every 5 s (+-50 %): well within the bound below
    row = db.wait_status(job_id, "completed", "dead", timeout=60)
    assert row["status"] == "completed", row["last_error"]
    assert row["result"]["signal"] is None and row["result"]["waited_for"] == "approval"
    assert row["wait_ended"] == "timeout"
    # a signal after the timeout (job finished now) is refused
    late = daemons.cli("signal", str(job_id), "approval")
    assert late.returncode == 1


def test_a_daemon_killed_while_its_job_waits_changes_nothing_and_another_resumes_it(
    daemons: Daemons, db: Db
) -> None:
    first = daemons.start({"approver": {"target": f"{H}:wait_once"}}, tag="A")
    job_id = db.enqueue("approver", {"name": "approval", "key": "order-42"})
    before = db.wait_status(job_id, "suspended")
    first.send(signal.SIGKILL)
    first.wait_exit()
    after = db.job(job_id)
    for column in ("status", "attempts", "checkpoint", "wait_for", "wait_until", "updated_at"):
        assert after[column] == before[column], column

    second = daemons.start({"approver": {"target": f"{H}:wait_once"}}, tag="B")
    sent = daemons.cli("signal", "--key", "order-42", "approval", "--payload", '"yes"')
    assert sent.returncode == 0, sent
    assert f"job {job_id}: signal 'approval' delivered" in sent.stdout
    row = db.wait_status(job_id, "completed", "dead")
    assert row["status"] == "completed", row["last_error"]
    assert row["result"]["signal"]["payload"] == "yes"
    assert f"job {job_id} approver attempt 1: started" in second.log()
    # the key is free again once the job finished: a signal by it is parked for the next
    # job that waits with it (0032), not delivered to the finished one
    gone = daemons.cli("signal", "--key", "order-42", "approval")
    assert gone.returncode == 0, gone.stderr
    assert "key 'order-42': signal 'approval' parked: no live job waits" in gone.stdout


def test_a_drain_does_not_wait_for_a_suspended_job(daemons: Daemons, db: Db) -> None:
    daemon = daemons.start(
        {"approver": {"target": f"{H}:wait_once"}}, {"drain_timeout": "5m"}, tag="A"
    )
    job_id = db.enqueue("approver", {"name": "approval"})
    db.wait_status(job_id, "suspended")
    daemon.send(signal.SIGTERM)
    # a drain of up to 5 minutes ends at once: the suspended job holds no slot here
    assert daemon.wait_exit(timeout=30) == 0
    assert db.job(job_id)["status"] == "suspended"


def test_two_waits_in_a_row_each_resumed_by_its_own_signal(daemons: Daemons, db: Db) -> None:
    daemons.start({"stepper": {"target": f"{H}:wait_twice"}})
    job_id = db.enqueue("stepper", {}, max_attempts=1)
    wait_for(lambda: db.job(job_id)["wait_for"] == "first", what="the first wait")
    db.wait_status(job_id, "suspended")
    # "second" sent early: kept while the job waits for "first"
    kept = daemons.cli("signal", str(job_id), "second", "--payload", "2", "--json")
    assert json.loads(kept.stdout)["outcome"] == "kept"
    assert db.job(job_id)["status"] == "suspended"
    assert daemons.cli("signal", str(job_id), "first", "--payload", "1").returncode == 0
    row = db.wait_status(job_id, "completed", "dead")
    assert row["status"] == "completed", row["last_error"]
    assert row["result"]["steps"] == {"started": True, "first": 1, "second": 2}
    assert _waited_attempts(db, job_id) == 2 and row["attempts"] == 1


def test_bad_waits_are_failed_attempts_that_say_why(daemons: Daemons, db: Db) -> None:
    daemons.start(
        {
            "bad": {"target": f"{H}:wait_bad"},
            "holder": {"target": f"{H}:wait_once"},
        }
    )
    cases = {
        "WaitFor timeout must be above 0": {"timeout": 0},
        "WaitFor timeout must be above 0 and at most 31622400s": {"timeout": "400d"},
        "is not a duration": {"timeout": "soon"},
        "WaitFor name must not contain control characters": {"name": "a\nb"},
        "WaitFor name must be a non-empty string": {"name": ""},
        "WaitFor key must be at most 128 characters": {"key": "k" * 129},
    }
    ids = {what: db.enqueue("bad", payload, max_attempts=1) for what, payload in cases.items()}
    holder = db.enqueue("holder", {"name": "approval", "key": "shared"})
    db.wait_status(holder, "suspended")
    taken = db.enqueue("bad", {"key": "shared"}, max_attempts=1)
    for what, job_id in ids.items():
        row = db.wait_status(job_id, "dead")
        assert what in row["last_error"], (what, row["last_error"])
        assert row["wait_for"] is None
    row = db.wait_status(taken, "dead")
    assert "correlation key 'shared' is held by live job" in row["last_error"]
    assert f"live job {holder}" in row["last_error"]
    assert db.job(holder)["status"] == "suspended"


@pytest.mark.parametrize("rounds", [40])
def test_signals_raced_against_waits_are_never_lost(daemons: Daemons, db: Db, rounds: int) -> None:
    """Each job gets its signal at a random moment around its wait (before it is claimed,
    while it runs, as it suspends, after): every one completes with the signal seen."""
    daemons.start({"approver": {"target": f"{H}:wait_once"}}, {"slots": 4})
    ids = [db.enqueue("approver", {"name": "go", "timeout": "1h"}) for _ in range(rounds)]
    outcomes: dict[int, str] = {}

    def send_all(order: list[int]) -> None:
        for n, job_id in enumerate(order):
            if n % 3:
                # wait until it runs (or waits) before signalling
                wait_for(
                    lambda j=job_id: db.job(j)["status"] != "pending",  # type: ignore[misc]
                    what=f"job {job_id} to start",
                )
            sent = daemons.cli("signal", str(job_id), "go", "--payload", str(job_id), "--json")
            assert sent.returncode == 0, sent
            outcomes[job_id] = json.loads(sent.stdout)["outcome"]

    sender = threading.Thread(target=send_all, args=(ids,))
    sender.start()
    sender.join(timeout=600)
    for job_id in ids:
        row = db.wait_status(job_id, "completed", "dead", timeout=120)
        assert row["status"] == "completed", row["last_error"]
        assert row["result"]["signal"]["payload"] == job_id
    assert set(outcomes.values()) <= {"kept", "resumed"}


def test_explain_show_and_jobs_tell_what_a_job_waits_for_and_what_it_received(
    daemons: Daemons, db: Db
) -> None:
    daemons.start({"approver": {"target": f"{H}:wait_once"}})
    job_id = db.enqueue("approver", {"name": "approval", "timeout": "2d", "key": "order-7"})
    db.wait_status(job_id, "suspended")
    other = db.enqueue("approver", {"name": "other"}, max_attempts=1)
    db.wait_status(other, "suspended")

    explained = daemons.cli("explain", str(job_id), "--json")
    assert explained.returncode == 0, explained
    [reason] = json.loads(explained.stdout)["reasons"]
    assert reason["code"] == "suspended"
    assert reason["facts"]["signal"] == "approval" and reason["facts"]["key"] == "order-7"
    text = daemons.cli("explain", str(job_id)).stdout
    assert "suspended: waiting for signal 'approval' since" in text and "timeout at" in text
    assert f"pgworkerd signal {job_id} approval resumes it" in text

    listed = daemons.cli("jobs", "--status", "suspended", "--json")
    assert listed.returncode == 0, listed
    assert {r["id"] for r in json.loads(listed.stdout)} == {job_id, other}

    sent = daemons.cli("signal", str(other), "early-bird", "--payload", '{"x": 1}')
    assert "kept" in sent.stdout
    shown = daemons.cli("show", str(other))
    assert shown.returncode == 0, shown
    assert "\nwait_for: other\n" in shown.stdout and "\nstatus: suspended\n" in shown.stdout
    assert "signals: 1 received:" in shown.stdout
    assert "early-bird" in shown.stdout and '{"x": 1}' in shown.stdout
    assert "#1 waited" in shown.stdout  # the attempt that waited, in the history

    assert daemons.cli("signal", str(job_id), "approval").returncode == 0
    row = db.wait_status(job_id, "completed")
    explained = json.loads(daemons.cli("explain", str(job_id), "--json").stdout)
    assert explained["reasons"][0]["code"] == "completed"
    assert row["wait_ended"] == "signal"
    # cancel reaches a suspended job at once
    cancelled = daemons.cli("cancel", str(other))
    assert cancelled.returncode == 0 and f"{other}: cancelled" in cancelled.stdout
    assert db.job(other)["status"] == "cancelled"
