"""Typed wrappers for the daemon registry statements (the `workers` table)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from pgworkerd.queue.queries import query

# A daemon heartbeats at least every 10 s (daemon/presence.py); one silent this long is
# dead (or cut off from the database) and is marked gone, by any other daemon or by
# `drain --wait`. Long before that, a daemon silent for twice the heartbeat interval it
# recorded is shown as silent (migration 0021, SQL function daemon_silent).
STALE_AFTER_SECONDS = 60.0
# What a registry row says when the daemon wrote no interval (code before schema 21).
DEFAULT_HEARTBEAT_INTERVAL = 10.0


def new_secret() -> str:
    """A daemon's registry secret (schema 24): drawn once per daemon, named in every write
    of its registry row, never logged; the database keeps only its SHA-256."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    host: str
    pid: int
    version: str
    queues: Sequence[str]
    handlers: Sequence[str]
    slots: int
    # handler -> {"queues", "slots", "max_running", "max_running_per_key"}: what `explain`
    # reads to tell whether a limit holds a job back (migration 0016)
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def register(
    conn: psycopg.Connection,
    info: WorkerInfo,
    state: str,
    schema: str,
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
    *,
    secret: str,
) -> None:
    """Record the daemon under its `secret` (new_secret; the same for every later write of
    its row); `heartbeat_interval`: the most seconds it lets pass before its next
    heartbeat (1 s to an hour: the registry refuses others)."""
    conn.execute(
        query("worker_register", schema),
        {
            "id": info.id,
            "secret": secret,
            "host": info.host,
            "pid": info.pid,
            "version": info.version,
            "queues": list(info.queues),
            "handlers": list(info.handlers),
            "slots": info.slots,
            "state": state,
            "settings": Jsonb(dict(info.settings)),
            "heartbeat_interval": heartbeat_interval,
        },
    )


@dataclass(frozen=True)
class HandBack:
    """A hand-back request as the registry holds it (migration 0017): hand back the running
    jobs it targets after the grace (None: each handler's stop_grace), and claim none of
    them meanwhile. requested_at tells one request from the next."""

    requested_at: datetime
    grace: float | None = None
    queues: frozenset[str] | None = None  # None: every queue
    handlers: frozenset[str] | None = None  # None: every handler

    def targets(self, queue: str | None, handler: str | None) -> bool:
        """Whether a job of `queue` and `handler` is to be handed back (None: unknown,
        so possibly)."""
        return (self.queues is None or queue is None or queue in self.queues) and (
            self.handlers is None or handler is None or handler in self.handlers
        )

    @property
    def everything(self) -> bool:
        return self.queues is None and self.handlers is None


@dataclass(frozen=True)
class DrainRequest:
    """What the registry asks of a daemon: drain (claim nothing; jobs finish), and perhaps
    hand jobs back."""

    drain: bool = False
    hand_back: HandBack | None = None


def heartbeat(
    conn: psycopg.Connection,
    info: WorkerInfo,
    state: str,
    in_flight: Sequence[int],
    schema: str,
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL,
    *,
    secret: str,
) -> DrainRequest | None:
    """Returns the drain requested of this daemon; None if our row is gone (re-register).
    `heartbeat_interval`: the most seconds until the next heartbeat, as at register;
    `secret`: the one it registered with."""
    row = conn.execute(
        query("worker_heartbeat", schema),
        {
            "id": info.id,
            "secret": secret,
            "state": state,
            "in_flight": list(in_flight),
            "queues": list(info.queues),
            "handlers": list(info.handlers),
            "slots": info.slots,
            "settings": Jsonb(dict(info.settings)),
            "heartbeat_interval": heartbeat_interval,
        },
    ).fetchone()
    if row is None:
        return None
    drain, requested_at, grace, queues, handlers = row
    hand_back = (
        None
        if requested_at is None
        else HandBack(
            requested_at,
            None if grace is None else float(grace),
            None if queues is None else frozenset(queues),
            None if handlers is None else frozenset(handlers),
        )
    )
    return DrainRequest(bool(drain), hand_back)


def deregister(conn: psycopg.Connection, worker_id: str, schema: str, *, secret: str) -> None:
    conn.execute(query("worker_deregister", schema), {"id": worker_id, "secret": secret})


def mark_stale(
    conn: psycopg.Connection, stale_after: float, schema: str
) -> list[tuple[str, str, int]]:
    """Mark daemons silent for over `stale_after` seconds gone; returns their (id, host,
    pid). One caller at a time: empty when another holds the lock (it marks them)."""
    rows = conn.execute(query("worker_mark_stale", schema), {"stale_after": stale_after}).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def peers(
    conn: psycopg.Connection, stale_after: float, schema: str
) -> list[tuple[str, list[str], list[str], int]]:
    """The running daemons heartbeating within `stale_after` seconds: (id, queues,
    handlers, slots)."""
    rows = conn.execute(query("worker_peers", schema), {"stale_after": stale_after}).fetchall()
    return [(r[0], list(r[1]), list(r[2]), int(r[3])) for r in rows]


def wake_channel_set(
    conn: psycopg.Connection, worker_id: str, listening: bool, schema: str, *, secret: str
) -> bool:
    """Say in the daemon's own row whether it listens on its own wake channel (schema
    40); False when the row is not there."""
    row = conn.execute(
        query("worker_wake_channel_set", schema),
        {"id": worker_id, "secret": secret, "listening": listening},
    ).fetchone()
    return bool(row and row[0])


def wake_forward(
    conn: psycopg.Connection,
    queue: str,
    handler: str,
    job_id: int,
    count: int,
    skip: int,
    hops: int,
    schema: str,
) -> int:
    """Hand a wake-up aimed at this daemon on to the group ranked from `skip` (schema 40:
    workers_wake); returns how many were notified on their own channel."""
    params = {
        "queue": queue,
        "handler": handler,
        "job_id": job_id,
        "n": count,
        "skip": skip,
        "hops": hops,
    }
    row = conn.execute(query("wake_forward", schema), params).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def wake_send(conn: psycopg.Connection, payload: str, schema: str) -> None:
    """NOTIFY the wake channel (a forwarded wake-up; see pgworkerd/daemon/peers.py)."""
    conn.execute(query("wake_send", schema), {"payload": payload})
