"""Unit tier: the lease keeper and the outcome writer with a fake clock and fake
statements: renewal deadlines, lost leases, cancels read back, a refused progress save,
batching, retries and giving up."""

from __future__ import annotations

import json
import signal

from fakes import FakeClock, FakeStatements, FakeSupervisor, claimed_job

from pgworkerd.config import HandlerConfig, WorkerConfig
from pgworkerd.daemon.jobtable import JobTable
from pgworkerd.daemon.leases import PROGRESS_SAVE_INTERVAL, LeaseKeeper
from pgworkerd.daemon.outcomes import (
    COMPLETION_LINGER,
    MAX_OUTCOME_WRITES,
    Outcome,
    OutcomeWriter,
    fence_margin,
)
from pgworkerd.daemon.states import OutcomeKind, StopReason
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.queue.lease import RenewOutcome
from pgworkerd.worker import protocol

HANDLER = HandlerConfig("h", "jobhandlers:work")
LEASE = 60.0


class Setup:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.statements = FakeStatements()
        self.supervisor = FakeSupervisor(2)
        self.outcomes: list[Outcome] = []
        self.table = JobTable(
            WorkerConfig(),
            self.supervisor,
            NullMetrics(),
            self.outcomes.append,
            clock=self.clock,
        )
        self.leases = LeaseKeeper(
            self.statements,
            self.table,
            NullMetrics(),
            renew_interval=10.0,
            clock=self.clock,
        )

    def start(self):
        job = claimed_job("h")
        self.table.add(job, HANDLER, LEASE, self.clock())
        self.table.dispatch()
        held = self.table.jobs[job.id]
        child = self.table.child_of(held)
        self.table.on_message(child, protocol.Started(job.id))
        return held, child


def test_renewals_come_every_renew_interval_and_move_the_deadline() -> None:
    s = Setup()
    job, child = s.start()
    s.leases.tick(s.clock())
    assert len(s.statements.renewals) == 1 and s.leases.next_deadline() == s.clock() + 10.0
    s.leases.tick(s.clock.advance(9.9))
    assert len(s.statements.renewals) == 1
    now = s.clock.advance(0.1)
    s.leases.tick(now)
    assert len(s.statements.renewals) == 2
    assert job.deadline == now + LEASE - fence_margin(LEASE)
    assert child.sent[-1] == protocol.LeaseExtended(job.deadline, job.job.id)


def test_a_lease_the_database_refuses_kills_the_job() -> None:
    s = Setup()
    job, child = s.start()
    s.statements.renew_answer[job.job.id] = RenewOutcome(job.job.id, False, False)
    s.leases.tick(s.clock())
    assert job.stop_reason is StopReason.LEASE_LOST and child.signals == [signal.SIGKILL]


def test_a_cancel_read_back_with_the_renewal_stops_the_job() -> None:
    s = Setup()
    job, child = s.start()
    s.statements.renew_answer[job.job.id] = RenewOutcome(job.job.id, True, True)
    s.leases.tick(s.clock())
    assert job.stop_reason is StopReason.CANCEL and isinstance(child.sent[-1], protocol.Cancel)


def test_progress_is_saved_at_most_every_second_between_renewals() -> None:
    s = Setup()
    job, child = s.start()
    s.leases.tick(s.clock())  # the first renewal
    s.table.on_message(child, protocol.Beat(progress={"n": 1}))
    assert s.leases.next_deadline() == s.clock() + PROGRESS_SAVE_INTERVAL
    s.leases.tick(s.clock.advance(PROGRESS_SAVE_INTERVAL))
    saved = s.statements.renewals[-1]
    assert len(s.statements.renewals) == 2 and json.loads(saved[0].progress) == {"n": 1}
    assert not job.unsaved


def test_a_refused_save_renews_the_leases_alone_and_keeps_the_values_for_later() -> None:
    s = Setup()
    job, child = s.start()
    s.table.on_message(child, protocol.Beat(progress={"n": 1}))
    s.statements.renew_fails = 1
    now = s.clock()
    s.leases.tick(now)
    with_values, bare = s.statements.renewals
    assert with_values[0].progress is not None and bare[0].progress is None
    assert job.unsaved and job.deadline == now + LEASE - fence_margin(LEASE)


def test_a_job_settled_while_its_renewal_ran_is_left_alone() -> None:
    s = Setup()
    job, child = s.start()
    # Its outcome arrives while the renewal statement runs (the lease is gone with it).
    s.statements.during_renew = lambda leases: s.table.on_message(child, protocol.Done(job.job.id))
    s.statements.renew_answer[job.job.id] = RenewOutcome(job.job.id, False, False)
    s.leases.tick(s.clock())
    assert [o.kind for o in s.outcomes] == [OutcomeKind.COMPLETE]
    assert child.signals == [] and not job.fenced  # not killed for a lease it gave up


# -- the outcome writer -----------------------------------------------------------------


def writer(statements: FakeStatements, clock: FakeClock, retries: list[float]) -> OutcomeWriter:
    return OutcomeWriter(
        statements.write_outcomes,
        lambda: statements.ok,
        retries.append,
        clock=clock,
    )


def outcome(kind: OutcomeKind, retry_in: float | None = None) -> Outcome:
    o = Outcome(claimed_job("h"), HANDLER, kind, 1.0)
    o.retry_in = retry_in
    return o


def test_completions_go_in_one_write_the_rest_one_by_one() -> None:
    statements, clock = FakeStatements(), FakeClock()
    retries: list[float] = []
    w = writer(statements, clock, retries)
    for kind in (OutcomeKind.COMPLETE, OutcomeKind.FAIL, OutcomeKind.COMPLETE):
        w.add(outcome(kind))
    w.tick(clock())
    assert [[o.kind for o in batch] for batch in statements.written] == [
        [OutcomeKind.COMPLETE, OutcomeKind.COMPLETE],
        [OutcomeKind.FAIL],
    ]
    assert not w.pending


def test_outcomes_wait_while_the_database_is_away() -> None:
    statements, clock = FakeStatements(), FakeClock()
    retries: list[float] = []
    w = writer(statements, clock, retries)
    statements.ok = False
    w.add(outcome(OutcomeKind.COMPLETE))
    w.tick(clock())
    assert len(w.pending) == 1 and statements.written == []
    statements.ok = True
    w.tick(clock())
    assert not w.pending


def test_a_write_that_keeps_failing_is_given_up_after_three_tries_one_at_a_time() -> None:
    statements, clock = FakeStatements(), FakeClock()
    retries: list[float] = []
    w = writer(statements, clock, retries)
    first, second = outcome(OutcomeKind.COMPLETE), outcome(OutcomeKind.COMPLETE)
    w.add(first)
    w.add(second)
    statements.write_fails = MAX_OUTCOME_WRITES
    w.tick(clock())  # the batch fails: from now on one at a time
    w.tick(clock())  # the first fails again
    assert list(w.pending) == [first, second] and statements.written == []
    w.tick(clock())  # its third failure: given up; the second then goes alone
    assert not w.pending and statements.written == [[second]]


def test_a_failed_jobs_retry_wakes_the_claimer_when_due() -> None:
    statements, clock = FakeStatements(), FakeClock()
    retries: list[float] = []
    w = writer(statements, clock, retries)
    statements.retry_in = 12.5
    w.add(outcome(OutcomeKind.COMPLETE))
    w.add(outcome(OutcomeKind.FAIL))
    w.tick(clock())
    assert retries == [clock() + 12.5]  # once: a completion schedules nothing


def test_write_then_claim_writes_other_outcomes_before_the_claim_and_carries_completions() -> None:
    statements, clock = FakeStatements(), FakeClock()
    retries: list[float] = []
    w = writer(statements, clock, retries)
    done, failed = outcome(OutcomeKind.COMPLETE), outcome(OutcomeKind.FAIL)
    released = outcome(OutcomeKind.RELEASE)
    for o in (done, failed, released):
        w.add(o)
    seen: list[object] = []

    def claim(now: float) -> None:
        # by the time the claim runs, every outcome but the completion is written
        seen.append([list(batch) for batch in statements.written])
        carried = w.completions()
        seen.append(carried)
        w.carried(carried)  # the claim wrote it in its own transaction

    w.write_then_claim(clock(), claim)
    assert seen == [[[failed], [released]], [done]]
    assert not w.pending and statements.written == [[failed], [released]]


def test_write_then_claim_writes_the_completions_a_claim_did_not_carry_after_it() -> None:
    statements, clock = FakeStatements(), FakeClock()
    retries: list[float] = []
    w = writer(statements, clock, retries)
    done = outcome(OutcomeKind.COMPLETE)
    w.add(done)
    claims: list[float] = []
    w.write_then_claim(clock(), claims.append)  # no claim was due: it carried nothing
    assert claims == [clock()] and statements.written == [[done]] and not w.pending


def lingering_writer(
    statements: FakeStatements, clock: FakeClock, coming: list[bool]
) -> OutcomeWriter:
    """A writer whose completions wait for a claim while coming[0] says one is coming."""
    return OutcomeWriter(
        statements.write_outcomes,
        lambda: statements.ok,
        lambda when: None,
        clock=clock,
        hold_completions=lambda: coming[0],
    )


def test_completions_wait_for_a_claim_that_is_coming_at_most_the_linger() -> None:
    statements, clock = FakeStatements(), FakeClock()
    coming = [True]
    w = lingering_writer(statements, clock, coming)
    first, second = outcome(OutcomeKind.COMPLETE), outcome(OutcomeKind.COMPLETE)
    w.add(first)
    no_claim: list[float] = []
    w.write_then_claim(clock(), no_claim.append)  # not due yet: they wait for it
    assert statements.written == [] and w.next_deadline() == clock() + COMPLETION_LINGER
    clock.advance(COMPLETION_LINGER / 2)
    w.add(second)
    w.write_then_claim(clock(), no_claim.append)
    assert statements.written == []  # the linger counts from the oldest
    clock.advance(COMPLETION_LINGER / 2)
    w.write_then_claim(clock(), no_claim.append)  # the linger is over: written alone
    assert statements.written == [[first, second]] and not w.pending
    assert w.next_deadline() is None


def test_completions_are_written_at_once_when_no_claim_is_coming_or_other_outcomes_wait() -> None:
    statements, clock = FakeStatements(), FakeClock()
    coming = [False]
    w = lingering_writer(statements, clock, coming)
    done = outcome(OutcomeKind.COMPLETE)
    w.add(done)
    w.tick(clock())
    assert statements.written == [[done]]
    coming[0] = True
    done, failed = outcome(OutcomeKind.COMPLETE), outcome(OutcomeKind.FAIL)
    w.add(done)
    w.add(failed)
    w.tick(clock())  # a failure is never held, nor the completions beside it
    assert statements.written[1:] == [[done], [failed]] and not w.pending


def test_no_renewal_deadline_while_the_database_is_away() -> None:
    # A past deadline that cannot be served would make the loop spin through an outage.
    s = Setup()
    s.start()
    s.statements.ok = False
    s.leases.tick(s.clock.advance(30.0))
    assert s.leases.next_deadline() is None
    s.statements.ok = True
    assert s.leases.next_deadline() == 0.0  # renew at once when it is back
