"""What the finished-notification trigger (schema 9: NOTIFY '<schema>.finished' on every
final status) costs on the finish path, on one private server:

  1. bench/queue_bench.py's claim + complete rows, with the trigger disabled (the finish
     path as it was before schema 9) and enabled, interleaved (the order alternates per
     repetition), medians;
  2. single-job completions, each its own transaction (the daemon's job_complete_one
     shape), µs per completion, disabled vs enabled, interleaved;
  3. one 10,000-row completion in one transaction, ms, disabled vs enabled.

    .venv/bin/python bench/finish_notify_bench.py [--reps N] [--seconds S]

A benchmark, not a test: nothing is asserted. On a busy machine the queue_bench rows
swing by tens of percent between repetitions; 2 and 3 isolate the trigger.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
import queue_bench as qb

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate

SCHEMA = "pgworkerd"
TRIGGER = "jobs_notify_finished"
COMPLETE_ONE = (
    "UPDATE pgworkerd.jobs SET status = 'completed', locked_by = NULL, locked_until = NULL,"
    " finished_at = now(), updated_at = now() WHERE id = %s AND status::text = 'running'"
)


def set_trigger(conn: psycopg.Connection, enabled: bool) -> None:
    state = "ENABLE" if enabled else "DISABLE"
    conn.execute(f"ALTER TABLE {SCHEMA}.jobs {state} TRIGGER {TRIGGER}")


def fill_running(conn: psycopg.Connection, count: int) -> list[int]:
    conn.execute(f"TRUNCATE {SCHEMA}.jobs")
    conn.execute(
        f"INSERT INTO {SCHEMA}.jobs (handler, status, locked_by, locked_until, started_at,"
        " attempts) SELECT 'h', 'running', 'w', now() + interval '1 hour', now(), 1"
        " FROM generate_series(1, %s)",
        (count,),
    )
    conn.execute(f"VACUUM ANALYZE {SCHEMA}.jobs")
    return [r[0] for r in conn.execute(f"SELECT id FROM {SCHEMA}.jobs ORDER BY id")]


def orders(reps: int) -> list[tuple[bool, ...]]:
    return [(False, True) if rep % 2 == 0 else (True, False) for rep in range(reps)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=3)
    args = parser.parse_args()
    cfg = replace(qb.SHORT, seconds=args.seconds, reps=1)
    rows: dict[tuple[str, bool], list[float]] = {}
    single: dict[bool, list[float]] = {False: [], True: []}
    bulk: dict[bool, list[float]] = {False: [], True: []}
    with LocalPostgres(settings=qb.SERVER_SETTINGS) as pg:
        dsn = pg.dsn()
        migrate(dsn, SCHEMA)
        with tempfile.TemporaryDirectory() as tmp:
            bench = qb.Bench(dsn, SCHEMA, cfg, Path(tmp), True)
            try:
                for order in orders(args.reps):
                    for enabled in order:
                        set_trigger(bench.conn, enabled)
                        for name, batch, many in (
                            ("claim 1 + complete", 1, False),
                            ("claim 10 + 10 completes", 10, False),
                            ("claim 10 + complete_many", 10, True),
                        ):
                            row = bench.claim_row(batch, 1, many=many)
                            rows.setdefault((name, enabled), []).append(row.py_median or 0.0)
            finally:
                bench.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for order in orders(args.reps):
                for enabled in order:
                    ids = fill_running(conn, 3000)
                    set_trigger(conn, enabled)
                    started = time.perf_counter()
                    for job_id in ids:
                        conn.execute(COMPLETE_ONE, (job_id,), prepare=True)
                    single[enabled].append((time.perf_counter() - started) / len(ids) * 1e6)
                    fill_running(conn, 10_000)
                    set_trigger(conn, enabled)
                    started = time.perf_counter()
                    with conn.transaction():
                        conn.execute(
                            f"UPDATE {SCHEMA}.jobs SET status = 'completed',"
                            " locked_by = NULL, locked_until = NULL,"
                            " finished_at = now(), updated_at = now()"
                        )
                    bulk[enabled].append((time.perf_counter() - started) * 1e3)
            set_trigger(conn, True)
    med = statistics.median
    print(f"{'':30} {'trigger off':>12} {'trigger on':>12} {'change':>8}")
    for name in dict.fromkeys(n for n, _ in rows):
        off, on = med(rows[(name, False)]), med(rows[(name, True)])
        print(f"{name + ', jobs/s':30} {off:12,.0f} {on:12,.0f} {on / off - 1:+8.1%}")
    off, on = med(single[False]), med(single[True])
    print(f"{'one completion, µs':30} {off:12.1f} {on:12.1f} {on / off - 1:+8.1%}")
    off, on = med(bulk[False]), med(bulk[True])
    print(f"{'10,000 in one statement, ms':30} {off:12.1f} {on:12.1f} {on / off - 1:+8.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
