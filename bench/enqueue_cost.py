"""CPU per enqueued job, the client's and its PostgreSQL backend's: this checkout against a
baseline checkout, interleaved. A figure the machine's load distorts far less than jobs/s.

    .venv/bin/python bench/enqueue_cost.py [--baseline DIR] [--rounds N] [--short]

Each side installs its own schema (a fresh install, as queue_bench does) in one private
LocalPostgres with queue_bench's server settings. Each round runs, for each side in a
shuffled order, a fresh interpreter with that side's package first on sys.path: 300
warm-up enqueues, then `client.enqueue` N times (autocommit, prepared statements: as
queue_bench's single row), then `client.enqueue_many` of 10,000 specs K times. Per job it
reports the client's CPU (time.process_time) and its backend's (/proc/<pid>/stat utime +
stime; 10 ms ticks, hence many jobs per run). The table gives medians and the median of
the per-round ratios (this / baseline). Without --baseline the baseline is this checkout
again: the spread of identical code, which a real difference must exceed.

On a loaded machine CPU per job still rises with the load (shared caches, a busy core's
sibling): compare sides only within one run, where both see the same load. For figures
no load moves, count instructions instead (valgrind's cachegrind: docs/benchmarks/
2026-11-27.md has the commands). A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BULK = 10_000


def _backend_cpu(pid: int) -> float:
    """The CPU seconds (user + system) process `pid` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def child(dsn: str, schema: str, single: int, many: int) -> dict[str, float]:
    """One side's run, in a fresh interpreter whose pgworkerd is that side's."""
    from psycopg import sql

    from pgworkerd import client
    from pgworkerd.queue.db import connect

    figures: dict[str, float] = {}
    with connect(dsn, prepare=True) as conn:
        conn.execute(sql.SQL("TRUNCATE {}.jobs CASCADE").format(sql.Identifier(schema)))
        pid = conn.info.backend_pid
        for _ in range(300):  # prepared, caches warm
            client.enqueue(conn, "noop", {}, schema=schema)
        specs = [client.JobSpec("noop", {}) for _ in range(BULK)]
        for name, calls, jobs_per_call in (("single", single, 1), ("many", many, BULK)):
            cpu, backend = time.process_time(), _backend_cpu(pid)
            for _ in range(calls):
                if name == "single":
                    client.enqueue(conn, "noop", {}, schema=schema)
                else:
                    client.enqueue_many(conn, specs, schema=schema)
            jobs = calls * jobs_per_call
            figures[f"{name} client"] = (time.process_time() - cpu) * 1e6 / jobs
            figures[f"{name} backend"] = (_backend_cpu(pid) - backend) * 1e6 / jobs
    return figures


def _side(root: Path, *args: str) -> str:
    """Run this script's child mode with `root`'s package first on sys.path."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, __file__, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{root}: {' '.join(args[:3])} failed:\n{proc.stderr}")
    return proc.stdout


def _registry(dsn: str, schema: str, count: int) -> None:
    """`count` running daemons serving every handler of the default queue, heartbeating
    (an hour's interval: none goes silent during the run), listening on their own channel
    where the schema has them (40)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "INSERT INTO {}.workers (id, host, pid, version, queues, handlers, slots, state,"
                " heartbeat_interval) SELECT 'bench:' || i, 'bench', i, 'bench', '{{default}}',"
                " '{{noop}}', 8, 'running', '1 hour'"
                " FROM generate_series(1, %s) AS i"
            ).format(sql.Identifier(schema)),
            (count,),
        )
        has_channels = conn.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = %s"
            " AND table_name = 'workers' AND column_name = 'wake_channel'",
            (schema,),
        ).fetchone()
        if has_channels:
            named = "UPDATE {0}.workers SET wake_channel = {0}.worker_wake_channel_name(id)"
            conn.execute(sql.SQL(named).format(sql.Identifier(schema)))


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] in ("--child", "--install"):
        dsn, schema = sys.argv[2], sys.argv[3]
        if sys.argv[1] == "--install":
            from pgworkerd.queue.migrate import migrate

            migrate(dsn, schema)
        else:
            print(json.dumps(child(dsn, schema, int(sys.argv[4]), int(sys.argv[5]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--baseline", type=Path, default=REPO, help="the other checkout (default: this one)"
    )
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--single", type=int, default=2000, help="single enqueues per run")
    parser.add_argument("--many", type=int, default=3, help="enqueue_many calls per run")
    parser.add_argument("--short", action="store_true", help="2 rounds of small runs")
    parser.add_argument(
        "--registry",
        type=int,
        default=0,
        help="running daemons in each side's registry, serving the jobs' handler (schema "
        "40: each enqueue ranks them to choose whose wake-up it is)",
    )
    args = parser.parse_args(argv)
    if args.short:
        args.rounds, args.single, args.many = 2, 300, 1
    if not (args.baseline / "pgworkerd" / "client.py").is_file():
        parser.error(f"--baseline {args.baseline}: no pgworkerd checkout there")

    sys.path.insert(0, str(REPO / "bench"))
    from queue_bench import SERVER_SETTINGS

    from pgworkerd.devcluster.localpg import LocalPostgres

    sides = {"this": (REPO, "cost_this"), "baseline": (args.baseline.resolve(), "cost_base")}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in sides}
    load_before = os.getloadavg()[0]
    with LocalPostgres(settings=SERVER_SETTINGS) as pg:
        dsn = pg.dsn()
        for root, schema in sides.values():
            _side(root, "--install", dsn, schema)
            if args.registry:
                _registry(dsn, schema, args.registry)
        for _ in range(args.rounds):
            for name in random.sample(list(sides), len(sides)):
                root, schema = sides[name]
                out = _side(root, "--child", dsn, schema, str(args.single), str(args.many))
                samples[name].append(json.loads(out))
    print(
        f"CPU per job, µs: median of {args.rounds} rounds ({args.single} single enqueues, "
        f"{args.many} x enqueue_many of {BULK:,} per run); this = {REPO}, "
        f"baseline = {sides['baseline'][0]}; load average {load_before:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after, on {os.cpu_count()} CPUs"
    )
    print(f"{'':26} {'this':>8} {'baseline':>9}   this/baseline per round: median (min-max)")
    for figure in samples["this"][0]:
        this = [s[figure] for s in samples["this"]]
        base = [s[figure] for s in samples["baseline"]]
        ratios = [t / b for t, b in zip(this, base, strict=True) if b > 0]
        spread = (
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
            if ratios
            else "-"
        )
        print(
            f"{figure:26} {statistics.median(this):8.1f} {statistics.median(base):9.1f}   " + spread
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
