"""`pgworkerd demo`: a throwaway PostgreSQL, example jobs, and the daemon running them."""

from __future__ import annotations

import importlib.util
import logging
import os
import shlex
import shutil
import signal
import sys
import threading
from pathlib import Path

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


def pgworkerd_command() -> str:
    """How to run this very pgworkerd from a shell: `pgworkerd` when PATH finds this one,
    else its absolute path (a venv's `bin/` is seldom on PATH: the demo runs from
    `.venv/bin/pgworkerd`, and a bare `pgworkerd` would be "command not found")."""
    here = Path(sys.executable).with_name("pgworkerd")
    if not here.exists():
        here = Path(sys.argv[0])
    here = here.absolute()
    found = shutil.which("pgworkerd")
    if found is not None and Path(found).resolve() == here.resolve():
        return "pgworkerd"
    return shlex.quote(str(here))


def hints(dsn: str, flaky_id: int) -> list[str]:
    """What to try while the demo runs: commands that run as printed, from any directory."""
    cli = f"{pgworkerd_command()} --dsn {shlex.quote(dsn)}"
    # a note after the command is a shell comment, so the whole line still pastes
    # --no-login: a throwaway demo has no [web.users]; the dashboard then says loudly that
    # every local account can open it (README "Web dashboard" sets up a login).
    web = f"{cli} web --no-login"
    if importlib.util.find_spec("flask") is None or importlib.util.find_spec("waitress") is None:
        web += "   # needs the [web] extra: pip install 'pgworkerd[web]'"
    else:
        web += "   # demo only (any local user can open it); --port N if 8470 is taken"
    return [
        f"watch them with: {cli} jobs",
        f"why a job is where it is: {cli} explain {flaky_id}",
        f"what a job printed: {cli} logs {flaky_id}",
        f"the dashboard: {web}",
    ]


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
            specs = _example_jobs()
            ids = client.enqueue_many(conn, specs)
        log.info(
            "demo: PostgreSQL at %s; enqueued jobs %s; Ctrl-C drains and stops",
            dsn,
            ", ".join(map(str, ids)),
        )
        flaky_id = ids[[spec.handler for spec in specs].index("flaky")]
        for hint in hints(dsn, flaky_id):
            log.info("demo: %s", hint)
        if seconds is not None:
            timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGTERM))
            timer.daemon = True
            timer.start()
        return run_daemon(parse_config(DEMO_CONFIG, "<demo>"), dsn=dsn)
    finally:
        pg.cleanup()
        log.info("demo: throwaway PostgreSQL removed")
