"""A job child: runs handler code for the parent, one job at a time.

The main thread runs the handler. A monitor thread reads the parent's messages (jobs,
lease deadlines, cancel and shutdown requests) from the child's socket, and keeps the
process title and the job's figures current. The watcher
(pgworkerd.worker.watcher), a process of its own outside this interpreter, enforces the
lease and the memory limit: if the deadline passes without a renewal, or the parent
vanishes mid-job, it stops every process of the job, even while the handler holds the
GIL, so a frozen or dead parent can never leave a job running after its lease ran out
(another host may be running it by then).

The child is a subreaper (pgworkerd.worker.reaper): whatever the handler starts stays in
its tree, and is killed at the end of every attempt, however the attempt ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import importlib
import inspect
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any

from setproctitle import setproctitle

from pgworkerd import typed
from pgworkerd.jsontext import storable_json, storable_text
from pgworkerd.worker import (
    aiorun,
    aiosession,
    identity,
    outcomes,
    protocol,
    reaper,
    tmpdirs,
    watcher,
)
from pgworkerd.worker.capture import Capture
from pgworkerd.worker.outcomes import (
    GiveUp,
    Snooze,
    WaitFor,
    exception_types,
    snooze_problem,
    wait_problem,
)
from pgworkerd.worker.protocol import (
    Beat,
    Cancel,
    Done,
    Exit,
    Failed,
    Hello,
    Interrupted,
    Job,
    LeaseExtended,
    Report,
    Shutdown,
    Started,
    Stop,
    Usage,
)
from pgworkerd.worker.resources import Figures, Meter
from pgworkerd.worker.wire import FrameReader, FrameTooLarge

PR_SET_PDEATHSIG = 1
# Sent by the kernel when the daemon dies. Not SIGKILL: the child must live long enough
# to kill what the handler started (a SIGKILLed child's orphans would go to init).
PARENT_DEATH_SIGNAL = signal.SIGRTMIN + 5
# How often the monitor wakes to check the lease and refresh the title.
_MONITOR_TICK = 0.2
# How long a child whose daemon is gone waits for its watcher to stop its job (at once, as
# a rule: _daemon_gone) before it stops the job itself.
_WATCHER_FENCE_WAIT = 5.0
# The watcher's pidfd (readable once it has exited), for _daemon_gone; set in main.
_watcher_exit: int | None = None
# Progress-only heartbeats are coalesced to at most one message per this interval.
_BEAT_INTERVAL = 0.25


def _check_storable(value: Any) -> None:
    """Raise (in the handler, not later in the daemon) for a value the job row cannot hold:
    not JSON-serialisable, or with a string jsonb rejects (a NUL character, a lone
    surrogate)."""
    storable_json(value)


class JobInterrupted(BaseException):
    """Raised inside the handler when the daemon stops the job (SIGTERM to the child):
    drain timeout, timeout, cancellation or a lost lease. Catch it only to clean up.

    A handler may raise it itself when it sees `job.stop_requested`: during a drain the
    job is then handed back (released, the attempt not counted), after a cancel it is
    cancelled, and otherwise it is a failed attempt."""


class Signal:
    """The signal that woke a job from its wait (JobContext.signal): its name, its payload
    (any JSON value, None if it had none) and when it was sent (ISO 8601 text)."""

    __slots__ = ("name", "payload", "sent_at")

    def __init__(self, name: Any, payload: Any, sent_at: Any) -> None:
        self.name: str = str(name)
        self.payload: Any = payload
        self.sent_at: str | None = None if sent_at is None else str(sent_at)

    def __repr__(self) -> str:
        return f"Signal(name={self.name!r}, payload={self.payload!r}, sent_at={self.sent_at!r})"


class JobContext:
    """What a handler receives: the job, and a way to report progress.

    A handler is a plain function `def handler(job: JobContext) -> JSON value`, or an
    `async def` one (run in an event loop of the child: pgworkerd.worker.aiorun).
    """

    def __init__(self, channel: _Channel, job: Job) -> None:
        self._channel = channel
        self.id: int = job.id
        self.handler: str = job.handler
        self.queue: str = job.queue
        self.payload: dict[str, Any] = job.payload
        self.attempt: int = job.attempt
        self.max_attempts: int = job.max_attempts
        #: The checkpoint saved by an earlier attempt (None on a fresh start).
        self.checkpoint: Any = job.checkpoint
        #: Its parents' results by parent id (docs/guide/dependencies.md): each result, or
        #: None for a parent that did not complete (on_parent_failure "run") or was pruned.
        #: Empty for a job without parents.
        self.parents: dict[int, Any] = {int(k): v for k, v in (job.parents or {}).items()}
        #: This attempt's lease token: pass it with the job's id to job_lease_assert in
        #: the application's own transaction, so that its writes commit only while this
        #: attempt still holds the job (docs/guide/exactly-once.md). A capability: never
        #: log or show it. None only under a daemon older than schema 29.
        self.lease_token: int | None = job.lease_token
        #: A batch callback's batch (docs/guide/batches.md): {"id", "members",
        #: "completed", "dead", "cancelled", "outcomes": [{"id", "status", "result",
        #: "error"}, ...] for its first 100 members by id, "outcomes_complete"}; page the
        #: rest with pgworkerd.batch_members. None for any other job.
        self.batch: dict[str, Any] | None = job.batch if isinstance(job.batch, dict) else None
        self._last_beat = 0.0
        self._pending_progress: Any = None
        woken = job.woken if isinstance(job.woken, dict) else None
        #: The signal name of the job's last wait (raise pgworkerd.WaitFor), None if it
        #: never waited. With `signal` None it ended by its timeout.
        self.waited_for: str | None = woken.get("name") if woken else None
        #: The signal that ended the last wait (name, payload, sent_at), None if it never
        #: waited or its wait timed out.
        self.signal: Signal | None = (
            Signal(woken.get("name"), woken.get("payload"), woken.get("sent_at"))
            if woken and woken.get("ended") == "signal"
            else None
        )

    @property
    def cancel_requested(self) -> bool:
        """Someone ran `pgworkerd cancel` on this job: return or raise soon."""
        return self._channel.cancel_requested or self.id in self._channel.cancel_jobs

    @property
    def shutdown_requested(self) -> bool:
        """The daemon is draining or hands this job back: a long job may save a checkpoint
        and stop early (raise JobInterrupted: the job is released, the attempt not
        counted)."""
        return self._channel.shutdown_requested or self.id in self._channel.shutdown_jobs

    @property
    def stop_requested(self) -> bool:
        return self.cancel_requested or self.shutdown_requested

    def heartbeat(self, progress: Any = None, checkpoint: Any = None) -> None:
        """Tell the daemon the job is alive, optionally with progress (any JSON value,
        shown in `pgworkerd status`) and a checkpoint (handed to the next attempt if this
        one fails). Both must be JSON-serialisable; saving is throttled."""
        if progress is not None:
            _check_storable(progress)  # fail in the handler, not later
        if checkpoint is not None:
            _check_storable(checkpoint)
            self.checkpoint = checkpoint
        message = Beat(self.id, progress, checkpoint)
        now = time.monotonic()
        if checkpoint is None and now - self._last_beat < _BEAT_INTERVAL:
            self._channel.set_pending_beat(message)
            return
        self._last_beat = now
        self._channel.send(message)


class _Channel:
    """The socket to the parent, shared by the handler thread and the monitor (which reads
    it; both write to it, as the watcher does, under the send lock)."""

    def __init__(self, sock: socket.socket, fence: watcher.Watcher) -> None:
        # Blocking, with no timeout: a frozen parent that reads nothing blocks a chatty
        # handler's heartbeat until it thaws (the watcher fences at the lease deadline),
        # it does not fail the job.
        self.sock = sock
        self.watcher = fence
        self._lock = threading.Lock()
        self.jobs: queue.Queue[Job | None] = queue.Queue()
        self.cancel_requested = False
        # jobs asked to cancel by id, in a child that runs jobs side by side (aiosession)
        self.cancel_jobs: set[int] = set()
        # the jobs a concurrent session runs (pgworkerd.worker.aiosession), while it runs;
        # the monitor hands it their messages
        self.session: Any = None
        self.shutdown_requested = False
        # jobs asked to stop by id (a hand-back): one may be asked right behind its Job
        # message, before it runs; a few at most (a hostile count is capped)
        self.shutdown_jobs: set[int] = set()
        self.deadline: float | None = None  # time.monotonic() when the lease runs out
        self.title = "pgworkerd: idle child"
        self.job_started = 0.0
        self.job_id: int | None = None  # the job running now
        # progress-only beats not sent yet, by job (one job, or a session's jobs)
        self._pending_beats: dict[int | None, Beat] = {}
        # the running job's measurements (pgworkerd.worker.resources)
        self.meter: Meter | None = None
        self.usage_sent_peak = 0  # the peak the parent was last told of
        self.jobs_run = 0
        # (the event loop, its thread) while a concurrent session runs: see coalesce()
        self._coalescing: tuple[Any, int] | None = None
        self._held: list[bytes] = []  # frames the loop's thread sent, not written yet

    def send(self, message: protocol.ChildMessage) -> None:
        data = protocol.encode(message)
        if isinstance(message, Beat):
            with self._lock:
                self._pending_beats.pop(message.id, None)
        self.send_encoded(data)

    def send_encoded(self, frame: bytes) -> None:
        if self._coalescing is not None and threading.get_ident() == self._coalescing[1]:
            # the event loop's thread: held until its callbacks so far have run
            with self._lock:
                self._held.append(frame)
                if len(self._held) > 1:
                    return  # its flush is scheduled already
            self._coalescing[0].call_soon(self.send_held)
            return
        with self._lock, self.watcher.locked():
            # (anything the loop's thread holds goes first: each job's messages keep
            # their order)
            self.sock.sendall(b"".join((*self._held, frame)))
            self._held.clear()

    def coalesce(self, loop: Any) -> None:
        """While a concurrent session's event loop runs (`loop`; None: it has ended), what
        its thread sends waits until the callbacks that the loop has ready have run, then
        goes in one write: a child running many short jobs side by side wakes the daemon
        once for their starts and outcomes, not once per message. A message from another
        thread sends what is held first, so a loop held by a blocking call lets it go
        when the watchdog reports the block (aiorun.BLOCKED_AFTER). Ending it sends what
        is held."""
        self.send_held()
        self._coalescing = None if loop is None else (loop, threading.get_ident())

    def send_held(self) -> None:
        with self._lock, self.watcher.locked():
            if self._held:
                self.sock.sendall(b"".join(self._held))
                self._held.clear()

    def is_current(self, job_id: int | None) -> bool:
        """Whether a message about job `job_id` is about the job running now (None:
        about whatever runs, as a parent of release 0.2 sends them)."""
        session = self.session
        return (
            job_id is None
            or job_id == self.job_id
            or (session is not None and session.runs(job_id))
        )

    def set_pending_beat(self, message: Beat) -> None:
        with self._lock:
            self._pending_beats[message.id] = message

    def flush_pending_beat(self, job_id: int | None = None) -> None:
        """Send the pending beat of job `job_id` (None: of every job)."""
        with self._lock:
            if job_id is None:
                messages = list(self._pending_beats.values())
                self._pending_beats.clear()
            else:
                one = self._pending_beats.pop(job_id, None)
                messages = [] if one is None else [one]
        for message in messages:
            self.send(message)


def _fence(reason: str) -> None:
    """Stop this job now: the lease is gone or the parent is. Kill every process the
    handler started (whatever session or group it is in), then exit."""
    try:
        sys.stderr.write(f"pgworkerd child {os.getpid()}: {reason}; stopping\n")
        sys.stderr.flush()
    finally:
        try:
            reaper.kill_descendants()
            tmpdirs.remove_current()
        finally:
            os._exit(reaper.FENCED_EXIT)


def _parent_died(signum: int, frame: Any) -> None:
    # The monitor sees the socket's end first, as a rule; this covers a monitor thread
    # that is gone.
    _daemon_gone()


def _daemon_gone() -> None:
    """The daemon is gone while a job may run. The watcher, which sees its own socket end
    at the same moment, stops the job's tree: it freezes this process (every thread of
    it) before it walks the tree, so no thread of the handler can fork past the walk, as
    one could past a sweep made from here (the suspect of the chaos soak's rare process
    left behind). This waits for it, and stops the job itself only if the watcher does
    not (it had not read the job yet, or is gone)."""
    if _watcher_exit is not None:
        poller = select.poll()
        poller.register(_watcher_exit, select.POLLIN)
        with contextlib.suppress(OSError):
            poller.poll(int(_WATCHER_FENCE_WAIT * 1000))
    _fence("the daemon is gone")


def _monitor(channel: _Channel, watcher_exit: int) -> None:
    """Reads the daemon's messages; `watcher_exit` (a pidfd) is readable once the watcher
    has died: without it no renewal reaches this child's fence."""
    reader = FrameReader()
    sock = channel.sock.fileno()
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    poller.register(watcher_exit, select.POLLIN)
    while True:
        try:
            ready = {fd for fd, _ in poller.poll(_MONITOR_TICK * 1000)}
            if watcher_exit in ready:
                poller.unregister(watcher_exit)
                if channel.deadline is not None:  # a job runs unfenced: stop it
                    _watcher_gone(channel)
                    _fence("the job child's watcher is gone")
                # (idle: it left because the daemon did, whose end is read next)
            data = os.read(sock, 65536) if sock in ready else None
            if data == b"":  # the daemon is gone
                if channel.deadline is not None:
                    _daemon_gone()
                channel.watcher.stop()
                os._exit(0)  # idle and orphaned: nothing to protect
            for frame in reader.feed(data or b""):
                message = protocol.decode(frame)
                if isinstance(message, Job):
                    channel.shutdown_jobs.discard(message.id)  # a stale ask of an earlier run
                    channel.cancel_jobs.discard(message.id)
                    if message.concurrency:  # to the running session, if any
                        aiosession.submit(channel, message)
                    else:
                        channel.jobs.put(message)
                        aiosession.nudge(channel)  # (a session running ends for it)
                elif isinstance(message, Stop):
                    aiosession.stop(channel, message.id)
                # (a lease or cancel sent for a job that has ended here meanwhile is
                # ignored: it must not fence or cancel the next one)
                elif isinstance(message, LeaseExtended):
                    if channel.is_current(message.id):
                        channel.deadline = message.deadline
                elif isinstance(message, Cancel):
                    if channel.session is not None and message.id is not None:
                        if channel.is_current(message.id):
                            channel.cancel_jobs.add(message.id)
                    elif channel.is_current(message.id):
                        channel.cancel_requested = True
                elif isinstance(message, Shutdown):
                    if message.id is None:
                        channel.shutdown_requested = True
                    elif len(channel.shutdown_jobs) < 64:
                        channel.shutdown_jobs.add(message.id)
                elif isinstance(message, Exit):
                    channel.jobs.put(None)
                    aiosession.nudge(channel)
        except OSError:
            # An uncaught error here would end this thread: treated as the end.
            if channel.deadline is not None:
                _daemon_gone()
            channel.watcher.stop()
            os._exit(0)
        if channel.deadline is not None:
            try:
                _measure(channel)
            except Exception as exc:  # never at the cost of the lease check above
                channel.meter = None
                print(f"pgworkerd child: measuring the job failed: {exc!r}", file=sys.stderr)
            elapsed = int(time.monotonic() - channel.job_started)
            setproctitle(f"{channel.title} {elapsed}s")
            channel.flush_pending_beat()


def _watcher_gone(channel: _Channel) -> None:
    """The watcher died while a job runs (killed by the handler: it is a child of this
    process): say so in the attempt's report and stop, since without it no renewal
    reaches this child's fence."""
    killed_by = channel.watcher.killed_by()
    job_id = channel.job_id
    if job_id is None:
        return
    if killed_by is None:  # (a crash; or the daemon went before it had read the job)
        error = f"the job child's watcher (pid {channel.watcher.pid}) exited"
    else:
        error = (
            f"the job child's watcher (pid {channel.watcher.pid}) was killed by {killed_by}: "
            "a handler must not kill processes it did not start"
        )
    with contextlib.suppress(OSError):
        channel.send(Failed(job_id, error))
    _fence(error)


def _measure(channel: _Channel) -> None:
    """Sample the job's tree when due: tell the parent of a peak that grew (a job killed
    later keeps a figure). (The memory limit is the watcher's.)"""
    meter, job_id = channel.meter, channel.job_id
    if meter is None or job_id is None or not meter.due(time.monotonic()):
        return
    meter.sample()
    if meter.peak > channel.usage_sent_peak * 1.1:
        channel.usage_sent_peak = meter.peak
        channel.send(_usage(job_id, meter.figures(sample=False)))


def _usage(job_id: int, f: Figures) -> Usage:
    return Usage(job_id, f.cpu_user, f.cpu_system, f.peak_memory, f.child_memory)


def _bind_to_daemon(daemon_pid: int) -> None:
    """Wait until re-parented to the daemon (the middle process exits at once), then
    stop with it: PR_SET_PDEATHSIG fires when the parent exits, however it exits."""
    limit = time.monotonic() + 5
    while os.getppid() != daemon_pid:
        if time.monotonic() > limit:
            os._exit(70)
        time.sleep(0.0005)
    libc = ctypes.CDLL(None, use_errno=True)
    signal.signal(PARENT_DEATH_SIGNAL, _parent_died)
    libc.prctl(PR_SET_PDEATHSIG, PARENT_DEATH_SIGNAL, 0, 0, 0)
    if os.getppid() != daemon_pid:  # died before the prctl took effect
        os._exit(70)


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise JobInterrupted(f"stopped by the daemon ({signal.Signals(signum).name})")


def _run_one(
    channel: _Channel,
    job: Job,
    scratch_dir: str | None,
    capture: Capture | None,
    spans: Any = None,
) -> None:
    # (cancel/shutdown flags are cleared after a job, not before: a shutdown message can
    # arrive right behind the job message and must not be lost)
    channel.watcher.job_began()  # (with attempt cgroups: the child is in this one's)
    channel.title = f"pgworkerd: job {job.id} {job.handler} attempt {job.attempt}"
    channel.job_started = time.monotonic()
    channel.deadline = job.deadline
    channel.job_id = job.id
    channel.usage_sent_peak = 0
    watcher_only = frozenset({channel.watcher.pid})
    channel.meter = Meter(first_job=channel.jobs_run == 0, leave_out=watcher_only)
    channel.jobs_run += 1
    setproctitle(f"{channel.title} 0s")
    scratch = tmpdirs.enter(scratch_dir)
    if capture is not None:
        capture.enter()  # what the attempt prints goes to the daemon's job log
    ctx = JobContext(channel, job)
    outcome: Report
    attempt = None  # the attempt's span ([tracing] enabled: spans is a tracing.AttemptSpans)
    try:
        module_name, _, function = job.target.partition(":")
        # Preloaded by the fork server, so this is a dictionary look-up, not an import.
        func = getattr(importlib.import_module(module_name), function)
        channel.send(Started(job.id))
        if spans is not None:
            attempt = _trace_start(spans, job)
        # a typed payload (pgworkerd.typed), validated and passed: dead at once if not
        func = typed.bind(func, job.payload)
        result = func(ctx)
        if inspect.isawaitable(result):  # an async def handler: run in an event loop
            result = _run_awaitable(result)
        outcome = _returned(job.id, result)
    except BaseException as exc:  # the handler's failure, whatever it is, is the outcome
        outcome = _raised(channel, ctx, exc)
    # Ignore further SIGTERMs while cleaning up and reporting: the attempt's processes
    # must all go, and the outcome must reach the parent whole.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if attempt is not None:
        spans.leave(attempt)
    # Nothing the attempt started outlives it (before the outcome: once the daemon has
    # it, the job may run again elsewhere). Its temp directory goes after the outcome.
    if channel.meter is not None:
        # the tree's last peak, before the sweep below ends it
        with contextlib.suppress(OSError):
            channel.meter.sample()
    killed = reaper.kill_descendants(keep=watcher_only)
    tmpdirs.leave(scratch)
    if capture is not None:
        # Before the outcome: once the daemon has it, it reads the log to its end.
        capture.leave()
    try:
        frame = protocol.encode(outcome)
    except FrameTooLarge as exc:  # the attempt fails, saying why (not "exited with 70")
        what = "result" if isinstance(outcome, Done) else "error report"
        frame = protocol.encode(Failed(job.id, f"the {what} is too large to store: {exc}"))
    channel.flush_pending_beat()
    meter = channel.meter  # (None if measuring failed)
    figures = None
    if meter is not None:
        # what it cost, for the attempt's history: sampled again if the tree had more
        # than this process, now that it is gone, so the killed descendants' CPU counts
        # once (reaped: in RUSAGE_CHILDREN)
        with contextlib.suppress(OSError):
            figures = meter.figures(sample=killed > 0 or meter.live != 0)
            # sent with the outcome, in one write (one wake-up of the daemon)
            frame = protocol.encode(_usage(job.id, figures)) + frame
    channel.deadline = None
    channel.job_id = None
    channel.meter = None
    # Before the outcome: no fence for an ended job, and the attempt's cgroup killed and
    # gone ([worker] job_cgroups); then reap what that killed and was ours.
    channel.watcher.job_ended(job.id)
    if channel.watcher.cgroups:
        reaper.kill_descendants(keep=watcher_only)
    if attempt is not None:
        _trace_end(spans, attempt, outcome, figures)  # ended before the outcome is sent
    channel.send_encoded(frame)
    channel.cancel_requested = False
    channel.shutdown_jobs.discard(job.id)
    signal.signal(signal.SIGTERM, _raise_interrupted)
    channel.title = "pgworkerd: idle child"
    setproctitle(channel.title)
    if attempt is not None:
        spans.flush()  # after the outcome: the export is off the job's path


def _trace_start(spans: Any, job: Job) -> Any:
    """The attempt's span, current while the handler runs; None if tracing failed (said
    on stderr: telemetry never costs a job)."""
    try:
        return spans.start(job)
    except Exception as exc:
        print(f"pgworkerd child: starting the attempt's span failed: {exc!r}", file=sys.stderr)
        return None


def _trace_end(spans: Any, attempt: Any, outcome: Report, figures: Figures | None) -> None:
    try:
        spans.end(attempt, outcome, figures)
    except Exception as exc:
        print(f"pgworkerd child: ending the attempt's span failed: {exc!r}", file=sys.stderr)


def _returned(job_id: int, result: Any) -> Report:
    """The report of a handler that returned `result`."""
    then: list[Any] | None = None
    if isinstance(result, outcomes.Done):  # a result with follow-up jobs
        # (a bad one raises ValueError: the attempt fails with it, as if the handler had)
        result, then = result.result, _follow_ups(result.then)
    try:
        _check_storable(result)
        return Done(job_id, result, then or None)
    except (TypeError, ValueError) as exc:
        return Failed(
            job_id,
            storable_text(f"handler returned a value that cannot be stored as JSON: {exc}"),
        )


def _raised(channel: _Channel, ctx: JobContext, exc: BaseException) -> Report:
    """The report of a handler that raised `exc` (call it in the `except` block: the
    traceback is the one being handled)."""
    if isinstance(exc, JobInterrupted):
        # text PostgreSQL can store, for last_error
        return Interrupted(ctx.id, storable_text(str(exc)), storable_text(traceback.format_exc()))
    if isinstance(exc, Snooze):
        return _snoozed(ctx.id, exc)
    if isinstance(exc, WaitFor):
        return _waiting(channel, ctx, exc)
    if isinstance(exc, GiveUp):
        return Failed(
            ctx.id,
            storable_text(f"GiveUp: {exc.reason}"),
            storable_text(traceback.format_exc()),
            give_up=storable_text(exc.reason),
        )
    return Failed(
        ctx.id,
        storable_text(f"{type(exc).__name__}: {exc}"),
        storable_text(traceback.format_exc()),
        exception_types=[storable_text(n) for n in exception_types(exc)],
    )


def _run_awaitable(awaitable: Any) -> Any:
    """What an async handler's coroutine returns, run in an event loop
    (pgworkerd.worker.aiorun): a stop from the daemon ends it as JobInterrupted."""
    return aiorun.run(awaitable, JobInterrupted, _say)


def _say(line: str) -> None:
    """A line of the child's own in the attempt's output (its job log)."""
    with contextlib.suppress(Exception):
        sys.stderr.write(line.rstrip("\n") + "\n")
        sys.stderr.flush()


def _run_concurrent(
    channel: _Channel,
    first: Job,
    scratch_dir: str | None,
    capture: Capture | None,
    spans: Any = None,
) -> int:
    """Run an async handler's jobs side by side, `first` and those the daemon hands over
    meanwhile (pgworkerd.worker.aiosession); returns how many ran. With [tracing] each
    job's attempt is a span of its own, current in its own task only (no resource
    figures: the jobs share the process); the spans are flushed when the session ends."""
    channel.title = f"pgworkerd: async jobs of {first.handler}"
    channel.job_started = time.monotonic()
    channel.deadline = first.deadline  # (a job runs: the monitor fences if the daemon goes)
    channel.job_id = None
    channel.meter = None  # the jobs share the process: no figures per job
    channel.jobs_run += 1
    setproctitle(f"{channel.title} 0s")
    scratch = tmpdirs.enter(scratch_dir)  # one TMPDIR for the session's jobs
    restore = aiosession.route_output(channel.send) if capture is not None else None
    if capture is not None:
        capture.enter()
    runner = aiosession.Runner(
        context=lambda job: JobContext(channel, job),
        returned=_returned,
        raised=lambda ctx, exc: _raised(channel, ctx, exc),
        finish=lambda job, outcome, last: _finish_concurrent(channel, job, outcome, last),
        interrupted=JobInterrupted,
        send=channel.send,
    )
    if spans is not None:
        runner = dataclasses.replace(
            runner,
            trace_start=lambda job: _trace_start(spans, job),
            trace_end=lambda attempt, outcome: _trace_concurrent_end(spans, attempt, outcome),
        )
    try:
        ran = aiosession.run(channel, first, runner)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        reaper.kill_descendants(keep=frozenset({channel.watcher.pid}))
        tmpdirs.leave(scratch)
        if capture is not None:
            capture.leave()
        if restore is not None:
            restore()
        channel.deadline = None
        channel.cancel_requested = False
        signal.signal(signal.SIGTERM, _raise_interrupted)
        channel.title = "pgworkerd: idle child"
        setproctitle(channel.title)
    if spans is not None:
        spans.flush()  # after the outcomes: the export is off the jobs' path
    return ran


def _trace_concurrent_end(spans: Any, attempt: Any, outcome: Report) -> None:
    """End a concurrent job's attempt span (in its own task, which made it current)."""
    try:
        spans.leave(attempt)
    except Exception as exc:
        print(f"pgworkerd child: leaving the attempt's span failed: {exc!r}", file=sys.stderr)
    _trace_end(spans, attempt, outcome, None)


def _finish_concurrent(channel: _Channel, job: Job, outcome: Report, last: bool) -> None:
    """Report one job of a concurrent session: its last beat, the watcher told (no fence
    for it from now on), what the session started killed if it was the last job, then
    the outcome."""
    try:
        frame = protocol.encode(outcome)
    except FrameTooLarge as exc:  # the attempt fails, saying why
        what = "result" if isinstance(outcome, Done) else "error report"
        frame = protocol.encode(Failed(job.id, f"the {what} is too large to store: {exc}"))
    channel.flush_pending_beat(job.id)
    channel.watcher.job_ended(job.id)
    if last:
        reaper.kill_descendants(keep=frozenset({channel.watcher.pid}))
    channel.send_encoded(frame)
    channel.cancel_jobs.discard(job.id)
    channel.shutdown_jobs.discard(job.id)


def _follow_ups(then: Any) -> list[Any]:
    """The follow-ups of a returned Done as job objects; raises ValueError saying what is
    wrong (the attempt fails with it)."""
    specs = outcomes.follow_ups_json(then, protocol.MAX_FOLLOW_UPS)
    for spec in specs:
        _check_storable(spec)  # a payload jsonb refuses: here, not in the daemon
    return specs


def _snoozed(job_id: int, exc: Snooze) -> Failed:
    """The report of a Snooze: a failure to a daemon of release 0.2, a snooze to this
    release's; a snooze of a bad length is a plain failed attempt that says why."""
    problem = snooze_problem(exc.seconds)
    tb = storable_text(traceback.format_exc())
    if problem is not None:
        return Failed(job_id, storable_text(problem), tb)
    return Failed(job_id, storable_text(f"Snooze: {exc}"), tb, snooze=float(exc.seconds))


def _waiting(channel: _Channel, ctx: JobContext, exc: WaitFor) -> Failed:
    """The report of a WaitFor: a failure to a daemon that does not know waits, a wait to
    this release's (its checkpoint sent first as a heartbeat, so the daemon saves it with
    the suspension); a bad WaitFor is a plain failed attempt that says why."""
    tb = storable_text(traceback.format_exc())
    problem, seconds = wait_problem(exc.name, exc.timeout, exc.key)
    if problem is None and exc.checkpoint is not None:
        try:
            _check_storable(exc.checkpoint)
            channel.send(Beat(ctx.id, None, exc.checkpoint))
        except (TypeError, ValueError, RecursionError) as bad:  # FrameTooLarge: a ValueError
            problem = f"WaitFor checkpoint cannot be stored: {bad}"
        else:
            ctx.checkpoint = exc.checkpoint
    if problem is not None:
        return Failed(ctx.id, storable_text(problem), tb)
    wait = {"name": exc.name, "timeout": seconds, "key": exc.key}
    return Failed(ctx.id, storable_text(f"WaitFor: {exc}"), tb, wait=wait)


def main(fd: int, daemon_pid: int, settings: dict[str, Any], watch_fd: int) -> None:
    """Entry point in the freshly forked child, which talks to the daemon over `fd` (its
    watcher over `watch_fd`); never returns."""
    status = 0
    fence: watcher.Watcher | None = None
    try:
        # Close-on-exec: no handler subprocess (close_fds=False, os.system, a shell)
        # may hold the daemon's socket, or the daemon would see no end when we exit.
        os.set_inheritable(fd, False)
        os.set_inheritable(watch_fd, False)
        # the output file exists before the daemon learns our pid (pgworkerd.worker.capture);
        # made before the drop below: the daemon's directory is root's
        capture = Capture.open(settings.get("tmpdir")) if settings.get("capture_logs") else None
        tmp_root = settings.get("tmpdir")
        reaper.become_subreaper()  # every process the handler starts stays below us
        os.setpgid(0, 0)  # own group: the daemon's SIGTERM reaches handler subprocesses too
        signal.signal(signal.SIGTERM, _raise_interrupted)
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        setproctitle("pgworkerd: idle child")
        # The watcher (pgworkerd.worker.watcher) before any thread runs here, and before
        # the drop below: it keeps this process's uid, so a job of a uid of its own can
        # neither stop it nor escape it, and it may still signal the job's processes.
        fence = watcher.start(fd, watch_fd, tmp_root, settings.get("cgroup"))
        global _watcher_exit
        watcher_exit = _watcher_exit = os.pidfd_open(fence.pid)  # (before a drop of uid)
        if settings.get("job_uid") is not None:  # [worker] job_uids: before any handler code
            tmp_root = identity.become(int(settings["job_uid"]), tmp_root)
        else:
            # (the fork server is not dumpable, and so were we, so that the watcher is
            # not: a job may not open its descriptors, the daemon's stderr among them)
            identity.set_dumpable(True)
        if capture is not None:
            capture.seal()  # the daemon's stdout and stderr are closed here from now on
        _bind_to_daemon(daemon_pid)  # (after the drop: a change of uid clears PDEATHSIG)
        channel = _Channel(socket.socket(fileno=fd), fence)
        channel.send(Hello(os.getpid()))
        threading.Thread(target=_monitor, args=(channel, watcher_exit), daemon=True).start()
        spans = None
        if settings.get("tracing"):  # pgworkerd.tracing: preloaded by the fork server
            from pgworkerd import tracing

            spans = tracing.child_spans(settings)  # after the fork: threads of our own
        jobs = int(settings.get("max_jobs_per_child", 1))
        scratch_dir = tmpdirs.prepare(tmp_root)  # while no job waits on it
        n = 0
        while n < jobs:
            job = channel.jobs.get()
            if job is None:
                break
            if job.concurrency:  # an async handler's jobs, side by side
                # (such a child runs at least that many: the daemon counts so too)
                jobs = max(jobs, job.concurrency)
                n += _run_concurrent(channel, job, scratch_dir, capture, spans)
            else:
                _run_one(channel, job, scratch_dir, capture, spans)
                n += 1
            # the outcome is sent: off the job's path (the same directory if it is empty)
            scratch_dir = tmpdirs.renew(scratch_dir, tmp_root) if n < jobs else scratch_dir
        tmpdirs.remove(scratch_dir)
    except (BrokenPipeError, ConnectionResetError):
        # The daemon died while this child was telling it something: stop quietly, as
        # when the monitor sees it go (its jobs come back when their leases expire).
        print(f"pgworkerd child {os.getpid()}: the daemon is gone; stopping", file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        status = 70
    finally:
        # os._exit: interpreter shutdown of a forked heap costs tens of milliseconds and
        # could run the parent's atexit hooks; flush what the handler printed first.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        if fence is not None:
            fence.stop()
        os._exit(status)
