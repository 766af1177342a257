"""bench/dashboard_queries.py --short runs every read-side call on a 200,000-job table
(against the suite's server, in a schema of its own): it must run through; its figures
are printed (shown with -rP), never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "dashboard_queries.py"


def test_dashboard_bench_short(test_db_dsn: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--short", "--reps", "1", "--dsn", test_db_dsn],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for shown in ("jobs page: newest", "overview", "explain a dead job", "CREATE INDEX"):
        assert shown in proc.stdout
