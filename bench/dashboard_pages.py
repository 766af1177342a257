"""The dashboard's pages timed over HTTP on a big table: the same data as
bench/dashboard_queries.py (10 M finished jobs plus a backlog, running jobs and daemons),
served by `pgworkerd web` (waitress, in a thread of this process) and fetched with a
plain HTTP client; the median (min, max) of --reps fetches of each page, warm.

    .venv/bin/python bench/dashboard_pages.py [--short] [--rows N] [--reps 5]
                                              [--dsn DSN --keep SCHEMA]

A page costs its queries (dashboard_queries.py) plus rendering and HTTP. A benchmark, not
a test: nothing is asserted.
"""

from __future__ import annotations

import http.client
import statistics
import sys
import threading
import time

import psycopg
from dashboard_queries import announce, arguments, database, fill
from psycopg import sql

from pgworkerd.config import WebConfig
from pgworkerd.queue import attempts
from pgworkerd.queue.db import connect
from pgworkerd.web.server import build


def fetch(port: int, path: str) -> tuple[int, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path, headers={"Host": f"127.0.0.1:{port}"})
        response = conn.getresponse()
        return response.status, len(response.read())
    finally:
        conn.close()


def rollup(conn: psycopg.Connection, schema: str) -> None:
    """The charts' rollup as the daemons keep it: the real step (attempt_rollups_advance,
    timed) over the attempts of the last day, then every bucket of each grain the rollup
    keeps (a day of minutes and 5 minutes, 35 days of hours and 3 hours) for every
    handler (what a steady fleet leaves: the charts read (window / bucket) x
    handlers rows, whatever the number of jobs)."""
    s = sql.Identifier(schema)
    conn.execute(
        sql.SQL("UPDATE {}.attempt_rollup_cursor SET rolled_to = now() - interval '1 day'").format(
            s
        )
    )
    steps, start = 0, time.perf_counter()
    slowest = 0.0
    while True:
        began = time.perf_counter()
        step = attempts.rollup_advance(conn, schema)
        slowest = max(slowest, time.perf_counter() - began)
        steps += 1
        if step is None or not step.behind:
            break
    print(
        f"  rollup of the last day's attempts: {steps} step(s) of at most"
        f" {attempts.ROLLUP_MAX_ATTEMPTS:,} attempts in {time.perf_counter() - start:.2f} s"
        f" (slowest step {slowest * 1000:.0f} ms)"
    )
    conn.execute(
        sql.SQL(
            """INSERT INTO {}.attempt_rollups
                   (grain_seconds, bucket_start, handler, completed, failed, run_counts,
                    wait_counts)
               SELECT g.grain, h, 'h' || n, 100, 3, array_fill(6::bigint, ARRAY[17]),
                      array_fill(6::bigint, ARRAY[17])
                 FROM (VALUES (60, interval '1 day'), (300, interval '1 day'),
                              (3600, interval '35 days'), (10800, interval '35 days'))
                          AS g(grain, kept),
                      generate_series(date_bin(make_interval(secs => g.grain), now() - g.kept,
                                               timestamptz '2000-01-01 00:00:00+00'),
                                      now(), make_interval(secs => g.grain)) h,
                      generate_series(0, 49) n
               ON CONFLICT DO NOTHING"""
        ).format(s)
    )
    conn.execute(sql.SQL("VACUUM ANALYZE {}.attempt_rollups").format(s))


def main() -> int:
    args = arguments(__doc__.split("\n")[0]).parse_args()
    rows = announce(args)
    with database(args.dsn, args.keep) as (dsn, schema, filled):
        with connect(dsn) as conn:
            if not filled:
                fill(conn, schema, rows)
                rollup(conn, schema)
            [(newest, dead, running)] = conn.execute(
                sql.SQL(
                    "SELECT max(id), max(id) FILTER (WHERE status = 'dead'),"
                    " max(id) FILTER (WHERE status = 'running') FROM {}.jobs"
                ).format(sql.Identifier(schema))
            ).fetchall()
        dashboard = build(WebConfig(port=0, allow_anonymous=True), dsn, schema)
        thread = threading.Thread(target=dashboard.run, daemon=True)
        thread.start()
        port = int(dashboard.server.effective_port)
        pages = [
            "/",
            "/live/overview",
            "/jobs",
            "/jobs?status=dead",
            "/jobs?queue=q3&status=completed",
            "/jobs?handler=h7",
            f"/jobs?before={newest // 2}",
            "/jobs?text=bad+row",
            # the state tabs (issue 27): each list and its capped counts
            "/jobs?tab=due",
            "/jobs?tab=scheduled",
            "/jobs?tab=retrying",
            "/jobs?tab=completed",
            "/jobs?tab=dead&handler=h7",
            f"/jobs/{dead}",
            f"/live/jobs/{running}",
            # the job page's log tail: one poll from the start of the newest attempt
            f"/live/jobs/{running}/log",
            "/schedules",
            "/limits",
            "/paused",
            # the charts (issue 27): from the rollup, over each window
            "/charts?window=1h",
            "/charts?window=6h",
            "/charts?window=24h",
            "/charts?window=7d",
            # the jobs list oldest first (the same indexes read upwards)
            "/jobs?sort=oldest",
            "/jobs?status=completed&sort=oldest",
        ]
        try:
            for path in pages:
                status, size = fetch(port, path)  # warm
                times = []
                for _ in range(args.reps):
                    start = time.perf_counter()
                    fetch(port, path)
                    times.append((time.perf_counter() - start) * 1000)
                print(
                    f"  GET {path:<36} {status} {size:>7} B {statistics.median(times):9.1f} ms"
                    f"  ({min(times):.1f} .. {max(times):.1f})"
                )
                sys.stdout.flush()
        finally:
            dashboard.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
