"""An idle job's path through the database, timed from the client: one enqueue, a claim
of that one job, its completion; this checkout against a baseline checkout, interleaved,
and where the server spends it.

    .venv/bin/python bench/idle_path.py [--baseline DIR] [--rounds N] [--jobs N] [--statements]
                                        [--starts] [--start-jobs N]

Each side installs its own schema in one private LocalPostgres (`synchronous_commit =
on`). Each round runs, for each side in turn, a fresh interpreter with that side's
package first on sys.path: `client.enqueue` (autocommit), `lease.claim_checked` of one
job for one handler, `lease.complete_many` of it, N times on one connection each (the
first 20 left out: prepared statements, caches and plan choices settle), and prints the
medians of each step. --statements also loads pg_stat_statements (nested statements,
planning tracked) and prints each side's costliest statements with their calls, plans
and mean planning and execution times: a statement planned at every call (plans =
calls) is a custom plan chosen again and again (what migration 0042 fixed for the
claim). Without --baseline the baseline is this checkout again: the spread of identical
code, which a real difference must exceed.

--starts then times what an idle daemon adds: for each side in turn, each round, a
`pgworkerd run` of that side's code (1 slot, a warm child, the record_start handler of
bench/bench_handlers.py) in a database of its own, sent 20 jobs/s one per transaction; from
the client's clock after its COMMIT to the handler's first line (enqueue -> start), p50
and p90 per round and over all rounds. Rounds alternate the sides, so a machine whose
speed drifts (a VM's does) weighs on both alike. A benchmark, not a test: nothing is
asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WARM_UP = 20


def child(dsn: str, schema: str, jobs: int) -> dict[str, float]:
    """One side's run, in a fresh interpreter whose pgworkerd is that side's."""
    import psycopg

    from pgworkerd import client
    from pgworkerd.queue import lease
    from pgworkerd.queue.migrate import migrate_conn

    with psycopg.connect(dsn, autocommit=True) as conn:
        migrate_conn(conn, schema)
    capacity = {"h": lease.HandlerCapacity(lease_seconds=60.0, free=1)}
    steps: dict[str, list[float]] = {"enqueue": [], "claim": [], "complete": []}
    with (
        psycopg.connect(dsn, autocommit=True) as enqueuer,
        psycopg.connect(dsn, autocommit=True) as worker,
    ):
        for n in range(jobs + WARM_UP):
            t0 = time.perf_counter()
            client.enqueue(enqueuer, "h", {"n": n}, schema=schema)
            t1 = time.perf_counter()
            claimed, _refused = lease.claim_checked(
                worker, "bench-worker", queues=["default"], handlers=capacity, limit=1,
                schema=schema,
            )  # fmt: skip
            t2 = time.perf_counter()
            done = [lease.Completion(j.id, j.token) for j in claimed]
            lease.complete_many(worker, "bench-worker", done, schema=schema)
            t3 = time.perf_counter()
            if len(claimed) != 1:
                raise SystemExit(f"claimed {len(claimed)} jobs, not 1")
            if n >= WARM_UP:
                for name, took in (("enqueue", t1 - t0), ("claim", t2 - t1), ("complete", t3 - t2)):
                    steps[name].append(took)
    return {name: statistics.median(values) * 1000 for name, values in steps.items()}


START_RATE = 20.0  # jobs/s: each one finds the daemon idle


def enqueue_paced(dsn: str, jobs: int) -> None:
    """(in a fresh interpreter of one side) `jobs` jobs at START_RATE, one per
    transaction; prints {job id: the time after its COMMIT}."""
    import random

    from pgworkerd import client
    from pgworkerd.queue.db import connect

    enqueued = {}
    with connect(dsn) as conn:
        t0 = time.monotonic()
        for n in range(jobs):
            job_id = client.enqueue(conn, "record_start")
            enqueued[job_id] = time.time()
            # jitter: the enqueues do not line up with the daemon's timers
            pause = max(0.0, t0 + (n + 1) / START_RATE - time.monotonic())
            time.sleep(pause * random.uniform(0.8, 1.2))
    print(json.dumps(enqueued))


def starts(dsn: str, code: Path, workdir: Path, jobs: int) -> list[float]:
    """One side's round: its daemon in a database of its own; enqueue -> start, ms."""
    import signal

    import psycopg

    database = f"starts_{len(list(workdir.glob('*.log')))}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    side_dsn = psycopg.conninfo.make_conninfo(dsn, dbname=database)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(code), str(REPO / "bench")])}
    migrate = "import sys; from pgworkerd.queue.migrate import migrate; migrate(sys.argv[1])"
    subprocess.run([sys.executable, "-c", migrate, side_dsn], env=env, check=True)
    config = workdir / "starts.toml"
    config.write_text(
        "[worker]\nslots = 1\nwarm_children = 1\n"
        '[handlers.record_start]\ntarget = "bench_handlers:record_start"\n'
    )
    stamps = workdir / f"{database}.starts"
    stamps.write_text("")
    log = workdir / f"{database}.log"
    env["BENCH_STARTS"] = str(stamps)
    run = "import sys; from pgworkerd.cli import main; sys.exit(main())"
    with log.open("ab") as err:
        daemon = subprocess.Popen(
            [sys.executable, "-c", run, "--dsn", side_dsn, "--config", str(config), "run"],
            env=env, stdout=subprocess.DEVNULL, stderr=err, cwd=workdir,
        )  # fmt: skip
    try:
        give_up = time.monotonic() + 120
        while "running as" not in log.read_text():
            if daemon.poll() is not None or time.monotonic() > give_up:
                raise SystemExit(f"the daemon of {code} did not start: {log.read_text()}")
            time.sleep(0.05)
        time.sleep(1.0)  # its warm child is up
        out = subprocess.run(
            [sys.executable, __file__, "--enqueue", side_dsn, str(jobs)],
            env=env, check=True, capture_output=True, text=True,
        )  # fmt: skip
        enqueued = {int(k): v for k, v in json.loads(out.stdout).items()}
        give_up = time.monotonic() + 60
        while len(stamps.read_text().splitlines()) < len(enqueued):
            if time.monotonic() > give_up:
                raise SystemExit(f"not every job started: {log.read_text()[-2000:]}")
            time.sleep(0.05)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    started = {}
    for line in stamps.read_text().splitlines():
        ident, _, stamp = line.partition(" ")
        started[int(ident)] = float(stamp)
    return [(started[i] - t) * 1000 for i, t in enqueued.items()]


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def statements(conn: Any, schema: str, top: int) -> list[str]:
    rows = conn.execute(
        "SELECT calls, plans, mean_plan_time, mean_exec_time,"
        " left(regexp_replace(query, '\\s+', ' ', 'g'), 90)"
        " FROM public.pg_stat_statements WHERE query LIKE %s AND calls >= %s"
        " ORDER BY (mean_plan_time + mean_exec_time) DESC LIMIT %s",
        (f'%"{schema}"%', WARM_UP, top),
    ).fetchall()
    return [
        f"  {calls:6} calls {plans:6} plans  plan {plan * 1000:7.0f} µs"
        f"  exec {exec_ * 1000:7.0f} µs  {query}"
        for calls, plans, plan, exec_, query in rows
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline", type=Path, default=REPO, help="the other checkout (default: this one)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--statements", action="store_true", help="pg_stat_statements' view")
    parser.add_argument("--short", action="store_true", help="1 round of 50 jobs")
    parser.add_argument("--starts", action="store_true", help="a daemon's enqueue -> start")
    parser.add_argument("--start-jobs", type=int, default=300, help="jobs per side and round")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--enqueue", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.enqueue:
        enqueue_paced(args.enqueue[0], int(args.enqueue[1]))
        return
    if args.child:
        dsn, schema, jobs = args.child
        print(json.dumps(child(dsn, schema, int(jobs))))
        return
    if not (args.baseline / "pgworkerd" / "client.py").is_file():
        parser.error(f"--baseline {args.baseline}: no pgworkerd checkout there")
    rounds, jobs = (1, 50) if args.short else (args.rounds, args.jobs)

    import psycopg

    from pgworkerd.devcluster.localpg import LocalPostgres

    settings = {"synchronous_commit": "on"}
    if args.statements:
        settings |= {
            "shared_preload_libraries": "pg_stat_statements",
            "pg_stat_statements.track": "all",
            "pg_stat_statements.track_planning": "on",
        }
    sides = {"this": (REPO, "idle_this"), "baseline": (args.baseline.resolve(), "idle_base")}
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    with LocalPostgres(settings=settings) as pg:
        dsn = pg.dsn()
        if args.statements:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION pg_stat_statements SCHEMA public")
        for _ in range(rounds):
            for side, (code, schema) in sides.items():
                env = {**os.environ, "PYTHONPATH": str(code)}
                out = subprocess.run(
                    [sys.executable, __file__, "--child", dsn, schema, str(jobs)],
                    env=env, check=True, capture_output=True, text=True,
                )  # fmt: skip
                results[side].append(json.loads(out.stdout))
        print(f"this = {REPO}, baseline = {sides['baseline'][0]}; {rounds} rounds of {jobs}")
        print(f"{'median ms':12} {'this':>8} {'baseline':>9}   each round: this / baseline")
        for step in ("enqueue", "claim", "complete"):
            mine = [r[step] for r in results["this"]]
            base = [r[step] for r in results["baseline"]]
            rounds_text = ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(mine, base, strict=True))
            print(
                f"{step:12} {statistics.median(mine):8.2f} {statistics.median(base):9.2f}"
                f"   {rounds_text}"
            )
        if args.starts:
            start_jobs = 20 if args.short else args.start_jobs
            gaps: dict[str, list[list[float]]] = {side: [] for side in sides}
            with tempfile.TemporaryDirectory(prefix="idle-starts-") as workdir:
                for _ in range(rounds):
                    for side, (code, _schema) in sides.items():
                        gaps[side].append(starts(dsn, code, Path(workdir), start_jobs))
            print(
                f"enqueue -> start of an idle daemon (1 slot), ms; {rounds} rounds of "
                f"{start_jobs} jobs at {START_RATE:g}/s per side"
            )
            for side, per_round in gaps.items():
                every = [g for one in per_round for g in one]
                rounds_text = ", ".join(f"{statistics.median(r):.2f}" for r in per_round)
                print(
                    f"{side:12} p50 {statistics.median(every):6.2f}  p90 {_p(every, 0.9):6.2f}"
                    f"   p50 each round: {rounds_text}"
                )
        if args.statements:
            with psycopg.connect(dsn, autocommit=True) as conn:
                for side, (_code, schema) in sides.items():
                    print(f"{side}: the costliest statements (nested included)")
                    for line in statements(conn, schema, 12):
                        print(line)


if __name__ == "__main__":
    main()
