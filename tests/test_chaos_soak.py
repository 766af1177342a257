"""The chaos soak's short mode (bench/chaos_soak.py --short, about a minute): three daemons,
800 jobs, every kind of fault at random intervals; the soak checks its own invariants
(no overlapping executions, no lost or stuck jobs, no outcome recorded twice, attempts
accounted for) and exits 1 when one fails. Its summary is printed (shown with -rP or on
failure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parent.parent / "bench" / "chaos_soak.py"


@pytest.mark.slow
def test_chaos_soak_short(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(SOAK), "--short", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    print(proc.stdout)
    print(proc.stderr)
    summary = proc.stdout
    assert "=== chaos soak summary ===" in summary, proc.stderr
    assert proc.returncode == 0, summary
    assert "RESULT: OK" in summary
    assert "overlapping executions of one job: 0" in summary
    assert "lost or stuck jobs (not completed/dead): 0" in summary
