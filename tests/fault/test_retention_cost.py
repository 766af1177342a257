"""The retention cost bench's short mode (bench/retention_cost.py --short, seconds): with
the default mixed retentions, a batch of prune_finished_v2 reads the jobs it deletes and
no kept dead job, and the drain deletes exactly the jobs past their retention. The bench
checks that itself and exits 1 otherwise; its times are printed, never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "retention_cost.py"


def test_retention_cost_short() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--short"],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    print(proc.stdout)
    print(proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # v1 (a parameter for the status) walks the kept dead jobs; v2 does not
    assert "20000 kept rows read and skipped" in proc.stdout
    assert "index jobs_completed_finished_at_idx, 500 rows found, 0 kept rows" in proc.stdout
