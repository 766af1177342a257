"""Hand-back drain benchmark: a busy host handed back to another daemon.

    .venv/bin/python bench/handback_bench.py [--short] [--grace 30] [--every 10] [--json out.json]

Two real daemons (`pgworkerd run`, 4 slots each) on a private PostgreSQL. Host A runs 4
"2-hour" jobs (tests/support/handbackhandlers.py long_job: a checkpoint every `--every`
seconds, a `sleep` in its process group and one in a session of its own); B idles. Then
`pgworkerd drain --hand-back --grace G --worker A --wait`, and the figures:
  - host empty: from the command's start until it returned (A holds no job; this
    includes starting the command, ~0.3 s on a quiet machine), and from the request's
    commit to the last release's (both the database's clock);
  - release -> start: from each job's release (its attempt's end in the database) to its
    start on B (the handler's first line), and whether it started from the last
    checkpoint A saved;
  - attempts counted by the hand-back (each job's attempts while it runs on B, minus 1);
  - processes of A's runs (children and their trees) still alive when the command
    returned, and 1 s later.
Twice: with handlers that raise JobInterrupted when job.stop_requested turns true, and
with handlers that never look (released at the end of the grace, their trees killed).
`--short` (CI): grace 3 s, checkpoints every second. A benchmark, not a test: nothing is
asserted; the goals (host empty <= grace + 2 s, start <= 1 s after release, 0 attempts,
0 processes) are printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
SUPPORT = BENCH_DIR.parent / "tests" / "support"
# The handlers and the process-tree helpers the tests use (standard library + pgworkerd).
sys.path.insert(0, str(SUPPORT))

from daemon_bench import wait_for  # noqa: E402
from handbackhandlers import recorded  # noqa: E402
from proctree import is_gone  # noqa: E402

from pgworkerd import client  # noqa: E402
from pgworkerd.devcluster.localpg import LocalPostgres  # noqa: E402
from pgworkerd.queue.db import connect  # noqa: E402
from pgworkerd.queue.migrate import migrate  # noqa: E402

PGWORKERD = Path(sys.executable).with_name("pgworkerd")
JOBS = 4


class Daemon:
    def __init__(self, dsn: str, schema: str, workdir: Path, tag: str) -> None:
        config = workdir / f"{schema}-{tag}.toml"
        config.write_text(
            f'[worker]\nname = "host-{tag}"\nslots = {JOBS}\nwarm_children = 1\n'
            'kill_grace = "10s"\n'
            '[handlers.long]\ntarget = "handbackhandlers:long_job"\n'
        )
        self.log = workdir / f"{schema}-daemon-{tag}.log"
        env = {**os.environ, "PYTHONPATH": str(SUPPORT), "JOBHANDLERS_TAG": tag}
        env.pop("NOTIFY_SOCKET", None)
        self.proc = subprocess.Popen(
            [str(PGWORKERD), "--dsn", dsn, "--schema", schema, "--config", str(config), "run"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("ab"),
            cwd=workdir,
            start_new_session=True,
        )
        found = wait_for(
            lambda: re.search(r"running as (\S+):", self.log.read_text()),
            60,
            f"daemon {tag} to start",
        )
        self.worker_id: str = found[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)  # its children die with it (PDEATHSIG)
            self.proc.wait(30)


def scenario(
    dsn: str, workdir: Path, *, honour: bool, grace: float, every: float
) -> dict[str, Any]:
    schema = f"hb_{uuid.uuid4().hex[:8]}"
    migrate(dsn, schema=schema)
    out = workdir / f"{schema}.jsonl"
    daemons: list[Daemon] = []
    try:
        with connect(dsn) as conn:
            a = Daemon(dsn, schema, workdir, "A")
            daemons.append(a)
            payload = {
                "file": str(out),
                "every": every,
                "steps": int(7200 / every),  # two hours of steps
                "honour": honour,
                "log_checkpoints": True,
            }
            jobs = [client.enqueue(conn, "long", payload, schema=schema) for _ in range(JOBS)]
            wait_for(
                lambda: len([r for r in recorded(str(out)) if "pid" in r]) >= JOBS,
                60,
                "4 jobs running on A",
            )
            # each has saved at least one checkpoint; then wait into the middle of a step
            wait_for(
                lambda: {r["job"] for r in recorded(str(out)) if "checkpoint" in r} >= set(jobs),
                every * 3 + 30,
                "a checkpoint of every job",
            )
            b = Daemon(dsn, schema, workdir, "B")
            daemons.append(b)
            time.sleep(every / 2)
            a_runs = [r for r in recorded(str(out)) if "pid" in r and r["tag"] == "A"]

            began = time.monotonic()
            proc = subprocess.run(
                [
                    str(PGWORKERD), "--dsn", dsn, "--schema", schema, "drain", "--hand-back",
                    "--grace", f"{grace}s", "--worker", a.worker_id, "--wait",
                ],
                capture_output=True,
                text=True,
                timeout=grace + 120,
                check=False,
            )  # fmt: skip
            empty_after = time.monotonic() - began
            alive_at_return = sum(
                not is_gone(pid) for r in a_runs for pid in [r["pid"], *r["tree"]]
            )
            time.sleep(1.0)
            alive_later = sum(not is_gone(pid) for r in a_runs for pid in [r["pid"], *r["tree"]])

            starts = wait_for(
                lambda: (
                    (found := [r for r in recorded(str(out)) if "pid" in r and r["tag"] == "B"])
                    and len(found) >= JOBS
                    and found
                ),
                60,
                "the jobs to start on B",
            )
            released = {
                job_id: finished.timestamp()
                for job_id, finished in conn.execute(
                    f"SELECT job_id, finished_at FROM {schema}.attempts WHERE outcome = 'released'"
                ).fetchall()
            }
            lines = recorded(str(out))
            latencies, from_checkpoint = [], 0
            for start in starts:
                job_id = start["job"]
                latencies.append(start["at"] - released[job_id])
                last_on_a = max(
                    (r["checkpoint"] for r in lines if r.get("job") == job_id and "checkpoint" in r
                     and r["at"] < released[job_id]),
                    default=0,
                )  # fmt: skip
                from_checkpoint += start["started_from"] == last_on_a
            [(requested_at,)] = conn.execute(
                f"SELECT hand_back_requested_at FROM {schema}.workers WHERE id = %s",
                (a.worker_id,),
            ).fetchall()
            emptied = max(released.values()) - requested_at.timestamp()
            attempts = conn.execute(
                f"SELECT sum(attempts) FROM {schema}.jobs WHERE id = ANY(%s)", (jobs,)
            ).fetchone()
            return {
                "handler": "checks stop_requested" if honour else "ignores stop_requested",
                "grace_s": grace,
                "checkpoint_every_s": every,
                "exit_code": proc.returncode,
                "host_empty_s": round(empty_after, 2),
                "request_to_last_release_s": round(emptied, 2),
                "release_to_start_ms": {
                    "max": round(max(latencies) * 1000, 1),
                    "median": round(statistics.median(latencies) * 1000, 1),
                },
                "started_from_last_checkpoint": f"{from_checkpoint}/{len(starts)}",
                "attempts_counted": int(attempts[0] or 0) - JOBS if attempts else None,
                "processes_left_at_return": alive_at_return,
                "processes_left_after_1s": alive_later,
            }
    finally:
        for d in daemons:
            d.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="CI: 3 s grace, 1 s checkpoints")
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=10.0, help="seconds between checkpoints")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.short:
        args.grace, args.every = 3.0, 1.0
    print(
        f"hand-back bench {datetime.now().astimezone():%Y-%m-%d %H:%M %Z}: {JOBS} jobs, grace "
        f"{args.grace:g}s, checkpoint every {args.every:g}s; {platform.machine()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results = []
    workdir = Path(tempfile.mkdtemp(prefix="pgworkerd-handback-"))
    with LocalPostgres() as pg:
        for honour in (True, False):
            r = scenario(pg.dsn(), workdir, honour=honour, grace=args.grace, every=args.every)
            results.append(r)
            print(
                f"{r['handler']:>24}: host empty {r['host_empty_s']} s (goal <= "
                f"{args.grace + 2:g}; request -> last release {r['request_to_last_release_s']}"
                " s); release -> start on B max "
                f"{r['release_to_start_ms']['max']} ms, median "
                f"{r['release_to_start_ms']['median']} ms (goal <= 1000); from the last "
                f"checkpoint {r['started_from_last_checkpoint']}; attempts counted "
                f"{r['attempts_counted']} (goal 0); processes left {r['processes_left_at_return']}"
                f" at return, {r['processes_left_after_1s']} 1 s later (goal 0); "
                f"exit {r['exit_code']}",
                flush=True,
            )
    print(f"load average at the end {os.getloadavg()[0]:.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
