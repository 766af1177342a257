"""The jobs this daemon holds, from claim to outcome: each with its child, its limits
(lease deadline, timeout, heartbeat timeout, kill grace) and why it was stopped.

The table is the one place that links a job to its child (its own map, and the child's
record through Supervisor.assign/unassign, change together in dispatch and _unlink), that
reads what children report about their jobs, and that decides a finished attempt's
outcome (once: settle). Outcomes leave through `on_settled`; nothing here touches the database.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable, Iterator
from typing import Generic

from pgworkerd.config import HandlerConfig, WorkerConfig
from pgworkerd.daemon import accounting
from pgworkerd.daemon.children import ChildSupervisor, ChildT
from pgworkerd.daemon.joblogs import JobLogs
from pgworkerd.daemon.outcomes import InFlight, Outcome, decide, fence_margin
from pgworkerd.daemon.states import OutcomeKind, StopReason
from pgworkerd.daemon.supervisor import describe_exit
from pgworkerd.describe import short_error
from pgworkerd.ops.logs import JOB_EVENTS
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.queue.lease import ClaimedJob, RefusedJob, encode_json
from pgworkerd.worker import protocol
from pgworkerd.worker.protocol import (
    Beat,
    Cancel,
    ChildMessage,
    Done,
    Failed,
    Hello,
    Interrupted,
    LeaseExtended,
    Output,
    Report,
    Shutdown,
    Started,
    Stop,
    Usage,
)

log = logging.getLogger("pgworkerd")
job_events = logging.getLogger(JOB_EVENTS)  # started: [logging] job_events

# A claimed job that no child could take for this long, while none can be started (the
# fork server is down), is handed back for another daemon to run.
START_TIMEOUT = 10.0


class JobTable(Generic[ChildT]):
    def __init__(
        self,
        worker: WorkerConfig,
        supervisor: ChildSupervisor[ChildT],
        metrics: NullMetrics,
        on_settled: Callable[[Outcome], None],
        clock: Callable[[], float] = time.monotonic,
        logs: JobLogs | None = None,
    ) -> None:
        self.worker = worker
        self.supervisor = supervisor
        self.metrics = metrics
        self.on_settled = on_settled
        self.clock = clock
        self.logs = logs  # what the jobs print (daemon.joblogs); None: not captured
        self.jobs: dict[int, InFlight] = {}
        self._child_of: dict[int, ChildT] = {}  # job id -> the child running it
        self.draining = False

    def configure(self, worker: WorkerConfig) -> None:
        """After a reload: new slots, kill grace and backoff; jobs in flight keep theirs."""
        self.worker = worker

    # -- what is in it -------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.jobs)

    def __iter__(self) -> Iterator[InFlight]:
        return iter(list(self.jobs.values()))

    def holds(self, job: InFlight) -> bool:
        return self.jobs.get(job.job.id) is job

    def ids(self) -> list[int]:
        return sorted(self.jobs)

    def has_job(self, job_id: int) -> bool:
        return job_id in self.jobs

    def free_slots(self) -> int:
        """Slots without a job (held jobs waiting for a child count as theirs)."""
        return self.worker.slots - len(self.jobs)

    def free_to_claim(self) -> int:
        """How many jobs a claim may take now: the free slots and [worker] prefetch (jobs
        held ready for a slot)."""
        return self.worker.slots + self.worker.prefetch - len(self.jobs)

    def slots_without_child(self) -> int:
        """How many held jobs could get a child now: waiting ones, as far as slots are
        free of running ones (with prefetch, more may wait than there are slots)."""
        waiting = len(self.waiting())
        return max(0, min(waiting, self.worker.slots - (len(self.jobs) - waiting)))

    def busy_per_handler(self) -> dict[str, int]:
        busy: dict[str, int] = {}
        for j in self.jobs.values():
            busy[j.job.handler] = busy.get(j.job.handler, 0) + 1
        return busy

    def jobs_of(self, child: ChildT) -> list[InFlight]:
        """The jobs `child` runs: one, or an async handler's side by side (concurrency)."""
        return [self.jobs[i] for i, c in self._child_of.items() if c is child and i in self.jobs]

    def room_beside(self) -> int:
        """How many more jobs the children running jobs side by side could take now."""
        room = 0
        for child in {id(c): c for c in self._child_of.values()}.values():
            jobs = self.jobs_of(child)
            if jobs and self._joinable(child, jobs[0].handler, jobs):
                room += jobs[0].handler.concurrency - len(jobs)
        return room

    def _joinable(self, child: ChildT, handler: HandlerConfig, jobs: list[InFlight]) -> bool:
        """Whether `child`, running `jobs`, can take one more of `handler`'s jobs."""
        return (
            handler.concurrency > 1
            and child.pid is not None
            and not child.exiting
            and not child.broken
            and len(jobs) < handler.concurrency
            and all(j.handler.name == handler.name and j.stop_reason is None for j in jobs)
        )

    def _beside(self, handler: HandlerConfig) -> ChildT | None:
        """A child running `handler`'s jobs side by side with room for one more."""
        for child in {id(c): c for c in self._child_of.values()}.values():
            if self._joinable(child, handler, self.jobs_of(child)):
                return child
        return None

    def waiting(self) -> list[InFlight]:
        """Claimed, not handed to a child yet, and not stopped."""
        return [
            j
            for j in self.jobs.values()
            if j.job.id not in self._child_of and j.stop_reason is None
        ]

    def has_unsaved(self) -> bool:
        return any(j.unsaved for j in self.jobs.values())

    def busy(self) -> bool:
        """Jobs held, or children still running (their outcome may be on its way)."""
        return bool(self.jobs) or self.supervisor.has_children()

    # -- claim to child ------------------------------------------------------------------

    def add(self, job: ClaimedJob, handler: HandlerConfig, lease: float, claimed_at: float) -> None:
        self.jobs[job.id] = InFlight(
            job=job,
            handler=handler,
            lease=lease,
            claimed_at=claimed_at,
            deadline=claimed_at + lease - fence_margin(lease),
        )

    def refuse(
        self, job: ClaimedJob | RefusedJob, handler: HandlerConfig | None, reason: str
    ) -> None:
        """A claimed job this daemon cannot run at all: dead at once with the reason
        (written like any outcome: fenced, kept while the database is away)."""
        self.jobs.pop(job.id, None)
        self.on_settled(Outcome(job, handler, OutcomeKind.BURY, 0.0, error=reason))

    def dispatch(self) -> None:
        """Hand waiting jobs to idle children."""
        waiting = self.waiting()
        if not waiting:
            return
        idle = self.supervisor.idle()
        handed: list[tuple[InFlight, ChildT]] = []
        for job in waiting:
            beside = self._beside(job.handler) if job.handler.concurrency > 1 else None
            if beside is None and not idle:
                continue  # (a later job may join a child running its handler's jobs)
            try:
                message = protocol.Job(
                    id=job.job.id,
                    handler=job.job.handler,
                    target=job.handler.target,
                    queue=job.job.queue,
                    payload=job.job.payload,
                    attempt=job.job.attempt,
                    max_attempts=job.job.max_attempts,
                    checkpoint=job.job.checkpoint,
                    deadline=job.deadline,
                    memory_limit=job.handler.memory_limit or self.worker.memory_limit,
                    parents=job.job.parents,
                    woken=job.job.woken,
                    lease_token=job.job.token,
                    batch=job.job.batch,
                    concurrency=job.handler.concurrency if job.handler.concurrency > 1 else None,
                    trace=job.job.trace,
                )
                frame = protocol.encode(message)
            except Exception as exc:  # this job's data: too big, too deep, not JSON
                self.refuse(
                    job.job, job.handler, f"cannot be handed to a child: {short_error(exc)}"
                )
                continue
            child = beside if beside is not None else idle.pop(0)
            self._child_of[job.job.id] = child
            self.supervisor.assign(
                child,
                job.job.id,
                frame,
                protocol.encode(protocol.Watch.of(message)),
                job.handler.concurrency,
            )
            handed.append((job, child))
        unreachable = self.supervisor.send_assigned()
        for job, child in handed:
            if child in unreachable:
                self._unlink(job)
            elif self.logs is not None and job.handler.concurrency > 1:
                # its output comes as Output messages (the child's file is shared)
                self.logs.begin_routed(job.job.id, job.job.token, job.job.attempt)
            elif self.logs is not None:
                self.logs.begin(job.job.id, job.job.token, job.job.attempt, child.pid)

    def child_of(self, job: InFlight) -> ChildT | None:
        return self._child_of.get(job.job.id)

    def _unlink(self, job: InFlight) -> None:
        child = self._child_of.pop(job.job.id, None)
        if child is not None:
            self.supervisor.unassign(child, job.job.id)
            if child.job is None or child.job == job.job.id:
                # a child running jobs side by side is busy while any of them runs
                rest = self.jobs_of(child)
                child.job = rest[0].job.id if rest else None

    # -- what children say and how they end ---------------------------------------------

    def on_message(self, child: ChildT, message: ChildMessage) -> None:
        if isinstance(message, Hello):
            return  # the supervisor's
        job_id = message.id
        if job_id is None or self._child_of.get(job_id) is not child:
            job_id = child.job  # (a message of release 0.2 names no job: its current one)
        job = self.jobs.get(job_id) if job_id is not None else None
        if job is None or self.child_of(job) is not child:
            return
        if message.id not in (None, job.job.id):
            return  # a late beat is about an ended job
        if isinstance(message, Output):
            if self.logs is not None:
                self.logs.output(job.job.id, message.text.encode("utf-8", "replace"))
            return
        now = self.clock()
        if isinstance(message, Started):
            job.started_at = job.last_beat = now
            job_events.info(
                "%s: started in child %s (%.1f ms after the claim)",
                job.name,
                child.pid,
                (now - job.claimed_at) * 1000,
                extra={
                    "fields": {
                        "job_id": job.job.id,
                        "handler": job.job.handler,
                        "attempt": job.job.attempt,
                        "pid": child.pid,
                        "event": "started",
                    }
                },
            )
            if not job.job.rescued:  # a rescued job's run_at predates its lost attempt
                self.metrics.observe_job_start(job.job.run_at, job.job.created_at, job.job.handler)
        elif isinstance(message, Beat):
            job.last_beat = now
            for key in ("progress", "checkpoint"):
                value = getattr(message, key)
                if value is None:
                    continue
                # Encoded (and so checked) here, once: one job's odd value must never
                # fail the renewal statement that carries every job's lease.
                try:
                    setattr(job, key, encode_json(value))
                    job.unsaved = True
                except Exception as exc:
                    log.warning("%s: %s not saved: %s", job.name, key, short_error(exc))
        elif isinstance(message, Usage):
            job.usage = message
            accounting.reported(child, message, self.worker.max_child_memory)
        elif isinstance(message, Done | Failed | Interrupted):
            report: Report = message
            if isinstance(message, Done) and message.result is not None:
                try:
                    report = Done(message.id, encode_json(message.result), message.then)
                except Exception as exc:
                    report = Failed(message.id, f"the result cannot be stored: {short_error(exc)}")
            if isinstance(report, Done) and report.then is not None:
                # the follow-ups' JSON checked here, as the result's: a value jsonb
                # refuses must fail this attempt, not the batch's completion statement
                try:
                    then = encode_json(report.then)  # the list, as JSON text
                    report = Done(report.id, report.result, then)  # type: ignore[arg-type]
                except Exception as exc:
                    report = Failed(
                        message.id, f"the follow-ups cannot be stored: {short_error(exc)}"
                    )
            self._settle(job, report)

    def on_exit(self, child: ChildT, status: int) -> None:
        jobs = self.jobs_of(child)
        for job in jobs:
            self._settle(job, None, exit_description=child.broken or describe_exit(status))
        if not jobs and status != 0 and not child.exiting:
            log.warning("idle child %s %s", child.pid, describe_exit(status))
        if self.logs is not None:
            self.logs.child_exited(child.pid)

    # -- stopping ------------------------------------------------------------------------

    def stop(self, job: InFlight, reason: StopReason, *, now_kill: bool = False) -> None:
        """Stop a job's child: SIGTERM to its group, SIGKILL after the kill grace."""
        if job.stop_reason is None:
            job.stop_reason = reason
        child = self.child_of(job)
        if child is None:
            self._settle(job, None)
            return
        if now_kill:
            self._kill(child, job)
            job.kill_at = None
        elif job.kill_at is None:
            if job.handler.concurrency > 1:
                child.send(Stop(job.job.id))  # its coroutine only, not its siblings
            else:
                child.signal_group(signal.SIGTERM)
            job.kill_at = self.clock() + self.worker.kill_grace

    def _kill(self, child: ChildT, job: InFlight) -> None:
        """SIGKILL a job's child. Jobs running beside it there die too: they are handed
        back, their attempt not counted (StopReason.SIBLING), unless stopping already."""
        for other in self.jobs_of(child):
            if other is not job and other.stop_reason is None:
                other.stop_reason = StopReason.SIBLING
        child.signal_group(signal.SIGKILL)

    def stop_all(self, reason: StopReason) -> None:
        for job in self:
            self.stop(job, reason)

    def drain(self) -> None:
        """No new jobs: ones never started go back at once; running ones are asked to
        finish (JobContext.shutdown_requested) until the drain timeout stops them."""
        self.draining = True
        for job in self:
            child = self.child_of(job)
            if child is None:
                self.stop(job, StopReason.DRAIN)
            else:
                child.send(Shutdown())

    def hand_back(self, job: InFlight, grace: float) -> None:
        """`drain --hand-back`: ask the job's handler to stop (job.stop_requested, as a
        SIGTERM drain does) and hand the job back when `grace` seconds have passed, or at
        once if it never started. A job keeps the earliest hand-back time it was given:
        a second request never gives it more time."""
        if job.stop_reason is not None:
            return  # stopping already (its own reason decides what it leaves)
        child = self.child_of(job)
        if child is None or grace <= 0:
            self.stop(job, StopReason.HAND_BACK)
            return
        if not job.stop_asked:
            job.stop_asked = True
            child.send(Shutdown(job.job.id))
        at = self.clock() + grace
        job.hand_back_at = at if job.hand_back_at is None else min(job.hand_back_at, at)

    def lift_hand_back(self) -> None:
        """`pgworkerd resume`: jobs waiting out a hand-back grace run on (a handler that
        stops itself all the same is still released, not failed)."""
        for job in self.jobs.values():
            job.hand_back_at = None

    def lease_renewed(self, job: InFlight, deadline: float, *, saved: bool) -> None:
        job.deadline = deadline
        job.unsaved = job.unsaved and not saved
        child = self.child_of(job)
        if child is not None:
            child.send(LeaseExtended(deadline, job.job.id))

    def lease_lost(self, job: InFlight, why: str) -> None:
        """Kill the job now (once): its lease is gone or may be. A job stopped for
        another reason first keeps that reason (decide() reports it)."""
        if job.fenced:
            return
        job.fenced = True
        log.error(
            "%s: %s; stopping it",
            job.name,
            why,
            extra={"fields": {"job_id": job.job.id, "event": "lease_lost"}},
        )
        self.metrics.lease_lost(job.handler.name)
        self.stop(job, StopReason.LEASE_LOST, now_kill=True)

    def cancel(self, job: InFlight) -> None:
        """The database asked to cancel this job: tell the handler, then stop it."""
        if job.stop_reason is not None:
            return
        job.cancel_seen = True
        log.info("%s: cancel requested; stopping it", job.name)
        child = self.child_of(job)
        if child is not None:
            child.send(Cancel(job.job.id))
        self.stop(job, StopReason.CANCEL)

    def _settle(self, job: InFlight, report: Report | None, exit_description: str = "") -> None:
        """Decide a finished attempt's outcome (once) and pass it on."""
        if self.jobs.pop(job.job.id, None) is None:
            return
        child = self.child_of(job)
        self._unlink(job)
        if self.logs is not None:
            self.logs.end(job.job.id)  # the rest of its output, before a next job's
        outcome = decide(job, report, exit_description, self.draining, self.worker)
        if job.started_at is not None:  # it ran: what it cost goes to its history
            wall = self.clock() - job.claimed_at
            outcome.usage = accounting.attempt_usage(
                job.job.id, job.job.token, wall, job.usage, child
            )
            u = outcome.usage
            cpu = None if u.cpu_user is None else u.cpu_user + (u.cpu_system or 0.0)
            self.metrics.observe_attempt(job.job.handler, wall, cpu, u.peak_memory)
        if child is not None:
            accounting.settled(child, job.usage)
        self.on_settled(outcome)

    # -- limits --------------------------------------------------------------------------

    def tick(self, now: float, *, can_start: bool = True) -> None:
        """Enforce every job's limits: lease deadline, kill grace, timeout, heartbeat."""
        for job in self:
            h = job.handler
            if now >= job.deadline and not job.fenced:
                # Self-fencing: the lease may be gone; the job must not run on.
                self.lease_lost(job, "lease not renewed in time")
            elif job.kill_at is not None and now >= job.kill_at:
                child = self.child_of(job)
                if child is not None:
                    self._kill(child, job)
                job.kill_at = None
            elif (
                job.hand_back_at is not None and now >= job.hand_back_at and job.stop_reason is None
            ):
                log.info("%s: its hand-back grace is over; stopping it", job.name)
                self.stop(job, StopReason.HAND_BACK)
            elif job.started_at is not None and job.stop_reason is None:
                if job.timeout is not None and now - job.started_at >= job.timeout:
                    self.stop(job, StopReason.TIMEOUT)
                elif h.heartbeat_timeout is not None and (
                    now - job.last_beat >= h.heartbeat_timeout
                ):
                    self.stop(job, StopReason.STUCK)
            elif (
                not can_start
                and self.child_of(job) is None
                and job.stop_reason is None
                and now - job.claimed_at >= START_TIMEOUT
            ):
                log.warning(
                    "%s: no child could be started for it in %.0fs; handing it back",
                    job.name,
                    START_TIMEOUT,
                )
                self.stop(job, StopReason.NO_CHILD)

    def next_deadline(self, can_start: bool = True) -> float | None:
        times = [t for job in self.jobs.values() for t in job.limits()]
        if not can_start:
            times += [j.claimed_at + START_TIMEOUT for j in self.waiting()]
        return min(times, default=None)
