"""`pgworkerd explain ID`: why a job is where it is, from the database alone (so it works
from any host): for a pending job every reason it is not running now, for any other what
happened to it.

explain(conn, schema, job_id) returns None for an unknown id, else a dict: id, status,
queue, handler, summary (one line), and reasons, a list of {"code", "message", "facts"}.
Codes are stable (scripts and the dashboard match on them; messages may be reworded):

  pending:  scheduled, backing_off, snoozed, retried, queue_paused, handler_paused,
            no_daemon, daemons_silent, daemons_drained, daemons_full, limit_full,
            key_limit_full, rate_limited (schema 33: the handler's or its key's next
            start-rate token is not due yet; facts: next_token_at), claimable (nothing
            blocks it; always alone but for informational reasons)
  pending, with admission by memory ([worker] memory_budget): memory_admission (every
            daemon that could take it has less of its budget free than the job's handler is
            expected to use; facts: expected, from (how the expectation was formed), each
            daemon's budget and free), memory_over_budget (the expectation is above every
            such daemon's budget: it runs only alone, on an idle daemon)
  pending, of a fair handler (schema 33): fair_turn (informational: the keys whose turn
            comes before its key's; facts: keys_ahead, at most 10)
  running:  running, daemon_silent (its daemon stopped heartbeating: dead, frozen or cut
            off; the job stays its until the lease ends), lease_expired, cancel_requested
  finished: completed, dead, cancelled, dedupe_held (a retry would leave it pending
            elsewhere: another live job holds its dedupe key), follow_ups (its completion
            enqueued these jobs, schema 29), follow_up_of (the completion of that job
            enqueued it)
  waiting (schema 27, docs/guide/dependencies.md): waiting_on_parents (facts: each
            parent's id and status, how many are unfinished), held (a parent ended dead or
            cancelled and on_parent_failure is hold: `pgworkerd release ID` runs it)
  waiting, a batch's callback (schema 30, docs/guide/batches.md): waiting_on_batch (facts:
            the batch, its members, how many finished: completed, dead, cancelled)
  cancelled by a deadline or a parent (instead of "cancelled"): expired (not started by
            its expires_at), parent_failed (a parent ended dead or cancelled and
            on_parent_failure is cancel)
  suspended: suspended (waiting for a signal since T, timeout at T; its correlation key),
            wait_timed_out (past its timeout: a daemon's sweep makes it pending soon)
  pending, after a wait: resumed (informational: what ended its last wait)

Dedupe never holds a pending job back in this schema: the unique index admits one live
job per handler and key, and a second enqueue returns the first one's id.

A daemon is silent when its registry heartbeat is older than twice the interval it
recorded (SQL function daemon_silent, migration 0021): daemons_silent and daemon_silent
use that one definition, as do `status`, `show`, the dashboard and the metric.

Limits live in each daemon's configuration; daemons of schema 16 on publish theirs in
the registry (workers.handler_settings), and a job is held by a limit only when every
daemon that could take it has reached its own.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import dict_row

from pgworkerd.config.checks import size_text
from pgworkerd.durations import format_duration
from pgworkerd.queue import batchread, views
from pgworkerd.queue.queries import query

NOT_TAKING = ("draining", "drained", "stopping")


def _reason(code: str, message: str, **facts: Any) -> dict[str, Any]:
    return {"code": code, "message": message, "facts": facts}


def _ago(seconds: float | None) -> str:
    return "-" if seconds is None else format_duration(abs(seconds), rounded=True)


def _int(value: Any) -> int | None:
    """A whole number a daemon wrote in its settings, or None (hostile or absent)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _last_line(text: Any) -> str:
    lines = str(text or "").strip().split("\n")
    return lines[-1].strip()[:200]


def explain(conn: psycopg.Connection[Any], schema: str, job_id: int) -> dict[str, Any] | None:
    with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query("session_read_side_local", schema))  # no JIT for a few probes
        facts = cur.execute(query("job_explain_facts", schema), {"id": job_id}).fetchone()
    if facts is None or facts["job"] is None:
        return None
    job = facts["job"]
    f = dict(facts)
    for d in f["daemons"]:  # settings come from the registry: anything but an object is none
        d["settings"] = d["settings"] if isinstance(d["settings"], dict) else {}
    status = job["status"]
    if status == "pending":
        reasons = _pending(job, f, _turn_and_token(conn, schema, job, f))
    elif status == "waiting" and (batch := _callback_batch(conn, schema, job_id)):
        reasons = [_waiting_on_batch(batch)]
    elif status == "waiting":
        reasons = _waiting(job, views.relatives(conn, schema, job_id)["parents"])
    elif status == "running":
        reasons = _running(job, f)
    elif status == "suspended":
        reasons = _suspended(job)
    else:
        reasons = _finished(job, f)
        reasons += _follow_up_reasons(conn, schema, job)
    return {
        "id": job["id"],
        "status": status,
        "queue": job["queue"],
        "handler": job["handler"],
        "summary": reasons[0]["message"] if reasons else status,
        "reasons": reasons,
    }


def _pending(
    job: dict[str, Any], f: dict[str, Any], turn_and_token: Sequence[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    reasons: list[dict[str, Any]] = []
    last = f["last_attempt"] or {}
    run_in = f["run_in_seconds"]
    if run_in is None or run_in > 0:  # not due ('infinity' is never due)
        when = "never (run_at is infinity)" if run_in is None else f"in {_ago(run_in)}"
        common = {"run_at": job["run_at"], "in_seconds": run_in}
        if last.get("outcome") == "snoozed":
            reasons.append(
                _reason(
                    "snoozed",
                    f"its handler snoozed it: due again {when} (at {job['run_at']})",
                    snoozes=job.get("snoozes"),
                    **common,
                )
            )
        elif job["attempts"] > 0:
            reasons.append(
                _reason(
                    "backing_off",
                    f"backing off after attempt {job['attempts']} of {job['max_attempts']}"
                    f" failed: retried {when} (at {job['run_at']}); last error:"
                    f" {_last_line(job['last_error'])}",
                    attempt=job["attempts"],
                    max_attempts=job["max_attempts"],
                    last_error=job["last_error"],
                    **common,
                )
            )
        else:
            reasons.append(
                _reason("scheduled", f"scheduled to run {when} (at {job['run_at']})", **common)
            )
    if job["attempts"] == 0 and last.get("outcome") in ("dead", "cancelled"):
        reasons.append(
            _reason(
                "retried",
                f"retried by hand after it ended {last['outcome']}"
                f" ({f['attempts_recorded']} earlier attempt(s) recorded: pgworkerd show"
                f" {job['id']})",
                earlier_attempts=f["attempts_recorded"],
                last_outcome=last["outcome"],
            )
        )
    for p in f["paused"]:
        reasons.append(
            _reason(
                f"{p['kind']}_paused",
                f"its {p['kind']} '{p['name']}' is paused since {p['paused_at']} by"
                + (
                    f" {p['requested_by']} (role {p['paused_by']})"
                    if p.get("requested_by")
                    else f" {p['paused_by']}"
                )
                + (f": {p['comment']}" if p["comment"] else "")
                + f" (pgworkerd resume --{p['kind']} {shlex.quote(p['name'])})",
                name=p["name"],
                paused_at=p["paused_at"],
                paused_by=p["paused_by"],
                comment=p["comment"],
                requested_by=p.get("requested_by"),
            )
        )
    reasons += _capacity(job, f)
    reasons += turn_and_token
    reasons += _resumed(job)
    # Informational reasons do not hold a job back; the others do.
    if not [r for r in reasons if r["code"] not in ("retried", "resumed", "fair_turn")]:
        ahead = f["due_ahead"]
        reasons.append(
            _reason(
                "claimable",
                "nothing blocks it: a daemon serving it should claim it within its poll"
                " interval (worker.poll_interval, 5 s by default)"
                + (
                    f", once the {ahead}{'+' if ahead >= 10000 else ''} due job(s) of its"
                    " handler ahead of it have been claimed"
                    if ahead
                    else ""
                ),
                due_ahead=ahead,
            )
        )
    return reasons


def _suspended(job: dict[str, Any]) -> list[dict[str, Any]]:
    """A job its handler suspended (raise pgworkerd.WaitFor, migration 0028): what it
    waits for, since when and until when."""
    name, until = job.get("wait_for"), job.get("wait_until")
    key = job.get("wait_key")
    facts = {
        "signal": name,
        "since": job.get("wait_since"),
        "timeout_at": until,
        "key": key,
    }
    try:
        left = (datetime.fromisoformat(str(until)) - datetime.now(UTC)).total_seconds()
    except ValueError:
        left = None
    send = f"pgworkerd signal {job['id']} {shlex.quote(str(name))}"
    if left is not None and left <= 0:
        return [
            _reason(
                "wait_timed_out",
                f"waited for signal '{name}' since {job.get('wait_since')}; its timeout passed"
                f" at {until}: a daemon's sweep makes it pending within about 8 s (none runs?"
                " pgworkerd status)",
                **facts,
            )
        ]
    return [
        _reason(
            "suspended",
            f"suspended: waiting for signal '{name}' since {job.get('wait_since')}, timeout"
            f" at {until}"
            + (f" (in {_ago(left)})" if left is not None else "")
            + (f"; correlation key '{key}'" if key else "")
            + f" ({send} resumes it)",
            **facts,
        )
    ]


def _resumed(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Informational, for a pending job that waited: what ended its last wait."""
    ended = job.get("wait_ended")
    if ended not in ("signal", "timeout"):
        return []
    how = "signal" if ended == "signal" else "timeout (no signal)"
    return [
        _reason(
            "resumed",
            f"its wait for signal '{job.get('wait_for')}' ended by {how}: its next attempt"
            " resumes from its checkpoint",
            signal=job.get("wait_for"),
            ended=ended,
        )
    ]


def _serves(d: dict[str, Any], queue: str) -> bool:
    """Whether daemon `d` claims the job's handler from its queue: it serves both, and
    the handler's own queues (when it declares any) include it."""
    own = d["settings"].get("queues")
    return bool(d["serves_handler"] and d["serves_queue"]) and (
        not isinstance(own, list) or queue in own
    )


def _capacity(job: dict[str, Any], f: dict[str, Any]) -> list[dict[str, Any]]:
    """Reasons about the daemons: none serves it, all are silent, drained, full, or at
    their limits."""
    serving = [d for d in f["daemons"] if _serves(d, job["queue"])]
    fresh = [d for d in serving if d["fresh"]]
    if not serving:
        return [
            _reason(
                "no_daemon",
                f"no live daemon serves handler '{job['handler']}' on queue '{job['queue']}'"
                + _partly(f["daemons"], job),
                serving_handler_only=[d["id"] for d in f["daemons"] if d["serves_handler"]],
                serving_queue_only=[d["id"] for d in f["daemons"] if not d["serves_handler"]],
            )
        ]
    if not fresh:
        return [
            _reason(
                "daemons_silent",
                "every daemon serving it is silent (no heartbeat for over twice its"
                " interval): "
                + ", ".join(
                    f"{d['id']} on {d['host']} ({_ago(d['heartbeat_age_seconds'])})"
                    for d in serving
                ),
                daemons=[_brief(d) for d in serving],
            )
        ]
    taking = [d for d in fresh if not d["drain_requested"] and d["state"] not in NOT_TAKING]
    if not taking:
        return [
            _reason(
                "daemons_drained",
                "every daemon serving it is drained or stopping: "
                + ", ".join(f"{d['id']} on {d['host']} ({d['state']})" for d in fresh)
                + " (pgworkerd resume undoes a drain)",
                daemons=[_brief(d) for d in fresh],
            )
        ]
    reasons: list[dict[str, Any]] = []
    if all(_full(d) for d in taking):
        reasons.append(
            _reason(
                "daemons_full",
                "every daemon serving it is busy: "
                + ", ".join(
                    f"{d['id']} on {d['host']} ({d['busy']}/{d['slots']} slots"
                    + (
                        f", {d['busy_with_handler']}/{_int(d['settings'].get('slots'))} of"
                        " the handler's)"
                        if _handler_full(d)
                        else ")"
                    )
                    for d in taking
                ),
                daemons=[_brief(d) for d in taking],
            )
        )
    strictest = _at_limit(taking, "max_running", f["handler_running"])
    if strictest is not None:
        reasons.append(
            _reason(
                "limit_full",
                f"handler '{job['handler']}' is at its fleet-wide limit: {f['handler_running']}"
                f" running, max_running {strictest}; running: "
                + ", ".join(map(str, f["handler_running_ids"])),
                max_running=strictest,
                running=f["handler_running"],
                running_ids=f["handler_running_ids"],
            )
        )
    reasons += _memory(job, taking)
    strictest = _at_limit(taking, "max_running_per_key", f["key_running"])
    if job["concurrency_key"] is not None and strictest is not None:
        reasons.append(
            _reason(
                "key_limit_full",
                f"concurrency key '{job['concurrency_key']}' is at its limit:"
                f" {f['key_running']} running, max_running_per_key {strictest}; running: "
                + ", ".join(map(str, f["key_running_ids"])),
                key=job["concurrency_key"],
                max_running_per_key=strictest,
                running=f["key_running"],
                running_ids=f["key_running_ids"],
            )
        )
    return reasons


def _at_limit(taking: list[dict[str, Any]], setting: str, running: int) -> int | None:
    """The strictest limit `setting` of the daemons that could take the job, when every
    one of them has reached its own (each claims within its own); else None."""
    limits = [_int(d["settings"].get(setting)) for d in taking]
    if not limits or any(n is None or running < n for n in limits):
        return None
    return min(n for n in limits if n is not None)


class _Room(NamedTuple):
    """What a daemon that admits by memory published for the job's handler."""

    daemon: dict[str, Any]
    expected: int
    budget: int
    free: int
    source: str


def _bytes(n: int) -> str:
    return size_text(n) if n % (1 << 20) == 0 else f"{n / (1 << 20):.1f}MiB"


def _memory(job: dict[str, Any], taking: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """memory_admission or memory_over_budget when every daemon that could take the job
    admits by memory (publishes its handler's expectation, its budget and what is free:
    daemon.admission) and none has room for it; else nothing."""
    rooms = []
    for d in taking:
        m = d["settings"].get("memory")
        m = m if isinstance(m, dict) else {}
        expected, budget, free = (_int(m.get(k)) for k in ("expected", "budget", "free"))
        if expected is None or budget is None or free is None or min(expected, budget, free) < 0:
            return []  # a daemon without a budget (or an older one) may take it
        rooms.append(_Room(d, expected, budget, free, str(m.get("from") or "?")[:200]))
    if not rooms or any(r.expected <= r.free for r in rooms):
        return []
    expected = max(r.expected for r in rooms)
    sources = sorted({r.source for r in rooms})
    each = ", ".join(
        f"{r.daemon['id']} on {r.daemon['host']}: {_bytes(r.free)} free of {_bytes(r.budget)}"
        for r in rooms
    )
    facts = {
        "expected": expected,
        "from": sources,
        "daemons": [
            {"id": r.daemon["id"], "host": r.daemon["host"], "budget": r.budget, "free": r.free}
            for r in rooms
        ],
    }
    if all(r.expected > r.budget for r in rooms):
        return [
            _reason(
                "memory_over_budget",
                f"handler '{job['handler']}' is expected to use {_bytes(expected)} per job"
                f" ({'; '.join(sources)}), more than the memory budget of every daemon that"
                f" could take it ({each}): it runs only alone, on an idle daemon",
                **facts,
            )
        ]
    return [
        _reason(
            "memory_admission",
            f"waits for memory: handler '{job['handler']}' is expected to use"
            f" {_bytes(expected)} per job ({'; '.join(sources)}), and no daemon that could"
            f" take it has that much of its memory budget free ({each})",
            **facts,
        )
    ]


def _partly(daemons: list[dict[str, Any]], job: dict[str, Any]) -> str:
    handler_only = [d["id"] for d in daemons if d["serves_handler"]]
    if handler_only:
        return f" (daemons with the handler but not on this queue: {', '.join(handler_only)})"
    if daemons:
        return f" (daemons on the queue without the handler: {', '.join(d['id'] for d in daemons)})"
    return ""


def _handler_full(d: dict[str, Any]) -> bool:
    slots = _int(d["settings"].get("slots"))
    return slots is not None and d["busy_with_handler"] >= slots


def _full(d: dict[str, Any]) -> bool:
    return d["busy"] >= d["slots"] or _handler_full(d)


def _brief(d: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "id",
        "host",
        "state",
        "drain_requested",
        "busy",
        "slots",
        "heartbeat_age_seconds",
        "heartbeat_interval_seconds",
    )
    return {k: d[k] for k in keys}


def _running(job: dict[str, Any], f: dict[str, Any]) -> list[dict[str, Any]]:
    holder = f["holder"] or {}
    where = f"{job['locked_by']}" + (f" on host {holder['host']}" if holder else "")
    left = f["lease_left_seconds"]
    reasons = [
        _reason(
            "running",
            f"running attempt {job['attempts']} of {job['max_attempts']} on daemon {where}"
            f" since {job['started_at']}; lease until {job['locked_until']}",
            worker=job["locked_by"],
            host=holder.get("host"),
            daemon_state=holder.get("state"),
            started_at=job["started_at"],
            locked_until=job["locked_until"],
            lease_left_seconds=left,
            attempt=job["attempts"],
            max_attempts=job["max_attempts"],
            progress=job["progress"],
        )
    ]
    if holder.get("silent"):
        reasons.append(_silent(job, holder, left))
    if left is not None and left < 0:
        reasons.append(
            _reason(
                "lease_expired",
                f"its lease ran out {_ago(left)} ago: daemon {job['locked_by']} stopped renewing"
                " it (dead, or cut off from the database); the next claim of a daemon"
                " serving it rescues it",
                expired_seconds=-left,
            )
        )
    if job["cancel_requested"]:
        reasons.append(
            _reason("cancel_requested", "a cancel was requested: its daemon is stopping it")
        )
    return reasons


def _silent(job: dict[str, Any], holder: dict[str, Any], left: float | None) -> dict[str, Any]:
    """Its daemon stopped heartbeating. Killed, frozen, or cut off from the database:
    nobody can tell which from here, and a cut-off host's child runs on (and may finish)
    until its lease ends, so the job is left to its lease; only then may another daemon
    take it. Said in the message, so that nobody "fixes" it by hand."""
    age, interval = holder.get("heartbeat_age_seconds"), holder.get("heartbeat_interval_seconds")
    if left is None:
        frees = "its lease"
    elif left >= 0:
        frees = f"its lease ends at {job['locked_until']} (in {_ago(left)})"
    else:
        frees = f"its lease ended at {job['locked_until']}"
    return _reason(
        "daemon_silent",
        f"daemon {job['locked_by']} on host {holder.get('host')} is silent: no heartbeat for"
        f" {_ago(age)} (it heartbeats every {_ago(interval)}); dead, frozen or cut off from"
        f" the database. The job is not taken from it early ({frees}): a cut-off host's"
        " job may still be running until then; afterwards a daemon serving it takes it"
        " again",
        worker=job["locked_by"],
        host=holder.get("host"),
        pid=holder.get("pid"),
        daemon_state=holder.get("state"),
        heartbeat_age_seconds=age,
        heartbeat_interval_seconds=interval,
        locked_until=job["locked_until"],
        lease_left_seconds=left,
    )


def _finished(job: dict[str, Any], f: dict[str, Any]) -> list[dict[str, Any]]:
    last = f["last_attempt"] or {}
    status = job["status"]
    common = {"finished_at": job["finished_at"], "attempts": job["attempts"]}
    if status == "completed":
        reasons = [
            _reason(
                "completed",
                f"completed at {job['finished_at']} after {job['attempts']} attempt(s)"
                + (f" on {last['worker']}" if last.get("worker") else ""),
                **common,
            )
        ]
    elif status == "dead":
        reasons = [
            _reason(
                "dead",
                f"dead at {job['finished_at']} after {job['attempts']} of"
                f" {job['max_attempts']} attempts; last error: {_last_line(job['last_error'])}"
                f" (pgworkerd retry {job['id']} runs it again)",
                max_attempts=job["max_attempts"],
                last_error=job["last_error"],
                last_outcome=last.get("outcome"),
                **common,
            )
        ]
    elif str(job.get("last_error") or "").startswith("expired: "):
        reasons = [
            _reason(
                "expired",
                f"cancelled at {job['finished_at']}, never started: "
                f"{_last_line(job['last_error']).removeprefix('expired: ')}",
                expires_at=job.get("expires_at"),
                **common,
            )
        ]
    elif str(job.get("last_error") or "").startswith("cancelled: parent job "):
        reasons = [
            _reason(
                "parent_failed",
                f"cancelled at {job['finished_at']}: "
                f"{_last_line(job['last_error']).removeprefix('cancelled: ')}"
                " (on_parent_failure cancel)",
                **common,
            )
        ]
    else:
        was_running = last.get("outcome") == "cancelled"
        reasons = [
            _reason(
                "cancelled",
                f"cancelled at {job['finished_at']}"
                + (" while running" if was_running else " before it ran again"),
                while_running=was_running,
                **common,
            )
        ]
    if f["dedupe_holder"] is not None:
        reasons.append(
            _reason(
                "dedupe_held",
                f"job {f['dedupe_holder']} holds its dedupe key '{job['dedupe_key']}':"
                " a retry leaves this one as it is",
                dedupe_key=job["dedupe_key"],
                holder=f["dedupe_holder"],
            )
        )
    return reasons


def _waiting(job: dict[str, Any], parents: Any) -> list[dict[str, Any]]:
    """A job with parents (schema 27): what it waits for, or that an operator must act."""
    listed = [{"id": p["id"], "status": p["status"] or "pruned"} for p in parents]
    unfinished = job.get("parents_unfinished") or 0
    failed = job.get("parents_failed") or 0
    if failed and job.get("on_parent_failure") == "hold":
        bad = [p for p in listed if p["status"] in ("dead", "cancelled")]
        named = ", ".join(f"job {p['id']} ended {p['status']}" for p in bad) or "a parent failed"
        return [
            _reason(
                "held",
                f"held for an operator: {named} (on_parent_failure hold);"
                f" pgworkerd release {job['id']} runs it"
                + (f" once its {unfinished} unfinished parent(s) finish" if unfinished else "")
                + f", pgworkerd cancel {job['id']} drops it",
                parents=listed,
                unfinished=unfinished,
                failed=failed,
            )
        ]
    waiting_on = [p for p in listed if p["status"] not in ("completed", "dead", "cancelled")]
    shown = ", ".join(f"{p['id']} ({p['status']})" for p in waiting_on[:10])
    more = f" and {unfinished - len(waiting_on[:10])} more" if unfinished > 10 else ""
    return [
        _reason(
            "waiting_on_parents",
            f"waiting for {unfinished} of its parents to finish: {shown}{more}",
            parents=listed,
            unfinished=unfinished,
            failed=failed,
            on_parent_failure=job.get("on_parent_failure"),
        )
    ]


def _callback_batch(
    conn: psycopg.Connection[Any], schema: str, job_id: int
) -> dict[str, Any] | None:
    """The batch whose callback job `job_id` is (schema 30), else None."""
    batch = batchread.batch_of(conn, schema, job_id)
    return batch if batch is not None and batch["callback_id"] == job_id else None


def _waiting_on_batch(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch's callback (schema 30): how many of its members have finished."""
    finished = batch["completed"] + batch["dead"] + batch["cancelled"]
    return _reason(
        "waiting_on_batch",
        f"the callback of batch {batch['id']}: waiting for its members, {finished} of "
        f"{batch['members']} finished ({batch['completed']} completed, {batch['dead']} dead, "
        f"{batch['cancelled']} cancelled); it runs once all have",
        batch=batch["id"],
        members=batch["members"],
        finished=finished,
        completed=batch["completed"],
        dead=batch["dead"],
        cancelled=batch["cancelled"],
    )


def _follow_up_reasons(
    conn: psycopg.Connection[Any], schema: str, job: dict[str, Any]
) -> list[dict[str, Any]]:
    """follow_ups and follow_up_of for a finished job (none for a role that may not read
    them; views.follow_ups)."""
    found = views.follow_ups(conn, schema, job["id"])
    if found is None:
        return []
    reasons = []
    then, of = found["follow_ups"], found["follow_up_of"]
    if then:
        shown = ", ".join(str(i) for i in then[:20]) + (" ..." if len(then) > 20 else "")
        reasons.append(
            _reason(
                "follow_ups",
                f"its completion enqueued {len(then)} follow-up(s) in the same transaction:"
                f" {shown}",
                ids=then,
            )
        )
    if of:
        reasons.append(
            _reason(
                "follow_up_of",
                "enqueued by the completion of job " + ", ".join(str(i) for i in of),
                ids=of,
            )
        )
    return reasons


# -- fair share and start-rate limits (claim_v4, schema 33) -------------------------------

FAIR_KEYS_SHOWN = 10  # keys ahead named by fair_turn (the walk stops after one more)


def _turn_and_token(
    conn: psycopg.Connection[Any], schema: str, job: dict[str, Any], f: dict[str, Any]
) -> list[dict[str, Any]]:
    """A due pending job of a rate-limited handler (or key) whose next start-rate token is
    not due yet (rate_limited: when it is), and of a fair handler, the keys whose turns
    come before its key's (fair_turn, informational: it holds no slot back)."""
    if f["run_in_seconds"] is None or f["run_in_seconds"] > 0:
        return []  # not due: scheduled says when
    settings = [d["settings"] for d in f["daemons"] if d.get("serves_handler", True)]
    key = job["concurrency_key"]
    reasons: list[dict[str, Any]] = []
    rated = [s.get("rate") for s in settings if isinstance(s.get("rate"), str)]
    keyed = [s.get("rate_per_key") for s in settings if isinstance(s.get("rate_per_key"), str)]
    if rated or (keyed and key is not None):
        with conn.cursor(row_factory=dict_row) as cur:
            tokens = cur.execute(
                query("view_rate_tokens", schema), {"handler": job["handler"], "key": key}
            ).fetchall()
        for t in tokens:
            whose = (
                f"handler '{job['handler']}' (rate {', '.join(rated)})"
                if t["concurrency_key"] == ""
                else f"concurrency key '{key}' (rate_per_key {', '.join(keyed)})"
            )
            reasons.append(
                _reason(
                    "rate_limited",
                    f"the start rate of {whose} is used up: its next token is due at"
                    f" {t['next_at']} (in {_ago(t['in_seconds'])}); daemons wake for it",
                    key=None if t["concurrency_key"] == "" else key,
                    next_token_at=t["next_at"],
                    in_seconds=t["in_seconds"],
                    rate=(rated if t["concurrency_key"] == "" else keyed),
                )
            )
    if any(s.get("fair") is True for s in settings):
        reasons += _fair_turn(conn, schema, job)
    return reasons


def _fair_turn(
    conn: psycopg.Connection[Any], schema: str, job: dict[str, Any]
) -> list[dict[str, Any]]:
    """The keys with pending jobs at the job's priority whose turns come between the fair
    cursor (the key served last) and the job's key, in the claim's order, up to
    FAIR_KEYS_SHOWN: one index probe each (claim_v4's walk), never a scan of all keys."""
    mine = job["concurrency_key"] or ""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("view_fair_cursor", schema), {"handler": job["handler"]}).fetchone()
        cursor = None if row is None else row["concurrency_key"]
        ahead: list[str] = []
        after, wrapped = cursor, False
        while len(ahead) <= FAIR_KEYS_SHOWN:
            nxt = cur.execute(
                query("view_fair_next_key", schema),
                {"handler": job["handler"], "priority": job["priority"], "after": after},
            ).fetchone()
            if nxt is None:
                if wrapped or after is None:
                    break
                after, wrapped = None, True
                continue
            k = nxt["concurrency_key"]
            if k == mine or (wrapped and cursor is not None and k >= cursor):
                break
            ahead.append(k)
            after = k
    named = ", ".join("(no key)" if k == "" else f"'{k}'" for k in ahead[:FAIR_KEYS_SHOWN])
    more = "+" if len(ahead) > FAIR_KEYS_SHOWN else ""
    return [
        _reason(
            "fair_turn",
            f"handler '{job['handler']}' is fair: "
            + (
                f"{min(len(ahead), FAIR_KEYS_SHOWN)}{more} key(s) with pending jobs take"
                f" their turn before its key's: {named}"
                if ahead
                else "its key's turn is next"
            )
            + (f" (the last key served: '{cursor}')" if cursor else ""),
            keys_ahead=ahead[:FAIR_KEYS_SHOWN],
            more_keys_ahead=bool(more),
            last_served=cursor,
        )
    ]
