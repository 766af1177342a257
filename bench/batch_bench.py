"""Batches benchmark (issue 24 item 2, schema 30): what a batch costs to enqueue, how soon
its callback starts after its last member, and what the batch's counter row costs
members that finish at once.

    .venv/bin/python bench/batch_bench.py [--short] [--json out.json]

1. enqueue: pgworkerd.batch() of M members (10,000) and its callback, one transaction,
   against pgworkerd.enqueue_many() of the same M jobs and against enqueue_many_v3 (what
   batch_enqueue inserts the members with), interleaved rounds, medians (the difference
   from v3 is the callback, the batch row and marking the members).
2. last member -> callback start: two daemons (4 slots each) run a batch of B members
   (--short 2,000; else 10,000; handler record_end, which notes when it returns) and its
   callback (record_start, which notes when it starts); the gap is the callback's start
   minus the latest member's return (time.time() on this host: the last completion's
   write, the trigger that releases the callback, the wake-up and the claim are in it).
3. finishing members at once: T connections (4) each finish their share of N jobs, one
   job per transaction (an UPDATE to completed, as any finisher writes it), for members
   of ONE batch (they serialise on its counter row for the length of each transaction)
   and for jobs in no batch, interleaved rounds: microseconds per finish, medians.

A private LocalPostgres with the settings below. A benchmark, not a test: figures are
reported, never asserted. The machine may be shared: quote the load with the figures.
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pgworkerd
from pgworkerd import client
from pgworkerd.queue.db import connect
from pgworkerd.queue.queries import query

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
import _measure  # noqa: E402  (bench/_measure.py)
from daemon_bench import Daemon, wait_for  # noqa: E402


def enqueue_time(dsn: str, members: int, rounds: int) -> dict[str, Any]:
    """Milliseconds to enqueue a batch of `members` vs enqueue_many of as many jobs."""
    batch_ms: list[float] = []
    plain_ms: list[float] = []
    v3_ms: list[float] = []
    with connect(dsn) as conn:
        for _ in range(rounds):
            for kind, out in (("batch", batch_ms), ("plain", plain_ms), ("v3", v3_ms)):
                conn.execute("TRUNCATE pgworkerd.jobs")
                specs = [client.JobSpec("noop", {"n": n}) for n in range(members)]
                start = time.perf_counter()
                if kind == "batch":
                    pgworkerd.batch(conn, specs, then=client.JobSpec("noop"))
                elif kind == "plain":
                    client.enqueue_many(conn, specs)
                else:  # the statement batch_enqueue inserts its members with
                    conn.execute(query("job_enqueue_many_v3"), {"jobs": client.jobs_json(specs)})
                out.append((time.perf_counter() - start) * 1000)
        conn.execute("TRUNCATE pgworkerd.jobs")
    return {
        "members": members,
        "rounds": rounds,
        "batch_ms": round(statistics.median(batch_ms), 1),
        "enqueue_many_ms": round(statistics.median(plain_ms), 1),
        "enqueue_many_v3_ms": round(statistics.median(v3_ms), 1),
    }


def callback_start(dsn: str, workdir: Path, members: int) -> dict[str, Any]:
    """The callback's start minus its last member's return, two daemons."""
    starts = workdir / "starts.log"
    starts.write_text("")
    os.environ["BENCH_STARTS"] = str(starts)
    handlers = {
        "record_start": "bench_handlers:record_start",
        "record_end": "bench_handlers:record_end",
    }
    settings = {"slots": 4, "warm_children": 4, "lease": "60s", "poll_interval": "5s"}
    daemons = []
    for tag in ("a", "b"):
        (workdir / tag).mkdir()
        daemons.append(Daemon(dsn, workdir / tag, settings, handlers))
    try:
        with connect(dsn) as conn:
            began = time.monotonic()
            ids = pgworkerd.batch(
                conn,
                [client.JobSpec("record_end") for _ in range(members)],
                then=client.JobSpec("record_start"),
            )
            stamps = wait_for(
                lambda: (s := _measure.stamps(starts)).get(str(ids.callback_id)) and s,
                60 + members * 0.1,
                "the callback",
                0.01,
            )
            elapsed = time.monotonic() - began
    finally:
        for d in daemons:
            d.stop()
    last_end = max(stamps[f"end:{m}"] for m in ids.member_ids)
    return {
        "members": members,
        "daemons": 2,
        "slots_each": 4,
        "last_member_to_callback_ms": round((stamps[str(ids.callback_id)] - last_end) * 1000, 1),
        "batch_wall_s": round(elapsed, 1),
    }


def finish_cost(dsn: str, jobs: int, threads: int, rounds: int) -> dict[str, Any]:
    """Microseconds per finish (one job per transaction, `threads` at once): members of
    one batch against jobs in no batch."""

    def finish_all(ids: list[int]) -> float:
        shares = [ids[k::threads] for k in range(threads)]

        def run(share: list[int]) -> None:
            with connect(dsn) as c:
                c.autocommit = True
                for job_id in share:
                    c.execute(
                        "UPDATE pgworkerd.jobs SET status = 'completed', finished_at = now()"
                        " WHERE id = %s",
                        (job_id,),
                    )

        workers = [threading.Thread(target=run, args=(s,)) for s in shares]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return (time.perf_counter() - start) * 1e6 / len(ids)

    member_us: list[float] = []
    plain_us: list[float] = []
    with connect(dsn) as conn:
        conn.autocommit = True
        for _ in range(rounds):
            conn.execute("TRUNCATE pgworkerd.jobs")
            ids = pgworkerd.batch(
                conn, [client.JobSpec("noop") for _ in range(jobs)], then=client.JobSpec("noop")
            )
            member_us.append(finish_all(ids.member_ids))
            conn.execute("TRUNCATE pgworkerd.jobs")
            plain = client.enqueue_many(conn, [client.JobSpec("noop") for _ in range(jobs)])
            plain_us.append(finish_all(plain))
        conn.execute("TRUNCATE pgworkerd.jobs")
    m, p = statistics.median(member_us), statistics.median(plain_us)
    return {
        "jobs": jobs,
        "threads": threads,
        "rounds": rounds,
        "us_per_finish_member": round(m, 1),
        "us_per_finish_no_batch": round(p, 1),
        "change_percent": round((m - p) / p * 100, 1),
    }


def main() -> None:
    args = _measure.arguments(__doc__).parse_args()
    results: dict[str, Any] = {
        "server_settings": _measure.SERVER_SETTINGS,
        "load": os.getloadavg(),
    }
    with _measure.server() as (dsn, tmp):
        _measure.headline("batch", args.short)
        e = enqueue_time(dsn, 10_000, 3 if args.short else 7)
        results["enqueue"] = e
        print(
            f"enqueue {e['members']:,} jobs: batch() {e['batch_ms']} ms, enqueue_many()"
            f" {e['enqueue_many_ms']} ms, enqueue_many_v3 {e['enqueue_many_v3_ms']} ms (medians"
            f" of {e['rounds']} interleaved rounds)",
            flush=True,
        )
        c = callback_start(dsn, tmp, 2_000 if args.short else 10_000)
        results["callback_start"] = c
        print(
            f"last member returns -> callback starts: {c['last_member_to_callback_ms']} ms"
            f" ({c['members']:,} members on 2 daemons x 4 slots, batch done in"
            f" {c['batch_wall_s']} s)",
            flush=True,
        )
        f = finish_cost(dsn, 1_000 if args.short else 5_000, 4, 3 if args.short else 7)
        results["finish_cost"] = f
        print(
            f"finish, {f['threads']} connections at once: {f['us_per_finish_member']} us per"
            f" member of one batch, {f['us_per_finish_no_batch']} us per job in no batch"
            f" ({f['change_percent']:+} %; medians of {f['rounds']} interleaved rounds of"
            f" {f['jobs']:,} jobs)",
            flush=True,
        )
        results["load_after"] = os.getloadavg()
    _measure.write_json(args.json, results)


if __name__ == "__main__":
    main()
