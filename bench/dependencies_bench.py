"""Dependencies benchmark (issue 24, schema 27): how soon a child starts after its parent,
and what waiting jobs cost the claim.

    .venv/bin/python bench/dependencies_bench.py [--short] [--json out.json]

1. parent completes -> child starts, idle fleet: one daemon (4 slots, 2 warm children);
   a parent (handler record_end, which notes when it returns) and its child (record_start,
   which notes when it starts) are enqueued together, the child `waiting`; the gap is the
   child's start minus the parent's return (both time.time() on this host: the parent's
   completion write, the trigger that releases the child and the claim are inside it).
   Interleaved with the same number of enqueue -> start samples of a job without parents,
   the figure it is compared with (goal: p50 <= 10 ms like it).
2. claim speed with W waiting jobs (default 1,000,000; --short 200,000) against none, same
   run: the same K pending jobs each time, claimed 10 at a time and completed one by one
   through pgworkerd's statements (tests/support/leasing.py), jobs/s over S seconds; runs
   interleaved (none, waiting, none, waiting, ...), medians (goal: within 5 %).
3. completing a job without children with the resolving trigger (jobs_children_resolved)
   against the same with it disabled, interleaved: microseconds per complete statement
   (pgworkerd's job_complete, one job each), N jobs claimed beforehand each round. The
   before/after of whole claim+complete rows is bench/queue_bench.py on main and here.

A private LocalPostgres with the settings below. A benchmark, not a test: goals are
reported, never asserted. The machine may be shared: quote the load with the figures.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from pgworkerd import client
from pgworkerd.queue import lease
from pgworkerd.queue.db import connect

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "tests" / "support"))
import _measure  # noqa: E402  (bench/_measure.py)
import leasing  # noqa: E402  (tests/support/leasing.py: claim, complete)
from daemon_bench import Daemon, wait_for  # noqa: E402

HANDLER = "noop"
BATCH = 10


def child_start(dsn: str, workdir: Path, samples: int) -> dict[str, Any]:
    """Parent's return -> child's start, and enqueue -> start, interleaved."""
    starts = workdir / "starts.log"
    starts.write_text("")
    os.environ["BENCH_STARTS"] = str(starts)
    after_parent: list[float] = []
    after_enqueue: list[float] = []
    with connect(dsn) as conn:
        conn.execute("TRUNCATE pgworkerd.jobs")
        daemon = Daemon(
            dsn,
            workdir,
            {"slots": 4, "warm_children": 2, "lease": "60s", "poll_interval": "5s"},
            {
                "record_start": "bench_handlers:record_start",
                "record_end": "bench_handlers:record_end",
            },
        )
        try:
            for n in range(samples):
                parent = client.JobSpec("record_end")
                ids = client.enqueue_many(
                    conn, [parent, client.JobSpec("record_start", after=[parent])]
                )
                child = ids[1]
                stamps = wait_for(
                    lambda c=child: (s := _measure.stamps(starts)).get(str(c)) and s,
                    10,
                    f"child {n}",
                    0.0005,
                )
                after_parent.append((stamps[str(child)] - stamps[f"end:{ids[0]}"]) * 1000)
                time.sleep(0.05)  # idle again
                plain = client.enqueue(conn, "record_start")
                enqueued = time.time()
                stamp = wait_for(
                    lambda p=plain: _measure.stamps(starts).get(str(p)), 10, f"job {n}", 0.0005
                )
                after_enqueue.append((stamp - enqueued) * 1000)
                time.sleep(0.05)
        finally:
            daemon.stop()
    return {
        "parent_to_child": _measure.summary(after_parent),
        "enqueue_to_start": _measure.summary(after_enqueue),
    }


def refill(conn: psycopg.Connection, pending: int) -> None:
    """The same K pending jobs for every run; waiting jobs stay."""
    conn.execute("DELETE FROM pgworkerd.jobs WHERE status <> 'waiting'")
    conn.execute(
        "INSERT INTO pgworkerd.jobs (handler) SELECT %s FROM generate_series(1, %s)",
        (HANDLER, pending),
    )
    conn.execute("VACUUM ANALYZE pgworkerd.jobs")


def add_waiting(conn: psycopg.Connection, waiting: int) -> None:
    """W jobs waiting for a parent that never finishes (status waiting, counts set), as
    enqueue_many_v3 inserts them, written directly for speed."""
    conn.execute(
        "INSERT INTO pgworkerd.jobs (handler, status, parents_unfinished, parents_failed,"
        " on_parent_failure) SELECT %s, 'waiting', 1, 0, 'cancel'"
        " FROM generate_series(1, %s)",
        (HANDLER, waiting),
    )


def claim_rate(dsn: str, seconds: float) -> float:
    handlers = {HANDLER: lease.HandlerCapacity(lease_seconds=60, free=BATCH)}
    done = 0
    with connect(dsn) as conn:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            claimed = leasing.claim(
                conn, "bench", queues=["default"], handlers=handlers, limit=BATCH
            )
            for job in claimed:
                leasing.complete(conn, "bench", job.id, job.token)
            done += len(claimed)
            if len(claimed) < BATCH:
                raise RuntimeError("the queue ran dry: raise --pending")
        return done / (time.perf_counter() - start)


def claim_speed(
    dsn: str, waiting: int, pending: int, seconds: float, rounds: int
) -> dict[str, Any]:
    rates: dict[str, list[float]] = {"none": [], "waiting": []}
    with connect(dsn) as conn:
        conn.execute("TRUNCATE pgworkerd.jobs")
        for _ in range(rounds):
            for case in ("none", "waiting"):
                if case == "waiting":
                    add_waiting(conn, waiting)
                refill(conn, pending)
                rates[case].append(claim_rate(dsn, seconds))
                if case == "waiting":
                    conn.execute("DELETE FROM pgworkerd.jobs WHERE status = 'waiting'")
    none, with_waiting = (statistics.median(rates[c]) for c in ("none", "waiting"))
    return {
        "waiting_jobs": waiting,
        "pending_jobs": pending,
        "seconds_per_run": seconds,
        "rounds": rounds,
        "jobs_per_s_empty": round(none),
        "jobs_per_s_with_waiting": round(with_waiting),
        "change_percent": round((with_waiting - none) / none * 100, 1),
        "samples": {c: [round(r) for r in v] for c, v in rates.items()},
    }


def completion_cost(dsn: str, jobs: int, rounds: int) -> dict[str, Any]:
    """us per completion of a job without children, trigger on vs off (interleaved)."""
    handlers = {HANDLER: lease.HandlerCapacity(lease_seconds=600, free=jobs)}
    per_job: dict[str, list[float]] = {"on": [], "off": []}
    with connect(dsn) as conn:
        for _ in range(rounds):
            for case in ("on", "off"):
                conn.execute("TRUNCATE pgworkerd.jobs")
                conn.execute(
                    f"ALTER TABLE pgworkerd.jobs {'ENABLE' if case == 'on' else 'DISABLE'}"
                    " TRIGGER jobs_children_resolved"
                )
                refill(conn, jobs)
                held = leasing.claim(
                    conn, "bench", queues=["default"], handlers=handlers, limit=jobs
                )
                start = time.perf_counter()
                for job in held:
                    leasing.complete(conn, "bench", job.id, job.token)
                per_job[case].append((time.perf_counter() - start) / len(held) * 1e6)
        conn.execute("ALTER TABLE pgworkerd.jobs ENABLE TRIGGER jobs_children_resolved")
    on, off = (statistics.median(per_job[c]) for c in ("on", "off"))
    return {
        "jobs_per_round": jobs,
        "rounds": rounds,
        "us_per_complete_trigger_on": round(on, 1),
        "us_per_complete_trigger_off": round(off, 1),
        "change_percent": round((on - off) / off * 100, 1),
        "samples": {c: [round(v, 1) for v in s] for c, s in per_job.items()},
    }


def main() -> None:
    parser = _measure.arguments(__doc__)
    parser.add_argument("--waiting", type=int, help="waiting jobs (default 1e6; short 2e5)")
    args = parser.parse_args()
    samples = 30 if args.short else 300
    waiting = args.waiting or (200_000 if args.short else 1_000_000)
    seconds, rounds = (2.0, 2) if args.short else (8.0, 4)
    results: dict[str, Any] = {"load": os.getloadavg()}
    with _measure.server() as (dsn, tmp):
        _measure.headline("dependencies", args.short)
        r = child_start(dsn, tmp, samples)
        results["child_start"] = r
        for name, label in (
            ("parent_to_child", "parent returns -> child starts"),
            ("enqueue_to_start", "enqueue -> start (no parents)"),
        ):
            s = r[name]
            print(
                f"{label:<32} p50 {s['p50_ms']} ms, p99 {s['p99_ms']} ms, max {s['max_ms']}"
                f" ms ({s['samples']} samples, idle daemon)",
                flush=True,
            )
        c = claim_speed(dsn, waiting, 20_000 if args.short else 100_000, seconds, rounds)
        results["claim_speed"] = c
        print(
            f"claim+complete, batch {BATCH}: {c['jobs_per_s_empty']} jobs/s with no waiting job,"
            f" {c['jobs_per_s_with_waiting']} with {waiting:,} waiting ({c['change_percent']:+}"
            f" %; medians of {rounds} interleaved {seconds:.0f} s runs each)",
            flush=True,
        )
        k = completion_cost(dsn, 500 if args.short else 2000, 3 if args.short else 7)
        results["completion_cost"] = k
        print(
            f"complete, job without children: {k['us_per_complete_trigger_on']} us with the"
            f" resolving trigger, {k['us_per_complete_trigger_off']} us without"
            f" ({k['change_percent']:+} %; medians of {k['rounds']} interleaved rounds of"
            f" {k['jobs_per_round']} jobs)",
            flush=True,
        )
    _measure.write_json(args.json, results)


if __name__ == "__main__":
    main()
