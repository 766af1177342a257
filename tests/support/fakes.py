"""Fakes for the in-process unit tier (tests/unit): a clock, the daemon's statements and
its supervisor. They stand in for the database and for processes only where a test drives
a component's logic (decide, limits, capacity, deadlines) in milliseconds; the same
behaviours are tested against real PostgreSQL and real processes in the other tiers."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pgworkerd.config import Config, parse_config
from pgworkerd.daemon.claimer import Claimer
from pgworkerd.daemon.jobtable import JobTable
from pgworkerd.daemon.outcomes import Outcome
from pgworkerd.daemon.peers import Peers, Wake
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.queue.lease import (
    ClaimedJob,
    Expiring,
    HandlerCapacity,
    Lease,
    NextWakeups,
    RefusedJob,
    RenewOutcome,
)
from pgworkerd.queue.registry import DrainRequest, WorkerInfo
from pgworkerd.worker import protocol


class FakeClock:
    """time.monotonic() that moves only when told."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@dataclass(eq=False)
class FakeChild:
    pid: int
    job: int | None = None
    exiting: bool = False
    broken: str = ""
    jobs_run: int = 0
    rusage: Any = None  # as Supervisor's Child: os.wait4's once reaped
    cpu_reported: tuple[float, float] = (0.0, 0.0)
    sent: list[Any] = field(default_factory=list)  # protocol messages, decoded
    watched: list[Any] = field(default_factory=list)  # what its watcher was sent, decoded
    signals: list[int] = field(default_factory=list)

    def send(self, message: Any) -> bool:
        self.sent.append(message)
        return True

    def signal_group(self, sig: int) -> None:
        self.signals.append(sig)


class FakeSupervisor:
    """Children that exist as soon as they are spawned (while `startable`)."""

    def __init__(
        self, idle_children: int = 0, *, startable: bool = True, max_jobs_per_child: int = 1
    ) -> None:
        self._pids = itertools.count(100)
        self.max_jobs_per_child = max_jobs_per_child
        self.children: list[FakeChild] = []
        self.startable = startable
        self.spawned = 0
        self.spawn_requests: list[int] = []  # the count of each spawn() call
        self.retired: list[FakeChild] = []
        self.unreachable: list[FakeChild] = []  # send_assigned cannot write to these
        for _ in range(idle_children):
            self.children.append(FakeChild(next(self._pids)))

    def idle(self) -> list[FakeChild]:
        return [c for c in self.children if c.job is None and not c.exiting]

    def starting(self) -> int:
        return 0

    def can_start(self) -> bool:
        return self.startable or bool(self.idle())

    def spawn(self, count: int = 1) -> int:
        if not self.startable:
            return 0
        self.spawned += count
        self.spawn_requests.append(count)
        self.children += [FakeChild(next(self._pids)) for _ in range(count)]
        return count

    def retire(self, child: FakeChild) -> None:
        child.exiting = True
        self.retired.append(child)

    def has_children(self) -> bool:
        return bool(self.children)

    def unassign(self, child: FakeChild, job_id: int) -> None:
        if child.job == job_id:
            child.job = None

    def assign(
        self, child: FakeChild, job_id: int, frame: bytes, watch_frame: bytes, side_by_side: int = 1
    ) -> None:
        if child.job is None:  # (a child running jobs side by side keeps its first)
            child.job = job_id
        child.jobs_run += 1
        if child.jobs_run >= max(side_by_side, self.max_jobs_per_child):  # as Supervisor.assign
            child.exiting = True
        # What the child would read: the frame decoded (4-byte length, then JSON).
        import json

        child.sent.append(protocol.decode(json.loads(frame[4:])))
        child.watched.append(protocol.decode(json.loads(watch_frame[4:])))

    def send_assigned(self) -> list[FakeChild]:
        return list(self.unreachable)  # (what a test made unreachable)


class FakeStatements:
    """The daemon's database calls, answered from what the test queued up."""

    def __init__(self) -> None:
        self.ok = True
        self.claims: list[tuple[list[ClaimedJob], list[RefusedJob]] | None] = []
        self.claim_calls: list[tuple[list[str], dict[str, HandlerCapacity], int]] = []
        self.next_run: float | None = None
        self.expiring: Expiring | None = None  # the running job whose lease ends first
        self.peer_rows: list[tuple[str, list[str], list[str], int]] = []
        self.sent_wakes: list[str] = []
        self.forwarded_wakes: list[Wake] = []  # aimed wake-ups handed on (workers_wake)
        self.renewals: list[list[Lease]] = []
        self.renew_answer: dict[int, RenewOutcome] = {}
        self.renew_fails = 0  # this many renew calls return None (a failed statement)
        self.written: list[list[Any]] = []
        self.write_fails = 0
        self.retry_in: float | None = None  # what the database says of a failed job's retry
        self.during_renew: Any = None  # called with the leases while the renewal "runs"
        self.registry_calls: list[tuple[str, str]] = []  # (call, state) to the registry
        # what each heartbeat answers (None: the call failed, or the row is gone)
        self.drain_request: DrainRequest | None = DrainRequest()

    def claim(
        self,
        queues: Any,
        capacity: dict[str, HandlerCapacity],
        limit: int,
        completions: Any = (),
    ) -> tuple[list[ClaimedJob], list[RefusedJob]] | None:
        self.claim_calls.append((list(queues), capacity, limit))
        answer = self.claims.pop(0) if self.claims else ([], [])
        if completions and answer is not None:  # written with the claim, all or nothing
            self.written.append(list(completions))
        return answer

    def next_wakeups(self, queues: Any, handlers: Any) -> NextWakeups | None:
        return NextWakeups(self.next_run, self.expiring)

    def peers(self, stale_after: float) -> list[tuple[str, list[str], list[str], int]] | None:
        return list(self.peer_rows)

    def register(self, info: WorkerInfo, state: str, heartbeat_interval: float) -> None:
        self.registry_calls.append(("register", state))

    def deregister(self) -> None:
        self.registry_calls.append(("deregister", ""))

    def heartbeat(
        self, info: WorkerInfo, state: str, job_ids: list[int], heartbeat_interval: float
    ) -> DrainRequest | None:
        self.registry_calls.append(("heartbeat", state))
        return self.drain_request

    def wake_send(self, payload: str) -> bool | None:
        self.sent_wakes.append(payload)
        return True

    def wake_forward(self, wake: Wake) -> bool | None:
        self.forwarded_wakes.append(wake)
        return True

    def wake_channel_set(self, listening: bool) -> bool | None:
        self.registry_calls.append(("wake_channel", "on" if listening else "off"))
        return True

    def renew(self, leases: list[Lease]) -> list[RenewOutcome] | None:
        self.renewals.append(leases)
        if self.during_renew is not None:
            self.during_renew(leases)
        if self.renew_fails:
            self.renew_fails -= 1
            return None
        return [
            self.renew_answer.get(lease.id, RenewOutcome(lease.id, True, False)) for lease in leases
        ]

    def write_outcomes(self, batch: list[Any]) -> bool | None:
        if self.write_fails:
            self.write_fails -= 1
            return None
        self.written.append(list(batch))
        for o in batch:  # as outcomes.write: a failed attempt learns when it is retried
            if o.kind == "fail":
                o.retry_in = self.retry_in
        return True


_ids = itertools.count(1)


def claimed_job(handler: str = "h", *, attempt: int = 1, **kw: Any) -> ClaimedJob:
    now = datetime.now(UTC)
    values: dict[str, Any] = {
        "id": next(_ids),
        "queue": "default",
        "handler": handler,
        "payload": {},
        "priority": 0,
        "attempt": attempt,
        "max_attempts": 5,
        "token": 1,
        "checkpoint": None,
        "run_at": now,
        "created_at": now,
        "locked_until": now,
        "rescued": False,
    }
    values.update(kw)
    return ClaimedJob(**values)


def config(text: str = "") -> Config:
    """A Config from TOML, with handler "h" (and whatever `text` adds)."""
    base = '[handlers.h]\ntarget = "jobhandlers:noop"\n'
    return parse_config(base + text)


class ClaimerRig:
    """A Claimer on a fake clock, fake statements and a fake supervisor with `idle` idle
    children (a job table between them); outcomes collected in `outcomes`."""

    def __init__(
        self,
        text: str,
        *,
        idle: int = 4,
        startable: bool = True,
        peers: Peers | None = None,
        listening: Callable[[], bool] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config(text)
        self.clock = FakeClock()
        self.statements = FakeStatements()
        self.supervisor = FakeSupervisor(
            idle, startable=startable, max_jobs_per_child=self.config.worker.max_jobs_per_child
        )
        self.outcomes: list[Outcome] = []
        self.table = JobTable(
            self.config.worker,
            self.supervisor,
            NullMetrics(),
            self.outcomes.append,
            clock=self.clock,
        )
        extra: dict[str, Any] = {}
        if peers is not None:
            extra["peers"] = peers
        if listening is not None:
            extra["listening"] = listening
        if rng is not None:
            extra["rng"] = rng
        self.claimer = Claimer(
            self.config,
            self.statements,
            self.table,
            self.supervisor,
            NullMetrics(),
            clock=self.clock,
            **extra,
        )
        self.claimer.set_accepting(True)

    def tick(self, advance: float = 0.0) -> None:
        self.claimer.tick(self.clock.advance(advance))
