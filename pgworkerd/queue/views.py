"""The read side of the queue: what `pgworkerd status`, `show`, `jobs`, `explain` and the
web dashboard show, as plain data (dicts and lists of str, int, float, bool, datetime,
None and decoded JSON), so that the CLI and the dashboard read the same rows the same
way. Every function takes a connection owned by the caller and the schema name, and
only reads (text search sets a transaction-local statement timeout). Values are as the
database holds them, written by others: escape them where they are shown (the CLI's
printable, HTML escaping), and register pgworkerd.cli.display.register_safe_loaders on
the connection (a pool's `configure`) so that a timestamp or JSON value Python cannot
hold loads as text instead of raising. Works in autocommit or inside a transaction.

API (each function's args after (conn, schema); returned keys):

    daemons(conn, schema) -> list of dict
        id, host, pid, version, queues, handlers, slots, in_flight, state, drain_requested,
        started_at, heartbeat_at, stopped_at, uptime_seconds, heartbeat_age_seconds,
        busy (= len(in_flight)), drained (= drain_requested), last_seen_seconds
        (= heartbeat_age_seconds), heartbeat_interval_seconds (the most it lets pass
        between heartbeats), silent (its heartbeat is older than twice that: SQL function
        daemon_silent, the one definition). Live daemons and those gone within the last
        hour.
    running_jobs(conn, schema) -> list of dict
        id, queue, handler, attempts, max_attempts, locked_by, progress, cancel_requested,
        locked_until (when its lease frees it), age_seconds, lease_left_seconds,
        daemon_host, daemon_heartbeat_age_seconds (None: no registry row), daemon_silent
        (its daemon is silent; the job is left to its lease all the same)
    silent_jobs(conn, schema) -> dict: jobs (running jobs whose daemon is silent), daemons
        (silent daemons holding them); what the daemons export as metrics
    queue_counts(conn, schema, *, served, top=20, finished_within=None)
        -> (counts: {queue: {status: n}}, other_queues: {status: n})
        finished_within None: every job (a full count); a number of seconds: pending and
        running all, finished ones of that window only (through indexes).
    oldest_due_seconds(conn, schema) -> float | None   (the oldest due pending job)
    queues(conn, schema, *, finished_within=3600.0, top=20, served=None) -> list of dict
        queue (None: the other queues summed), counts {status: n}, oldest_due_seconds;
        served: the queues always listed (None: those live daemons serve)
    throughput(conn, schema, *, minutes=60) -> list of dict, one per minute, oldest first
        minute (datetime), one count per outcome of an ended attempt: completed,
        failed, dead, cancelled, released, snoozed, lease_expired; and failed_total
        (failed + dead + lease_expired); every minute a row, quiet ones all zeros
    unserved(conn, schema) -> list of dict: queue, handler, jobs, groups, oldest_seconds
    paused(conn, schema) -> list of dict: kind, name, paused_at, paused_by, comment,
        paused_seconds
    status(conn, schema) -> dict (`pgworkerd status --json`): daemons, running_jobs,
        counts, other_queues, oldest_pending_seconds, unserved, paused
    overview(conn, schema, *, finished_within=3600.0, minutes=60) -> dict
        status()'s keys, with counts/other_queues over finished_within, plus
        queues (see queues()), throughput (see throughput()), finished_within
    jobs_page(conn, schema, *, statuses=None, queue=None, handler=None, text=None,
              before=None, after=None, limit=50, text_timeout=TEXT_SEARCH_TIMEOUT)
        -> dict: jobs (list of dict, newest first: id, queue, handler, status, priority,
        attempts, max_attempts, run_at, locked_by, locked_until, progress, last_error,
        created_at, started_at, finished_at, concurrency_key), limit, older (the `before`
        of the next older page, None at the end), newer (the `after` of the next newer
        page, None when nothing newer can be there)
        Raises ValueError for a bad status or limit, TextSearchTimeout when the text
        search ran out of time.
    job(conn, schema, job_id) -> dict | None: every column of jobs, and attempt_history (list of
        dict: attempt, outcome, worker, host, started_at, finished_at, wall_seconds,
        cpu_user_seconds, cpu_system_seconds, peak_memory, error; None when the role may
        not read attempts), and daemon: None unless it is running on a daemon of the
        registry, else dict: id, host, pid, state, heartbeat_at, heartbeat_age_seconds,
        heartbeat_interval_seconds, silent, locked_until, lease_left_seconds
    schedules(conn, schema) -> list of dict: name, definition, declared_by, declared_at,
        created_at, last_tick, last_job_id, last_skipped, last_fired_by, last_job_status,
        runs, declared_now
    explain.explain(conn, schema, job_id) (pgworkerd/queue/explain.py) -> dict | None:
        id, status, queue, handler, summary, reasons [{code, message, facts}]
    limits(conn, schema) -> list of dict: handler, max_running, max_running_per_key (the
        strictest a live daemon declares; None: none), daemons (how many declare any),
        running (current leases), busiest_keys (list of {key, running}, at most 20)

Why a module of its own and not queue/fleet.py: fleet.py changes the fleet (drain, pause,
waiting for a drain); this module only reads, and the dashboard, which may run
read-only, imports nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg.errors import InsufficientPrivilege, QueryCanceled
from psycopg.rows import dict_row

from pgworkerd.model import STATUSES
from pgworkerd.queue import admin, attempts
from pgworkerd.queue import schedules as schedule_statements
from pgworkerd.queue.queries import query

# `status` names this many queues (the ones with the most jobs) and sums the others.
STATUS_TOP_QUEUES = 20
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
# A text search reads rows until the page is full (no index serves a substring of a
# payload): past this many seconds it is cancelled and says so.
TEXT_SEARCH_TIMEOUT = 5.0
# A text search looks at this many first characters of each payload and last error: a
# multi-MB payload is not lowercased whole for every row read.
TEXT_SEARCH_CHARS = 64 * 1024
# The values of a job a raw download streams: a name of this set is all it accepts.
JOB_VALUES = ("payload", "progress", "checkpoint", "result", "last_error")
OUTCOMES = ("completed", "failed", "dead", "cancelled", "released", "snoozed", "lease expired")
FAILED_OUTCOMES = ("failed", "dead", "lease expired")


# The parts of the pending jobs the dashboard's tabs split them in: due now, due later
# and never run, due later after an attempt (a retry's backoff).
PENDING_PARTS = ("due", "scheduled", "retrying")
# The jobs list's tabs, in order: each a part of the pending jobs or a status.
TABS = (*PENDING_PARTS, "running", "waiting", "suspended", "dead", "cancelled", "completed")
# A tab's count stops here (the page says "10000+").
TAB_COUNT_CAP = 10_000


class TextSearchTimeout(RuntimeError):
    """A text search of the jobs page ran past its statement timeout."""


def _rows(
    conn: psycopg.Connection[Any],
    name: str,
    schema: str,
    params: dict[str, Any] | None = None,
    *,
    prepare: bool | None = None,
) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(query(name, schema), params or {}, prepare=prepare).fetchall()


def daemons(conn: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    rows = _rows(conn, "worker_list", schema)
    for w in rows:
        w["busy"] = len(w["in_flight"])
        w["drained"] = bool(w["drain_requested"])
        w["last_seen_seconds"] = w["heartbeat_age_seconds"]
    return rows


def running_jobs(conn: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    return _rows(conn, "job_running_list", schema)


def silent_jobs(conn: psycopg.Connection[Any], schema: str) -> dict[str, int]:
    [row] = _rows(conn, "job_silent_count", schema)
    return {"jobs": int(row["jobs"]), "daemons": int(row["daemons"])}


def queue_counts(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    served: Sequence[str],
    top: int = STATUS_TOP_QUEUES,
    finished_within: float | None = None,
) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """Jobs per queue and status: the `served` queues and the `top` biggest others by
    name, every other queue summed (an enqueuer with 200,000 queues must not make a page
    of 200,000 lines, nor push the fleet's own queues out of view)."""
    if finished_within is None:
        rows = admin.counts_capped(conn, served, top, schema=schema)
    else:
        rows = [
            (r["queue"], r["status"], int(r["jobs"]))
            for r in _rows(
                conn,
                "view_job_counts_recent_capped",
                schema,
                {"served": list(served), "top": top, "window": finished_within},
            )
        ]
    counts: dict[str, dict[str, int]] = {}
    other: dict[str, int] = {}
    for queue, status_name, n in rows:
        (other if queue is None else counts.setdefault(queue, {}))[status_name] = n
    return counts, other


def oldest_due_seconds(conn: psycopg.Connection[Any], schema: str) -> float | None:
    row = conn.execute(query("job_oldest_pending", schema)).fetchone()
    return row[0] if row else None


def _served_queues(live: Iterable[dict[str, Any]]) -> list[str]:
    return sorted({q for w in live if w["state"] != "gone" for q in w["queues"]})


def queues(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    finished_within: float | None = 3600.0,
    top: int = STATUS_TOP_QUEUES,
    served: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    if served is None:
        served = _served_queues(daemons(conn, schema))
    counts, other = queue_counts(
        conn, schema, served=served, top=top, finished_within=finished_within
    )
    names = sorted(set(counts) | set(served))
    oldest = {
        r["queue"]: r["oldest_due_seconds"]
        for r in _rows(conn, "view_queue_oldest_due", schema, {"queues": names})
    }
    listed: list[dict[str, Any]] = [
        {"queue": q, "counts": counts.get(q, {}), "oldest_due_seconds": oldest.get(q)}
        for q in names
    ]
    if other:
        listed.append({"queue": None, "counts": other, "oldest_due_seconds": None})
    return listed


def throughput(
    conn: psycopg.Connection[Any], schema: str, *, minutes: int = 60
) -> list[dict[str, Any]]:
    if not 1 <= minutes <= 7 * 24 * 60:
        raise ValueError(f"minutes must be within 1..10080, not {minutes}")
    out = []
    for r in _rows(conn, "view_throughput", schema, {"minutes": minutes}):
        ended = r["outcomes"] if isinstance(r["outcomes"], dict) else {}
        bucket: dict[str, Any] = {"minute": r["minute"]}
        for outcome in OUTCOMES:
            n = ended.get(outcome)
            bucket[outcome.replace(" ", "_")] = n if isinstance(n, int) else 0
        bucket["failed_total"] = sum(bucket[o.replace(" ", "_")] for o in FAILED_OUTCOMES)
        out.append(bucket)
    return out


# The rollup's grains (attempt_rollups.grain_seconds), one per chart window.
ROLLUP_GRAINS = (60, 300, 3600, 10800)


def rollup_rows(
    conn: psycopg.Connection[Any], schema: str, *, grain: int, since: datetime
) -> list[dict[str, Any]]:
    """The charts' rollup (attempt_rollups, 0038): buckets of `grain` seconds (60, 300,
    3600 or 10800) from `since` on, per handler, oldest first (the histograms' bounds:
    rollup_cursor)."""
    if grain not in ROLLUP_GRAINS:
        raise ValueError(f"grain must be one of {ROLLUP_GRAINS}, not {grain}")
    return _rows(conn, "view_attempt_rollups", schema, {"grain": grain, "since": since})


def rollup_cursor(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    """How far the charts' rollup counted (rolled_to), the database's now, and the
    histograms' bounds (attempt_rollup_bounds)."""
    [row] = _rows(conn, "view_attempt_rollup_cursor", schema)
    return row


def unserved(conn: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    return _rows(conn, "job_unserved_list", schema)


def paused(conn: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    return _rows(conn, "paused_list", schema)


def status(conn: psycopg.Connection[Any], schema: str) -> dict[str, Any]:
    """Everything `pgworkerd status` shows, as plain data (also its --json shape)."""
    return _snapshot(conn, schema, finished_within=None)


def overview(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    finished_within: float | None = 3600.0,
    minutes: int = 60,
) -> dict[str, Any]:
    """The dashboard's first page: status() with finished jobs counted over the last
    `finished_within` seconds (None: all, a full count), per-queue rows with the age of
    the oldest due job, and ended attempts per minute over the last `minutes`."""
    snap = _snapshot(conn, schema, finished_within=finished_within)
    served = _served_queues(snap["daemons"])
    return {
        **snap,
        "queues": queues(conn, schema, finished_within=finished_within, served=served),
        "throughput": throughput(conn, schema, minutes=minutes),
        "finished_within": finished_within,
    }


def _snapshot(
    conn: psycopg.Connection[Any], schema: str, *, finished_within: float | None
) -> dict[str, Any]:
    workers = daemons(conn, schema)
    counts, other = queue_counts(
        conn, schema, served=_served_queues(workers), finished_within=finished_within
    )
    return {
        "daemons": workers,
        "running_jobs": running_jobs(conn, schema),
        "counts": counts,
        "other_queues": other,
        "oldest_pending_seconds": oldest_due_seconds(conn, schema),
        "unserved": unserved(conn, schema),
        "paused": paused(conn, schema),
    }


def jobs_page(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    statuses: Iterable[str] | None = None,
    queue: str | None = None,
    handler: str | None = None,
    text: str | None = None,
    before: int | None = None,
    after: int | None = None,
    limit: int = DEFAULT_PAGE_SIZE,
    text_timeout: float = TEXT_SEARCH_TIMEOUT,
    pending_when: str | None = None,
    oldest_first: bool = False,
) -> dict[str, Any]:
    """One page of jobs, newest first: below id `before`, or just above id `after`, or
    the newest; with oldest_first, oldest first: above id `after` (or from the oldest),
    or just below id `before` (the same statements and indexes, read the other way).
    Every filter goes to the database as a bound value (hostile text is just text);
    `text` is a case-insensitive substring of the payload's JSON or the last error, which
    no index serves: that scan stops at the page size and at `text_timeout` seconds
    (TextSearchTimeout). pending_when (one of PENDING_PARTS: due, scheduled, retrying)
    keeps the pending jobs of that part only."""
    if pending_when is not None and pending_when not in PENDING_PARTS:
        raise ValueError(f"pending_when must be one of {', '.join(PENDING_PARTS)}")
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit must be within 1..{MAX_PAGE_SIZE}, not {limit}")
    if before is not None and after is not None:
        raise ValueError("give before or after, not both")
    for name, value in (("queue", queue), ("handler", handler), ("text", text)):
        if value and "\x00" in value:  # no text column holds one: PostgreSQL would refuse it
            raise ValueError(f"{name} cannot contain a NUL character")
    chosen = admin.check_statuses(statuses) if statuses else list(STATUSES)
    params = {
        "statuses": chosen,
        "queue": queue,
        "handler": handler,
        "text": text or None,
        "text_chars": TEXT_SEARCH_CHARS,
        "before": before,
        "after": after,
        "limit": limit,
        "pending_when": pending_when,
    }
    # A text search that covers completed jobs (most of a table) scans by id across the
    # statuses and stops at the page; otherwise one branch per status, each through its
    # index (see both statements).
    by_id = bool(text) and "completed" in chosen
    # ascending: ids above `after` (from the oldest: above 0), read upwards
    ascending = after is not None or (oldest_first and before is None)
    if ascending and after is None:
        params["after"] = 0
    name = {
        (False, False): "view_job_page_older",
        (False, True): "view_job_page_newer",
        (True, False): "view_job_text_older",
        (True, True): "view_job_text_newer",
    }[(by_id, ascending)]
    # Unprepared: the planner sees the values, so each filter not given folds away.
    try:
        with conn.transaction():
            conn.execute(query("session_read_side_local", schema))
            if text:
                conn.execute(
                    query("session_statement_timeout_set_local", schema),
                    {"timeout": f"{int(text_timeout * 1000)}ms"},
                )
            rows = _rows(conn, name, schema, params, prepare=False)
    except QueryCanceled:
        if not text:
            raise
        raise TextSearchTimeout(
            f"the text search read jobs for {text_timeout:g} s without filling the page;"
            " narrow it by status, queue or handler"
        ) from None
    full = len(rows) == limit
    if oldest_first:
        if not ascending:
            rows.reverse()  # read downwards from `before`: shown oldest first
            older = rows[0]["id"] if rows and full else None
            newer = rows[-1]["id"] if rows else before - 1  # type: ignore[operator]
        else:
            newer = rows[-1]["id"] if rows and full else None
            older = (rows[0]["id"] if rows else after + 1) if after else None
        return {"jobs": rows, "limit": limit, "older": older, "newer": newer}
    if after is not None:
        rows.reverse()
    if after is None:
        # newest first from `before` (or the top): more below when the page is full
        older = rows[-1]["id"] if rows and full else None
        newer = None if before is None else (rows[0]["id"] if rows else before)
    else:
        # the page just above `after`: more above when full, and `after` itself below
        older = rows[-1]["id"] if rows else after
        newer = rows[0]["id"] if rows and full else None
    return {"jobs": rows, "limit": limit, "older": older, "newer": newer}


# `show` prints each signal's payload up to this many characters (durable waits).
SIGNAL_SHOWN_CHARS = 2000


def job(conn: psycopg.Connection[Any], schema: str, job_id: int) -> dict[str, Any] | None:
    row = admin.get(conn, job_id, schema=schema)
    if row is None:
        return None
    history: list[dict[str, Any]] | None
    try:
        history = attempts.history(conn, job_id, schema=schema)
    except InsufficientPrivilege:  # a role granted before schema 12: the job still shows
        history = None
    daemon = _rows(conn, "job_daemon", schema, {"id": job_id})
    # Not under "attempts": that is the jobs column (how many attempts were counted).
    # The lease token is a capability (job_lease_assert): `show` never prints it.
    row = {k: v for k, v in row.items() if k != "lease_token"}
    return {
        **row,
        "attempt_history": history,
        "daemon": daemon[0] if daemon else None,
        **relatives(
            conn,
            schema,
            job_id,
            some=row.get("parents_unfinished") is not None or bool(row.get("has_children")),
        ),
        "signals": signals_shown(conn, schema, job_id, shown=SIGNAL_SHOWN_CHARS),
        **(follow_ups(conn, schema, job_id) or {}),
    }


# How many parents and children show, explain and the job page list (each side).
RELATIVES_SHOWN = 100


def relatives(
    conn: psycopg.Connection[Any], schema: str, job_id: int, *, some: bool = True
) -> dict[str, list[dict[str, Any]] | int]:
    """A job's parents and children (schema 27), each {id, status, handler} (status None:
    pruned), at most RELATIVES_SHOWN of each, with their whole counts. some=False (the
    jobs row says it has neither) skips the look-up."""
    found: dict[str, list[dict[str, Any]] | int] = {
        "parents": [],
        "children": [],
        "parents_total": 0,
        "children_total": 0,
    }
    if not some:
        return found
    for r in _rows(conn, "view_job_relatives", schema, {"id": job_id, "limit": RELATIVES_SHOWN}):
        side = "parents" if r["side"] == "parent" else "children"
        listed = found[side]
        assert isinstance(listed, list)
        listed.append({"id": r["id"], "status": r["status"], "handler": r["handler"]})
        found[f"{side}_total"] = r["total"]
    return found


def follow_ups(conn: psycopg.Connection[Any], schema: str, job_id: int) -> dict[str, Any] | None:
    """The follow-ups a job's completion inserted (follow_ups: their ids, in order) and
    the jobs whose completion inserted it (follow_up_of), with the status of each under
    follow_up_statuses (None: pruned since). None: the role may not read them (a role
    granted before schema 29)."""
    try:
        with conn.transaction():
            rows = _rows(conn, "view_job_follow_ups", schema, {"id": job_id})
    except InsufficientPrivilege:
        return None
    return {
        "follow_ups": [r["id"] for r in rows if r["relation"] == "then"],
        "follow_up_of": [r["id"] for r in rows if r["relation"] == "of"],
        "follow_up_statuses": {str(r["id"]): r["status"] for r in rows},
    }


def schedules(conn: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    return schedule_statements.list_all(conn, schema)


def limits(conn: psycopg.Connection[Any], schema: str) -> list[dict[str, Any]]:
    return _rows(conn, "view_limits", schema)


# -- bounded reads for pages (the dashboard): no value travels whole ----------------------


def job_shown(
    conn: psycopg.Connection[Any], schema: str, job_id: int, *, shown: int
) -> dict[str, Any] | None:
    """One job with payload, progress, checkpoint, result and last_error as text of at
    most `shown` characters (JSON indented when whole), each with its whole length under
    NAME_chars (None: no value), and the registry row of the daemon holding it under
    "daemon" (None: not held; `silent` says whether it stopped heartbeating)."""
    rows = _rows(conn, "view_job_shown", schema, {"id": job_id, "shown": shown})
    if not rows:
        return None
    daemon = _rows(conn, "job_daemon", schema, {"id": job_id})
    return {**rows[0], "daemon": daemon[0] if daemon else None, **relatives(conn, schema, job_id)}


def signals_shown(
    conn: psycopg.Connection[Any], schema: str, job_id: int, *, shown: int, limit: int = 100
) -> list[dict[str, Any]] | None:
    """The signals a job received (durable waits, 0028), oldest first, at most `limit` (the
    newest; total: how many in all), payloads as JSON text cut to `shown` characters
    (payload_chars: the whole length). None: the role may not read signals."""
    params = {"id": job_id, "shown": shown, "limit": limit}
    try:
        with conn.transaction():
            rows = _rows(conn, "signal_list", schema, params)
    except InsufficientPrivilege:
        return None
    return rows[::-1]


def attempts_shown(
    conn: psycopg.Connection[Any], schema: str, job_id: int, *, shown: int, limit: int
) -> list[dict[str, Any]] | None:
    """The newest `limit` attempts (oldest of them first), errors cut to `shown`
    characters (error_chars: the whole length; total: how many in all). None: the role
    may not read attempts."""
    params = {"id": job_id, "shown": shown, "limit": limit}
    try:
        with conn.transaction():
            return _rows(conn, "view_attempts_shown", schema, params)
    except InsufficientPrivilege:
        return None


def logs_shown(
    conn: psycopg.Connection[Any], schema: str, job_id: int, *, shown: int, limit: int
) -> list[dict[str, Any]] | None:
    """The newest `limit` attempts' output (oldest of them first): the head's first and
    the tail's last `shown` characters (head_chars, tail_chars: whole lengths; total: how
    many attempts printed). None: the role may not read job logs."""
    params = {"id": job_id, "shown": shown, "limit": limit}
    try:
        with conn.transaction():
            return _rows(conn, "view_job_logs_shown", schema, params)
    except InsufficientPrivilege:
        return None


def job_value_part(
    conn: psycopg.Connection[Any], schema: str, job_id: int, field: str, start: int, chars: int
) -> tuple[str, int] | None:
    """`chars` characters of a job's value `field` (one of JOB_VALUES) from character
    `start` (0-based), and the value's whole length; None: no such job or no value."""
    if field not in JOB_VALUES:
        raise ValueError(f"not a value of a job: {field!r}")
    params = {"id": job_id, "field": field, "start": start + 1, "chars": chars}
    rows = _rows(conn, "view_job_value_part", schema, params)
    if not rows or rows[0]["chars"] is None:
        return None
    return rows[0]["part"], rows[0]["chars"]


def job_log_part(
    conn: psycopg.Connection[Any],
    schema: str,
    job_id: int,
    token: int,
    part: str,
    start: int,
    chars: int,
) -> tuple[str, int, int] | None:
    """`chars` characters of one attempt's stored head or tail (`part`) from character
    `start` (0-based), its whole length and the attempt's omitted bytes; None: none."""
    if part not in ("head", "tail"):
        raise ValueError(f"not a part of a log: {part!r}")
    params = {"id": job_id, "token": token, "part": part, "start": start + 1, "chars": chars}
    rows = _rows(conn, "view_job_log_part", schema, params)
    if not rows:
        return None
    return rows[0]["part"], rows[0]["chars"], rows[0]["omitted_bytes"]


def tab_counts(
    conn: psycopg.Connection[Any],
    schema: str,
    *,
    queue: str | None = None,
    handler: str | None = None,
    cap: int = TAB_COUNT_CAP,
) -> dict[str, int]:
    """How many jobs each of TABS holds (of a queue, a handler), each count stopping at
    `cap` (cap + 1 means "more than cap")."""
    for name, value in (("queue", queue), ("handler", handler)):
        if value and "\x00" in value:
            raise ValueError(f"{name} cannot contain a NUL character")
    params = {"queue": queue, "handler": handler, "cap": cap + 1}
    rows = _rows(conn, "view_job_tab_counts", schema, params, prepare=False)
    return {r["tab"]: r["jobs"] for r in rows}


def limits_held(
    conn: psycopg.Connection[Any], schema: str, rows: list[dict[str, Any]], *, cap: int
) -> None:
    """Add to each row of limits() what its limits hold back: due (its due pending jobs),
    held_by_max (those beyond the free slots of max_running), held_by_key (those whose
    concurrency key runs its max_running_per_key already); counts stop at `cap` + 1."""
    if not rows:
        return
    params = {
        "handlers": [r["handler"] for r in rows],
        "per_key": [r["max_running_per_key"] for r in rows],
        "cap": cap + 1,
    }
    found = {r["handler"]: r for r in _rows(conn, "view_limits_held", schema, params)}
    for row in rows:
        held = found.get(row["handler"], {"due": 0, "held_by_key": 0})
        row["due"], row["held_by_key"] = held["due"], held["held_by_key"]
        free = None
        if row["max_running"] is not None:
            free = max(0, row["max_running"] - row["running"])
        # the jobs a free slot could take are those its key does not hold back
        takeable = row["due"] - row["held_by_key"]
        row["held_by_max"] = 0 if free is None else max(0, takeable - free)
