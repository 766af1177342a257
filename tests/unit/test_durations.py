"""Unit tests of pgworkerd.durations.format_duration: the exact form used in messages about
configured values, and the rounded form `pgworkerd status` uses for ages."""

from __future__ import annotations

import pytest

from pgworkerd.durations import format_duration, parse_duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.25, "250ms"),
        (0.0, "0ms"),
        (1.5, "1.5s"),
        (30, "30s"),
        (119, "119s"),
        (120, "2m"),
        (5400, "90m"),
        (7200, "2h"),
        (259200, "72h"),  # exact never switches to days
    ],
)
def test_exact(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds  # what it prints reads back as the same value


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (-3.0, "0s"),  # clocks of two hosts: an age is never negative
        (0.4, "0s"),
        (1.5, "2s"),
        (119.4, "119s"),
        (120, "2m"),
        (300.3, "5m"),
        (7199, "120m"),
        (7200, "2.0h"),
        (11520, "3.2h"),
        (172799, "48.0h"),
        (172800, "2.0d"),
        (388800, "4.5d"),
    ],
)
def test_rounded(seconds: float, text: str) -> None:
    assert format_duration(seconds, rounded=True) == text
