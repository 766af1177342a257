"""Unit tier: what the child's channel takes as being about the job it runs now."""

from __future__ import annotations

import socket

from pgworkerd.worker.child import _Channel
from pgworkerd.worker.watcher import Watcher


def test_a_lease_or_cancel_for_an_ended_job_is_not_about_the_next() -> None:
    ours, theirs = socket.socketpair()
    try:
        # (no watcher process: only the channel's bookkeeping is exercised)
        channel = _Channel(ours, Watcher(pid=0, relay=-1, events=-1, send_lock=-1, acks=-1))
        assert not channel.is_current(7)  # idle: a late message about job 7 is stale
        channel.job_id = 8
        assert channel.is_current(8) and not channel.is_current(7)
        assert channel.is_current(None)  # a parent of release 0.2 names no job
    finally:
        ours.close()
        theirs.close()
