"""The parent's side of its children: the fork server, warm children, messages, reaping.

The daemon decides what happens to jobs; this module only runs processes and reports
what they say and how they end. Children are reaped here, in one place, and exit
statuses are decoded once (describe_exit).
"""

from __future__ import annotations

import errno
import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pgworkerd.describe import short_error
from pgworkerd.worker import protocol
from pgworkerd.worker.forkserver import ForkServer
from pgworkerd.worker.protocol import ChildMessage, Exit, Hello, ParentMessage
from pgworkerd.worker.wire import FrameReader

log = logging.getLogger("pgworkerd")


def describe_exit(status: int) -> str:
    """A wait status as words: 'killed by SIGKILL' or 'exited with code 3'."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        hint = " (the OOM killer or kill -9)" if sig == signal.SIGKILL else ""
        hint = " (segmentation fault)" if sig == signal.SIGSEGV else hint
        return f"killed by {name}{hint}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


@dataclass(eq=False)
class Child:
    """One child process and its socket; `job` is the id it runs, if any."""

    sock: socket.socket
    spawned_at: float
    pid: int | None = None  # known once the child says hello
    job: int | None = None
    jobs_run: int = 0
    exiting: bool = False  # told to exit, or will exit after its current job
    reader: FrameReader = field(default_factory=FrameReader)
    eof: bool = False
    broken: str = ""  # why the daemon stopped it for a message it could not read

    def send(self, message: ParentMessage) -> bool:
        """Best effort: a child that is gone cannot be told anything."""
        return self.send_encoded(protocol.encode(message))

    def send_encoded(self, frame: bytes) -> bool:
        try:
            self.sock.sendall(frame)
            return True
        except OSError:
            return False

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
    ) -> None:
        self.selector = selector
        self.on_message = on_message
        self.on_exit = on_exit
        self.forkserver: ForkServer | None = None
        self.modules: list[str] = []
        self.settings: dict[str, Any] = {}
        self.children: list[Child] = []
        self.by_pid: dict[int, Child] = {}
        self._unmatched_exits: dict[int, int] = {}  # reaped before their hello arrived
        self._forkserver_failures = 0
        self._forkserver_retry_at = 0.0

    # -- fork server -------------------------------------------------------------------

    def start_forkserver(self, modules: list[str], settings: dict[str, Any]) -> None:
        """(Re)start the fork server; on failure the old one keeps serving."""
        new = ForkServer.start(modules, settings)
        old, self.forkserver = self.forkserver, new
        self.modules, self.settings = modules, settings
        if old is not None:
            old.stop()
            # Warm children of the old fork server carry old handler code: retire them.
            for child in self.idle():
                self.retire(child)

    def _forkserver_died(self) -> None:
        self.forkserver = None
        self._forkserver_failures += 1
        delay = min(30.0, 0.5 * 2 ** min(self._forkserver_failures, 6))
        self._forkserver_retry_at = time.monotonic() + delay
        log.error("fork server died; restarting it in %.1fs", delay)

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
        log.info("fork server restarted (pid %d)", self.forkserver.pid)  # type: ignore[union-attr]
        return True

    def stop_forkserver(self) -> None:
        if self.forkserver is not None:
            self.forkserver.stop()
            self.forkserver = None

    # -- children ----------------------------------------------------------------------

    def spawn(self) -> bool:
        if not self.ensure_forkserver():
            return False
        assert self.forkserver is not None
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.forkserver.spawn(theirs)
        except OSError as exc:
            ours.close()
            log.error("fork server unreachable (%s)", exc)
            self.forkserver.stop()
            self._forkserver_died()
            return False
        finally:
            theirs.close()
        ours.setblocking(False)
        child = Child(sock=ours, spawned_at=time.monotonic())
        self.children.append(child)
        self.selector.register(ours, selectors.EVENT_READ, ("child", child))
        return True

    def can_start(self) -> bool:
        """Whether a job claimed now could start soon: a fork server is up to start a
        child for it, or a warm child is idle. (Claims wait while not.)"""
        return self.forkserver is not None or bool(self.idle())

    def idle(self) -> list[Child]:
        """Warm children ready for a job."""
        return [
            c
            for c in self.children
            if c.pid is not None and c.job is None and not c.exiting and not c.eof
        ]

    def starting(self) -> int:
        return sum(1 for c in self.children if c.pid is None and not c.eof)

    def retire(self, child: Child) -> None:
        child.exiting = True
        child.send(Exit())

    def assign(self, child: Child, frame: bytes) -> bool:
        """Hand a job (its message, encoded already) to an idle child; the caller has
        linked the child to its job (child.job)."""
        child.jobs_run += 1
        if child.jobs_run >= int(self.settings.get("max_jobs_per_child", 1)):
            child.exiting = True
        return child.send_encoded(frame)

    def readable(self, child: Child) -> None:
        try:
            data = child.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            child.eof = True
            self.selector.unregister(child.sock)
            return
        for message in self._messages(child, data):
            if isinstance(message, Hello):
                child.pid = message.pid
                self.by_pid[child.pid] = child
                status = self._unmatched_exits.pop(child.pid, None)
                if status is not None:
                    self._exited(child, status)
                    return
                continue
            self.on_message(child, message)

    def _messages(self, child: Child, data: bytes) -> list[ChildMessage]:
        """The complete messages in `data`. One the daemon cannot read (a frame over the
        limit, JSON it cannot parse) stops that child: its job fails with the reason, and
        nothing a child sends can raise into the loop."""
        if child.broken:
            return []
        try:
            messages = [protocol.decode(frame) for frame in child.reader.feed(data)]
            if any(isinstance(m, protocol.ParentMessage) for m in messages):
                raise protocol.ProtocolError("a parent's message kind")
            return messages  # type: ignore[return-value]
        except Exception as exc:
            child.broken = f"sent a message the daemon cannot read ({short_error(exc)})"
            log.error("child %s %s; stopping it", child.pid, child.broken)
            child.signal_group(signal.SIGKILL)
            return []

    def reap(self) -> None:
        """Collect every exited child (SIGCHLD woke us) and report it once."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if pid == 0:
                return
            if self.forkserver is not None and pid == self.forkserver.pid:
                self.forkserver.stop()
                self._forkserver_died()
                continue
            child = self.by_pid.get(pid)
            if child is None:
                # A child can die before its hello is read; match it when the hello comes.
                self._unmatched_exits[pid] = status
                continue
            self._exited(child, status)

    def _exited(self, child: Child, status: int) -> None:
        # Read what it said before dying (its outcome may be in the socket buffer).
        if not child.eof:
            child.sock.setblocking(True)
            child.sock.settimeout(0.5)
            while not child.eof:
                try:
                    data = child.sock.recv(1 << 20)
                except OSError:
                    data = b""
                if not data:
                    child.eof = True
                    self.selector.unregister(child.sock)
                    break
                for message in self._messages(child, data):
                    self.on_message(child, message)
        child.sock.close()
        if child.pid is not None:
            self.by_pid.pop(child.pid, None)
        self.children.remove(child)
        self.on_exit(child, status)

    def signal_all(self, sig: int) -> None:
        for child in self.children:
            child.signal_group(sig)

    def prune_stuck_starts(self, timeout: float) -> None:
        """A child that never said hello (its fork failed) is forgotten after a while."""
        now = time.monotonic()
        for child in list(self.children):
            if child.pid is None and (child.eof or now - child.spawned_at > timeout):
                if not child.eof:
                    self.selector.unregister(child.sock)
                child.sock.close()
                self.children.remove(child)
