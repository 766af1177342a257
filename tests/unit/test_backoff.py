"""Unit tier: the one jittered backoff every retry loop uses (pgworkerd.backoff)."""

from __future__ import annotations

import random

import pytest

from pgworkerd.backoff import Backoff


def test_without_jitter_the_delay_grows_by_the_factor_up_to_the_maximum() -> None:
    b = Backoff(0.5, 30.0, jitter=0.0)
    assert [b.next_delay() for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]


def test_a_factor_other_than_two() -> None:
    b = Backoff(1.0, 10.0, factor=3.0, jitter=0.0)
    assert [b.next_delay() for _ in range(4)] == [1, 3, 9, 10]


def test_reset_starts_again_from_the_initial_delay() -> None:
    b = Backoff(1.0, 30.0, jitter=0.0)
    for _ in range(5):
        b.next_delay()
    b.reset()
    assert b.next_delay() == 1.0
    assert b.next_delay() == 2.0


def test_jitter_stays_within_its_spread_around_the_nominal_delay() -> None:
    b = Backoff(1.0, 30.0, jitter=0.1, rng=random.Random(7))
    nominal = [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    for expected in nominal:
        delay = b.next_delay()
        assert expected * 0.9 <= delay <= expected * 1.1


def test_jitter_spreads_daemons_that_failed_at_the_same_moment() -> None:
    # Two daemons that lost the database together must not retry in lock-step.
    first = Backoff(1.0, 30.0, rng=random.Random(1)).next_delay()
    second = Backoff(1.0, 30.0, rng=random.Random(2)).next_delay()
    assert first != second
    delays = {round(Backoff(30.0, 30.0, rng=random.Random(s)).next_delay(), 6) for s in range(50)}
    assert len(delays) == 50  # even at the cap


def test_a_seeded_random_source_gives_the_same_delays() -> None:
    a = Backoff(0.5, 30.0, rng=random.Random(42))
    b = Backoff(0.5, 30.0, rng=random.Random(42))
    assert [a.next_delay() for _ in range(10)] == [b.next_delay() for _ in range(10)]


def test_the_nominal_delay_is_readable_without_advancing() -> None:
    b = Backoff(0.5, 30.0, jitter=0.0)
    assert b.nominal == 0.5
    b.next_delay()
    assert b.nominal == 1.0
    assert b.nominal == 1.0


@pytest.mark.parametrize(
    ("initial", "maximum", "factor", "jitter"),
    [
        (0.0, 30.0, 2.0, 0.1),
        (-1.0, 30.0, 2.0, 0.1),
        (2.0, 1.0, 2.0, 0.1),
        (1.0, 30.0, 0.5, 0.1),
        (1.0, 30.0, 2.0, -0.1),
        (1.0, 30.0, 2.0, 1.0),
    ],
)
def test_nonsense_parameters_are_refused(
    initial: float, maximum: float, factor: float, jitter: float
) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(initial, maximum, factor=factor, jitter=jitter)
