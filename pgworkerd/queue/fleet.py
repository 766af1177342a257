"""What `drain`, `resume` and `pause` change: the fleet of daemons, through the database
(so they work across hosts and need no signal rights). What `status` shows is read by
queue/views.py."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg.rows import dict_row

from pgworkerd.queue import registry
from pgworkerd.queue.queries import query


def _rows(
    conn: psycopg.Connection, name: str, schema: str, params: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query(name, schema), params or {}).fetchall()


def _target_host(worker_id: str | None, all_hosts: bool) -> str | None:
    return None if (all_hosts or worker_id) else socket.gethostname()


def request_drain(
    conn: psycopg.Connection,
    schema: str,
    *,
    drain: bool,
    worker_id: str | None = None,
    all_hosts: bool = False,
) -> list[dict[str, Any]]:
    """Ask this host's daemons, one daemon, or all to drain (let their jobs finish), or
    with drain=False lift every drain of theirs, plain or hand-back (`resume`); returns
    the daemons affected."""
    host = _target_host(worker_id, all_hosts)
    if not drain:
        return _rows(conn, "worker_lift_drain", schema, {"id": worker_id, "host": host})
    return _rows(
        conn,
        "worker_request_drain",
        schema,
        {
            "id": worker_id,
            "host": host,
            "hand_back": False,
            "grace": None,
            "queues": None,
            "handlers": None,
        },
    )


def request_hand_back(
    conn: psycopg.Connection,
    schema: str,
    *,
    grace: float | None,
    queues: Sequence[str] | None = None,
    handlers: Sequence[str] | None = None,
    worker_id: str | None = None,
    all_hosts: bool = False,
) -> list[dict[str, Any]]:
    """Ask this host's daemons, one daemon, or all to hand back their running jobs (of
    `queues` and `handlers`; None: all) after `grace` seconds (None: each handler's
    stop_grace), claiming none of them meanwhile; returns the daemons asked. Checked again
    by the database (drain_request, migration 0017): a bad value changes nothing."""
    return _rows(
        conn,
        "worker_request_drain",
        schema,
        {
            "id": worker_id,
            "host": _target_host(worker_id, all_hosts),
            "hand_back": True,
            "grace": grace,
            "queues": None if queues is None else list(queues),
            "handlers": None if handlers is None else list(handlers),
        },
    )


def find_daemon(conn: psycopg.Connection, schema: str, worker_id: str) -> dict[str, Any] | None:
    """A daemon's registry row as `status` lists it (live, or gone within the hour)."""
    return next((w for w in _rows(conn, "worker_list", schema) if w["id"] == worker_id), None)


# -- pausing queues and handlers (migration 0009) -------------------------------------------

PAUSE_KINDS = ("queue", "handler")


def set_paused(
    conn: psycopg.Connection,
    schema: str,
    kind: str,
    name: str,
    *,
    pause: bool,
    comment: str | None = None,
    requested_by: str | None = None,
) -> bool:
    """Pause (or with pause=False resume) a queue or handler fleet-wide; returns whether
    that changed anything (False: it was already paused, or was not paused). The claim
    reads the paused table, so daemons need no restart or signal. `comment` is the
    reason; `requested_by` the person who asked (schema 38: paused_add), checked by
    pause_text_problem first (the database checks again)."""
    if pause and requested_by is not None:
        for problem in (
            pause_text_problem("the reason", comment, REASON_MAX, empty_ok=True),
            pause_text_problem("who asked", requested_by, BY_MAX),
        ):
            if problem:
                raise ValueError(problem)
    params = {
        "pause": pause,
        "kind": kind,
        "name": name,
        "comment": comment,
        "requested_by": requested_by,
    }
    [row] = _rows(conn, "paused_set", schema, params)
    return bool(row["changed"])


# A pause's reason and the name of who asked, at most (paused_add checks them too).
REASON_MAX = 500
BY_MAX = 128


def pause_text_problem(
    what: str, text: str | None, limit: int, *, empty_ok: bool = False
) -> str | None:
    """Why a pause's reason or person cannot be stored (None: it can, or it is None):
    longer than `limit`, or with a control character (a NUL, which PostgreSQL text
    cannot hold, a line break, an escape sequence)."""
    if text is None:
        return None
    if not text and not empty_ok:
        return f"{what} must not be empty"
    if len(text) > limit:
        return f"{what} must be at most {limit} characters, not {len(text)}"
    if "\x00" in text:
        return f"{what} contains a NUL character, which cannot be stored"
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in text):
        return f"{what} must be one line without control characters"
    return None


def served(conn: psycopg.Connection, schema: str, kind: str, name: str) -> bool:
    """Whether a live daemon serves queue or handler `name` (kind "queue" or "handler")."""
    [row] = _rows(conn, "paused_target_served", schema, {"kind": kind, "name": name})
    return bool(row["served"])


def daemons_still_busy(
    conn: psycopg.Connection, schema: str, ids: set[str]
) -> list[dict[str, Any]]:
    """Of the given daemons, those not yet drained (state) or still holding jobs."""
    return [
        w
        for w in _rows(conn, "worker_list", schema)
        if w["id"] in ids and w["state"] != "gone" and (w["state"] != "drained" or w["in_flight"])
    ]


@dataclass(frozen=True)
class DrainProgress:
    """One look at the daemons a drain waits for."""

    # Those not yet drained or still holding jobs (worker_list rows).
    busy: list[dict[str, Any]]
    # The ids of the jobs they still run, sorted.
    running_jobs: list[int]
    # Daemons waited for that this look marked gone (id, host, pid): silent for
    # registry.STALE_AFTER_SECONDS, so they are waited for no longer.
    marked_gone: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def drained(self) -> bool:
        return not self.busy


def wait_drained(
    conn: psycopg.Connection,
    schema: str,
    ids: Collection[str],
    timeout: float | None,
    on_progress: Callable[[DrainProgress], None] = lambda progress: None,
    *,
    interval: float = 0.5,
) -> DrainProgress:
    """Wait until the daemons `ids` are drained and run no jobs, or `timeout` seconds
    passed (None: no limit). Calls `on_progress` after every look, the last included,
    and returns the last look (`drained` False: timed out).

    A killed daemon never reports drained; with no other daemon left to notice, waiting
    on it would never end. So each look also marks daemons silent for
    registry.STALE_AFTER_SECONDS gone (as every daemon does): dead, their children died
    with them; cut off from the database, their jobs stop by the end of their leases.
    Either way the leases bring the jobs back to the queue.
    """
    wanted = set(ids)

    def look(gone: list[tuple[str, str, int]]) -> DrainProgress:
        busy = daemons_still_busy(conn, schema, wanted)
        return DrainProgress(busy, sorted(j for d in busy for j in d["in_flight"]), gone)

    return _wait_for_daemons(conn, schema, wanted, look, timeout, on_progress, interval)


@dataclass(frozen=True)
class HandBackProgress:
    """One look at the daemons a hand-back waits for."""

    # Per daemon still waited for: its row (id, host, pid, state), whether it has read the
    # request ("seen") and the targeted jobs it still runs ("running_jobs").
    busy: list[dict[str, Any]]
    marked_gone: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def running_jobs(self) -> list[int]:
        return sorted(j for d in self.busy for j in d["running_jobs"])

    @property
    def drained(self) -> bool:
        return not self.busy


def wait_handed_back(
    conn: psycopg.Connection,
    schema: str,
    ids: Collection[str],
    timeout: float | None,
    on_progress: Callable[[HandBackProgress], None] = lambda progress: None,
    *,
    interval: float = 0.2,
) -> HandBackProgress:
    """Wait until each of the daemons `ids` has read its hand-back request and runs none
    of the jobs it targets (read from the jobs table), or `timeout` seconds passed (None:
    no limit); silent daemons are marked gone and waited for no longer, as in
    wait_drained. Returns the last look (`drained` False: timed out)."""
    wanted = set(ids)

    def look(gone: list[tuple[str, str, int]]) -> HandBackProgress:
        rows = _rows(conn, "worker_hand_back_progress", schema, {"ids": sorted(wanted)})
        return HandBackProgress([r for r in rows if not r["seen"] or r["running_jobs"]], gone)

    return _wait_for_daemons(conn, schema, wanted, look, timeout, on_progress, interval)


class _Progress(Protocol):
    @property
    def drained(self) -> bool: ...


ProgressT = TypeVar("ProgressT", bound=_Progress)


def _wait_for_daemons(
    conn: psycopg.Connection,
    schema: str,
    wanted: set[str],
    look: Callable[[list[tuple[str, str, int]]], ProgressT],
    timeout: float | None,
    on_progress: Callable[[ProgressT], None],
    interval: float,
) -> ProgressT:
    """The loop of wait_drained and wait_handed_back: mark silent daemons gone (those of
    `wanted` it marked go to `look`), look, report, and again every `interval` seconds
    until the look says drained or `timeout` seconds passed (None: no limit)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        gone = [
            row
            for row in registry.mark_stale(conn, registry.STALE_AFTER_SECONDS, schema)
            if row[0] in wanted
        ]
        progress = look(gone)
        on_progress(progress)
        if progress.drained or (deadline is not None and time.monotonic() >= deadline):
            return progress
        time.sleep(interval)


def set_handler_default(
    conn: psycopg.Connection,
    schema: str,
    handler: str,
    policy: str | None,
    debounce: float | None = None,
    debounce_max: float | None = None,
) -> bool:
    """Set a handler's default dedupe policy (schema 37: what an enqueue that names none
    does when its key is held), or remove it with `policy` None; returns whether the
    handler has one now. The database checks every value (InvalidParameterValue) and who
    may (the operator)."""
    params = {
        "handler": handler,
        "policy": policy,
        "debounce": debounce,
        "debounce_max": debounce_max,
    }
    row = conn.execute(query("handler_default_set", schema), params).fetchone()
    return bool(row and row[0])


def handler_defaults(
    conn: psycopg.Connection, schema: str, handler: str | None = None
) -> list[dict[str, Any]]:
    """The handlers' default dedupe policies (all, or `handler`'s)."""
    return _rows(conn, "handler_default_list", schema, {"handler": handler})
