"""Unit tier: when the daemon's sweeps look (pgworkerd.daemon.sweeps: the expiry sweep,
spaced across the fleet, and the waits' timeouts, each daemon on its own), with a fake
clock and a fake statement."""

from __future__ import annotations

import logging
import random

import pytest
from fakes import FakeClock

from pgworkerd.daemon.sweeps import EXPIRY, WAIT_TIMEOUTS, Sweep


class Ended:
    """A fake job_expired_cancel: the counts it returns, in turn (then 0)."""

    def __init__(self, *answers: int | None) -> None:
        self.answers = list(answers)
        self.asked: list[int] = []

    def __call__(self, max_jobs: int) -> int | None:
        self.asked.append(max_jobs)
        return self.answers.pop(0) if self.answers else 0


def test_the_expiry_sweep_is_spaced_across_the_fleet() -> None:
    # 10 live daemons: each looks every ~10 x EXPIRY.look, so the fleet about every one
    clock = FakeClock()
    ended = Ended()
    sweep = Sweep(EXPIRY, ended, lambda: 10, clock=clock, rng=random.Random(8))
    assert clock() <= sweep.next_deadline() <= clock() + EXPIRY.look
    gaps = []
    for _ in range(200):
        before = clock()
        clock.advance(max(0.0, sweep.next_deadline() - clock()))
        sweep.tick(clock())
        gaps.append(clock() - before)
    lo, hi = EXPIRY.look * 10 * (1 - EXPIRY.jitter), EXPIRY.look * 10 * (1 + EXPIRY.jitter)
    assert all(lo <= g <= hi for g in gaps[1:])
    assert 0.9 * EXPIRY.look * 10 <= sum(gaps[1:]) / len(gaps[1:]) <= 1.1 * EXPIRY.look * 10
    assert len(ended.asked) == 200 and set(ended.asked) == {EXPIRY.batch}
    sweep.tick(clock.advance(1.0))  # no statement between looks
    assert len(ended.asked) == 200


def test_a_full_expiry_batch_is_followed_by_the_next_soon_and_a_failure_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    ended = Ended(EXPIRY.batch, EXPIRY.batch, 3, None)
    sweep = Sweep(EXPIRY, ended, lambda: 1, clock=clock, rng=random.Random(9))
    with caplog.at_level(logging.INFO, logger="pgworkerd"):
        clock.advance(EXPIRY.look)
        sweep.tick(clock())
        assert sweep.next_deadline() == clock() + EXPIRY.batch_pause
        sweep.tick(clock.advance(EXPIRY.batch_pause))
        assert sweep.next_deadline() == clock() + EXPIRY.batch_pause
        sweep.tick(clock.advance(EXPIRY.batch_pause))  # 3: done, the spaced interval again
        assert sweep.next_deadline() >= clock() + EXPIRY.look * (1 - EXPIRY.jitter)
        clock.advance(sweep.next_deadline() - clock())
        sweep.tick(clock())  # failed (None): no retry storm
        assert sweep.next_deadline() >= clock() + EXPIRY.look * (1 - EXPIRY.jitter)
    assert "expiry: 1000 job(s) past their expires_at ended as cancelled" in caplog.text
    assert "expiry: 3 job(s)" in caplog.text


def test_the_wait_timeouts_look_once_per_jittered_interval_whatever_the_fleet() -> None:
    """Each daemon looks every WAIT_TIMEOUTS.look on its own (not spaced across the
    fleet), so a wait ends at most about look * (1 + jitter) after its timeout."""
    clock = FakeClock()
    moved = Ended(0, WAIT_TIMEOUTS.batch, 3, None)
    w = Sweep(WAIT_TIMEOUTS, moved, lambda: 10, clock=clock, rng=random.Random(3))
    look, jitter = WAIT_TIMEOUTS.look, WAIT_TIMEOUTS.jitter
    assert clock() <= w.next_deadline() <= clock() + look
    w.tick(w.next_deadline() - 0.01)
    assert moved.asked == []
    now = w.next_deadline()
    w.tick(now)  # nothing due: the next look within the jittered interval, 10 peers or not
    assert moved.asked == [WAIT_TIMEOUTS.batch]
    gap = w.next_deadline() - now
    assert look * (1 - jitter) <= gap <= look * (1 + jitter)
    now = w.next_deadline()
    w.tick(now)  # a full batch: more are due, the next batch soon
    assert w.next_deadline() == now + WAIT_TIMEOUTS.batch_pause
    for _ in range(2):  # a short batch, then a failed call: back to the interval
        now = w.next_deadline()
        w.tick(now)
        assert look * (1 - jitter) <= w.next_deadline() - now <= look * (1 + jitter)
    assert len(moved.asked) == 4
