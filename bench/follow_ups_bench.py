"""What follow-ups and the lease in the handler's hands cost (issue 24, items 3 and 6).

    .venv/bin/python bench/follow_ups_bench.py [--short]

1. Completion, µs per job, the daemon's way (the queue.lease calls, server-side prepared
   statements on one autocommit connection, each call its own transaction), batches of
   10 held jobs:
   - job_complete (complete_jobs): a batch without follow-ups, what the daemon sends
     for one, unchanged by schema 29;
   - job_complete_with_follow_ups with no follow-ups (the function's own overhead: the
     daemon does not send it for such a batch);
   - job_complete_with_follow_ups with 1 and with 10 follow-ups per job (each through
     enqueue_many_v2's checks and a row of job_follow_ups).
   The sides alternate round by round; the minimum over rounds is the figure least
   disturbed by other work on the machine, the median is shown beside it.
2. job_lease_assert: µs per call (a transaction of the assert alone, committed).
3. The lock it takes: while an application's transaction holds the assert for HOLD
   seconds, how long the holder's renewal of the job's lease (one renew_leases
   statement, as the daemon sends) waits, under FOR KEY SHARE (job_lease_assert) and under
   FOR SHARE (the same row locked by a plain SELECT ... FOR SHARE, for comparison).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from pgworkerd import client
from pgworkerd.queue import lease
from pgworkerd.queue.queries import render

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
import _measure  # bench/_measure.py
import leasing

SCHEMA = "pgworkerd"
WORKER = "bench:1:abc"
BATCH = 10
HOLD = 0.5


def held_jobs(conn: psycopg.Connection[Any], n: int) -> list[lease.ClaimedJob]:
    client.enqueue_many(conn, [client.JobSpec("h") for _ in range(n)], schema=SCHEMA)
    held: list[lease.ClaimedJob] = []
    while len(held) < n:
        held += leasing.claim(
            conn,
            WORKER,
            queues=["default"],
            handlers={"h": lease.HandlerCapacity(600, n)},
            limit=n - len(held),
            schema=SCHEMA,
        )
    return held


def follow_ups(k: int) -> list[dict[str, Any]] | None:
    if k == 0:
        return None
    return [client.JobSpec("next", {"n": n}).as_json() for n in range(k)]


def complete(conn: psycopg.Connection[Any], jobs: list[lease.ClaimedJob], k: int | None) -> float:
    """Seconds per job to complete `jobs` in batches of BATCH: k None through job_complete,
    else through job_complete_with_follow_ups with k follow-ups per job."""
    specs = follow_ups(k or 0)
    start = time.perf_counter()
    for i in range(0, len(jobs), BATCH):
        done = [lease.Completion(j.id, j.token, None, None, specs) for j in jobs[i : i + BATCH]]
        if k is None:
            got = len(lease.complete_many(conn, WORKER, done, schema=SCHEMA))
        else:
            got = len(lease.complete_with_follow_ups(conn, WORKER, done, schema=SCHEMA))
        assert got == len(done)
    return (time.perf_counter() - start) / len(jobs)


def assert_calls(conn: psycopg.Connection[Any], jobs: list[lease.ClaimedJob]) -> float:
    text = render("SELECT @schema@.job_lease_assert(%s, %s)", SCHEMA)
    start = time.perf_counter()
    for j in jobs:
        conn.execute(text, (j.id, j.token), prepare=True)  # type: ignore[arg-type]
    return (time.perf_counter() - start) / len(jobs)


def renewal_wait(dsn: str, conn: psycopg.Connection[Any], lock: str) -> float:
    """Seconds the holder's renewal of a job waited while another transaction held the
    row `lock`ed ("key share": job_lease_assert; "share": SELECT ... FOR SHARE) for HOLD."""
    [job] = held_jobs(conn, 1)
    holding, release = threading.Event(), threading.Event()

    def application() -> None:
        with psycopg.connect(dsn) as app:
            if lock == "key share":
                app.execute(
                    render("SELECT @schema@.job_lease_assert(%s, %s)", SCHEMA),  # type: ignore[arg-type]
                    (job.id, job.token),
                )
            else:
                app.execute(
                    render("SELECT 1 FROM @schema@.jobs WHERE id = %s FOR SHARE", SCHEMA),  # type: ignore[arg-type]
                    (job.id,),
                )
            holding.set()
            release.wait(30)
            time.sleep(HOLD)

    t = threading.Thread(target=application)
    t.start()
    holding.wait(30)
    release.set()
    start = time.perf_counter()
    [renewed] = lease.renew(conn, WORKER, [lease.Lease(job.id, job.token, 600)], schema=SCHEMA)
    waited = time.perf_counter() - start
    t.join()
    assert renewed.renewed
    return waited


def main() -> None:
    args = _measure.arguments(__doc__, json_output=False).parse_args()
    jobs_per_round, rounds = (100, 4) if args.short else (500, 12)
    measures: dict[str, Callable[[psycopg.Connection[Any]], float]] = {
        "job_complete, no follow-ups (the daemon's)": lambda c: complete(
            c, held_jobs(c, jobs_per_round), None
        ),
        "job_complete_with_follow_ups, none": lambda c: complete(
            c, held_jobs(c, jobs_per_round), 0
        ),
        "job_complete_with_follow_ups, 1 per job": lambda c: complete(
            c, held_jobs(c, jobs_per_round), 1
        ),
        "job_complete_with_follow_ups, 10 per job": lambda c: complete(
            c, held_jobs(c, jobs_per_round), 10
        ),
        "job_lease_assert, one call": lambda c: assert_calls(c, held_jobs(c, jobs_per_round)),
    }
    samples: dict[str, list[float]] = {m: [] for m in measures}
    waits: dict[str, list[float]] = {"key share": [], "share": []}
    with _measure.server(settings={}) as (dsn, _):
        _measure.headline("follow-ups", args.short)
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
            for n in range(rounds):
                order = list(measures) if n % 2 == 0 else list(reversed(measures))
                for name in order:
                    samples[name].append(measures[name](conn) * 1e6)
                for lock in ("key share", "share") if n % 2 == 0 else ("share", "key share"):
                    waits[lock].append(renewal_wait(dsn, conn, lock) * 1e3)
                conn.execute(render("DELETE FROM @schema@.jobs", SCHEMA))  # type: ignore[arg-type]
    print(
        f"follow-ups and job_lease_assert (schema 29): {rounds} rounds, {jobs_per_round} jobs"
        f" a round, batches of {BATCH}, prepared statements, one connection"
    )
    print(f"load average at the end: {_measure.load()}")
    for name, values in samples.items():
        print(
            f"  {name:<44} min {min(values):7.1f} us per job (median"
            f" {statistics.median(values):7.1f})"
        )
    print(f"  the holder's renewal while an application's transaction holds the row {HOLD}s:")
    for lock, values in waits.items():
        print(
            f"    FOR {lock.upper():<9} waited min {min(values):7.1f} ms (median"
            f" {statistics.median(values):7.1f}, max {max(values):7.1f})"
        )


if __name__ == "__main__":
    main()
