"""Queue-core benchmark: pgworkerd's Python API against the raw SQL ceiling measured by pgbench.

    .venv/bin/python bench/queue_bench.py [--dsn DSN] [--short] [--unprepared] [--json out.json]
                                          [--limits-only]

Every row times the same work three ways, on the same server, table and kind of connection:

  python    pgworkerd's API: queue.lease (claim/complete), client (enqueue, enqueue_many)
  same SQL  pgworkerd's own statements from sql/queries/, run by pgbench with the same
            parameters: what the API would reach with a free client (shows the Python share)
  raw SQL   hand-written minimal SQL doing the same work, run by pgbench: the ceiling

The ratio python/raw is what the targets are about; python/same is the client's own cost.

Without --dsn a private LocalPostgres is started with one set of server settings for the whole
run. Every side uses the extended query protocol, by default with server-side prepared
statements, the way the daemon runs (database.prepared_statements = true): psycopg through
pgworkerd.queue.db.connect(prepare=True) and `pgbench -M prepared`. --unprepared measures the
PgBouncer < 1.21 mode instead (prepared_statements = false): connect(prepare=False), i.e.
prepare_threshold=None, against `pgbench -M extended`. The header says which mode ran.
Each timed run starts from an emptied job table (TRUNCATE), pre-filled by one raw INSERT,
VACUUM ANALYZEd and CHECKPOINTed. Runs are interleaved and, in a full run, repeated; the
table shows medians, --json every sample. A benchmark, not a test: targets are reported,
never asserted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, LiteralString

import psycopg
from psycopg import sql

from pgworkerd import client
from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue import lease
from pgworkerd.queue.db import PREPARE_THRESHOLD, connect
from pgworkerd.queue.migrate import migrate
from pgworkerd.queue.queries import query, render

# The queue calls the tests hold jobs with (tests/support/leasing.py: claim, complete).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
import leasing

HANDLER = "noop"
# the binding-limit row: a handler at its max_running with a backlog
BLOCKED_HANDLER = "blocked"
BLOCKED_RUNNING = 4
BLOCKED_BACKLOG = 100_000
QUEUE = "default"
LEASE_SECONDS = 60
BULK_SIZE = 10_000

# One set of server settings for every row. fsync stays on (a queue must survive power loss);
# synchronous_commit=off is the usual choice for job tables and keeps the disk's flush latency
# out of the ratios. A large max_wal_size plus an explicit CHECKPOINT before every timed run
# keep checkpoints out of the measurements.
SERVER_SETTINGS: dict[str, str] = {
    "fsync": "on",
    "full_page_writes": "on",
    "synchronous_commit": "off",
    "shared_buffers": "512MB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "30min",
    "maintenance_work_mem": "256MB",
}
SHOWN_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "shared_buffers",
    "max_wal_size",
    "checkpoint_timeout",
    "autovacuum",
    "wal_level",
)


@dataclass(frozen=True)
class Config:
    seconds: int  # length of each timed run (pgbench -T takes whole seconds)
    reps: int  # interleaved repetitions of every run; the table shows medians
    fill_per_second: int  # pending jobs pre-filled per second of a claim run, per 2 connections
    history_rows: int  # finished rows in the table for the last row


FULL = Config(seconds=5, reps=3, fill_per_second=30_000, history_rows=10_000_000)
SHORT = Config(seconds=2, reps=1, fill_per_second=30_000, history_rows=1_000_000)


@dataclass
class Row:
    name: str
    python: list[float]  # jobs/s, one sample per repetition
    same: list[float]  # empty when pgworkerd's statement could not be turned into a script
    raw: list[float]
    raw_what: str  # what the raw side ran
    target: str = ""
    notes: list[str] = field(default_factory=list)
    drained: bool = False  # some run emptied the queue before its time was up
    left_running: int = 0  # claimed but never completed jobs: a broken script or API call

    @property
    def py_median(self) -> float:
        return statistics.median(self.python)

    @property
    def same_median(self) -> float | None:
        return statistics.median(self.same) if self.same else None

    @property
    def raw_median(self) -> float:
        return statistics.median(self.raw)

    @property
    def ratio(self) -> float:
        return self.py_median / self.raw_median

    def round_ratios(self) -> str:
        """python/raw of each interleaved round: their spread shows how noisy the machine was."""
        return " ".join(f"{p / r:.0%}" for p, r in zip(self.python, self.raw, strict=True))


@dataclass
class Report:
    header: dict[str, str]
    rows: list[Row] = field(default_factory=list)
    targets: list[tuple[str, str, bool]] = field(default_factory=list)


# -- the Python side ----------------------------------------------------------------------------


def claim_loop(
    dsn: str,
    schema: str,
    worker: str,
    batch: int,
    seconds: float,
    many: bool = False,
    prepare: bool = True,
    handlers: Mapping[str, lease.HandlerCapacity] | None = None,
) -> tuple[int, float, bool]:
    """claim(limit=batch), then complete() each job (many: one complete_many()), until time
    is up. `handlers`: what the claim asks for (default: HANDLER, `batch` free, no limits).

    Returns (jobs, elapsed seconds, drained: a claim came back short, the queue ran dry).
    """
    if handlers is None:
        handlers = {HANDLER: lease.HandlerCapacity(lease_seconds=LEASE_SECONDS, free=batch)}
    queues = [QUEUE]
    done = 0
    drained = False
    with connect(dsn, prepare=prepare) as conn:
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            claimed = leasing.claim(
                conn, worker, queues=queues, handlers=handlers, limit=batch, schema=schema
            )
            if many:
                done_now = [lease.Completion(job.id, job.token) for job in claimed]
                lease.complete_many(conn, worker, done_now, schema=schema)
            else:
                for job in claimed:
                    leasing.complete(conn, worker, job.id, job.token, schema=schema)
            done += len(claimed)
            if len(claimed) < batch:
                drained = True
                break
        elapsed = time.perf_counter() - start
    return done, elapsed, drained


def enqueue_loop(dsn: str, schema: str, seconds: float, prepare: bool) -> tuple[int, float]:
    """client.enqueue() on an autocommit connection: one job per transaction."""
    done = 0
    with connect(dsn, prepare=prepare) as conn:
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            client.enqueue(conn, HANDLER, {}, schema=schema)
            done += 1
        elapsed = time.perf_counter() - start
    return done, elapsed


def enqueue_many_loop(dsn: str, schema: str, seconds: float, prepare: bool) -> tuple[int, float]:
    """client.enqueue_many() of BULK_SIZE specs per call (the specs are built before the clock)."""
    specs = [client.JobSpec(HANDLER, {}) for _ in range(BULK_SIZE)]
    done = 0
    with connect(dsn, prepare=prepare) as conn:
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            done += len(client.enqueue_many(conn, specs, schema=schema))
        elapsed = time.perf_counter() - start
    return done, elapsed


def _claim_process(
    dsn: str,
    schema: str,
    worker: str,
    batch: int,
    seconds: float,
    many: bool,
    prepare: bool,
    handlers: Mapping[str, lease.HandlerCapacity] | None,
    ready: Any,
    results: Any,
) -> None:
    ready.wait(timeout=60)  # all processes start their clocks together
    results.put(claim_loop(dsn, schema, worker, batch, seconds, many, prepare, handlers))


def claim_parallel(
    dsn: str,
    schema: str,
    batch: int,
    seconds: float,
    processes: int,
    many: bool,
    prepare: bool,
    handlers: Mapping[str, lease.HandlerCapacity] | None = None,
) -> tuple[float, bool]:
    """claim_loop in `processes` OS processes (no shared GIL); returns (jobs/s, drained)."""
    if processes == 1:
        done, elapsed, drained = claim_loop(
            dsn, schema, "bench-1", batch, seconds, many, prepare, handlers
        )
        return done / elapsed, drained
    ctx = mp.get_context("spawn")
    ready = ctx.Barrier(processes + 1)
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_claim_process,
            args=(
                dsn,
                schema,
                f"bench-{n}",
                batch,
                seconds,
                many,
                prepare,
                handlers,
                ready,
                results,
            ),
        )
        for n in range(1, processes + 1)
    ]
    for p in procs:
        p.start()
    try:
        ready.wait(timeout=60)
        outcomes = [results.get(timeout=seconds + 60) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=10)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"benchmark processes exited with {[p.exitcode for p in procs]}")
    # Same window in every process, so the rates add up.
    return sum(done / elapsed for done, elapsed, _ in outcomes), any(d for *_, d in outcomes)


# -- pgbench scripts ----------------------------------------------------------------------------

PGBENCH_WORKER = "('pgbench-' || :client_id)"  # one worker name per pgbench client
Script = tuple[str, dict[str, str]]  # pgbench script text, its -D variables


def _gset_ids(batch: int) -> str:
    """The claimed rows as one row for \\gset: id1, token1, ... and ids, tokens (arrays).

    pgbench cannot loop over the rows a statement returns, so the claim hands back one row;
    a job that was not claimed reads as id 0, which no complete statement finds.
    """
    picks = "".join(
        f"coalesce(ids[{k}], 0) AS id{k}, coalesce(tokens[{k}], 0) AS token{k}, "
        for k in range(1, batch + 1)
    )
    return (
        f"SELECT {picks}coalesce(ids, '{{}}') AS ids, coalesce(tokens, '{{}}') AS tokens,\n"
        "       coalesce(cardinality(ids), 0) AS claimed_count\n"
        "  FROM (SELECT array_agg(id ORDER BY id) AS ids,\n"
        "               array_agg(lease_token ORDER BY id) AS tokens FROM claimed) c\n"
        "\\gset\n"
    )


def raw_claim_complete_script(batch: int, many: bool) -> str:
    """Minimal SQL: claim `batch` jobs with the classic SKIP LOCKED UPDATE, then complete them
    with one UPDATE per job (many: one UPDATE for all); each statement its own transaction,
    as with the API."""
    claim = f"""\
WITH claimed AS (
    UPDATE @schema@.jobs
       SET status = 'running', locked_by = {PGBENCH_WORKER},
           locked_until = now() + make_interval(secs => {LEASE_SECONDS}),
           attempts = attempts + 1, lease_token = lease_token + 1,
           started_at = now(), updated_at = now()
     WHERE id IN (SELECT id FROM @schema@.jobs
                   WHERE status = 'pending' AND run_at <= now()
                     AND queue = '{QUEUE}' AND handler = '{HANDLER}'
                   ORDER BY priority, run_at, id
                   LIMIT {batch}
                   FOR UPDATE SKIP LOCKED)
    RETURNING id, queue, handler, payload, priority, attempts, max_attempts, lease_token,
              checkpoint, run_at, created_at, locked_until
)
"""
    set_completed = """\
UPDATE @schema@.jobs j
   SET status = 'completed', result = NULL, locked_by = NULL, locked_until = NULL,
       cancel_requested = false, finished_at = now(), updated_at = now()
"""
    if many:
        completes = (
            set_completed
            + f"""\
  FROM unnest(:ids::bigint[], :tokens::bigint[]) AS d(id, token)
 WHERE j.id = d.id AND j.lease_token = d.token AND j.locked_by = {PGBENCH_WORKER}
   AND j.status = 'running'
RETURNING j.id;
"""
        )
    else:
        completes = "".join(
            set_completed
            + f"""\
 WHERE id = :id{k} AND lease_token = :token{k} AND locked_by = {PGBENCH_WORKER}
   AND status = 'running'
RETURNING id;
"""
            for k in range(1, batch + 1)
        )
    return claim + _gset_ids(batch) + completes


RAW_ENQUEUE_FUNCTION = f"SELECT @schema@.enqueue('{HANDLER}', '{{}}'::jsonb);\n"
RAW_INSERT = f"INSERT INTO @schema@.jobs (handler, payload) VALUES ('{HANDLER}', '{{}}');\n"
RAW_BULK_INSERT = (
    f"INSERT INTO @schema@.jobs (handler, payload)\n"
    f"SELECT '{HANDLER}', '{{}}' FROM generate_series(1, {BULK_SIZE});\n"
)


class StatementChanged(Exception):
    """A pgworkerd statement no longer fits the shape this benchmark scripts it in."""


_PARAM_RE = re.compile(r"%\((\w+)\)s")


def own_statement(name: str, schema: str, values: Mapping[str, str]) -> str:
    """pgworkerd's statement `name` with its psycopg placeholders replaced by pgbench text."""
    text = query(name, schema)
    unknown = sorted(set(_PARAM_RE.findall(text)) - set(values))
    if unknown:
        raise StatementChanged(f"{name} has parameters this benchmark does not know: {unknown}")
    return _PARAM_RE.sub(lambda m: values[m[1]], text).replace("%%", "%")


def same_claim_complete_script(schema: str, batch: int, many: bool) -> Script:
    """job_claim, then job_complete_one per job (many: job_complete once for all), with the
    parameters the API sends; returns the script and its pgbench -D variables.

    Array parameters travel as pgbench variables, i.e. as extended-protocol parameters like
    psycopg's. job_claim (a SELECT from the claim function) becomes a CTE so that the
    claimed ids can be \\gset.
    """
    cap = lease.HandlerCapacity(lease_seconds=LEASE_SECONDS, free=batch)
    max_attempts = getattr(cap, "max_attempts", None)  # a handler's override, if configured
    variables = {
        "queues": f"{{{QUEUE}}}",
        "handlers": f"{{{HANDLER}}}",
        "lease_seconds": f"{{{float(cap.lease_seconds)}}}",
        "handler_free": f"{{{cap.free}}}",
        "max_attempts": f"{{{'NULL' if max_attempts is None else max_attempts}}}",
        "handler_queues": "[null]",  # claim_v2 (0006): the handler claims from every queue
        "max_running": "{NULL}",  # claim_v3 (0009): no fleet-wide limits
        "max_running_per_key": "{NULL}",
        "limit": str(batch),
    }
    claim = own_statement(
        "job_claim", schema, {**{k: f":{k}" for k in variables}, "worker": PGBENCH_WORKER}
    )
    if not claim.startswith("SELECT ") or not (
        ".claim_jobs(" in claim or ".claim_jobs_v2(" in claim
    ):
        raise StatementChanged("job_claim no longer selects from the claim function")
    script = (
        f"WITH claimed AS (\nSELECT c.id, c.token AS lease_token FROM (\n{claim}\n) c\n)\n"
        + _gset_ids(batch)
    )

    def complete(ids: str, tokens: str) -> str:
        # results and progress: all None, one per job claimed (the batch functions refuse
        # arrays of unequal lengths, and an empty batch: no statement when none was claimed)
        nulls = f"array_fill(NULL::jsonb, ARRAY[cardinality({ids}::bigint[])])"
        return (
            "\\if :claimed_count > 0\n"
            + own_statement(
                "job_complete",
                schema,
                {
                    "ids": ids,
                    "tokens": tokens,
                    "worker": PGBENCH_WORKER,
                    "results": nulls,
                    "progress": nulls,
                },
            )
            + ";\n\\endif\n"
        )

    if many:
        script += complete(":ids", ":tokens")
    else:
        for k in range(1, batch + 1):  # leasing.complete(): result and progress None
            script += (
                own_statement(
                    "job_complete_one",
                    schema,
                    {
                        "id": f":id{k}",
                        "token": f":token{k}",
                        "worker": PGBENCH_WORKER,
                        "result": "NULL",
                        "progress": "NULL",
                    },
                )
                + ";\n"
            )
    return script, variables


def _jobs_json(count: int) -> str:
    """What enqueue_many sends for `count` no-op jobs, made by the API's own jobs_json."""
    return client.jobs_json([client.JobSpec(HANDLER, {})] * count)


def same_enqueue_script(schema: str) -> Script:
    """job_enqueue (the SQL function enqueue) with the parameters client.enqueue sends for a
    no-op job; the NULLs are literals (pgbench variables cannot be NULL)."""
    variables = {
        "handler": HANDLER,
        "payload": "{}",
        "queue": QUEUE,
        "priority": "0",
        "max_attempts": str(client.DEFAULT_MAX_ATTEMPTS),
    }
    return own_statement(
        "job_enqueue",
        schema,
        {
            **{k: f":{k}" for k in variables},
            "run_at": "NULL::timestamptz",
            "delay": "NULL::float8",
            "dedupe_key": "NULL::text",
        },
    ) + ";\n", variables


def same_bulk_script(schema: str) -> Script:
    """job_enqueue_many with BULK_SIZE jobs. The ~1 MB array is too big for a command-line
    variable, so it is a literal in the statement: the server parses it either way."""
    literal = "'" + _jobs_json(BULK_SIZE).replace("'", "''") + "'"
    return own_statement("job_enqueue_many", schema, {"jobs": literal}) + ";\n", {}


_TPS_RE = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
_TXNS_RE = re.compile(r"^number of transactions actually processed: (\d+)", re.MULTILINE)
_FAILED_RE = re.compile(r"^number of failed transactions: (\d+)", re.MULTILINE)


# -- running ------------------------------------------------------------------------------------


class Bench:
    def __init__(
        self, dsn: str, schema: str, cfg: Config, workdir: Path, prepare: bool = True
    ) -> None:
        self.dsn = dsn
        self.prepare = prepare
        self.schema = schema
        self.cfg = cfg
        self.workdir = workdir
        self.conn = connect(dsn)
        self.jobs_table = sql.Identifier(schema, "jobs")
        self.history_max = 0  # ids up to this are the history's finished jobs, kept by reset
        # the limits rows: pending jobs spread over this many concurrency keys (0: none),
        # and what else reset() adds (a blocked handler's backlog and running jobs)
        self.fill_keys = 0
        self.blocked: tuple[int, int] | None = None  # (pending backlog, running)

    def close(self) -> None:
        self.conn.close()

    # -- the job table

    def reset(self, pending: int) -> None:
        """Empty the job table (but for the history, if any), then add `pending` jobs."""
        if self.history_max:
            self.conn.execute(
                sql.SQL("DELETE FROM {} WHERE id > %s").format(self.jobs_table),
                [self.history_max],
            )
        else:
            self.conn.execute(sql.SQL("TRUNCATE {}").format(self.jobs_table))
        if pending:
            self.conn.execute(
                sql.SQL(
                    "INSERT INTO {} (handler, payload, concurrency_key)"
                    " SELECT %s, '{{}}', CASE WHEN %s > 0 THEN 'k' || g %% %s END"
                    " FROM generate_series(1, %s) g"
                ).format(self.jobs_table),
                [HANDLER, self.fill_keys, max(1, self.fill_keys), pending],
            )
        if self.blocked:
            backlog, running = self.blocked
            # better placed than HANDLER's jobs, and at its limit: `running` held by a
            # worker that is not part of the run, with leases that outlast it
            self.conn.execute(
                sql.SQL(
                    "INSERT INTO {} (handler, payload, priority, status, attempts, locked_by,"
                    " locked_until, started_at)"
                    " SELECT %s, '{{}}', -1, CASE WHEN g <= %s THEN 'running' ELSE 'pending'"
                    " END::{}, CASE WHEN g <= %s THEN 1 ELSE 0 END,"
                    " CASE WHEN g <= %s THEN 'elsewhere' END,"
                    " CASE WHEN g <= %s THEN now() + interval '1 hour' END,"
                    " CASE WHEN g <= %s THEN now() END"
                    " FROM generate_series(1, %s) g"
                ).format(self.jobs_table, sql.Identifier(self.schema, "job_status")),
                [BLOCKED_HANDLER, running, running, running, running, running, backlog + running],
            )
        self.conn.execute(sql.SQL("VACUUM ANALYZE {}").format(self.jobs_table))
        self.conn.execute("CHECKPOINT")

    def count(self, where: LiteralString) -> int:
        """Jobs outside the history matching `where`."""
        row = self.conn.execute(
            sql.SQL("SELECT count(*) FROM {} WHERE id > %s AND ").format(self.jobs_table)
            + sql.SQL(where),
            [self.history_max],
        ).fetchone()
        return int(row[0]) if row else 0

    def fill_history(self, rows: int) -> float:
        """Replace the table's contents by `rows` completed jobs; returns the seconds taken."""
        start = time.perf_counter()
        self.conn.execute(sql.SQL("TRUNCATE {}").format(self.jobs_table))
        self.conn.execute(
            sql.SQL(
                "INSERT INTO {} (handler, payload, status, attempts, lease_token, run_at,"
                " created_at, started_at, finished_at, updated_at, result)"
                " SELECT %s, '{{}}', 'completed', 1, 1, t, t, t, t + interval '1 second',"
                " t + interval '1 second', '{{}}'"
                " FROM (SELECT now() - interval '30 days' + g * interval '250 ms' AS t"
                "       FROM generate_series(1, %s) g) s"
            ).format(self.jobs_table),
            [HANDLER, rows],
        )
        row = self.conn.execute(
            sql.SQL("SELECT max(id) FROM {}").format(self.jobs_table)
        ).fetchone()
        self.history_max = int(row[0]) if row and row[0] is not None else 0
        self.reset(0)
        return time.perf_counter() - start

    # -- pgbench

    def pgbench(self, name: str, script: Script, clients: int, counted: LiteralString) -> float:
        """Run a pgbench script for cfg.seconds; returns jobs/s.

        Jobs are counted in the table (`counted`: a WHERE clause) rather than assumed per
        transaction: jobs/s = tps * jobs / transactions.
        """
        text, variables = script
        path = self.workdir / f"{name}.sql"
        path.write_text(render(text, self.schema))
        before = self.count(counted)
        mode = "prepared" if self.prepare else "extended"
        args = [
            "pgbench",
            "-n",
            "-M",
            mode,
            "-f",
            str(path),
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-T",
            str(self.cfg.seconds),
        ]
        for key, value in variables.items():
            args += ["-D", f"{key}={value}"]
        proc = subprocess.run([*args, self.dsn], capture_output=True, text=True, check=False)
        out = proc.stdout + proc.stderr
        tps, txns, failed = _TPS_RE.search(out), _TXNS_RE.search(out), _FAILED_RE.search(out)
        if proc.returncode != 0 or not tps or not txns or (failed and int(failed[1])):
            raise RuntimeError(f"pgbench {name} failed (exit {proc.returncode}):\n{out}")
        return float(tps[1]) * (self.count(counted) - before) / int(txns[1])

    def runs(
        self,
        python: Callable[[], tuple[float, bool]],
        others: list[Callable[[], float] | None],
        fill: int,
    ) -> tuple[list[float], list[list[float]], bool, int]:
        """`reps` interleaved rounds of: python run, then each other run (None: skipped).

        Every run starts from reset(fill). Returns python's samples, the others' samples,
        whether any run drained the queue and how many jobs runs left running (should be 0).
        """
        py_rates: list[float] = []
        other_rates: list[list[float]] = [[] for _ in others]
        drained = False
        left_running = 0
        for _ in range(self.cfg.reps):
            self.reset(fill)
            rate, was_drained = python()
            py_rates.append(rate)
            drained |= was_drained
            left_running += self.count("status = 'running'")
            for other, rates in zip(others, other_rates, strict=True):
                if other is None:
                    continue
                self.reset(fill)
                rates.append(other())
                drained |= fill > 0 and self.count("status = 'pending'") == 0
                left_running += self.count("status = 'running'")
        return py_rates, other_rates, drained, left_running

    def _same(self, make: Callable[[], Script]) -> tuple[Script | None, str]:
        try:
            return make(), ""
        except StatementChanged as exc:
            return None, f"same SQL: n/a ({exc})"

    # -- the rows

    def claim_row(self, batch: int, processes: int, many: bool = False, suffix: str = "") -> Row:
        fill = self.cfg.fill_per_second * self.cfg.seconds * max(1, processes // 2)
        seconds = self.cfg.seconds
        same, why = self._same(lambda: same_claim_complete_script(self.schema, batch, many))
        tag = f"claim{batch}_c{processes}{'_many' if many else ''}"
        py, (same_rates, raw), drained, left_running = self.runs(
            lambda: claim_parallel(
                self.dsn, self.schema, batch, seconds, processes, many, self.prepare
            ),
            [
                None
                if same is None
                else lambda: self.pgbench(f"same_{tag}", same, processes, "status = 'completed'"),
                lambda: self.pgbench(
                    f"raw_{tag}",
                    (raw_claim_complete_script(batch, many), {}),
                    processes,
                    "status = 'completed'",
                ),
            ],
            fill,
        )
        conns = "1 connection" if processes == 1 else f"{processes} processes"
        pgbench = f"pgbench -c {processes}" + (f" -j {min(processes, 2)}" if processes > 1 else "")
        completes = "1 x UPDATE .. FROM unnest(ids)" if many else f"{batch} x UPDATE .. WHERE id ="
        return Row(
            name=f"claim+complete{'_many' if many else ''} batch {batch}, {conns}{suffix}",
            python=py,
            same=same_rates,
            raw=raw,
            drained=drained,
            left_running=left_running,
            raw_what=(
                f"{pgbench}: UPDATE .. WHERE id IN (SELECT .. LIMIT {batch}"
                f" FOR UPDATE SKIP LOCKED) RETURNING, then {completes}"
            ),
            notes=[why] if why else [],
        )

    def limits_row(self, batch: int, processes: int) -> Row:
        """The claim with fleet-wide limits that do not bind (a max_running and a
        max_running_per_key far above what runs; the jobs spread over 100 keys) against
        the same claim without limits, interleaved in one run: what the lock, the counts
        and the key filter cost."""
        fill = self.cfg.fill_per_second * self.cfg.seconds * max(1, processes // 2)
        seconds = self.cfg.seconds
        loose = lease.HandlerCapacity(
            lease_seconds=LEASE_SECONDS,
            free=batch,
            max_running=1_000_000,
            max_running_per_key=1_000_000,
        )
        plain = lease.HandlerCapacity(lease_seconds=LEASE_SECONDS, free=batch)
        self.fill_keys = 100
        try:
            py, (without,), drained, left_running = self.runs(
                lambda: claim_parallel(
                    self.dsn,
                    self.schema,
                    batch,
                    seconds,
                    processes,
                    False,
                    self.prepare,
                    {HANDLER: loose},
                ),
                [
                    lambda: claim_parallel(
                        self.dsn,
                        self.schema,
                        batch,
                        seconds,
                        processes,
                        False,
                        self.prepare,
                        {HANDLER: plain},
                    )[0]
                ],
                fill,
            )
        finally:
            self.fill_keys = 0
        conns = "1 connection" if processes == 1 else f"{processes} processes"
        return Row(
            name=f"claim+complete batch {batch}, {conns}, limits not binding",
            python=py,
            same=[],
            raw=without,
            drained=drained,
            left_running=left_running,
            raw_what="(not SQL) the Python API's same claim without limits, same run",
            target=">= 80% of the claim without limits",
            notes=["py/raw here: with limits / without limits (both through the Python API)"],
        )

    def blocked_row(self, batch: int) -> Row:
        """Another handler sits at its max_running with a big backlog better placed than
        HANDLER's jobs, and both are claimed for in one claim: HANDLER's rate against the
        claim of HANDLER alone (no limits anywhere)."""
        fill = self.cfg.fill_per_second * self.cfg.seconds
        seconds = self.cfg.seconds
        both = {
            BLOCKED_HANDLER: lease.HandlerCapacity(
                lease_seconds=LEASE_SECONDS, free=batch, max_running=BLOCKED_RUNNING
            ),
            HANDLER: lease.HandlerCapacity(lease_seconds=LEASE_SECONDS, free=batch),
        }
        self.blocked = (BLOCKED_BACKLOG, BLOCKED_RUNNING)
        try:
            py, (alone,), drained, left_running = self.runs(
                lambda: claim_parallel(
                    self.dsn, self.schema, batch, seconds, 1, False, self.prepare, both
                ),
                [
                    lambda: claim_parallel(
                        self.dsn, self.schema, batch, seconds, 1, False, self.prepare
                    )[0]
                ],
                fill,
            )
        finally:
            self.blocked = None
        return Row(
            name=(
                f"claim+complete batch {batch}, 1 connection, beside a handler blocked at"
                f" max_running with {BLOCKED_BACKLOG:,} pending"
            ),
            python=py,
            same=[],
            raw=alone,
            drained=drained,
            # the blocked handler's own running jobs are left running on purpose
            left_running=max(0, left_running - BLOCKED_RUNNING * self.cfg.reps * 2),
            raw_what="(not SQL) the Python API's claim of the other handler alone, same run",
            notes=["py/raw here: beside the blocked handler / alone"],
        )

    def enqueue_rows(self) -> list[Row]:
        def python() -> tuple[float, bool]:
            done, elapsed = enqueue_loop(self.dsn, self.schema, self.cfg.seconds, self.prepare)
            return done / elapsed, False

        same, why = self._same(lambda: same_enqueue_script(self.schema))
        py, (same_rates, raw_fn, raw_insert), *_ = self.runs(
            python,
            [
                None if same is None else lambda: self.pgbench("same_enqueue", same, 1, "true"),
                lambda: self.pgbench("raw_enqueue_fn", (RAW_ENQUEUE_FUNCTION, {}), 1, "true"),
                lambda: self.pgbench("raw_insert", (RAW_INSERT, {}), 1, "true"),
            ],
            0,
        )
        notes = [why] if why else []
        return [
            Row(
                "enqueue single, 1 connection",
                py,
                same_rates,
                raw_fn,
                "pgbench -c 1: SELECT <schema>.enqueue('noop', '{}') (the SQL function)",
                target=">= 2,500 jobs/s",
                notes=notes,
            ),
            Row(
                "enqueue single vs plain INSERT",
                py,
                same_rates,
                raw_insert,
                "pgbench -c 1: INSERT INTO <schema>.jobs (handler, payload) VALUES (..)",
                notes=notes,
            ),
        ]

    def bulk_row(self) -> Row:
        def python() -> tuple[float, bool]:
            done, elapsed = enqueue_many_loop(self.dsn, self.schema, self.cfg.seconds, self.prepare)
            return done / elapsed, False

        same, why = self._same(lambda: same_bulk_script(self.schema))
        py, (same_rates, raw), *_ = self.runs(
            python,
            [
                None if same is None else lambda: self.pgbench("same_bulk", same, 1, "true"),
                lambda: self.pgbench("raw_bulk", (RAW_BULK_INSERT, {}), 1, "true"),
            ],
            0,
        )
        return Row(
            f"enqueue_many {BULK_SIZE:,} per call, 1 connection",
            py,
            same_rates,
            raw,
            f"pgbench -c 1: INSERT INTO <schema>.jobs .. SELECT .. generate_series(1, {BULK_SIZE})",
            target=">= 50,000 jobs/s",
            notes=[why] if why else [],
        )


# -- report -------------------------------------------------------------------------------------


def server_header(conn: psycopg.Connection, local: bool, prepare: bool) -> dict[str, str]:
    rows = conn.execute(
        "SELECT name, current_setting(name) FROM unnest(%s::text[]) AS name",
        [list(SHOWN_SETTINGS)],
    ).fetchall()
    header = {str(name): str(value) for name, value in rows}
    header["server"] = "LocalPostgres started by this run" if local else "given by --dsn"
    header["machine"] = (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    )
    if prepare:
        header["protocol"] = (
            f"PREPARED: psycopg {psycopg.__version__} ({psycopg.pq.__impl__}) through"
            " connect(prepare=True) (server-side prepared statements after"
            f" {PREPARE_THRESHOLD} runs, as the daemon with prepared_statements = true);"
            " pgbench -M prepared"
        )
    else:
        header["protocol"] = (
            f"UNPREPARED: psycopg {psycopg.__version__} ({psycopg.pq.__impl__}) through"
            " connect(prepare=False) (prepare_threshold=None, as behind PgBouncer < 1.21);"
            " pgbench -M extended"
        )
    if local:
        header["protocol"] += "; both over the unix socket"
    return header


def _rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:,.0f}"


def _pct(part: float | None, whole: float | None) -> str:
    return "n/a" if part is None or not whole else f"{part / whole:.0%}"


def render_report(report: Report, cfg: Config) -> str:
    width = max(len(k) for k in report.header)
    lines = ["pgworkerd queue benchmark"]
    lines += [f"  {k:<{width}}  {v}" for k, v in report.header.items()]
    lines.append(
        f"  {'runs':<{width}}  {cfg.seconds} s each, {cfg.reps} interleaved repetition(s),"
        " medians; figures in jobs/s"
    )
    lines += [
        "",
        "  python   = pgworkerd's Python API  same SQL = pgworkerd's own statements via pgbench",
        "  raw SQL  = minimal hand-written SQL via pgbench (the ceiling)",
        "",
    ]
    name_w = max(len(r.name) for r in report.rows)
    head = (
        f"{'#':>2}  {'measurement':<{name_w}}  {'python':>8} {'same SQL':>9} {'raw SQL':>9}"
        f" {'py/raw':>7} {'py/same':>7}  target"
    )
    lines += [head, "-" * (len(head) + 18)]
    for n, row in enumerate(report.rows, 1):
        lines.append(
            f"{n:>2}  {row.name:<{name_w}}  {_rate(row.py_median):>8}"
            f" {_rate(row.same_median):>9} {_rate(row.raw_median):>9}"
            f" {_pct(row.py_median, row.raw_median):>7}"
            f" {_pct(row.py_median, row.same_median):>7}  {row.target}"
        )
        lines.append(f"{'':>4}raw: {row.raw_what}")
        if len(row.python) > 1:
            lines.append(f"{'':>4}py/raw per round: {row.round_ratios()}")
        if row.drained:
            lines.append(f"{'':>4}WARNING: a run drained the queue; raise fill_per_second")
        if row.left_running:
            lines.append(f"{'':>4}WARNING: {row.left_running} claimed jobs were never completed")
        lines += [f"{'':>4}{note}" for note in row.notes]
    lines += ["", "targets"]
    lines += [
        f"  {'met    ' if met else 'NOT met'}  {what}: {figure}"
        for what, figure, met in report.targets
    ]
    return "\n".join(lines)


def evaluate_targets(
    rows: Mapping[str, Row], limits_only: bool = False
) -> list[tuple[str, str, bool]]:
    limits = [
        (
            f"{rows[key].name}: >= 80% of the claim without limits",
            f"{rows[key].ratio:.0%} ({_rate(rows[key].py_median)} of"
            f" {_rate(rows[key].raw_median)} jobs/s)",
            rows[key].ratio >= 0.80,
        )
        for key in ("limits10", "limits10_c4")
        if key in rows
    ]
    if limits_only:
        return limits
    claim10, bulk, single = rows["claim10"], rows["bulk"], rows["single"]
    return [
        *limits,
        (
            "claim batch 10, 1 connection >= 70% of the raw ceiling",
            f"{claim10.ratio:.0%} ({_rate(claim10.py_median)} of {_rate(claim10.raw_median)}"
            " jobs/s)",
            claim10.ratio >= 0.70,
        ),
        (
            "enqueue_many >= 50,000 jobs/s",
            f"{_rate(bulk.py_median)} jobs/s",
            bulk.py_median >= 50_000,
        ),
        (
            "enqueue single >= 2,500 jobs/s",
            f"{_rate(single.py_median)} jobs/s",
            single.py_median >= 2_500,
        ),
    ]


def run(
    dsn: str,
    schema: str,
    cfg: Config,
    local: bool,
    prepare: bool = True,
    limits_only: bool = False,
) -> Report:
    migrate(dsn, schema)
    with tempfile.TemporaryDirectory(prefix="pgworkerd-bench-") as tmp:
        bench = Bench(dsn, schema, cfg, Path(tmp), prepare)
        try:
            report = Report(server_header(bench.conn, local, prepare))
            named: dict[str, Row] = {}

            def add(key: str, row: Row) -> Row:
                named[key] = row
                report.rows.append(row)
                print(
                    f"  {row.name}: python {_rate(row.py_median)},"
                    f" same SQL {_rate(row.same_median)}, raw {_rate(row.raw_median)}",
                    file=sys.stderr,
                    flush=True,
                )
                return row

            if limits_only:
                add("limits10", bench.limits_row(10, 1))
                add("limits10_c4", bench.limits_row(10, 4))
                add("blocked10", bench.blocked_row(10))
                report.targets = evaluate_targets(named, limits_only=True)
                return report
            add("claim1", bench.claim_row(1, 1))
            empty = add("claim10", bench.claim_row(10, 1))
            add("claim10_many", bench.claim_row(10, 1, many=True))
            add("claim1_c4", bench.claim_row(1, 4))
            add("claim10_c4", bench.claim_row(10, 4))
            single, single_insert = bench.enqueue_rows()
            add("single", single)
            add("single_insert", single_insert)
            add("bulk", bench.bulk_row())
            add("limits10", bench.limits_row(10, 1))
            add("limits10_c4", bench.limits_row(10, 4))
            add("blocked10", bench.blocked_row(10))

            took = bench.fill_history(cfg.history_rows)
            print(
                f"  history: {cfg.history_rows:,} finished rows in {took:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            hist = bench.claim_row(
                10, 1, suffix=f", {cfg.history_rows // 1_000_000}M finished rows"
            )
            hist.notes.append(
                f"vs the empty table (row 2): python {_pct(hist.py_median, empty.py_median)},"
                f" same SQL {_pct(hist.same_median, empty.same_median)},"
                f" raw {_pct(hist.raw_median, empty.raw_median)}"
                f" (history inserted + VACUUM ANALYZEd in {took:.0f} s)"
            )
            add("history", hist)
            bench.fill_history(0)  # leave an empty table behind
            report.targets = evaluate_targets(named)
            return report
        finally:
            bench.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Benchmark pgworkerd's queue core against raw SQL run by pgbench."
    )
    parser.add_argument("--dsn", help="benchmark this server instead of a private LocalPostgres")
    parser.add_argument(
        "--schema",
        default="pgworkerd",
        help="schema to migrate and use: its jobs table is TRUNCATEd! (default: pgworkerd)",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="2 s runs, 1 repetition, 1M history rows (a few minutes)",
    )
    parser.add_argument("--json", type=Path, help="also write every sample to this file")
    parser.add_argument(
        "--unprepared",
        action="store_true",
        help="no server-side prepared statements on either side (the PgBouncer < 1.21 mode)",
    )
    parser.add_argument(
        "--limits-only",
        action="store_true",
        help="only the rows of fleet-wide limits (with vs without, and beside a blocked handler)",
    )
    parser.add_argument("--seconds", type=int, help="override the length of each timed run")
    parser.add_argument("--reps", type=int, help="override the number of repetitions")
    args = parser.parse_args(argv)
    if not shutil.which("pgbench"):
        parser.error("pgbench not found on PATH (Debian: postgresql-client)")
    cfg = SHORT if args.short else FULL
    cfg = replace(cfg, seconds=args.seconds or cfg.seconds, reps=args.reps or cfg.reps)

    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    if args.dsn:
        report = run(
            args.dsn,
            args.schema,
            cfg,
            local=False,
            prepare=not args.unprepared,
            limits_only=args.limits_only,
        )
    else:
        with LocalPostgres(settings=SERVER_SETTINGS) as pg:
            report = run(
                pg.dsn(),
                args.schema,
                cfg,
                local=True,
                prepare=not args.unprepared,
                limits_only=args.limits_only,
            )
    report.header["wall time"] = f"{time.perf_counter() - started:.0f} s"
    report.header["load average"] = (
        f"{load_before:.1f} before the run (others' work), {os.getloadavg()[0]:.1f} at its end,"
        f" on {os.cpu_count()} CPUs"
    )

    print(render_report(report, cfg))
    if args.json:
        rows = [
            {
                **asdict(r),
                "python_median": r.py_median,
                "same_median": r.same_median,
                "raw_median": r.raw_median,
                "py_over_raw": r.ratio,
            }
            for r in report.rows
        ]
        targets = [{"target": t, "measured": m, "met": ok} for t, m, ok in report.targets]
        args.json.write_text(
            json.dumps(
                {"config": asdict(cfg), "header": report.header, "rows": rows, "targets": targets},
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
