"""pgworkerd: runs long background jobs stored in PostgreSQL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgworkerd.version import __version__

if TYPE_CHECKING:
    from pgworkerd.batches import BatchIds, batch, batch_members
    from pgworkerd.child import Done, GiveUp, Snooze, WaitFor
    from pgworkerd.client import (
        DuplicateJob,
        InvalidJob,
        JobFailed,
        JobInfo,
        JobNotFound,
        JobSpec,
        WaitTimeout,
        enqueue,
        enqueue_many,
        enqueue_typed,
        get,
        wait,
    )
    from pgworkerd.signals import SignalRefused, SignalSent, signal

__all__ = [
    "BatchIds",
    "Done",
    "DuplicateJob",
    "GiveUp",
    "InvalidJob",
    "JobFailed",
    "JobInfo",
    "JobNotFound",
    "JobSpec",
    "SignalRefused",
    "SignalSent",
    "Snooze",
    "WaitFor",
    "WaitTimeout",
    "__version__",
    "batch",
    "batch_members",
    "enqueue",
    "enqueue_many",
    "enqueue_typed",
    "get",
    "signal",
    "wait",
]
# Waiting for a job (client.get, client.wait) and a handler's outcomes (Snooze, GiveUp,
# Done with follow-ups).
_WAITING = ("JobFailed", "JobInfo", "JobNotFound", "WaitTimeout", "get", "wait")
_OUTCOMES = ("Done", "GiveUp", "Snooze", "WaitFor")
# Durable waits: signalling a job (pgworkerd.signals).
_SIGNALS = ("SignalRefused", "SignalSent", "signal")
# Batches: fan out, fan in to one callback (pgworkerd.batches).
_BATCHES = ("BatchIds", "batch", "batch_members")


def __getattr__(name: str) -> Any:
    # Loaded on first use, not with the package: `pgworkerd run` must mask a password in
    # its argv before psycopg's ~0.2 s import (pgworkerd.masking).
    if name in (
        "DuplicateJob",
        "InvalidJob",
        "JobSpec",
        "enqueue",
        "enqueue_many",
        "enqueue_typed",
    ):
        from pgworkerd import client

        return getattr(client, name)
    if name in _WAITING:
        from pgworkerd import client

        return getattr(client, name)
    if name in _BATCHES:
        from pgworkerd import batches

        return getattr(batches, name)
    if name in _SIGNALS:
        from pgworkerd import signals

        return getattr(signals, name)
    if name in _OUTCOMES:  # the child side's, through its shim: loads no psycopg
        from pgworkerd import child

        return getattr(child, name)
    raise AttributeError(f"module 'pgworkerd' has no attribute {name!r}")
