"""A child running an async handler's jobs side by side (`[handlers.X] concurrency = N`):
one event loop in the child's main thread, one task per job.

The daemon hands such a child up to N jobs of one handler at once (each its own Job
message, lease, deadline and outcome). The first starts a session (run); the monitor
thread hands the next ones to it (submit) while it runs; it ends LINGER after its last
job has ended if no other came meanwhile (at once if a job to run alone or an Exit
came: nudge), and the child is back to taking jobs one by one. (The linger keeps a
stream of short jobs in one session: a session's start and end, with its event loop,
watchdog thread and temp directory, cost more than a no-op job.)

Per job, as for a child's single job: a JobContext (progress, checkpoint, cancel and stop
requests by job id), Started, beats, the outcome (WaitFor, Done and follow-ups, Snooze,
GiveUp, failures). What differs, because the jobs share one process:

- A stop (timeout, cancel, hand-back, lost lease) is the daemon's Stop message for that
  job, not a SIGTERM: its task is cancelled (asyncio.CancelledError at its await) and it
  ends with JobInterrupted. A SIGTERM to the child stops them all.
- Output: what a job prints or logs through Python (print, sys.stdout, sys.stderr,
  logging, also from threads started with asyncio.to_thread, which copy its context) is
  attributed to it by a context variable and sent to the daemon as Output messages, a
  line at a time, for its job log. What is written to descriptors 1 and 2 directly (a
  subprocess, C code, os.write) cannot be attributed: it goes to the child's output
  file, which no job's log reads.
- A blocking call in one job holds the loop for all of them; the loop watchdog
  (pgworkerd.worker.aiorun.LoopWatchdog) writes to the blocking job's log how long and
  where, and to the others' that they were held.
- Processes a job starts are killed when the session's last running job ends (not at
  the end of each job: the child cannot tell whose they are). Figures (CPU, memory) are
  the child's, not a job's: none are reported per job.

Dependency-free: the job's child imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import inspect
import io
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pgworkerd.worker.aiorun import LoopWatchdog
from pgworkerd.worker.protocol import Job, Output, Report, Started

# The job whose code runs (each task's own context): output is attributed by it.
CURRENT_JOB: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "pgworkerd_current_job", default=None
)
# An Output message carries at most this many characters (a longer line: several).
OUTPUT_CHUNK = 16 * 1024
# Guards channel.session between the monitor (submit) and the main thread.
_LOCK = threading.Lock()
# How long a session with no job left waits for the next before it ends (seconds).
LINGER = 0.1


@dataclass(frozen=True)
class Runner:
    """What the child (pgworkerd.worker.child) does per job, given to the session."""

    context: Callable[[Job], Any]  # the job's JobContext
    returned: Callable[[int, Any], Report]  # the report of a returned value
    raised: Callable[[Any, BaseException], Report]  # of a raised one (in its except)
    finish: Callable[[Job, Report, bool], None]  # send it (True: the session's last job)
    interrupted: Callable[[str], BaseException]  # JobInterrupted(reason)
    send: Callable[[Any], None]  # a message to the daemon
    # [tracing]: the attempt's span, started in the job's own task (so current for its
    # coroutine alone: contextvars) and ended with its report; no tracing: None, nothing
    trace_start: Callable[[Job], Any] = lambda job: None
    trace_end: Callable[[Any, Report], None] = lambda attempt, report: None


def submit(channel: Any, job: Job) -> None:
    """(Monitor thread.) Hand `job` to the running session, or queue it for the main
    thread (which starts a session with it, or gives it to one starting)."""
    with _LOCK:
        session: Session | None = channel.session
        if session is not None and not session.closed:
            session.submitted.add(job.id)
            session.loop.call_soon_threadsafe(session.start, job)
            return
        channel.jobs.put(job)


def nudge(channel: Any) -> None:
    """(Monitor thread.) A job to run alone, or an Exit, was queued for the main thread:
    a running session ends as soon as it has no job left, without lingering."""
    session: Session | None = channel.session
    if session is not None and not session.closed:
        session.wanted = True
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            session.loop.call_soon_threadsafe(session.close_if_idle)


def stop(channel: Any, job_id: int) -> None:
    """(Monitor thread.) The daemon's Stop for one job of the session (ignored if it is
    not one of them: it ended meanwhile)."""
    session: Session | None = channel.session
    if session is not None and not session.closed:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            session.loop.call_soon_threadsafe(session.stop, job_id, "stopped by the daemon")


def run(channel: Any, first: Job, runner: Runner) -> int:
    """Run `first` and every job handed to the session meanwhile; returns how many."""
    session = Session(channel, runner)
    asyncio.run(session.main(first))
    return session.ran


class Session:
    def __init__(self, channel: Any, runner: Runner) -> None:
        self.channel, self.runner = channel, runner
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # main()
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.job_of: dict[asyncio.Task[Any], int] = {}
        self.submitted: set[int] = set()  # handed over, not started yet
        self.stopped: dict[int, str] = {}  # job id -> why
        self.closed = False
        self.ran = 0
        self._done: asyncio.Event | None = None
        self._blocker: int | None = None  # the job the watchdog last saw block
        self.wanted = False  # the main thread has something else to do (nudge)
        self._linger: asyncio.TimerHandle | None = None  # its end, while it has no job

    def runs(self, job_id: int) -> bool:
        return job_id in self.tasks or job_id in self.submitted

    async def main(self, first: Job) -> None:
        self.loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        with _LOCK:
            self.channel.session = self
            queued = _take_queued(self.channel)
        self.start(first)
        for job in queued:
            self.start(job)
        watchdog = LoopWatchdog(self.loop, threading.get_ident(), self._blocked)
        watchdog.start()
        coalesce = getattr(self.channel, "coalesce", None)
        if coalesce is not None:
            coalesce(self.loop)  # one write for what the jobs of a loop's turn send
        try:
            await self._done.wait()
        finally:
            if coalesce is not None:
                coalesce(None)  # what is held goes now
            watchdog.stop()
            signal.signal(signal.SIGTERM, previous)

    def start(self, job: Job) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self.submitted.discard(job.id)
        task = self.loop.create_task(self._one(job), context=contextvars.copy_context())
        self.tasks[job.id] = task
        self.job_of[task] = job.id
        self.ran += 1

    def stop(self, job_id: int, why: str) -> None:
        if job_id in self.stopped:
            return
        self.stopped[job_id] = why
        task = self.tasks.get(job_id)
        if task is not None:
            task.cancel(why)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        why = f"stopped by the daemon ({signal.Signals(signum).name})"
        for job_id in list(self.tasks):
            self.loop.call_soon_threadsafe(self.stop, job_id, why)

    async def _one(self, job: Job) -> None:
        CURRENT_JOB.set(job.id)
        ctx = self.runner.context(job)
        attempt = None
        try:
            if job.id in self.stopped:  # stopped before it started
                raise self.runner.interrupted(self.stopped[job.id])
            module_name, _, function = job.target.partition(":")
            func = getattr(importlib.import_module(module_name), function)
            self.runner.send(Started(job.id))
            attempt = self.runner.trace_start(job)
            result = func(ctx)
            if inspect.isawaitable(result):
                result = await result
            report = self.runner.returned(job.id, result)
        except asyncio.CancelledError as cancelled:
            why = self.stopped.get(job.id, "cancelled (asyncio.CancelledError)")
            try:
                raise self.runner.interrupted(why) from cancelled
            except BaseException as exc:
                report = self.runner.raised(ctx, exc)
        except BaseException as exc:  # the handler's failure, whatever it is
            report = self.runner.raised(ctx, exc)
        if attempt is not None:
            self.runner.trace_end(attempt, report)  # in this task: its context is the span's
        self._end(job, report)

    def _end(self, job: Job, report: Report) -> None:
        out = sys.stdout
        if isinstance(out, _Routed):
            out.flush_job(job.id)
        err = sys.stderr
        if isinstance(err, _Routed):
            err.flush_job(job.id)
        with _LOCK:
            last = len(self.tasks) == 1 and not self.submitted
        self.runner.finish(job, report, last)
        task = self.tasks.pop(job.id, None)
        self.job_of.pop(task, None)  # type: ignore[arg-type]
        self.stopped.pop(job.id, None)
        if self.wanted:
            self.close_if_idle()
        elif not self.tasks and not self.submitted:
            self._linger = self.loop.call_later(LINGER, self.close_if_idle)

    def close_if_idle(self) -> None:
        """End the session if it has no job running or on its way (loop thread)."""
        with _LOCK:
            if not self.tasks and not self.submitted and not self.closed:
                self.closed = True
                self.channel.session = None
                assert self._done is not None
                self._done.set()

    def _blocked(self, message: str) -> None:
        """(Watchdog thread.) The loop is held: tell the job that holds it, and the
        others that they are held."""
        task = asyncio.current_task(self.loop)
        blocker = self.job_of.get(task) if task is not None else None
        blocker = blocker if blocker is not None else self._blocker
        self._blocker = blocker
        for job_id in list(self.tasks):
            if blocker is None or job_id == blocker:
                text = message
            else:
                text = f"{message.splitlines()[0].split(' by ')[0]} by job {blocker}"
            with contextlib.suppress(Exception):
                self.runner.send(Output(job_id, text.rstrip("\n") + "\n"))


def _take_queued(channel: Any) -> list[Job]:
    """Jobs the monitor queued before the session began (an Exit stays queued)."""
    taken: list[Job] = []
    rest: list[Any] = []
    while True:
        try:
            item = channel.jobs.get_nowait()
        except Exception:  # queue.Empty
            break
        (taken if isinstance(item, Job) and item.concurrency else rest).append(item)
    for item in rest:
        channel.jobs.put(item)
    return taken


def route_output(send: Callable[[Any], None]) -> Callable[[], None]:
    """Replace sys.stdout and sys.stderr by streams that attribute what jobs write
    (_Routed); returns what puts the originals back. (Call it before the capture's
    enter(): its logging handler then writes to the routed sys.stderr.)"""
    streams = (sys.stdout, sys.stderr)
    sys.stdout = _Routed(streams[0], send)
    sys.stderr = _Routed(streams[1], send)

    def restore() -> None:
        sys.stdout, sys.stderr = streams

    return restore


class _Routed(io.TextIOBase):
    """sys.stdout or sys.stderr while a session runs: text written in a job's context
    goes to that job's log (Output messages, a line at a time); other text (the child's
    own, or written outside any job) to the stream it replaces."""

    def __init__(self, original: Any, send: Callable[[Any], None]) -> None:
        self.original = original
        self._send = send
        self._lock = threading.Lock()
        self._buffers: dict[int, list[str]] = {}

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.original, "encoding", "utf-8"))

    @property
    def buffer(self) -> Any:
        return self.original.buffer  # (bytes written there are not attributed)

    def fileno(self) -> int:
        return int(self.original.fileno())

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        job_id = CURRENT_JOB.get()
        if job_id is None:
            return int(self.original.write(text))
        with self._lock:
            parts = self._buffers.setdefault(job_id, [])
            parts.append(text)
            whole = "\n" in text or sum(len(p) for p in parts) >= OUTPUT_CHUNK
        if whole:
            self.flush_job(job_id, whole_lines=True)
        return len(text)

    def flush(self) -> None:
        job_id = CURRENT_JOB.get()
        if job_id is not None:
            self.flush_job(job_id)
        with contextlib.suppress(Exception):
            self.original.flush()

    def flush_job(self, job_id: int, whole_lines: bool = False) -> None:
        with self._lock:
            text = "".join(self._buffers.pop(job_id, []))
            if whole_lines and len(text) < OUTPUT_CHUNK:
                cut = text.rfind("\n") + 1
                if cut < len(text):
                    self._buffers[job_id] = [text[cut:]]
                text = text[:cut]
        for start in range(0, len(text), OUTPUT_CHUNK):
            self._send(Output(job_id, text[start : start + OUTPUT_CHUNK]))
