"""While a claim's answer is on its way, the parent reads its children and hands them
held jobs (Supervisor.serve_until), and stops as soon as the database's socket is
readable. The real Supervisor, real socket pairs for children, a pipe for the database
socket (no fork server)."""

from __future__ import annotations

import os
import selectors
import socket
import threading
import time

from pgworkerd.daemon.supervisor import Child, Supervisor
from pgworkerd.worker import protocol
from pgworkerd.worker.protocol import ChildMessage


def test_children_are_served_until_the_database_answers() -> None:
    messages: list[tuple[int | None, ChildMessage]] = []
    after: list[int] = []
    selector = selectors.DefaultSelector()
    sup = Supervisor(selector, lambda c, m: messages.append((c.pid, m)), lambda c, s: None)
    pairs = [socket.socketpair() for _ in range(2)]
    for pid, (ours, _) in zip((201, 202), pairs, strict=True):
        ours.setblocking(False)
        child = Child(sock=ours, spawned_at=0.0, pid=pid)
        sup.children.append(child)
        selector.register(ours, selectors.EVENT_READ, ("child", child))
    db_r, db_w = os.pipe()

    def children_then_database() -> None:
        pairs[0][1].sendall(protocol.encode(protocol.Done(1)))
        time.sleep(0.05)
        pairs[1][1].sendall(protocol.encode(protocol.Started(2)))
        time.sleep(0.05)
        os.write(db_w, b"x")  # the answer comes
        time.sleep(0.05)
        pairs[0][1].sendall(protocol.encode(protocol.Done(3)))  # after it: not served

    sender = threading.Thread(target=children_then_database)
    started = time.monotonic()
    sender.start()
    sup.serve_until(db_r, 10.0, lambda: after.append(len(messages)))
    took = time.monotonic() - started
    sender.join()
    assert [(pid, type(m).__name__, getattr(m, "id", None)) for pid, m in messages] == [
        (201, "Done", 1),
        (202, "Started", 2),
    ]
    assert after == [1, 2]  # `then` after each read: held jobs go to the freed child
    assert took < 5.0  # it returned when the database's socket was readable
    for ours, theirs in pairs:
        ours.close()
        theirs.close()
    os.close(db_r)
    os.close(db_w)


def test_a_child_that_ends_while_served_leaves_the_poll_and_the_limit_bounds_it() -> None:
    selector = selectors.DefaultSelector()
    sup = Supervisor(selector, lambda c, m: None, lambda c, s: None)
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    child = Child(sock=ours, spawned_at=0.0, pid=301)
    sup.children.append(child)
    selector.register(ours, selectors.EVENT_READ, ("child", child))
    theirs.close()  # its end: read once, then no longer polled
    db_r, db_w = os.pipe()
    started = time.monotonic()
    sup.serve_until(db_r, 0.3, lambda: None)  # the database never answers: the limit ends it
    assert child.eof and 0.25 <= time.monotonic() - started < 5.0
    ours.close()
    os.close(db_r)
    os.close(db_w)
