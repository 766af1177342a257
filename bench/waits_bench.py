"""Durable waits benchmark: a real `pgworkerd run` on a private PostgreSQL.

    .venv/bin/python bench/waits_bench.py [--short] [--json out.json]

Prints:
  - enqueue -> handler start on the same idle daemon set-up, for comparison
    (bench/daemon_bench.py's measurement);
  - signal -> handler start latency p50/p99 on an idle daemon: a job suspended by its
    handler (raise pgworkerd.WaitFor), then `pgworkerd.signal` (the clock starts after its
    COMMIT) until the resumed handler's first line; one job at a time;
  - the claim of 1 and 10 jobs that never waited: microseconds per claim (since schema
    31 the claim returns what woke a job itself; until then job_wakeups read it after
    each claim that returned jobs);
  - the timeout sweep (job_waits_expire) with nothing due, beside 0 and 100,000
    suspended jobs: microseconds per statement (its index holds suspended jobs only).
A benchmark, not a test: figures are printed, never asserted.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from daemon_bench import SERVER_SETTINGS, Daemon, _start_of, latency, wait_for

from pgworkerd import client, signals
from pgworkerd.queue import lease
from pgworkerd.queue.db import connect

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent / "tests" / "support"))
import _measure  # noqa: E402  (bench/_measure.py)
import leasing  # noqa: E402  (tests/support/leasing.py: claim)


def signal_latency(dsn: str, workdir: Path, samples: int) -> dict[str, Any]:
    starts = workdir / "starts.log"
    starts.write_text("")
    os.environ["BENCH_STARTS"] = str(starts)
    with connect(dsn) as conn:
        conn.execute("TRUNCATE pgworkerd.jobs")
        daemon = Daemon(
            dsn,
            workdir,
            {"slots": 4, "warm_children": 2, "lease": "60s", "poll_interval": "5s"},
            {"approver": "wait_handlers:wait_then_record"},
        )
        try:
            gaps = []
            for n in range(samples):
                job_id = client.enqueue(conn, "approver")
                wait_for(
                    lambda j=job_id: _status(conn, j) == "suspended", 10, f"job {n} waits", 0.001
                )
                time.sleep(0.05)  # idle again: the child back in the pool, the daemon asleep
                signals.signal(conn, job_id, "go")
                sent = time.time()
                line = wait_for(
                    functools.partial(_start_of, starts, job_id), 10, f"job {n} resumes", 0.0005
                )
                gaps.append((line - sent) * 1000)
        finally:
            daemon.stop()
    return _measure.summary(gaps)


def _status(conn: Any, job_id: int) -> str:
    [(status,)] = conn.execute(
        "SELECT status::text FROM pgworkerd.jobs WHERE id = %s", (job_id,)
    ).fetchall()
    return str(status)


def _micros(call: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e6)
    return round(statistics.median(times), 1)


def claim_cost(dsn: str, reps: int) -> dict[str, Any]:
    """The claim (job_claim: claim_jobs_v3, with what woke each job in its rows) of `n`
    fresh jobs that never waited, microseconds per claim."""
    out: dict[str, Any] = {}
    with connect(dsn) as conn:
        for n in (1, 10):
            conn.execute("TRUNCATE pgworkerd.jobs")
            client.enqueue_many(conn, [client.JobSpec("h") for _ in range(n * reps)])
            conn.execute("ANALYZE pgworkerd.jobs")
            served = {"h": lease.HandlerCapacity(60, n)}
            claims = []
            for _ in range(reps):
                t0 = time.perf_counter()
                leasing.claim(conn, "bench", queues=["default"], handlers=served, limit=n)
                claims.append((time.perf_counter() - t0) * 1e6)
            out[f"claim_{n}_us"] = round(statistics.median(claims), 1)
        conn.execute("TRUNCATE pgworkerd.jobs")
    return out


def sweep(dsn: str, reps: int, suspended: int) -> dict[str, Any]:
    """job_waits_expire with nothing due, with 0 and `suspended` suspended jobs."""
    out: dict[str, Any] = {}
    with connect(dsn) as conn:
        conn.execute("TRUNCATE pgworkerd.jobs")
        out["sweep_empty_us"] = _micros(lambda: lease.waits_expire(conn), reps)
        conn.execute(
            "INSERT INTO pgworkerd.jobs (handler, status, wait_for, wait_since, wait_until)"
            " SELECT 'h', 'suspended', 'go', now(), now() + interval '1 day'"
            " FROM generate_series(1, %s)",
            (suspended,),
        )
        conn.execute("ANALYZE pgworkerd.jobs")
        out[f"sweep_{suspended}_suspended_us"] = _micros(lambda: lease.waits_expire(conn), reps)
        conn.execute("TRUNCATE pgworkerd.jobs")
    return out


def main() -> None:
    args = _measure.arguments(__doc__).parse_args()
    samples = 30 if args.short else 300
    reps = 200 if args.short else 2000
    suspended = 10_000 if args.short else 100_000
    results: dict[str, Any] = {"load": os.getloadavg()}
    with _measure.server({**SERVER_SETTINGS, "shared_preload_libraries": ""}) as (dsn, tmp):
        _measure.headline("waits", args.short)
        r = signal_latency(dsn, tmp, samples)
        results["signal_latency"] = r
        print(
            f"signal -> handler start, idle daemon: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms,"
            f" max {r['max_ms']} ms ({r['samples']} samples)",
            flush=True,
        )
        r = latency(dsn, tmp, samples)  # the same path without a wait, same run
        results["enqueue_latency"] = r
        print(
            f"enqueue -> handler start, idle daemon (for comparison): p50 {r['p50_ms']} ms,"
            f" p99 {r['p99_ms']} ms ({r['samples']} samples)",
            flush=True,
        )
        r = claim_cost(dsn, reps)
        results["claim"] = r
        print(
            f"claim, jobs that never waited (what woke a job comes with it): {r['claim_1_us']}"
            f" us for 1 job, {r['claim_10_us']} us for 10",
            flush=True,
        )
        r = sweep(dsn, reps, suspended)
        results["sweep"] = r
        print(
            f"timeout sweep, nothing due: {r['sweep_empty_us']} us with no suspended job,"
            f" {r[f'sweep_{suspended}_suspended_us']} us with {suspended}",
            flush=True,
        )
    _measure.write_json(args.json, results)


if __name__ == "__main__":
    main()
