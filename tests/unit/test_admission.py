"""Admission by measured memory (daemon/admission.py): what one job of a handler is
expected to use (its recent peak, bounded; its estimate until there is history) and how
many more fit; the config's refusals. The daemon's behaviour under it, with real jobs:
tests/acceptance/test_memory_admission.py."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pgworkerd.config import ConfigError, parse_config
from pgworkerd.daemon.admission import FLOOR, MIN_HISTORY, MemoryAdmission
from pgworkerd.queue.attempts import MemoryPeak

MIB = 1 << 20

CONFIG = """
[worker]
slots = 8
memory_budget = "1GiB"
memory_limit = "900MiB"
[handlers.small]
target = "m:f"
memory_estimate = "100MiB"
[handlers.big]
target = "m:g"
memory_estimate = "400MiB"
"""


def admission(peaks: Mapping[str, MemoryPeak] | None = None, text: str = CONFIG) -> MemoryAdmission:
    read: list[list[str]] = []

    def read_peaks(handlers: list[str]) -> Mapping[str, MemoryPeak] | None:
        read.append(handlers)
        return peaks

    a = MemoryAdmission(parse_config(text), read_peaks, clock=lambda: 0.0)
    a.tick(0.0)
    assert read == ([["big", "small"]] if a.enabled else [])  # no budget: never read
    return a


def test_without_history_the_estimate_counts() -> None:
    a = admission({})
    assert a.expected("small") == 100 * MIB
    assert a.admits("small", {}) == 10
    assert a.admits("big", {}) == 2
    # what runs is expected to use its handlers' estimates: 400 + 2 x 100 of 1024 MiB
    assert a.admits("small", {"big": 1, "small": 2}) == 4
    assert a.admits("big", {"big": 1, "small": 2}) == 1
    assert a.admits("big", {"big": 2, "small": 1}) == 0
    # one claim for both handlers takes at most what fits of the larger
    assert a.claim_cap(["small", "big"], {}) == 2
    assert a.claim_cap(["small"], {}) == 10


def test_history_replaces_the_estimate_bounded_by_floor_and_limit() -> None:
    few = MemoryPeak(10 * MIB, MIN_HISTORY - 1)
    a = admission({"small": few, "big": MemoryPeak(300 * MIB, 50)})
    assert a.expected("small") == 100 * MIB  # too few measured attempts
    assert a.expected("big") == 300 * MIB
    a = admission({"small": MemoryPeak(1 * MIB, 50), "big": MemoryPeak(5000 * MIB, 50)})
    assert a.expected("small") == FLOOR  # never below the floor
    assert a.expected("big") == 900 * MIB  # never above the memory limit


def test_a_job_larger_than_the_budget_runs_alone_on_an_idle_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = CONFIG.replace('memory_limit = "900MiB"\n', "")
    a = admission({"big": MemoryPeak(3000 * MIB, 50)}, text)
    assert a.expected("big") == 3000 * MIB
    assert a.admits("big", {}) == 1
    assert a.claim_cap(["big", "small"], {}) == 1
    assert "more than [worker] memory_budget 1GiB: one runs here only alone" in caplog.text
    assert a.admits("big", {"small": 1}) == 0  # not beside anything
    assert a.claim_cap(["big", "small"], {"small": 1}) == 0


def test_a_failed_read_keeps_what_was_read_before() -> None:
    peaks: dict[str, MemoryPeak] | None = {"big": MemoryPeak(200 * MIB, 50)}
    now = [0.0]
    a = MemoryAdmission(parse_config(CONFIG), lambda h: peaks, clock=lambda: now[0])
    a.tick(0.0)
    assert a.expected("big") == 200 * MIB
    peaks = None
    a.tick(1000.0)
    assert a.expected("big") == 200 * MIB


def test_no_budget_no_admission() -> None:
    a = admission(None, CONFIG.replace('memory_budget = "1GiB"\n', ""))
    assert not a.enabled
    assert a.admits("big", {"big": 100}) >= 1 << 20


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[worker]\nmemory_budget = "1GiB"\n[handlers.h]\ntarget = "m:f"\n',
            "is needed with [worker] memory_budget",
        ),
        (
            '[worker]\nmemory_budget = "1GiB"\n[handlers.h]\ntarget = "m:f"\n'
            'memory_estimate = "2GiB"\n',
            "2GiB is larger than [worker] memory_budget (1GiB): its jobs would never be "
            "admitted here",
        ),
        (
            '[worker]\nmemory_budget = "1GiB"\nmemory_limit = "4GiB"\n[handlers.h]\n'
            'target = "m:f"\n',
            "4GiB is larger than [worker] memory_budget",
        ),
        ('[worker]\nmemory_budget = "0"\n', "memory_budget"),
        ('[worker]\nmemory_budget = "lots"\n', "memory_budget"),
    ],
)
def test_the_config_refuses_a_budget_no_job_fits(text: str, message: str) -> None:
    with pytest.raises(
        ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")
    ):
        parse_config(text)
