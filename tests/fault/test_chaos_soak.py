"""The chaos soak's short mode (bench/chaos_soak.py --short, about a minute): three daemons,
800 jobs, every kind of fault at random intervals, poison rows of every kind; the soak
checks its own invariants (no overlapping executions, no lost or stuck jobs, no outcome
recorded twice, attempts accounted for, poison rows dead alone, the fleet-wide limits of
its "limited" handler held, no handler subprocess left behind; issue 24's: no child started
before all its parents completed, each follow-up exactly once, no signal lost, a signal
by key sent before the wait seen exactly once, no expired job started, an expiring job no
claim reached in time (no daemon serves it, its one slot busy) ended by the sweep; issue
25's: no start-rate window exceeded, each key's share of a fair handler's starts within a
bound of its weight, no slot idle while work is due, no dedupe window broken) and exits 1
when one fails. Its summary is printed (shown with -rP or on failure)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[2] / "bench" / "chaos_soak.py"
POISON = (
    "integer_5001_digits",
    "payload_nested_5000",
    "number_beyond_float",
    "run_at_minus_infinity",
    "run_at_before_year_1",
    "checkpoint_nested_5000",
    "payload_over_frame_limit",
)


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
    # poison rows of every kind were enqueued, and each died alone
    assert re.search(r"poison jobs \((\d+) enqueued\) not dead with the reason: 0", summary)
    for kind in POISON:
        assert kind in summary, kind
    assert "jobs dead that were not doomed to fail: 0" in summary
    # the fleet-wide limits held across the three daemons, faults and all
    assert re.search(
        r"instants with more limited executions than .*\((\d+) executions\): 0", summary
    )
    assert "daemons that exited on their own: 0" in summary
    # every execution started subprocesses; none outlived its attempt, faults and all
    assert "handler subprocesses left behind: 0" in summary
    # periodic jobs raced by all three daemons through the faults: one job per tick
    assert "scheduled jobs without exactly one tick: 0" in summary
    assert "late schedule runs back to back (catch-up bursts): 0" in summary
    assert re.search(r"schedule \(1 s, fired by all daemons\): [1-9]\d* ticks", summary)
    # issue 24's features were in the workload, and their invariants held
    counts = re.search(
        r"issue 24 workload: (?P<children>[1-9]\d*) children of \d+ parents"
        r" \((?P<of_failed>[1-9]\d*) of a parent that failed: [^)]*\);"
        r" (?P<fan_outs>[1-9]\d*) fan-outs with (?P<follow_ups>[1-9]\d*) follow-ups;"
        r" (?P<waits>[1-9]\d*) waits, signals (?P<by_id>[^;]*);"
        r" (?P<keyed>[1-9]\d*) waits by key, signals (?P<by_key>[^;]*);"
        r" (?P<expiring>[1-9]\d*) expiring jobs \((?P<unserved>[1-9]\d*) no daemon serves,"
        r" (?P<narrow>[1-9]\d*) of a one-slot handler\), \d+ of them expired"
        r" \((?P<never_started>[1-9]\d*) never started\)",
        summary,
    )
    assert counts, summary
    by_id, by_key = counts["by_id"], counts["by_key"]
    assert "kept" in by_id, by_id  # signals came before the wait, and after it
    assert "resumed" in by_id, by_id
    assert "refused" not in by_id and "never sent" not in by_id, by_id
    # signals by key came before the wait (parked, handed over by the WaitFor)
    assert "parked" in by_key, by_key
    assert "refused" not in by_key and "never sent" not in by_key, by_key
    assert "children started before all their parents completed: 0" in summary
    assert "fan-outs whose follow-ups are not there exactly once: 0" in summary
    assert "signals lost (a signalled wait not resumed by it): 0" in summary
    assert "jobs left suspended with their signal there: 0" in summary
    assert "signals by key not seen exactly once by their job: 0" in summary
    assert "expired jobs started (claimed at or after expires_at): 0" in summary
    assert "expiring jobs never started not ended cancelled as expired: 0" in summary
    # issue 25's: each invariant looked at something, and held
    assert re.search(r"of one key than 2 \(([1-9]\d*) starts\): 0$", summary, re.MULTILINE)
    assert re.search(
        r"more than \d+ from its weight's \(([1-9]\d*) windows\): 0$", summary, re.MULTILINE
    )
    assert re.search(r"([1-9]\d*) looks at a daemon up for", summary)
    assert re.search(r"with a slot idle while a job was due: 0$", summary, re.MULTILINE)
    assert re.search(r"held twice within their window \(([1-9]\d*) jobs\): 0$", summary, re.M)
