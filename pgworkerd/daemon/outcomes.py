"""A job attempt from claim to outcome: what the daemon holds while it runs (InFlight),
what it left (decide), and what became of its record (report: one log line per job
event, and the metrics). Recording itself is queue.finish (the fenced write protocol:
which statement, a snooze past max_snoozes, a write that had landed earlier); the
daemon's Statements runs it and hands the result here. Every write names the lease token,
so an outcome whose lease was lost and re-claimed changes nothing and is logged as fenced
off (unless the row shows that an earlier write of the same outcome landed)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pgworkerd.config import HandlerConfig, WorkerConfig
from pgworkerd.daemon.states import OutcomeKind, StopReason
from pgworkerd.durations import format_duration
from pgworkerd.jsontext import storable_text
from pgworkerd.ops.logs import JOB_EVENTS
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.queue import attempts, finish
from pgworkerd.queue.lease import ClaimedJob, EncodedJson, RefusedJob
from pgworkerd.worker import protocol
from pgworkerd.worker.outcomes import snooze_problem, wait_problem
from pgworkerd.worker.protocol import Done, Failed, Interrupted, Report

log = logging.getLogger("pgworkerd")
job_events = logging.getLogger(JOB_EVENTS)  # completed: [logging] job_events

# The child stops itself this long before its lease runs out in the database, leaving
# room for the kill to land and for clock-rate differences.
FENCE_MARGIN_MIN = 1.0
FENCE_MARGIN_FRACTION = 0.1


def fence_margin(lease: float) -> float:
    """How long before the lease's end (as the daemon last renewed it) the job stops."""
    return min(lease / 2, max(FENCE_MARGIN_MIN, lease * FENCE_MARGIN_FRACTION))


@dataclass
class Outcome:
    """What to write for a finished attempt; kept until the database takes it."""

    job: ClaimedJob | RefusedJob
    handler: HandlerConfig | None  # None: a refused row's handler name did not decode
    kind: OutcomeKind
    duration: float
    result: Any = None
    error: str = ""
    progress: Any = None
    checkpoint: Any = None  # the attempt's latest, if not saved yet (None: keep)
    backoff: tuple[float, float] = (10.0, 3600.0)
    failed_writes: int = 0
    retry_in: float | None = None  # set once written: seconds until the retry is due
    snooze: float | None = None  # SNOOZE: seconds until the job runs again (checked)
    usage: attempts.Usage | None = None  # what the attempt cost (daemon.accounting)
    # WAIT: (signal name, timeout seconds, correlation key or None), checked
    wait: tuple[str, float, str | None] | None = None
    # COMPLETE: the follow-up jobs the handler returned, as JSON text (checked by
    # protocol.decode as a list of objects, encoded by the job table; the database checks
    # each job); None: none
    follow_ups: Any = None
    follow_up_ids: list[int] | None = None  # set once written: the follow-ups inserted

    def __post_init__(self) -> None:
        self.kind = OutcomeKind(self.kind)  # a plain string names the same kind

    def write(self) -> finish.OutcomeWrite:
        """What queue.finish records for it."""
        j, h = self.job, self.handler
        return finish.OutcomeWrite(
            kind=str(self.kind),
            id=j.id,
            token=j.token,
            handler=j.handler,
            result=self.result,
            error=self.error,
            progress=self.progress,
            checkpoint=self.checkpoint,
            backoff_base=self.backoff[0],
            backoff_max=self.backoff[1],
            delay=self.snooze or 0.0,
            max_snoozes=h.max_snoozes if h is not None else 0,
            wait_name=self.wait[0] if self.wait else "",
            wait_timeout=self.wait[1] if self.wait else 0.0,
            wait_key=self.wait[2] if self.wait else None,
            follow_ups=self.follow_ups,
        )

    @property
    def name(self) -> str:
        return f"job {self.job.id} {self.job.handler} attempt {self.job.attempt}"

    def fields(self, event: str) -> dict[str, Any]:
        return {
            "fields": {
                "job_id": self.job.id,
                "handler": self.job.handler,
                "attempt": self.job.attempt,
                "duration": round(self.duration, 3),
                "event": event,
            }
        }


@dataclass(eq=False)
class InFlight:
    """A claimed job this daemon holds, from claim to recorded outcome."""

    job: ClaimedJob
    handler: HandlerConfig
    lease: float
    claimed_at: float
    deadline: float  # monotonic: stop the child here if no renewal came
    started_at: float | None = None
    last_beat: float = 0.0
    progress: EncodedJson | None = None
    checkpoint: EncodedJson | None = None
    unsaved: bool = False  # progress or checkpoint not yet in the row
    stop_reason: StopReason | None = None  # None: the daemon did not stop it
    kill_at: float | None = None  # SIGKILL the child's group at this time
    cancel_seen: bool = False  # the database asked to cancel this job
    fenced: bool = False  # its lease is (or may be) gone: killed, whatever stopped it first
    usage: protocol.Usage | None = None  # the child's latest figures for it
    # A hand-back (drain --hand-back) asked its handler to stop (job.stop_requested): a
    # JobInterrupted it raises is a release; at hand_back_at (monotonic) it is stopped and
    # released whatever it does (None: no hand-back pending, or lifted by a resume).
    stop_asked: bool = False
    hand_back_at: float | None = None

    @property
    def name(self) -> str:
        return f"job {self.job.id} {self.job.handler} attempt {self.job.attempt}"

    @property
    def timeout(self) -> float | None:
        """The job's own timeout (enqueued with one, schema 27), else its handler's."""
        if self.job.timeout_seconds is not None:
            return self.job.timeout_seconds
        return self.handler.timeout

    def limits(self) -> Iterator[float]:
        """The times at which this job's limits next need a look."""
        if not self.fenced:  # once acted on, the passed deadline is no deadline
            yield self.deadline
        if self.kill_at is not None:
            yield self.kill_at
        if self.hand_back_at is not None and self.stop_reason is None:
            yield self.hand_back_at
        if self.started_at is not None and self.stop_reason is None:
            if self.timeout is not None:
                yield self.started_at + self.timeout
            if self.handler.heartbeat_timeout is not None:
                yield self.last_beat + self.handler.heartbeat_timeout


def decide(
    job: InFlight,
    report: Report | None,
    exit_description: str,
    draining: bool,
    worker: WorkerConfig,
) -> Outcome:
    """The outcome of a finished attempt, from the child's report (None if it died
    without one) and why the daemon stopped it, if it did. A reported result always wins."""
    duration = time.monotonic() - (job.started_at or job.claimed_at)
    h, reason = job.handler, job.stop_reason
    kind, error, result = OutcomeKind.FAIL, "", None
    snooze: float | None = None
    wait: tuple[str, float, str | None] | None = None
    follow_ups: list[Any] | None = None
    # the handler stopped itself (JobInterrupted) after a drain, hand-back or cancel request
    interrupted = isinstance(report, Interrupted)
    if isinstance(report, Done):
        kind, result, follow_ups = OutcomeKind.COMPLETE, report.result, report.then
    elif (reason is not None and reason.hands_back) or (
        interrupted and (draining or job.stop_asked)
    ):
        kind = OutcomeKind.RELEASE
    elif reason is StopReason.CANCEL or (interrupted and job.cancel_seen):
        kind, error = OutcomeKind.CANCEL, "cancelled while running"
    elif reason is StopReason.LEASE_LOST:
        error = "stopped: the lease could not be renewed in time"
    elif reason is StopReason.TIMEOUT:
        error = f"timed out after {format_duration(job.timeout or 0)}"
    elif reason is StopReason.STUCK:
        error = f"no heartbeat for {format_duration(h.heartbeat_timeout or 0)}: stuck"
    elif isinstance(report, Failed) and report.wait is not None:
        kind, error, wait = chosen_wait(report)
    elif isinstance(report, Failed):
        kind, error, snooze = chosen_outcome(report, h)
    elif isinstance(report, Interrupted):
        error = f"interrupted from outside the daemon: {report.error}"
    else:
        error = f"child process {exit_description or 'vanished'}"
    if (
        reason in (StopReason.TIMEOUT, StopReason.STUCK)
        and isinstance(report, Failed | Interrupted)
        and report.traceback
    ):
        error += "\n" + report.traceback
    backoff = (
        h.backoff if h.backoff is not None else worker.backoff,
        h.backoff_max if h.backoff_max is not None else worker.backoff_max,
    )
    return Outcome(
        job.job,
        h,
        kind,
        duration,
        result,
        storable_text(error),  # whatever the child sent, text the row can hold
        job.progress,
        job.checkpoint if job.unsaved else None,
        backoff,
        snooze=snooze,
        wait=wait,
        follow_ups=follow_ups or None,
    )


def chosen_wait(report: Failed) -> tuple[OutcomeKind, str, tuple[str, float, str | None] | None]:
    """(kind, error, (name, timeout seconds, key)) of a WaitFor report, checked again here
    (a child runs arbitrary code): a bad one is a failed attempt that says why."""
    w = report.wait
    if not isinstance(w, dict):
        return OutcomeKind.FAIL, "WaitFor: the child sent a wait that is not an object", None
    problem, seconds = wait_problem(w.get("name"), w.get("timeout"), w.get("key"))
    if problem is not None:
        return OutcomeKind.FAIL, problem, None
    return OutcomeKind.WAIT, report.error, (w["name"], seconds, w.get("key"))


def chosen_outcome(report: Failed, h: HandlerConfig) -> tuple[OutcomeKind, str, float | None]:
    """(kind, error, snooze seconds) of a handler's failure report: a snooze or a give-up
    it raised, an exception type its no_retry names, or else a failed attempt. What the
    child sent is checked again here (a child runs arbitrary code)."""
    detail = "\n" + report.traceback if report.traceback else ""
    if report.snooze is not None:
        problem = snooze_problem(report.snooze)
        if problem is not None:
            return OutcomeKind.FAIL, problem + detail, None
        return OutcomeKind.SNOOZE, report.error, float(report.snooze)
    if report.give_up is not None:
        return OutcomeKind.GIVE_UP, report.give_up, None
    matched = next((t for t in report.exception_types or () if t in h.no_retry), None)
    if matched is not None:
        return (
            OutcomeKind.GIVE_UP,
            f"{report.error}\n(not retried: {matched} is in no_retry of handler {h.name}){detail}",
            None,
        )
    return OutcomeKind.FAIL, report.error + detail, None


def report(
    batch: Sequence[Outcome],
    recorded: Sequence[finish.Recorded],
    metrics: NullMetrics | None = None,
) -> None:
    """Log (and count) what became of a batch the database was given (queue.finish.
    record or complete_and_claim, in `batch`'s order). A snooze written as a failed attempt
    becomes one here too (kind and error), so a write repeated later is that failure's."""
    for o, r in zip(batch, recorded, strict=True):
        o.kind, o.error = OutcomeKind(r.kind), r.error
        if r.retry_in is not None:
            o.retry_in = r.retry_in
        if r.follow_up_ids is not None:
            o.follow_up_ids = r.follow_up_ids
        message = (
            f"{o.name}: {o.kind} already recorded by an earlier write"
            if r.earlier
            else _message(o, r)
        )
        _report(metrics, o, r.landed, message)


def _message(o: Outcome, r: finish.Recorded) -> str:
    took = f"{o.duration:.2f}s"
    first = o.error.splitlines()[0] if o.error else ""
    if o.kind is OutcomeKind.COMPLETE:
        if r.follow_up_ids:
            ids = ", ".join(str(i) for i in r.follow_up_ids[:10])
            more = f" and {len(r.follow_up_ids) - 10} more" if len(r.follow_up_ids) > 10 else ""
            return f"{o.name}: completed in {took}; follow-ups {ids}{more}"
        return f"{o.name}: completed in {took}"
    if o.kind is OutcomeKind.RELEASE:
        return f"{o.name}: released after {took} (attempt not counted)"
    if o.kind is OutcomeKind.CANCEL:
        return f"{o.name}: cancelled after {took}"
    if o.kind in (OutcomeKind.BURY, OutcomeKind.GIVE_UP):
        who = "the handler gave up" if o.kind is OutcomeKind.GIVE_UP else "cannot run"
        return f"{o.name}: dead at once ({who}): {first}"
    due = (
        f"at {r.run_at:%H:%M:%S}"
        if r.status == "pending" and r.run_at is not None
        else f"now {r.status}"
    )
    if o.kind is OutcomeKind.WAIT and o.wait is not None:
        if r.status == "suspended":
            until = f"{r.wait_until:%Y-%m-%d %H:%M:%S}" if r.wait_until else "?"
            return f"{o.name}: suspended, waiting for signal {o.wait[0]!r} until {until}"
        if r.status == "pending":
            return f"{o.name}: signal {o.wait[0]!r} had come already: pending again at once"
        return f"{o.name}: waited for signal {o.wait[0]!r}; now {r.status}"
    if o.kind is OutcomeKind.SNOOZE:
        again = f"runs again {due}" if due.startswith("at ") else due
        return f"{o.name}: snoozed for {o.snooze or 0.0:g}s (snooze {r.snoozes}); {again}"
    retry = f"retry {due}" if due.startswith("at ") else due
    return f"{o.name}: failed after {took}: {first or 'failed'}; " + (retry if r.landed else "")


def _report(metrics: NullMetrics | None, o: Outcome, ok: bool, message: str) -> None:
    if metrics is not None:
        metrics.outcome(o.job.handler, o.kind, ok)
    if ok:
        level = (
            logging.ERROR
            if o.kind in (OutcomeKind.BURY, OutcomeKind.GIVE_UP)
            else logging.WARNING
            if o.kind is OutcomeKind.FAIL
            else logging.INFO
        )
        (job_events if o.kind is OutcomeKind.COMPLETE else log).log(
            level, "%s", message, extra=o.fields(o.kind)
        )
    else:
        log.warning(
            "%s: outcome %s rejected: the lease was lost and the job re-claimed (fenced off)",
            o.name,
            o.kind,
            extra=o.fields("fenced"),
        )


# An outcome whose write fails this often (with the database up) is dropped; the job's
# lease then expires and the claim rescues it.
MAX_OUTCOME_WRITES = 3
# While a claim is on its way (hold_completions), completions wait for it at most this
# long (seconds) rather than pay a commit of their own: with [worker] prefetch a busy
# daemon claims when half the prefetch is free, and writing each turn's completions alone
# in between was half its commits.
COMPLETION_LINGER = 0.01


class OutcomeWriter:
    """Keeps finished attempts' outcomes until the database takes them: all completions
    in one statement, the other outcomes one by one; kept in memory while the database is
    away (they are fenced by the lease token whenever they land)."""

    def __init__(
        self,
        write: Callable[[list[Outcome]], bool | None],
        database_up: Callable[[], bool],
        on_retry_due: Callable[[float], None],
        clock: Callable[[], float] = time.monotonic,
        on_written: Callable[[list[Outcome]], None] = lambda batch: None,
        hold_completions: Callable[[], bool] = lambda: False,
    ) -> None:
        self.write = write  # None: the write failed
        self.database_up = database_up
        self.on_retry_due = on_retry_due  # a failed job's retry is due at this time
        self.clock = clock
        self.on_written = on_written  # outcomes the database took (fenced ones too)
        # a claim that will carry completions comes soon (Claimer.claiming_soon)
        self.hold_completions = hold_completions
        self.pending: deque[Outcome] = deque()
        self._oldest_held: float | None = None  # when the oldest completion waiting came

    def add(self, outcome: Outcome) -> None:
        if not self.pending:
            self._oldest_held = self.clock()
        self.pending.append(outcome)

    def __len__(self) -> int:
        return len(self.pending)

    def holds(self, job_id: int) -> bool:
        """An outcome of this job waits here, unwritten."""
        return any(o.job.id == job_id for o in self.pending)

    def completions(self) -> list[Outcome]:
        """The completions a claim may carry (Claimer: one transaction for both); none
        after a failed write, which the writer retries one outcome at a time."""
        if any(o.failed_writes for o in self.pending):
            return []
        # (a completion with follow-ups is written right after the claim, by its own
        # statement: the claim's transaction keeps the cost it has without them)
        return [o for o in self.pending if o.kind is OutcomeKind.COMPLETE and not o.follow_ups]

    def carried(self, batch: list[Outcome]) -> None:
        """`batch` (from completions()) was written along with a claim."""
        for o in batch:
            self.pending.remove(o)
        self._oldest_held = self.clock() if self.pending else None
        self.on_written(batch)

    def _lingering(self, now: float) -> bool:
        """Whether the completions waiting (and nothing else) wait for the claim that is
        coming, for at most COMPLETION_LINGER."""
        return (
            self._oldest_held is not None
            and now < self._oldest_held + COMPLETION_LINGER
            and all(
                o.kind is OutcomeKind.COMPLETE and not o.follow_ups and not o.failed_writes
                for o in self.pending
            )
            and self.hold_completions()
        )

    def write_then_claim(self, now: float, claim: Callable[[float], None]) -> None:
        """One loop turn's writes and claim, in the order correctness needs.

        The rule: every outcome but a completion is written before the claim; completions
        go with the claim (it takes them with completions() and gives back what it wrote
        with carried(): one commit for a finish and the next jobs), and whatever the claim
        did not carry (no claim was due, it failed, or a failed write made the writer go
        one at a time) is written right after it. Why before: an outcome written after a
        claim that took its job again (the database lost an acknowledged write and gave
        the same lease token out again) would end the new attempt's lease. A completion
        is safe with the claim: it is written first in the same transaction, and the
        claim skips a job whose outcome still waits here (holds())."""
        self.tick(now, completions_too=False)
        claim(now)
        self.tick(now)

    def tick(self, now: float, *, completions_too: bool = True) -> None:
        """Write what waits. completions_too=False writes the other outcomes only (the
        loop does that before a claim, which carries the completions)."""
        if completions_too and self._lingering(now):
            return  # the claim carries them (next_deadline: written alone at the latest)
        while self.database_up():
            waiting = [
                o for o in self.pending if completions_too or o.kind is not OutcomeKind.COMPLETE
            ]
            if not waiting:
                return
            completions = [o for o in waiting if o.kind is OutcomeKind.COMPLETE]
            # After a failed write, one at a time: a value the database refuses must
            # cost only its own job's outcome, not the whole batch's.
            batch = (
                completions
                if completions and not any(o.failed_writes for o in self.pending)
                else [waiting[0]]
            )
            if self.write(batch) is None:
                if not self.database_up():
                    return  # kept: written when the database is back
                for o in batch:
                    o.failed_writes += 1
                if batch[0].failed_writes < MAX_OUTCOME_WRITES:
                    return  # e.g. a statement timeout: try again next tick
                log.error(
                    "giving up recording the outcome of job(s) %s; they run again when "
                    "their leases expire",
                    ", ".join(str(o.job.id) for o in batch),
                )
            else:
                self.on_written(batch)
            for o in batch:
                self.pending.remove(o)
                if not self.pending:
                    self._oldest_held = None
                if o.retry_in is not None:
                    # Wake for the retry when it is due, not at the next poll.
                    self.on_retry_due(self.clock() + max(0.0, o.retry_in))

    def next_deadline(self) -> float | None:
        # written every tick while the database is up, but completions that wait for a
        # claim: at the end of their linger
        if self._oldest_held is not None and self._lingering(self.clock()):
            return self._oldest_held + COMPLETION_LINGER
        return None
