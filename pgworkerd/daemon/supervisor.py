"""The parent's side of its children: the fork server, warm children, messages, reaping.

The daemon decides what happens to jobs; this module only runs processes and reports
what they say and how they end. Children are reaped here, in one place, and exit
statuses are decoded once (describe_exit).

For the loop: `can_start()` says whether a job claimed now could be started (a warm
child is idle or the fork server is up); claim only while it is True. `tick(now)`
restarts a dead fork server once its delay is over, and `next_deadline()` says when
that is. The delay is a jittered backoff from 1 s that starts over once a restarted
fork server has served.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import selectors
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgworkerd.backoff import Backoff
from pgworkerd.daemon.cgroups import JobCgroups
from pgworkerd.daemon.containment import Containment
from pgworkerd.daemon.jobuids import UidPool
from pgworkerd.describe import short_error
from pgworkerd.worker import protocol, reaper, watcher
from pgworkerd.worker.forkserver import MAX_BATCH, ForkServer
from pgworkerd.worker.protocol import ChildMessage, Exit, Hello, LeaseExtended, ParentMessage
from pgworkerd.worker.wire import FrameReader

log = logging.getLogger("pgworkerd")

# A child that has not said hello this long after its spawn (its fork failed) is forgotten.
STUCK_START_TIMEOUT = 30.0
# The fork server's restart delays: 1 s after a death, doubling while restarts do not
# serve, back to 1 s once a restarted fork server has served (see _served).
FORKSERVER_RESTART_INITIAL = 1.0
FORKSERVER_RESTART_MAX = 30.0
# A fork server that stayed up this long has served, even if no child was asked of it.
FORKSERVER_STABLE_AFTER = 60.0


_LEASE_RAN_OUT = "its lease ran out without renewal (daemon or database too slow)"


def describe_exit(status: int) -> str:
    """A wait status as words: 'killed by SIGKILL' or 'exited with code 3'."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == watcher.LEASE_SIGNAL:  # (its watcher stopped it: pgworkerd.worker.watcher)
            return f"stopped: {_LEASE_RAN_OUT}"
        if sig == watcher.MEMORY_SIGNAL:
            return "stopped: its process tree went past its memory limit"
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = " (the OOM killer or kill -9)" if sig == signal.SIGKILL else ""
        hint = " (segmentation fault)" if sig == signal.SIGSEGV else hint
        return f"killed by {name}{hint}"
    code = os.waitstatus_to_exitcode(status)
    if code == reaper.FENCED_EXIT:
        return f"stopped itself: {_LEASE_RAN_OUT}"
    return f"exited with code {code}"


def _parent_of(pid: int) -> int | None:
    """The parent pid of a process (a zombie too), None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    return int(stat.rpartition(")")[2].split()[1])


def _write(sock: socket.socket, unsent: bytearray, frame: bytes) -> bool:
    """Send `frame` after what `unsent` holds, as far as the non-blocking `sock` takes it
    now; the rest joins `unsent`. False if the socket is broken."""
    try:
        if not unsent:
            frame = frame[sock.send(frame) :]
    except BlockingIOError:
        pass
    except OSError:
        return False
    unsent += frame
    return True


@dataclass(eq=False)
class Child:
    """One child process, its socket and its watcher's; `job` is the id it runs, if any.

    The child reads its own socket; its watcher (pgworkerd.worker.watcher) reads a socket
    of its own, which carries only what the fence needs (each job, with its lease
    deadline and memory limit, and each renewal). A job therefore reaches the child
    straight from the daemon, not relayed by another process: on an idle machine each
    hop between processes is a wake-up, which costs a job's start a good part of a
    millisecond (docs/benchmarks/2026-11-27-job-straight-to-child.md)."""

    sock: socket.socket
    spawned_at: float
    watch: socket.socket | None = None  # the watcher's; None for a child without one
    pid: int | None = None  # known once the child says hello
    job: int | None = None
    jobs_run: int = 0
    exiting: bool = False  # told to exit, or will exit after its current job
    reader: FrameReader = field(default_factory=FrameReader)
    eof: bool = False
    broken: str = ""  # why the daemon stopped it for a message it could not read
    rusage: Any = None  # os.wait4's, once reaped (daemon.accounting)
    uid: int | None = None  # its own uid ([worker] job_uids), held until it is reaped
    cpu_reported: tuple[float, float] = (0.0, 0.0)  # (user, system) its settled jobs used
    outbox: list[bytes] = field(default_factory=list)  # jobs assigned, not sent yet
    watch_outbox: list[bytes] = field(default_factory=list)  # their Watch frames, as outbox
    # what its socket and its watcher's did not take yet (a frame larger than a socket's
    # buffer: a job's payload may be up to 64 MiB); Supervisor.flush_writes sends it as
    # they drain, and later frames wait behind it
    unsent: bytearray = field(default_factory=bytearray)
    watch_unsent: bytearray = field(default_factory=bytearray)
    writing: tuple[bool, bool] = (False, False)  # registered for writability: sock, watch
    # told when something is left unsent (the supervisor's note of whom to flush)
    on_unsent: Callable[[Child], None] | None = None

    def send(self, message: ParentMessage) -> bool:
        """Best effort: a child that is gone cannot be told anything."""
        frame = protocol.encode(message)
        return self.send_encoded(frame, frame if isinstance(message, LeaseExtended) else b"")

    def send_encoded(self, frame: bytes, watch_frame: bytes = b"") -> bool:
        """Write `frame` to the child and `watch_frame` (what the fence needs of jobs and
        renewals), if any, to its watcher: the child first, whose job waits on it. What a
        socket does not take now waits (never the loop); False if the child or its
        watcher is gone."""
        sent = _write(self.sock, self.unsent, frame)
        if watch_frame and self.watch is not None:
            sent = _write(self.watch, self.watch_unsent, watch_frame) and sent
        if (self.unsent or self.watch_unsent) and self.on_unsent is not None:
            self.on_unsent(self)
        return sent

    def close_sockets(self) -> None:
        self.sock.close()
        if self.watch is not None:
            self.watch.close()

    def signal_group(self, sig: int) -> None:
        if self.pid is None:
            return
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            os.kill(self.pid, sig)


class Supervisor:
    """Keeps the fork server and children; calls back with messages and exits."""

    def __init__(
        self,
        selector: selectors.BaseSelector,
        on_message: Callable[[Child, ChildMessage], None],
        on_exit: Callable[[Child, int], None],
        *,
        stable_after: float = FORKSERVER_STABLE_AFTER,
        job_uids: tuple[int, int] | None = None,
        job_cgroups: JobCgroups | None = None,
    ) -> None:
        self.selector = selector
        self._unsent: set[Child] = set()  # children with something left to send (flush_writes)
        self.on_message = on_message
        self.on_exit = on_exit
        self.forkserver: ForkServer | None = None
        self.modules: list[str] = []
        self.settings: dict[str, Any] = {}
        self.children: list[Child] = []
        self.by_pid: dict[int, Child] = {}
        # pid -> (wait status, when reaped) of processes reaped before their hello arrived
        self._unmatched_exits: dict[int, tuple[int, float]] = {}
        self._forkserver_restarts = Backoff(FORKSERVER_RESTART_INITIAL, FORKSERVER_RESTART_MAX)
        self._forkserver_started_at = 0.0
        self._forkserver_retry_at = 0.0
        self._stable_after = stable_after
        # orphans of dead children, temp directories (which children of other uids traverse)
        self.containment = Containment(traversable=job_uids is not None, cgroups=job_cgroups)
        # the uids no live child holds ([worker] job_uids; None: children run as ours)
        self.uids = UidPool(*job_uids) if job_uids is not None else None
        self._forkserver_pids: set[int] = set()  # every fork server not reaped yet

    # -- fork server -------------------------------------------------------------------

    def start_forkserver(self, modules: list[str], settings: dict[str, Any]) -> None:
        """(Re)start the fork server; on failure the old one keeps serving."""
        self.containment.start()
        new = ForkServer.start(modules, {**settings, **self.containment.child_settings()})
        self._forkserver_pids.add(new.pid)
        old, self.forkserver = self.forkserver, new
        self._forkserver_started_at = time.monotonic()
        self.modules, self.settings = modules, settings
        if old is not None:
            old.stop()
            # Warm children of the old fork server carry old handler code: retire them.
            for child in self.idle():
                self.retire(child)

    def can_start(self) -> bool:
        """Whether a job claimed now could be started: a warm child is idle, or the fork
        server is up to fork one. While False (fork server down and restarting, no warm
        child) the daemon must not claim: it would hold jobs it cannot start and renew
        their leases while another daemon sits idle. It turns True again when tick()
        has restarted the fork server."""
        return self.forkserver is not None or bool(self.idle())

    def tick(self, now: float) -> None:
        """Restart a dead fork server once its delay is over (not only when a child is
        wanted: while can_start() is False nobody claims, so nobody would ask), and
        forget children that never said hello."""
        if self.forkserver is None and now >= self._forkserver_retry_at:
            self.ensure_forkserver()
        self.prune_stuck_starts(STUCK_START_TIMEOUT)
        self._sweep()  # one that had to wait for a child's hello
        self.containment.tick(now)

    def next_deadline(self) -> float | None:
        """When tick() has something to do: the fork server's restart, if it is down, and
        containment's retry of attempt cgroups left behind."""
        due = [self.containment.next_deadline()]
        if self.forkserver is None:
            due.append(self._forkserver_retry_at)
        return min((d for d in due if d is not None), default=None)

    def _forkserver_died(self) -> None:
        now = time.monotonic()
        if self.forkserver is not None and now - self._forkserver_started_at >= self._stable_after:
            self._served()
        self.forkserver = None
        delay = self._forkserver_restarts.next_delay()
        self._forkserver_retry_at = now + delay
        log.error("fork server died; restarting it in %.1fs", delay)

    def _served(self) -> None:
        """The current fork server works (a child of it said hello, or it stayed up for
        a while): its next death is retried after the initial delay again, not after a
        delay that doubled with every death over the daemon's whole life."""
        self._forkserver_restarts.reset()

    def ensure_forkserver(self) -> bool:
        if self.forkserver is not None:
            return True
        if time.monotonic() < self._forkserver_retry_at:
            return False
        try:
            self.start_forkserver(self.modules, self.settings)
        except (OSError, RuntimeError) as exc:
            log.error("cannot restart the fork server: %s", exc)
            self._forkserver_died()
            return False
        assert self.forkserver is not None
        log.info("fork server restarted (pid %d)", self.forkserver.pid)
        return True

    def stop_forkserver(self) -> None:
        if self.forkserver is not None:
            self.forkserver.stop()
            self.forkserver = None

    # -- children ----------------------------------------------------------------------

    def spawn(self, count: int = 1) -> int:
        """Start up to `count` children with one request to the fork server (which forks
        them from one middle process); returns how many are on their way."""
        count = min(count, MAX_BATCH)
        if self.uids is not None:
            # (the range holds slots + warm_children: a shortage is a child still exiting,
            # and the next loop turn after its reaping spawns again)
            count = min(count, self.uids.free())
        if count <= 0 or not self.ensure_forkserver():
            return 0
        assert self.forkserver is not None
        uids = self.uids.take(count) if self.uids is not None else None
        # (the child's socket, then its watcher's)
        pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2 * count)]
        try:
            self.forkserver.spawn([theirs for _, theirs in pairs], uids)
        except OSError as exc:
            for ours, _ in pairs:
                ours.close()
            for uid in uids or ():
                self._give_back(uid)
            log.error("fork server unreachable (%s)", exc)
            self.forkserver.stop()
            self._forkserver_died()
            return 0
        finally:
            for _, theirs in pairs:
                theirs.close()
        now = time.monotonic()
        for i in range(count):
            ours, watch = pairs[2 * i][0], pairs[2 * i + 1][0]
            ours.setblocking(False)
            watch.setblocking(False)
            child_uid = uids[i] if uids is not None else None
            child = Child(sock=ours, spawned_at=now, watch=watch, uid=child_uid)
            child.on_unsent = self._unsent.add
            self.children.append(child)
            self.selector.register(ours, selectors.EVENT_READ, ("child", child))
        return count

    def unassign(self, child: Child, job_id: int) -> None:
        """The child's job has settled: it is idle again (unless it exits)."""
        if child.job == job_id:
            child.job = None

    def has_children(self) -> bool:
        """Any child process alive (one that said hello and has not been reaped)."""
        return any(c.pid is not None for c in self.children)

    def idle(self) -> list[Child]:
        """Warm children ready for a job."""
        return [
            c
            for c in self.children
            if c.pid is not None and c.job is None and not c.exiting and not c.eof and not c.broken
        ]

    def starting(self) -> int:
        return sum(1 for c in self.children if c.pid is None and not c.eof)

    def retire(self, child: Child) -> None:
        child.exiting = True
        child.send(Exit())

    def assign(
        self, child: Child, job_id: int, frame: bytes, watch_frame: bytes, side_by_side: int = 1
    ) -> None:
        """Hand a job (its Job message and its Watch, encoded already) to an idle child, or
        to one that runs up to `side_by_side` jobs of an async handler at once (child.job
        stays its first; such a child runs at least that many jobs before it is replaced,
        as the child counts them too: pgworkerd.worker.child.main). The messages wait in
        the child's outboxes for send_assigned."""
        if child.job is None:
            child.job = job_id
        child.jobs_run += 1
        if child.jobs_run >= max(side_by_side, int(self.settings.get("max_jobs_per_child", 1))):
            child.exiting = True
        child.outbox.append(frame)
        child.watch_outbox.append(watch_frame)

    def send_assigned(self) -> list[Child]:
        """Send each child the jobs assigned to it since the last call, in one write (a
        child handed several jobs of an async handler at once wakes once for them), and
        its watcher their Watch frames likewise; returns the children that could not be
        written to (gone)."""
        failed = []
        for child in self.children:
            if child.outbox:
                frames, child.outbox = b"".join(child.outbox), []
                watch_frames, child.watch_outbox = b"".join(child.watch_outbox), []
                if not child.send_encoded(frames, watch_frames):
                    failed.append(child)
        return failed

    def serve_until(self, fd: int, limit: float, then: Callable[[], None]) -> None:
        """Read what children say, calling `then` after each batch of messages, until
        `fd` is readable (or `limit` seconds have passed): what the daemon does while a
        claim's answer is on its way, instead of leaving children of short jobs idle for
        the round trip and the commit (queue.hotpath.meanwhile)."""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        by_fd = {c.sock.fileno(): c for c in self.children if not c.eof}
        for child_fd in by_fd:
            poller.register(child_fd, select.POLLIN)
        give_up = time.monotonic() + limit
        while True:
            left = give_up - time.monotonic()
            events = poller.poll(max(0, int(left * 1000))) if left > 0 else []
            if not events or any(ready == fd for ready, _ in events):
                return
            for ready, _ in events:
                child = by_fd.get(ready)
                if child is None:
                    continue
                self.readable(child)
                if child.eof:  # (its socket left the loop's selector, and is closed)
                    poller.unregister(ready)
                    del by_fd[ready]
            then()

    def flush_writes(self, child: Child | None = None) -> None:
        """Send what waits for `child`'s sockets (None: every child's) as far as they take
        it, and keep the loop's selector watching for writability exactly where some is
        left. The loop calls it before each wait, and when a socket is writable."""
        for one in list(self._unsent) if child is None else [child]:
            if one.eof:  # (it has exited, or is exiting: nothing more reaches it)
                one.unsent.clear()
                one.watch_unsent.clear()
            for unsent, sock in ((one.unsent, one.sock), (one.watch_unsent, one.watch)):
                if unsent and sock is not None:
                    try:
                        del unsent[: sock.send(unsent)]
                    except BlockingIOError:
                        pass
                    except OSError:  # gone: its end is read (or reaped) as usual
                        unsent.clear()
            self._watch_writes(one)
            if not one.writing[0] and not one.writing[1]:
                self._unsent.discard(one)

    def _watch_writes(self, child: Child) -> None:
        wanted = (bool(child.unsent) and not child.eof, bool(child.watch_unsent))
        if wanted == child.writing:
            return
        if wanted[0] != child.writing[0]:
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if wanted[0] else 0)
            self.selector.modify(child.sock, events, ("child", child))
        if wanted[1] != child.writing[1] and child.watch is not None:
            if wanted[1]:
                self.selector.register(child.watch, selectors.EVENT_WRITE, ("watch", child))
            else:
                self.selector.unregister(child.watch)
        child.writing = wanted

    def _stop_watching_writes(self, child: Child) -> None:
        """Before a child's sockets are closed or its own leaves the selector."""
        child.unsent.clear()
        child.watch_unsent.clear()
        if child.writing[1] and child.watch is not None:
            self.selector.unregister(child.watch)
        child.writing = (False, False)
        self._unsent.discard(child)

    def readable(self, child: Child) -> None:
        data = self._receive(child)
        if not data:
            return
        status = self._deliver(child, data)
        if status is not None:
            self._exited(child, status)

    def _receive(self, child: Child) -> bytes | None:
        """One read from a child's socket: None when nothing is there yet (non-blocking);
        b"" at its end (EOF, a broken socket or, blocking, a timeout), after which the
        child is marked eof and its socket leaves the selector."""
        try:
            data = child.sock.recv(1 << 20)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:
            self._stop_watching_writes(child)
            child.eof = True
            self.selector.unregister(child.sock)
        return data

    def _deliver(self, child: Child, data: bytes) -> int | None:
        """Hand the messages in `data` on; a hello makes the child known by its pid. The
        wait status of a child already reaped before its hello came is returned (after
        the rest of what it said was delivered): the caller reports its exit."""
        matched: int | None = None
        for message in self._messages(child, data):
            if not isinstance(message, Hello):
                self.on_message(child, message)
                continue
            if not self._hello_is_genuine(child, message.pid):
                self._break(child, f"said hello as pid {message.pid}, not its own")
                return None
            child.pid = message.pid
            self.by_pid[child.pid] = child
            if child.spawned_at >= self._forkserver_started_at:
                self._served()
            exit_ = self._unmatched_exits.pop(child.pid, None)
            # Only an exit reaped after this child was spawned can be its own: an older
            # one belongs to an earlier process that had the same pid (pids wrap).
            if exit_ is not None and exit_[1] >= child.spawned_at:
                matched = exit_[0]
        self._forget_unmatched()
        return matched

    def _messages(self, child: Child, data: bytes) -> list[ChildMessage]:
        """The complete messages in `data`. One the daemon cannot read (a frame over the
        limit, JSON it cannot parse) stops that child: its job fails with the reason, and
        nothing a child sends can raise into the loop."""
        if child.broken:
            return []
        try:
            messages = [protocol.decode(frame) for frame in child.reader.feed(data)]
            if any(isinstance(m, protocol.ParentMessage | protocol.Watch) for m in messages):
                raise protocol.ProtocolError("a parent's message kind")
            return messages  # type: ignore[return-value]
        except Exception as exc:
            self._break(child, f"sent a message the daemon cannot read ({short_error(exc)})")
            return []

    def _break(self, child: Child, why: str) -> None:
        """Stop a child that broke the protocol: its job fails with the reason. (One whose
        pid is unknown is forgotten with the children that never said hello.)"""
        child.broken = why
        log.error("child %s %s; stopping it", child.pid, why)
        child.signal_group(signal.SIGKILL)

    def _hello_is_genuine(self, child: Child, pid: int) -> bool:
        """A child says hello once, with its own pid: a process this daemon adopted (a
        subreaper's child; the child waits for that before it says hello), or one it has
        reaped already. Anything else would aim the daemon's signals elsewhere."""
        if child.pid is not None or pid <= 0:
            return False
        reaped = self._unmatched_exits.get(pid)
        if reaped is not None and reaped[1] >= child.spawned_at:
            return True
        return _parent_of(pid) == os.getpid()

    def reap(self) -> None:
        """Collect every exited child (SIGCHLD woke us) and report it once."""
        while True:
            try:
                pid, status, rusage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if pid == 0:
                break
            self.containment.process_reaped()
            self._forkserver_pids.discard(pid)
            if self.forkserver is not None and pid == self.forkserver.pid:
                self.forkserver.stop()
                self._forkserver_died()
                continue
            child = self.by_pid.get(pid)
            if child is None:
                # A child can die before its hello is read; match it when the hello comes.
                self._unmatched_exits[pid] = (status, time.monotonic())
                continue
            child.rusage = rusage
            self._exited(child, status)
        self._forget_unmatched()
        self._sweep()

    def _sweep(self) -> None:
        """Kill what dead job children left behind (containment.sweep)."""
        if not self.containment.sweep_due:
            return  # (every loop turn calls this: no work unless something was reaped)
        self.containment.sweep(
            self._forkserver_pids | set(self.by_pid), pids_known=self.starting() == 0
        )

    def _forget_unmatched(self) -> None:
        """Keep an unmatched exit only while a child spawned before it was reaped still
        waits for its hello: nothing else can claim it (an old fork server, a process
        adopted as subreaper), and kept for ever it would be pinned on the next child
        that gets the same pid."""
        waiting = [c.spawned_at for c in self.children if c.pid is None]
        oldest = min(waiting, default=None)
        for pid, (_status, reaped_at) in list(self._unmatched_exits.items()):
            if oldest is None or reaped_at < oldest:
                del self._unmatched_exits[pid]

    def _exited(self, child: Child, status: int) -> None:
        # Read what it said before dying (its outcome may be in the socket buffer). All
        # of it is there: a Unix socket queues what is sent straight to the receiver. So
        # no waiting for the end of the stream, which never comes while a process the
        # child forked still holds the child's end: the loop never waits on a child.
        while not child.eof:
            data = self._receive(child)
            if data is None:
                self._stop_watching_writes(child)
                self.selector.unregister(child.sock)
                child.eof = True
            elif data:
                self._deliver(child, data)
        self._stop_watching_writes(child)
        child.close_sockets()
        oom = self.containment.child_exited(child.pid)
        if oom is not None and not child.broken:  # (the OOM killer in its attempt's cgroup)
            child.broken = oom
        if child.pid is not None:
            self.by_pid.pop(child.pid, None)
        self.children.remove(child)
        self._give_back(child.uid)
        self.on_exit(child, status)

    def _give_back(self, uid: int | None) -> None:
        if self.uids is not None:
            self.uids.give_back(uid)

    def close(self) -> None:
        """At the daemon's exit: kill everything left (children and their orphans)."""
        self.containment.close()

    def signal_all(self, sig: int) -> None:
        for child in self.children:
            child.signal_group(sig)

    def prune_stuck_starts(self, timeout: float) -> None:
        """A child that never said hello (its fork failed) is forgotten after a while."""
        now = time.monotonic()
        for child in list(self.children):
            if child.pid is None and (child.eof or now - child.spawned_at > timeout):
                self._stop_watching_writes(child)
                if not child.eof:
                    self.selector.unregister(child.sock)
                child.close_sockets()
                self.children.remove(child)
                self._give_back(child.uid)
        self._forget_unmatched()
