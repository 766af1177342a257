"""What the fenced SECURITY DEFINER functions of schema 22 cost the daemon's hot path over
the column UPDATEs the daemon role ran before (issue 22, N4).

    .venv/bin/python bench/fenced_finish_bench.py [--short]

From the client, the way the daemon sends them: server-side prepared statements on one
autocommit connection (psycopg, prepare_threshold 0), each call its own transaction.
Per round, jobs are enqueued and claimed untimed, then finished (or renewed) one call
after another, timed; "before" runs the statement text of schema 21's queries.sql (a
direct UPDATE), "after" the statement of this release (a call of the fenced function).
The two alternate round by round; the minimum over rounds is the figure least disturbed
by other work on the machine, the median is shown beside it. The claim is timed too:
claim_jobs as SECURITY INVOKER (schema 21) and as SECURITY DEFINER (schema 22), switched
by ALTER FUNCTION between rounds on this private database.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue import lease
from pgworkerd.queue.migrate import migrate
from pgworkerd.queue.queries import query, render

# The queue calls the tests hold jobs with (tests/support/leasing.py: claim, complete).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
import leasing

SCHEMA = "pgworkerd"
DURABLE = "(SELECT pg_catalog.set_config('synchronous_commit', 'on', true)) IS NOT NULL"

# Schema 21's statements (queries.sql before this release), for the "before" side.
BEFORE = {
    "job_complete_one": f"""
UPDATE @schema@.jobs
   SET status = 'completed', result = %(result)s::jsonb,
       progress = coalesce(%(progress)s::jsonb, progress),
       locked_by = NULL, locked_until = NULL, cancel_requested = false,
       finished_at = now(), updated_at = now()
 WHERE id = %(id)s AND locked_by = %(worker)s AND lease_token = %(token)s
   AND status::text = 'running' AND {DURABLE}
RETURNING id""",
    "job_complete": f"""
WITH done AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[], %(results)s::jsonb[],
                         %(progress)s::jsonb[]) AS d(id, token, result, progress)
)
UPDATE @schema@.jobs j
   SET status = 'completed', result = d.result,
       progress = coalesce(d.progress, j.progress),
       locked_by = NULL, locked_until = NULL, cancel_requested = false,
       finished_at = now(), updated_at = now()
  FROM done d
 WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = d.id AND j.locked_by = %(worker)s
   AND j.lease_token = d.token AND j.status::text = 'running' AND {DURABLE}
RETURNING j.id""",
    "job_renew": f"""
WITH lease AS (
    SELECT * FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[],
                         %(lease_seconds)s::float8[], %(progress)s::jsonb[],
                         %(checkpoints)s::jsonb[])
             AS l(id, token, lease_seconds, progress, checkpoint)
), renewed AS (
    UPDATE @schema@.jobs j
       SET locked_until = now() + make_interval(secs => l.lease_seconds),
           progress = coalesce(l.progress, j.progress),
           checkpoint = coalesce(l.checkpoint, j.checkpoint),
           updated_at = now()
      FROM lease l
     WHERE j.id = ANY(%(ids)s::bigint[]) AND j.id = l.id AND j.lease_token = l.token
       AND j.locked_by = %(worker)s AND j.status::text = 'running' AND {DURABLE}
    RETURNING j.id, j.cancel_requested, j.locked_until
)
SELECT l.id, r.id IS NOT NULL AS renewed,
       coalesce(r.cancel_requested, false) AS cancel_requested, r.locked_until
  FROM lease l LEFT JOIN renewed r USING (id)""",
}


def statement(name: str, side: str) -> str:
    return render(BEFORE[name], SCHEMA) if side == "before" else query(name, SCHEMA)


def held_jobs(conn: psycopg.Connection, n: int) -> list[lease.ClaimedJob]:
    client.enqueue_many(conn, [client.JobSpec("h") for _ in range(n)], schema=SCHEMA)
    return leasing.claim(
        conn,
        "bench",
        queues=["default"],
        handlers={"h": lease.HandlerCapacity(300, n)},
        limit=n,
        schema=SCHEMA,
    )


def complete_one(conn: psycopg.Connection, side: str, jobs: list[lease.ClaimedJob]) -> float:
    text = statement("job_complete_one", side)
    start = time.perf_counter()
    for job in jobs:
        row = conn.execute(
            text,
            {"id": job.id, "worker": "bench", "token": job.token, "result": None, "progress": None},
            prepare=True,
        ).fetchone()
        assert row is not None
    return (time.perf_counter() - start) / len(jobs)


def complete_batches(conn: psycopg.Connection, side: str, jobs: list[lease.ClaimedJob]) -> float:
    text = statement("job_complete", side)
    batches = [jobs[i : i + 10] for i in range(0, len(jobs), 10)]
    start = time.perf_counter()
    for batch in batches:
        rows = conn.execute(
            text,
            {
                "ids": [j.id for j in batch],
                "tokens": [j.token for j in batch],
                "results": [None] * len(batch),
                "progress": [None] * len(batch),
                "worker": "bench",
            },
            prepare=True,
        ).fetchall()
        assert len(rows) == len(batch)
    return (time.perf_counter() - start) / len(batches)


def renew_all(conn: psycopg.Connection, side: str, jobs: list[lease.ClaimedJob]) -> float:
    text = statement("job_renew", side)
    params: dict[str, Any] = {
        "ids": [j.id for j in jobs],
        "tokens": [j.token for j in jobs],
        "lease_seconds": [300.0] * len(jobs),
        "progress": [None] * len(jobs),
        "checkpoints": [Jsonb({"at": 1})] * len(jobs),
        "worker": "bench",
    }
    calls = 5
    start = time.perf_counter()
    for _ in range(calls):
        rows = conn.execute(text, params, prepare=True).fetchall()
        assert all(r[1] for r in rows)
    return (time.perf_counter() - start) / calls


def claim_one(conn: psycopg.Connection, side: str, n: int) -> float:
    conn.execute(
        f"ALTER FUNCTION {SCHEMA}.claim_jobs(text, text[], text[], float8[], integer[],"
        " integer, integer[], jsonb, integer[], integer[]) "
        + ("SECURITY INVOKER" if side == "before" else "SECURITY DEFINER")
    )
    client.enqueue_many(conn, [client.JobSpec("h") for _ in range(n)], schema=SCHEMA)
    start = time.perf_counter()
    for _ in range(n):
        [_claimed] = leasing.claim(
            conn,
            "bench",
            queues=["default"],
            handlers={"h": lease.HandlerCapacity(300, 1)},
            limit=1,
            schema=SCHEMA,
        )
    elapsed = (time.perf_counter() - start) / n
    conn.execute(render("DELETE FROM @schema@.jobs", SCHEMA))
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="a quick run (CI)")
    args = parser.parse_args()
    jobs_per_round, rounds = (100, 4) if args.short else (500, 12)
    measures: dict[str, Callable[[psycopg.Connection, str], float]] = {
        "complete one job (job_complete_one)": lambda c, s: complete_one(
            c, s, held_jobs(c, jobs_per_round)
        ),
        "complete 10 jobs (job_complete)": lambda c, s: complete_batches(
            c, s, held_jobs(c, jobs_per_round)
        ),
        f"renew {jobs_per_round} leases (job_renew)": lambda c, s: renew_all(
            c, s, held_jobs(c, jobs_per_round)
        ),
        "claim one job (claim_jobs)": lambda c, s: claim_one(c, s, jobs_per_round),
    }
    samples = {(m, s): [] for m in measures for s in ("before", "after")}
    with LocalPostgres() as pg:
        pg.create_database("bench")
        migrate(pg.dsn("bench"))
        with psycopg.connect(pg.dsn("bench"), autocommit=True, prepare_threshold=0) as conn:
            for n in range(rounds):
                for name, measure in measures.items():
                    for side in ("before", "after") if n % 2 == 0 else ("after", "before"):
                        samples[name, side].append(measure(conn, side) * 1e6)
                conn.execute(render("DELETE FROM @schema@.jobs", SCHEMA))
    print(
        f"fenced functions (schema 22) against schema 21's UPDATEs: {rounds} rounds,"
        f" {jobs_per_round} jobs a round, prepared statements, one connection"
    )
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    for name in measures:
        before, after = samples[name, "before"], samples[name, "after"]
        print(
            f"  {name:<38} before min {min(before):7.0f} us (median"
            f" {statistics.median(before):7.0f})   after min {min(after):7.0f} us (median"
            f" {statistics.median(after):7.0f})   {min(after) - min(before):+6.0f} us per call"
        )


if __name__ == "__main__":
    main()
