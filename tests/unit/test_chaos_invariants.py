"""The chaos soak's invariants of issues 24 and 25 (bench/chaos_soak.py) on rows made by
hand: a clean run passes them all, and each kind of violation is counted by its own check,
so a soak that reports 0 has looked. Issue 24's (Soak.issue24_checks): a child started
before its parent completed, a follow-up twice, a lost signal, a job left suspended with
its signal, a signal by key not seen exactly once, an expired job started, an expiring job
never claimed and not ended as expired. Issue 25's: a key's share of a fair handler's
starts off its weight (fair_share_breaches), a slot idle while a job was due (idle_slots),
a dedupe key held twice within its window (dedupe_breaches)."""

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


# Issue 25's invariants: fair share by weight, no idle slot while work is due, dedupe
# windows (the rate's, _over_rate, predates them). Each passes a clean history and counts
# its own kind of breach.

WEIGHTS = {"a": 3, "b": 1}


def fair_history(order: str) -> tuple[dict[int, tuple[str, float]], list[tuple[float, int]]]:
    """12 jobs of a and 4 of b, all enqueued at 0, started one a second in `order`."""
    jobs = {n: ("a" if n < 12 else "b", 0.0) for n in range(16)}
    next_of = {"a": iter(range(12)), "b": iter(range(12, 16))}
    starts = [(float(t + 1), next(next_of[k])) for t, k in enumerate(order)]
    return jobs, starts


def test_fair_share_by_weight_passes_turns_and_counts_a_starved_key() -> None:
    jobs, starts = fair_history("aaab" * 4)  # turns: 3 of a, 1 of b
    # (the last window ends at 16, when a has no job left: not looked at)
    assert SOAK.fair_share_breaches(jobs, starts, WEIGHTS, 8, 1) == (8, [])
    jobs, starts = fair_history("a" * 12 + "b" * 4)  # FIFO: b waits for all of a
    looked, breaches = SOAK.fair_share_breaches(jobs, starts, WEIGHTS, 8, 1)
    # b is due until its first start at 13: windows starting at 1..5 end before that
    assert looked == 5 and len(breaches) == 5
    assert breaches[0] == (1.0, {"a": 8, "b": 0})


def test_fair_share_looks_only_while_every_key_is_due() -> None:
    jobs, starts = fair_history("a" * 12 + "b" * 4)
    jobs = {j: (k, 0.0 if k == "a" else 12.5) for j, (k, _) in jobs.items()}  # b came late
    assert SOAK.fair_share_breaches(jobs, starts, WEIGHTS, 8, 1) == (0, [])


def sample(at: float, running: int, due: set[int], since: float = 0.0) -> Any:
    return SOAK.Sample(at, {"w1": (since, running)}, due)


def test_an_idle_slot_counts_only_when_it_lasts_the_grace_with_the_same_job_due() -> None:
    busy = [sample(10 + t / 2, 6, {1}) for t in range(20)]
    assert SOAK.idle_slots(busy, 6, 3.0, []) == []
    idle = [sample(10 + t / 2, 5, {1}) for t in range(8)]  # 3.5 s with job 1 due
    assert SOAK.idle_slots(idle, 6, 3.0, []) == [("w1", 10.0, 13.0, 5)]
    # a different job due at each end: claims are happening (not idle by this measure)
    moving = [sample(10 + t / 2, 5, {t}) for t in range(8)]
    assert SOAK.idle_slots(moving, 6, 3.0, []) == []
    # no work due; a daemon just (re)started; PostgreSQL just restarted
    assert SOAK.idle_slots([sample(10 + t / 2, 5, set()) for t in range(8)], 6, 3.0, []) == []
    fresh = [sample(10 + t / 2, 5, {1}, since=9.0) for t in range(8)]
    assert SOAK.idle_slots(fresh, 6, 3.0, []) == []
    assert SOAK.idle_slots(idle, 6, 3.0, [9.0]) == []


def test_a_dedupe_key_held_twice_within_its_window_is_counted() -> None:
    # (id, key, created, finished)
    clean = [(1, "k", 0.0, 5.0), (2, "k", 6.5, 7.0), (3, "j", 1.0, None), (4, "k", 8.5, 9.0)]
    assert SOAK.dedupe_breaches(clean, 1.5) == []
    within = [(1, "k", 0.0, 5.0), (2, "k", 6.4, 7.0)]  # 1.4 s after the finish
    assert SOAK.dedupe_breaches(within, 1.5) == [("k", 1, 2)]
    live = [(1, "k", 0.0, None), (2, "k", 3.0, 4.0)]  # the first never finished
    assert SOAK.dedupe_breaches(live, 1.5) == [("k", 1, 2)]
    overlapping = [(1, "k", 0.0, 5.0), (2, "k", 2.0, 3.0)]
    assert SOAK.dedupe_breaches(overlapping, 1.5) == [("k", 1, 2)]


def test_a_second_with_more_starts_than_the_rate_is_counted() -> None:
    spaced = [0.0, 0.21, 0.42, 0.63, 0.84, 1.05, 1.26]  # any second holds at most 5
    assert SOAK._over_rate(spaced, 5) == []
    over = SOAK._over_rate([*spaced, 1.1], 5)
    assert over and over[0] == (0.21, 6)  # 0.21 .. 1.1 holds six
