"""Where the daemon's parent spends its time per no-op job: the real `pgworkerd run` on a
private PostgreSQL, a backlog of no-op jobs drained once, the parent profiled.

    .venv/bin/python bench/parent_profile.py [--fresh] [--jobs N] [--slots N] [--prefetch N]
        [--concurrency N]
        [--synchronous-commit on|off] [--py-spy OUT.txt] [--cprofile OUT.prof]

--fresh runs a fresh process per job (max_jobs_per_child = 1), else children are reused
(max_jobs_per_child = 1000). --cprofile runs the parent under cProfile (children are
forked from the fork server, which is started before the profiler) and prints the top
functions by own and cumulative time; --py-spy samples the parent from outside with
py-spy (`pip install py-spy`) and writes its raw stacks. Without either, only the rate.
A benchmark, not a test: figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from daemon_bench import wait_for

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate

# cProfile is switched on after the fork server started, so its children run unprofiled.
PROFILED = """
import cProfile, sys
out = sys.argv.pop()
from pgworkerd.daemon import loop
prof = cProfile.Profile()
original = loop.Daemon._install_signals
def install(self):
    prof.enable()
    original(self)
loop.Daemon._install_signals = install
from pgworkerd.cli import main
try:
    main()
except SystemExit:
    pass
finally:
    prof.disable()
    prof.dump_stats(out)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fresh", action="store_true", help="max_jobs_per_child = 1")
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--prefetch", type=int, default=0, help="[worker] prefetch")
    ap.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="above 1: an async def no-op, this many side by side in a child",
    )
    ap.add_argument("--synchronous-commit", default="off", choices=("on", "off"))
    ap.add_argument("--cprofile", type=Path, help="write cProfile stats here")
    ap.add_argument("--py-spy", type=Path, help="write py-spy raw stacks here")
    ap.add_argument(
        "--spy-children",
        action="store_true",
        help="with --py-spy: sample the fork server and the children instead of the parent",
    )
    ap.add_argument("--top", type=int, default=35)
    ap.add_argument(
        "--functions",
        action="store_true",
        help="print PostgreSQL's own time per SQL function and job (track_functions = all)",
    )
    ap.add_argument("--code", type=Path, help="run the pgworkerd/ of this checkout instead")
    args = ap.parse_args()
    settings = {"fsync": "on", "synchronous_commit": args.synchronous_commit}
    if args.functions:
        settings["track_functions"] = "all"
    with tempfile.TemporaryDirectory() as tmp, LocalPostgres(settings=settings) as pg:
        dsn = pg.dsn()
        migrate(dsn)
        config = Path(tmp) / "config.toml"
        config.write_text(
            "[worker]\n"
            f"slots = {args.slots}\nwarm_children = {args.slots}\n"
            f"max_jobs_per_child = {1 if args.fresh else 1000}\n"
            f"prefetch = {args.prefetch}\n"
            'lease = "60s"\npoll_interval = "1s"\n'
            + (
                '[handlers.noop]\ntarget = "pgworkerd.examples:noop"\n'
                if args.concurrency <= 1
                else '[handlers.noop]\ntarget = "compare_handlers:anoop"\n'
                f"concurrency = {args.concurrency}\n"
            )
        )
        log = Path(tmp) / "daemon.log"
        argv = ["--dsn", dsn, "--config", str(config), "run"]
        main_cli = "import sys; from pgworkerd.cli import main; sys.exit(main())"
        if args.cprofile:
            cmd = [sys.executable, "-c", PROFILED, *argv, str(args.cprofile.absolute())]
        else:
            cmd = [sys.executable, "-c", main_cli, *argv]
        env = dict(os.environ)
        # (compare_handlers: the async no-op, imported by the fork server)
        here = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = f"{here}{os.pathsep}{env.get('PYTHONPATH', '')}"
        if args.code is not None:
            env["PYTHONPATH"] = f"{args.code.absolute()}{os.pathsep}{env.get('PYTHONPATH', '')}"
        with log.open("ab") as err:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        spy = None
        try:
            wait_for(lambda: "running as" in log.read_text(), 60, "daemon start", 0.05)
            time.sleep(1.0)  # warm children up
            with psycopg.connect(dsn, autocommit=True) as conn:
                for _ in range(0, args.jobs, 1000):
                    client.enqueue_many(conn, [client.JobSpec("noop") for _ in range(1000)])
                start = time.monotonic()
                if args.py_spy:
                    target = proc.pid
                    if args.spy_children:
                        target = int(
                            subprocess.run(
                                ["pgrep", "-f", "-P", str(proc.pid), "worker.forkserver"],
                                capture_output=True,
                                text=True,
                                check=True,
                            ).stdout.split()[0]
                        )
                    spy = subprocess.Popen(
                        [
                            "py-spy",
                            "record",
                            "-f",
                            "raw",
                            "-r",
                            "200",
                            "-p",
                            str(target),
                            *(["--subprocesses"] if args.spy_children else []),
                            "-o",
                            str(args.py_spy),
                            "--nonblocking",
                        ],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                total = (args.jobs + 999) // 1000 * 1000
                cpu0, reaped0, pg0 = _cpu(proc.pid), _cpu(proc.pid, reaped=True), _pg_cpu(pg)
                while True:
                    done = conn.execute(
                        "SELECT count(*) FROM pgworkerd.jobs WHERE status = 'completed'"
                    ).fetchone()[0]  # type: ignore[index]
                    if done >= total or time.monotonic() - start > 300:
                        break
                    time.sleep(0.05)
                elapsed = time.monotonic() - start
                cpu = _cpu(proc.pid) - cpu0
                reaped = _cpu(proc.pid, reaped=True) - reaped0
                pg_cpu = _pg_cpu(pg) - pg0
                if args.functions:
                    time.sleep(1)  # (a backend reports its statistics when idle)
                    rows = conn.execute(
                        "SELECT funcname, calls, self_time, total_time"
                        " FROM pg_stat_user_functions ORDER BY self_time DESC LIMIT 15"
                    ).fetchall()
                    print(f"{'function':32} {'calls':>8} {'self us/job':>12} {'total us/job':>12}")
                    for name, calls, self_ms, total_ms in rows:
                        per = 1000 / max(total, 1)
                        print(f"{name:32} {calls:8} {self_ms * per:12.1f} {total_ms * per:12.1f}")
            print(
                f"{'fresh' if args.fresh else 'reused'} sync={args.synchronous_commit}: "
                f"{done} jobs in {elapsed:.2f}s = {done / elapsed:,.0f} jobs/s; parent CPU "
                f"{cpu:.2f}s = {cpu / max(done, 1) * 1e6:,.0f} us/job; children it reaped "
                f"{reaped / max(done, 1) * 1e6:,.0f} us/job; PostgreSQL "
                f"{pg_cpu / max(done, 1) * 1e6:,.0f} us/job; load {os.getloadavg()[0]:.2f}"
            )
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
            problems = [x for x in log.read_text().splitlines() if "WARNING" in x or "ERROR" in x]
            print(f"{len(problems)} warnings/errors in the daemon's log", *problems[:5], sep="\n")
    if args.cprofile:
        stats = pstats.Stats(str(args.cprofile))
        stats.sort_stats("tottime").print_stats(args.top)
        stats.sort_stats("cumulative").print_stats(args.top)


def _cpu(pid: int, reaped: bool = False) -> float:
    """A process's CPU seconds (user + system), or with `reaped` its reaped children's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    first = 13 if reaped else 11
    return (int(fields[first]) + int(fields[first + 1])) / os.sysconf("SC_CLK_TCK")


def _pg_cpu(pg: LocalPostgres) -> float:
    """CPU seconds of the cluster's processes now running (backends and helpers)."""
    postmaster = int((pg.data_dir / "postmaster.pid").read_text().split()[0])
    total = _cpu(postmaster)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == postmaster:
                    total += _cpu(int(entry.name))
            except (OSError, ValueError):
                continue
    return total


if __name__ == "__main__":
    main()
