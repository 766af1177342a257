"""Unit tier: decide(), the outcome of a finished attempt, one test per branch."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakes import claimed_job

from pgworkerd.config import HandlerConfig, WorkerConfig
from pgworkerd.daemon.outcomes import InFlight, decide
from pgworkerd.daemon.states import OutcomeKind, StopReason
from pgworkerd.queue.lease import encode_json
from pgworkerd.worker.protocol import Done, Failed, Interrupted, Report

WORKER = WorkerConfig(backoff=10.0, backoff_max=3600.0)
HANDLER = HandlerConfig("h", "jobhandlers:work", timeout=30.0, heartbeat_timeout=5.0)


def in_flight(handler: HandlerConfig = HANDLER, **kw: object) -> InFlight:
    job = InFlight(claimed_job(), handler, lease=60.0, claimed_at=0.0, deadline=54.0)
    for key, value in kw.items():
        setattr(job, key, value)
    return job


def outcome(
    report: Report | None,
    *,
    reason: StopReason | None = None,
    draining: bool = False,
    exit_description: str = "",
    **kw: Any,
) -> tuple[OutcomeKind, str]:
    o = decide(in_flight(stop_reason=reason, **kw), report, exit_description, draining, WORKER)
    return o.kind, o.error


def test_a_reported_result_completes_whatever_stopped_it() -> None:
    job = in_flight(stop_reason=StopReason.TIMEOUT)
    o = decide(job, Done(job.job.id, encode_json({"n": 1})), "", True, WORKER)
    assert (o.kind, o.error, json.loads(o.result)) == (OutcomeKind.COMPLETE, "", {"n": 1})


@pytest.mark.parametrize("reason", [StopReason.DRAIN, StopReason.TERMINATE, StopReason.NO_CHILD])
def test_stopped_by_the_daemon_to_leave_is_handed_back(reason: StopReason) -> None:
    assert outcome(None, reason=reason, exit_description="killed by SIGTERM") == (
        OutcomeKind.RELEASE,
        "",
    )


def test_a_handler_that_stops_itself_during_a_drain_is_handed_back() -> None:
    assert outcome(Interrupted(1, "stopping on request"), draining=True)[0] is OutcomeKind.RELEASE


def test_cancelled_by_the_daemon_or_by_itself_after_a_cancel_request() -> None:
    assert outcome(None, reason=StopReason.CANCEL) == (
        OutcomeKind.CANCEL,
        "cancelled while running",
    )
    assert outcome(Interrupted(1, "x"), cancel_seen=True) == (
        OutcomeKind.CANCEL,
        "cancelled while running",
    )


def test_a_lost_lease_is_a_failed_attempt() -> None:
    assert outcome(None, reason=StopReason.LEASE_LOST) == (
        OutcomeKind.FAIL,
        "stopped: the lease could not be renewed in time",
    )


def test_a_timeout_says_how_long_and_keeps_the_handlers_traceback() -> None:
    assert outcome(None, reason=StopReason.TIMEOUT) == (OutcomeKind.FAIL, "timed out after 30s")
    kind, error = outcome(
        Interrupted(1, "stopped by the daemon (SIGTERM)", "Traceback: here"),
        reason=StopReason.TIMEOUT,
    )
    assert (kind, error) == (OutcomeKind.FAIL, "timed out after 30s\nTraceback: here")


def test_no_heartbeat_is_stuck() -> None:
    assert outcome(None, reason=StopReason.STUCK) == (
        OutcomeKind.FAIL,
        "no heartbeat for 5s: stuck",
    )


def test_the_handlers_exception_is_the_error_with_its_traceback() -> None:
    assert outcome(Failed(1, "ValueError: bad", "Traceback ...")) == (
        OutcomeKind.FAIL,
        "ValueError: bad\nTraceback ...",
    )
    assert outcome(Failed(1, "ValueError: bad")) == (OutcomeKind.FAIL, "ValueError: bad")


def test_interrupted_by_someone_else_is_a_failure_that_says_so() -> None:
    assert outcome(Interrupted(1, "stopped by the daemon (SIGTERM)")) == (
        OutcomeKind.FAIL,
        "interrupted from outside the daemon: stopped by the daemon (SIGTERM)",
    )


def test_a_child_that_died_without_a_report() -> None:
    assert outcome(None, exit_description="killed by SIGKILL") == (
        OutcomeKind.FAIL,
        "child process killed by SIGKILL",
    )
    assert outcome(None) == (OutcomeKind.FAIL, "child process vanished")


def test_backoff_comes_from_the_handler_or_else_the_worker() -> None:
    own = HandlerConfig("h", "m:f", backoff=2.0)
    assert decide(in_flight(own), None, "", False, WORKER).backoff == (2.0, 3600.0)
    assert decide(in_flight(), None, "", False, WORKER).backoff == (10.0, 3600.0)


def test_only_an_unsaved_checkpoint_goes_with_the_outcome() -> None:
    saved = in_flight(checkpoint=encode_json({"step": 1}), unsaved=False)
    unsaved = in_flight(checkpoint=encode_json({"step": 2}), unsaved=True)
    assert decide(saved, None, "", False, WORKER).checkpoint is None
    assert json.loads(decide(unsaved, None, "", False, WORKER).checkpoint) == {"step": 2}


def test_error_text_is_made_storable() -> None:
    # A lone surrogate (a file name that is not UTF-8) cannot go into a text column.
    kind, error = outcome(Failed(1, "OSError: \udcff.txt"))
    assert kind is OutcomeKind.FAIL and "\udcff" not in error and ".txt" in error


# -- outcomes the handler chose (issue 11) ------------------------------------------------

CHOOSER = HandlerConfig("h", "m:f", no_retry=("ValueError", "myapp.errors.PermanentError"))


def chosen(report: Failed, handler: HandlerConfig = CHOOSER) -> tuple[OutcomeKind, str, object]:
    o = decide(in_flight(handler), report, "", False, WORKER)
    return o.kind, o.error, o.snooze


def test_a_snooze_is_a_snooze_of_its_length() -> None:
    assert chosen(Failed(1, "Snooze: run again in 5s", "tb", snooze=5)) == (
        OutcomeKind.SNOOZE,
        "Snooze: run again in 5s",
        5.0,
    )


@pytest.mark.parametrize("seconds", [-1, 30 * 86400 + 1, float("inf"), float("nan")])
def test_a_snooze_of_a_bad_length_from_the_child_is_a_failed_attempt(seconds: float) -> None:
    kind, error, snooze = chosen(Failed(1, "Snooze", "tb", snooze=seconds))
    assert (kind, snooze) == (OutcomeKind.FAIL, None)
    assert error.startswith("Snooze seconds must be from 0 to 2592000")


def test_give_up_is_dead_at_once_with_the_reason() -> None:
    assert chosen(Failed(1, "GiveUp: gone", "tb", give_up="gone")) == (
        OutcomeKind.GIVE_UP,
        "gone",
        None,
    )


def test_no_retry_matches_along_the_mro_and_only_there() -> None:
    kind, error, _ = chosen(
        Failed(
            1,
            "CustomerGone: x",
            "tb",
            exception_types=["myapp.errors.CustomerGone", "myapp.errors.PermanentError"],
        )
    )
    assert kind is OutcomeKind.GIVE_UP
    assert "not retried: myapp.errors.PermanentError is in no_retry of handler h" in error
    assert chosen(Failed(1, "KeyError: x", "tb", exception_types=["KeyError"]))[0] is (
        OutcomeKind.FAIL
    )
    # a handler without no_retry retries everything
    assert chosen(Failed(1, "ValueError: x", exception_types=["ValueError"]), HANDLER)[0] is (
        OutcomeKind.FAIL
    )


def test_the_daemon_stopping_the_job_wins_over_a_chosen_outcome() -> None:
    o = decide(
        in_flight(CHOOSER, stop_reason=StopReason.TIMEOUT),
        Failed(1, "GiveUp", give_up="gone"),
        "",
        False,
        WORKER,
    )
    assert o.kind is OutcomeKind.FAIL and o.error.startswith("timed out")
