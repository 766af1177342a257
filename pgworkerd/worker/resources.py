"""What a job's process tree costs, measured from inside its child: the tree's resident
memory (sampled), its CPU time, and the peak; and the memory limit's message.

The tree is the child and every descendant reachable through /proc/<pid>/task/*/children
(descendants that a subreaper child adopts are among them); where the kernel lacks that
file, a scan of /proc/*/stat for parent links stands in. Memory is the sum of the
processes' resident sets (statm: one small read each, O(1) in the kernel, unlike smaps),
so pages shared between them count once per process: an overestimate that errs on the
side of stopping a job, never of letting one grow past its limit unseen.

Sampling runs on the child's monitor thread (every SAMPLE_INTERVAL while a job runs): it
costs the job, in its own process, a few /proc reads per tree member, and the daemon's
single loop nothing. A peak between two samples is caught afterwards by ru_maxrss (the
child's own, and of the descendants it reaped), not by the limit. The limit itself is
checked as often by the child's watcher (pgworkerd.worker.watcher), from outside the
child's interpreter: a handler holding the GIL stops this sampling, not that check.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

from pgworkerd.sizes import format_size

# How often the tree is measured while a job runs: a job allocating 1 GiB/s overshoots
# its limit by at most ~0.25 GiB before it is stopped; each sample of a tree of a few
# processes costs well under a millisecond.
SAMPLE_INTERVAL = 0.25
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


def children_of(pid: int) -> list[int] | None:
    """Direct children of `pid` (every thread's), None if the kernel has no such file."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            return None  # no CONFIG_PROC_CHILDREN
        except OSError:
            continue
        found.extend(int(p) for p in text.split())
    return found


def _parents() -> dict[int, list[int]]:
    """pid -> children, from every process's stat (the fallback)."""
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        tree.setdefault(ppid, []).append(int(name))
    return tree


def descendants(root: int, leave_out: frozenset[int] = frozenset()) -> list[int]:
    """Every live descendant of `root` (not `root` itself), but the processes in
    `leave_out` and theirs."""
    found: list[int] = []
    stack = [root]
    table: dict[int, list[int]] | None = None
    while stack:
        pid = stack.pop()
        if table is None:
            kids = children_of(pid)
            if kids is None:
                table = _parents()
                kids = table.get(pid, [])
        else:
            kids = table.get(pid, [])
        kids = [k for k in kids if k not in leave_out]
        found.extend(kids)
        stack.extend(kids)
    return found


def rss(pid: int) -> int:
    """Resident bytes of one process, 0 if it is gone."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def cpu_of(pid: int) -> tuple[float, float]:
    """(user, system) seconds of a live process, its reaped children's included."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0, 0.0
    # after the command: state is fields[0], so utime (14) is [11], stime [12], cutime
    # [13], cstime [14]
    user = (int(fields[11]) + int(fields[13])) / _TICK
    system = (int(fields[12]) + int(fields[14])) / _TICK
    return user, system


@dataclass(frozen=True)
class Figures:
    cpu_user: float
    cpu_system: float
    peak_memory: int  # bytes
    child_memory: int  # the child's own resident bytes now


def _rusage_sum() -> tuple[float, float, int]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + kids.ru_utime, me.ru_stime + kids.ru_stime, kids.ru_maxrss * 1024


class Meter:
    """One job's measurements, from start() to figures()."""

    def __init__(self, first_job: bool, leave_out: frozenset[int] = frozenset()) -> None:
        self.pid = os.getpid()
        self.leave_out = leave_out  # the child's watcher: not the job's
        self.first_job = first_job
        self.started = time.monotonic()
        self.last_sample = 0.0
        self.peak = 0
        self._base_user, self._base_system, self._base_kids_maxrss = _rusage_sum()
        self._live_cpu: tuple[float, float] = (0.0, 0.0)
        # live descendants at the last sample; -1: not sampled yet
        self.live = -1

    def sample(self) -> int:
        """Measure the tree now; returns its resident bytes."""
        self.last_sample = time.monotonic()
        # (the watcher's subtree is left out whole: a walk of it per sample was a tenth of
        # a short job's cost in its child)
        members = descendants(self.pid, self.leave_out)
        total = rss(self.pid) + sum(rss(p) for p in members)
        user = system = 0.0
        for pid in members:
            u, s = cpu_of(pid)
            user, system = user + u, system + s
        self._live_cpu = (user, system)
        self.live = len(members)
        self.peak = max(self.peak, total)
        return total

    def due(self, now: float) -> bool:
        return now - self.last_sample >= SAMPLE_INTERVAL

    def figures(self, *, sample: bool = True) -> Figures:
        """What the job cost so far: CPU of this process and of every descendant reaped
        (by it or below it) since the start, plus the live descendants' at the last
        sample; the peak of the samples and of ru_maxrss where it is this job's alone."""
        if sample:
            self.sample()
        user, system, kids_maxrss = _rusage_sum()
        peak = self.peak
        if kids_maxrss > self._base_kids_maxrss:  # a reaped descendant was this job's
            peak = max(peak, kids_maxrss)
        if self.first_job:  # the child's lifetime high-water mark is this job's
            peak = max(peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
        return Figures(
            cpu_user=max(0.0, user - self._base_user + self._live_cpu[0]),
            cpu_system=max(0.0, system - self._base_system + self._live_cpu[1]),
            peak_memory=peak,
            child_memory=rss(self.pid),
        )


def limit_message(limit: int, peak: int) -> str:
    """'memory limit 2 GiB exceeded (peak 2.1 GiB)': the peak shown precisely enough to
    differ from the limit."""
    shown = format_size(peak)
    if shown == format_size(limit):
        shown = f"{peak / (1 << 20):.0f} MiB"
    return f"memory limit {format_size(limit)} exceeded (peak {shown})"
