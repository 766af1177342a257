"""Acceptance tier: job logs (issue 13) with the real daemon, real children and the real
`pgworkerd logs` (tests/support/loghandlers.py): every way out of a handler is captured
per attempt, bounded to a head and a tail, kept through a kill -9 and a timeout, copied to
the daemon's log tagged with the job, stored and shown inert; capture does not slow a
handler down."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

from daemon_harness import PGWORKERD, Daemons, Db, wait_for

KIB = 1 << 10


def stored(db: Db, job_id: int, count: int = 1) -> list[dict[str, Any]]:
    """The job's log rows once `count` attempts' logs are stored whole."""
    return wait_for(
        lambda: (
            len(
                rows := db.rows(
                    "SELECT * FROM {schema}.job_logs WHERE job_id = %s ORDER BY attempt",
                    (job_id,),
                )
            )
            == count
            and all(r["finished"] for r in rows)
            and rows
        ),
        what=f"{count} finished log(s) of job {job_id}",
    )


def logs_cli(daemons: Daemons, *args: str) -> subprocess.CompletedProcess[str]:
    return daemons.cli("logs", *args)


def test_every_way_out_is_captured_per_attempt_and_tagged_in_the_daemons_log(
    db: Db, daemons: Daemons
) -> None:
    d = daemons.start({"chatter": {"target": "loghandlers:chatter"}})
    job_id = db.enqueue("chatter", {"fail_first": True}, max_attempts=2)
    assert db.wait_status(job_id, "completed", "dead")["status"] == "completed"
    one, two = stored(db, job_id, 2)
    for row, n in ((one, 1), (two, 2)):
        assert row["attempt"] == n and not row["omitted_bytes"]
        for kind in ("stdout", "stderr", "subprocess", "raw"):
            assert f"{kind} line of attempt {n}\n" in row["head"], row["head"]
        assert re.search(rf"INFO app\.jobs: logging line of attempt {n}\n", row["head"])
        assert f"attempt {3 - n}" not in row["head"]
        assert row["total_bytes"] == len(row["head"].encode())
    # the daemon's own log has them too, tagged with the job and attempt
    d.wait_log(rf"job {job_id} attempt 1 \| stdout line of attempt 1")
    d.wait_log(rf"job {job_id} attempt 2 \| subprocess line of attempt 2")

    latest = logs_cli(daemons, str(job_id))
    assert latest.returncode == 0, latest.stderr
    assert latest.stdout == two["head"]
    first = logs_cli(daemons, str(job_id), "--attempt", "1")
    assert first.returncode == 0 and first.stdout == one["head"], first.stderr
    printed = logs_cli(daemons, str(job_id), "--json").stdout
    as_json = json.loads(printed)
    assert [e["attempt"] for e in as_json["logs"]] == [1, 2]
    assert as_json["logs"][0]["head"] == one["head"]
    # no lease token is printed (a token fences a holder's writes; a reader runs this)
    assert "lease_token" not in printed
    for row in (one, two):
        assert str(row["lease_token"]) not in printed

    unknown = logs_cli(daemons, str(job_id + 1000))
    assert unknown.returncode == 1 and f"job {job_id + 1000} not found" in unknown.stderr
    beyond = logs_cli(daemons, str(job_id), "--attempt", "3")
    assert beyond.returncode == 1 and "has had 2 attempt(s), not 3" in beyond.stderr


def test_the_cap_keeps_the_head_and_the_tail_and_counts_what_is_between(
    db: Db, daemons: Daemons
) -> None:
    # a reused child: each job's lines are its own
    daemons.start(
        {"numbered": {"target": "loghandlers:numbered"}},
        {"slots": 1, "max_jobs_per_child": 5},
        tables={"logs": {"max_bytes_per_attempt": "8KiB"}},
    )
    jobs = [db.enqueue("numbered", {"lines": lines}) for lines in (1000, 30)]
    pids = {db.wait_status(j, "completed")["result"]["pid"] for j in jobs}
    assert len(pids) == 1  # the same child ran both
    [big] = stored(db, jobs[0])
    [small] = stored(db, jobs[1])
    assert big["total_bytes"] == 1000 * 100
    assert len(big["head"]) == 4 * KIB and len(big["tail"]) <= 4 * KIB
    assert big["head"].startswith(f"line 00000 {jobs[0]:>10} x")
    assert big["tail"].endswith(f"line 00999 {jobs[0]:>10} ".ljust(99, "x") + "\n")
    assert big["omitted_bytes"] == 100_000 - len(big["head"]) - len(big["tail"]) > 0
    assert f" {jobs[1]:>10} " not in big["head"] + big["tail"]
    assert small["total_bytes"] == 3000 and small["omitted_bytes"] == 0
    assert small["head"] + small["tail"] == "".join(
        f"line {i:05d} {jobs[1]:>10} ".ljust(99, "x") + "\n" for i in range(30)
    )
    shown = logs_cli(daemons, str(jobs[0])).stdout
    marker = f"[... {big['omitted_bytes']} bytes omitted ...]"
    assert shown.split("\n").count(marker) == 1
    assert shown.startswith(big["head"]) and shown.endswith(big["tail"])


def timed_flood(db: Db, daemons: Daemons, capture: bool) -> tuple[float, int, str]:
    """How long printing 10 MiB took the handler, the job's id and the daemon's log."""
    d = daemons.start(
        {"flood": {"target": "loghandlers:flood"}},
        tables={"logs": {"capture": capture}},
        tag="on" if capture else "off",
    )
    job_id = db.enqueue("flood", {"mib": 10})
    row = db.wait_status(job_id, "completed", "dead", timeout=120)
    assert row["status"] == "completed", row["last_error"]
    d.send(signal.SIGTERM)
    d.wait_exit()
    return row["result"]["seconds"], job_id, d.log()


def test_a_handler_printing_10_mib_at_full_speed_is_not_slowed_down(
    db: Db, daemons: Daemons
) -> None:
    off, _, _ = timed_flood(db, daemons, capture=False)
    on, job_id, log = timed_flood(db, daemons, capture=True)
    print(f"printing 10 MiB: {on:.2f}s with capture, {off:.2f}s without")
    assert on < 3 * off + 2.0
    [row] = stored(db, job_id)
    assert row["total_bytes"] == 10 * (1 << 20) // 100 * 100 + len("the last line of the flood\n")
    assert row["tail"].endswith("y\nthe last line of the flood\n")
    # the daemon's log got at most 100 lines a second of it, and says what it left out
    assert re.search(rf"job {job_id} attempt 1: \d+ line\(s\) of output not copied", log)
    assert log.count(f"job {job_id} attempt 1 | ") < 100 * 30


def test_a_killed_attempt_keeps_its_last_lines(db: Db, daemons: Daemons, tmp_path: Path) -> None:
    daemons.start(
        {
            "killed": {"target": "loghandlers:last_words"},
            "timed_out": {"target": "loghandlers:last_words", "timeout": "2s"},
        },
        {"kill_grace": "1s"},
    )
    pidfile = tmp_path / "pid"
    killed = db.enqueue("killed", {"pidfile": str(pidfile)}, max_attempts=1)
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), what="the pid"))
    os.kill(pid, signal.SIGKILL)
    timed_out = db.enqueue("timed_out", max_attempts=1)
    assert "killed by SIGKILL" in db.wait_status(killed, "dead")["last_error"]
    assert "timed out" in db.wait_status(timed_out, "dead")["last_error"]
    for job_id in (killed, timed_out):
        [row] = stored(db, job_id)
        text = row["head"] + row["tail"]
        assert text.endswith("working 199\nthe last line before the kill\n"), text[-300:]
        shown = logs_cli(daemons, str(job_id))
        assert shown.stdout.endswith("the last line before the kill\n"), shown.stderr


def test_hostile_bytes_are_stored_and_shown_inert(db: Db, daemons: Daemons) -> None:
    d = daemons.start({"hostile": {"target": "loghandlers:hostile"}})
    job_id = db.enqueue("hostile")
    db.wait_status(job_id, "completed")
    [row] = stored(db, job_id)
    assert row["head"] == (
        "nul><nul\nbad utf8>\ufffd\ufffd<\nescape>\x1b[2J\x1b]0;pwned\x07<\rcr\ntab>\t<\n"
    )
    assert row["total_bytes"] == 10 + 13 + 26 + 7  # every byte written
    shown = logs_cli(daemons, str(job_id)).stdout
    assert "\x1b" not in shown and "\x07" not in shown and "\r" not in shown
    assert "escape>\\x1b[2J\\x1b]0;pwned\\x07<\\rcr\n" in shown
    assert "tab>\t<\n" in shown
    line = d.wait_log(rf"job {job_id} attempt 1 \| escape>")
    assert "\x1b" not in line and "\\x1b[2J" in line


def test_follow_prints_a_running_attempts_output_until_it_ends(db: Db, daemons: Daemons) -> None:
    daemons.start({"ticker": {"target": "loghandlers:ticker"}})
    job_id = db.enqueue("ticker", {"ticks": 8, "every": 0.4})
    follow = subprocess.Popen(
        [
            str(PGWORKERD),
            "--dsn",
            daemons.dsn,
            "--schema",
            daemons.schema,
            "logs",
            str(job_id),
            "-f",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = follow.communicate(timeout=60)
    finally:
        follow.kill()
    assert follow.returncode == 0, err
    assert out == "".join(f"tick {i}\n" for i in range(8))
    assert db.job(job_id)["status"] == "completed"


def test_follow_after_invalid_utf8_prints_each_line_once(db: Db, daemons: Daemons) -> None:
    """The audit's N12: after invalid UTF-8 and NULs, -f's byte offsets drifted into the
    stored (replaced) text: 25 tick lines printed for 20 written."""
    daemons.start({"ticker": {"target": "loghandlers:ticker"}})
    payload = {"ticks": 20, "every": 0.2, "hex": "fffe0000c328"}
    job_id = db.enqueue("ticker", payload)
    follow = subprocess.run(
        [
            str(PGWORKERD),
            "--dsn",
            daemons.dsn,
            "--schema",
            daemons.schema,
            "logs",
            str(job_id),
            "-f",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert follow.returncode == 0, follow.stderr
    ticks = "".join(f"tick {i}\n" for i in range(20))
    assert follow.stdout == "\ufffd\ufffd\ufffd(" + ticks, follow.stdout
