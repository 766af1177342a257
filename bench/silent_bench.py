"""Silent-daemon benchmark: kill -9 of a busy daemon -> `explain` flags its job.

    .venv/bin/python bench/silent_bench.py [--short] [--runs N] [--json out.json]

Prints, on a private PostgreSQL with the real `pgworkerd run`:
  - kill -9 -> daemon_silent: for each run a fresh daemon (default settings: lease 60 s,
    renew_interval 10 s) takes one long job; it is killed with SIGKILL at a random moment
    of its busy heartbeat cycle, and `explain` (in process, the function the CLI calls)
    is polled every 20 ms until it reports daemon_silent. Seconds from the kill to the
    flag, min / median / max, against the goal 2 x HEARTBEAT_BUSY + 1 s; and the lease
    time left at the flag (what the flag saves over waiting for the lease).
  - the metric's read (views.silent_jobs, statement job_silent_count): ms per read with
    N running jobs held by D registry daemons, a tenth of them silent (synthetic rows,
    each daemon's in_flight listing its jobs, as its heartbeat writes it).
A benchmark, not a test: figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from daemon_bench import wait_for

from pgworkerd import client
from pgworkerd.daemon.presence import HEARTBEAT_BUSY
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue import explain, views
from pgworkerd.queue.migrate import migrate

PGWORKERD = str(Path(sys.executable).with_name("pgworkerd"))


def flagged(conn: psycopg.Connection, job_id: int) -> dict[str, Any] | None:
    found = explain.explain(conn, "pgworkerd", job_id)
    assert found is not None
    return next((r for r in found["reasons"] if r["code"] == "daemon_silent"), None)


def kill_to_flag(dsn: str, workdir: Path, run: int, rng: random.Random) -> dict[str, Any]:
    config = workdir / f"silent-{run}.toml"
    config.write_text(
        '[worker]\nslots = 1\n[handlers.sleep]\ntarget = "pgworkerd.examples:sleep_with_progress"\n'
    )
    log = workdir / f"daemon-{run}.log"
    proc = subprocess.Popen(
        [PGWORKERD, "--dsn", dsn, "--config", str(config), "run"],
        stdout=subprocess.DEVNULL,
        stderr=log.open("ab"),
        start_new_session=True,
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            wait_for(lambda: "running as" in log.read_text(), 60, "the daemon to start")
            job = client.enqueue(conn, "sleep", {"seconds": 3600, "steps": 3600}, queue="default")
            wait_for(
                lambda: conn.execute(
                    "SELECT 1 FROM pgworkerd.workers WHERE pid = %s AND in_flight = %s::bigint[]",
                    (proc.pid, [job]),
                ).fetchone(),
                30,
                "the busy heartbeat",
            )
            time.sleep(rng.uniform(0, HEARTBEAT_BUSY))  # anywhere in the heartbeat cycle
            killed = time.monotonic()
            proc.send_signal(signal.SIGKILL)
            reason = wait_for(lambda: flagged(conn, job), 120, "daemon_silent")
            took = time.monotonic() - killed
            return {
                "seconds": took,
                "lease_left_seconds": reason["facts"]["lease_left_seconds"],
                "heartbeat_interval_seconds": reason["facts"]["heartbeat_interval_seconds"],
            }
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            # the next run starts clean: the dead daemon's job and row out of the way
            conn.execute("DELETE FROM pgworkerd.jobs")
            conn.execute("DELETE FROM pgworkerd.workers")


def metric_read_cost(
    dsn: str, daemons: int, per_daemon: int, reads: int, silent_every: int = 10
) -> dict[str, Any]:
    """ms per views.silent_jobs with daemons x per_daemon running jobs, every
    `silent_every`th daemon silent (0: none, a healthy fleet)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO pgworkerd.workers (id, host, pid, version, slots, state, heartbeat_at,"
            " heartbeat_interval)"
            " SELECT 'd' || i, 'h' || i, i, 'bench', %(n)s, 'running',"
            "        now() - CASE WHEN i %% 10 = 0 THEN interval '1 minute' ELSE '0' END,"
            "        interval '5 seconds'"
            "   FROM generate_series(1, %(d)s) i",
            {"d": daemons, "n": per_daemon},
        )
        conn.execute(
            "INSERT INTO pgworkerd.jobs (handler, status, locked_by, locked_until, lease_token,"
            " attempts, started_at)"
            " SELECT 'sleep', 'running', 'd' || (i %% %(d)s + 1), now() + interval '1 hour', 1, 1,"
            "        now()"
            "   FROM generate_series(1, %(total)s) i",
            {"d": daemons, "total": daemons * per_daemon},
        )
        conn.execute(
            "UPDATE pgworkerd.workers w SET in_flight = held.ids"
            "  FROM (SELECT locked_by, array_agg(id) AS ids FROM pgworkerd.jobs"
            "         GROUP BY locked_by) held WHERE held.locked_by = w.id"
        )
        # finished history beside it: the read must not grow with it
        conn.execute(
            "INSERT INTO pgworkerd.jobs (handler, status, attempts, started_at, finished_at)"
            " SELECT 'sleep', 'completed', 1, now(), now() FROM generate_series(1, %(n)s)",
            {"n": 20 * daemons * per_daemon},
        )
        conn.execute("ANALYZE pgworkerd.jobs")
        conn.execute("ANALYZE pgworkerd.workers")
        # the live nine tenths have just heartbeated (the inserts took a while)
        conn.execute(
            "UPDATE pgworkerd.workers SET heartbeat_at = now()"
            " - CASE WHEN %(every)s > 0 AND pid %% %(every)s = 0 THEN interval '1 minute'"
            "        ELSE '0' END",
            {"every": silent_every},
        )
        counts = views.silent_jobs(conn, "pgworkerd")
        times = []
        for _ in range(reads):
            start = time.perf_counter()
            views.silent_jobs(conn, "pgworkerd")
            times.append((time.perf_counter() - start) * 1000)
        conn.execute("DELETE FROM pgworkerd.jobs")
        conn.execute("DELETE FROM pgworkerd.workers")
    return {
        "daemons": daemons,
        "running_jobs": daemons * per_daemon,
        "finished_jobs": 20 * daemons * per_daemon,
        "silent": counts,
        "ms_median": statistics.median(times),
        "ms_max": max(times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="few runs (CI)")
    parser.add_argument("--runs", type=int, help="kill -9 runs (default 8, short 2)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    runs = args.runs or (2 if args.short else 8)
    rng = random.Random(21)
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "settings": {
            "lease": "60s (default)",
            "renew_interval": "10s (default)",
            "HEARTBEAT_BUSY": HEARTBEAT_BUSY,
            "goal_seconds": 2 * HEARTBEAT_BUSY + 1,
        },
    }
    with tempfile.TemporaryDirectory(prefix="pgworkerd-silent-") as tmp, LocalPostgres() as pg:
        pg.create_database("bench")
        dsn = pg.dsn("bench")
        migrate(dsn)
        kills = [kill_to_flag(dsn, Path(tmp), run, rng) for run in range(runs)]
        seconds = [k["seconds"] for k in kills]
        results["kill_to_flag"] = {
            "runs": runs,
            "seconds": [round(s, 2) for s in seconds],
            "min": min(seconds),
            "median": statistics.median(seconds),
            "max": max(seconds),
            "lease_left_at_flag_median": statistics.median(k["lease_left_seconds"] for k in kills),
        }
        sizes = [(50, 8, 10)] if args.short else [(50, 8, 10), (500, 8, 10), (1000, 16, 10)]
        sizes += [(1000, 16, 0)]  # a healthy fleet: what every daemon pays every count
        results["metric_read"] = [
            metric_read_cost(dsn, d, n, 20 if args.short else 100, every) for d, n, every in sizes
        ]
    print(f"machine: {results['machine']}; settings: {results['settings']}")
    k = results["kill_to_flag"]
    print(
        f"kill -9 -> explain daemon_silent over {k['runs']} runs: min {k['min']:.2f} s,"
        f" median {k['median']:.2f} s, max {k['max']:.2f} s (goal <= "
        f"{results['settings']['goal_seconds']:g} s); lease left at the flag (median)"
        f" {k['lease_left_at_flag_median']:.1f} s; each run: {k['seconds']}"
    )
    for m in results["metric_read"]:
        print(
            f"metric read (job_silent_count): {m['running_jobs']} running jobs on"
            f" {m['daemons']} daemons (+{m['finished_jobs']} finished), {m['silent']}:"
            f" median {m['ms_median']:.2f} ms, max {m['ms_max']:.2f} ms"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
