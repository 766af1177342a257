"""Admission by measured memory with real daemons (docs/guide/memory-admission.md): every
execution is recorded by the handler (tests/support/jobhandlers.py), and the number
running at once is what the budget admits: by the configured estimate until there is
history, by the handlers' measured peaks once there is, and a job larger than the budget
alone, with a warning."""

from __future__ import annotations

import re
import socket
import urllib.request
from datetime import datetime
from typing import Any

import pytest
from daemon_harness import Daemons, Db, wait_for

from pgworkerd.queue.explain import explain

WORK = "jobhandlers:work"
MIB = 1 << 20


def overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    """The most intervals open at one instant (an end before a start at equal times)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def run_all(db: Db, jobs: int, seconds: float) -> int:
    """Enqueue `jobs` jobs of handler rec working `seconds` each, wait until all have
    completed, and return how many ran at once at most."""
    ids = [db.enqueue("rec", {"seconds": seconds}) for _ in range(jobs)]
    wait_for(
        lambda: all(db.job(i)["status"] == "completed" for i in ids),
        timeout=90,
        what="every job to complete",
    )
    runs = db.rows(
        "SELECT started_at, ended_at FROM {schema}.executions WHERE job_id = ANY(%s)", (ids,)
    )
    assert len(runs) == jobs
    return overlap([(r["started_at"], r["ended_at"]) for r in runs])


def history(db: Db, handler: str, peak_mib: int, attempts: int = 10) -> None:
    """Completed jobs of `handler` whose attempts peaked at `peak_mib` (what a daemon
    measured and recorded, as attempt_account_v1 writes it)."""
    for n in range(attempts):
        [row] = db.rows(
            "INSERT INTO {schema}.jobs (handler, status, started_at, finished_at, attempts) "
            "VALUES (%s, 'completed', now(), now(), 1) RETURNING id",
            (handler,),
        )
        db.rows(
            "INSERT INTO {schema}.attempts (job_id, lease_token, attempt, outcome, "
            "started_at, wall_seconds, peak_memory) "
            "VALUES (%s, %s, 1, 'completed', now(), 1, %s)",
            (row["id"], n + 1, peak_mib * MIB),
        )


def test_the_estimate_admits_what_fits_until_there_is_history(db: Db, daemons: Daemons) -> None:
    # 4 slots, but 256 MiB admits two jobs expected to use 100 MiB each
    daemons.start(
        {"rec": {"target": WORK, "memory_estimate": "100MiB"}},
        {"slots": 4, "memory_budget": "256MiB"},
    )
    assert run_all(db, 6, 1.5) == 2


def test_measured_peaks_replace_the_estimate(db: Db, daemons: Daemons) -> None:
    # estimated at 200 MiB (one at a time), measured at 20 MiB: the 4 slots bind instead
    history(db, "rec", peak_mib=20)
    daemons.start(
        {"rec": {"target": WORK, "memory_estimate": "200MiB"}},
        {"slots": 4, "memory_budget": "256MiB"},
    )
    assert run_all(db, 8, 2.0) > 1


def test_a_job_larger_than_the_budget_runs_alone_with_a_warning(db: Db, daemons: Daemons) -> None:
    history(db, "rec", peak_mib=400)  # measured above the 256 MiB budget
    daemon = daemons.start(
        {"rec": {"target": WORK, "memory_estimate": "100MiB"}},
        {"slots": 4, "memory_budget": "256MiB"},
    )
    assert run_all(db, 3, 1.0) == 1
    daemon.wait_log(r"handler rec: its jobs are expected to use 400MiB .* one runs here only alone")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sample(text: str, name: str, **labels: str) -> float | None:
    """A sample's value in Prometheus text (as tests/integration/test_daemon_metrics.py)."""
    for line in text.splitlines():
        match = re.match(rf"{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if match and all(f'{k}="{v}"' in (match[1] or "") for k, v in labels.items()):
            return float(match[2])
    return None


def test_explain_and_the_metrics_show_what_admission_holds_back(db: Db, daemons: Daemons) -> None:
    """A job that waits for memory says so in `explain` (its handler's expectation, how it
    was formed, each daemon's free budget); one larger than every budget says that; the
    metrics show the budget, what the running jobs hold, each handler's expectation and
    the slots admission refused."""
    pytest.importorskip("prometheus_client")
    history(db, "huge", peak_mib=400)  # measured above the 256 MiB budget
    port = free_port()
    config = daemons.config(
        {
            "rec": {"target": WORK, "memory_estimate": "100MiB"},
            "huge": {"target": WORK, "memory_estimate": "100MiB"},
        },
        {"slots": 4, "memory_budget": "256MiB"},
    )
    config.write_text(config.read_text() + f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
    daemons.start(config)
    ids = [db.enqueue("rec", {"seconds": 30}) for _ in range(3)]
    wait_for(
        lambda: sum(db.job(i)["status"] == "running" for i in ids) == 2,
        what="two of the three jobs running (256 MiB admits two of 100 MiB)",
    )
    [waiting] = [i for i in ids if db.job(i)["status"] == "pending"]
    huge = db.enqueue("huge", {"seconds": 0.1})

    def reason(job_id: int, code: str) -> dict[str, Any] | None:
        found = explain(db.conn, db.schema, job_id)
        assert found is not None
        return next((r for r in found["reasons"] if r["code"] == code), None)

    # (the registry row carries the daemon's figures from its next heartbeat)
    held = wait_for(lambda: reason(waiting, "memory_admission"), what="memory_admission")
    assert held["facts"]["expected"] == 100 * MIB
    assert held["facts"]["daemons"][0]["budget"] == 256 * MIB
    assert held["facts"]["daemons"][0]["free"] == 56 * MIB
    assert "its memory_estimate (fewer than 5 measured attempts: 0)" in held["message"]
    assert "56MiB free of 256MiB" in held["message"]
    over = wait_for(lambda: reason(huge, "memory_over_budget"), what="memory_over_budget")
    assert over["facts"]["expected"] == 400 * MIB
    assert "percentile of the peaks of its last 10 measured attempts" in over["message"]
    assert "it runs only alone, on an idle daemon" in over["message"]
    assert db.job(huge)["status"] == "pending"

    def scrape() -> str | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
        refused = sample(text, "pgworkerd_memory_admission_refused_slots", handler="rec")
        return text if refused else None

    text = wait_for(scrape, what="the metrics to show slots refused to rec")
    assert sample(text, "pgworkerd_memory_budget_bytes") == 256 * MIB
    assert sample(text, "pgworkerd_memory_held_bytes") == 200 * MIB
    assert sample(text, "pgworkerd_memory_expected_bytes", handler="rec") == 100 * MIB
    assert sample(text, "pgworkerd_memory_expected_bytes", handler="huge") == 400 * MIB
