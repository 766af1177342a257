"""What the lock order of migration 0032 costs a finish (issue 24: no deadlock between two
completions covering members of two batches, or parents of shared children, in opposite
orders). A statement that finishes members or parents now notes each one's batch or its
children (the BEFORE trigger jobs_statement_locks_noted) and the first counting trigger
takes their rows in id order (statement_locks_take).

    .venv/bin/python bench/lock_order_bench.py [--short] [--json out.json]

One connection finishes N batch members (of B batches) and N parents (one waiting child
each) in one UPDATE, with the BEFORE trigger enabled and disabled (ALTER TABLE ... DISABLE
TRIGGER: the counting is the same, only the notes and the ordered locks are skipped),
interleaved rounds: microseconds per finished job, medians. A private LocalPostgres; a
benchmark, not a test: figures are reported, never asserted (quote the machine's load).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import pgworkerd
from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.db import connect
from pgworkerd.queue.migrate import migrate

SERVER_SETTINGS = {"fsync": "on", "synchronous_commit": "off", "shared_buffers": "256MB"}
TRIGGER = "jobs_statement_locks_noted"


def finish_us(conn: Any, kind: str, jobs: int, batches: int, noted: bool) -> float:
    """Microseconds per job of one UPDATE finishing `jobs` members or parents."""
    conn.execute("TRUNCATE pgworkerd.jobs")
    if kind == "members":
        ids: list[int] = []
        for _ in range(batches):
            made = pgworkerd.batch(
                conn,
                [client.JobSpec("noop") for _ in range(jobs // batches)],
                then=client.JobSpec("noop"),
            )
            ids += made.member_ids
    else:
        ids = client.enqueue_many(conn, [client.JobSpec("noop") for _ in range(jobs)])
        client.enqueue_many(conn, [client.JobSpec("noop", after=[p]) for p in ids])
    conn.execute(f"ALTER TABLE pgworkerd.jobs {'ENABLE' if noted else 'DISABLE'} TRIGGER {TRIGGER}")
    start = time.perf_counter()
    with conn.transaction():
        conn.execute(
            "UPDATE pgworkerd.jobs SET status = 'completed', finished_at = now() "
            "WHERE id = ANY(%s)",
            (ids,),
        )
    elapsed = (time.perf_counter() - start) * 1e6 / len(ids)
    conn.execute(f"ALTER TABLE pgworkerd.jobs ENABLE TRIGGER {TRIGGER}")
    return elapsed


def measure(dsn: str, jobs: int, batches: int, rounds: int) -> dict[str, Any]:
    found: dict[str, list[float]] = {}
    with connect(dsn) as conn:
        conn.autocommit = True
        for _ in range(rounds):
            for kind in ("members", "parents"):
                for noted in (True, False):
                    key = f"{kind}_{'ordered' if noted else 'unordered'}_us"
                    found.setdefault(key, []).append(finish_us(conn, kind, jobs, batches, noted))
        conn.execute("TRUNCATE pgworkerd.jobs")
    result: dict[str, Any] = {"jobs": jobs, "batches": batches, "rounds": rounds}
    for key, values in found.items():
        result[key] = round(statistics.median(values), 1)
    for kind in ("members", "parents"):
        ordered, unordered = result[f"{kind}_ordered_us"], result[f"{kind}_unordered_us"]
        result[f"{kind}_change_percent"] = round((ordered - unordered) / unordered * 100, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", action="store_true", help="fewer jobs and rounds")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    jobs, rounds = (1000, 3) if args.short else (10_000, 9)
    with LocalPostgres(settings=SERVER_SETTINGS) as pg:
        dsn = pg.dsn()
        migrate(dsn)
        result = measure(dsn, jobs, 10, rounds)
    result["machine"] = f"{platform.machine()} {os.cpu_count()} cpus"
    result["load"] = [round(x, 1) for x in os.getloadavg()]
    result["server_settings"] = SERVER_SETTINGS
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
