"""Unit tier: when the maintenance components look (pgworkerd.daemon.retention: Retention,
StaleMarking and RollupSweep; the sweeps are test_sweeps_cadence.py), with a fake clock and
a fake statement: no idle load that grows with the fleet."""

from __future__ import annotations

import dataclasses
import logging
import random

import pytest
from fakes import FakeClock

from pgworkerd.config import RetentionConfig
from pgworkerd.daemon.retention import (
    BATCH_PAUSE,
    JITTER,
    LOCK_WAIT,
    ROLLUP_JITTER,
    ROLLUP_LOOK,
    Pruned,
    Retention,
    RetentionBusy,
    RollupSweep,
    StaleMarking,
)
from pgworkerd.queue.attempts import RollupStep
from pgworkerd.queue.retention import PruneResult

POLICY = RetentionConfig(interval=300.0, batch=500)


class Answers:
    def __init__(self, *results: PruneResult | None) -> None:
        self.results = list(results)
        self.calls = 0

    def __call__(self, config: RetentionConfig) -> PruneResult | None:
        self.calls += 1
        return self.results.pop(0) if self.results else PruneResult(0, 1)


def test_the_first_look_comes_within_the_first_interval() -> None:
    clock = FakeClock()
    r = Retention(POLICY, Answers(), clock=clock, rng=random.Random(1))
    deadline = r.next_deadline()
    assert deadline is not None and clock() <= deadline <= clock() + 300.0


def test_with_nothing_to_do_the_fleet_looks_about_once_per_interval() -> None:
    # 100 live daemons: each looks every ~100 intervals, so the fleet about once per one.
    clock = FakeClock()
    answers = Answers(*[PruneResult(0, 100)] * 1000)
    r = Retention(POLICY, answers, clock=clock, rng=random.Random(2))
    looks = []
    for _ in range(50):
        clock.advance(max(0.0, r.due_at - clock()))
        r.tick(clock())
        looks.append(r.due_at - clock())
    assert all(300.0 * 100 * (1 - JITTER) <= w <= 300.0 * 100 * (1 + JITTER) for w in looks)
    assert answers.calls == 50


def test_full_batches_follow_each_other_then_the_spaced_interval() -> None:
    clock = FakeClock()
    answers = Answers(PruneResult(500, 1), PruneResult(500, 1), PruneResult(7, 1))
    r = Retention(POLICY, answers, clock=clock, rng=random.Random(3))
    r.due_at = clock()
    r.tick(clock())
    assert r.due_at == clock() + BATCH_PAUSE
    r.tick(clock.advance(BATCH_PAUSE))
    r.tick(clock.advance(BATCH_PAUSE))
    assert r.run == Pruned() and r.due_at - clock() >= 300.0 * (1 - JITTER)
    assert answers.calls == 3


def test_another_daemon_pruning_or_a_failed_call_waits_the_spaced_interval() -> None:
    clock = FakeClock()
    r = Retention(POLICY, Answers(PruneResult(None, 3), None), clock=clock, rng=random.Random(4))
    r.due_at = clock()
    r.tick(clock())
    assert r.due_at - clock() >= 300.0 * 3 * (1 - JITTER)
    r.tick(clock.advance(r.due_at - clock()))  # failed: no live count learnt, none lost
    assert r.due_at - clock() >= 300.0 * 3 * (1 - JITTER)


def test_off_everywhere_means_no_deadline_and_no_statement() -> None:
    off = dataclasses.replace(
        POLICY, completed=None, cancelled=None, dead=None, schedule_runs=None, gone_daemons=None
    )
    answers = Answers()
    clock = FakeClock()
    r = Retention(off, answers, clock=clock)
    r.tick(clock.advance(10_000.0))
    assert r.next_deadline() is None and r.run_once() is None and answers.calls == 0


def test_run_to_end_runs_batches_until_one_comes_back_short_and_sums_them() -> None:
    # `pgworkerd prune`: the same component, to the end at once, not on the cadence
    answers = Answers(
        PruneResult(500, 1, 3, 0), PruneResult(12, 1, 500, 1), PruneResult(0, 1, 4, 0)
    )
    slept: list[float] = []
    r = Retention(POLICY, answers, clock=FakeClock(), rng=random.Random(5))
    assert r.run_to_end(sleep=slept.append) == Pruned(jobs=512, schedule_runs=507, daemons=1)
    assert answers.calls == 3 and slept == []


def test_run_to_end_waits_while_a_daemon_holds_the_lock_then_gives_up() -> None:
    answers = Answers(PruneResult(None, 2), PruneResult(None, 2), PruneResult(7, 2))
    slept: list[float] = []
    r = Retention(POLICY, answers, clock=FakeClock())
    assert r.run_to_end(sleep=slept.append) == Pruned(jobs=7)
    assert slept == [BATCH_PAUSE, BATCH_PAUSE]

    held = Answers(*[PruneResult(None, 2)] * 10_000)
    slept.clear()
    with pytest.raises(RetentionBusy, match="retention lock"):
        Retention(POLICY, held, clock=FakeClock()).run_to_end(sleep=slept.append)
    assert LOCK_WAIT <= sum(slept) <= LOCK_WAIT + BATCH_PAUSE


# -- stale-marking: the fleet looks for silent peers about every quarter of stale_after ----


class Marks:
    """The stale-marking statement: what it was asked, what it answers in turn."""

    def __init__(self, *answers: list[tuple[str, str, int]] | None) -> None:
        self.answers = list(answers)
        self.asked: list[float] = []

    def __call__(self, stale_after: float) -> list[tuple[str, str, int]] | None:
        self.asked.append(stale_after)
        return self.answers.pop(0) if self.answers else []


def looks(marking: StaleMarking, clock: FakeClock, n: int) -> list[float]:
    """The gaps between this daemon's next n looks."""
    gaps = []
    for _ in range(n):
        before = clock()
        clock.advance(max(0.0, marking.next_deadline() - clock()))
        marking.tick(clock())
        gaps.append(clock() - before)
    return gaps


def test_a_starting_daemon_looks_at_once_then_alone_every_quarter_of_stale_after() -> None:
    clock = FakeClock()
    marks = Marks()
    m = StaleMarking(marks, lambda: 60.0, lambda: 1, clock=clock, rng=random.Random(6))
    assert m.next_deadline() == clock()
    m.tick(clock())
    assert marks.asked == [60.0]
    gaps = looks(m, clock, 200)
    assert all(15.0 * 0.5 <= g <= 15.0 * 1.5 for g in gaps)
    assert 14.0 <= sum(gaps) / len(gaps) <= 16.0
    assert len(marks.asked) == 201  # one statement per look, none in between
    m.tick(clock.advance(1.0))
    assert len(marks.asked) == 201


def test_in_a_fleet_each_daemon_looks_that_much_less_often_the_fleet_as_often() -> None:
    """The fleet-wide spacing: each of 40 daemons every quarter x 40, so the fleet as a
    whole still looks about every quarter of stale_after (15 s), whatever its size; an
    empty peer list (not read yet) counts as the daemon alone."""
    fleet = 40
    clock = FakeClock()
    marks = Marks()
    m = StaleMarking(marks, lambda: 60.0, lambda: fleet, clock=clock, rng=random.Random(7))
    gaps = looks(m, clock, 300)[1:]  # after the first look, at once
    assert all(15.0 * 40 * 0.5 <= g <= 15.0 * 40 * 1.5 for g in gaps)
    assert 15.0 * 0.9 <= sum(gaps) / len(gaps) / fleet <= 15.0 * 1.1
    fleet = 0
    assert all(15.0 * 0.5 <= g <= 15.0 * 1.5 for g in looks(m, clock, 50)[1:])


def test_stale_after_is_read_at_each_look_a_reload_changes_it() -> None:
    stale_after = 60.0
    clock = FakeClock()
    marks = Marks()
    m = StaleMarking(marks, lambda: stale_after, lambda: 1, clock=clock, rng=random.Random(8))
    looks(m, clock, 2)
    stale_after = 600.0  # renew_interval 100 s: 6 x 100
    gaps = looks(m, clock, 20)
    assert marks.asked[:3] == [60.0, 60.0, 600.0] and set(marks.asked[3:]) == {600.0}
    assert all(150.0 * 0.5 <= g <= 150.0 * 1.5 for g in gaps[1:])


def test_each_daemon_marked_gone_is_logged_and_a_failed_look_waits_its_turn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    marks = Marks([("w-1", "host-a", 41), ("w-2", "host-b", 42)], None)
    m = StaleMarking(marks, lambda: 60.0, lambda: 3, clock=clock, rng=random.Random(9))
    with caplog.at_level(logging.WARNING, logger="pgworkerd"):
        m.tick(clock())
        assert [r.getMessage() for r in caplog.records] == [
            "daemon w-1 (host host-a pid 41) stopped heartbeating: marked gone",
            "daemon w-2 (host host-b pid 42) stopped heartbeating: marked gone",
        ]
        caplog.clear()
        looks(m, clock, 1)  # the statement failed: nothing logged, next look spaced
        assert caplog.records == []
    assert m.next_deadline() - clock() >= 15.0 * 3 * 0.5


class Steps:
    """A fake attempt_rollups_advance: the steps it returns, in turn (then one not behind)."""

    def __init__(self, *answers: RollupStep | None) -> None:
        self.answers = list(answers)
        self.calls = 0

    def __call__(self) -> RollupStep | None:
        self.calls += 1
        return self.answers.pop(0) if self.answers else RollupStep(None, False)


def test_the_rollup_is_spaced_across_the_fleet_and_catches_up_soon() -> None:
    """The fleet steps the charts' rollup about every ROLLUP_LOOK seconds whatever its
    size; a step left behind (a backlog) is followed by the next after BATCH_PAUSE; a
    failed or skipped step (None: another daemon holds it) waits for the next look."""
    clock = FakeClock()
    steps = Steps()
    sweep = RollupSweep(steps, lambda: 10, clock=clock, rng=random.Random(3))
    assert clock() <= sweep.next_deadline() <= clock() + ROLLUP_LOOK
    gaps = []
    for _ in range(200):
        before = clock()
        clock.advance(max(0.0, sweep.next_deadline() - clock()))
        sweep.tick(clock())
        gaps.append(clock() - before)
    lo, hi = ROLLUP_LOOK * 10 * (1 - ROLLUP_JITTER), ROLLUP_LOOK * 10 * (1 + ROLLUP_JITTER)
    assert all(lo <= g <= hi for g in gaps[1:])
    assert 0.9 * ROLLUP_LOOK * 10 <= sum(gaps[1:]) / len(gaps[1:]) <= 1.1 * ROLLUP_LOOK * 10
    assert steps.calls == 200
    sweep.tick(clock.advance(1.0))  # no statement between looks
    assert steps.calls == 200

    behind = Steps(RollupStep(None, True), RollupStep(None, True), None)
    sweep = RollupSweep(behind, lambda: 1, clock=clock, rng=random.Random(4))
    clock.advance(ROLLUP_LOOK)
    sweep.tick(clock())
    assert sweep.next_deadline() == clock() + BATCH_PAUSE
    sweep.tick(clock.advance(BATCH_PAUSE))
    assert sweep.next_deadline() == clock() + BATCH_PAUSE
    sweep.tick(clock.advance(BATCH_PAUSE))  # None: skipped or failed, no retry storm
    assert sweep.next_deadline() >= clock() + ROLLUP_LOOK * (1 - ROLLUP_JITTER)
