"""Running an `async def` handler in its job child: the coroutine a handler returned is run
to its end in an event loop of the child's main thread (asyncio.run: a fresh loop per
attempt, so nothing of one attempt's loop outlives it).

How the daemon's stop reaches a coroutine: the child's SIGTERM handler (which raises
JobInterrupted into a sync handler) is replaced while the loop runs by one that cancels
the handler's task. The coroutine sees asyncio.CancelledError at the await it is in (the
asyncio idiom: clean up in `finally`, or catch it only to clean up); when it ends so, the
attempt ends with JobInterrupted, as a sync handler's would, and the daemon decides what
that means (timeout, cancel, drain, hand-back). A coroutine that swallows the
cancellation and returns has completed, as a sync handler that swallows JobInterrupted.

A blocking call in a coroutine (time.sleep, a sync database driver, CPU-bound work) holds
the loop: no other callback of the loop runs meanwhile, and a stop cannot be delivered
until it returns (the daemon's SIGKILL after kill_grace still ends it). A watchdog thread
measures the loop's responsiveness and, once the loop was held longer than
BLOCKED_AFTER, writes to the attempt's output (its job log) how long and where
(the main thread's stack as the watchdog first saw it held).

Dependency-free: the job's child imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import threading
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

# The loop is "blocked" once a callback scheduled on it waited this long to run.
BLOCKED_AFTER = 1.0
# How often the watchdog probes the loop.
PROBE_INTERVAL = 0.1


class LoopWatchdog:
    """A thread that probes the loop every PROBE_INTERVAL (a callback scheduled from the
    thread) and reports each stretch the loop did not answer for BLOCKED_AFTER or more:
    once when it is first seen (with the blocking frame), once when it ends (with its
    length). `report` gets each message; `blocked` counts the stretches."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        main_thread: int,
        report: Callable[[str], None],
        threshold: float = BLOCKED_AFTER,
    ) -> None:
        self.loop, self.main_thread, self.report = loop, main_thread, report
        self.threshold = threshold
        self.blocked = 0
        self._answered = time.monotonic()  # when the loop last ran a probe
        self._held_since: float | None = None  # a stretch being reported: its start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pgworkerd-loop-watchdog")
        self._thread.daemon = True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        if self._held_since is not None:  # held until the coroutine's end
            self._ended(time.monotonic())

    def _answer(self) -> None:
        self._answered = time.monotonic()

    def _run(self) -> None:
        while not self._stop.wait(PROBE_INTERVAL):
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self.loop.call_soon_threadsafe(self._answer)
            now = time.monotonic()
            late = now - self._answered
            if self._held_since is None and late >= self.threshold + PROBE_INTERVAL:
                self._held_since = self._answered
                self.blocked += 1
                self.report(
                    "pgworkerd: the event loop has been blocked for "
                    f"{late:.1f}s by a blocking call in an async handler (it stalls every "
                    "coroutine of this child and delays its stop), at:\n" + self._where()
                )
            elif self._held_since is not None and late < PROBE_INTERVAL * 2:
                self._ended(self._answered)

    def _ended(self, at: float) -> None:
        held_since, self._held_since = self._held_since, None
        if held_since is not None:
            self.report(f"pgworkerd: the event loop was blocked for {at - held_since:.1f}s in all")

    def _where(self) -> str:
        frame = sys._current_frames().get(self.main_thread)
        if frame is None:
            return "  (unknown)\n"
        return "".join(traceback.format_stack(frame)[-4:])


def run(
    awaitable: Awaitable[Any],
    interrupted: Callable[[str], BaseException],
    report: Callable[[str], None],
) -> Any:
    """Run `awaitable` (what an async handler returned) to its end in a fresh event loop
    and return its value. A SIGTERM meanwhile cancels it; if it ends cancelled, the
    exception `interrupted(reason)` is raised (JobInterrupted). `report` writes a line to
    the attempt's output (the watchdog's findings). The SIGTERM handler in place before
    is put back before this returns."""
    return asyncio.run(_main(awaitable, interrupted, report))


async def _main(
    awaitable: Awaitable[Any],
    interrupted: Callable[[str], BaseException],
    report: Callable[[str], None],
) -> Any:
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(awaitable)
    stopped: list[str] = []

    def on_sigterm(signum: int, frame: Any) -> None:
        # (Python runs this in the main thread between bytecodes, the loop's select
        # included; call_soon_threadsafe wakes the loop.)
        if not stopped:
            stopped.append(f"stopped by the daemon ({signal.Signals(signum).name})")
            loop.call_soon_threadsafe(task.cancel, stopped[0])

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    watchdog = LoopWatchdog(loop, threading.get_ident(), report)
    watchdog.start()
    try:
        return await task
    except asyncio.CancelledError:
        if stopped:
            raise interrupted(stopped[0]) from None
        raise
    finally:
        watchdog.stop()
        signal.signal(signal.SIGTERM, previous)
