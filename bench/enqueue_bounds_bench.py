"""What schema 23 (enqueue bounds) costs the enqueue hot path: before the migration, after
it with no bound set (one look-up of the empty table per call), and after it with a bound
that binds the enqueuer (its bounds read once per call, every job checked against them).

    .venv/bin/python bench/enqueue_bounds_bench.py [--short]

A private LocalPostgres with three schemas side by side: one migrated up to 0022 only
(the functions of before), two fully migrated, one of them with a bound on the bench's
enqueuer role (priorities 0..100, dedupe keys under "bench:"; the jobs, at priority 5, pass).
Enqueued into as that role, through the Python client, which calls enqueue for one job
and enqueue_many for a batch. The variants alternate in small blocks (100 single
enqueues, one enqueue_many of 2,000, one SELECT calling enqueue 2,000 times: the server's
cost alone), rotating their order, so that the load of a shared
machine falls on all alike; medians of the blocks are printed. A benchmark, not a test:
nothing is asserted.
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
from pgworkerd.queue.migrate import migrate, migrations
from pgworkerd.queue.queries import render

BEFORE, EMPTY, BOUND = "before_0023", "no_bound", "bound"
SINGLE, BULK = 100, 2_000
SERVER_SIDE = "SELECT count(@schema@.enqueue('noop', priority => 5)) FROM generate_series(1, 2000)"
ROLE = "bench_enqueuer"


def migrate_before(admin: psycopg.Connection, schema: str) -> None:
    """The schema as it was before 0023: every earlier migration, applied as migrate does."""
    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    for migration in migrations():
        if migration.version < 23:
            admin.execute(render(migration.sql, schema))


def grant(admin: psycopg.Connection, schema: str) -> None:
    admin.execute(
        render(
            f"GRANT USAGE ON SCHEMA @schema@ TO {ROLE};"
            " GRANT EXECUTE ON FUNCTION @schema@.enqueue(text, jsonb, text, integer,"
            " timestamptz, interval, integer, text), @schema@.enqueue_many(jsonb)"
            f" TO {ROLE}",
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
    variants = (BEFORE, EMPTY, BOUND)
    with LocalPostgres() as pg:
        pg.create_database("bench")
        owner = pg.dsn("bench")
        migrate(owner, EMPTY)
        migrate(owner, BOUND)
        with psycopg.connect(owner, autocommit=True) as admin:
            migrate_before(admin, BEFORE)
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(ROLE)))
            pg.grant_login(ROLE)
            for schema in variants:
                grant(admin, schema)
            admin.execute(
                render(
                    "INSERT INTO @schema@.enqueue_bounds (role_name, priority_min, priority_max,"
                    " dedupe_key_prefix) VALUES (%s, 0, 100, 'bench:')",
                    BOUND,
                ),
                [ROLE],
            )
        specs = [client.JobSpec("noop", priority=5) for _ in range(BULK)]
        single: dict[str, list[float]] = {v: [] for v in variants}
        server: dict[str, list[float]] = {v: [] for v in variants}
        many: dict[str, list[float]] = {v: [] for v in variants}
        with connect(pg.dsn("bench", user=ROLE), prepare=True) as enq:
            enq.autocommit = True
            for n in range(rounds):
                order = variants[n % 3 :] + variants[: n % 3]
                for schema in order:

                    def one_by_one(schema: str = schema) -> None:
                        for _ in range(SINGLE):
                            client.enqueue(enq, "noop", priority=5, schema=schema)

                    single[schema].append(rate(SINGLE, one_by_one))
                    # the same calls inside one statement: the server's cost alone
                    in_server = render(SERVER_SIDE, schema)
                    server[schema].append(rate(BULK, lambda q=in_server: enq.execute(q)))
                    many[schema].append(
                        rate(BULK, lambda s=schema: client.enqueue_many(enq, specs, schema=s))
                    )

    print(
        f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()};"
        f" {rounds} rotating rounds, medians"
    )
    for label, data in (
        (f"enqueue single ({SINGLE}/block), jobs/s", single),
        (f"enqueue_many {BULK:,}/call, jobs/s", many),
        (f"enqueue x {BULK:,} in one SELECT, jobs/s", server),
    ):
        medians = {name: statistics.median(data[name]) for name in variants}
        figures = "   ".join(
            f"{name} {per_s:9,.0f} ({per_s / medians[BEFORE]:.3f})"
            for name, per_s in medians.items()
        )
        print(f"  {label:36} {figures}")


if __name__ == "__main__":
    main()
