"""Daemon benchmark: the real `pgworkerd run` on a private PostgreSQL.

    .venv/bin/python bench/daemon_bench.py [--short] [--json out.json] [--job-uids RANGE]

Prints:
  - no-op jobs/s through children, max_jobs_per_child = 1 (a fresh process per job) and
    1000 (children reused), one daemon; and async no-op handlers with concurrency = 8
    (8 jobs side by side in one child), children reused;
  - enqueue -> handler start latency p50/p99 on an idle daemon (one job at a time; the
    handler notes time.time() at its first line, the client after its COMMIT);
  - lease renewal with 1,000 in-flight jobs on one host: the renew statement's cost
    (ms per statement of 1,000 leases), and the real daemon's CPU while it holds them;
  - parent and child memory (RSS and PSS).
With --job-uids (as root), every daemon runs its children as uids of that range
([worker] job_uids; at least 2 x the in-flight count): the cost of the privilege drop
shows in the no-op rate with max_jobs_per_child = 1 (a fork and a drop per job).
A benchmark, not a test: figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue import lease
from pgworkerd.queue.db import connect
from pgworkerd.queue.migrate import migrate

BENCH_DIR = Path(__file__).resolve().parent
# The process-tree helpers the tests use (tests/support/proctree.py, standard library only).
sys.path.insert(0, str(BENCH_DIR.parent / "tests" / "support"))
import _measure  # noqa: E402  (bench/_measure.py)
import leasing  # noqa: E402  (tests/support/leasing.py: claim)
from proctree import children_of, cpu_seconds, process_title  # noqa: E402

PGWORKERD = str(Path(sys.executable).with_name("pgworkerd"))
SERVER_SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "off",
    "shared_buffers": "256MB",
    "max_connections": "300",
    # counts the daemon's renew statements exactly
    "shared_preload_libraries": "pg_stat_statements",
}


def wait_for(condition: Callable[[], Any], timeout: float, what: str, step: float = 0.005) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError(f"timed out waiting for {what}")


class Daemon:
    """A `pgworkerd run` subprocess with a generated config."""

    def __init__(
        self,
        dsn: str,
        workdir: Path,
        worker: dict[str, Any],
        handlers: dict[str, str | dict[str, Any]],
    ) -> None:
        uids = os.environ.get("BENCH_JOB_UIDS")  # set by --job-uids
        if uids:
            worker = {**worker, "job_uids": uids}
        lines = ["[worker]"] + [f"{k} = {json.dumps(v)}" for k, v in worker.items()]
        for name, target in handlers.items():
            keys = target if isinstance(target, dict) else {"target": target}
            lines += [f"[handlers.{name}]"] + [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
        if os.environ.get("BENCH_LOG_LEVEL"):  # e.g. debug: per-job start delays
            lines += ["[logging]", f'level = "{os.environ["BENCH_LOG_LEVEL"]}"']
        if os.environ.get("BENCH_LOGS_CAPTURE") == "off":  # the cost of job output capture
            lines += ["[logs]", "capture = false"]
        self.config = workdir / f"bench-{time.monotonic_ns()}.toml"
        self.config.write_text("\n".join(lines) + "\n")
        self.config.chmod(0o600)  # (job_uids: a config others can read is refused)
        self.log = workdir / "daemon.log"
        env = {**os.environ, "PYTHONPATH": str(BENCH_DIR)}
        if uids:  # the daemon's temp directories in the work directory, open to job users
            env["TMPDIR"] = str(workdir)
        self.proc = subprocess.Popen(
            [PGWORKERD, "--dsn", dsn, "--config", str(self.config), "run"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
        )
        wait_for(lambda: "running as" in self.log.read_text(), 30, "daemon start", 0.05)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def children(self) -> list[int]:
        """The daemon's job children, titled "pgworkerd: ..." (not its fork server)."""
        return [p for p in children_of(self.proc.pid) if process_title(p).startswith("pgworkerd: ")]


def memory_kib(pid: int) -> tuple[int, int]:
    rss = pss = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Rss:"):
            rss = int(line.split()[1])
        elif line.startswith("Pss:"):
            pss = int(line.split()[1])
    return rss, pss


def completed(conn: psycopg.Connection) -> int:
    row = conn.execute("SELECT count(*) FROM pgworkerd.jobs WHERE status = 'completed'").fetchone()
    return int(row[0]) if row else 0


def throughput(
    dsn: str, workdir: Path, per_child: int, n_jobs: int, concurrency: int = 0
) -> dict[str, Any]:
    """No-op jobs/s; with `concurrency`, of an async no-op handler run that many at once
    per child."""
    handler: dict[str, Any] = {"target": "pgworkerd.examples:noop"}
    if concurrency:
        handler = {"target": "bench_handlers:async_noop", "concurrency": concurrency}
    with connect(dsn) as conn:
        conn.execute("TRUNCATE pgworkerd.jobs")
        daemon = Daemon(
            dsn,
            workdir,
            {
                "slots": 8,
                "warm_children": 8,
                "max_jobs_per_child": per_child,
                "lease": "60s",
                "poll_interval": "1s",
            },
            {"noop": handler},
        )
        try:
            start = time.monotonic()
            client.enqueue_many(conn, [client.JobSpec("noop") for _ in range(n_jobs)])
            wait_for(lambda: completed(conn) >= n_jobs, 600, "all jobs", 0.05)
            elapsed = time.monotonic() - start
            cpu = cpu_seconds(daemon.proc.pid)
        finally:
            daemon.stop()
    return {
        "jobs": n_jobs,
        "seconds": round(elapsed, 2),
        "jobs_per_s": round(n_jobs / elapsed),
        "parent_cpu_s": round(cpu, 2),
    }


def latency(dsn: str, workdir: Path, samples: int) -> dict[str, Any]:
    starts = workdir / "starts.log"
    starts.write_text("")
    starts.chmod(0o666)  # (job_uids: the handler runs as another user)
    os.environ["BENCH_STARTS"] = str(starts)
    with connect(dsn) as conn:
        conn.execute("TRUNCATE pgworkerd.jobs")
        daemon = Daemon(
            dsn,
            workdir,
            {"slots": 4, "warm_children": 2, "lease": "60s", "poll_interval": "5s"},
            {"record_start": "bench_handlers:record_start"},
        )
        try:
            gaps = []
            for n in range(samples):
                job_id = client.enqueue(conn, "record_start")
                enqueued = time.time()
                line = wait_for(
                    functools.partial(_start_of, starts, job_id), 10, f"job {n}", 0.0005
                )
                gaps.append((line - enqueued) * 1000)
                time.sleep(0.02)  # idle again: warm children back, daemon asleep
        finally:
            daemon.stop()
    # which samples were slowest (a first-sample warm-up shows as sample 0)
    slowest = sorted(enumerate(gaps), key=lambda pair: pair[1])[-3:]
    return {
        "slowest": [f"#{n}: {ms:.1f} ms" for n, ms in reversed(slowest)],
        **_measure.summary(gaps),
    }


def _start_of(path: Path, job_id: int) -> float | None:
    for line in path.read_text().splitlines():
        ident, _, stamp = line.partition(" ")
        if ident == str(job_id):
            return float(stamp)
    return None


def renewal(dsn: str, workdir: Path, in_flight: int, window: float) -> dict[str, Any]:
    with connect(dsn) as conn:
        conn.execute("TRUNCATE pgworkerd.jobs")
        # The statement alone: renew `in_flight` leases of one worker, repeatedly.
        client.enqueue_many(conn, [client.JobSpec("noop") for _ in range(in_flight)])
        held = leasing.claim(
            conn,
            "bench",
            queues=["default"],
            handlers={"noop": lease.HandlerCapacity(60, in_flight)},
            limit=in_flight,
        )
        leases = [lease.Lease(j.id, j.token, 60) for j in held]
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            lease.renew(conn, "bench", leases)
            times.append((time.perf_counter() - t0) * 1000)
        conn.execute("TRUNCATE pgworkerd.jobs")
        # The real daemon holding them: children sleep, the parent renews every second.
        daemon = Daemon(
            dsn,
            workdir,
            {
                "slots": in_flight,
                "warm_children": 0,
                "lease": "30s",
                "renew_interval": "1s",
                "poll_interval": "1s",
            },
            {"sleep": "pgworkerd.examples:hang"},
        )
        try:
            client.enqueue_many(
                conn, [client.JobSpec("sleep", {"seconds": 3600}) for _ in range(in_flight)]
            )
            wait_for(lambda: len(daemon.children()) >= in_flight, 300, "children", 0.5)
            time.sleep(2)  # let the start-up burst settle before measuring
            before_cpu = cpu_seconds(daemon.proc.pid)
            before_calls, before_rows = _renewals(conn)
            time.sleep(window)
            cpu = cpu_seconds(daemon.proc.pid) - before_cpu
            calls, rows = _renewals(conn)
            calls, updates = calls - before_calls, rows - before_rows
            parent_mem = memory_kib(daemon.proc.pid)
            child_pids = daemon.children()
            child_mem = [memory_kib(p) for p in child_pids[:50]]
        finally:
            daemon.stop()
    return {
        "in_flight": in_flight,
        "renew_statement_ms_median": round(statistics.median(times), 2),
        "renewed_rows_per_s": round(updates / window),
        "renew_statements_per_s": round(calls / window, 2),
        "parent_cpu_percent": round(100 * cpu / window, 1),
        "parent_rss_mib": round(parent_mem[0] / 1024, 1),
        "parent_pss_mib": round(parent_mem[1] / 1024, 1),
        "child_rss_mib_median": round(statistics.median(m[0] for m in child_mem) / 1024, 1),
        "child_pss_mib_median": round(statistics.median(m[1] for m in child_mem) / 1024, 1),
    }


def _renewals(conn: psycopg.Connection) -> tuple[int, int]:
    """Calls of the renew statement and the rows they returned, so far."""
    row = conn.execute(
        "SELECT coalesce(sum(calls), 0), coalesce(sum(rows), 0) FROM public.pg_stat_statements "
        "WHERE query LIKE %s",
        ["%WITH lease AS%"],
    ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="a quick run (CI)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--job-uids", metavar="RANGE", help='run children as these uids ("61000-62023")'
    )
    args = parser.parse_args()
    if args.job_uids:
        os.environ["BENCH_JOB_UIDS"] = args.job_uids
    n_jobs = 2000 if args.short else 20000
    samples = 50 if args.short else 500
    in_flight = 200 if args.short else 1000
    window = 5.0 if args.short else 15.0
    results: dict[str, Any] = {
        "machine": f"{platform.node()} {os.cpu_count()} cpus "
        f"{platform.machine()} Python {platform.python_version()}"
    }
    with (
        tempfile.TemporaryDirectory(prefix="pgworkerd-bench-") as tmp,
        LocalPostgres(settings=SERVER_SETTINGS) as pg,
    ):
        workdir = Path(tmp)
        workdir.chmod(0o711)  # (job users pass through to their files, never list it)
        dsn = pg.dsn()
        migrate(dsn)
        with connect(dsn) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public")
        print(
            f"# pgworkerd daemon benchmark ({'short' if args.short else 'full'}) on "
            f"{results['machine']}" + (f", job_uids {args.job_uids}" if args.job_uids else ""),
            flush=True,
        )
        for per_child in (1, 1000):
            r = throughput(dsn, workdir, per_child, n_jobs)
            results[f"noop_max_jobs_per_child_{per_child}"] = r
            print(
                f"no-op jobs/s, max_jobs_per_child={per_child:<5} {r['jobs_per_s']:>7} "
                f"({r['jobs']} jobs in {r['seconds']}s, parent CPU {r['parent_cpu_s']}s)",
                flush=True,
            )
        r = throughput(dsn, workdir, 1000, n_jobs, concurrency=8)
        results["async_noop_concurrency_8"] = r
        print(
            f"async no-op jobs/s, concurrency=8, max_jobs_per_child=1000 {r['jobs_per_s']:>7} "
            f"({r['jobs']} jobs in {r['seconds']}s, parent CPU {r['parent_cpu_s']}s)",
            flush=True,
        )
        r = latency(dsn, workdir, samples)
        results["latency"] = r
        print(
            f"enqueue -> handler start, idle daemon: p50 {r['p50_ms']} ms, "
            f"p99 {r['p99_ms']} ms, max {r['max_ms']} ms ({r['samples']} samples; slowest "
            f"{', '.join(r['slowest'])})",
            flush=True,
        )
        r = renewal(dsn, workdir, in_flight, window)
        results["renewal"] = r
        print(
            f"lease renewal, {in_flight} in flight: statement {r['renew_statement_ms_median']}"
            f" ms; daemon renews {r['renewed_rows_per_s']} rows/s in "
            f"{r['renew_statements_per_s']} statements/s; parent CPU "
            f"{r['parent_cpu_percent']}%",
            flush=True,
        )
        print(
            f"memory: parent RSS {r['parent_rss_mib']} MiB (PSS {r['parent_pss_mib']}); "
            f"child RSS {r['child_rss_mib_median']} MiB (PSS {r['child_pss_mib_median']})",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
