"""`pgworkerd drain --hand-back`: real daemons, real children and process trees, the CLI
as an operator runs it. Two daemons on this host; every hand-back names its daemon
(--worker), since the default target (this host's daemons) would be both."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_harness import DEADLINE, PGWORKERD, DaemonProcess, Daemons, Db, is_gone, wait_for
from handbackhandlers import recorded

LONG = {"target": "handbackhandlers:long_job"}


def runs(path: Path) -> list[dict[str, Any]]:
    return recorded(str(path))


def wait_runs(path: Path, count: int, timeout: float = DEADLINE) -> list[dict[str, Any]]:
    return wait_for(
        lambda: len(found := runs(path)) >= count and found,
        timeout=timeout,
        what=f"{count} run(s) recorded in {path.name}",
    )


def checkpoint_step(db: Db, job_id: int) -> int:
    return int((db.job(job_id)["checkpoint"] or {}).get("step", 0))


def cli_timed(daemons: Daemons, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    proc = daemons.cli(*args)
    return proc, time.monotonic() - began


def worker_row(db: Db, daemon: DaemonProcess) -> dict[str, Any]:
    [row] = db.rows("SELECT * FROM {schema}.workers WHERE id = %s", (daemon.worker_id,))
    return row


def tree_gone(run: dict[str, Any]) -> bool:
    return all(is_gone(pid) for pid in [run["pid"], *run["tree"]])


@pytest.mark.parametrize("honour", [True, False], ids=["checks-stop_requested", "ignores-it"])
def test_hand_back_moves_a_checkpointing_job_to_the_other_daemon(
    db: Db, daemons: Daemons, tmp_path: Path, honour: bool
) -> None:
    a = daemons.start({"long": LONG}, tag="A")
    out = tmp_path / "runs.jsonl"
    job = db.enqueue("long", {"file": str(out), "every": 0.2, "honour": honour})
    [first] = wait_runs(out, 1)
    assert first["tag"] == "A"
    wait_for(lambda: checkpoint_step(db, job) >= 3, what="a few checkpoints saved")
    b = daemons.start({"long": LONG}, tag="B")

    proc, took = cli_timed(
        daemons, "drain", "--hand-back", "--grace", "2s", "--worker", a.worker_id, "--wait"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hand-back requested for 1 daemon(s)" in proc.stdout
    assert "handed back: no targeted jobs running on daemon" in proc.stdout
    if honour:
        # released when the handler stopped itself, well before the grace ended
        a.wait_log(rf"job {job} long attempt 1: released")
    else:
        # released at the grace, not before (the request reached A within a second)
        assert took >= 2.0, took
        a.wait_log(rf"job {job} long attempt 1: its hand-back grace is over")
    assert took < 2.0 + 10.0, took  # generous on a loaded machine; bench/ measures it

    # The job resumes on B from the checkpoint A saved, its attempt not counted.
    runs_now = wait_runs(out, 2)
    second = runs_now[1]
    assert second["tag"] == "B", runs_now
    assert second["attempt"] == 1
    assert second["started_from"] >= 3
    row = db.wait_status(job, "running")
    assert row["attempts"] == 1 and row["locked_by"] == b.worker_id
    # nothing of A's run is left: the child, its sleep, the sleep in a session of its own
    wait_for(lambda: tree_gone(first), what="A's run and its process tree to be gone")
    history = db.rows(
        "SELECT outcome FROM {schema}.attempts WHERE job_id = %s ORDER BY started_at", (job,)
    )
    assert [h["outcome"] for h in history][:1] == ["released"], history

    # A stays up, drained, until resumed; then it claims again.
    assert a.proc is not None and a.proc.poll() is None
    wait_for(lambda: worker_row(db, a)["state"] == "drained", what="A drained")
    resumed = daemons.cli("resume", "--worker", a.worker_id)
    assert resumed.returncode == 0, resumed.stderr
    wait_for(lambda: worker_row(db, a)["state"] == "running", what="A running again")
    assert worker_row(db, a)["hand_back_requested_at"] is None


def test_a_handler_filter_hands_back_only_its_jobs_and_the_rest_goes_on(
    db: Db, daemons: Daemons, tmp_path: Path
) -> None:
    a = daemons.start({"long": LONG, "other": LONG}, {"slots": 3}, tag="A")
    out = tmp_path / "runs.jsonl"
    targeted = db.enqueue("long", {"file": str(out), "honour": False})
    kept = db.enqueue("other", {"file": str(out)})
    wait_runs(out, 2)
    b = daemons.start({"long": LONG}, tag="B")  # B serves "long" only

    proc = daemons.cli(
        "drain", "--hand-back", "--grace", "0", "--handler", "long", "--worker", a.worker_id,
        "--wait",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    moved = wait_for(
        lambda: [r for r in runs(out) if r["job"] == targeted and r["tag"] == "B"],
        what="the targeted job to start on B",
    )
    assert moved[0]["attempt"] == 1
    # the other handler's job runs on where it was, not asked to stop
    assert db.job(kept)["locked_by"] == a.worker_id
    assert worker_row(db, a)["state"] == "running"  # a filtered hand-back claims the rest
    status = daemons.cli("status")
    assert status.returncode == 1, status.stdout + status.stderr  # left in place: loud
    assert f"daemon {a.worker_id} on " in status.stderr
    assert "is HANDING BACK the jobs of handler(s) long (grace 0ms)" in status.stderr
    # A still claims jobs of "other" (only A serves it), none of "long"
    another = db.enqueue("other", {"file": str(out)})
    assert db.wait_status(another, "running")["locked_by"] == a.worker_id
    later = db.enqueue("long", {"file": str(out)})
    assert db.wait_status(later, "running")["locked_by"] == b.worker_id
    # "running" is set at the claim, the run recorded once the child starts: wait for all
    # five (targeted and kept on A, targeted again and later on B, another on A)
    wait_runs(out, 5)
    a_runs = [r for r in runs(out) if r["tag"] == "A"]
    assert {r["job"] for r in a_runs} == {targeted, kept, another}
    assert "asked to stop" not in (db.job(kept)["last_error"] or "")


def test_a_queue_filter_hands_back_only_that_queue_s_jobs(
    db: Db, daemons: Daemons, tmp_path: Path
) -> None:
    served = {"slots": 3, "queues": ["default", "video"]}
    a = daemons.start({"long": LONG}, served, tag="A")
    out = tmp_path / "runs.jsonl"
    video = db.enqueue("long", {"file": str(out)}, queue="video")
    plain = db.enqueue("long", {"file": str(out)})
    wait_runs(out, 2)
    b = daemons.start({"long": LONG}, served, tag="B")
    proc = daemons.cli(
        "drain", "--hand-back", "--queue", "video", "--worker", a.worker_id, "--wait"
    )  # no --grace: the handler's stop_grace (30 s); it stops itself at once
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(grace: each handler's stop_grace)" in proc.stdout
    moved = wait_for(
        lambda: [r for r in runs(out) if r["job"] == video and r["tag"] == "B"],
        what="the video job to start on B",
    )
    assert moved[0]["attempt"] == 1
    assert db.job(plain)["locked_by"] == a.worker_id  # the default queue's job runs on
    later = db.enqueue("long", {"file": str(out)}, queue="video")
    assert db.wait_status(later, "running")["locked_by"] == b.worker_id


def test_a_second_hand_back_with_a_shorter_grace_wins(
    db: Db, daemons: Daemons, tmp_path: Path
) -> None:
    a = daemons.start({"long": LONG}, tag="A")
    out = tmp_path / "runs.jsonl"
    job = db.enqueue("long", {"file": str(out), "honour": False})
    wait_runs(out, 1)
    # a plain drain first: an upgrade to a hand-back on a host already draining
    plain = daemons.cli("drain", "--worker", a.worker_id)
    assert plain.returncode == 0, plain.stderr
    slow = daemons.cli("drain", "--hand-back", "--grace", "1h", "--worker", a.worker_id)
    assert slow.returncode == 0, slow.stderr
    a.wait_log("hand-back requested through the database: grace 60m")
    proc, took = cli_timed(
        daemons, "drain", "--hand-back", "--grace", "1s", "--worker", a.worker_id, "--wait"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert took < 1.0 + 10.0, took
    assert db.wait_status(job, "pending")["attempts"] == 0
    # a longer one afterwards changes nothing of the shorter one stored
    assert worker_row(db, a)["hand_back_grace"].total_seconds() == 1.0


def test_a_completion_racing_the_release_wins_or_loses_whole(
    db: Db, daemons: Daemons, tmp_path: Path
) -> None:
    """Handlers that return a result the moment they are asked to stop, with a grace of 0
    (release at once): whichever write lands first under the lease token wins, and the
    job is either completed once or pending with its checkpoint, never both."""
    a = daemons.start({"long": LONG}, {"slots": 4}, tag="A")
    out = tmp_path / "runs.jsonl"
    jobs = [
        db.enqueue("long", {"file": str(out), "every": every, "finish_at_stop": True})
        for every in (0.02, 0.1, 0.2, 0.4)
    ]
    wait_runs(out, 4)
    wait_for(lambda: all(checkpoint_step(db, j) >= 2 for j in jobs), what="checkpoints")
    # 100 ms: the handlers see stop_requested at their next step (20 to 400 ms) and
    # return, while the daemon's stop lands after 100 ms: either may come first
    proc = daemons.cli(
        "drain", "--hand-back", "--grace", "100ms", "--worker", a.worker_id, "--wait"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ends = []
    for job in jobs:
        row = db.wait_status(job, "pending", "completed")
        ends.append(row["status"])
        history = db.rows("SELECT outcome FROM {schema}.attempts WHERE job_id = %s", (job,))
        assert len(history) == 1, history
        if row["status"] == "completed":
            assert history[0]["outcome"] == "completed" and row["attempts"] == 1
        else:
            assert history[0]["outcome"] == "released" and row["attempts"] == 0
            assert checkpoint_step(db, job) >= 2  # the checkpoint survived the release
    print("race outcomes:", ends)  # which side won, for whoever reads the output
    assert a.proc is not None and a.proc.poll() is None


def test_hostile_values_are_refused_and_change_nothing(db: Db, daemons: Daemons) -> None:
    a = daemons.start({"long": LONG}, tag="A")
    # settled first: the daemon names its own wake channel at its first heartbeat after
    # it listens (schema 40), a change of its own that a refused drain has nothing to do with
    before = wait_for(lambda: (row := worker_row(db, a))["wake_channel"] and row, what="channel")

    def refused(*args: str) -> subprocess.CompletedProcess[str]:
        proc = daemons.cli("drain", *args)
        assert proc.returncode != 0, proc.stdout
        return proc

    assert refused("--hand-back", "--grace", "-5s", "--worker", a.worker_id).returncode == 2
    ten_years = refused("--hand-back", "--grace", "3650d", "--worker", a.worker_id)
    assert ten_years.returncode == 3 and "at most 1 day" in ten_years.stderr
    assert refused("--grace", "5s", "--worker", a.worker_id).returncode == 2  # no --hand-back
    assert refused("--queue", "q", "--worker", a.worker_id).returncode == 2
    bad_name = refused("--hand-back", "--queue", "bad\x1bname", "--worker", a.worker_id)
    assert bad_name.returncode == 3
    unknown = refused("--hand-back", "--worker", "nobody:1:abc")
    assert unknown.returncode == 1 and "no daemon has this id" in unknown.stderr
    # one read: a heartbeat between two reads made the two sides differ (a CI failure)
    after = worker_row(db, a)
    assert after == {**before, "heartbeat_at": after["heartbeat_at"]}

    # a daemon that is gone: said so
    a.send(15)
    a.wait_exit()
    gone = refused("--hand-back", "--grace", "0", "--worker", a.worker_id)
    assert gone.returncode == 1 and "it is gone since" in gone.stderr


def test_the_drain_cli_lists_the_new_options() -> None:
    proc = subprocess.run(
        [str(PGWORKERD), "drain", "--help"], capture_output=True, text=True, check=True
    )
    for option in ("--hand-back", "--grace", "--queue", "--handler", "--wait", "--timeout"):
        assert option in proc.stdout
