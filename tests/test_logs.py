"""Daemon logs: one JSON object per line with the job event fields, and never a password
(not in logs, not in process titles)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psycopg

from pgworkerd import jobs
from pgworkerd.localpg import LocalPostgres

PGWORKERD = str(Path(sys.executable).with_name("pgworkerd"))


def test_json_logs_carry_job_events_and_no_password(
    pg: LocalPostgres, test_db_dsn: str, schema: str, conn: psycopg.Connection, tmp_path: Path
) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[handlers.echo]\ntarget = "pgworkerd.examples:echo"\n'
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
        ok = jobs.enqueue(conn, "echo", {"x": 1}, schema=schema)
        bad = jobs.enqueue(conn, "flaky", {"failures": 5}, max_attempts=1, schema=schema)
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
    assert {(ok, "claimed"), (ok, "started"), (ok, "complete")} <= events
    assert {(bad, "claimed"), (bad, "started"), (bad, "fail")} <= events
    done = next(e for e in entries if e.get("job_id") == ok and e.get("event") == "complete")
    assert done["handler"] == "echo" and done["attempt"] == 1 and done["duration"] >= 0
