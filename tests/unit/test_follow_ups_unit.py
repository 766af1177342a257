"""Follow-ups and the lease token on the child's and the daemon's side, without a database:
the protocol carries them (and refuses a hostile child's), the child turns a returned
pgworkerd.Done into job objects or a clear failure, the job table hands the token to the
child and checks the follow-ups' JSON, and the writer keeps a completion with follow-ups
out of the claim's transaction (the claim's cost stays what it was)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakes import FakeClock, FakeStatements, FakeSupervisor, claimed_job
from test_leases_and_writer import HANDLER, LEASE

import pgworkerd
from pgworkerd.config import WorkerConfig
from pgworkerd.daemon.jobtable import JobTable
from pgworkerd.daemon.outcomes import Outcome, OutcomeWriter
from pgworkerd.daemon.states import OutcomeKind
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.worker import outcomes, protocol
from pgworkerd.worker.wire import FrameReader


def test_a_done_with_follow_ups_and_a_job_with_its_token_survive_the_wire() -> None:
    for message in (
        protocol.Done(7, {"ok": 1}, [{"handler": "next", "payload": {"a": 1}}]),
        protocol.Job(7, "h", "m:f", "default", {}, 1, 5, None, 12.5, None, 1 << 60 | 12345),
    ):
        [frame] = FrameReader().feed(protocol.encode(message))
        assert protocol.decode(frame) == message


@pytest.mark.parametrize(
    "then",
    ["next", {"handler": "next"}, [1], [[]], [{"handler": "x"}] * 1001],
)
def test_a_hostile_childs_follow_ups_are_refused_by_the_protocol(then: Any) -> None:
    with pytest.raises(protocol.ProtocolError, match="'then' must be a list of at most 1000"):
        protocol.decode({"t": "done", "id": 1, "then": then})


def test_pgworkerd_done_and_jobspec_become_job_objects() -> None:
    done = pgworkerd.Done({"r": 1}, then=[pgworkerd.JobSpec("next", {"a": 1}, priority=3)])
    assert done.result == {"r": 1}
    [spec] = outcomes.follow_ups_json(done.then, 1000)
    assert spec["handler"] == "next" and spec["payload"] == {"a": 1} and spec["priority"] == 3
    assert outcomes.follow_ups_json((), 1000) == []
    assert "2 follow-ups" in repr(pgworkerd.Done(None, then=[1, 2]))


@pytest.mark.parametrize(
    ("then", "message"),
    [
        ("next", "must be a list of pgworkerd.JobSpec, not str"),
        ({"handler": "next"}, "must be a list of pgworkerd.JobSpec, not dict"),
        (None, "must be a list of pgworkerd.JobSpec, not NoneType"),
        ([{"handler": "next"}], "follow-up 1 of 1 must be a pgworkerd.JobSpec, not dict"),
        ([pgworkerd.JobSpec("")], "follow-up 1 of 1: handler must be a non-empty string"),
        ([pgworkerd.JobSpec("next")] * 3, "holds 3 follow-ups; at most 2"),
    ],
)
def test_a_bad_follow_up_list_is_a_clear_error(then: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        outcomes.follow_ups_json(then, 2)


_SEGMENT = pgworkerd.JobSpec("segment")


@pytest.mark.parametrize(
    "spec",
    [
        pgworkerd.JobSpec("stitch", after=[_SEGMENT]),  # was sent without its parents
        pgworkerd.JobSpec("stitch", after=[12]),
        pgworkerd.JobSpec("stitch", after=[12], on_parent_failure="run"),
        pgworkerd.JobSpec("stitch", expire_in=60),
        pgworkerd.JobSpec("stitch", timeout=60),
    ],
)
def test_a_follow_up_with_parents_or_deadlines_is_refused_not_sent_without_them(
    spec: Any,
) -> None:
    """Follow-ups go through enqueue_many_v2, which has no parents or deadlines: a follow-up
    naming an earlier JobSpec of the list as its parent used to be sent without it (it
    would run at once, before its parent), and one with ids or deadlines was refused only
    at the completion as an unknown key. Both are a clear error in the child."""
    with pytest.raises(ValueError, match="follow-up 2 of 2: a follow-up cannot have parents"):
        outcomes.follow_ups_json([_SEGMENT, spec], 1000)


class Table:
    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self.supervisor = FakeSupervisor(1)
        self.table = JobTable(
            WorkerConfig(), self.supervisor, NullMetrics(), self.outcomes.append, clock=FakeClock()
        )

    def run(self) -> tuple[Any, Any]:
        job = claimed_job("h")
        self.table.add(job, HANDLER, LEASE, 0.0)
        self.table.dispatch()
        held = self.table.jobs[job.id]
        return held, self.table.child_of(held)


def test_the_child_is_handed_its_attempts_lease_token() -> None:
    t = Table()
    held, child = t.run()
    [job] = child.sent
    assert isinstance(job, protocol.Job) and job.lease_token == held.job.token


def test_follow_ups_jsonb_refuses_fail_the_attempt_not_the_batch() -> None:
    t = Table()
    held, child = t.run()
    t.table.on_message(child, protocol.Started(held.job.id))
    t.table.on_message(child, protocol.Done(held.job.id, 1, [{"handler": "a\u0000b"}]))
    [o] = t.outcomes
    assert o.kind is OutcomeKind.FAIL and "the follow-ups cannot be stored" in o.error


def test_follow_ups_reach_the_outcome_as_json_text() -> None:
    t = Table()
    held, child = t.run()
    t.table.on_message(child, protocol.Started(held.job.id))
    t.table.on_message(child, protocol.Done(held.job.id, 1, [{"handler": "next"}]))
    [o] = t.outcomes
    assert o.kind is OutcomeKind.COMPLETE and json.loads(o.follow_ups) == [{"handler": "next"}]
    assert o.write().follow_ups == o.follow_ups


def test_a_completion_with_follow_ups_is_not_carried_by_the_claim() -> None:
    statements = FakeStatements()
    w = OutcomeWriter(statements.write_outcomes, lambda: True, lambda t: None, clock=FakeClock())
    plain = Outcome(claimed_job("h"), HANDLER, OutcomeKind.COMPLETE, 1.0)
    with_follow_ups = Outcome(
        claimed_job("h"), HANDLER, OutcomeKind.COMPLETE, 1.0, follow_ups='[{"handler": "x"}]'
    )
    w.add(plain)
    w.add(with_follow_ups)
    assert w.completions() == [plain]
    w.carried([plain])
    w.tick(0.0)  # written right after the claim, by the writer
    assert statements.written == [[with_follow_ups]] and not w.pending
