"""Retention soak: table and index sizes under a constant load while the fleet prunes.

    .venv/bin/python bench/retention_soak.py [--short] [--minutes M] [--rate R]
                                             [--no-autovacuum-settings] [--json out.json]

Two real daemons (`pgworkerd run`, no-op handler, children reused) on a private
PostgreSQL; a client enqueues R jobs/s, one per transaction, for the whole run; the
daemons' [retention] keeps completed jobs `retention` seconds and looks every `interval`.
Every sample prints the jobs table's heap and index sizes, its rows (live and dead
tuples), and autovacuum's count. The jobs table gets the README's autovacuum settings
(--no-autovacuum-settings: the server defaults).

The soak checks its own invariants and exits 1 when one fails (tests/fault/
test_retention_soak.py runs --short and asserts only that): every job enqueued more than
`retention` + a margin ago is gone (completed and pruned), none younger than its
retention was deleted, none failed. Sizes are printed, never asserted: "flat" is for the
reader of the full run (the second half's growth is printed last).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate

BENCH_DIR = Path(__file__).resolve().parent
PGWORKERD = str(Path(sys.executable).with_name("pgworkerd"))
SCHEMA = "pgworkerd"
SERVER_SETTINGS = {
    "synchronous_commit": "off",  # the daemon's own claims and finishes commit durably
    "shared_buffers": "128MB",
    "autovacuum_naptime": "10s",
}
# README "Retention": what the jobs table gets on a busy queue.
AUTOVACUUM_SETTINGS = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
    "autovacuum_vacuum_insert_scale_factor": "0.01",
    "autovacuum_analyze_scale_factor": "0.02",
    "autovacuum_vacuum_cost_delay": "1",
}


def daemon_config(path: Path, retention: float, interval: float) -> Path:
    path.write_text(
        "[worker]\nslots = 4\nmax_jobs_per_child = 10000\nwarm_children = 4\n"
        'poll_interval = "1s"\nlease = "30s"\nrenew_interval = "5s"\n'
        '[handlers.noop]\ntarget = "bench_handlers:noop"\n'
        f'[retention]\ncompleted = "{retention}s"\ncancelled = "{retention}s"\n'
        f'dead = "{retention}s"\ninterval = "{interval}s"\nbatch = 500\n'
    )
    return path


def sizes(conn: psycopg.Connection) -> dict[str, Any]:
    row = conn.execute(
        """SELECT pg_relation_size(c.oid), pg_indexes_size(c.oid), s.n_live_tup,
                  s.n_dead_tup, s.autovacuum_count,
                  (SELECT count(*) FROM pgworkerd.jobs WHERE status <> 'completed')
             FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
            WHERE c.oid = 'pgworkerd.jobs'::regclass"""
    ).fetchone()
    assert row is not None
    keys = ("heap_bytes", "index_bytes", "live_rows", "dead_rows", "autovacuums", "unfinished")
    return dict(zip(keys, (int(v) for v in row), strict=True))


def existing_ids(conn: psycopg.Connection) -> set[int]:
    return {r[0] for r in conn.execute("SELECT id FROM pgworkerd.jobs")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="about a minute (CI)")
    parser.add_argument("--minutes", type=float, help="length of the load (default 60; short 1)")
    parser.add_argument("--rate", type=float, help="jobs enqueued per second (default 100)")
    parser.add_argument("--no-autovacuum-settings", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    minutes = args.minutes or (1.0 if args.short else 60.0)
    rate = args.rate or (50.0 if args.short else 100.0)
    retention = 10.0 if args.short else 120.0
    interval = 2.0 if args.short else 30.0
    sample_every = 5.0 if args.short else 60.0
    margin = retention + 4 * interval + 45.0  # pruned by then: retention, looks, a loaded box
    machine = f"{platform.node()} {os.cpu_count()} cpus Python {platform.python_version()}"
    failures: list[str] = []
    samples: list[dict[str, Any]] = []
    enqueued: dict[int, float] = {}  # id -> time.time() after its commit
    with (
        tempfile.TemporaryDirectory(prefix="pgworkerd-soak-") as tmp,
        LocalPostgres(settings=SERVER_SETTINGS) as pg,
    ):
        workdir = Path(tmp)
        dsn = pg.dsn()
        migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            if not args.no_autovacuum_settings:
                options = ", ".join(f"{k} = {v}" for k, v in AUTOVACUUM_SETTINGS.items())
                conn.execute(f"ALTER TABLE pgworkerd.jobs SET ({options})")
        config = daemon_config(workdir / "soak.toml", retention, interval)
        env = {**os.environ, "PYTHONPATH": str(BENCH_DIR)}
        daemons = [
            subprocess.Popen(
                [PGWORKERD, "--dsn", dsn, "--config", str(config), "run"],
                env=env,
                stdout=(workdir / f"daemon-{i}.log").open("wb"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            for i in range(2)
        ]
        print(
            f"# retention soak ({'short' if args.short else 'full'}) on {machine}: "
            f"{rate:g} jobs/s for {minutes:g} min, retention {retention:g}s, interval "
            f"{interval:g}s, autovacuum settings "
            f"{'server defaults' if args.no_autovacuum_settings else 'README'}",
            flush=True,
        )
        print(
            f"{'t_s':>6} {'heap_kB':>9} {'index_kB':>9} {'live':>7} {'dead':>7} "
            f"{'autovac':>7} {'unfinished':>10}",
            flush=True,
        )
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                start = time.monotonic()
                end = start + minutes * 60
                next_sample = start
                n = 0
                while (now := time.monotonic()) < end:
                    if now >= next_sample:
                        s = {"t_s": round(now - start), **sizes(conn)}
                        samples.append(s)
                        print(
                            f"{s['t_s']:>6} {s['heap_bytes'] // 1024:>9} "
                            f"{s['index_bytes'] // 1024:>9} {s['live_rows']:>7} "
                            f"{s['dead_rows']:>7} {s['autovacuums']:>7} "
                            f"{s['unfinished']:>10}",
                            flush=True,
                        )
                        next_sample += sample_every
                    job_id = client.enqueue(conn, "noop")
                    enqueued[job_id] = time.time()
                    n += 1
                    time.sleep(max(0.0, start + n / rate - time.monotonic()))
                # The last jobs finish and age past their retention, then get pruned.
                time.sleep(margin)
                checked_at = time.time()
                left = existing_ids(conn)
                s = {"t_s": round(time.monotonic() - start), **sizes(conn)}
                samples.append(s)
                statuses = dict(
                    conn.execute(
                        "SELECT status::text, count(*) FROM pgworkerd.jobs GROUP BY 1"
                    ).fetchall()
                )
        finally:
            for d in daemons:
                d.send_signal(signal.SIGTERM)
            for d in daemons:
                try:
                    d.wait(60)
                except subprocess.TimeoutExpired:
                    d.kill()
        logs = [(workdir / f"daemon-{i}.log").read_text() for i in range(2)]
    # Invariants: everything old enough is gone, nothing young was deleted, nothing failed.
    stale = [i for i in left if i in enqueued and enqueued[i] < checked_at - margin]
    if stale:
        failures.append(f"{len(stale)} job(s) older than {margin:g}s still there: {stale[:5]}")
    too_young = [i for i, t in enqueued.items() if i not in left and t > checked_at - retention]
    if too_young:
        failures.append(f"{len(too_young)} job(s) deleted before their retention")
    if set(statuses) - {"completed", "pending", "running"}:
        failures.append(f"jobs failed: {statuses}")
    pruned_by = [i for i, log in enumerate(logs) if "retention: deleted" in log]
    if not pruned_by:
        failures.append("no daemon logged a retention run")
    # The samples under load (the last one was taken after it), in halves: "flat" means
    # the second half's range is no higher than the first's once retention has kicked in.
    loaded = samples[:-1] if len(samples) > 2 else samples
    halves = (loaded[: len(loaded) // 2], loaded[len(loaded) // 2 :])
    ranges = {
        k: [[min(s[k] for s in h) // 1024, max(s[k] for s in h) // 1024] for h in halves]
        for k in ("heap_bytes", "index_bytes")
    }
    growth = {k: round(100.0 * (r[1][1] - r[0][1]) / max(1, r[0][1]), 1) for k, r in ranges.items()}
    heap, index = ranges["heap_bytes"], ranges["index_bytes"]
    print(
        f"heap kB min-max, first half {heap[0][0]}-{heap[0][1]}, second half "
        f"{heap[1][0]}-{heap[1][1]} (max {growth['heap_bytes']:+}%); indexes kB first half "
        f"{index[0][0]}-{index[0][1]}, second half {index[1][0]}-{index[1][1]} (max "
        f"{growth['index_bytes']:+}%); {len(enqueued)} jobs enqueued, {len(left)} left after "
        f"{margin:g}s ({statuses}); pruned by daemon(s) {pruned_by}",
        flush=True,
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine,
                    "samples": samples,
                    "growth_percent": growth,
                    "failures": failures,
                }
            )
        )
    for failure in failures:
        print(f"FAILED: {failure}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
