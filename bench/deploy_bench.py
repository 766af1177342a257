"""deploy/deploy-host on a busy host under a real systemd: wall time from the start of the
deploy to READY of the new version, split into its phases.

    .venv/bin/python bench/deploy_bench.py --short      # ~1 minute: 1 round, grace 5s
    .venv/bin/python bench/deploy_bench.py              # 3 rounds, grace 30s

The host: one daemon under a unit derived from systemd/pgworkerd.service (the testbed of
tests/support/sdtestbed.py, root, as tests/acceptance/test_systemd.py runs it), running
--jobs long jobs (2 hours each): all but one checkpoint every --step seconds and stop
when asked (tests/support/deployhandlers.py:transcode), one ignores the request and runs
a subprocess (stubborn), so the deploy always waits out the whole grace. The install
command is `true`: the figures are deploy-host's own cost.

Printed per round: hand-back (deploy start -> host empty, `installing`), restart
(`systemctl restart` -> READY=1, when it returns), total (start -> READY), and after
READY: when every job runs again on the new daemon, how many checkpointing jobs kept
their checkpoints (they resume from them), attempts counted by the hand-back (0
expected) and job processes of the old tree seen at install (0 expected). A benchmark,
not a test: nothing is asserted.
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
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests" / "support"), str(REPO / "tests" / "acceptance")]

import psycopg  # noqa: E402
from sdtestbed import Testbed, unavailable_reason  # noqa: E402
from test_systemd import DB, HANDLERS, PGWORKERD, Service  # noqa: E402

import pgworkerd.queue.admin  # noqa: E402
from pgworkerd.devcluster.localpg import LocalPostgres  # noqa: E402
from pgworkerd.queue.migrate import migrate  # noqa: E402

DEPLOY_HOST = REPO / "deploy" / "deploy-host"
PYTHONPATH = f'"PYTHONPATH={REPO}:{REPO / "tests" / "support"}"'
TWO_HOURS = 7200.0


def one_round(tb: Testbed, pg: LocalPostgres, workdir: Path, args: argparse.Namespace) -> dict:
    schema = f"b_{uuid.uuid4().hex[:8]}"
    migrate(pg.dsn(DB), schema=schema)
    svc = Service(tb, pg, f"pgw-bench-{schema[2:]}.service", schema, workdir / f"{schema}.toml")
    svc.write_config(
        {
            **HANDLERS,
            "transcode": "deployhandlers:transcode",
            "stubborn": "deployhandlers:stubborn",
        }
    )
    svc.install(Environment=PYTHONPATH, TimeoutStopSec="5min")
    try:
        svc.start()
        steps = int(TWO_HOURS / args.step)
        jobs = [
            svc.enqueue("transcode", {"steps": steps, "step_seconds": args.step})
            for _ in range(args.jobs - 1)
        ]
        jobs.append(svc.enqueue("stubborn", {"marker": 7000 + len(jobs)}))
        # Every transcode has saved a checkpoint: mid-job, as a busy host is.
        svc.wait(
            lambda: (
                all(svc.job(j)["checkpoint"] for j in jobs[:-1])
                and svc.job_status(jobs[-1]) == "running"
            ),
            "every job running with a checkpoint",
            timeout=60 + 2 * args.step,
        )
        env = {
            "PGWORKERD": str(PGWORKERD),
            "PYTHONPATH": str(REPO),
            "PGWORKERD_DSN": svc.pg.tcp_dsn(DB),
            "PGWORKERD_SCHEMA": schema,
            "PGWORKERD_CONFIG": str(svc.config),
        }
        ps_file = workdir / f"{schema}-ps.txt"
        argv = [
            "nsenter", "-t", str(tb.pid), "-m", "-p", "-u", "--", "env",
            *(f"{k}={v}" for k, v in env.items()),
            str(DEPLOY_HOST), "--unit", svc.unit, "--grace", args.grace, "--",
            "sh", "-c", 'ps -eo args --no-headers > "$1"', "sh", str(ps_file),
        ]  # fmt: skip
        marks: dict[str, float] = {}
        started = time.monotonic()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        for line in proc.stderr:
            now = time.monotonic() - started
            for key in ("installing", "restarting", "done"):
                if line.startswith(f"deploy-host: {key}"):
                    marks[key] = now
        proc.wait()
        if proc.returncode != 0 or "done" not in marks:
            raise RuntimeError(f"deploy-host exit {proc.returncode}\n{svc.journal()}")
        ready = marks["done"]
        svc.wait(
            lambda: all(svc.job_status(j) == "running" for j in jobs),
            "every job running on the new daemon",
            timeout=120,
        )
        again = time.monotonic() - started - ready
        with psycopg.connect(pg.dsn(DB), autocommit=True) as conn:
            rows = [pgworkerd.queue.admin.get(conn, j, schema=schema) for j in jobs]
            released = conn.execute(
                f"SELECT count(*) FROM {schema}.attempts WHERE outcome = 'released'"
            ).fetchone()
        ps = ps_file.read_text()
        return {
            "hand_back": marks["installing"],
            "restart": ready - marks["restarting"],
            "total": ready,
            "all_running_again_after_ready": again,
            "checkpoints_kept": sum(1 for r in rows[:-1] if r is not None and r["checkpoint"]),
            "attempts_counted_by_hand_back": sum(r["attempts"] for r in rows if r) - len(rows),
            "released_attempts": released[0] if released else None,
            "job_processes_at_install": sum(
                1 for ln in ps.splitlines() if ln.startswith("pgworkerd: job") or "sleep 70" in ln
            ),
        }
    finally:
        tb.systemctl("kill", "--signal=SIGKILL", svc.unit, check=False)
        tb.systemctl("stop", svc.unit, check=False)
        tb.systemctl("reset-failed", svc.unit, check=False)
        tb.remove_unit(svc.unit)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="1 round, 2 jobs, grace 5s (CI)")
    parser.add_argument("--rounds", type=int, help="deploys measured (default 3; short 1)")
    parser.add_argument("--jobs", type=int, help="running jobs on the host (4; short 2)")
    parser.add_argument("--grace", help="deploy-host --grace (default 30s; short 5s)")
    parser.add_argument("--step", type=float, help="seconds between checkpoints (10; short 1)")
    a = parser.parse_args()
    a.rounds = a.rounds or (1 if a.short else 3)
    a.jobs = max(1, a.jobs or (2 if a.short else 4))
    a.grace = a.grace or ("5s" if a.short else "30s")
    a.step = a.step or (1.0 if a.short else 10.0)
    reason = unavailable_reason()
    if reason:
        sys.exit(f"deploy_bench: no systemd testbed here: {reason}")
    print(
        f"deploy-host on a busy host: {a.jobs} job(s) of 2 h ({a.jobs - 1} checkpointing every"
        f" {a.step:g}s, 1 ignoring stop requests), --grace {a.grace}, install `true`;"
        f" worker kill_grace 2s; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="deploy-bench-") as tmp:
        workdir = Path(tmp)
        (workdir / "tb").mkdir()
        with Testbed(workdir / "tb") as tb, LocalPostgres() as pg:
            pg.create_database(DB)
            for n in range(a.rounds):
                r = one_round(tb, pg, workdir, a)
                results.append(r)
                print(f"round {n + 1}: " + json.dumps({k: round(v, 2) for k, v in r.items()}))
    for key in ("hand_back", "restart", "total", "all_running_again_after_ready"):
        values = [r[key] for r in results]
        print(f"{key:<32} median {statistics.median(values):6.2f} s  max {max(values):6.2f} s")


if __name__ == "__main__":
    main()
