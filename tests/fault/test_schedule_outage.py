"""Periodic jobs through a PostgreSQL crash: the daemon rides the outage out, the ticks
missed meanwhile give at most one catch-up run when it reconnects, and it goes on firing
one job per tick (a cluster of this module's own: the test crashes it)."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from daemon_harness import Daemons, wait_for

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate


@pytest.fixture
def crashable(tmp_path: Path) -> Iterator[tuple[LocalPostgres, Daemons]]:
    with LocalPostgres() as cluster:
        cluster.create_database("faults")
        dsn, schema = cluster.dsn("faults"), f"f_{uuid.uuid4().hex[:8]}"
        migrate(dsn, schema=schema)
        daemons = Daemons(tmp_path, dsn, schema)
        try:
            yield cluster, daemons
        finally:
            daemons.stop_all()


def ticks(dsn: str, schema: str) -> list[datetime]:
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=2) as c:
            rows = c.execute(f'SELECT tick FROM "{schema}".schedule_runs ORDER BY tick').fetchall()
    except psycopg.OperationalError:
        return []
    return [r[0] for r in rows]


def test_missed_ticks_during_an_outage_give_one_catch_up_run(
    crashable: tuple[LocalPostgres, Daemons], tmp_path: Path
) -> None:
    pg, daemons = crashable
    config = daemons.config({"work": {"target": "faulthandlers:work"}})
    config.write_text(
        config.read_text()
        + '\n[schedules.beat]\nevery = "1s"\nhandler = "work"\noverlap = "allow"\n'
        + f'payload = {{ file = "{tmp_path / "executions.jsonl"}" }}\n'
    )
    daemon = daemons.start(config)
    wait_for(lambda: len(ticks(daemons.dsn, daemons.schema)) >= 3, what="three ticks")
    crashed = datetime.now(UTC)
    pg.crash()
    daemon.wait_log("database connection lost")
    outage_end = datetime.now(UTC) + timedelta(seconds=6)
    while datetime.now(UTC) < outage_end:
        time.sleep(0.2)
    restarted = datetime.now(UTC)
    pg.start()
    daemon.wait_log("database connection restored")
    wait_for(
        lambda: len([t for t in ticks(daemons.dsn, daemons.schema) if t > restarted]) >= 3,
        what="ticks after the outage",
    )
    assert daemon.proc is not None and daemon.proc.poll() is None
    all_ticks = ticks(daemons.dsn, daemons.schema)
    # every tick from the crash until PostgreSQL was back was missed: one run at most
    missed = [t for t in all_ticks if crashed < t <= restarted]
    assert len(missed) <= 1, f"a burst of missed ticks after the outage: {missed}"
    after = [t for t in all_ticks if t > restarted]
    assert [int(t.timestamp()) for t in after] == list(
        range(int(after[0].timestamp()), int(after[0].timestamp()) + len(after))
    )
    daemon.send(signal.SIGTERM)
    assert daemon.wait_exit() == 0
