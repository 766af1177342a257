"""Unit tier: an async handler's jobs side by side in one child ([handlers.X] concurrency,
issue 26 item 1): the job table places them, routes each report by job id, stops one by
a Stop message (not its child's SIGTERM), hands its siblings back when it must kill the
child; the config refuses what cannot work; the protocol carries Stop and Output."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from fakes import FakeChild, FakeClock, FakeSupervisor, claimed_job

from pgworkerd.config import HandlerConfig, WorkerConfig, import_handler, parse_config
from pgworkerd.config.spec import ConfigError
from pgworkerd.daemon.jobtable import JobTable
from pgworkerd.daemon.outcomes import InFlight, Outcome
from pgworkerd.daemon.states import OutcomeKind, StopReason
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.worker import protocol

ASYNC = HandlerConfig("a", "asynchandlers:echo", concurrency=3, timeout=30.0)
SYNC = HandlerConfig("s", "jobhandlers:work")


class Table:
    def __init__(self, idle: int = 2) -> None:
        self.clock = FakeClock()
        self.supervisor = FakeSupervisor(idle, max_jobs_per_child=1)
        self.outcomes: list[Outcome] = []
        self.table = JobTable(
            WorkerConfig(slots=8, kill_grace=5.0),
            self.supervisor,
            NullMetrics(),
            self.outcomes.append,
            clock=self.clock,
        )

    def add(self, handler: HandlerConfig = ASYNC, count: int = 1) -> list[InFlight]:
        jobs = []
        for _ in range(count):
            job = claimed_job(handler.name)
            self.table.add(job, handler, 60.0, self.clock())
            jobs.append(self.table.jobs[job.id])
        return jobs

    def child(self, job: InFlight) -> FakeChild:
        child = self.table.child_of(job)
        assert child is not None
        return child


def test_jobs_of_a_concurrent_handler_share_a_child_up_to_its_concurrency() -> None:
    t = Table(idle=2)
    jobs = t.add(count=4)
    t.table.dispatch()
    children = [t.child(j) for j in jobs]
    assert children[0] is children[1] is children[2] and children[3] is not children[0]
    sent = [m for m in children[0].sent if isinstance(m, protocol.Job)]
    assert [m.id for m in sent] == [j.job.id for j in jobs[:3]]
    assert {m.concurrency for m in sent} == {3}
    # 3 jobs in a child that may take 3: full (and replaced after them: max(3, 1))
    assert children[0].exiting and t.table.room_beside() == 2  # the second child's room


def test_a_sync_handlers_job_never_joins_a_busy_child() -> None:
    t = Table(idle=2)
    [a] = t.add()
    [s] = t.add(SYNC)
    t.table.dispatch()
    assert t.child(a) is not t.child(s)
    assert [m.concurrency for m in t.child(s).sent] == [None]


def test_each_report_settles_its_own_job_and_the_child_stays_busy_until_the_last() -> None:
    t = Table(idle=1)
    one, two = t.add(count=2)
    t.table.dispatch()
    child = t.child(one)
    for job in (one, two):
        t.table.on_message(child, protocol.Started(job.job.id))
    t.table.on_message(child, protocol.Beat(two.job.id, {"p": 2}))
    t.table.on_message(child, protocol.Done(one.job.id, 1))
    assert [o.job.id for o in t.outcomes] == [one.job.id]
    assert child.job == two.job.id and t.supervisor.idle() == []
    assert json.loads(two.progress or "null") == {"p": 2}
    t.table.on_message(child, protocol.Failed(two.job.id, "ValueError: x"))
    assert [o.kind for o in t.outcomes] == [OutcomeKind.COMPLETE, OutcomeKind.FAIL]
    assert child.job is None


def test_a_timeout_stops_one_job_by_message_and_a_kill_hands_its_siblings_back() -> None:
    t = Table(idle=1)
    slow, sibling = t.add(count=2)
    t.table.dispatch()
    child = t.child(slow)
    t.table.on_message(child, protocol.Started(slow.job.id))
    t.clock.advance(10)
    t.table.on_message(child, protocol.Started(sibling.job.id))
    t.clock.advance(21)  # slow: past its 30 s timeout; the sibling is not
    t.table.tick(t.clock())
    assert protocol.Stop(slow.job.id) in child.sent and child.signals == []
    assert slow.stop_reason is StopReason.TIMEOUT and sibling.stop_reason is None
    t.clock.advance(5)  # kill_grace: the coroutine did not end
    t.table.tick(t.clock())
    assert child.signals == [signal.SIGKILL]
    assert sibling.stop_reason is StopReason.SIBLING
    t.table.on_exit(child, signal.SIGKILL)
    kinds = {o.job.id: o.kind for o in t.outcomes}
    assert kinds == {slow.job.id: OutcomeKind.FAIL, sibling.job.id: OutcomeKind.RELEASE}


def test_a_child_that_dies_settles_every_job_it_ran() -> None:
    t = Table(idle=1)
    jobs = t.add(count=3)
    t.table.dispatch()
    child = t.child(jobs[0])
    t.table.on_exit(child, 9)
    assert sorted(o.job.id for o in t.outcomes) == sorted(j.job.id for j in jobs)
    assert {o.kind for o in t.outcomes} == {OutcomeKind.FAIL}


@pytest.mark.parametrize(
    ("value", "message"), [(0, "at least 1"), (1001, "at most 1000"), ("8", "")]
)
def test_concurrency_is_bounded(value: object, message: str) -> None:
    text = f'[handlers.a]\ntarget = "m:f"\nconcurrency = {value!r}\n'.replace("'", '"')
    with pytest.raises(ConfigError, match="concurrency") as refused:
        parse_config(text)
    assert message in str(refused.value)


def test_a_sync_handler_with_concurrency_is_refused_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cmod.py").write_text(
        "def plain(job):\n    return 1\n\nasync def coro(job):\n    return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="concurrency = 2 needs an async def handler"):
        import_handler(HandlerConfig("p", "cmod:plain", concurrency=2))
    import_handler(HandlerConfig("c", "cmod:coro", concurrency=2))
    import_handler(HandlerConfig("p1", "cmod:plain"))


def test_stop_and_output_messages_round_trip_and_are_checked() -> None:
    for message in (protocol.Stop(7), protocol.Output(7, "a line\n")):
        frame = protocol.encode(message)
        assert protocol.decode(json.loads(frame[4:])) == message
    with pytest.raises(protocol.ProtocolError):
        protocol.decode({"t": "output", "id": 7, "text": 5})
    with pytest.raises(protocol.ProtocolError):
        protocol.decode({"t": "stop"})
