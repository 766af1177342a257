"""bench/enqueue_cost.py --short (this checkout against itself, on a private cluster): it
runs through and prints the client's and the backend's CPU per job for both enqueue paths;
the figures are printed (shown with -rP), never asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "enqueue_cost.py"


def test_enqueue_cost_short() -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--short"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for figure in ("single client", "single backend", "many client", "many backend"):
        assert re.search(rf"^{figure} +[0-9.]+ +[0-9.]+ ", proc.stdout, re.MULTILINE), figure
