"""What the benchmarks share, written once: their command line (--short, --json), the
machine and load line every figure is printed with, a private PostgreSQL with the schema
migrated, percentiles of latency samples, the handlers' start stamps, and a statement's
time on the server alone.

A bench imports it by name (a bench runs as `python bench/NAME.py`, so bench/ is on
sys.path). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pgworkerd.devcluster.localpg import LocalPostgres
from pgworkerd.queue.migrate import migrate

# The server the latency and throughput benches measure against: durable writes (fsync),
# commits that do not wait for the disk (as most deployments of a queue choose), room
# for a backlog in memory.
SERVER_SETTINGS: dict[str, str] = {
    "fsync": "on",
    "synchronous_commit": "off",
    "shared_buffers": "256MB",
}


def arguments(doc: str | None, *, json_output: bool = True) -> argparse.ArgumentParser:
    """The bench's parser: its docstring's first paragraph, --short (a quick run, CI) and
    --json (also write the figures to a file). Add a bench's own options, then parse."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="a quick run (CI)")
    if json_output:
        parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser


def machine() -> str:
    """Where the figures were measured: host, CPUs, architecture and Python."""
    return (
        f"{platform.node()} {os.cpu_count()} cpus {platform.machine()} "
        f"Python {platform.python_version()}"
    )


def load() -> str:
    """The load averages (1, 5, 15 min) now: a shared machine's figures need them."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def headline(name: str, short: bool, detail: str = "") -> str:
    """Print (and return) the bench's first line: what, which mode, where, under what
    load."""
    line = (
        f"# pgworkerd {name} benchmark ({'short' if short else 'full'}) on {machine()}, "
        f"load {load()}{'; ' + detail if detail else ''}"
    )
    print(line, flush=True)
    return line


@contextmanager
def server(settings: Mapping[str, str] | None = None) -> Iterator[tuple[str, Path]]:
    """A private PostgreSQL (SERVER_SETTINGS unless `settings`) with pgworkerd's schema
    migrated, and a scratch directory: (dsn, directory); both gone afterwards."""
    with (
        tempfile.TemporaryDirectory(prefix="pgworkerd-bench-") as scratch,
        LocalPostgres(settings=dict(SERVER_SETTINGS if settings is None else settings)) as pg,
    ):
        dsn = pg.dsn()
        migrate(dsn)
        yield dsn, Path(scratch)


def percentile(values: list[float], p: float) -> float:
    """The `p`th percentile of `values` (nearest rank, at most the largest), rounded."""
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))], 2)


def summary(samples_ms: list[float]) -> dict[str, Any]:
    """Latency samples in milliseconds as the benches print them: count, p50, p99, max."""
    return {
        "samples": len(samples_ms),
        "p50_ms": round(statistics.median(samples_ms), 2),
        "p99_ms": percentile(samples_ms, 99),
        "max_ms": round(max(samples_ms), 2),
    }


def stamps(path: Path) -> dict[str, float]:
    """The "<key> <time>" lines bench handlers append (bench_handlers.py), by key."""
    found = {}
    for line in path.read_text().splitlines():
        key, _, stamp = line.partition(" ")
        found[key] = float(stamp)
    return found


def write_json(path: Path | None, results: Mapping[str, Any]) -> None:
    """--json: the figures, with the machine they were measured on, to `path`."""
    if path is not None:
        figures = {"machine": machine(), **results}
        path.write_text(json.dumps(figures, indent=2, default=str) + "\n")


def server_us_per_call(conn: Any, statement: str, calls: int) -> float:
    """Microseconds per run of `statement` (PL/pgSQL, e.g. a PERFORM) on the server alone:
    a DO block runs it `calls` times in a loop, so neither the client nor the network is
    in the figure."""
    conn.execute(
        f"""DO $$ DECLARE t timestamptz := clock_timestamp(); BEGIN
              FOR i IN 1..{calls} LOOP {statement} END LOOP;
              PERFORM set_config('bench.us',
                  (extract(epoch FROM clock_timestamp() - t) * 1e6 / {calls})::text, false);
            END $$"""
    )
    row = conn.execute("SELECT current_setting('bench.us')").fetchone()
    assert row is not None
    return float(row[0])
