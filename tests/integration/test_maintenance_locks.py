"""The daemon's maintenance never stalls its loop behind a lock (daemon/statements.py
MAINTENANCE_LOCK_TIMEOUT_MS): with the jobs table locked by another session (a
migration, VACUUM FULL, an operator's LOCK TABLE), retention's prune and the scheduler's
fires fail after a bounded wait, are logged and are tried again, while the loop goes on
heartbeating. A real daemon, a real lock."""

from __future__ import annotations

import itertools
import time

import psycopg
from daemon_harness import Daemons, Db, wait_for

from pgworkerd.daemon.presence import HEARTBEAT_IDLE

# How long the longest lock wait of any other session has lasted so far (seconds).
LOCK_WAIT = (
    "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - query_start)), 0)"
    " FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
)


def test_retention_and_the_scheduler_do_not_stall_the_daemon_behind_a_table_lock(
    db: Db, daemons: Daemons, conn: psycopg.Connection, schema: str
) -> None:
    config = daemons.config(
        {"work": {"target": "jobhandlers:work"}},
        {"poll_interval": "60s"},
        tables={"retention": {"interval": "1s"}},
    )
    # A schedule every second into a queue this daemon does not serve: its fires touch
    # the jobs table, and no claim follows them.
    with open(config, "a") as f:
        f.write(
            '\n[schedules.tick]\nevery = "1s"\nhandler = "elsewhere"\nqueue = "elsewhere"\n'
            'overlap = "allow"\n'
        )
    daemon = daemons.start(config)
    fired = f"SELECT count(*) FROM \"{schema}\".jobs WHERE queue = 'elsewhere'"
    wait_for(lambda: conn.execute(fired).fetchone()[0] >= 1, what="the schedule's first fire")
    age = (
        f'SELECT extract(epoch FROM clock_timestamp() - heartbeat_at) FROM "{schema}".workers'
        " WHERE id = %s"
    )
    with psycopg.connect(daemons.dsn) as locker:  # one transaction, held open below
        locker.execute(f'LOCK TABLE "{schema}".jobs IN ACCESS EXCLUSIVE MODE')
        # Over more than HEARTBEAT_IDLE of fires and prunes meeting the lock, the last
        # heartbeat must never grow older than an idle daemon's, and it must heartbeat.
        # And no statement of the daemon waits for the lock much longer than the bound
        # (before: up to its statement_timeout, 10 s, the loop stalled meanwhile).
        ages, waits = [], []
        watch_until = time.monotonic() + HEARTBEAT_IDLE + 2
        while time.monotonic() < watch_until:
            ages.append(float(conn.execute(age, [daemon.worker_id]).fetchone()[0]))
            waits.append(float(conn.execute(LOCK_WAIT).fetchone()[0]))
            time.sleep(0.2)  # sampling a window, not waiting for a condition
        assert max(ages) < HEARTBEAT_IDLE + 3.5, f"the loop stalled: heartbeat ages {ages}"
        assert 0 < max(waits) < 3.0, f"lock waits {waits}"
        assert any(b < a for a, b in itertools.pairwise(ages)), f"no heartbeat: ages {ages}"
        locker.rollback()
    log = daemon.log()
    assert "firing schedule 'tick' failed" in log and "lock timeout" in log, log[-3000:]
    assert "pruning finished jobs, schedule runs and gone daemons failed" in log, log[-3000:]
    # the lock gone, both go on
    before = conn.execute(fired).fetchone()[0]
    wait_for(lambda: conn.execute(fired).fetchone()[0] > before, what="a fire after the lock")
