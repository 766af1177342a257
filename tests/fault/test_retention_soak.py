"""The retention soak's short mode (bench/retention_soak.py --short, about two minutes):
two daemons prune their own finished jobs under a constant load of 50 jobs/s. The soak
checks its own invariants (every job old enough is gone, none deleted before its
retention, none failed, a daemon pruned) and exits 1 when one fails; its sizes are
printed (shown with -rP or on failure), never asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "retention_soak.py"


@pytest.mark.slow
def test_retention_soak_short() -> None:
    proc = subprocess.run(
        [sys.executable, str(SOAK), "--short"],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    print(proc.stdout)
    print(proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "jobs enqueued, 0 left after" in proc.stdout
