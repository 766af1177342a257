"""The job child's fence, outside its interpreter: the lease deadline and the memory limit
hold even while a handler holds the GIL in C code for minutes (a huge `json.loads`, a
backtracking regex, a C extension's loop), when no thread of the child can run.

Each job child forks one watcher at its start, before it runs any thread (so the fork is
safe): a small process of its own interpreter, so of its own GIL. The daemon gives each
child two sockets: the child's own, which its monitor thread reads and the child writes
its messages to, and the watcher's, which only the watcher holds (the child closes its
copy once the watcher is forked, before any handler code runs) and on which the daemon
sends what a fence needs: each job's Watch (its id, attempt, lease deadline and memory
limit: never its payload or anything else the enqueuer wrote, so this process, root's if
the daemon is, parses nothing of a job's data) and each renewal. A renewal therefore
reaches the fence whatever the child's interpreter is doing, and a job's own code cannot
forge one (only the daemon holds the other end).
The job reaches the child straight from the daemon: an earlier design had the watcher
read the daemon's only socket and relay every byte to the child, which put a wake-up of
a third process on every job's path (0.45 ms of an idle daemon's median enqueue -> start,
bench/idle_path.py --starts).

With attempt cgroups ([worker] job_cgroups) the child waits, before it runs a job, for
the watcher to say that the attempt's cgroup holds it (Watcher.job_began), so that no
process of the job starts outside it.

Why a process and not a kernel timer: the deadline moves with every renewal, which a timer
armed by the child can only follow with the child's GIL; and a timer's signal kills only
the child, whose orphans would then go to the daemon, which may be the frozen process
that failed to renew (so they would run on past the lease). The watcher stops the whole
tree itself, and the kernel enforces nothing per process that would break allocators (as
RLIMIT_AS does).

Stopping the tree (stop_tree): the child is stopped (SIGSTOP) first, then its descendants
level by level, each listed only once its parent is stopped, so none can be reaped and its
pid reused before it is signalled, and none can fork or exit its way out; the walk repeats
until it finds nothing new. Then every descendant is SIGKILLed and the child gets a fatal
signal of its own (LEASE_SIGNAL or MEMORY_SIGNAL, default action: terminate, no handler),
which the daemon reads as the reason (supervisor.describe_exit). The killed descendants
are zombies of stopped parents; they go to the daemon with the child and it reaps them.

When the job runs past its memory limit the watcher first tells the daemon, as the child
did: a Usage and a Failed report written to the socket under the child's send lock (a
POSIX record lock on a shared memfd, so a frame of the child is never cut by one of the
watcher's; the kernel drops it with a process that dies holding it).

The watcher dies with the child (PR_SET_PDEATHSIG); the child kills and reaps it before it
exits, and leaves it out of every sweep and measurement of the job's tree.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from setproctitle import setproctitle

from pgworkerd.worker import cgroup, protocol, tmpdirs
from pgworkerd.worker.protocol import Failed, LeaseExtended, Usage, Watch
from pgworkerd.worker.resources import SAMPLE_INTERVAL, children_of, cpu_of, limit_message, rss
from pgworkerd.worker.wire import FrameReader

PR_SET_PDEATHSIG = 1
# The signals the watcher ends a child with (default action: terminate, never handled by
# the child), so the child's wait status says why: its lease ran out unrenewed (or the
# daemon vanished mid-job), or its tree went past its memory limit.
LEASE_SIGNAL = signal.SIGRTMIN + 6
MEMORY_SIGNAL = signal.SIGRTMIN + 7
# How long the watcher waits for the child's send lock before it stops a job over its
# memory limit without a report (the child blocked in a send the daemon does not read):
# the wait status then says why.
_LOCK_WAIT = 1.0
# A child that outlives its fatal signal this long (a handler installed a handler for
# it) is SIGKILLed.
_DEATH_WAIT = 2.0
# How long stop_tree waits, in all, for the processes it stops to stop and those it kills
# to die (past it, it goes on regardless).
_SETTLE_WAIT = 3.0
# How long a child that is exiting waits for its watcher to go (Watcher.stop).
_STOP_WAIT = 2.0


@dataclass
class Watcher:
    """The child's handle on its watcher."""

    pid: int
    events: int  # write end: what the child tells the watcher (a job ended)
    send_lock: int  # a memfd: lockf()ed around every frame the child sends
    # read end: the watcher's answers to job_began (the attempt's cgroup holds the child)
    # and job_ended (it is gone), one byte each, in that order
    acks: int
    # whether attempts have cgroups of their own ([worker] job_cgroups): job_began and
    # job_ended wait for the watcher only then
    cgroups: bool = False

    def job_began(self) -> None:
        """Before a job of its own (not one run side by side with others) runs: with
        cgroups, wait (bounded) until the watcher, which reads the same job on its socket,
        has moved this child into the attempt's cgroup."""
        if self.cgroups:
            self._wait_ack()

    def _wait_ack(self) -> None:
        poller = select.poll()
        poller.register(self.acks, select.POLLIN)
        with contextlib.suppress(OSError):
            if poller.poll(int((cgroup.KILL_WAIT + 1) * 1000)):
                os.read(self.acks, 1)

    def job_ended(self, job_id: int) -> None:
        """The job ended here (before its outcome is sent): no deadline or limit holds,
        and the attempt's cgroup ([worker] job_cgroups) is killed and removed: with
        cgroups this waits for the watcher to say so (bounded), so nothing of the attempt
        runs on once the daemon has its outcome. Without, there is nothing to wait for: the
        watcher reads this before the daemon's next message (it reads its events first,
        and the daemon sends the next job only once it has this one's outcome), and a
        wait would cost every short job a round trip to another process."""
        os.write(self.events, f"{job_id}\n".encode())
        if self.cgroups:
            self._wait_ack()

    def stop(self) -> None:
        """End and reap the watcher (the child's last act: not to leave it to the daemon).

        The end of the events pipe tells it to exit: a child that dropped to a job's uid
        ([worker] job_uids) may not signal it, since the watcher keeps the uid it was
        forked with. The wait is bounded: if it has not gone by then, this child's exit
        ends it (PR_SET_PDEATHSIG)."""
        with contextlib.suppress(OSError):
            os.close(self.events)
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)  # (EPERM after a drop to a job's uid)
        # Woken by its exit (a pidfd), not by a poll: a sleep of 5 ms per stop was most
        # of a fresh process's life after its job.
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:  # gone and reaped already
            return
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            poller.poll(int(_STOP_WAIT * 1000))
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, os.WNOHANG)
        finally:
            os.close(pidfd)

    def killed_by(self) -> str | None:
        """The signal that killed the watcher ('SIGKILL'), once it was; None while it
        lives or if it exited on its own (the daemon closed the socket)."""
        pid, status = 0, 0
        give_up = time.monotonic() + 1.0  # (its pipe closes a moment before it is reapable)
        while pid == 0 and time.monotonic() < give_up:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return None
            if pid == 0:
                time.sleep(0.01)
        if pid != self.pid or not os.WIFSIGNALED(status):
            return None
        try:
            return signal.Signals(os.WTERMSIG(status)).name
        except ValueError:
            return f"signal {os.WTERMSIG(status)}"

    @contextlib.contextmanager
    def locked(self) -> Any:
        fcntl.lockf(self.send_lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(self.send_lock, fcntl.LOCK_UN)


def start(
    sock_fd: int, watch_fd: int, tmp_root: str | None, cgroup_base: str | None = None
) -> Watcher:
    """Fork the watcher of this child: it reads the daemon's `watch_fd` (closed here once
    it is forked), and writes its reports to the child's `sock_fd`; the child's temp
    directories are in `tmp_root`; `cgroup_base`: the daemon's delegated cgroup, where
    each attempt gets a cgroup of its own (None: none). Call it before any thread of the
    child runs."""
    events_r, events_w = os.pipe()
    acks_r, acks_w = os.pipe()
    send_lock = os.memfd_create("pgworkerd-send-lock")  # (close-on-exec)
    child_pid = os.getpid()
    pid = os.fork()
    if pid == 0:
        status = 70
        try:
            os.close(events_w)
            os.close(acks_r)
            watch = _Watch(child_pid, watch_fd, sock_fd, events_r, send_lock, tmp_root)
            watch.acks, watch.cgroup_base = acks_w, cgroup_base
            watch.run()
            status = 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(watch_fd)  # (the job's code must not read the renewals meant for the fence)
    os.close(events_r)
    os.close(acks_w)
    return Watcher(pid, events_w, send_lock, acks_r, cgroups=cgroup_base is not None)


class _Watch:
    """The watcher's loop."""

    def __init__(
        self, child: int, sock: int, report: int, events: int, send_lock: int, tmp_root: str | None
    ) -> None:
        # `sock`: the daemon's socket to this watcher; `report`: the child's to the daemon,
        # written to only under the child's send lock (_over_limit)
        self.child, self.sock, self.report, self.events = child, sock, report, events
        self.send_lock, self.tmp_root = send_lock, tmp_root
        self.me = os.getpid()
        self.reader: FrameReader | None = FrameReader()
        # the running jobs (one, or an async handler's side by side: aiosession) and
        # each one's lease deadline as last renewed
        self.jobs: dict[int, float] = {}
        self.limit: int | None = None  # (the jobs of a child share it: one handler's)
        self.next_sample = 0.0
        self.peak = 0
        self.events_buffer = b""
        self.acks = -1  # write end of the child's acks pipe
        self.cgroup_base: str | None = None
        self.attempt_cgroup: str | None = None  # the running attempt's, while it runs

    def run(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.child:  # the child died before the prctl took effect
            return
        # The daemon's SIGTERM to the child's group is the handler's, not ours.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        setproctitle(f"pgworkerd: watcher of child {self.child}")
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        poller.register(self.events, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll(self._timeout_ms())}
            # events first: the child tells a job's end before its outcome, and the daemon
            # sends the next job only once it has read that outcome
            if self.events in ready:
                self._read_events()
            if self.sock in ready and not self._read_daemon():
                return
            self._check(time.monotonic())

    def _timeout_ms(self) -> int | None:
        if not self.jobs:
            return None
        now = time.monotonic()
        due = min(self.jobs.values())
        if self.limit is not None:
            due = min(due, self.next_sample)
        return max(0, int((due - now) * 1000) + 1)

    def _read_events(self) -> None:
        data = os.read(self.events, 4096)
        if not data:  # the child is exiting (Watcher.stop): so do we, for it to reap
            self._end_cgroup()
            os._exit(0)
        self.events_buffer += data
        *lines, self.events_buffer = self.events_buffer.split(b"\n")
        for line in lines:
            self.jobs.pop(int(line), None)
            if not self.jobs:
                self.limit = None
            self._end_cgroup()  # (none for a job run side by side with others)
            if self.cgroup_base is not None:  # (Watcher.job_ended waits only then)
                with contextlib.suppress(OSError):
                    os.write(self.acks, b"k")

    def _begin_cgroup(self, message: Watch) -> None:
        """The attempt's own cgroup, the child in it (before the job reaches the child)."""
        self._end_cgroup()  # (an earlier attempt's that was never ended: not to leak it)
        if self.cgroup_base is None:
            return
        name = cgroup.attempt_name(message.id, message.attempt, self.child)
        try:
            self.attempt_cgroup = cgroup.create(
                self.cgroup_base, name, self.child, message.memory_limit
            )
        except OSError as exc:  # the attempt runs, contained by the tree walks alone
            print(
                f"pgworkerd watcher {self.me}: no cgroup for job {message.id}: {exc}",
                file=sys.stderr,
                flush=True,
            )

    def _end_cgroup(self) -> None:
        """The child back in the daemon's leaf; everything else in the attempt's cgroup
        killed at once; the cgroup removed (what cannot be yet, the daemon removes)."""
        path, self.attempt_cgroup = self.attempt_cgroup, None
        if path is None or self.cgroup_base is None:
            return
        try:
            cgroup.move(self.child, os.path.join(self.cgroup_base, cgroup.DAEMON_LEAF))
        except OSError as exc:
            print(f"pgworkerd watcher {self.me}: {exc}", file=sys.stderr, flush=True)
        cgroup.remove(path)

    def _read_daemon(self) -> bool:
        """Keep what the fence needs of what the daemon sent; False once the daemon is
        gone (then a running job is stopped)."""
        try:
            data = os.read(self.sock, 1 << 20)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:
            # A job runs: its tree is stopped here, frozen first, at once. The child sees
            # the end of its own socket too and leaves this to us (child._daemon_gone): a
            # sweep by the child itself cannot stop a thread of the handler from forking
            # after the sweep's last look, and that process would outlive the job with no
            # daemon left to adopt it.
            # SIGKILL for the child too, not LEASE_SIGNAL: a signal other than SIGKILL
            # reaches a stopped process only once it is continued, when a thread of the
            # handler that did not take it may run (and fork) for a moment; and no
            # daemon is left to read why the child ended.
            if self.jobs:
                self._fence(signal.SIGKILL, "the daemon is gone")
            return False
        if self.reader is not None:
            try:
                frames = self.reader.feed(data)
            except Exception as exc:  # (the child's monitor judges its own copy)
                print(f"pgworkerd watcher {self.me}: {exc}", file=sys.stderr)
                self.reader = None
                frames = []
            for frame in frames:
                with contextlib.suppress(Exception):  # (the child's monitor judges it)
                    self._note(protocol.decode(frame))
        return True

    def _note(self, message: protocol.Message) -> None:
        if isinstance(message, Watch):
            if not self.jobs:
                self.next_sample, self.peak = 0.0, 0
            self.jobs[message.id] = message.deadline
            self.limit = message.memory_limit
            if not message.concurrency:  # jobs side by side share the child: no cgroup each
                self._begin_cgroup(message)
                if self.cgroup_base is not None:  # (Watcher.job_began waits only then)
                    with contextlib.suppress(OSError):
                        os.write(self.acks, b"b")
        elif isinstance(message, LeaseExtended):  # (one for a job that ended is ignored)
            for job in self.jobs if message.id is None else (message.id,):
                if job in self.jobs:
                    self.jobs[job] = message.deadline

    def _check(self, now: float) -> None:
        if not self.jobs:
            return
        if now >= min(self.jobs.values()):
            self._fence(LEASE_SIGNAL, "lease deadline passed without renewal")
        if self.limit is not None and now >= self.next_sample:
            self.next_sample = now + SAMPLE_INTERVAL
            members = self._tree()
            total = sum(rss(p) for p in members)
            self.peak = max(self.peak, total)
            if total > self.limit:
                self._over_limit(list(self.jobs), self.limit, members)
            if self.attempt_cgroup is not None and cgroup.oom_kills(self.attempt_cgroup):
                error = (
                    "killed: memory (the kernel's OOM killer, in the attempt's cgroup: "
                    f"memory.max = its limit, {self.limit} bytes)"
                )
                self._over_limit(list(self.jobs), self.limit, members, error)

    def _tree(self) -> list[int]:
        """The child and its descendants, without this watcher."""
        found, stack = [self.child], [self.child]
        while stack:
            for kid in children_of(stack.pop()) or []:
                if kid != self.me:
                    found.append(kid)
                    stack.append(kid)
        return found

    def _over_limit(
        self, jobs: list[int], limit: int, members: list[int], error: str | None = None
    ) -> None:
        """Stop the child, after a report for each of its jobs: jobs run side by side share
        the child and its limit, and which of them grew cannot be told, so each fails
        with the reason (and none reports figures: they are the child's)."""
        locked = self._lock()
        cpu = [cpu_of(p) for p in members]
        error = error or limit_message(limit, self.peak)
        if len(jobs) > 1:
            error += (
                f" (the limit of a child that ran {len(jobs)} jobs side by side, "
                f"{', '.join(map(str, sorted(jobs)))}: each of them is stopped)"
            )
        frames = b""
        for job in jobs:
            if len(jobs) == 1:
                usage = Usage(
                    job, sum(u for u, _ in cpu), sum(s for _, s in cpu), self.peak, rss(self.child)
                )
                frames += protocol.encode(usage)
            frames += protocol.encode(Failed(job, error))
        if locked:
            os.kill(self.child, signal.SIGSTOP)  # it sends nothing more
            with contextlib.suppress(OSError):
                _write_all(self.report, frames)
        self._fence(MEMORY_SIGNAL, error)

    def _lock(self) -> bool:
        """Take the child's send lock (wait at most _LOCK_WAIT)."""
        give_up = time.monotonic() + _LOCK_WAIT
        while True:
            try:
                fcntl.lockf(self.send_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError:
                if time.monotonic() > give_up:
                    return False
                time.sleep(0.01)

    def _fence(self, sig: int, reason: str) -> None:
        """Stop the job's whole tree, the child with `sig`; never returns."""
        with contextlib.suppress(Exception):
            print(f"pgworkerd child {self.child}: {reason}; stopping", file=sys.stderr, flush=True)

        def remove_temp_dirs() -> None:  # (the daemon would, but it may be gone)
            # what left the tree dies with the attempt's cgroup (the child, stopped, is
            # moved out first: it dies of `sig`, which tells the daemon why)
            self._end_cgroup()
            if self.tmp_root is not None:
                tmpdirs.remove_child_dirs(self.tmp_root, self.child)

        stop_tree(self.child, sig, skip={self.me}, before_end=remove_temp_dirs)
        # The child is dying (stop_tree SIGKILLs it if it outlives its signal): go once it
        # has. PR_SET_PDEATHSIG should end us with it, but one watcher was left behind
        # after its child, which had dropped to a job's uid, was stopped at its memory
        # limit: its own end is not left to that signal.
        with contextlib.suppress(OSError):
            pidfd = os.pidfd_open(self.child)
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            poller.poll(int((_DEATH_WAIT + 1) * 1000))
        os._exit(0)


def stop_tree(
    root: int, sig: int, skip: set[int], before_end: Callable[[], None] | None = None
) -> None:
    """Freeze `root` and every descendant (but `skip`), SIGKILL the descendants, call
    `before_end` (the tree is still), end `root` with the fatal signal `sig` (SIGKILL if
    it outlives it).

    A single walk can miss processes, so it is repeated until one finds nothing new while
    `root` stays stopped, after everything found before is dead:
    - SIGSTOP takes effect a moment after kill() returns, and a thread inside fork() then
      finishes it first: a process's children are listed only once it has stopped
      (_settle);
    - `root` has been found running again after a walk's kills (a handler whose threads
      fork without a pause, its daemon dead: tests/fault/test_containment.py; what
      continued it is not established): it is stopped again before each walk, and the
      last walk must begin and end with it stopped;
    - the kernel's list of a process's children (/proc/PID/task/TID/children) may skip
      entries while other children exit, which the killed ones do: only once they are all
      dead (zombies: `root` is stopped and reaps none) is the list still, and a walk then
      sees every process that was re-parented to `root` meanwhile."""
    give_up = time.monotonic() + _SETTLE_WAIT
    stopped = {root}
    while True:
        _signal(root, signal.SIGSTOP)
        _settle(root, give_up)
        new: list[int] = []
        level = [root]
        while level:
            below = []
            for pid in level:
                for kid in children_of(pid) or []:
                    if kid in skip:
                        continue
                    if kid not in stopped:
                        _signal(kid, signal.SIGSTOP)
                        stopped.add(kid)
                        new.append(kid)
                    below.append(kid)
            for kid in below:
                _settle(kid, give_up)
            level = below
        if not new and (_is_stopped(root) or time.monotonic() > give_up):
            break
        for pid in new:
            _signal(pid, signal.SIGKILL)
        _wait_dead(new, give_up)
    if before_end is not None:
        with contextlib.suppress(Exception):
            before_end()
    _signal(root, sig)
    _signal(root, signal.SIGCONT)
    give_up = time.monotonic() + _DEATH_WAIT
    while os.path.exists(f"/proc/{root}/task") and _state(root) not in ("Z", "X", None):
        if time.monotonic() > give_up:
            _signal(root, signal.SIGKILL)
            return
        time.sleep(0.01)


def _wait_dead(pids: list[int], give_up: float) -> None:
    """Wait (until `give_up`) until each of `pids`, SIGKILLed, has exited."""
    left = list(pids)
    while left and time.monotonic() < give_up:
        left = [p for p in left if _state(p) not in ("Z", "X", None)]
        if left:
            time.sleep(0.0005)


def _settle(pid: int, give_up: float) -> None:
    """Wait (until `give_up`) until `pid`, just sent SIGSTOP, has stopped."""
    while time.monotonic() < give_up and not _is_stopped(pid):
        time.sleep(0.0005)


def _is_stopped(pid: int) -> bool:
    """Whether no thread of `pid` may run its own code: each is stopped, dead, or blocked
    in the kernel (`D`: in vfork() until its child execs, which the walk stops first, or
    in I/O; it stops before it returns). True if the process is gone."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    return all(_state(pid, int(tid)) in ("T", "t", "D", "Z", "X", None) for tid in tasks)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _state(pid: int, tid: int | None = None) -> str | None:
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, "rb") as f:
            return f.read().rpartition(b")")[2].split()[0].decode()
    except (OSError, IndexError):
        return None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
