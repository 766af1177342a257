"""Synthetic idle hosts for bench/fleet.py: the statements an idle daemon sends, at the
rates it sends them, for many made-up hosts over one connection.

"after" uses the daemon's own constants (pgworkerd.daemon.presence and .claimer), so the
simulation follows the code; "before" the rates of the code before targeted wake-ups
(a heartbeat every second, every daemon checking for stale peers every 15 s, every daemon
polling every poll_interval), with the same statements.
"""

from __future__ import annotations

import heapq
import random
import socket
import time
from collections.abc import Callable
from typing import Any

import psycopg

from pgworkerd.config import WorkerConfig
from pgworkerd.daemon.claimer import MAX_POLL_PERIOD
from pgworkerd.daemon.peers import FLEET_POLLERS
from pgworkerd.daemon.presence import HEARTBEAT_IDLE, PEERS_REFRESH, PEERS_REFRESH_MAX
from pgworkerd.queue import lease, registry

# a daemon's registry secret (schema 24), the same for every row of these tests
SECRET = "test-registry-secret-" + "x" * 32

SCHEMA = "pgworkerd"
HANDLER = "record_start"
QUEUES = ["default"]


def rates(code: str, hosts: int) -> dict[str, float]:
    """Seconds between two of each statement of one idle host."""
    w = WorkerConfig()
    stale_quarter = max(registry.STALE_AFTER_SECONDS, 6 * w.renew_interval) / 4
    if code == "before":
        return {"heartbeat": 1.0, "stale": stale_quarter, "poll": w.poll_interval}
    poll = w.poll_interval
    if hosts > FLEET_POLLERS:
        poll = min(max(w.poll_interval, MAX_POLL_PERIOD), w.poll_interval * hosts / FLEET_POLLERS)
    return {
        "heartbeat": HEARTBEAT_IDLE,
        "stale": stale_quarter * hosts,
        "poll": poll,
        "peers": min(PEERS_REFRESH_MAX, PEERS_REFRESH * max(1.0, hosts / FLEET_POLLERS)),
    }


def infos(ids: list[str]) -> dict[str, registry.WorkerInfo]:
    host = socket.gethostname()
    return {i: registry.WorkerInfo(i, host, 0, "sim", QUEUES, [HANDLER], 1) for i in ids}


def register(conn: psycopg.Connection[Any], ids: list[str]) -> None:
    for info in infos(ids).values():
        registry.register(conn, info, "running", SCHEMA, secret=SECRET)


def host_schedule(
    conn: psycopg.Connection[Any], ids: list[str], stop: float, code: str, hosts: int
) -> None:
    """Send each of `ids`' statements on its own jittered schedule until `stop`
    (time.monotonic()); they are registered already."""
    every = rates(code, hosts)
    capacity = {
        HANDLER: lease.HandlerCapacity(
            lease_seconds=60.0,
            free=1,
            max_attempts=None,
            queues=None,
            max_running=None,
            max_running_per_key=None,
        )
    }
    rows = infos(ids)
    actions: dict[str, Callable[[str], object]] = {
        "heartbeat": lambda i: registry.heartbeat(
            conn, rows[i], "running", [], SCHEMA, secret=SECRET
        ),
        "stale": lambda i: registry.mark_stale(conn, 60.0, SCHEMA),
        "poll": lambda i: (
            lease.claim_checked(conn, i, queues=QUEUES, handlers=capacity, limit=1, schema=SCHEMA),
            lease.next_wakeups(conn, QUEUES, [HANDLER], schema=SCHEMA),
        ),
        "peers": lambda i: registry.peers(conn, 60.0, SCHEMA),
    }
    now = time.monotonic()
    queue = [
        (now + random.uniform(0, period), name, i) for name, period in every.items() for i in ids
    ]
    heapq.heapify(queue)
    while queue:
        at, name, i = heapq.heappop(queue)
        if at >= stop:
            break
        wait = at - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        actions[name](i)
        heapq.heappush(queue, (at + every[name] * random.uniform(0.9, 1.1), name, i))
