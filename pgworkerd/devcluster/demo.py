"""`pgworkerd demo`: a throwaway PostgreSQL, example jobs, and the daemon running them."""

from __future__ import annotations

import logging
import os
import signal
import threading

from pgworkerd import client
from pgworkerd.config import parse_config
from pgworkerd.daemon.loop import run_daemon
from pgworkerd.devcluster.localpg import LocalPostgres, LocalPostgresError
from pgworkerd.queue.db import connect
from pgworkerd.queue.migrate import migrate_conn

log = logging.getLogger("pgworkerd")

DEMO_CONFIG = """
[worker]
slots = 4
lease = "30s"
renew_interval = "5s"
drain_timeout = "10s"
kill_grace = "3s"
backoff = "1s"

[handlers.sleep_with_progress]
target = "pgworkerd.examples:sleep_with_progress"

[handlers.flaky]
target = "pgworkerd.examples:flaky"

[handlers.echo]
target = "pgworkerd.examples:echo"
"""


def _example_jobs() -> list[client.JobSpec]:
    specs = [
        client.JobSpec("sleep_with_progress", {"seconds": 2 + n, "steps": 4}) for n in range(4)
    ]
    specs += [
        client.JobSpec("flaky", {"failures": 1}, max_attempts=3),
        client.JobSpec("echo", {"hello": "world"}),
        client.JobSpec("echo", {"scheduled": True}, delay=5.0),
        client.JobSpec("sleep_with_progress", {"seconds": 1}, priority=-1),
    ]
    return specs


def run_demo(log_format: str, seconds: float | None) -> int:
    try:
        pg = LocalPostgres()
        pg.start()
    except LocalPostgresError as exc:
        log.error("cannot start a local PostgreSQL: %s", exc)
        return 4
    try:
        dsn = pg.dsn()
        with connect(dsn) as conn:
            migrate_conn(conn)
            ids = client.enqueue_many(conn, _example_jobs())
        log.info(
            "demo: PostgreSQL at %s; enqueued jobs %s; Ctrl-C drains and stops",
            dsn,
            ", ".join(map(str, ids)),
        )
        log.info("demo: watch them with: pgworkerd --dsn '%s' jobs", dsn)
        if seconds is not None:
            timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM))
            timer.daemon = True
            timer.start()
        return run_daemon(parse_config(DEMO_CONFIG, "<demo>"), dsn=dsn)
    finally:
        pg.cleanup()
        log.info("demo: throwaway PostgreSQL removed")
