"""What one claim costs the server: claim_jobs_v3 (the daemon's claim) called as a daemon
calls it, on an empty queue and with one due job, optionally against another checkout's
schema in the same run; and what a claim of 40 costs from a backlog that came after the
session's plans were made on an empty queue (a daemon's first claims).

    .venv/bin/python bench/claim_cost.py [--short] [--baseline DIR]

Measured on the server alone (a DO block calling the function in a loop, so neither the
client nor the network nor the commit is in the figure). The claim of one job runs in a
subtransaction that is rolled back, so the same job is due at every call and no dead
rows pile up. --baseline DIR (a source tree holding its pgworkerd/ package, e.g. a
`git worktree add --detach /tmp/base REF`) migrates a second database with that tree's
schema; the two alternate round by round. The median over rounds is the figure; the
minimum is the one least disturbed by other work on the machine.

The backlog cases time claims from the client (each its own transaction, as a daemon's):
a new database and session per round and side, six claims on its empty jobs table
(vacuumed and analyzed, as autovacuum leaves a queue that has been empty, or never
vacuumed, as a new one), then 3,000 due jobs, then claims of 40.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psycopg
from _measure import headline, server_us_per_call

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate

# What the daemon sends for one handler, and for four with limits (lease.py
# _handler_object): the checks of the handler objects run on each.
ONE_HANDLER = [{"name": "h1", "lease_seconds": 60, "free": 8}]
FOUR_HANDLERS = [
    {"name": "h1", "lease_seconds": 60, "free": 8},
    {"name": "h2", "lease_seconds": 300, "free": 4, "max_attempts": 3, "queues": ["default"]},
    {"name": "h3", "lease_seconds": 60, "free": 2, "max_running": 10},
    {"name": "h4", "lease_seconds": 60, "free": 2, "max_running_per_key": 1},
]
CASES = {
    "empty queue, 1 handler": (ONE_HANDLER, False),
    "empty queue, 4 handlers": (FOUR_HANDLERS, False),
    "one due job, 1 handler": (ONE_HANDLER, True),
}


def per_call_us(conn: psycopg.Connection, handlers: list, with_job: bool, calls: int) -> float:
    claim = (
        "PERFORM * FROM pgworkerd.claim_jobs_v3('bench-worker', '{default}', 8, "
        + "'"
        + json.dumps(handlers).replace("'", "''")
        + "');"
    )
    if with_job:
        # rolled back: the job stays due, its new row versions an aborted
        # subtransaction's (pruned, not piled up in one long transaction)
        claim = (
            f"BEGIN {claim} RAISE EXCEPTION USING ERRCODE = 'P0003';"
            " EXCEPTION WHEN too_many_rows THEN NULL; END;"
        )
    return server_us_per_call(conn, claim, calls)


BACKLOG_CASES = {
    "a backlog after plans made on an empty, vacuumed queue": True,
    "a backlog after plans made on a new queue (never vacuumed)": False,
}


def backlog_claim_ms(dsn: str, vacuumed: bool, claims: int) -> float:
    """The median of `claims` claims of 40, in ms (see the module's docstring)."""
    handlers = json.dumps([{"name": "h1", "lease_seconds": 60, "free": 40}])
    claim = "SELECT count(*) FROM pgworkerd.claim_jobs_v3('bench-worker', '{default}', 40, %s)"
    with psycopg.connect(dsn, autocommit=True) as conn:
        if vacuumed:
            conn.execute("VACUUM ANALYZE pgworkerd.jobs")
        for _ in range(6):
            conn.execute(claim, (handlers,)).fetchone()
        conn.execute(
            "INSERT INTO pgworkerd.jobs (queue, handler, payload)"
            " SELECT 'default', 'h1', '{}' FROM generate_series(1, 3000)"
        )
        times = []
        for _ in range(claims):
            started = time.perf_counter()
            conn.execute(claim, (handlers,)).fetchone()
            times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def migrate_with(tree: Path, dsn: str) -> None:
    """The baseline tree's own migrate, in a process of its own (its pgworkerd package)."""
    code = "import sys; from pgworkerd.queue.migrate import migrate; migrate(sys.argv[1])"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, "-c", code, dsn], cwd=tree, env=env, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="a quick run (CI)")
    parser.add_argument("--baseline", type=Path, help="another checkout to measure too")
    args = parser.parse_args()
    calls, rounds = (100, 2) if args.short else (1000, 10)
    with LocalPostgres() as pg:
        sides = {"this checkout": "main"}
        pg.create_database("main")
        migrate(pg.dsn("main"))
        if args.baseline is not None:
            sides[f"--baseline {args.baseline}"] = "base"
            pg.create_database("base")
            migrate_with(args.baseline.resolve(), pg.dsn("base"))
        conns = {side: psycopg.connect(pg.dsn(db), autocommit=True) for side, db in sides.items()}
        for conn in conns.values():
            conn.execute(
                "INSERT INTO pgworkerd.jobs (queue, handler, payload, run_at)"
                " VALUES ('default', 'h1', '{}', now() + interval '1 day')"
            )
        samples: dict[tuple[str, str], list[float]] = {}
        for case, (handlers, with_job) in CASES.items():
            for conn in conns.values():  # the job is due for this case only
                conn.execute(
                    "UPDATE pgworkerd.jobs SET run_at = now()"
                    + (" - interval '1 s'" if with_job else " + interval '1 day'")
                )
            for n in range(rounds):
                order = list(conns.items())
                for side, conn in order if n % 2 == 0 else order[::-1]:
                    samples.setdefault((case, side), []).append(
                        per_call_us(conn, handlers, with_job, calls)
                    )
        for conn in conns.values():
            conn.close()
        trees = {
            "this checkout": None,
            **({f"--baseline {args.baseline}": args.baseline} if args.baseline else {}),
        }
        backlog: dict[tuple[str, str], list[float]] = {}
        for case, vacuumed in BACKLOG_CASES.items():
            for n in range(2 if args.short else 4):
                order = list(trees.items())
                for side, tree in order if n % 2 == 0 else order[::-1]:
                    database = f"backlog_{sum(map(len, backlog.values())) + 1}"
                    pg.create_database(database)
                    if tree is None:
                        migrate(pg.dsn(database))
                    else:
                        migrate_with(tree.resolve(), pg.dsn(database))
                    backlog.setdefault((case, side), []).append(
                        backlog_claim_ms(pg.dsn(database), vacuumed, 10 if args.short else 50)
                    )
    headline("claim cost", args.short, f"{rounds} rounds of {calls} calls, sides alternating")
    for case in CASES:
        print(case)
        medians = {}
        for side in sides:
            values = samples[(case, side)]
            medians[side] = statistics.median(values)
            print(
                f"  {side:<40} median {medians[side]:7.0f} us   min {min(values):7.0f} us per claim"
            )
        if len(sides) == 2:
            this, base = medians.values()
            print(f"  this checkout / baseline: {this / base:.2f}")
    for case in BACKLOG_CASES:
        print(f"{case}, claims of 40 from the client, median ms per claim (each round)")
        medians = {}
        for side in trees:
            values = backlog[(case, side)]
            medians[side] = statistics.median(values)
            rounds_text = ", ".join(f"{v:.1f}" for v in values)
            print(f"  {side:<40} median {medians[side]:7.1f} ms   ({rounds_text})")
        if len(trees) == 2:
            this, base = medians.values()
            print(f"  this checkout / baseline: {this / base:.2f}")


if __name__ == "__main__":
    main()
