"""Integration tier: the Supervisor in-process, with a real selector, a real fork server
and real children (no database).

The test process plays the daemon: it becomes a child subreaper (children are forked
twice and wait to be re-parented to the daemon before they say hello), pumps the selector
into Supervisor.readable() and reaps through Supervisor.reap(), as the loop does.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import os
import re
import select
import selectors
import signal
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from daemon_harness import children_of, process_title, wait_for

from pgworkerd.daemon.supervisor import FORKSERVER_RESTART_INITIAL, Child, Supervisor
from pgworkerd.worker.forkserver import PR_SET_CHILD_SUBREAPER, set_child_subreaper
from pgworkerd.worker.wire import encode

SETTINGS = {"max_jobs_per_child": 1}
JITTER = 0.1  # the Backoff default the supervisor uses
DELAY_LOGGED = re.compile(r"fork server died; restarting it in ([0-9.]+)s")


class Harness:
    """A Supervisor and what it reported, driven the way the daemon's loop drives it."""

    def __init__(self, **kwargs: Any) -> None:
        self.selector = selectors.DefaultSelector()
        self.messages: list[tuple[Child, dict[str, Any]]] = []
        self.exits: list[tuple[Child, int]] = []
        self.sup = Supervisor(
            self.selector,
            lambda child, message: self.messages.append((child, message)),
            lambda child, status: self.exits.append((child, status)),
            **kwargs,
        )

    def pump(self, timeout: float = 0.02) -> None:
        for key, _ in self.selector.select(timeout):
            kind, obj = key.data
            if kind == "child":
                self.sup.readable(obj)
        self.sup.reap()

    def pump_until(self, condition: Any, what: str, timeout: float = 30.0) -> Any:
        def step() -> Any:
            self.pump()
            return condition()

        return wait_for(step, timeout=timeout, what=what)

    def kill_forkserver(self) -> float:
        """kill -9 the fork server; returns when the supervisor noticed (reaped) it."""
        assert self.sup.forkserver is not None
        os.kill(self.sup.forkserver.pid, signal.SIGKILL)
        self.pump_until(lambda: self.sup.forkserver is None, "the fork server's death noticed")
        return time.monotonic()

    def wait_restarted(self) -> float:
        """Ask for the fork server until it is back (spawn() asks the same way)."""
        wait_for(self.sup.ensure_forkserver, timeout=60, what="the fork server restarted")
        return time.monotonic()

    def start_child(self) -> Child:
        """A warm child of the current fork server that said hello."""
        before = set(self.sup.children)
        assert self.sup.spawn()
        (child,) = set(self.sup.children) - before
        self.pump_until(lambda: child.pid is not None, "the child's hello")
        return child

    def retire_all(self) -> None:
        for child in list(self.sup.children):
            self.sup.retire(child)
        self.pump_until(lambda: not self.sup.children, "every child reaped")

    def close(self) -> None:
        self.sup.signal_all(signal.SIGKILL)
        self.sup.stop_forkserver()
        deadline = time.monotonic() + 10
        while self.sup.children and time.monotonic() < deadline:
            self.pump()
        self.selector.close()


@pytest.fixture
def harness() -> Iterator[Harness]:
    set_child_subreaper()
    h = Harness()
    try:
        yield h
    finally:
        h.close()
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        # Whatever is left re-parented to us (a fork server that was still exiting).
        for pid in children_of(os.getpid()):
            if "pgworkerd" in process_title(pid):
                with contextlib.suppress(ProcessLookupError, ChildProcessError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)


def exited(pid: int) -> bool:
    """Exited (and not reaped yet, left for Supervisor.reap; or reaped already by the
    supervisor under test: gone either way)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None
    except ChildProcessError:
        return True


def logged_delays(caplog: pytest.LogCaptureFixture) -> list[float]:
    found = (DELAY_LOGGED.search(r.getMessage()) for r in caplog.records)
    return [float(m[1]) for m in found if m is not None]


def test_the_restart_delay_starts_over_once_a_restarted_fork_server_served(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """kill -9 the fork server four times, spaced out, each restarted server forking a child
    in between: every restart comes after the initial delay (today: 1, 2, 4, 8 s)."""
    caplog.set_level(logging.INFO, logger="pgworkerd")
    harness.sup.start_forkserver([], SETTINGS)
    waited = []
    for _ in range(4):
        harness.start_child()  # the fork server serves
        harness.retire_all()
        time.sleep(0.3)  # spaced out
        died_at = harness.kill_forkserver()
        waited.append(harness.wait_restarted() - died_at)
    delays = logged_delays(caplog)
    assert len(delays) == 4, caplog.text
    for delay in delays:
        assert delay <= FORKSERVER_RESTART_INITIAL * (1 + JITTER) + 0.05, delays
    for seconds in waited:  # and the delay is kept: no restart before it is over
        assert seconds >= FORKSERVER_RESTART_INITIAL * (1 - JITTER) - 0.05, waited


def test_a_fork_server_that_dies_before_serving_is_restarted_later_and_later(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """The reset must not turn a crash loop into a restart every second."""
    caplog.set_level(logging.INFO, logger="pgworkerd")
    harness.sup.start_forkserver([], SETTINGS)
    harness.start_child()
    harness.retire_all()
    for _ in range(3):
        harness.kill_forkserver()  # at once: no child asked of it
        harness.wait_restarted()
    delays = logged_delays(caplog)
    assert len(delays) == 3, caplog.text
    for delay, nominal in zip(delays, [1.0, 2.0, 4.0], strict=True):
        assert nominal * (1 - JITTER) - 0.05 <= delay <= nominal * (1 + JITTER) + 0.05, delays


def test_a_fork_server_that_stayed_up_long_enough_has_served(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An idle daemon (no warm children) asks nothing of its fork server: surviving
    `stable_after` seconds counts as serving, or a fork server that dies once a week
    would be restarted a little later every time."""
    caplog.set_level(logging.INFO, logger="pgworkerd")
    set_child_subreaper()
    h = Harness(stable_after=1.5)
    try:
        h.sup.start_forkserver([], SETTINGS)
        h.kill_forkserver()
        h.wait_restarted()
        time.sleep(1.6)
        h.kill_forkserver()
        h.wait_restarted()
        h.kill_forkserver()  # at once: grows again
        delays = logged_delays(caplog)
        assert [round(d) for d in delays] == [1, 1, 2], delays
    finally:
        h.close()
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def test_can_start_follows_the_fork_server_and_the_warm_children(harness: Harness) -> None:
    sup = harness.sup
    sup.start_forkserver([], SETTINGS)
    assert sup.can_start()
    warm = harness.start_child()
    died_at = harness.kill_forkserver()
    assert sup.can_start(), "an idle warm child can still start a job"
    assert sup.next_deadline() is not None
    sup.retire(warm)
    harness.pump_until(lambda: not sup.children, "the warm child reaped")
    assert not sup.can_start(), "no fork server, no warm child"
    # The loop's tick brings the fork server back once its delay is over, without a
    # spawn() (nobody claims, so nobody would ask for a child).
    sup.tick(time.monotonic())
    assert not sup.can_start(), "restarted before its delay"

    def restarted() -> bool:
        sup.tick(time.monotonic())
        return sup.can_start()

    wait_for(restarted, what="the restart")
    assert time.monotonic() - died_at >= FORKSERVER_RESTART_INITIAL * (1 - JITTER) - 0.05
    assert sup.next_deadline() is None
    harness.start_child()  # and it forks


def test_a_child_killed_before_its_hello_was_read_is_reported_with_its_status(
    harness: Harness,
) -> None:
    """The reason unmatched exits are kept at all: reaped first, matched at the hello."""
    sup = harness.sup
    sup.start_forkserver([], SETTINGS)
    assert sup.spawn()
    (child,) = sup.children
    forkserver_pid = sup.forkserver.pid if sup.forkserver else -1

    def child_pid() -> int:
        pids = [
            p
            for p in children_of(os.getpid())
            if p != forkserver_pid and "pgworkerd" in process_title(p)
        ]
        return pids[0] if pids else 0

    pid = wait_for(child_pid, what="the child re-parented to us")
    # Its hello is in the socket (or about to be) but not read yet: kill and reap first.
    wait_for(
        lambda: select.select([child.sock], [], [], 0)[0], what="the child's hello in the socket"
    )
    os.kill(pid, signal.SIGKILL)

    def reaped() -> bool:
        sup.reap()
        return pid not in children_of(os.getpid())

    wait_for(reaped, what="reaped")
    assert child.pid is None and not harness.exits
    harness.pump_until(lambda: harness.exits, "the exit reported at the hello")
    ((reported, status),) = harness.exits
    assert reported is child and child.pid == pid
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def test_an_old_exit_is_not_pinned_on_a_later_child_that_got_the_same_pid(
    harness: Harness,
) -> None:
    """A process adopted as subreaper (or an old fork server) exits and is reaped while no
    child waits for its hello; much later a new child gets the same pid (pids wrap within
    hours). Its hello must not be taken for a death."""
    sup = harness.sup
    pid = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
    wait_for(lambda: exited(pid), what="/bin/true exited")
    sup.reap()
    # The later child: a live process of ours (a hello is only believed from one) that
    # got the old pid; played here by re-keying whatever the supervisor kept of the old
    # exit to the new process's pid. It says hello over a real socket pair.
    later = os.posix_spawn("/bin/sleep", ["sleep", "30"], dict(os.environ))
    if pid in sup._unmatched_exits:
        sup._unmatched_exits[later] = sup._unmatched_exits.pop(pid)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    child = Child(sock=ours, spawned_at=time.monotonic())
    sup.children.append(child)
    harness.selector.register(ours, selectors.EVENT_READ, ("child", child))
    try:
        theirs.sendall(encode({"t": "hello", "pid": later}))
        harness.pump_until(lambda: child.pid is not None, "the hello")
        harness.pump(0.1)
        assert not harness.exits, "a live child was declared dead at its hello"
        assert sup.idle() == [child]
    finally:
        theirs.close()
        if child in sup.children:  # forget it, as prune_stuck_starts would
            harness.pump_until(lambda: child.eof, "the socket's end")
            sup.children.remove(child)
        ours.close()
        os.kill(later, signal.SIGKILL)
        os.waitpid(later, 0)


def test_unmatched_exits_are_forgotten_once_no_child_waits_for_its_hello(
    harness: Harness,
) -> None:
    sup = harness.sup
    for _ in range(5):
        pid = os.posix_spawn("/bin/true", ["true"], dict(os.environ))
        wait_for(functools.partial(exited, pid), what="/bin/true exited")
        sup.reap()
    assert not sup._unmatched_exits


@pytest.mark.parametrize("claimed", ["zero", "huge", "not ours", "twice"])
def test_a_hello_that_is_not_the_childs_own_stops_that_child_only(
    harness: Harness, claimed: str
) -> None:
    """A child runs handler code, which owns the socket: a hello naming a pid that is not
    a process of this daemon's (or a second hello) would aim the daemon's signals at
    someone else, or at its own process group (pid 0)."""
    sup = harness.sup
    # ours, leading its own process group as a child does (the daemon signals the group);
    # it outlives wait_for's deadline: only the daemon's kill ends it in time
    live = os.posix_spawn("/bin/sleep", ["sleep", "1000"], dict(os.environ), setpgroup=0)
    pids = {"zero": [0], "huge": [2**70], "not ours": [1], "twice": [live, os.getppid()]}
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    child = Child(sock=ours, spawned_at=time.monotonic())
    sup.children.append(child)
    harness.selector.register(ours, selectors.EVENT_READ, ("child", child))
    try:
        for pid in pids[claimed]:
            theirs.sendall(encode({"t": "hello", "pid": pid}))
        harness.pump_until(lambda: child.broken, "the child to be stopped")
        assert "said hello as pid" in child.broken
        if claimed == "twice":  # the genuine one is killed: it broke the protocol
            assert child.pid == live
            wait_for(lambda: exited(live), what="the child to be killed")
        else:
            assert child.pid is None and not exited(live)
        assert sup.idle() == []
    finally:
        theirs.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(live, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(live, 0)
        if child in sup.children:
            sup.children.remove(child)
        ours.close()


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:"):
                out.add(target)
    return out


def test_children_asked_for_in_one_request_each_hold_only_their_own_socket(
    harness: Harness,
) -> None:
    """spawn(n) is one message to the fork server, forked by one middle process: each
    child is this process's own (re-parented), says hello with its own pid, and holds no
    sibling's socket (which would hide that sibling's EOF from the daemon)."""
    sup = harness.sup
    sup.start_forkserver([], SETTINGS)
    assert sup.spawn(4) == 4
    harness.pump_until(
        lambda: len(sup.children) == 4 and all(c.pid is not None for c in sup.children),
        "four hellos",
    )
    pids = [c.pid for c in sup.children]
    assert len(set(pids)) == 4
    assert all(p in children_of(os.getpid()) for p in pids)
    held = [_socket_inodes(p) for p in pids if p is not None]
    for i, mine in enumerate(held):
        others = set().union(*(h for j, h in enumerate(held) if j != i))
        assert not mine & others, f"child {pids[i]} shares sockets with a sibling"
    # Each one's end is its own: one killed, only its socket ends, and it is reaped.
    victim = sup.children[0]
    victim.signal_group(signal.SIGKILL)
    harness.pump_until(lambda: victim not in sup.children, "the killed child reaped")
    assert [c for c, _ in harness.exits] == [victim]
    assert all(not c.eof for c in sup.children)
    harness.retire_all()
