"""Fleet simulation: N real daemons against one PostgreSQL, plus synthetic hosts.

    .venv/bin/python bench/fleet.py [--short] [--sizes 10,50,100,200] [--rate 20]
                                    [--before REF] [--simulate-hosts 1000] [--json out.json]

For each fleet size N (1 slot per daemon, the default lease, renew and poll intervals):
  - idle: database statements/s, by statement, and the CPU of every PostgreSQL process
    (from /proc) while the fleet waits for work;
  - load: `--rate` jobs/s enqueued one per transaction for a while; claims per job (calls
    of the claim statement / jobs) and enqueue -> handler start p50 / p99 (the client's
    clock after its COMMIT, the handler's at its first line);
  - the connections the fleet holds, and what the registry and the lease renewals cost
    (statement time per second, from pg_stat_statements).
`--before REF` runs the same measurements with the code of a git ref (e.g. main) in the
same run, interleaved per N: the before/after figures the README quotes.
`--simulate-hosts M` then sends, from a few connections, exactly the statements M idle
hosts send at their real rates (the rates are the daemon's own constants), and reports
the database's statements/s and CPU for them: what 1,000 hosts cost without 1,000
processes. Bounded: sizes whose memory (about 100 MiB per daemon) the machine lacks are
skipped, and each phase has a fixed length. A benchmark, not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon_bench import wait_for

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.db import connect
from pgworkerd.queue.migrate import migrate

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
SERVER_SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "off",
    "shared_buffers": "256MB",
    "max_connections": "500",
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track_utility": "on",
}
DAEMON_MIB = 110  # one daemon with one slot: parent, fork server and a warm child
# Statements by what they are, from their text (pg_stat_statements normalises it).
KINDS = (
    ("claim", "claim_v"),
    ("claim", "FROM @schema@.claim("),
    ("next-run lookup", "WITH RECURSIVE priorities"),
    ("registry heartbeat", "heartbeat_at = now()\n WHERE id"),
    ("stale marking", "pg_try_advisory_xact_lock"),
    ("peers", "SELECT id, queues, handlers, slots FROM pgworkerd.workers"),
    ("lease renewal", "renewed AS"),
    ("finish", "SET status = 'completed'"),
    ("enqueue", "enqueue("),
)


def kind_of(text: str) -> str:
    for kind, marker in KINDS:
        if marker.replace("@schema@", "pgworkerd") in text or marker in text:
            return kind
    head = text.strip().split(None, 1)[0].upper() if text.strip() else "?"
    return head if head in ("BEGIN", "COMMIT", "LISTEN", "SELECT", "UPDATE", "INSERT") else "other"


class Server:
    """The private PostgreSQL, with pg_stat_statements and its processes' CPU."""

    def __init__(self, pg: LocalPostgres) -> None:
        self.pg = pg
        self.dsn = pg.dsn()
        self.admin = connect(self.dsn)
        self.admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public")
        self.admin_pid = self.admin.info.backend_pid

    def cpu_ticks(self) -> int:
        postmaster = int((self.pg.data_dir / "postmaster.pid").read_text().split()[0])
        total = 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            pid, ppid = int(entry.name), int(fields[1])
            if pid == self.admin_pid:
                continue  # the bench's own backend
            if pid == postmaster or ppid == postmaster:
                total += int(fields[11]) + int(fields[12])
            if pid == postmaster:  # backends that ended meanwhile, once reaped
                total += int(fields[13]) + int(fields[14])
        return total

    def reset(self) -> None:
        self.admin.execute("SELECT public.pg_stat_statements_reset()")

    def statements(self) -> dict[str, dict[str, float]]:
        rows = self.admin.execute(
            "SELECT query, calls, total_exec_time FROM public.pg_stat_statements "
            "WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_stat_activity%'"
        ).fetchall()
        out: dict[str, dict[str, float]] = {}
        for text, calls, ms in rows:
            entry = out.setdefault(kind_of(text), {"calls": 0.0, "ms": 0.0})
            entry["calls"] += calls
            entry["ms"] += ms
        return out

    def wal_and_tables(self) -> tuple[int, dict[str, int]]:
        """WAL written so far (bytes) and the row versions each table made dead so far
        (updates + deletes: what vacuum has to clean)."""
        row = self.admin.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        tables = self.admin.execute(
            "SELECT relname, n_tup_upd + n_tup_del FROM pg_stat_user_tables "
            "WHERE schemaname = 'pgworkerd' AND relname IN ('jobs', 'workers')"
        ).fetchall()
        return int(row[0]) if row else 0, {name: int(n) for name, n in tables}

    def connections(self) -> int:
        row = self.admin.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        ).fetchone()
        return int(row[0]) if row else 0

    def measure(self, seconds: float, work: Callable[[], None] | None = None) -> dict[str, Any]:
        """Statements and server CPU over `seconds` (running `work` meanwhile, if any)."""
        self.reset()
        ticks, start = self.cpu_ticks(), time.monotonic()
        if work is not None:
            work()
        else:
            time.sleep(seconds)
        elapsed = time.monotonic() - start
        cpu = (self.cpu_ticks() - ticks) / os.sysconf("SC_CLK_TCK")
        stmts = self.statements()
        calls = sum(s["calls"] for s in stmts.values())
        return {
            "seconds": round(elapsed, 1),
            "statements_per_s": round(calls / elapsed, 1),
            "server_cpu_pct": round(100 * cpu / elapsed, 2),
            "by_kind": {
                k: {
                    "per_s": round(v["calls"] / elapsed, 2),
                    "ms_per_s": round(v["ms"] / elapsed, 3),
                }
                for k, v in sorted(stmts.items(), key=lambda kv: -kv[1]["calls"])
            },
        }


class Fleet:
    """N `pgworkerd run` processes of one code version, 1 slot each."""

    def __init__(self, dsn: str, workdir: Path, n: int, source: Path | None) -> None:
        self.workdir = workdir
        config = workdir / "fleet.toml"
        config.write_text(
            "[worker]\nslots = 1\nwarm_children = 1\n"
            '[handlers.record_start]\ntarget = "bench_handlers:record_start"\n'
        )
        path = [str(BENCH_DIR)] if source is None else [str(source), str(BENCH_DIR)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        self.logs = [workdir / f"daemon-{i}.log" for i in range(n)]
        self.procs = []
        for log in self.logs:
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        "import sys; from pgworkerd.cli import main; sys.exit(main())",
                        "--dsn",
                        dsn,
                        "--config",
                        str(config),
                        "run",
                    ],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=log.open("ab"),
                    cwd=workdir,
                )
            )
        for i, log in enumerate(self.logs):
            wait_for(
                lambda log=log: "running as" in log.read_text(), 300, f"daemon {i} start", step=0.05
            )

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def load(server: Server, starts: Path, rate: float, seconds: float) -> dict[str, Any]:
    """Enqueue `rate` jobs/s one per transaction; claims per job and start latency."""
    starts.write_text("")
    enqueued: dict[int, float] = {}
    with connect(server.dsn) as conn:
        conn.execute("TRUNCATE pgworkerd.jobs")

        def work() -> None:
            t0 = time.monotonic()
            n = 0
            while time.monotonic() - t0 < seconds:
                job_id = client.enqueue(conn, "record_start")
                enqueued[job_id] = time.time()
                n += 1
                # a steady rate, with jitter so that enqueues do not line up with ticks
                time.sleep(max(0.0, t0 + n / rate - time.monotonic()) * random.uniform(0.8, 1.2))
            wait_for(lambda: _started(starts) >= len(enqueued), 60, "every job to start", step=0.05)
            time.sleep(0.5)  # the claims and lookups that follow the last job

        wal, tables = server.wal_and_tables()
        figures = server.measure(seconds, work)
        wal_after, tables_after = server.wal_and_tables()
    started = {}
    for line in starts.read_text().splitlines():
        ident, _, stamp = line.partition(" ")
        started[int(ident)] = float(stamp)
    gaps = sorted((started[i] - t) * 1000 for i, t in enqueued.items() if i in started)
    claims = figures["by_kind"].get("claim", {}).get("per_s", 0.0) * figures["seconds"]
    jobs = max(1, len(enqueued))
    return {
        "wal_bytes_per_job": round((wal_after - wal) / jobs),
        "row_versions_per_job": {
            t: round((tables_after[t] - tables.get(t, 0)) / jobs, 2) for t in tables_after
        },
        "statements_per_job": round(figures["statements_per_s"] * figures["seconds"] / jobs, 1),
        "jobs": len(enqueued),
        "claims_per_job": round(claims / max(1, len(enqueued)), 2),
        "start_p50_ms": round(statistics.median(gaps), 1) if gaps else None,
        "start_p99_ms": round(gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))], 1) if gaps else None,
        "statements_per_s": figures["statements_per_s"],
        "server_cpu_pct": figures["server_cpu_pct"],
        "by_kind": figures["by_kind"],
    }


def _started(path: Path) -> int:
    return len(path.read_text().splitlines())


def memory_allows(n: int) -> bool:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024 > n * DAEMON_MIB + 2048
    return False


def export_source(ref: str, into: Path) -> Path:
    """The package of a git ref, extracted beside the working tree's."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", ref, "pgworkerd"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run_size(
    server: Server, workdir: Path, n: int, source: Path | None, args: argparse.Namespace
) -> dict[str, Any]:
    with server.admin.transaction():
        server.admin.execute("TRUNCATE pgworkerd.jobs")
        server.admin.execute("DELETE FROM pgworkerd.workers")
    starts = workdir / "starts.log"
    os.environ["BENCH_STARTS"] = str(starts)
    t0 = time.monotonic()
    fleet = Fleet(server.dsn, workdir, n, source)
    try:
        started_in = time.monotonic() - t0
        time.sleep(args.settle)  # start-up statements and first polls out of the way
        idle = server.measure(args.idle_seconds)
        connections = server.connections()
        busy = load(server, starts, args.rate, args.load_seconds)
    finally:
        fleet.stop()
    by_kind = idle["by_kind"]
    registry = sum(
        by_kind.get(k, {}).get("ms_per_s", 0.0) for k in ("registry heartbeat", "stale marking")
    )
    return {
        "daemons": n,
        "started_in_s": round(started_in, 1),
        "connections": connections,
        "idle": idle,
        "load": busy,
        "registry_ms_per_s": round(registry, 3),
        "renewal_ms_per_s": busy["by_kind"].get("lease renewal", {}).get("ms_per_s", 0.0),
    }


def print_row(label: str, r: dict[str, Any]) -> None:
    idle, busy = r["idle"], r["load"]
    print(
        f"{label:>8} N={r['daemons']:>4}  idle {idle['statements_per_s']:7.1f} stmt/s "
        f"{idle['server_cpu_pct']:5.2f} % CPU | load {busy['jobs']} jobs: "
        f"{busy['claims_per_job']:5.2f} claims/job, start p50 {busy['start_p50_ms']} "
        f"p99 {busy['start_p99_ms']} ms, {busy['server_cpu_pct']:5.2f} % CPU | "
        f"{r['connections']} connections | registry {r['registry_ms_per_s']} ms/s | "
        f"per job: {busy['statements_per_job']} statements, {busy['wal_bytes_per_job']} B WAL, "
        f"dead row versions {busy['row_versions_per_job']}",
        flush=True,
    )
    top = ", ".join(f"{k} {v['per_s']}" for k, v in list(idle["by_kind"].items())[:6])
    print(f"{'':>8}   idle statements/s: {top}", flush=True)


def simulate(server: Server, hosts: int, seconds: float, code: str) -> dict[str, Any]:
    """`hosts` idle hosts' statements at the rates of `code` ('after' or 'before'), sent
    over a few connections: one thread per connection, each host on its own schedule.
    The hosts register before the measured window."""
    from bench_fleet_sim import host_schedule, register  # beside this file

    threads = max(1, min(8, hosts // 100))
    errors: list[str] = []
    ready = threading.Barrier(threads + 1)
    start: list[float] = []

    def worker(index: int) -> None:
        ids = [f"sim-{index}-{h}" for h in range(hosts // threads)]
        try:
            with connect(server.dsn, prepare=True) as conn:
                register(conn, ids)
                ready.wait()
                host_schedule(conn, ids, start[0] + seconds, code, hosts)
        except Exception as exc:  # shown, not fatal
            errors.append(repr(exc))
            ready.abort()

    with server.admin.transaction():
        server.admin.execute("DELETE FROM pgworkerd.workers")
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    start.append(time.monotonic() + 0.5)
    with contextlib.suppress(threading.BrokenBarrierError):
        ready.wait()
    figures = server.measure(seconds)
    for t in pool:
        t.join()
    with server.admin.transaction():
        server.admin.execute("DELETE FROM pgworkerd.workers")
    figures["hosts"] = hosts
    figures["errors"] = errors[:3]
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="CI: 3 daemons, a few seconds each")
    parser.add_argument("--sizes", default="10,50,100,200")
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--load-seconds", type=float, default=15.0)
    parser.add_argument("--settle", type=float, default=8.0)
    parser.add_argument("--before", help="git ref whose code runs the same fleet, interleaved")
    parser.add_argument("--simulate-hosts", type=int, default=1000)
    parser.add_argument("--simulate-seconds", type=float, default=30.0)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.short:
        args.sizes, args.idle_seconds, args.load_seconds, args.settle = "3", 3.0, 3.0, 2.0
        args.simulate_hosts, args.simulate_seconds = min(args.simulate_hosts, 100), 3.0
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    sys.path.insert(0, str(BENCH_DIR))
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="pgworkerd-fleet-"))
    print(
        f"fleet simulation: sizes {sizes}, {args.rate:g} jobs/s, idle {args.idle_seconds:g}s, "
        f"load {args.load_seconds:g}s; load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} CPUs",
        flush=True,
    )
    results: dict[str, Any] = {"sizes": [], "simulated": []}
    variants: list[tuple[str, Path | None]] = [("after", None)]
    if args.before:
        variants.insert(0, ("before", export_source(args.before, workdir / "before-src")))
    with LocalPostgres(settings=SERVER_SETTINGS) as pg:
        server = Server(pg)
        migrate(server.dsn)
        # The server's own background work (checkpointer, autovacuum launcher, stats),
        # with no daemon at all: the fleet's share is the rest.
        baseline = server.measure(args.idle_seconds)
        results["baseline"] = baseline
        print(f"no daemons: {baseline['server_cpu_pct']} % CPU", flush=True)
        for n in sizes:
            if not memory_allows(n):
                print(f"N={n}: skipped, not enough memory (~{DAEMON_MIB} MiB per daemon)")
                continue
            for label, source in variants:
                sub = workdir / f"{label}-{n}"
                sub.mkdir(parents=True, exist_ok=True)
                row = run_size(server, sub, n, source, args)
                row["code"] = label
                results["sizes"].append(row)
                print_row(label, row)
        if args.simulate_hosts:
            for label, _ in variants:
                sim = simulate(server, args.simulate_hosts, args.simulate_seconds, label)
                sim["code"] = label
                results["simulated"].append(sim)
                top = ", ".join(
                    f"{k} {v['per_s']}/s {v['ms_per_s']} ms/s"
                    for k, v in list(sim["by_kind"].items())[:6]
                )
                print(
                    f"{label:>8} simulated {sim['hosts']} idle hosts: "
                    f"{sim['statements_per_s']} stmt/s, {sim['server_cpu_pct']} % CPU ({top})"
                    f"{' errors: ' + '; '.join(sim['errors']) if sim['errors'] else ''}",
                    flush=True,
                )
        server.admin.close()
    print(f"load average at the end {os.getloadavg()[0]:.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
