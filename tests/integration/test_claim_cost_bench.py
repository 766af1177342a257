"""bench/claim_cost.py --short --baseline <this checkout> (on a private cluster): it runs
through, migrating the baseline's database with that tree's own code, and prints both
sides' server time per claim for each case, and a claim of 40 from a backlog that came
after the plans were made on an empty queue, and their ratios; the figures are printed
(shown with -rP), never asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_claim_cost_short() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "claim_cost.py"), "--short", "--baseline", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for case in ("empty queue, 1 handler", "empty queue, 4 handlers", "one due job, 1 handler"):
        block = proc.stdout.split(case + "\n", 1)[1]
        for side in ("this checkout", "--baseline"):
            assert re.search(rf"{side}.* median +\d+ us +min +\d+ us per claim", block), side
        assert re.search(r"this checkout / baseline: [0-9.]+", block), case
    for case in ("an empty, vacuumed queue", "a new queue (never vacuumed)"):
        block = proc.stdout.split(case, 1)[1]
        for side in ("this checkout", "--baseline"):
            assert re.search(rf"{side}.* median +[0-9.]+ ms +\(", block), side
