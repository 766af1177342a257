"""bench/idle_path.py --short --statements --starts (this checkout against itself, on a
private cluster): it runs through and prints the median enqueue, claim and completion of
an idle job for both sides, pg_stat_statements' view of each, and an idle daemon's
enqueue -> start for each side; the figures are printed (shown with -rP), never
asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "idle_path.py"


def test_idle_path_short() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--short", "--statements", "--starts"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for step in ("enqueue", "claim", "complete"):
        assert re.search(rf"^{step} +[0-9.]+ +[0-9.]+ ", proc.stdout, re.MULTILINE), step
    assert re.search(r"calls +\d+ plans .*claim_v[34]\b", proc.stdout), "no statement view"
    for side in ("this", "baseline"):
        assert re.search(rf"^{side} +p50 +[0-9.]+ +p90 +[0-9.]+ ", proc.stdout, re.MULTILINE), side
