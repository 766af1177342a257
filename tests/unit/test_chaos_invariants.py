"""The chaos soak's invariants of issue 24 (bench/chaos_soak.py, Soak.issue24_checks) on
rows made by hand: a clean run passes them all, and each kind of violation (a child
started before its parent completed, a follow-up twice, a lost signal, a job left
suspended with its signal, a signal by key not seen exactly once, an expired job started,
an expiring job never claimed and not ended as expired) is counted by its own check, so a
soak that reports 0 has looked."""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_soak() -> Any:
    sys.path.insert(0, str(BENCH))  # chaos_soak imports daemon_bench
    try:
        spec = importlib.util.spec_from_file_location("chaos_soak", BENCH / "chaos_soak.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["chaos_soak"] = module  # its dataclasses look themselves up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


SOAK = load_soak()
T100 = datetime.fromtimestamp(100, UTC)
CHECKS = (
    "children started before all their parents completed",
    "fan-outs whose follow-ups are not there exactly once",
    "signals lost (a signalled wait not resumed by it)",
    "jobs left suspended with their signal there",
    "signals by key not seen exactly once by their job",
    "expired jobs started (claimed at or after expires_at)",
    "expiring jobs never started not ended cancelled as expired",
)


def job(job_id: int, status: str, result: Any = None, error: str | None = None) -> tuple:
    # the columns of Soak.report's rows: id, status, attempts, max_attempts, result,
    # doomed, last_error, handler, concurrency_key
    return (job_id, status, 1, 10, result, False, error, "chaos", None)


def clean() -> tuple[dict[str, list[tuple]], dict[int, tuple], dict[int, list], dict]:
    """Parent 1 -> child 2; fan-out 3 with follow-ups 4, 5; waiter 6, signalled; job 7
    expired before it started; waiter 8 under key "k8", signalled by key before its wait
    (parked): it waited, then saw the payload on two attempts; job 9, of a handler no
    daemon serves, expired never claimed."""
    found: dict[str, list[tuple]] = {
        "parents": [(2, 1, "completed", T100, "cancel")],
        "fan_outs": [(3, 2)],
        "follow_ups": [(4, 3, 0), (5, 3, 1)],
        "follow_up_rows": [(3, 4), (3, 5)],
        "waiters": [(6, None), (8, "k8")],
        "signals": [(6, {"token": "t"}), (8, {"token": "t8"})],
        "parked_left": [],
        "suspended_with_signal": [],
        "expiring": [(7, T100, "chaos", True), (9, T100, "nobody-serves-this", True)],
        "started_expired": [],
    }
    jobs = {
        1: job(1, "completed"),
        2: job(2, "completed"),
        3: job(3, "completed"),
        4: job(4, "completed"),
        5: job(5, "completed"),
        6: job(6, "completed", {"signal": {"token": "t"}}),
        7: job(7, "cancelled", error="expired: not started by its expires_at ..."),
        8: job(8, "completed", {"signal": {"token": "t8"}}),
        9: job(9, "cancelled", error="expired: not started by its expires_at ..."),
    }
    per_job: dict[int, list[Any]] = {
        1: [{"start": 90.0}],
        2: [{"start": 101.0}],
        8: [
            {"start": 100.0, "wait": 100.1, "seen": []},
            {"start": 105.0, "wait": None, "seen": [(105.0, {"token": "t8"})]},
            {"start": 107.0, "wait": None, "seen": [(107.0, {"token": "t8"})]},
        ],
    }
    return found, jobs, per_job, {6: ("t", "kept"), 8: ("t8", "parked")}


def counts(found: dict, jobs: dict, per_job: dict, signals: dict) -> dict[str, int]:
    out = SOAK.Soak.issue24_checks(SimpleNamespace(signals=signals), found, jobs, per_job)
    return {what: n for what, n, _ in out.checks}


def test_a_clean_run_passes_and_its_cancelled_jobs_are_not_lost() -> None:
    found, jobs, per_job, signals = clean()
    assert counts(found, jobs, per_job, signals) == dict.fromkeys(CHECKS, 0)
    # with the run policy, a child runs once its dead parent has ended
    found["parents"] = [(2, 1, "dead", T100, "run")]
    jobs[1] = job(1, "dead")
    assert counts(found, jobs, per_job, signals) == dict.fromkeys(CHECKS, 0)
    out = SOAK.Soak.issue24_checks(SimpleNamespace(signals=signals), found, jobs, per_job)
    assert out.cancelled_rightly == {7, 9}
    assert "1 children of 1 parents (1 of a parent that failed: run 1); 1 fan-outs with 2" in (
        out.summary
    )
    assert "2 follow-ups; 1 waits" in out.summary
    assert "1 waits by key, signals parked 1" in out.summary
    assert "2 expiring jobs (1 no daemon serves" in out.summary


def started_before_its_parent_finished(f: dict, j: dict, p: dict, s: dict) -> None:
    p[2] = [{"start": 99.5}]


def ran_though_its_parent_died(f: dict, j: dict, p: dict, s: dict) -> None:
    f["parents"] = [(2, 1, "dead", T100, "cancel")]
    j[1] = job(1, "dead")


def ran_before_its_dead_parent_ended_with_the_run_policy(
    f: dict, j: dict, p: dict, s: dict
) -> None:
    f["parents"] = [(2, 1, "dead", datetime.fromtimestamp(102, UTC), "run")]
    j[1] = job(1, "dead")


def a_follow_up_twice(f: dict, j: dict, p: dict, s: dict) -> None:
    f["follow_ups"].append((8, 3, 1))
    f["follow_up_rows"].append((3, 8))


def follow_ups_of_a_dead_fan_out(f: dict, j: dict, p: dict, s: dict) -> None:
    j[3] = job(3, "dead")


def a_follow_up_not_listed(f: dict, j: dict, p: dict, s: dict) -> None:
    f["follow_up_rows"].pop()


def resumed_by_the_timeout(f: dict, j: dict, p: dict, s: dict) -> None:
    j[6] = job(6, "completed", {"signal": None})


def never_signalled(f: dict, j: dict, p: dict, s: dict) -> None:
    del s[6]


def a_keyed_signal_refused(f: dict, j: dict, p: dict, s: dict) -> None:
    s[8] = ("t8", "refused: 16 signals are parked under it already")


def a_refused_signal(f: dict, j: dict, p: dict, s: dict) -> None:
    s[6] = ("t", "refused: job 6 is finished")


def left_suspended(f: dict, j: dict, p: dict, s: dict) -> None:
    f["suspended_with_signal"] = [(6,)]


def an_expired_job_claimed(f: dict, j: dict, p: dict, s: dict) -> None:
    f["started_expired"] = [(7, 1, T100)]


def a_keyed_signal_left_parked(f: dict, j: dict, p: dict, s: dict) -> None:
    # (its job still saw a payload: another way in, but this one stayed parked)
    f["parked_left"] = [("k8",)]


def a_keyed_signal_seen_as_none_after_the_wait(f: dict, j: dict, p: dict, s: dict) -> None:
    p[8][1]["seen"] = [(105.0, None)]  # a retry that lost it; the last attempt saw it


def a_keyed_wait_taken_again_after_its_signal(f: dict, j: dict, p: dict, s: dict) -> None:
    p[8][2]["wait"] = 107.5  # the signal consumed, then waited for again


def a_keyed_signal_another_payload(f: dict, j: dict, p: dict, s: dict) -> None:
    p[8][1]["seen"] = [(105.0, {"token": "other"})]


def a_keyed_signal_never_seen(f: dict, j: dict, p: dict, s: dict) -> None:
    p[8] = p[8][:1]


def an_unserved_expiring_job_left_pending(f: dict, j: dict, p: dict, s: dict) -> None:
    j[9] = job(9, "pending")


def an_unserved_expiring_job_cancelled_without_the_reason(
    f: dict, j: dict, p: dict, s: dict
) -> None:
    j[9] = job(9, "cancelled", error="cancelled by an operator")


def a_never_claimed_expired_job_reached_a_handler(f: dict, j: dict, p: dict, s: dict) -> None:
    p[9] = [{"start": 101.0}]


@pytest.mark.parametrize(
    ("spoil", "check"),
    [
        (started_before_its_parent_finished, CHECKS[0]),
        (ran_though_its_parent_died, CHECKS[0]),
        (ran_before_its_dead_parent_ended_with_the_run_policy, CHECKS[0]),
        (a_follow_up_twice, CHECKS[1]),
        (follow_ups_of_a_dead_fan_out, CHECKS[1]),
        (a_follow_up_not_listed, CHECKS[1]),
        (resumed_by_the_timeout, CHECKS[2]),
        (never_signalled, CHECKS[2]),
        (a_refused_signal, CHECKS[2]),
        (a_keyed_signal_refused, CHECKS[2]),
        (left_suspended, CHECKS[3]),
        (a_keyed_signal_left_parked, CHECKS[4]),
        (a_keyed_signal_seen_as_none_after_the_wait, CHECKS[4]),
        (a_keyed_wait_taken_again_after_its_signal, CHECKS[4]),
        (a_keyed_signal_another_payload, CHECKS[4]),
        (a_keyed_signal_never_seen, CHECKS[4]),
        (an_expired_job_claimed, CHECKS[5]),
        (an_unserved_expiring_job_left_pending, CHECKS[6]),
        (an_unserved_expiring_job_cancelled_without_the_reason, CHECKS[6]),
        (a_never_claimed_expired_job_reached_a_handler, CHECKS[6]),
    ],
)
def test_each_violation_is_counted_by_its_check(spoil: Any, check: str) -> None:
    found, jobs, per_job, signals = clean()
    spoil(found, jobs, per_job, signals)
    assert counts(found, jobs, per_job, signals) == {c: int(c == check) for c in CHECKS}
