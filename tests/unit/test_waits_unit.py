"""Unit tier of durable waits: WaitFor's checks (child and daemon alike), the protocol's
wait and wake-up fields, decide() of a wait report, JobContext's view of what woke it
(the cadence of the daemons' timeout sweep is test_sweeps_cadence.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakes import claimed_job

from pgworkerd.config import HandlerConfig, WorkerConfig
from pgworkerd.daemon.outcomes import InFlight, decide
from pgworkerd.daemon.states import OutcomeKind
from pgworkerd.worker import protocol
from pgworkerd.worker.child import JobContext
from pgworkerd.worker.outcomes import MAX_WAIT_SECONDS, WaitFor, wait_problem
from pgworkerd.worker.protocol import Failed, Job

WORKER = WorkerConfig(backoff=10.0, backoff_max=3600.0)
HANDLER = HandlerConfig("h", "jobhandlers:work")


@pytest.mark.parametrize(
    ("name", "timeout", "key", "seconds"),
    [
        ("approval", "2d", None, 2 * 86400.0),
        ("approval", 30, "order-42", 30.0),
        ("a" * 128, "1h30m", "k" * 128, 5400.0),
        ("x", MAX_WAIT_SECONDS, None, MAX_WAIT_SECONDS),
    ],
)
def test_good_waits_pass_with_their_timeout_in_seconds(
    name: str, timeout: Any, key: str | None, seconds: float
) -> None:
    assert wait_problem(name, timeout, key) == (None, seconds)


@pytest.mark.parametrize(
    ("name", "timeout", "key", "problem"),
    [
        ("", "1d", None, "WaitFor name must be a non-empty string"),
        (None, "1d", None, "WaitFor name must be a non-empty string"),
        ("a\x00b", "1d", None, "WaitFor name must not contain control characters"),
        ("a" * 129, "1d", None, "WaitFor name must be at most 128 characters"),
        (" a", "1d", None, "must not begin or end with whitespace"),
        ("a", 0, None, "WaitFor timeout must be above 0"),
        ("a", -1, None, "WaitFor timeout: -1 is negative"),
        ("a", float("nan"), None, "WaitFor timeout must be above 0"),
        ("a", float("inf"), None, "WaitFor timeout must be above 0"),
        ("a", "367d", None, "at most 31622400s (366 days)"),
        ("a", "tomorrow", None, "is not a duration"),
        ("a", [1], None, "WaitFor timeout must be a duration, not list"),
        ("a", True, None, "is not a duration"),
        ("a", "1d", "", "WaitFor key must be a non-empty string"),
        ("a", "1d", "k\n", "WaitFor key must not contain control characters"),
        ("a", "1d", 42, "WaitFor key must be a non-empty string"),
    ],
)
def test_bad_waits_say_why(name: Any, timeout: Any, key: Any, problem: str) -> None:
    found, _ = wait_problem(name, timeout, key)
    assert found is not None and problem in found


def test_the_protocol_carries_a_wait_and_what_woke_a_job() -> None:
    wait = {"name": "approval", "timeout": 60.0, "key": None}
    failed = Failed(3, "WaitFor: ...", "", wait=wait)
    body = json.loads(protocol.encode(failed)[4:])
    assert protocol.decode(body) == failed
    woken = {"name": "go", "ended": "signal", "payload": [1], "sent_at": "2026-11-27T00:00:00"}
    job = Job(3, "h", "m:f", "default", {}, 1, 5, None, 1.0, None, woken)
    assert protocol.decode(json.loads(protocol.encode(job)[4:])) == job
    # a job that never waited sends no key at all (an older child ignores it anyway)
    plain = protocol.encode(Job(3, "h", "m:f", "q", {}, 1, 5, None, 1.0))
    assert "woken" not in json.loads(plain[4:])


def in_flight() -> InFlight:
    return InFlight(claimed_job(), HANDLER, lease=60.0, claimed_at=0.0, deadline=54.0)


def test_decide_turns_a_checked_wait_into_a_wait_outcome() -> None:
    report = Failed(1, "WaitFor: x", "", wait={"name": "go", "timeout": "2h", "key": "k"})
    o = decide(in_flight(), report, "", False, WORKER)
    assert (o.kind, o.wait) == (OutcomeKind.WAIT, ("go", 7200.0, "k"))
    w = o.write()
    assert (w.kind, w.wait_name, w.wait_timeout, w.wait_key) == ("wait", "go", 7200.0, "k")


@pytest.mark.parametrize(
    ("wait", "problem"),
    [
        ({"name": "go", "timeout": 0}, "WaitFor timeout must be above 0"),
        ({"name": "a\tb", "timeout": 5}, "WaitFor name must not contain control"),
        ({"timeout": 5}, "WaitFor name must be a non-empty string"),
        (["go", 5], "the child sent a wait that is not an object"),
    ],
)
def test_decide_checks_a_childs_wait_again_a_bad_one_is_a_failed_attempt(
    wait: Any, problem: str
) -> None:
    """A child runs arbitrary code: what it sends is checked again in the daemon."""
    o = decide(in_flight(), Failed(1, "WaitFor: x", "", wait=wait), "", False, WORKER)
    assert o.kind is OutcomeKind.FAIL and problem in o.error and o.wait is None


class _Channel:
    cancel_requested = shutdown_requested = False
    shutdown_jobs: set[int] = set()


def _context(woken: Any) -> JobContext:
    job = Job(7, "h", "m:f", "default", {}, 1, 5, {"c": 1}, 1.0, None, woken=woken)
    return JobContext(_Channel(), job)  # type: ignore[arg-type]


def test_the_handler_sees_what_woke_its_job() -> None:
    never = _context(None)
    assert (never.waited_for, never.signal) == (None, None)
    timed_out = _context({"name": "go", "ended": "timeout", "payload": None, "sent_at": None})
    assert (timed_out.waited_for, timed_out.signal) == ("go", None)
    signalled = _context({"name": "go", "ended": "signal", "payload": {"a": 1}, "sent_at": "T"})
    assert signalled.waited_for == "go" and signalled.signal is not None
    assert (signalled.signal.name, signalled.signal.payload, signalled.signal.sent_at) == (
        "go",
        {"a": 1},
        "T",
    )
    assert str(WaitFor("go", "1d", key="k")) == "wait for signal 'go' (key 'k'), at most '1d'"
