"""Daemon logs: one JSON object per line with the job event fields, and never a password
(not in logs, not in process titles)."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from daemon_harness import DaemonProcess, Daemons, Db

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.ops.logs import _TextFormatter, under_journald

PGWORKERD = str(Path(sys.executable).with_name("pgworkerd"))


@pytest.mark.parametrize("job_events", [None, "all"])
def test_json_logs_carry_job_events_and_no_password(
    pg: LocalPostgres,
    test_db_dsn: str,
    schema: str,
    conn: psycopg.Connection,
    tmp_path: Path,
    job_events: str | None,
) -> None:
    """Every line is JSON and none holds the password. A job that goes well has its
    claimed, started and completed lines with [logging] job_events = "all"; by default
    (issue 26: three lines a job cost a daemon of short jobs a third of its time) it has
    none, and a job that fails still has its line."""
    config = tmp_path / "c.toml"
    config.write_text(
        ("" if job_events is None else f'[logging]\njob_events = "{job_events}"\n')
        + '[handlers.echo]\ntarget = "pgworkerd.examples:echo"\n'
        '[handlers.flaky]\ntarget = "pgworkerd.examples:flaky"\n'
    )
    # The cluster's real password, in the DSN as an operator might give it (it wins over
    # the passfile the DSN names).
    secret = pg.password
    dsn = f"{test_db_dsn} password={secret}"
    log = tmp_path / "daemon.log"
    daemon = subprocess.Popen(
        [
            PGWORKERD,
            "--dsn",
            dsn,
            "--schema",
            schema,
            "--config",
            str(config),
            "run",
            "--log-format",
            "json",
        ],
        stderr=log.open("w"),
        stdout=subprocess.DEVNULL,
    )
    try:
        ok = client.enqueue(conn, "echo", {"x": 1}, schema=schema)
        bad = client.enqueue(conn, "flaky", {"failures": 5}, max_attempts=1, schema=schema)
        deadline = time.monotonic() + 30
        while True:
            rows = conn.execute(
                f"SELECT count(*) FROM {schema}.jobs WHERE status IN ('completed', 'dead')"
            ).fetchone()
            if rows and rows[0] == 2:
                break
            assert daemon.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        title = Path(f"/proc/{daemon.pid}/cmdline").read_bytes().decode(errors="replace")
        assert title.startswith("pgworkerd: ")
        assert secret not in title
    finally:
        daemon.terminate()
        assert daemon.wait(30) == 0
    text = log.read_text()
    assert secret not in text
    entries = [json.loads(line) for line in text.splitlines()]  # every line is JSON
    assert all({"ts", "level", "msg"} <= e.keys() for e in entries)
    events = {(e.get("job_id"), e.get("event")) for e in entries}
    if job_events is None:
        assert (bad, "fail") in events
        routine = {"claimed", "started", "complete"}
        assert not [e for e in entries if e.get("event") in routine], entries
        return
    assert {(ok, "claimed"), (ok, "started"), (ok, "complete")} <= events
    assert {(bad, "claimed"), (bad, "started"), (bad, "fail")} <= events
    done = next(e for e in entries if e.get("job_id") == ok and e.get("event") == "complete")
    assert done["handler"] == "echo" and done["attempt"] == 1 and done["duration"] >= 0


# -- text logs are inert; journald gets priorities (issue 9) ----------------------------------


def _record(message: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("pgworkerd", level, __file__, 1, "%s", (message,), None)


def test_text_lines_escape_control_characters() -> None:
    hostile = "y\x1b[1A\x1b[2Kz\r2026-01-01T00:00:00.000Z INFO    fake\nline\x9b31m\u2028end"
    line = _TextFormatter().format(_record(hostile))
    assert len(line.splitlines()) == 1
    assert not re.search("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]", line), repr(line)
    assert line.endswith(
        "y\\x1b[1A\\x1b[2Kz\\r2026-01-01T00:00:00.000Z INFO    fake\\nline\\x9b31m\\u2028end"
    )


def test_a_jobs_error_text_cannot_forge_or_erase_log_lines(db: Db, daemons: Daemons) -> None:
    daemon = daemons.start({"raise_msg": {"target": "jobhandlers:raise_msg"}})
    job = db.enqueue("raise_msg", {"msg": "y\x1b[1A\x1b[2Kz\x07\x1b]0;PWNED\x07"}, max_attempts=1)
    db.wait_status(job, "dead")
    line = daemon.wait_log(rf"job {job} raise_msg attempt 1: failed")
    assert "\\x1b[1A\\x1b[2Kz\\x07\\x1b]0;PWNED\\x07" in line
    assert "\x1b" not in daemon.log() and "\x07" not in daemon.log()


def test_under_journald_lines_carry_priorities_and_no_timestamp(
    db: Db, daemons: Daemons, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """JOURNAL_STREAM names the stderr systemd connected to journald (device:inode);
    here it names the daemon's log file, so the daemon writes exactly what journald
    would read. (tests/acceptance/test_systemd.py shows `journalctl -p err` under a real
    systemd.)"""
    cfg = daemons.config({"raise_msg": {"target": "jobhandlers:raise_msg"}})
    log = tmp_path / "daemon-J.log"
    log.touch()
    st = log.stat()
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    daemon = DaemonProcess(daemons.dsn, daemons.schema, cfg, log, "J")
    daemons.started.append(daemon)
    daemon.start()
    job = db.enqueue("raise_msg", {"msg": "boom"}, max_attempts=1)
    db.wait_status(job, "dead")
    daemon.wait_log(rf"job {job} raise_msg attempt 1: failed")
    cfg.write_text(cfg.read_text() + "\n[bogus]\n")
    daemon.send(signal.SIGHUP)
    daemon.wait_log("reload failed")
    lines = daemon.log().splitlines()
    assert lines and all(re.match(r"<[2-7]>", ln) for ln in lines), lines
    assert not [ln for ln in lines if re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", ln)], lines
    by_text = {ln[3:]: ln[:3] for ln in lines}
    assert next(p for t, p in by_text.items() if "running as" in t) == "<6>"
    assert (
        next(p for t, p in by_text.items() if f"job {job} raise_msg attempt 1: failed" in t)
        == "<4>"
    )
    assert next(p for t, p in by_text.items() if "reload failed" in t) == "<3>"
    # A stderr redirected elsewhere keeps the variable but not the stream: timestamps.
    with log.open("a") as same, (tmp_path / "other.log").open("a") as other:
        assert under_journald(same) and not under_journald(other)
