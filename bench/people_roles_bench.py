"""What schema 18 (roles for people) costs: the enqueue hot path with and without the
`jobs.enqueued_by DEFAULT session_user` column default, and one `pgworkerd.get` through
`job_get_v1` (as a role that may read the table, and as the enqueuer reading its own job)
against the plain primary-key SELECT it replaced.

    .venv/bin/python bench/people_roles_bench.py [--short]

A private LocalPostgres with two schemas side by side, one with the default and one
without (DROP DEFAULT), enqueued into as the same enqueuer role. The variants alternate in
small blocks (100 single enqueues, one enqueue_many of 2,000; 200 reads), so that the load
of a shared machine falls on both alike; medians of the blocks are printed. A benchmark,
not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.db import connect
from pgworkerd.queue.migrate import migrate
from pgworkerd.queue.queries import render

WITH, WITHOUT = "with_default", "without_default"
SINGLE, BULK, READS = 100, 2_000, 200
OLD_JOB_INFO = """SELECT id, queue, handler, status::text AS status, priority, attempts,
       max_attempts, snoozes, result, progress, last_error, cancel_requested, run_at,
       created_at, started_at, finished_at
  FROM @schema@.jobs WHERE id = %(id)s"""


def grant(admin: psycopg.Connection, schema: str) -> None:
    admin.execute(
        render(
            "GRANT USAGE ON SCHEMA @schema@ TO bench_enqueuer, bench_reader;"
            " GRANT EXECUTE ON FUNCTION @schema@.enqueue(text, jsonb, text, integer,"
            " timestamptz, interval, integer, text), @schema@.enqueue_many(jsonb)"
            " TO bench_enqueuer; GRANT SELECT ON @schema@.jobs TO bench_reader",
            schema,
        )
    )


def rate(count: int, work: Callable[[], Any]) -> float:
    start = time.perf_counter()
    work()
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="a quick run (CI)")
    rounds = 6 if parser.parse_args().short else 40
    with LocalPostgres() as pg:
        pg.create_database("bench")
        owner = pg.dsn("bench")
        for schema in (WITH, WITHOUT):
            migrate(owner, schema)
        with psycopg.connect(owner, autocommit=True) as admin:
            for role in ("bench_enqueuer", "bench_reader"):
                admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
                pg.grant_login(role)
            for schema in (WITH, WITHOUT):
                grant(admin, schema)
            admin.execute(
                render("ALTER TABLE @schema@.jobs ALTER COLUMN enqueued_by DROP DEFAULT", WITHOUT)
            )
        specs = [client.JobSpec("noop") for _ in range(BULK)]
        single: dict[str, list[float]] = {WITH: [], WITHOUT: []}
        many: dict[str, list[float]] = {WITH: [], WITHOUT: []}
        with connect(pg.dsn("bench", user="bench_enqueuer"), prepare=True) as enq:
            enq.autocommit = True
            for n in range(rounds):
                for schema in (WITH, WITHOUT) if n % 2 == 0 else (WITHOUT, WITH):

                    def one_by_one(schema: str = schema) -> None:
                        for _ in range(SINGLE):
                            client.enqueue(enq, "noop", schema=schema)

                    single[schema].append(rate(SINGLE, one_by_one))
                    many[schema].append(
                        rate(BULK, lambda s=schema: client.enqueue_many(enq, specs, schema=s))
                    )
            own = client.enqueue(enq, "noop", schema=WITH)

            # pgworkerd.get as a reader (table privilege) and as the enqueuer (its own job),
            # and the plain SELECT of before, as the reader
            reads: dict[str, list[float]] = {"plain": [], "reader": [], "enqueuer": []}
            with connect(pg.dsn("bench", user="bench_reader"), prepare=True) as rd:
                rd.autocommit = True
                old = render(OLD_JOB_INFO, WITH)
                runs: dict[str, Callable[[], Any]] = {
                    "plain": lambda: rd.execute(old, {"id": own}).fetchall(),
                    "reader": lambda: client.get(rd, own, schema=WITH),
                    "enqueuer": lambda: client.get(enq, own, schema=WITH),
                }
                for _ in range(rounds):
                    for name, run in runs.items():

                        def repeat(run: Callable[[], Any] = run) -> None:
                            for _ in range(READS):
                                run()

                        reads[name].append(1e6 / rate(READS, repeat))

    print(
        f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()};"
        f" {rounds} alternating rounds, medians"
    )
    for label, data in (
        (f"enqueue single ({SINGLE}/block), jobs/s", single),
        (f"enqueue_many {BULK:,}/call, jobs/s", many),
    ):
        on, off = statistics.median(data[WITH]), statistics.median(data[WITHOUT])
        print(
            f"  {label:36} with default {on:10,.0f}   without {off:10,.0f}   ratio {on / off:.3f}"
        )
    labels = {
        "plain": "plain SELECT by id (before), reader",
        "reader": "get() via job_get_v1, reader",
        "enqueuer": "get() via job_get_v1, enqueuer",
    }
    for name, samples in reads.items():
        print(f"  {labels[name]:36} {statistics.median(samples):8.0f} us per call")


if __name__ == "__main__":
    main()
