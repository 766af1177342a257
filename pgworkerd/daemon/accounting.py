"""What an attempt cost, put together in the parent: the child's own measurements of the
job's process tree (protocol.Usage, sent before each report and whenever the peak grew)
and, for a child that died with its job, the kernel's rusage from wait4 when it was
reaped. Written to the attempt's history row after its outcome (queue.attempts.record_usage,
through the daemon's Statements)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from pgworkerd.daemon.children import ChildProcess
from pgworkerd.queue.attempts import Usage
from pgworkerd.sizes import format_size
from pgworkerd.worker import protocol

log = logging.getLogger("pgworkerd")


def attempt_usage(
    job_id: int,
    token: int,
    wall: float,
    reported: protocol.Usage | None,
    child: ChildProcess | None,
) -> Usage:
    """The attempt's figures. A child reaped with the job (killed, crashed) adds its
    rusage: its CPU (less what its earlier jobs reported, for a reused child) and, if this
    was its only job, its peak."""
    cpu_user = reported.cpu_user if reported else None
    cpu_system = reported.cpu_system if reported else None
    peak = reported.peak_memory if reported else None
    ru: Any = child.rusage if child is not None else None
    if child is not None and ru is not None:
        user = max(0.0, ru.ru_utime - child.cpu_reported[0])
        system = max(0.0, ru.ru_stime - child.cpu_reported[1])
        cpu_user = max(cpu_user or 0.0, user)
        cpu_system = max(cpu_system or 0.0, system)
        if child.jobs_run <= 1:
            peak = max(peak or 0, ru.ru_maxrss * 1024)
    return Usage(job_id, token, wall, cpu_user, cpu_system, peak)


def reported(child: ChildProcess, usage: protocol.Usage, max_child_memory: int | None) -> None:
    """A child's figures for its job: retire a reused child grown past max_child_memory
    (told now, it exits after this job; a fresh one takes the next)."""
    if max_child_memory is None or usage.child_memory <= max_child_memory or child.exiting:
        return
    log.info(
        "child %s uses %s, over max_child_memory %s: replacing it after its job",
        child.pid,
        format_size(usage.child_memory),
        format_size(max_child_memory),
    )
    child.exiting = True
    child.send(protocol.Exit())


def settled(child: ChildProcess, usage: protocol.Usage | None) -> None:
    """The job's last figures are in: what a later death of the child adds is not its."""
    if usage is not None:
        user, system = child.cpu_reported
        child.cpu_reported = (user + usage.cpu_user, system + usage.cpu_system)


# Figures are written at most this often, all that arrived meanwhile in one statement:
# O(1) statements per host and second, not one (and one commit) per outcome.
WRITE_INTERVAL = 1.0
# Kept at most this many while the database is away; older figures are dropped.
MAX_PENDING = 10_000


class UsageWriter:
    """Keeps the figures of attempts whose outcome is written (their history row exists)
    until the next write, every WRITE_INTERVAL."""

    def __init__(
        self,
        write: Callable[[list[Usage]], bool | None],
        database_up: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.write = write  # None: the write failed (kept for the next one)
        self.database_up = database_up
        self.clock = clock
        self.pending: list[Usage] = []
        self.due: float | None = None

    def add(self, usages: list[Usage]) -> None:
        if not usages:
            return
        self.pending = (self.pending + usages)[-MAX_PENDING:]
        if self.due is None:
            self.due = self.clock() + WRITE_INTERVAL

    def tick(self, now: float) -> None:
        if self.due is not None and now >= self.due:
            self.flush()

    def flush(self) -> None:
        if not self.pending or not self.database_up():
            return
        batch = self.pending
        if self.write(batch) is not None:
            self.pending = self.pending[len(batch) :]
        self.due = self.clock() + WRITE_INTERVAL if self.pending else None

    def next_deadline(self) -> float | None:
        return self.due
