"""Unit tier: the in-flight job table with a fake clock and fake children: the job<->child
link, what children report, every limit, drains, and jobs no child can take."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest
from fakes import FakeChild, FakeClock, FakeSupervisor, claimed_job

from pgworkerd.config import HandlerConfig, WorkerConfig
from pgworkerd.daemon.jobtable import START_TIMEOUT, JobTable
from pgworkerd.daemon.outcomes import InFlight, Outcome, fence_margin
from pgworkerd.daemon.states import OutcomeKind, StopReason
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.worker import protocol

HANDLER = HandlerConfig("h", "jobhandlers:work", timeout=30.0, heartbeat_timeout=5.0)
LEASE = 60.0


class Table:
    def __init__(self, idle: int = 1, *, startable: bool = True, kill_grace: float = 10.0) -> None:
        self.clock = FakeClock()
        self.supervisor = FakeSupervisor(idle, startable=startable)
        self.outcomes: list[Outcome] = []
        self.table = JobTable(
            WorkerConfig(slots=4, kill_grace=kill_grace),
            self.supervisor,
            NullMetrics(),
            self.outcomes.append,
            clock=self.clock,
        )

    def add(self, handler: HandlerConfig = HANDLER, **kw: Any) -> InFlight:
        job = claimed_job(handler.name, **kw)
        self.table.add(job, handler, LEASE, self.clock())
        return self.table.jobs[job.id]

    def start(self, handler: HandlerConfig = HANDLER) -> tuple[InFlight, FakeChild]:
        job = self.add(handler)
        self.table.dispatch()
        child = self.table.child_of(job)
        assert child is not None
        self.table.on_message(child, protocol.Started(job.job.id))
        return job, child


def progress_of(job: InFlight) -> Any:
    """The progress the job's child reported last, decoded (it is kept encoded)."""
    assert job.progress is not None
    return json.loads(job.progress)


def test_dispatch_links_a_job_and_its_child_and_a_report_unlinks_them_once() -> None:
    t = Table(idle=1)
    job, child = t.start()
    assert child.job == job.job.id and isinstance(child.sent[0], protocol.Job)
    assert child.sent[0].deadline == job.deadline == t.clock() + LEASE - fence_margin(LEASE)
    t.table.on_message(child, protocol.Done(job.job.id, {"ok": True}))
    assert child.job is None and t.table.child_of(job) is None and len(t.table) == 0
    assert [o.kind for o in t.outcomes] == [OutcomeKind.COMPLETE]
    assert json.loads(t.outcomes[0].result) == {"ok": True}
    # A second report (or the child's exit after it) changes nothing.
    t.table.on_message(child, protocol.Failed(job.job.id, "late"))
    t.table.on_exit(child, 0)
    assert len(t.outcomes) == 1


def test_a_report_naming_another_job_is_ignored() -> None:
    t = Table()
    job, child = t.start()
    t.table.on_message(child, protocol.Done(job.job.id + 1000))
    assert len(t.table) == 1 and t.outcomes == []


def test_a_child_that_dies_fails_its_job_with_how_it_died() -> None:
    t = Table()
    _job, child = t.start()
    t.table.on_exit(child, 9)  # raw wait status: SIGKILL
    assert t.outcomes[0].kind is OutcomeKind.FAIL
    assert t.outcomes[0].error.startswith("child process killed by SIGKILL")


def test_no_idle_child_keeps_the_job_waiting() -> None:
    t = Table(idle=0)
    job = t.add()
    t.table.dispatch()
    assert t.table.waiting() == [job]


def test_a_job_that_cannot_be_encoded_is_buried_alone() -> None:
    t = Table(idle=2)
    bad = t.add(payload={"x": float("nan")})  # JSON has no NaN
    good = t.add()
    t.table.dispatch()
    assert [(o.job.id, o.kind) for o in t.outcomes] == [(bad.job.id, OutcomeKind.BURY)]
    assert "cannot be handed to a child" in t.outcomes[0].error
    assert t.table.child_of(good) is not None


def test_a_missed_lease_deadline_kills_the_child_at_once() -> None:
    t = Table()
    job, child = t.start()
    t.clock.advance(LEASE - fence_margin(LEASE))
    t.table.tick(t.clock())
    assert child.signals == [signal.SIGKILL] and job.stop_reason is StopReason.LEASE_LOST
    t.table.tick(t.clock.advance(1))  # not stopped twice
    assert child.signals == [signal.SIGKILL]
    assert t.table.next_deadline() is None  # nothing left to wait for but its exit


def test_a_timeout_sends_sigterm_then_sigkill_after_the_kill_grace() -> None:
    t = Table(kill_grace=10.0)
    job, child = t.start()
    t.table.on_message(child, protocol.Beat())  # keep the heartbeat limit away
    assert t.table.next_deadline() == t.clock() + 5.0  # the heartbeat limit comes first
    for _ in range(6):
        t.table.tick(t.clock.advance(4.9))
        t.table.on_message(child, protocol.Beat())
    assert child.signals == [] and job.stop_reason is None
    t.table.tick(t.clock.advance(0.6))  # 30 s after the start
    assert child.signals == [signal.SIGTERM] and job.stop_reason is StopReason.TIMEOUT
    assert t.table.next_deadline() == t.clock() + 10.0
    t.table.tick(t.clock.advance(9.9))
    assert child.signals == [signal.SIGTERM]
    t.table.tick(t.clock.advance(0.1))
    assert child.signals == [signal.SIGTERM, signal.SIGKILL]
    t.table.on_exit(child, 9)
    assert t.outcomes[0].error == "timed out after 30s"


def test_silence_past_the_heartbeat_timeout_is_stuck() -> None:
    t = Table()
    job, child = t.start()
    t.table.tick(t.clock.advance(4.9))
    assert job.stop_reason is None
    t.table.tick(t.clock.advance(0.1))
    assert job.stop_reason is StopReason.STUCK and child.signals == [signal.SIGTERM]


def test_progress_is_kept_encoded_and_a_value_jsonb_refuses_is_dropped() -> None:
    t = Table()
    job, child = t.start()
    t.table.on_message(child, protocol.Beat(progress={"done": 3}))
    assert job.unsaved and progress_of(job) == {"done": 3}
    t.table.on_message(child, protocol.Beat(progress={"bad": "\x00"}))
    assert progress_of(job) == {"done": 3}  # the last storable value stays


def test_a_drain_hands_back_unstarted_jobs_and_asks_running_ones_to_stop() -> None:
    t = Table(idle=1)
    running, child = t.start()
    waiting = t.add()
    t.table.drain()
    assert [(o.job.id, o.kind) for o in t.outcomes] == [(waiting.job.id, OutcomeKind.RELEASE)]
    assert isinstance(child.sent[-1], protocol.Shutdown)
    t.table.on_message(child, protocol.Interrupted(running.job.id, "stopping on request"))
    assert t.outcomes[-1].kind is OutcomeKind.RELEASE


def test_a_cancel_tells_the_handler_then_stops_it() -> None:
    t = Table()
    job, child = t.start()
    t.table.cancel(job)
    assert isinstance(child.sent[-1], protocol.Cancel) and child.signals == [signal.SIGTERM]
    t.table.on_exit(child, 15)
    assert (t.outcomes[0].kind, t.outcomes[0].error) == (
        OutcomeKind.CANCEL,
        "cancelled while running",
    )


@pytest.mark.parametrize("startable", [True, False])
def test_a_job_no_child_can_take_is_handed_back_after_the_start_timeout(startable: bool) -> None:
    t = Table(idle=0, startable=startable)
    job = t.add()
    can_start = t.supervisor.can_start()
    assert t.table.next_deadline(can_start) == (
        job.deadline if startable else job.claimed_at + START_TIMEOUT
    )
    t.table.tick(t.clock.advance(START_TIMEOUT - 0.1), can_start=can_start)
    assert t.outcomes == []
    t.table.tick(t.clock.advance(0.1), can_start=can_start)
    # While children can be started the job waits for one (until its lease says so).
    assert [o.kind for o in t.outcomes] == ([] if startable else [OutcomeKind.RELEASE])


def test_a_job_stopped_for_a_timeout_that_then_misses_its_lease_is_killed_once() -> None:
    # The kill grace outlasts the lease's deadline (no renewals: the database is away).
    t = Table(kill_grace=60.0)
    job, child = t.start()
    t.table.tick(t.clock.advance(30.0))
    assert job.stop_reason is StopReason.TIMEOUT and child.signals == [signal.SIGTERM]
    for _ in range(5):
        t.table.tick(t.clock.advance(6.0))
    assert child.signals == [signal.SIGTERM, signal.SIGKILL]  # killed once, not per tick
    assert job.fenced and job.stop_reason is StopReason.TIMEOUT  # the reason it reports
    deadline = t.table.next_deadline()
    assert deadline is None or deadline > t.clock()


def test_a_late_beat_about_an_ended_job_is_not_pinned_on_the_next() -> None:
    t = Table(idle=1)
    first, child = t.start()
    t.table.on_message(child, protocol.Done(first.job.id))
    child.exiting = False  # a child that runs several jobs (max_jobs_per_child > 1)
    second = t.add()
    t.table.dispatch()
    assert t.table.child_of(second) is child
    t.table.on_message(child, protocol.Beat(first.job.id, progress={"of": "first"}))
    assert (second.progress, second.unsaved) == (None, False)
    t.table.on_message(child, protocol.Beat(second.job.id, progress={"of": "second"}))
    assert progress_of(second) == {"of": "second"}


# -- hand-back (drain --hand-back) ---------------------------------------------------------

QUIET = HandlerConfig("h", "jobhandlers:work")  # no timeout, no heartbeat limit


def test_a_hand_back_asks_that_job_to_stop_then_stops_it_at_the_grace() -> None:
    t = Table(idle=2, kill_grace=10.0)
    job, child = t.start(QUIET)
    other, other_child = t.start(QUIET)
    t.table.hand_back(job, 5.0)
    assert child.sent[-1] == protocol.Shutdown(job.job.id)  # only this job is asked
    assert not any(isinstance(m, protocol.Shutdown) for m in other_child.sent)
    assert t.table.next_deadline() == t.clock() + 5.0
    t.table.tick(t.clock.advance(4.9))
    assert child.signals == [] and job.stop_reason is None
    t.table.tick(t.clock.advance(0.1))
    assert child.signals == [signal.SIGTERM] and job.stop_reason is StopReason.HAND_BACK
    t.table.tick(t.clock.advance(10.0))  # the handler ignores SIGTERM too: its tree is killed
    assert child.signals == [signal.SIGTERM, signal.SIGKILL]
    t.table.on_exit(child, 9)
    assert [o.kind for o in t.outcomes] == [OutcomeKind.RELEASE]
    assert other.stop_reason is None and len(t.table) == 1


def test_a_handler_that_stops_itself_within_the_grace_is_released_at_once() -> None:
    t = Table()
    job, child = t.start(QUIET)
    t.table.on_message(child, protocol.Beat(checkpoint={"step": 7}))
    t.table.hand_back(job, 30.0)
    t.table.on_message(child, protocol.Interrupted(job.job.id, "asked to stop"))
    [outcome] = t.outcomes
    assert outcome.kind is OutcomeKind.RELEASE and json.loads(outcome.checkpoint) == {"step": 7}
    assert child.signals == []


def test_a_result_returned_at_the_grace_wins_over_the_hand_back() -> None:
    t = Table()
    job, child = t.start(QUIET)
    t.table.hand_back(job, 1.0)
    t.table.tick(t.clock.advance(1.0))  # stopped: SIGTERM on its way
    t.table.on_message(child, protocol.Done(job.job.id, {"ok": 1}))  # it had returned first
    assert [o.kind for o in t.outcomes] == [OutcomeKind.COMPLETE]


def test_a_second_hand_back_never_gives_more_time_and_zero_is_at_once() -> None:
    t = Table(idle=2)
    job, child = t.start(QUIET)
    t.table.hand_back(job, 10.0)
    t.table.hand_back(job, 60.0)  # longer: the earlier time holds
    assert job.hand_back_at == t.clock() + 10.0
    assert [m for m in child.sent if isinstance(m, protocol.Shutdown)] == [
        protocol.Shutdown(job.job.id)
    ]  # asked once
    t.table.hand_back(job, 0.0)  # a grace of 0: now
    assert child.signals == [signal.SIGTERM]
    waiting = t.add(QUIET)  # claimed, never started: back at once
    t.table.hand_back(waiting, 30.0)
    assert [(o.job.id, o.kind) for o in t.outcomes] == [(waiting.job.id, OutcomeKind.RELEASE)]


def test_a_resume_lifts_the_grace_and_a_later_self_stop_is_still_a_release() -> None:
    t = Table()
    job, child = t.start(QUIET)
    t.table.hand_back(job, 5.0)
    t.table.lift_hand_back()
    for _ in range(3):  # 12 s, past the grace it had
        t.table.tick(t.clock.advance(4.0))
        t.table.on_message(child, protocol.Beat())
    assert job.stop_reason is None and child.signals == []
    t.table.on_message(child, protocol.Interrupted(job.job.id, "saw stop_requested"))
    assert [o.kind for o in t.outcomes] == [OutcomeKind.RELEASE]


def test_jobs_handed_to_a_child_that_cannot_be_written_to_wait_for_another() -> None:
    t = Table(idle=1)
    t.supervisor.unreachable = list(t.supervisor.children)
    job = t.add()
    t.table.dispatch()
    assert t.table.child_of(job) is None and t.table.waiting() == [job]
