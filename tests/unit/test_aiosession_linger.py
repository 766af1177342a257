"""A child's session of side-by-side async jobs (pgworkerd.worker.aiosession) waits for
the next job after its last instead of ending at once (a session's start costs more than a
no-op job), and ends at once when the child has something else to do (nudge). A real
event loop and threads; the job's handler is asyncio.sleep."""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from typing import Any

import pytest

from pgworkerd.worker import aiosession
from pgworkerd.worker.protocol import Done, Failed, Job


class Channel:
    """What the session uses of the child's channel."""

    def __init__(self) -> None:
        self.session: Any = None
        self.jobs: queue.Queue[Any] = queue.Queue()


def job(job_id: int) -> Job:
    return Job(job_id, "h", "asyncio:sleep", "default", {}, 1, 3, None, 1e12, concurrency=8)


def runner(finished: list[int]) -> aiosession.Runner:
    return aiosession.Runner(
        context=lambda job: 0,  # asyncio.sleep(0): a no-op coroutine
        returned=lambda job_id, result: Done(job_id),
        raised=lambda ctx, exc: Failed(0, repr(exc)),
        finish=lambda job, report, last: finished.append(job.id),
        interrupted=RuntimeError,
        send=lambda message: None,
    )


def wait_for(condition: Any) -> None:
    give_up = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < give_up, "never came"
        time.sleep(0.001)


def beside(action: Any) -> threading.Thread:
    """`action` in a thread (the child's monitor), while the session runs in this one
    (it installs a signal handler: the main thread's)."""
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


def test_a_job_handed_over_while_the_session_lingers_joins_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aiosession, "LINGER", 0.5)
    channel, finished = Channel(), list[int]()
    seen: list[bool] = []

    def monitor() -> None:
        wait_for(lambda: finished == [1])  # the first job ended; the session lingers
        seen.append(channel.session is not None and not channel.session.closed)
        aiosession.submit(channel, job(2))  # (the monitor thread's hand-over)

    helper = beside(monitor)
    ran = aiosession.run(channel, job(1), runner(finished))
    helper.join(10)
    assert seen == [True] and ran == 2 and finished == [1, 2]
    assert channel.session is None


def test_a_nudge_ends_a_lingering_session_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiosession, "LINGER", 60.0)  # without the nudge: a minute
    channel, finished = Channel(), list[int]()

    def monitor() -> None:
        wait_for(lambda: finished == [1])
        aiosession.nudge(channel)  # a job to run alone (or an Exit) was queued

    helper = beside(monitor)
    began = time.monotonic()
    assert aiosession.run(channel, job(1), runner(finished)) == 1
    assert time.monotonic() - began < 20 and channel.session is None
    helper.join(10)


def test_a_nudge_before_the_last_job_ends_closes_the_session_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aiosession, "LINGER", 60.0)
    channel, finished = Channel(), list[int]()
    slow = dataclasses.replace(runner(finished), context=lambda job: 0.3)  # sleep(0.3)

    def monitor() -> None:
        wait_for(lambda: channel.session is not None)
        aiosession.nudge(channel)  # while the job still runs

    helper = beside(monitor)
    began = time.monotonic()
    assert aiosession.run(channel, job(1), slow) == 1
    assert time.monotonic() - began < 20 and finished == [1]
    helper.join(10)
