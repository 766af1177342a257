"""What schema 18 (roles for people) costs: the enqueue hot path with and without the
`jobs.enqueued_by DEFAULT session_user` column default, and one `pgworkerd.get` through
`job_get_v1` (as a role that reads the table, and as the enqueuer reading its own job)
against the plain primary-key SELECT it replaced.

    .venv/bin/python bench/people_roles_bench.py [--short]

A private LocalPostgres; the two enqueue variants run interleaved on the same table (the
default dropped and set again between runs, the table emptied before each), medians of the
rounds printed. A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable

import psycopg
from psycopg import sql

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.db import connect
from pgworkerd.queue.migrate import migrate
from pgworkerd.queue.queries import render

SCHEMA = "bench_roles"
BULK = 10_000
OLD_JOB_INFO = """SELECT id, queue, handler, status::text AS status, priority, attempts,
       max_attempts, snoozes, result, progress, last_error, cancel_requested, run_at,
       created_at, started_at, finished_at
  FROM @schema@.jobs WHERE id = %(id)s"""


def per_second(work: Callable[[], int], seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        done += work()
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="a quick run (CI)")
    args = parser.parse_args()
    rounds, seconds, calls = (2, 0.5, 300) if args.short else (7, 3.0, 3000)
    with LocalPostgres() as pg:
        pg.create_database("bench")
        owner = pg.dsn("bench")
        with psycopg.connect(owner, autocommit=True) as admin:
            migrate(owner, SCHEMA)
            for role in ("bench_enqueuer", "bench_reader"):
                admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
                pg.grant_login(role)
                admin.execute(
                    sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
                        sql.Identifier(SCHEMA), sql.Identifier(role)
                    )
                )
                admin.execute(
                    render(
                        f"GRANT EXECUTE ON FUNCTION @schema@.job_get_v1(bigint) TO {role}", SCHEMA
                    )
                )
            admin.execute(
                render(
                    "GRANT EXECUTE ON FUNCTION @schema@.enqueue(text, jsonb, text, integer,"
                    " timestamptz, interval, integer, text), @schema@.enqueue_many(jsonb)"
                    " TO bench_enqueuer; GRANT SELECT ON @schema@.jobs TO bench_reader",
                    SCHEMA,
                )
            )

            def set_default(on: bool) -> None:
                change = "SET DEFAULT session_user" if on else "DROP DEFAULT"
                admin.execute(
                    render(
                        f"TRUNCATE @schema@.jobs; ALTER TABLE @schema@.jobs "
                        f"ALTER COLUMN enqueued_by {change}",
                        SCHEMA,
                    )
                )
                admin.execute(render("VACUUM ANALYZE @schema@.jobs", SCHEMA))

            single: dict[bool, list[float]] = {True: [], False: []}
            many: dict[bool, list[float]] = {True: [], False: []}
            specs = [client.JobSpec("noop") for _ in range(BULK)]
            enq_dsn = pg.dsn("bench", user="bench_enqueuer")
            for n in range(rounds):
                for on in (True, False) if n % 2 == 0 else (False, True):
                    set_default(on)
                    with connect(enq_dsn, prepare=True) as c:
                        c.autocommit = True
                        single[on].append(
                            per_second(
                                lambda c=c: (client.enqueue(c, "noop", schema=SCHEMA), 1)[1],
                                seconds,
                            )
                        )
                        many[on].append(
                            per_second(
                                lambda c=c: len(client.enqueue_many(c, specs, schema=SCHEMA)),
                                seconds,
                            )
                        )
            set_default(True)

            # pgworkerd.get: as a reader (table privilege), as the enqueuer (its own job),
            # and the plain SELECT of before
            with psycopg.connect(enq_dsn, autocommit=True) as c:
                own = client.enqueue(c, "noop", schema=SCHEMA)
            reads: dict[str, float] = {}
            with (
                connect(pg.dsn("bench", user="bench_reader"), prepare=True) as r,
                connect(enq_dsn, prepare=True) as e,
            ):
                r.autocommit = e.autocommit = True
                old = render(OLD_JOB_INFO, SCHEMA)
                for name, run in (
                    ("plain SELECT (before, reader)", lambda: r.execute(old, {"id": own})),
                    ("get via job_get_v1, reader", lambda: client.get(r, own, schema=SCHEMA)),
                    ("get via job_get_v1, enqueuer", lambda: client.get(e, own, schema=SCHEMA)),
                ):
                    samples = []
                    for _ in range(rounds):
                        start = time.perf_counter()
                        for _ in range(calls):
                            run()
                        samples.append((time.perf_counter() - start) / calls * 1e6)
                    reads[name] = statistics.median(samples)

    print(
        f"machine: {platform.node()} {os.cpu_count()} CPUs, {platform.python_version()};"
        f" rounds {rounds} x {seconds:g} s, medians"
    )
    for label, data, unit in (
        ("enqueue single (jobs/s)", single, "{:,.0f}"),
        (f"enqueue_many {BULK:,}/call (jobs/s)", many, "{:,.0f}"),
    ):
        with_d, without = statistics.median(data[True]), statistics.median(data[False])
        print(
            f"  {label:36} with default {unit.format(with_d):>10}"
            f"   without {unit.format(without):>10}   ratio {with_d / without:.3f}"
        )
    for name, us in reads.items():
        print(f"  {name:36} {us:8.1f} us per call ({calls} calls x {rounds})")


if __name__ == "__main__":
    main()
