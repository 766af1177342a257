"""What schema 24's random lease tokens cost the claim: the trigger that draws a token
(jobs_lease_token_drawn, gen_random_uuid) on every claimed row, against the same schema
with the trigger dropped (the counter of before).

    .venv/bin/python bench/lease_token_bench.py [--short]

A private LocalPostgres with two fully migrated schemas side by side, one without the
trigger. Each block enqueues 2,000 jobs, then claims them all with claim_jobs as a daemon
does (batches of 10, one handler), as the schema owner; the two variants alternate,
rotating their order, so that the load of a shared machine falls on both alike; medians
of the blocks are printed. A benchmark, not a test: nothing is asserted.

Measured 2026-11-27, this 2-CPU VM, PostgreSQL 15, 20 rounds: at load 1.7, counter 9,756
claims/s, drawn 8,581 (0.88x: ~14 us per claimed job, the trigger's call); at load 6.6,
5,197 and 5,181 (1.00x). A first version that drew through uuid text was 0.84x at load 8.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import psycopg

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue import lease
from pgworkerd.queue.migrate import migrate
from pgworkerd.queue.queries import render

# The queue calls the tests hold jobs with (tests/support/leasing.py: claim).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
import leasing

DRAWN, COUNTER = "drawn", "counter"
JOBS, BATCH = 2_000, 10


def block(conn: psycopg.Connection, schema: str) -> float:
    """Claims per second of one block (enqueue not timed)."""
    conn.execute(render("TRUNCATE @schema@.jobs", schema))
    client.enqueue_many(conn, [client.JobSpec("h") for _ in range(JOBS)], schema=schema)
    capacity = {"h": lease.HandlerCapacity(300, BATCH)}
    claimed = 0
    start = time.perf_counter()
    while claimed < JOBS:
        got = leasing.claim(
            conn, "bench:1:x", queues=["default"], handlers=capacity, limit=BATCH, schema=schema
        )
        if not got:
            break
        claimed += len(got)
    return claimed / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="a quick run (CI)")
    rounds = 3 if parser.parse_args().short else 20
    with LocalPostgres() as pg:
        pg.create_database("bench")
        dsn = pg.dsn("bench")
        migrate(dsn, DRAWN)
        migrate(dsn, COUNTER)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(render("DROP TRIGGER jobs_lease_token_drawn ON @schema@.jobs", COUNTER))
            samples: dict[str, list[float]] = {DRAWN: [], COUNTER: []}
            for n in range(rounds):
                order = (DRAWN, COUNTER) if n % 2 == 0 else (COUNTER, DRAWN)
                for variant in order:
                    samples[variant].append(block(conn, variant))
    print(
        f"lease_token_bench: {rounds} rounds of {JOBS} claims in batches of {BATCH};"
        f" {platform.python_version()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    base = statistics.median(samples[COUNTER])
    for variant in (COUNTER, DRAWN):
        median = statistics.median(samples[variant])
        print(f"  {variant:8} {median:8.0f} claims/s  ({median / base:.2f}x)")


if __name__ == "__main__":
    main()
