"""Retention's cost with the default mixed retentions: completed 7 days, dead 30 days.

    .venv/bin/python bench/retention_cost.py [--short] [--dead N] [--completed N]
                                             [--batch B] [--json out.json]

The steady state of a fleet on the defaults: every dead job of the last 30 days is kept,
and the completed jobs to delete are the ones that have just turned 7 days old, so every
kept dead job between 7 and 30 days old finished BEFORE them. A private PostgreSQL gets
`--dead` kept dead jobs (finished 8 to 29 days ago), `--completed` deletable completed
jobs (finished 7 to 7.5 days ago) and as many recent completed jobs (kept), on schema 20.
Then, once for prune_finished_v1 on the schema before 0020 (its partial indexes dropped:
jobs_finished_at_idx is all there is) and once for prune_finished_v2 on schema 20 (its
status written out, so the partial index jobs_completed_finished_at_idx serves it), each
on a fresh server:

- the plan of one batch's DELETE (the function's statement, generic plan as in
  PL/pgSQL), EXPLAIN (ANALYZE, BUFFERS): the index it reads, the rows it read and threw
  away (kept rows walked), its buffers and time;
- a whole drain of the deletable jobs by calls of the function of `--batch` rows, as a
  daemon runs them: calls, ms per call (median, max), and that every kept job is still
  there.

The script checks its own invariants (the right jobs deleted, none kept deleted, and a
v2 batch reads no kept row) and exits 1 when one fails; times and
buffers are printed, never asserted. tests/fault/test_retention_cost.py runs --short.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate

SERVER_SETTINGS = {"shared_buffers": "128MB", "autovacuum": "off"}  # no vacuum mid-run
DAY = 86400.0
RETENTIONS = {"completed": 7 * DAY, "cancelled": 7 * DAY, "dead": 30 * DAY}

# One batch of completed jobs as each version of the function runs it. v1 (0014) names the
# status by a PL/pgSQL variable (a parameter: no partial index can serve it, its generic
# plan as below); v2 (0020) writes it out, so jobs_completed_finished_at_idx serves it.
V1_BATCH = """DELETE FROM pgworkerd.jobs
 WHERE id IN (SELECT id FROM pgworkerd.jobs
               WHERE status = $1::pgworkerd.job_status
                 AND finished_at < now() - make_interval(secs => $2::float8)
               ORDER BY finished_at
               LIMIT $3::integer
               FOR UPDATE SKIP LOCKED)"""
V2_BATCH = """DELETE FROM pgworkerd.jobs
 WHERE id = ANY (ARRAY(
           SELECT id FROM pgworkerd.jobs
            WHERE status = 'completed'
              AND finished_at < now() - make_interval(secs => $2::float8)
            ORDER BY finished_at
            LIMIT $3::integer
            FOR UPDATE SKIP LOCKED))"""
VERSIONS = {
    "prune_finished_v1": (
        V1_BATCH,
        "SELECT deleted FROM pgworkerd.prune_finished_v1(%s, %s, %s, %s)",
    ),
    "prune_finished_v2": (
        V2_BATCH,
        "SELECT deleted FROM pgworkerd.prune_finished_v2(%s, %s, %s, NULL, NULL, %s)",
    ),
}


def fill(conn: psycopg.Connection, dead: int, completed: int) -> None:
    """Kept dead jobs (8..29 days), deletable completed (7..7.5 days), recent completed
    (0..6 days, kept); ids in finish order within each kind, kinds interleaved by id."""
    conn.execute(
        """INSERT INTO pgworkerd.jobs (handler, payload, status, attempts, finished_at,
                                       last_error)
           SELECT 'h', '{}', 'dead', 1,
                  now() - make_interval(secs => (29 - 21 * g::float8 / %(n)s) * 86400),
                  'failed'
             FROM generate_series(1, %(n)s) g""",
        {"n": dead},
    )
    for low, span in ((7.0, 0.5), (0.0, 6.0)):
        conn.execute(
            """INSERT INTO pgworkerd.jobs (handler, payload, status, attempts, finished_at,
                                           result)
               SELECT 'h', '{}', 'completed', 1,
                      now() - make_interval(secs => (%(low)s + %(span)s * (1 - g::float8
                                                     / %(n)s)) * 86400 + 60),
                      '{}'
                 FROM generate_series(1, %(n)s) g""",
            {"n": completed, "low": low, "span": span},
        )
    conn.execute("VACUUM ANALYZE pgworkerd.jobs")


def scans(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of the plan that reads the jobs table."""
    found = [plan] if plan.get("Relation Name") == "jobs" and "Index Name" in plan else []
    for child in plan.get("Plans", []):
        found += scans(child)
    return found


def explain_batch(conn: psycopg.Connection, statement: str, batch: int) -> dict[str, Any]:
    """One batch of completed jobs, EXPLAIN (ANALYZE, BUFFERS) with a generic plan, rolled
    back (the drain below deletes them for real)."""
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        # the status, the retention, the batch (v2's statement does not use the status)
        conn.execute(f"PREPARE batch (text, float8, integer) AS {statement}")
        # numbers only (a utility statement takes no parameters)
        seconds, rows = float(RETENTIONS["completed"]), int(batch)
        [(doc,)] = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
            f"EXECUTE batch('completed', {seconds!r}, {rows})"
        ).fetchall()
    conn.execute("DEALLOCATE ALL")
    top = doc[0]["Plan"]
    # the scan that finds the batch (not the delete's look-up by primary key)
    [scan] = [s for s in scans(top) if s["Index Name"] != "jobs_pkey"]
    return {
        "index": scan.get("Index Name"),
        "found": int(scan.get("Actual Rows", 0)),
        "kept_rows_walked": int(scan.get("Rows Removed by Filter", 0)),
        "scan_buffers": scan["Shared Hit Blocks"] + scan["Shared Read Blocks"],
        "buffers": top["Shared Hit Blocks"] + top["Shared Read Blocks"],
        "ms": doc[0]["Execution Time"],
    }


def drain(conn: psycopg.Connection, call: str, batch: int) -> dict[str, Any]:
    """Calls of the function until a short batch: what each call cost."""
    times: list[float] = []
    deleted = 0
    while True:
        start = time.perf_counter()
        [(n,)] = conn.execute(
            call, (RETENTIONS["completed"], RETENTIONS["cancelled"], RETENTIONS["dead"], batch)
        ).fetchall()
        times.append((time.perf_counter() - start) * 1000)
        deleted += n
        if n < batch:
            break
    return {
        "calls": len(times),
        "deleted": deleted,
        "ms_median": statistics.median(times),
        "ms_max": max(times),
        "ms_total": sum(times),
        "ms_first_tenth": statistics.median(times[: max(1, len(times) // 10)]),
        "ms_last_tenth": statistics.median(times[-max(1, len(times) // 10) :]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="small tables, seconds (CI)")
    parser.add_argument("--dead", type=int, help="kept dead jobs (default 200000; short 20000)")
    parser.add_argument(
        "--completed", type=int, help="deletable completed jobs (default 100000; short 5000)"
    )
    parser.add_argument("--batch", type=int, default=500, help="rows per call (default 500)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    dead = args.dead or (20_000 if args.short else 200_000)
    completed = args.completed or (5_000 if args.short else 100_000)
    machine = f"{platform.node()} {os.cpu_count()} cpus Python {platform.python_version()}"
    print(
        f"# retention cost ({'short' if args.short else 'full'}) on {machine}: "
        f"{dead} kept dead jobs (8-29 days), {completed} deletable completed (7-7.5 days), "
        f"{completed} recent completed; retentions completed 7d, dead 30d; batch {args.batch}",
        flush=True,
    )
    failures: list[str] = []
    results: dict[str, Any] = {}
    for version, (statement, call) in VERSIONS.items():
        with LocalPostgres(settings=SERVER_SETTINGS) as pg:
            dsn = pg.dsn()
            migrate(dsn)
            with psycopg.connect(dsn, autocommit=True) as conn:
                if version == "prune_finished_v1":  # the schema before 0020: no partial index
                    for status in ("completed", "cancelled", "dead"):
                        conn.execute(f"DROP INDEX pgworkerd.jobs_{status}_finished_at_idx")
                fill(conn, dead, completed)
                [(server,)] = conn.execute("SHOW server_version").fetchall()
                plan = explain_batch(conn, statement, args.batch)
                drained = drain(conn, call, args.batch)
                [(left_dead, left_done)] = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'dead'),"
                    "       count(*) FILTER (WHERE status = 'completed') FROM pgworkerd.jobs"
                ).fetchall()
        results[version] = {"plan": plan, "drain": drained, "postgresql": server}
        print(f"\n## {version}, PostgreSQL {server}")
        print(
            f"one batch (EXPLAIN ANALYZE, generic plan): index {plan['index']}, "
            f"{plan['found']} rows found, {plan['kept_rows_walked']} kept rows read and skipped, "
            f"{plan['scan_buffers']} buffers to find them, {plan['buffers']} in all "
            f"(with the delete and its triggers), {plan['ms']:.1f} ms"
        )
        print(
            f"drain: {drained['deleted']} deleted in {drained['calls']} calls, "
            f"{drained['ms_median']:.1f} ms median (first tenth {drained['ms_first_tenth']:.1f}, "
            f"last tenth {drained['ms_last_tenth']:.1f}), {drained['ms_max']:.1f} ms max, "
            f"{drained['ms_total'] / 1000:.2f} s in all",
            flush=True,
        )
        if (left_dead, left_done, drained["deleted"]) != (dead, completed, completed):
            failures.append(
                f"{version}: left {left_dead} dead (want {dead}), {left_done} completed (want "
                f"{completed}), deleted {drained['deleted']} (want {completed})"
            )
        if version == "prune_finished_v2" and (
            plan["index"] != "jobs_completed_finished_at_idx" or plan["kept_rows_walked"] != 0
        ):
            failures.append(f"{version}: the batch read {plan['index']}, walking kept rows")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    for failure in failures:
        print(f"FAIL: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
