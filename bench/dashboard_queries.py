"""What the read side costs on a big table: every function of pgworkerd/queue/views.py
(what `status`, `jobs`, `show`, `explain` and the dashboard run) and explain, timed on a
schema holding 10 M finished jobs plus a backlog, running jobs and a registry.

    .venv/bin/python bench/dashboard_queries.py [--short] [--rows N] [--reps 5]
                                                [--dsn DSN] [--json out.json]

Fills the jobs table with INSERT ... SELECT generate_series (97 % completed, 2 % dead,
1 % cancelled, finished over the last 30 days, 20 queues, 50 handlers; attempt rows for
the last day's), 10,000 pending jobs (a fifth scheduled later), 40 running ones and 5
daemons; builds the indexes of migration 0016 after the fill and times each build (what
the migration costs on such a table: it holds a SHARE lock on jobs meanwhile); then
VACUUM ANALYZE, and the median (min, max) of --reps runs of each call.

Without --dsn it starts a private server (shared_buffers 256MB); with --dsn it uses a
fresh schema there and drops it at the end. --short: 200,000 rows (the test suite runs
it, and asserts nothing about speed). A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
from psycopg import sql

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue import explain, views
from pgworkerd.queue.db import connect
from pgworkerd.queue.migrate import migrate

INDEXES_0016 = {
    "jobs_status_id_idx": "jobs (status, id)",
    "jobs_queue_status_id_idx": "jobs (queue, status, id)",
    "jobs_handler_status_id_idx": "jobs (handler, status, id)",
    "attempts_finished_at_idx": "attempts (finished_at)",
}


def fill(conn: psycopg.Connection, schema: str, rows: int) -> dict[str, float]:
    """The table as a busy fleet leaves it; returns seconds per step."""
    s = sql.Identifier(schema)
    took: dict[str, float] = {}

    def step(name: str, statement: sql.Composable, params: Any = None) -> None:
        start = time.perf_counter()
        conn.execute(statement, params)
        took[name] = time.perf_counter() - start

    for index in INDEXES_0016:
        conn.execute(sql.SQL("DROP INDEX {}.{}").format(s, sql.Identifier(index)))
    # Finished jobs, the newest last: job g finished (rows - g) * 30 days / rows ago.
    step(
        "insert finished jobs",
        sql.SQL(
            """INSERT INTO {}.jobs (queue, handler, payload, status, attempts, max_attempts,
                   run_at, created_at, started_at, finished_at, updated_at, last_error)
            SELECT 'q' || (g %% 20), 'h' || (g %% 50),
                   jsonb_build_object('user', 'user' || (g %% 10000), 'n', g, 'pad', 'x'),
                   CASE WHEN g %% 100 < 97 THEN 'completed'
                        WHEN g %% 100 < 99 THEN 'dead' ELSE 'cancelled' END::{}.job_status,
                   1, 5, t - interval '1 minute', t - interval '1 minute',
                   t - interval '10 seconds', t, t,
                   CASE WHEN g %% 100 BETWEEN 97 AND 98
                        THEN 'Traceback (most recent call last):' || chr(10)
                             || 'ValueError: bad row ' || g END
              FROM generate_series(1, %(rows)s) g,
                   LATERAL (SELECT now() - (%(rows)s - g) * interval '30 days' / %(rows)s
                                AS t) ts"""
        ).format(s, s),
        {"rows": rows},
    )
    step(
        "insert attempts of the last day",
        sql.SQL(
            """INSERT INTO {}.attempts (job_id, lease_token, attempt, worker, host,
                   started_at, finished_at, outcome, error, wall_seconds)
            SELECT id, 1, 1, 'bench-w' || (id % 5), 'bench-host', started_at, finished_at,
                   CASE status WHEN 'completed' THEN 'completed' WHEN 'dead' THEN 'dead'
                        ELSE 'cancelled' END, last_error, 10
              FROM {}.jobs WHERE finished_at > now() - interval '1 day'"""
        ).format(s, s),
    )
    step(
        "insert pending, running, daemons",
        sql.SQL(
            """INSERT INTO {}.jobs (queue, handler, payload, run_at, priority)
            SELECT 'q' || (g % 20), 'h' || (g % 50), jsonb_build_object('n', g),
                   now() + CASE WHEN g % 5 = 0 THEN interval '1 hour'
                                ELSE -g * interval '1 second' END, g % 3
              FROM generate_series(1, 10000) g;
            INSERT INTO {}.jobs (queue, handler, status, attempts, locked_by, locked_until,
                   started_at, lease_token, concurrency_key)
            SELECT 'q' || (g % 20), 'h' || (g % 50), 'running', 1, 'bench-w' || (g % 5),
                   now() + interval '5 minutes', now() - interval '1 minute', 1, 'k' || (g % 3)
              FROM generate_series(1, 40) g;
            INSERT INTO {}.workers (id, host, pid, version, queues, handlers, slots, state,
                   in_flight, handler_settings)
            SELECT 'bench-w' || g, 'bench-host', g, 'bench',
                   ARRAY(SELECT 'q' || q FROM generate_series(0, 19) q),
                   ARRAY(SELECT 'h' || h FROM generate_series(0, 49) h), 8, 'running',
                   ARRAY(SELECT id FROM {}.jobs WHERE status = 'running'
                          AND locked_by = 'bench-w' || g),
                   '{{"h1": {{"max_running": 2, "max_running_per_key": 1}}}}'
              FROM generate_series(0, 4) g"""
        ).format(s, s, s, s),
    )
    for index, target in INDEXES_0016.items():
        step(
            f"CREATE INDEX {index}",
            sql.SQL("CREATE INDEX {} ON {}.{}").format(sql.Identifier(index), s, sql.SQL(target)),
        )
    step("VACUUM ANALYZE", sql.SQL("VACUUM ANALYZE {}.jobs, {}.attempts").format(s, s))
    return took


def calls(conn: psycopg.Connection, schema: str) -> dict[str, Callable[[], Any]]:
    """Each call the dashboard or the CLI makes, by what it shows."""

    def one(q: str) -> int:
        row = conn.execute(sql.SQL(q).format(sql.Identifier(schema))).fetchone()
        assert row is not None
        return int(row[0])

    top = one("SELECT max(id) FROM {}.jobs")
    middle = top // 2
    dead = one("SELECT max(id) FROM {}.jobs WHERE status = 'dead'")
    pending = one("SELECT max(id) FROM {}.jobs WHERE status = 'pending'")
    rare_user = "user9999"
    return {
        "status (pgworkerd status: full counts)": lambda: views.status(conn, schema),
        "overview (finished in the last hour)": lambda: views.overview(conn, schema),
        "daemons": lambda: views.daemons(conn, schema),
        "queues (last hour)": lambda: views.queues(conn, schema),
        "throughput (60 minutes)": lambda: views.throughput(conn, schema),
        "limits": lambda: views.limits(conn, schema),
        "schedules": lambda: views.schedules(conn, schema),
        "paused": lambda: views.paused(conn, schema),
        "jobs page: newest": lambda: views.jobs_page(conn, schema),
        "jobs page: before the middle id": lambda: views.jobs_page(conn, schema, before=middle),
        "jobs page: after the middle id": lambda: views.jobs_page(conn, schema, after=middle),
        "jobs page: status dead": lambda: views.jobs_page(conn, schema, statuses=["dead"]),
        "jobs page: dead, before the middle": lambda: views.jobs_page(
            conn, schema, statuses=["dead"], before=middle
        ),
        "jobs page: queue q7": lambda: views.jobs_page(conn, schema, queue="q7"),
        "jobs page: handler h13, cancelled": lambda: views.jobs_page(
            conn, schema, handler="h13", statuses=["cancelled"]
        ),
        "jobs page: text in the payload (common)": lambda: views.jobs_page(
            conn, schema, text="user42"
        ),
        "jobs page: text in the error, dead": lambda: views.jobs_page(
            conn, schema, text="bad row", statuses=["dead"]
        ),
        f"jobs page: text, 50 matches of {rare_user} (scan)": lambda: _bounded(
            lambda: views.jobs_page(conn, schema, text=rare_user)
        ),
        "job (one, with attempts)": lambda: views.job(conn, schema, dead),
        "explain a pending job": lambda: explain.explain(conn, schema, pending),
        "explain a dead job": lambda: explain.explain(conn, schema, dead),
    }


def _bounded(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except views.TextSearchTimeout:
        return "timed out"  # reported by its time: the timeout, 5 s


def measure(call: Callable[[], Any], reps: int) -> dict[str, float]:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times)}


@contextlib.contextmanager
def database(dsn: str | None, keep: str | None) -> Iterator[tuple[str, str, bool]]:
    """(dsn, schema, filled): a fresh schema on `dsn`, dropped afterwards (kept with
    `keep`, or reused when `keep` names one that exists), or one on a private server."""
    schema = keep or f"bench_{uuid.uuid4().hex[:8]}"
    if dsn is None:
        with LocalPostgres(settings={"shared_buffers": "256MB", "max_wal_size": "4GB"}) as pg:
            migrate(pg.dsn(), schema=schema)
            yield pg.dsn(), schema, False
        return
    with psycopg.connect(dsn, autocommit=True) as c:
        found = c.execute("SELECT to_regnamespace(%s) IS NOT NULL", [schema]).fetchone()
    filled = bool(found and found[0])
    if not filled:
        migrate(dsn, schema=schema)
    try:
        yield dsn, schema, filled
    finally:
        if keep is None:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def arguments(description: str) -> argparse.ArgumentParser:
    """The options this benchmark and dashboard_pages.py share (the same data)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--short", action="store_true", help="200,000 finished jobs")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dsn", help="use a fresh schema there instead of a private server")
    parser.add_argument(
        "--keep", metavar="SCHEMA", help="with --dsn: fill this schema and keep it, or reuse it"
    )
    return parser


def announce(args: argparse.Namespace) -> int:
    """The number of finished jobs to fill, printed with the machine's load."""
    rows = 200_000 if args.short else int(args.rows)
    load = os.getloadavg()
    print(f"{rows:,} finished jobs; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
          f" on {os.cpu_count()} CPUs")  # fmt: skip
    return rows


def main() -> int:
    parser = arguments(__doc__.split("\n")[0])
    parser.add_argument("--json", dest="json_out", help="write the figures here too")
    args = parser.parse_args()
    rows = announce(args)
    with database(args.dsn, args.keep) as (dsn, schema, filled), connect(dsn) as conn:
        took = {} if filled else fill(conn, schema, rows)
        for name, seconds in took.items():
            print(f"  {name:<44} {seconds:8.1f} s")
        results = {}
        for name, call in calls(conn, schema).items():
            call()  # warm the cache: a dashboard refreshing reads warm pages
            results[name] = measure(call, args.reps)
            r = results[name]
            print(
                f"  {name:<52} {r['median_ms']:9.1f} ms  ({r['min_ms']:.1f} .. {r['max_ms']:.1f})"
            )
            sys.stdout.flush()
    if args.json_out:
        with open(args.json_out, "w") as out:
            figures = {"rows": rows, "load": os.getloadavg(), "fill_seconds": took}
            json.dump({**figures, "calls": results}, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
