"""Tracing benchmark (docs/operations/tracing.md): what OpenTelemetry costs, and that it
costs nothing when off. The real `pgworkerd run` on a private PostgreSQL.

    .venv/bin/python bench/tracing_bench.py [--short] [--json out.json]

Prints no-op jobs/s through children (max_jobs_per_child = 1: a fork per job, so each
child builds its tracer provider; and 1000: children reused), one daemon with 8 slots,
in three settings:
  - "not installed": the daemon runs with OpenTelemetry made unimportable (a
    sitecustomize on its PYTHONPATH refuses every opentelemetry module), as without the
    extra;
  - "installed, off": the extra installed, [tracing] off (the default);
  - "on": [tracing] enabled, every job enqueued inside a span (so each attempt links to
    it), the provider bench_tracing_provider (the SDK's BatchSpanProcessor into an
    InMemorySpanExporter: spans made, processed and flushed after each attempt, no
    network);
and the client's single enqueue (µs per call, median of rounds) without OpenTelemetry
imported, with it imported but no span current, and inside a span (the job then goes
through enqueue_many_v3 with its trace). A benchmark, not a test: figures are printed,
never asserted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
PGWORKERD = str(Path(sys.executable).with_name("pgworkerd"))

import _measure  # noqa: E402  (bench/_measure.py)

from pgworkerd.queue.db import connect  # noqa: E402

# The module the "on" daemon names as its provider, and the sitecustomize that hides
# OpenTelemetry from the "not installed" one: written into the run's directory.
PROVIDER_MODULE = """
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

RESOURCE = Resource.create({"service.name": "bench"})  # once, in the fork server


def provider():
    made = TracerProvider(resource=RESOURCE)
    made.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    return made
"""
HIDE_OTEL = """
import importlib.abc
import sys


class _Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by the benchmark)")
        return None


sys.meta_path.insert(0, _Hidden())
"""

# One enqueue mode per fresh interpreter: "plain" never imports OpenTelemetry.
ENQUEUE = """
import statistics, sys, time
mode, dsn, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
from pgworkerd import client
from pgworkerd.queue.db import connect
span = None
if mode != "plain":
    from opentelemetry.sdk.trace import TracerProvider
    tracer = TracerProvider().get_tracer("bench")
    if mode == "span":
        span = tracer.start_as_current_span("request")
        span.__enter__()
assert ("opentelemetry.trace" in sys.modules) == (mode != "plain")
rounds = []
with connect(dsn) as conn:
    conn.autocommit = True
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            client.enqueue(conn, "noop")
        rounds.append((time.perf_counter() - start) / n * 1e6)
print(round(statistics.median(rounds), 1))
"""


def wait_for(condition: Any, timeout: float, what: str, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(step)
    raise TimeoutError(f"timed out waiting for {what}")


def completed(conn: Any) -> int:
    row = conn.execute("SELECT count(*) FROM pgworkerd.jobs WHERE status = 'completed'").fetchone()
    return int(row[0]) if row else 0


def throughput(
    dsn: str, workdir: Path, setting: str, per_child: int, n_jobs: int
) -> dict[str, Any]:
    lines = [
        "[worker]",
        "slots = 8",
        "warm_children = 8",
        f"max_jobs_per_child = {per_child}",
        'lease = "60s"',
        'poll_interval = "1s"',
        "[handlers.noop]",
        'target = "pgworkerd.examples:noop"',
    ]
    if setting == "on":
        lines += ["[tracing]", "enabled = true", 'provider = "bench_tracing_provider:provider"']
    config = workdir / f"{setting}-{per_child}.toml"
    config.write_text("\n".join(lines) + "\n")
    path = [str(workdir / "provider")]
    if setting == "not installed":
        path.insert(0, str(workdir / "hide"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    log = workdir / f"{setting}-{per_child}.log"
    with connect(dsn) as conn:
        conn.execute("TRUNCATE pgworkerd.jobs")
        proc = subprocess.Popen(
            [PGWORKERD, "--dsn", dsn, "--config", str(config), "run"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log.open("ab"),
        )
        try:
            wait_for(lambda: "running as" in log.read_text(), 60, "daemon start")
            from pgworkerd import client

            if setting == "on":
                from opentelemetry.sdk.trace import TracerProvider

                tracer = TracerProvider().get_tracer("bench")
                with tracer.start_as_current_span("request"):
                    specs = [client.JobSpec("noop") for _ in range(n_jobs)]
                    start = time.monotonic()
                    client.enqueue_many(conn, specs)
            else:
                specs = [client.JobSpec("noop", trace={}) for _ in range(n_jobs)]
                start = time.monotonic()
                client.enqueue_many(conn, specs)
            wait_for(lambda: completed(conn) >= n_jobs, 900, "all jobs")
            elapsed = time.monotonic() - start
            if setting == "on":
                [(traced,)] = conn.execute(
                    "SELECT count(*) FROM pgworkerd.jobs WHERE trace_context IS NOT NULL"
                ).fetchall()
                assert traced == n_jobs, traced
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    return {"jobs": n_jobs, "seconds": round(elapsed, 2), "jobs_per_s": round(n_jobs / elapsed)}


def enqueue_cost(dsn: str, mode: str, n: int) -> float:
    done = subprocess.run(
        [sys.executable, "-c", ENQUEUE, mode, dsn, str(n)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.strip())


def main() -> None:
    args = _measure.arguments(__doc__).parse_args()
    n_jobs = 1000 if args.short else 10000
    n_enqueues = 200 if args.short else 2000
    results: dict[str, Any] = {}
    with _measure.server() as (dsn, workdir):
        (workdir / "provider").mkdir()
        (workdir / "provider" / "bench_tracing_provider.py").write_text(PROVIDER_MODULE)
        (workdir / "hide").mkdir()
        (workdir / "hide" / "sitecustomize.py").write_text(HIDE_OTEL)
        _measure.headline("tracing", args.short, "8 slots, no-op jobs")
        for per_child in (1, 1000):
            for setting in ("not installed", "installed, off", "on"):
                r = throughput(dsn, workdir, setting, per_child, n_jobs)
                results[f"{setting}, max_jobs_per_child={per_child}"] = r
                print(
                    f"no-op jobs/s, max_jobs_per_child={per_child:<5} {setting:<15} "
                    f"{r['jobs_per_s']:>6} ({r['jobs']} jobs in {r['seconds']}s)",
                    flush=True,
                )
        for mode, what in (
            ("plain", "OpenTelemetry not imported"),
            ("imported", "imported, no current span"),
            ("span", "inside a span (traced)"),
        ):
            cost = enqueue_cost(dsn, mode, n_enqueues)
            results[f"enqueue_us_{mode}"] = cost
            print(f"client.enqueue, {what:<28} {cost:>7} µs/call (median of 5 x {n_enqueues})")
    _measure.write_json(args.json, results)


if __name__ == "__main__":
    main()
