"""What the attempt history (schema 12) costs on the finish path, on one private server:
claim 10 + complete_many 10 with the history's triggers disabled (the finish path as it
was before schema 12) and enabled, and enabled plus the daemon's accounting statement
as the daemon runs it (attempt_account: the figures of every attempt finished in the last
second, one statement per second: daemon.accounting.UsageWriter), in short blocks
interleaved in rotating order, jobs/s medians.

    .venv/bin/python bench/attempts_bench.py [--reps N] [--seconds S]

A benchmark, not a test: nothing is asserted. The claim of a pending job does not fire
the triggers (their WHEN is false), so the claim itself is unchanged.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from pgworkerd import client
from pgworkerd.daemon.accounting import WRITE_INTERVAL
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue import attempts, lease
from pgworkerd.queue.db import connect
from pgworkerd.queue.migrate import migrate

# The queue calls the tests hold jobs with (tests/support/leasing.py: claim, complete).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
import leasing

SCHEMA = "pgworkerd"
TRIGGERS = ("jobs_attempt_record", "jobs_attempt_lease_expired")
SERVED = {"noop": lease.HandlerCapacity(lease_seconds=300, free=10)}


def set_triggers(conn: psycopg.Connection, enabled: bool) -> None:
    for name in TRIGGERS:
        verb = "ENABLE" if enabled else "DISABLE"
        conn.execute(f"ALTER TABLE {SCHEMA}.jobs {verb} TRIGGER {name}")  # type: ignore[arg-type]


def block(conn: psycopg.Connection, seconds: float, account: bool) -> float:
    """Jobs/s of claim 10 + complete_many 10 (+ attempt_account once a second) for `seconds`."""
    done, start = 0, time.perf_counter()
    usages: list[attempts.Usage] = []
    flushed = start
    while time.perf_counter() - start < seconds:
        jobs = leasing.claim(
            conn, "w1", queues=["default"], handlers=SERVED, limit=10, schema=SCHEMA
        )
        lease.complete_many(
            conn, "w1", [lease.Completion(j.id, j.token) for j in jobs], schema=SCHEMA
        )
        if account:
            usages += [attempts.Usage(j.id, j.token, 1.0, 0.5, 0.1, 100 << 20) for j in jobs]
            if time.perf_counter() - flushed >= WRITE_INTERVAL:
                attempts.account(conn, "w1", usages, schema=SCHEMA)
                usages, flushed = [], time.perf_counter()
        done += len(jobs)
    if usages:
        attempts.account(conn, "w1", usages, schema=SCHEMA)
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    with LocalPostgres() as pg:
        dsn = pg.dsn()
        migrate(dsn, SCHEMA)
        with psycopg.connect(dsn, autocommit=True) as admin:
            jobs = [client.JobSpec("noop") for _ in range(10_000)]
            for _ in range(int(args.reps * args.seconds * 3 * 3000 / 10_000) + 1):
                client.enqueue_many(admin, jobs, schema=SCHEMA)
            admin.execute(f"VACUUM ANALYZE {SCHEMA}.jobs")  # type: ignore[arg-type]
            conn = connect(dsn, prepare=True)
            variants: dict[str, tuple[bool, bool]] = {
                "triggers off (before schema 12)": (False, False),
                "triggers on": (True, False),
                "triggers on + attempt_account/s": (True, True),
            }
            rates: dict[str, list[float]] = {name: [] for name in variants}
            names = list(variants)
            for rep in range(args.reps):
                order = names[rep % 3 :] + names[: rep % 3]
                for name in order:
                    enabled, account = variants[name]
                    set_triggers(admin, enabled)
                    rates[name].append(block(conn, args.seconds, account))
            conn.close()
    base = statistics.median(rates[names[0]])
    report: Callable[[str], None] = print
    report(f"claim 10 + complete_many 10, jobs/s, {args.reps} x {args.seconds:g}s blocks each")
    for name in names:
        med = statistics.median(rates[name])
        spread = f"{min(rates[name]):,.0f}..{max(rates[name]):,.0f}"
        report(f"  {name:<34} median {med:8,.0f}  ({med / base:6.1%})  range {spread}")


if __name__ == "__main__":
    main()
