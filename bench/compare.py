"""pgworkerd against its peers, procrastinate and PgQueuer, on one private PostgreSQL.

    bench/compare [--short] [--json out.json]      (the wrapper makes bench/.venv-compare)
    bench/compare --throughput-only [--workers 1,2] [--synchronous-commit on,off] [--baseline DIR]

Each library runs with its own worker command (`pgworkerd run`, `procrastinate worker`,
`pgq run`) as a subprocess, and is driven through its documented public API:

  no-op jobs/s     N no-op jobs bulk-enqueued into an idle worker; the clock starts when the
                   enqueue has committed and stops when all N are done (or a time cap is hit:
                   then done/elapsed). "1 at a time": one job at a time (pgworkerd slots=1,
                   procrastinate -c 1, PgQueuer concurrency_limit=1); "8 at a time":
                   pgworkerd slots=8, procrastinate -c 8, PgQueuer --max-concurrent-tasks 8
                   (--batch-size 4); and PgQueuer with its defaults (no cap, batch 10).
  enqueue→start    one job at a time into an idle worker: from the client's return of the
                   enqueue call (committed) to time.time() at the task's first line.
  enqueue/s        single: one job per call (autocommit), for a fixed window; bulk: the
                   library's batch API, BULK jobs per call.
  rescue           a job that sleeps forever starts on one of two idle workers; that worker's
                   whole process tree is SIGKILLed; seconds until the job starts again on the
                   other, through the library's own mechanism, bounded by RESCUE_WAIT.
  ceiling          pgbench on a minimal table: claim `batch` rows with UPDATE .. FOR UPDATE
                   SKIP LOCKED, then complete them with one UPDATE (two transactions).

  short jobs       --throughput-only: just the no-op rates, for each --workers count (worker
                   processes of the same mode side by side, e.g. "1,2") and each
                   --synchronous-commit setting (e.g. "on,off", set with ALTER SYSTEM and a
                   reload between runs), the libraries interleaved in each round (--rounds),
                   and a reference in the same run: fork + os._exit from a preloaded
                   interpreter, the floor of a fresh process per job.

A benchmark, not a test: figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata as md
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
from pathlib import Path
from typing import Any

import psycopg
from daemon_bench import wait_for
from psycopg import sql

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres

BENCH_DIR = Path(__file__).resolve().parent
# The process-tree helpers the tests use (tests/support/proctree.py, standard library only).
sys.path.insert(0, str(BENCH_DIR.parent / "tests" / "support"))
from proctree import descendants  # noqa: E402

REPO = BENCH_DIR.parent
BIN = Path(sys.executable).parent
SERVER_SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "off",
    "shared_buffers": "256MB",
    "max_connections": "300",
}
BULK = 1000
RESCUE_WAIT = 60.0
LEASE = 10.0  # pgworkerd's lease in the rescue test; the peers' detection times match it


class Starts:
    """The "TOKEN TIME PID PPID" lines the tasks append at their first line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.write_text("")

    def lines(self) -> list[tuple[str, float, int, int]]:
        out = []
        for line in self.path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                out.append((parts[0], float(parts[1]), int(parts[2]), int(parts[3])))
        return out

    def find(self, token: str, skip: int = 0) -> tuple[float, int] | None:
        """The (skip+1)-th start of `token`."""
        seen = 0
        for tok, stamp, pid, _ in self.lines():
            if tok == token:
                if seen == skip:
                    return stamp, pid
                seen += 1
        return None

    def parent_of(self, token: str) -> int | None:
        return next((ppid for tok, _, _, ppid in self.lines() if tok == token), None)


class Worker:
    """A library's worker command as a subprocess in its own session."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            argv,
            env=env,
            cwd=BENCH_DIR,
            stdout=subprocess.DEVNULL,
            stderr=log.open("ab"),
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill_tree()
        self.kill_tree()

    def kill_tree(self) -> None:
        """SIGKILL the worker and everything below it at once: the host died."""
        pids = descendants(self.proc.pid) if self.proc.poll() is None else set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # also what left the tree (reparented)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# -- the libraries ------------------------------------------------------------------------------


class Library:
    name = ""

    def __init__(self, pg: LocalPostgres, workdir: Path) -> None:
        self.settings: dict[str, str] = {}  # worker mode -> what it ran with
        pg.create_database(self.name)
        self.dsn = pg.dsn(self.name)
        # One URI form that libpq (psycopg) and asyncpg both read: unix socket, same server,
        # the password from the cluster's passfile.
        self.uri = (
            f"postgresql://postgres@/{self.name}"
            f"?host={pg.socket_dir}&port={pg.port}&passfile={pg.passfile}"
        )
        self.workdir = workdir
        self.db = psycopg.connect(self.dsn, autocommit=True)  # counting and cleaning only
        self.starts = Starts(workdir / f"{self.name}-starts.log")
        self.probes = 0

    def env(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(BENCH_DIR),
            "BENCH_DSN": self.uri,
            "BENCH_STARTS": str(self.starts.path),
            **extra,
        }

    def run(self, argv: list[str], **env: str) -> None:
        proc = subprocess.run(
            argv, env=self.env(**env), cwd=BENCH_DIR, capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{argv} failed:\n{proc.stdout}{proc.stderr}")

    def scalar(self, query: str) -> int:
        row = self.db.execute(query).fetchone()  # type: ignore[arg-type]
        return int(row[0]) if row and row[0] is not None else 0

    # each library implements these
    def setup(self) -> None: ...
    def worker(self, mode: str, tag: str) -> Worker: ...
    def reset(self) -> None: ...
    def done(self) -> int: ...  # no-op jobs finished
    def enqueue_record(self, token: str, task: str = "record") -> None: ...
    def enqueue_noops(self, n: int) -> None: ...
    def single_enqueue(self, seconds: float) -> tuple[int, float]: ...
    def bulk_enqueue(self, seconds: float) -> tuple[int, float]: ...
    def close(self) -> None:
        self.db.close()

    # shared

    def probe(self, worker: Worker, timeout: float = 60.0) -> None:
        """Wait until `worker` runs a job: enqueue probes until one starts inside its tree."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not worker.alive():
                raise RuntimeError(f"{self.name} worker exited:\n{worker.tail()}")
            self.probes += 1
            token = f"probe{self.probes}"
            self.enqueue_record(token)
            try:
                _, pid = wait_for(lambda t=token: self.starts.find(t), 15, f"{self.name} probe")
            except TimeoutError:
                continue
            # (a fresh process per job may be gone already: then its parent tells)
            ran_in = {worker.proc.pid} | descendants(worker.proc.pid)
            if pid in ran_in or self.starts.parent_of(token) in ran_in:
                return
        raise TimeoutError(f"{self.name} worker never ran a probe job:\n{worker.tail()}")


class Pgworkerd(Library):
    name = "pgworkerd"
    code: Path | None = None  # another checkout's pgworkerd/ (--baseline), else the installed

    def command(self) -> list[str]:
        if self.code is None:
            return [str(BIN / "pgworkerd")]
        return [
            sys.executable,
            "-c",
            "import sys; from pgworkerd.cli import main; sys.exit(main())",
        ]

    def env(self, **extra: str) -> dict[str, str]:
        env = super().env(**extra)
        if self.code is not None:
            env["PYTHONPATH"] = f"{self.code}{os.pathsep}{env['PYTHONPATH']}"
        return env

    def setup(self) -> None:
        self.run([*self.command(), "--dsn", self.dsn, "migrate"])
        self.conn = psycopg.connect(self.dsn, autocommit=True)  # what the API is given

    def worker(self, mode: str, tag: str) -> Worker:
        base: dict[str, Any] = {"lease": "60s", "poll_interval": "1s"}
        worker = {
            "one": {**base, "slots": 1, "warm_children": 1, "max_jobs_per_child": 1000},
            "sat": {**base, "slots": 8, "warm_children": 8, "max_jobs_per_child": 1000},
            "sat1": {**base, "slots": 8, "warm_children": 8, "max_jobs_per_child": 1},
            # the same with 16 claimed jobs held ready for a slot ([worker] prefetch)
            "satp": {
                **base,
                "slots": 8,
                "warm_children": 8,
                "max_jobs_per_child": 1000,
                "prefetch": 16,
            },
            # an async def no-op, 8 side by side in each child (concurrency = 8)
            "async": {**base, "slots": 8, "warm_children": 1, "max_jobs_per_child": 1000},
            "asyncp": {
                **base,
                "slots": 8,
                "warm_children": 1,
                "max_jobs_per_child": 1000,
                "prefetch": 16,
            },
            # as wide as PgQueuer's defaults (no cap): 32 side by side, 32 held ready
            "asyncw": {
                **base,
                "slots": 32,
                "warm_children": 1,
                "max_jobs_per_child": 1000,
                "prefetch": 32,
            },
            # an idle daemon as a user gets it: defaults but for the lease and poll
            "latency": {"slots": 4, "warm_children": 2, "lease": "60s", "poll_interval": "5s"},
            "rescue": {
                "slots": 4,
                "warm_children": 2,
                "lease": f"{LEASE:g}s",
                "renew_interval": f"{LEASE / 3:.1f}s",
            },
        }[mode]
        self.settings[mode] = ", ".join(f"{k}={v}" for k, v in worker.items())
        handlers = {
            "noop": "compare_handlers:anoop"
            if mode.startswith("async")
            else "pgworkerd.examples:noop",
            "record": "compare_handlers:record",
            "hang": "compare_handlers:hang",
        }
        lines = ["[worker]"] + [f"{k} = {json.dumps(v)}" for k, v in worker.items()]
        for name, target in handlers.items():
            lines += [f"[handlers.{name}]", f'target = "{target}"']
            if mode.startswith("async") and name == "noop":
                lines.append(f"concurrency = {worker['slots']}")
        config = self.workdir / f"{self.name}-{tag}.toml"
        config.write_text("\n".join(lines) + "\n")
        return Worker(
            [*self.command(), "--dsn", self.dsn, "--config", str(config), "run"],
            self.env(),
            self.workdir / f"{self.name}-{tag}.log",
        )

    def reset(self) -> None:
        self.db.execute("TRUNCATE pgworkerd.jobs")

    def done(self) -> int:
        return self.scalar(
            "SELECT count(*) FROM pgworkerd.jobs WHERE handler = 'noop' AND status = 'completed'"
        )

    def enqueue_record(self, token: str, task: str = "record") -> None:
        client.enqueue(self.conn, task, {"k": token})

    def enqueue_noops(self, n: int) -> None:
        client.enqueue_many(self.conn, [client.JobSpec("noop") for _ in range(n)])

    def single_enqueue(self, seconds: float) -> tuple[int, float]:
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            client.enqueue(self.conn, "noop")
            done += 1
        return done, time.perf_counter() - start

    def bulk_enqueue(self, seconds: float) -> tuple[int, float]:
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            done += len(
                client.enqueue_many(self.conn, [client.JobSpec("noop") for _ in range(BULK)])
            )
        return done, time.perf_counter() - start

    def close(self) -> None:
        self.conn.close()
        super().close()


def baseline_pgworkerd(code: Path) -> type[Pgworkerd]:
    """pgworkerd run from another checkout (e.g. `git archive main`), in a database of
    its own: before and after a change, interleaved in the same run."""
    return type("BaselinePgworkerd", (Pgworkerd,), {"name": "pgworkerd_base", "code": code})


class AsyncLibrary(Library):
    """A peer with an asyncio client API: one event loop kept for the whole run."""

    def __init__(self, pg: LocalPostgres, workdir: Path) -> None:
        super().__init__(pg, workdir)
        self.loop = asyncio.new_event_loop()

    def sync(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.loop.close()
        super().close()


class Procrastinate(AsyncLibrary):
    name = "procrastinate"
    HEARTBEAT = LEASE / 3
    STALLED = LEASE

    def rescue_env(self) -> dict[str, str]:
        return {
            "BENCH_RESCUE": "1",
            "BENCH_HEARTBEAT": f"{self.HEARTBEAT:g}",
            "BENCH_STALLED": f"{self.STALLED:g}",
        }

    def setup(self) -> None:
        cli = [str(BIN / "procrastinate"), "--app=compare_procrastinate.app"]
        self.run([*cli, "schema", "--apply"])
        os.environ["BENCH_DSN"] = self.uri  # read when the app module is imported
        sys.path.insert(0, str(BENCH_DIR))
        import compare_procrastinate

        self.mod = compare_procrastinate
        self.sync(self.mod.app.open_async())

    def worker(self, mode: str, tag: str) -> Worker:
        concurrency = {"one": 1, "sat": 8, "latency": 4, "rescue": 4}[mode]
        extra = self.rescue_env() if mode == "rescue" else {}
        self.settings[mode] = f"worker -c {concurrency}" + (
            f", update_heartbeat_interval={self.HEARTBEAT:g}s, stalled_worker_timeout="
            f"{self.STALLED:g}s, retry_stalled_jobs every 2s "
            f"(get_stalled_jobs(seconds_since_heartbeat={self.STALLED:g}))"
            if extra
            else ""
        )
        return Worker(
            [
                str(BIN / "procrastinate"),
                "--app=compare_procrastinate.app",
                "worker",
                "-c",
                str(concurrency),
            ],
            self.env(**extra),
            self.workdir / f"procrastinate-{tag}.log",
        )

    def reset(self) -> None:
        self.db.execute(
            "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers,"
            " procrastinate_workers CASCADE"
        )

    def done(self) -> int:
        return self.scalar(
            "SELECT count(*) FROM procrastinate_jobs WHERE task_name = 'noop'"
            " AND status = 'succeeded'"
        )

    def enqueue_record(self, token: str, task: str = "record") -> None:
        self.sync(getattr(self.mod, task).defer_async(k=token))

    def enqueue_noops(self, n: int) -> None:
        self.sync(self.mod.noop.batch_defer_async(*({} for _ in range(n))))

    def single_enqueue(self, seconds: float) -> tuple[int, float]:
        async def loop() -> tuple[int, float]:
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                await self.mod.noop.defer_async()
                done += 1
            return done, time.perf_counter() - start

        return self.sync(loop())  # type: ignore[no-any-return]

    def bulk_enqueue(self, seconds: float) -> tuple[int, float]:
        async def loop() -> tuple[int, float]:
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                done += len(await self.mod.noop.batch_defer_async(*({} for _ in range(BULK))))
            return done, time.perf_counter() - start

        return self.sync(loop())  # type: ignore[no-any-return]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.sync(self.mod.app.close_async())
        super().close()


class PgQueuer(AsyncLibrary):
    name = "pgqueuer"

    def setup(self) -> None:
        self.run([str(BIN / "pgq"), "--pg-dsn", self.uri, "install"])
        import asyncpg
        from pgqueuer import AsyncpgDriver, Queries

        self.aconn = self.sync(asyncpg.connect(self.uri))
        self.queries = Queries(AsyncpgDriver(self.aconn))
        self.enqueued = 0

    def worker(self, mode: str, tag: str) -> Worker:
        # concurrency_limit is per entrypoint and enforced in SQL across workers (the only
        # way to get exactly 1); --max-concurrent-tasks caps this worker (>= 2 x batch).
        limit = 1 if mode == "one" else 0
        options = {
            "one": [],
            "sat": ["--batch-size", "4", "--max-concurrent-tasks", "8"],
            "free": [],
            "latency": [],
            "rescue": ["--heartbeat-timeout", f"{LEASE:g}", "--dequeue-timeout", "5"],
        }[mode]
        argv = [str(BIN / "pgq"), "run", "compare_pgqueuer:main", *options]
        self.settings[mode] = (
            f"pgq run {' '.join(options) or '(defaults: batch-size 10, unlimited)'}"
            + (", entrypoint concurrency_limit=1" if limit else "")
        )
        return Worker(
            argv, self.env(BENCH_PGQ_CONCURRENCY=str(limit)), self.workdir / f"pgqueuer-{tag}.log"
        )

    def reset(self) -> None:
        self.db.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
        self.enqueued = 0

    def done(self) -> int:
        # Finished jobs leave the queue table (their status goes to pgqueuer_log).
        left = self.scalar("SELECT count(*) FROM pgqueuer WHERE entrypoint = 'noop'")
        return self.enqueued - left

    def enqueue_record(self, token: str, task: str = "record") -> None:
        self.sync(self.queries.enqueue(task, token.encode()))

    def enqueue_noops(self, n: int) -> None:
        self.sync(self.queries.enqueue(["noop"] * n, [None] * n, [0] * n))
        self.enqueued += n

    def single_enqueue(self, seconds: float) -> tuple[int, float]:
        async def loop() -> tuple[int, float]:
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                await self.queries.enqueue("noop", None)
                done += 1
            return done, time.perf_counter() - start

        return self.sync(loop())  # type: ignore[no-any-return]

    def bulk_enqueue(self, seconds: float) -> tuple[int, float]:
        async def loop() -> tuple[int, float]:
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                done += len(await self.queries.enqueue(["noop"] * BULK, [None] * BULK, [0] * BULK))
            return done, time.perf_counter() - start

        return self.sync(loop())  # type: ignore[no-any-return]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.sync(self.aconn.close())
        super().close()


# -- the measurements ---------------------------------------------------------------------------


def throughput(
    lib: Library, mode: str, n_jobs: int, cap: float, workers: int = 1
) -> dict[str, Any]:
    lib.reset()
    started = [lib.worker(mode, f"tp-{mode}-{n}") for n in range(workers)]
    try:
        for w in started:
            lib.probe(w)
        before = lib.done()
        lib.enqueue_noops(n_jobs)
        start = time.monotonic()
        deadline = start + cap
        done = 0
        while time.monotonic() < deadline:
            done = lib.done() - before
            if done >= n_jobs:
                break
            time.sleep(0.02)
        elapsed = time.monotonic() - start
    finally:
        for w in started:
            w.stop()
    return {
        "workers": workers,
        "jobs": n_jobs,
        "done": done,
        "seconds": round(elapsed, 2),
        "capped": done < n_jobs,
        "jobs_per_s": round(done / elapsed),
    }


def latency(lib: Library, samples: int) -> dict[str, Any]:
    lib.reset()
    w = lib.worker("latency", "latency")
    gaps = []
    try:
        lib.probe(w)
        time.sleep(0.5)
        for n in range(samples):
            token = f"lat{n}"
            lib.enqueue_record(token)
            enqueued = time.time()
            stamp, _ = wait_for(lambda t=token: lib.starts.find(t), 10, f"job {n}", 0.0005)
            gaps.append((stamp - enqueued) * 1000)
            time.sleep(0.02)  # idle again
    finally:
        w.stop()
    gaps.sort()
    return {
        "samples": samples,
        "p50_ms": round(statistics.median(gaps), 2),
        "p99_ms": round(gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))], 2),
        "max_ms": round(gaps[-1], 2),
    }


def enqueue_rates(lib: Library, seconds: float) -> dict[str, Any]:
    lib.reset()
    single, s_elapsed = lib.single_enqueue(seconds)
    lib.reset()
    bulk, b_elapsed = lib.bulk_enqueue(seconds)
    lib.reset()
    return {
        "single_per_s": round(single / s_elapsed),
        "bulk_per_s": round(bulk / b_elapsed),
        "bulk_size": BULK,
    }


def rescue(lib: Library) -> dict[str, Any]:
    """Two idle workers; the one running the hanging job is SIGKILLed (whole tree)."""
    lib.reset()
    w1 = lib.worker("rescue", "rescue1")
    w2: Worker | None = None
    try:
        lib.probe(w1)
        w2 = lib.worker("rescue", "rescue2")
        lib.probe(w2)
        lib.enqueue_record("victim", task="hang")
        _, pid = wait_for(lambda: lib.starts.find("victim"), 30, "the hanging job", 0.002)
        victim = w1 if pid in descendants(w1.proc.pid) else w2
        other = w2 if victim is w1 else w1
        killed = time.time()
        victim.kill_tree()
        try:
            again, pid2 = wait_for(
                lambda: lib.starts.find("victim", skip=1), RESCUE_WAIT, "rescue", 0.01
            )
        except TimeoutError:
            return {
                "seconds": None,
                "outcome": f"not rerun within {RESCUE_WAIT:g}s",
                "other_alive": other.alive(),
            }
        return {
            "seconds": round(again - killed, 2),
            "outcome": "rerun",
            "on_other_worker": pid2 in descendants(other.proc.pid),
        }
    finally:
        w1.stop()
        if w2 is not None:
            w2.stop()


CEILING_TABLE = """
CREATE TABLE ceiling_jobs (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'pending',
    payload jsonb NOT NULL DEFAULT '{}',
    locked_by text,
    locked_until timestamptz,
    finished_at timestamptz
);
CREATE INDEX ceiling_jobs_pending ON ceiling_jobs (id) WHERE status = 'pending';
"""


def ceiling_script(batch: int) -> str:
    return f"""\
WITH picked AS (
    SELECT id FROM ceiling_jobs WHERE status = 'pending' ORDER BY id
     LIMIT {batch} FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE ceiling_jobs j SET status = 'running', locked_by = 'c' || :client_id,
           locked_until = now() + interval '60 seconds'
      FROM picked WHERE j.id = picked.id RETURNING j.id
)
SELECT coalesce(array_agg(id), '{{}}') AS ids FROM claimed
\\gset
UPDATE ceiling_jobs SET status = 'completed', locked_by = NULL, locked_until = NULL,
       finished_at = now()
 WHERE id = ANY(:ids::bigint[]) AND status = 'running';
"""


_TPS_RE = re.compile(r"^tps = ([0-9.]+)", re.MULTILINE)


def ceiling(
    pg: LocalPostgres, workdir: Path, batch: int, clients: int, seconds: int, fill: int
) -> dict[str, Any]:
    pg.create_database("ceiling")
    dsn = pg.dsn("ceiling")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS ceiling_jobs")
        conn.execute(CEILING_TABLE)  # type: ignore[arg-type]
        conn.execute(
            "INSERT INTO ceiling_jobs (payload) SELECT '{}' FROM generate_series(1, %s)", [fill]
        )
        conn.execute("VACUUM ANALYZE ceiling_jobs")
        conn.execute("CHECKPOINT")
        script = workdir / f"ceiling-{batch}.sql"
        script.write_text(ceiling_script(batch))
        start = time.monotonic()
        proc = subprocess.run(
            [
                "pgbench",
                "-n",
                "-M",
                "extended",
                "-f",
                str(script),
                "-c",
                str(clients),
                "-j",
                str(clients),
                "-T",
                str(seconds),
                dsn,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        elapsed = time.monotonic() - start
        out = proc.stdout + proc.stderr
        if proc.returncode != 0 or not _TPS_RE.search(out):
            raise RuntimeError(f"pgbench failed:\n{out}")
        row = conn.execute(
            "SELECT count(*) FROM ceiling_jobs WHERE status = 'completed'"
        ).fetchone()
        done = int(row[0]) if row else 0
        left = conn.execute("SELECT count(*) FROM ceiling_jobs WHERE status = 'pending'").fetchone()
    # pgbench's own -T window; the job count comes from the table.
    return {
        "batch": batch,
        "clients": clients,
        "seconds": seconds,
        "jobs": done,
        "jobs_per_s": round(done / seconds),
        "drained": bool(left and left[0] == 0),
        "wall_s": round(elapsed, 1),
    }


def fork_exit_floor(seconds: float) -> dict[str, Any]:
    """fork + os._exit from an interpreter with pgworkerd's child preloaded, one at a time
    per core: the floor under any fresh-process-per-job rate on this machine, now."""
    code = (
        "import os, sys, time\n"
        "import pgworkerd.worker.child, pgworkerd.examples\n"
        "end, n = time.monotonic() + float(sys.argv[1]), 0\n"
        "while time.monotonic() < end:\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os._exit(0)\n"
        "    os.waitpid(pid, 0)\n"
        "    n += 1\n"
        "print(n)\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(seconds)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(os.cpu_count() or 1)
    ]
    total = sum(int((p.communicate()[0] or "0").strip() or 0) for p in procs)
    return {"per_s": round(total / seconds), "processes": len(procs), "seconds": seconds}


def set_synchronous_commit(pg: LocalPostgres, value: str) -> None:
    with psycopg.connect(pg.dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER SYSTEM SET synchronous_commit = {}").format(value))
        conn.execute("SELECT pg_reload_conf()")


# (library, worker mode, label) of the short-job rounds
SHORT_JOB_RUNS = (
    ("pgworkerd", "sat", "pgworkerd, 8 slots, children reused (max_jobs_per_child=1000)"),
    ("pgworkerd_base", "sat", "  the same, the --baseline code"),
    ("pgworkerd", "satp", "pgworkerd, 8 slots, children reused, prefetch 16"),
    ("pgworkerd_base", "satp", "  the same (prefetch 16), the --baseline code"),
    ("pgworkerd", "async", "pgworkerd, 8 slots, async def no-op, concurrency 8, reused"),
    ("pgworkerd", "asyncp", "  the same, prefetch 16"),
    ("pgworkerd_base", "asyncp", "  the same (async, prefetch 16), the --baseline code"),
    ("pgworkerd", "asyncw", "pgworkerd, 32 slots, async def no-op, concurrency 32, prefetch 32"),
    ("pgworkerd", "sat1", "pgworkerd, 8 slots, a fresh process per job"),
    ("pgworkerd_base", "sat1", "  a fresh process per job, the --baseline code"),
    ("pgqueuer", "free", "PgQueuer, defaults (batch 10, no cap)"),
    ("pgqueuer", "sat", "PgQueuer, 8 at a time (batch 4)"),
    ("procrastinate", "sat", "procrastinate, -c 8"),
)


def short_jobs(
    pg: LocalPostgres,
    workdir: Path,
    only: list[str],
    workers: list[int],
    sync: list[str],
    rounds: int,
    n_jobs: int,
    cap: float,
    baseline: Path | None = None,
) -> dict[str, Any]:
    """The no-op rates for every (synchronous_commit, workers) pair, each library's runs
    interleaved with the others' in every round; medians of the rounds."""
    classes: dict[str, type[Library]] = {
        "pgworkerd": Pgworkerd,
        "procrastinate": Procrastinate,
        "pgqueuer": PgQueuer,
    }
    if baseline is not None:
        classes["pgworkerd_base"] = baseline_pgworkerd(baseline)
        only = [*only, "pgworkerd_base"]

    def base_knows(mode: str) -> bool:
        """Whether the baseline code has what the mode's config needs (prefetch came
        with async handlers' concurrency): an older one runs sat and sat1 only."""
        tables = baseline / "pgworkerd" / "config" / "tables.py" if baseline else None
        return mode in ("sat", "sat1") or (
            tables is not None and tables.exists() and "prefetch" in tables.read_text()
        )

    libs: dict[str, Library] = {}
    out: dict[str, Any] = {"runs": {}, "floor": [], "settings": {}}
    try:
        for name in only:
            libs[name] = classes[name](pg, workdir)
            libs[name].setup()
        for value in sync:
            set_synchronous_commit(pg, value)
            for count in workers:
                for rnd in range(rounds):
                    out["floor"].append(fork_exit_floor(2.0))
                    for name, mode, label in SHORT_JOB_RUNS:
                        if name not in libs or (name == "pgworkerd_base" and not base_knows(mode)):
                            continue
                        key = f"sync={value} workers={count} {label}"
                        r = throughput(libs[name], mode, n_jobs, cap, count)
                        out["runs"].setdefault(key, []).append(r)
                        print(
                            f"  round {rnd + 1}: {key}: {r['jobs_per_s']:,} jobs/s"
                            f"{' (capped)' if r['capped'] else ''}; load {loadavg()}",
                            flush=True,
                        )
        set_synchronous_commit(pg, "off")
    finally:
        for lib in libs.values():
            out["settings"][lib.name] = dict(lib.settings)
            lib.close()
    return out


def short_jobs_table(res: dict[str, Any]) -> list[str]:
    lines = [f"{'no-op jobs/s (median of rounds; each round)':<88}{'median':>9}  rounds"]
    for key, runs in res["runs"].items():
        rates = [r["jobs_per_s"] for r in runs]
        capped = " (time cap hit)" if any(r["capped"] for r in runs) else ""
        lines.append(
            f"{key:<88}{statistics.median(rates):>9,.0f}  "
            f"{', '.join(f'{x:,}' for x in rates)}{capped}"
        )
    floors = [f["per_s"] for f in res["floor"]]
    if floors:
        lines.append(
            f"{'fork + os._exit alone, one process per core (the floor of a fresh process)':<88}"
            f"{statistics.median(floors):>9,.0f}  {', '.join(f'{x:,}' for x in floors)}"
        )
    return lines


# -- the report ---------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    out = {}
    for dist in ("pgworkerd", "procrastinate", "pgqueuer", "psycopg", "asyncpg"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "?"
    rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "pgworkerd"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    out["pgworkerd"] += f" ({rev}{'+dirty' if dirty else ''})"
    return out


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


LIBS = ("pgworkerd", "procrastinate", "pgqueuer")


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if unit == "s":
        return f"{value:.1f} s"
    if unit == "ms":
        return f"{value:.1f}"
    return f"{value:,.0f}"


def table(results: dict[str, Any]) -> list[str]:
    """One row per metric: each library, pgworkerd ÷ best peer, and each vs the ceiling."""
    r = results["libraries"]
    ceil = results["ceiling"]
    rows: list[tuple[str, dict[str, float | None], bool, float | None, str]] = []

    def get(lib: str, *keys: str) -> float | None:
        value: Any = r.get(lib, {})
        for k in keys:
            value = value.get(k) if isinstance(value, dict) else None
        return value

    def row(
        label: str,
        keys: tuple[str, ...],
        higher: bool = True,
        ceiling: float | None = None,
        unit: str = "",
        libs: tuple[str, ...] = LIBS,
    ) -> None:
        rows.append((label, {lib: get(lib, *keys) for lib in libs}, higher, ceiling, unit))

    b1, b10 = ceil["batch1"]["jobs_per_s"], ceil["batch10"]["jobs_per_s"]
    row("no-op jobs/s, 1 at a time", ("noop_one", "jobs_per_s"), ceiling=b1)
    row("no-op jobs/s, 8 at a time", ("noop_sat", "jobs_per_s"), ceiling=b10)
    row(
        "  pgworkerd max_jobs_per_child=1",
        ("noop_sat1", "jobs_per_s"),
        ceiling=b10,
        libs=("pgworkerd",),
    )
    row(
        "  pgqueuer defaults (no cap)", ("noop_free", "jobs_per_s"), ceiling=b10, libs=("pgqueuer",)
    )
    row("enqueue->start p50 ms (idle)", ("latency", "p50_ms"), higher=False, unit="ms")
    row("enqueue->start p99 ms (idle)", ("latency", "p99_ms"), higher=False, unit="ms")
    row("single enqueue/s", ("enqueue", "single_per_s"))
    row(f"bulk enqueue/s ({BULK}/call)", ("enqueue", "bulk_per_s"))
    row("rerun after SIGKILL, s", ("rescue", "seconds"), higher=False, unit="s")

    head = (
        f"{'metric':<34}{'pgworkerd':>11}{'procrast.':>11}{'pgqueuer':>11}"
        f"{'pgw/best':>10}{'ceiling':>9}  % of ceiling (pgw/proc/pgq)"
    )
    out = [head, "-" * len(head)]
    for label, vals, higher, ceiling_value, unit in rows:
        cells = "".join(f"{fmt(vals.get(lib), unit) if lib in vals else '':>11}" for lib in LIBS)
        peers = [v for k, v in vals.items() if k != "pgworkerd" and v is not None]
        pgw = vals.get("pgworkerd")
        ratio = ""
        if peers and pgw:
            best = max(peers) if higher else min(peers)
            ratio = f"{pgw / best:.2f}x" if higher else f"{best / pgw:.2f}x"
        elif pgw and "pgworkerd" in vals and len(vals) > 1:
            ratio = "no peer"
        cl = ""
        if ceiling_value:
            cl = " / ".join(
                f"{100 * v / ceiling_value:.0f}%" if v is not None else "-" for v in vals.values()
            )
        out.append(
            f"{label:<34}{cells}{ratio:>10}{fmt(ceiling_value) if ceiling_value else '':>9}  {cl}"
        )
    for lib in LIBS:
        res = get(lib, "rescue", "outcome")
        if res and res != "rerun":
            out.append(f"  {lib} rescue: {res}")
        for key in ("noop_one", "noop_sat", "noop_sat1", "noop_free"):
            if get(lib, key, "capped"):
                out.append(
                    f"  {lib} {key}: time cap hit ({get(lib, key, 'done'):.0f} of "
                    f"{get(lib, key, 'jobs'):.0f} jobs); the rate is done/elapsed"
                )
    out.append(
        "pgw/best: pgworkerd ÷ best peer for rates, best peer ÷ pgworkerd for times "
        "(>1: pgworkerd better)"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="a quick run (~3-4 min)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--only", help="comma-separated libraries to run (default: all)")
    parser.add_argument(
        "--throughput-only",
        action="store_true",
        help="only the short-job rounds: no-op rates per --workers and --synchronous-commit",
    )
    parser.add_argument("--workers", default="1,2", help="worker processes per run, e.g. 1,2")
    parser.add_argument(
        "--synchronous-commit", default="on,off", help="server settings to run with, e.g. on,off"
    )
    parser.add_argument("--rounds", type=int, default=3, help="short-job rounds (interleaved)")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="with --throughput-only: also run the pgworkerd of this source tree (the "
        "directory holding its pgworkerd/ package), interleaved, in a database of its own",
    )
    args = parser.parse_args()
    workers = [int(w) for w in args.workers.split(",")]
    sync = args.synchronous_commit.split(",")
    if any(w < 1 for w in workers) or any(v not in ("on", "off", "local") for v in sync):
        parser.error("--workers takes counts >= 1, --synchronous-commit on, off or local")
    n_jobs, cap = (2000, 8.0) if args.short else (20000, 40.0)
    samples = 30 if args.short else 300
    window = 2.0 if args.short else 5.0
    pgbench_s = 3 if args.short else 10
    only = args.only.split(",") if args.only else list(LIBS)
    results: dict[str, Any] = {
        "mode": "short" if args.short else "full",
        "machine": f"{platform.node()} {os.cpu_count()} cpus {platform.machine()} "
        f"Python {platform.python_version()}",
        "versions": versions(),
        "loadavg_start": loadavg(),
        "libraries": {},
        "settings": {},
    }
    t0 = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="pgworkerd-compare-") as tmp,
        LocalPostgres(settings=SERVER_SETTINGS) as pg,
    ):
        workdir = Path(tmp)
        os.chmod(workdir, 0o755)
        with psycopg.connect(pg.dsn(), autocommit=True) as conn:
            row = conn.execute("SHOW server_version").fetchone()
            results["postgres"] = str(row[0]) if row else "?"
        v = results["versions"]
        print(f"# pgworkerd vs peers ({results['mode']}) on {results['machine']}", flush=True)
        print(
            f"# pgworkerd {v['pgworkerd']}, procrastinate {v['procrastinate']}, pgqueuer "
            f"{v['pgqueuer']} (asyncpg {v['asyncpg']}), psycopg {v['psycopg']}; PostgreSQL "
            f"{results['postgres']} ({', '.join(f'{k}={x}' for k, x in SERVER_SETTINGS.items())})"
            f", unix socket",
            flush=True,
        )
        print(f"# load average at start: {results['loadavg_start']}", flush=True)
        if args.throughput_only:
            short = short_jobs(
                pg, workdir, only, workers, sync, args.rounds, n_jobs, cap, args.baseline
            )
            results["short_jobs"] = short
            results["loadavg_end"] = loadavg()
            lines = [
                f"# short jobs ({results['mode']}: {n_jobs} no-op jobs per run, capped at "
                f"{cap:g} s, {args.rounds} rounds); load average start "
                f"{results['loadavg_start']}, end {results['loadavg_end']}",
            ]
            for name, modes in short["settings"].items():
                for mode, text in modes.items():
                    lines.append(f"#   {name} {mode}: {text}")
            print("\n".join(lines + short_jobs_table(short)), flush=True)
            if args.json:
                args.json.write_text(json.dumps(results, indent=2))
            return
        fill = 400_000 if args.short else 1_200_000
        results["ceiling"] = {
            "batch1": ceiling(pg, workdir, 1, 1, pgbench_s, fill // 4),
            "batch10": ceiling(pg, workdir, 10, 2, pgbench_s, fill),
        }
        print(f"  ceiling done ({time.monotonic() - t0:.0f}s)", flush=True)
        classes: dict[str, type[Library]] = {
            "pgworkerd": Pgworkerd,
            "procrastinate": Procrastinate,
            "pgqueuer": PgQueuer,
        }
        for name in only:
            lib = classes[name](pg, workdir)
            res: dict[str, Any] = {}
            try:
                lib.setup()
                res["enqueue"] = enqueue_rates(lib, window)
                res["noop_one"] = throughput(lib, "one", n_jobs // 2, cap)
                res["noop_sat"] = throughput(lib, "sat", n_jobs, cap)
                if name == "pgworkerd":
                    res["noop_sat1"] = throughput(lib, "sat1", n_jobs, cap)
                if name == "pgqueuer":
                    res["noop_free"] = throughput(lib, "free", n_jobs, cap)
                res["latency"] = latency(lib, samples)
                res["rescue"] = rescue(lib)
            except Exception as exc:  # report what was measured, and why the rest is missing
                res["error"] = f"{type(exc).__name__}: {exc}"
                print(f"  {name}: {res['error']}", file=sys.stderr, flush=True)
            finally:
                lib.close()
            results["libraries"][name] = res
            results["settings"][name] = dict(lib.settings)
            print(f"  {name} done ({time.monotonic() - t0:.0f}s)", flush=True)
    results["loadavg_end"] = loadavg()
    results["seconds"] = round(time.monotonic() - t0)
    lines = [
        f"# pgworkerd vs peers ({results['mode']}) on {results['machine']}; "
        f"load average start {results['loadavg_start']}, end {results['loadavg_end']}; "
        f"{results['seconds']} s",
        "# versions: "
        + ", ".join(f"{k} {x}" for k, x in results["versions"].items())
        + f"; PostgreSQL {results['postgres']}",
    ]
    for name, modes in results["settings"].items():
        for mode, text in modes.items():
            lines.append(f"#   {name} {mode}: {text}")
    c = results["ceiling"]
    lines.append(
        f"# ceiling: pgbench claim (SKIP LOCKED) + complete, batch 1 x 1 client "
        f"{c['batch1']['jobs_per_s']:,} jobs/s, batch 10 x 2 clients "
        f"{c['batch10']['jobs_per_s']:,} jobs/s ({c['batch10']['seconds']} s each); "
        f"no-op rows compare 1-at-a-time with batch 1 and 8-at-a-time with batch 10"
    )
    lines.append(
        f"# no-op runs: up to {n_jobs // 2} (1 at a time) / {n_jobs} (8 at a time) "
        f"jobs, capped at {cap:g} s; latency {samples} samples; enqueue windows "
        f"{window:g} s; rescue bounded at {RESCUE_WAIT:g} s"
    )
    lines += table(results)
    for name, res in results["libraries"].items():
        if "error" in res:
            lines.append(f"  {name}: ERROR {res['error']}")
    print("\n".join(lines), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
