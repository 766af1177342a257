"""Admission by measured memory with real daemons (docs/guide/memory-admission.md): every
execution is recorded by the handler (tests/support/jobhandlers.py), and the number
running at once is what the budget admits: by the configured estimate until there is
history, by the handlers' measured peaks once there is, and a job larger than the budget
alone, with a warning."""

from __future__ import annotations

from datetime import datetime

from daemon_harness import Daemons, Db, wait_for

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
