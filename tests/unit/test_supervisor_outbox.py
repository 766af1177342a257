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

    def sendall(self, data: Any, flags: int = 0) -> None:
        self.writes += 1
        super().sendall(data, flags)


def job(job_id: int) -> bytes:
    return protocol.encode(
        protocol.Job(job_id, "h", "m:f", "default", {"n": job_id}, 1, 3, None, 99.0, concurrency=8)
    )


def test_the_jobs_of_one_dispatch_reach_a_child_in_one_write_in_order() -> None:
    ours, theirs = socket.socketpair()
    counted = CountingSocket(fileno=ours.detach())
    sup = Supervisor(selectors.DefaultSelector(), lambda c, m: None, lambda c, s: None)
    sup.settings = {"max_jobs_per_child": 1000}
    child = Child(sock=counted, spawned_at=0.0, pid=123)
    sup.children.append(child)
    for job_id in (1, 2, 3):
        sup.assign(child, job_id, job(job_id), side_by_side=8)
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
    sup.assign(child, 7, job(7))
    assert sup.send_assigned() == [child]
    assert child.outbox == []
    ours.close()
