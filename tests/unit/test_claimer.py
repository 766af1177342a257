"""Unit tier: the claimer with a fake clock, statements and supervisor: the per-handler
capacity arithmetic, when it claims (and when not), NOTIFY coalescing, its deadlines."""

from __future__ import annotations

from datetime import UTC, datetime

from fakes import ClaimerRig, claimed_job, config

from pgworkerd.config import Config
from pgworkerd.daemon.claimer import NOTIFY_CLAIM_INTERVAL
from pgworkerd.daemon.outcomes import Outcome, OutcomeWriter
from pgworkerd.daemon.states import OutcomeKind
from pgworkerd.queue.lease import RefusedJob
from pgworkerd.queue.registry import HandBack
from pgworkerd.worker import protocol

CONFIG = """
[worker]
slots = 4
poll_interval = "5s"
warm_children = 1
[handlers.solo]
target = "jobhandlers:work"
slots = 2
lease = "30s"
"""


class Setup(ClaimerRig):
    def __init__(self, *, startable: bool = True, idle: int = 4) -> None:
        super().__init__(CONFIG, idle=idle, startable=startable)


def test_capacity_is_the_free_slots_capped_by_each_handlers_own() -> None:
    s = Setup()
    s.statements.claims = [([claimed_job("solo")], [])]
    s.tick()
    queues, capacity, limit = s.statements.claim_calls[0]
    assert limit == 4 and queues == ["default"]
    assert (capacity["h"].free, capacity["solo"].free) == (4, 2)
    assert (capacity["h"].lease_seconds, capacity["solo"].lease_seconds) == (60.0, 30.0)
    s.claimer.request()
    s.tick()
    _, capacity, limit = s.statements.claim_calls[1]
    assert limit == 3 and (capacity["h"].free, capacity["solo"].free) == (3, 1)


def test_claimed_jobs_go_to_idle_children_at_once() -> None:
    s = Setup(idle=1)
    s.statements.claims = [([claimed_job("h"), claimed_job("h")], [])]
    s.tick()
    assert len(s.table) == 2 and len(s.table.waiting()) == 1
    assert s.supervisor.spawned >= 1  # the waiting one gets a child started for it


def test_the_children_a_claim_needs_are_asked_for_in_one_request() -> None:
    """Three claimed jobs and no idle child: one spawn request for the three children
    and the warm one for the free slot (one message to the fork server, one middle
    process), not four."""
    s = Setup(idle=0)
    s.statements.claims = [([claimed_job("h") for _ in range(3)], [])]
    s.tick()
    assert len(s.table.waiting()) == 3
    assert s.supervisor.spawn_requests == [4]


def test_no_claim_while_no_child_can_be_started_and_one_when_it_can() -> None:
    s = Setup(startable=False, idle=0)
    s.tick(10.0)
    assert s.statements.claim_calls == [] and s.claimer.next_deadline() is None
    s.supervisor.startable = True
    s.tick()
    assert len(s.statements.claim_calls) == 1


def test_no_claim_while_not_accepting_and_one_as_soon_as_it_is_again() -> None:
    s = Setup()
    s.claimer.set_accepting(False)
    s.tick(10.0)
    assert s.statements.claim_calls == []
    assert all(c.exiting for c in s.supervisor.children)  # idle children retired
    s.claimer.set_accepting(True)
    s.tick()
    assert len(s.statements.claim_calls) == 1


def test_the_poll_interval_paces_claims_and_a_request_comes_first() -> None:
    s = Setup()
    s.tick()
    assert s.claimer.next_deadline() == s.clock() + 5.0
    s.tick(4.9)
    assert len(s.statements.claim_calls) == 1
    s.tick(0.1)
    assert len(s.statements.claim_calls) == 2
    s.claimer.request()
    s.tick(0.1)
    assert len(s.statements.claim_calls) == 3


def test_a_full_claim_means_a_backlog_so_a_freed_slot_claims_again() -> None:
    s = Setup()
    s.statements.claims = [([claimed_job("h") for _ in range(4)], [])]
    s.tick()
    assert s.claimer.backlog
    s.claimer.slot_freed()
    s.tick()  # no free slot: nothing to claim yet
    assert len(s.statements.claim_calls) == 1
    job = next(iter(s.table))
    child = s.table.child_of(job)
    assert child is not None
    s.table.on_message(child, protocol.Done(job.job.id))
    s.claimer.slot_freed()  # what the daemon does when a job leaves the table
    s.tick()
    assert len(s.statements.claim_calls) == 2


def test_with_a_fleet_wide_limit_a_freed_slot_claims_again_after_a_short_claim() -> None:
    # the claim came back short, maybe only because of the limit: the slot that frees
    # here may be the one the held-back jobs wait for
    s = Setup()
    s.claimer.configure(config(CONFIG + "max_running = 3\n"))
    s.tick()
    assert not s.claimer.backlog and len(s.statements.claim_calls) == 1
    assert s.statements.claim_calls[0][1]["solo"].max_running == 3
    s.claimer.slot_freed()
    s.tick()
    assert len(s.statements.claim_calls) == 2
    # without a limit, a short claim means nothing waits: no claim before the poll
    plain = Setup()
    plain.tick()
    plain.claimer.slot_freed()
    plain.tick()
    assert len(plain.statements.claim_calls) == 1


def test_a_partial_claim_waits_for_the_next_scheduled_job() -> None:
    s = Setup()
    s.statements.next_run = 2.5
    s.tick()
    assert not s.claimer.backlog and s.claimer.next_deadline() == s.clock() + 2.5
    s.tick(2.5)
    assert len(s.statements.claim_calls) == 2


def test_notifications_are_coalesced() -> None:
    s = Setup()
    s.tick()
    s.claimer.notified(s.clock())  # an idle daemon claims at once
    deadline = s.claimer.next_deadline()
    assert deadline is not None and deadline <= s.clock()
    s.tick()
    assert len(s.statements.claim_calls) == 2
    for _ in range(100):  # a flood: one claim per NOTIFY_CLAIM_INTERVAL
        s.claimer.notified(s.clock())
    assert s.claimer.next_deadline() == s.clock() + NOTIFY_CLAIM_INTERVAL
    s.tick(NOTIFY_CLAIM_INTERVAL / 2)
    assert len(s.statements.claim_calls) == 2
    s.tick(NOTIFY_CLAIM_INTERVAL / 2)
    assert len(s.statements.claim_calls) == 3
    s.tick(0.001)
    assert len(s.statements.claim_calls) == 3


def test_a_retry_due_wakes_the_claimer_then() -> None:
    s = Setup()
    s.tick()
    s.claimer.request_at(s.clock() + 1.0)
    assert s.claimer.next_deadline() == s.clock() + 1.0


def test_rows_that_cannot_be_loaded_are_buried_and_the_rest_run() -> None:
    s = Setup()
    good = claimed_job("h")
    s.statements.claims = [([good], [RefusedJob(99, 1, "h", 1, "payload cannot be loaded")])]
    s.tick()
    assert [(o.job.id, o.kind) for o in s.outcomes] == [(99, OutcomeKind.BURY)]
    assert s.outcomes[0].error == "cannot run: payload cannot be loaded"
    assert s.table.child_of(s.table.jobs[good.id]) is not None


def test_a_failed_claim_waits_for_the_poll_interval() -> None:
    s = Setup()
    s.statements.claims = [None]
    s.tick()
    s.tick(0.5)
    assert len(s.statements.claim_calls) == 1


def test_a_failed_claim_leaves_no_past_deadline_behind() -> None:
    s = Setup()
    s.statements.next_run = 1.0
    s.tick()  # a partial claim: the next scheduled job is due in 1 s
    s.statements.claims = [None]  # that claim fails (a statement timeout)
    s.tick(1.0)
    assert len(s.statements.claim_calls) == 2
    assert s.claimer.next_deadline() == s.clock() + 5.0  # the poll, not a past time


def test_no_handlers_no_claim_and_no_deadline() -> None:
    # Until a reload adds handlers there is nothing to claim for; a poll deadline that
    # never moves would make the loop spin.
    s = Setup()
    s.claimer.configure(Config(worker=s.config.worker, handlers={}))
    s.tick(10.0)
    assert s.statements.claim_calls == [] and s.claimer.next_deadline() is None


def test_a_job_claimed_again_while_its_attempt_runs_here_is_not_started_twice() -> None:
    # After lost WAL (async failover) the same daemon may claim a job it still runs.
    s = Setup()
    job = claimed_job("h")
    s.statements.claims = [
        ([job], []),
        ([claimed_job("h", id=job.id, token=2), claimed_job("h")], []),
    ]
    s.tick()
    assert s.table.ids() == [job.id]
    first = s.table.jobs[job.id]
    s.claimer.request()
    s.tick()
    assert len(s.table) == 2 and s.table.jobs[job.id] is first


def carrying_setup() -> tuple[Setup, OutcomeWriter, list[list[Outcome]]]:
    """A claimer whose claims carry the outcome writer's completions."""
    s = Setup()
    written: list[list[Outcome]] = []
    w = OutcomeWriter(
        s.statements.write_outcomes,
        lambda: s.statements.ok,
        lambda when: None,
        on_written=written.append,
    )
    s.claimer.writer = w
    return s, w, written


def finished(kind: OutcomeKind) -> Outcome:
    return Outcome(claimed_job("solo"), None, kind, 0.1)


def test_a_claim_carries_the_completions_waiting_and_nothing_else() -> None:
    s, w, written = carrying_setup()
    done, failed = finished(OutcomeKind.COMPLETE), finished(OutcomeKind.FAIL)
    w.add(done)
    w.add(failed)
    s.tick()
    assert s.statements.written == [[done]]  # with the claim, in its transaction
    assert written == [[done]] and list(w.pending) == [failed]  # the writer does the rest
    w.tick(s.clock())
    assert s.statements.written == [[done], [failed]] and not w.pending


def test_completions_of_a_failed_claim_stay_with_the_writer_and_the_claim_runs_again() -> None:
    s, w, written = carrying_setup()
    done = finished(OutcomeKind.COMPLETE)
    w.add(done)
    s.statements.claims = [None]  # the combined statement failed: neither happened
    s.tick()
    assert written == [] and list(w.pending) == [done]
    w.tick(s.clock())  # alone, as always
    assert s.statements.written == [[done]] and not w.pending
    s.tick()  # no poll interval to wait for: the failed claim is asked for again
    assert len(s.statements.claim_calls) == 2


def test_after_a_failed_write_no_completion_rides_along() -> None:
    s, w, _ = carrying_setup()
    done = finished(OutcomeKind.COMPLETE)
    done.failed_writes = 1
    w.add(done)
    s.tick()
    assert len(s.statements.claim_calls) == 1 and s.statements.written == []


def test_a_job_claimed_again_while_its_outcome_waits_to_be_written_is_not_started() -> None:
    # After lost WAL the database can give out the same lease token again: the failure of
    # the attempt that ended here, written after the new claim, would end the new lease
    # while the new child runs (seen in test_failover's asynchronous case).
    s, w, _ = carrying_setup()
    ended = finished(OutcomeKind.FAIL)
    w.add(ended)
    s.statements.claims = [([claimed_job("solo", id=ended.job.id), claimed_job("solo")], [])]
    s.tick()
    assert ended.job.id not in s.table.ids() and len(s.table) == 1


def test_failures_are_written_before_the_claim_and_completions_with_it() -> None:
    s, w, _ = carrying_setup()
    done, failed = finished(OutcomeKind.COMPLETE), finished(OutcomeKind.FAIL)
    w.add(done)
    w.add(failed)
    w.tick(s.clock(), completions_too=False)  # what the loop does first
    assert s.statements.written == [[failed]] and list(w.pending) == [done]
    s.tick()
    assert s.statements.written == [[failed], [done]] and not w.pending


def test_a_filtered_hand_back_leaves_its_jobs_out_of_the_claim() -> None:
    s = ClaimerRig(
        '[handlers.mailer]\ntarget = "jobhandlers:work"\nqueues = ["mail", "bulk"]\n'
        '[worker]\nqueues = ["default", "mail", "bulk"]\n'
    )
    at = datetime(2026, 11, 26, tzinfo=UTC)

    def claimed_with(hand_back: HandBack | None) -> dict[str, list[str] | None]:
        s.claimer.hold_back(hand_back)
        s.statements.claims = [([], [])]
        s.claimer.request()
        s.tick()
        _, capacity, _ = s.statements.claim_calls[-1]
        return {name: None if c.queues is None else list(c.queues) for name, c in capacity.items()}

    assert claimed_with(None) == {"h": None, "mailer": ["mail", "bulk"]}
    # a queue: every handler claims from the other queues only
    assert claimed_with(HandBack(at, queues=frozenset({"mail"}))) == {
        "h": ["default", "bulk"],
        "mailer": ["bulk"],
    }
    # a handler: that handler is not claimed for, the others are as before
    assert claimed_with(HandBack(at, handlers=frozenset({"mailer"}))) == {"h": None}
    # both: that handler's jobs on that queue only
    both = HandBack(at, queues=frozenset({"bulk"}), handlers=frozenset({"mailer"}))
    assert claimed_with(both) == {"h": None, "mailer": ["mail"]}
    # everything held back: no claim at all
    calls = len(s.statements.claim_calls)
    s.claimer.hold_back(HandBack(at, handlers=frozenset({"h", "mailer"})))
    s.claimer.request()
    s.tick()
    assert len(s.statements.claim_calls) == calls
    assert claimed_with(None) == {"h": None, "mailer": ["mail", "bulk"]}  # resumed


PREFETCH = """
[worker]
slots = 2
prefetch = 4
max_jobs_per_child = 100
poll_interval = "5s"
warm_children = 1
"""


def test_prefetch_claims_beyond_the_slots_and_hands_held_jobs_on_as_slots_free() -> None:
    """Issue 26 (item 5): [worker] prefetch = 4 with 2 slots: a claim takes 6 jobs, 2 go
    to children, 4 wait in the table with no child of their own (no more children than
    slots), and each freed slot takes a held job at once, with no claim in between; a
    claim comes once half of the prefetch is free again."""
    s = ClaimerRig(PREFETCH, idle=2)
    s.statements.claims = [([claimed_job("h") for _ in range(6)], [])]
    s.tick()
    _, capacity, limit = s.statements.claim_calls[0]
    assert limit == 6 and capacity["h"].free == 6
    assert len(s.table) == 6 and len(s.table.waiting()) == 4
    assert s.supervisor.spawned == 0  # the 2 idle children run 2; the rest wait for them
    for left in (3, 2):
        running = [j for j in s.table if s.table.child_of(j) is not None]
        child = s.table.child_of(running[0])
        assert child is not None
        s.table.on_message(child, protocol.Done(running[0].job.id))
        s.claimer.slot_freed()
        s.tick()
        assert len(s.table.waiting()) == left  # the freed child took a held job
        if left == 3:
            assert len(s.statements.claim_calls) == 1  # 1 free of 4: no claim yet
    assert len(s.statements.claim_calls) == 2  # 2 free of 4: half, so a claim
    assert s.statements.claim_calls[1][2] == 2


def test_a_claim_is_coming_only_with_prefetch_and_a_backlog() -> None:
    """What lets completions wait for the claim (OutcomeWriter.hold_completions)."""
    s = ClaimerRig(PREFETCH, idle=2)
    s.statements.claims = [([claimed_job("h") for _ in range(6)], [])]
    s.tick()
    assert s.claimer.backlog and s.claimer.claiming_soon()  # the claim filled every slot
    s.claimer.set_accepting(False)  # a drain: no claim comes
    assert not s.claimer.claiming_soon()
    s = ClaimerRig(PREFETCH, idle=2)
    s.statements.claims = [([claimed_job("h")], [])]
    s.tick()
    assert not s.claimer.backlog and not s.claimer.claiming_soon()  # nothing more waits
    s = ClaimerRig(PREFETCH.replace("prefetch = 4", "prefetch = 0"), idle=2)
    s.statements.claims = [([claimed_job("h") for _ in range(2)], [])]
    s.tick()
    assert s.claimer.backlog and not s.claimer.claiming_soon()  # a freed slot claims at once


def test_with_prefetch_a_slot_freed_by_an_exiting_child_gets_a_new_child_for_a_held_job() -> None:
    """A fresh process per job with prefetch: when a child exits, its slot gets a new
    child for the next held job (before, the held jobs' count beyond the slots cancelled
    it out and they waited for ever, their leases renewed)."""
    s = ClaimerRig(PREFETCH.replace("max_jobs_per_child = 100", "max_jobs_per_child = 1"), idle=2)
    s.statements.claims = [([claimed_job("h") for _ in range(6)], [])]
    s.tick()
    assert len(s.table.waiting()) == 4 and s.supervisor.spawned == 0
    running = [j for j in s.table if s.table.child_of(j) is not None]
    child = s.table.child_of(running[0])
    assert child is not None and child.exiting  # one job per child
    s.table.on_message(child, protocol.Done(running[0].job.id))
    s.claimer.slot_freed()
    s.tick()
    assert s.supervisor.spawned == 1  # a child for the slot the exiting one frees
