"""bench/deploy_bench.py --short runs (its figures are printed, never asserted) and what it
reports beside the times holds: every job handed back with its checkpoint, no attempt
counted, no job process of the old tree left at install."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sdtestbed import unavailable_reason

BENCH = Path(__file__).resolve().parents[2] / "bench" / "deploy_bench.py"


def test_deploy_bench_short() -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--short"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    print(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("round 1: ")]
    result = json.loads(line.removeprefix("round 1: "))
    assert result["checkpoints_kept"] == 1  # the checkpointing job of the two
    assert result["released_attempts"] == 2
    assert result["attempts_counted_by_hand_back"] == 0
    assert result["job_processes_at_install"] == 0
    for key in ("hand_back", "restart", "total", "all_running_again_after_ready"):
        assert any(ln.startswith(key + " ") for ln in proc.stdout.splitlines()), key
