"""Unit tier: what the child's channel takes as being about the job it runs now."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from typing import Any

from pgworkerd.worker import protocol
from pgworkerd.worker.child import _Channel
from pgworkerd.worker.protocol import Beat, Done, Started
from pgworkerd.worker.watcher import Watcher
from pgworkerd.worker.wire import FrameReader


def test_a_lease_or_cancel_for_an_ended_job_is_not_about_the_next() -> None:
    ours, theirs = socket.socketpair()
    try:
        # (no watcher process: only the channel's bookkeeping is exercised)
        channel = _Channel(ours, Watcher(pid=0, events=-1, send_lock=-1, acks=-1))
        assert not channel.is_current(7)  # idle: a late message about job 7 is stale
        channel.job_id = 8
        assert channel.is_current(8) and not channel.is_current(7)
        assert channel.is_current(None)  # a parent of release 0.2 names no job
    finally:
        ours.close()
        theirs.close()


class CountingSocket(socket.socket):
    """A real socket that counts its writes."""

    writes = 0

    def sendall(self, data: Any, flags: int = 0) -> None:
        self.writes += 1
        super().sendall(data, flags)


def test_a_concurrent_sessions_messages_go_in_one_write_per_turn_of_its_loop_in_order() -> None:
    ours, theirs = socket.socketpair()
    counted = CountingSocket(fileno=ours.detach())
    lock_fd = os.memfd_create("send-lock")
    channel = _Channel(counted, Watcher(pid=0, events=-1, send_lock=lock_fd, acks=-1))
    writes_after_turn: list[int] = []

    async def session() -> None:
        loop = asyncio.get_running_loop()
        channel.coalesce(loop)
        for job_id in (1, 2, 3):  # what three short jobs send in one turn of the loop
            channel.send(Started(job_id))
            channel.send(Done(job_id, {"n": job_id}))
        assert counted.writes == 0  # held until the loop's ready callbacks have run
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        writes_after_turn.append(counted.writes)
        channel.send(Started(4))
        # another thread's message (the monitor's beat) sends what is held first
        other = threading.Thread(target=channel.send, args=(Beat(4, "half"),))
        other.start()
        other.join()
        channel.send(Done(4))
        channel.coalesce(None)  # the session ends: what is held goes

    try:
        asyncio.run(session())
        assert writes_after_turn == [1]
        assert counted.writes == 3
        theirs.settimeout(5)
        frames = list(FrameReader().feed(theirs.recv(1 << 16)))
        got = [(type(m).__name__, getattr(m, "id", None)) for m in map(protocol.decode, frames)]
        assert got == [
            ("Started", 1), ("Done", 1), ("Started", 2), ("Done", 2), ("Started", 3),
            ("Done", 3), ("Started", 4), ("Beat", 4), ("Done", 4),
        ]  # fmt: skip
        # outside a session, each message is its own write at once
        channel.send(Started(5))
        assert counted.writes == 4
    finally:
        counted.close()
        theirs.close()
        os.close(lock_fd)
