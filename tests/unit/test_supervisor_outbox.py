"""The parent hands a child the jobs of one dispatch in one write (a child running an
async handler's jobs side by side wakes once for all of them), and says which children
it could not write to. A real socket pair and the real Supervisor (no fork server)."""

from __future__ import annotations

import selectors
import socket
from typing import Any

from pgworkerd.daemon.supervisor import Child, Supervisor
from pgworkerd.worker import protocol
from pgworkerd.worker.wire import FrameReader


class CountingSocket(socket.socket):
    """A real socket that counts its writes."""

    writes = 0

    def send(self, data: Any, flags: int = 0) -> int:
        self.writes += 1
        return super().send(data, flags)


def job(job_id: int) -> bytes:
    return protocol.encode(
        protocol.Job(job_id, "h", "m:f", "default", {"n": job_id}, 1, 3, None, 99.0, concurrency=8)
    )


def watch(job_id: int) -> bytes:
    return protocol.encode(protocol.Watch(job_id, 1, 99.0, None, 8))


def test_the_jobs_of_one_dispatch_reach_a_child_in_one_write_in_order() -> None:
    ours, theirs = socket.socketpair()
    counted = CountingSocket(fileno=ours.detach())
    sup = Supervisor(selectors.DefaultSelector(), lambda c, m: None, lambda c, s: None)
    sup.settings = {"max_jobs_per_child": 1000}
    child = Child(sock=counted, spawned_at=0.0, pid=123)
    sup.children.append(child)
    for job_id in (1, 2, 3):
        sup.assign(child, job_id, job(job_id), watch(job_id), side_by_side=8)
    assert counted.writes == 0  # nothing is sent before send_assigned
    assert sup.send_assigned() == []
    assert counted.writes == 1 and child.outbox == [] and child.job == 1
    theirs.settimeout(5)
    frames = list(FrameReader().feed(theirs.recv(1 << 16)))
    jobs = [m for m in map(protocol.decode, frames) if isinstance(m, protocol.Job)]
    assert len(jobs) == len(frames) and [m.id for m in jobs] == [1, 2, 3]
    assert jobs[2].payload == {"n": 3}
    assert sup.send_assigned() == [] and counted.writes == 1  # nothing more to send
    counted.close()
    theirs.close()


def test_a_child_that_cannot_be_written_to_is_returned() -> None:
    ours, theirs = socket.socketpair()
    theirs.close()
    sup = Supervisor(selectors.DefaultSelector(), lambda c, m: None, lambda c, s: None)
    child = Child(sock=ours, spawned_at=0.0, pid=124)
    sup.children.append(child)
    sup.assign(child, 7, job(7), watch(7))
    assert sup.send_assigned() == [child]
    assert child.outbox == []
    ours.close()


def test_what_a_socket_does_not_take_waits_and_goes_as_it_drains() -> None:
    """A job larger than the socket's buffer: the part that fits is written, the rest
    waits (the loop does not), the socket is watched for writability exactly while some
    is left, a later message waits behind it, and the child reads every frame whole."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    selector = selectors.DefaultSelector()
    sup = Supervisor(selector, lambda c, m: None, lambda c, s: None)
    sup.settings = {"max_jobs_per_child": 1000}
    child = Child(sock=ours, spawned_at=0.0, pid=125)
    child.on_unsent = sup._unsent.add
    selector.register(ours, selectors.EVENT_READ, ("child", child))
    sup.children.append(child)
    big = protocol.encode(
        protocol.Job(9, "h", "m:f", "default", {"pad": "x" * (4 << 20)}, 1, 3, None, 99.0)
    )
    sup.assign(child, 9, big, watch(9))
    assert sup.send_assigned() == []  # not a failure: the rest waits
    assert 0 < len(child.unsent) < len(big)
    assert child.send(protocol.Exit())  # behind the job, never inside it
    sup.flush_writes()
    assert selector.get_key(ours).events == selectors.EVENT_READ | selectors.EVENT_WRITE
    reader, got = FrameReader(), list[protocol.Message]()
    theirs.settimeout(5)
    while len(got) < 2:
        got += [protocol.decode(f) for f in reader.feed(theirs.recv(1 << 20))]
        sup.flush_writes(child)  # (what the loop does when the socket is writable)
    assert isinstance(got[0], protocol.Job) and got[0].payload == {"pad": "x" * (4 << 20)}
    assert isinstance(got[1], protocol.Exit)
    assert not child.unsent and child not in sup._unsent
    assert selector.get_key(ours).events == selectors.EVENT_READ
    ours.close()
    theirs.close()


def test_the_watcher_is_sent_what_the_fence_needs_never_the_job_s_data() -> None:
    """A child's watcher socket carries each job's Watch (id, attempt, deadline, memory
    limit, concurrency) and each renewal; the Job with its payload goes to the child
    alone, so the watcher neither receives nor parses what the enqueuer wrote."""
    ours, theirs = socket.socketpair()
    watch_ours, watch_theirs = socket.socketpair()
    sup = Supervisor(selectors.DefaultSelector(), lambda c, m: None, lambda c, s: None)
    sup.settings = {"max_jobs_per_child": 1000}
    child = Child(sock=ours, spawned_at=0.0, pid=126, watch=watch_ours)
    sup.children.append(child)
    secret = "enqueuer-data-" + "x" * 1000
    message = protocol.Job(5, "h", "m:f", "default", {"s": secret}, 2, 3, None, 42.5, 1 << 20)
    sup.assign(child, 5, protocol.encode(message), protocol.encode(protocol.Watch.of(message)))
    assert sup.send_assigned() == []
    assert child.send(protocol.LeaseExtended(50.0, 5))
    assert child.send(protocol.Cancel(5))  # the child's alone
    theirs.settimeout(5)
    watch_theirs.settimeout(5)
    raw = watch_theirs.recv(1 << 16)
    assert b"enqueuer-data" not in raw
    watched = [protocol.decode(f) for f in FrameReader().feed(raw)]
    assert watched == [protocol.Watch(5, 2, 42.5, 1 << 20, None), protocol.LeaseExtended(50.0, 5)]
    told = [protocol.decode(f) for f in FrameReader().feed(theirs.recv(1 << 16))]
    assert told == [message, protocol.LeaseExtended(50.0, 5), protocol.Cancel(5)]
    for sock in (ours, theirs, watch_ours, watch_theirs):
        sock.close()


def test_a_child_that_sends_a_watch_is_stopped_as_one_that_broke_the_protocol() -> None:
    """A Watch goes from the daemon to a watcher only: a child that sends one (a handler
    writing to its socket) is stopped as any child sending a parent's message kind."""
    ours, theirs = socket.socketpair()
    sup = Supervisor(selectors.DefaultSelector(), lambda c, m: None, lambda c, s: None)
    child = Child(sock=ours, spawned_at=0.0, pid=None)  # (no pid: no signal is sent)
    assert sup._messages(child, protocol.encode(protocol.Watch(5, 1, 1.0))) == []
    assert "a parent's message kind" in child.broken
    ours.close()
    theirs.close()
