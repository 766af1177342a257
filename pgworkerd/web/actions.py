"""The dashboard's actions: enqueue, cancel, retry, release, signal, drain, resume, pause,
trigger a schedule.

They reuse the CLI's functions; each is a GET that shows a confirmation page and a POST
(with the session's CSRF token, checked by login.guard) that does it, through the action
pool, logged as an audit line naming who, from where, what and on which target.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from pgworkerd import client, signals
from pgworkerd.bounds import name_problem
from pgworkerd.describe import printable
from pgworkerd.durations import parse_duration
from pgworkerd.queue import admin, fleet
from pgworkerd.web import schedule_view
from pgworkerd.web.context import context
from pgworkerd.web.login import current_user

log = logging.getLogger("pgworkerd.web")


@dataclass(frozen=True)
class Action:
    title: str  # "Cancel job", shown on the confirmation page and its button
    kind: str  # what the target is: job, daemon, queue or handler
    run: Callable[[psycopg.Connection[Any], str, str, str], str]  # conn, schema, target, who
    warning: str = ""
    asks_reason: bool = False  # the confirmation page has a reason field (a pause)
    asks_signal: bool = False  # ... a signal's name and payload fields (a signal)
    asks_job: bool = False  # ... a new job's payload, queue, priority and delay (an enqueue)


def _cancel(conn: psycopg.Connection[Any], schema: str, target: str, who: str) -> str:
    outcome = admin.cancel(conn, [int(target)], schema=schema)
    return outcome.get(int(target), "not found")


def _retry(conn: psycopg.Connection[Any], schema: str, target: str, who: str) -> str:
    ids = admin.retry(conn, ids=[int(target)], schema=schema)
    return "back to pending" if ids else "not retried (not dead or cancelled, or a duplicate)"


def _release(conn: psycopg.Connection[Any], schema: str, target: str, who: str) -> str:
    """A job held after a parent failed (on_parent_failure hold) runs after all:
    `pgworkerd release`, through job_held_release (the operator's)."""
    try:
        status = admin.release_held(conn, int(target), schema=schema)
    except admin.NotHeld as exc:
        return f"not released: {exc}"
    if status == "pending":
        return "released: pending"
    return "released: it runs when its unfinished parents have finished"


def _signal_form() -> tuple[str, Any, str | None]:
    """A signal's name and payload from the form: (name, payload value, the problem with
    them or None), with `pgworkerd signal`'s checks and words (an empty payload: none)."""
    source = request.form if request.method == "POST" else request.args
    name = source.get("signal", "").strip()
    text = source.get("payload", "").strip()
    value: Any = None
    if text:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return name, None, f"the payload is not valid JSON: {exc}"
    problem, _ = signals.signal_problem(name, value)
    return name, value, problem


@dataclass(frozen=True)
class JobForm:
    """A new job's fields from the enqueue form (`pgworkerd enqueue`'s options of the same
    names); `problem` says what is wrong with them, None if nothing is."""

    payload: dict[str, Any]
    queue: str
    priority: int
    delay: float | None
    problem: str | None = None


def _job_form() -> JobForm:
    source = request.form if request.method == "POST" else request.args
    queue = source.get("queue", "").strip() or client.DEFAULT_QUEUE
    text = source.get("payload", "").strip() or "{}"
    priority_text = source.get("priority", "").strip() or "0"
    delay_text = source.get("delay", "").strip()

    def refused(problem: str) -> JobForm:
        return JobForm({}, queue, 0, None, problem)

    try:
        payload = client.payload_from_json(text)
    except ValueError as exc:
        return refused(f"the payload: {exc}")
    try:
        priority = int(priority_text)
    except ValueError:
        return refused(f"the priority must be a whole number, not {printable(priority_text)!r}")
    try:
        delay = parse_duration(delay_text) if delay_text else None
    except ValueError as exc:
        return refused(f"the delay: {exc}")
    problem = name_problem("queue", queue)
    return JobForm(payload, queue, priority, delay, problem)


def _enqueue(conn: psycopg.Connection[Any], schema: str, target: str, who: str) -> str:
    """`pgworkerd enqueue HANDLER --payload ... --queue ... --priority ... --delay ...`,
    through client.enqueue (its checks, the enqueue bounds of the action role)."""
    form = _job_form()  # (checked by _checked_action)
    try:
        job_id = client.enqueue(
            conn,
            target,
            form.payload,
            queue=form.queue,
            priority=form.priority,
            delay=form.delay,
            schema=schema,
        )
    except (client.InvalidJob, client.DuplicateJob, psycopg.DataError) as exc:
        # refused by the client's checks or the database's (class 22: a value it cannot
        # store, e.g. a NUL in the payload): said, nothing enqueued
        conn.rollback()
        return f"not enqueued: {str(exc).removeprefix('pgworkerd: ')}"
    return f"enqueued job {job_id}"


def _signal(conn: psycopg.Connection[Any], schema: str, target: str, who: str) -> str:
    """`pgworkerd signal ID NAME --payload ...`, through signal_send (the operator may
    signal any job: it reads them all): a job waiting for NAME becomes pending at once."""
    name, value, _ = _signal_form()  # (checked by _checked_action)
    try:
        sent = signals.signal(conn, int(target), name, value, schema=schema)
    except signals.SignalRefused as exc:
        return f"signal {name!r} not sent: {exc}"
    if sent.outcome == "resumed":
        return f"signal {name!r} sent: the job is {sent.status} again"
    if sent.outcome == "kept":
        return f"signal {name!r} kept: the job's wait for it returns at once"
    return f"signal {name!r} ignored: the job had one of that name already (first one wins)"


def _drain(drain: bool) -> Callable[[psycopg.Connection[Any], str, str, str], str]:
    def run(conn: psycopg.Connection[Any], schema: str, target: str, who: str) -> str:
        affected = fleet.request_drain(conn, schema, drain=drain, worker_id=target)
        if not affected:
            return "no live daemon has this id"
        return "drain requested" if drain else "resumed"

    return run


def _reason() -> str:
    """A pause's reason from the confirmation form (checked by _checked_action)."""
    return request.form.get("reason", "").strip()


def _pause(kind: str, pause: bool) -> Callable[[psycopg.Connection[Any], str, str, str], str]:
    def run(conn: psycopg.Connection[Any], schema: str, target: str, who: str) -> str:
        # the person is the dashboard's user (schema 38: paused_add); the role is shared
        changed = fleet.set_paused(
            conn,
            schema,
            kind,
            target,
            pause=pause,
            comment=(_reason() or None) if pause else None,
            requested_by=f"{who} (web)" if pause else None,
        )
        if pause:
            return "paused" if changed else "was already paused"
        return "resumed" if changed else "was not paused"

    return run


def _trigger_schedule(conn: psycopg.Connection[Any], schema: str, target: str, who: str) -> str:
    try:
        return f"enqueued job {schedule_view.trigger(conn, schema, target)}"
    except schedule_view.CannotTrigger as exc:
        return f"not triggered: {exc}"


ACTIONS: dict[str, Action] = {
    "enqueue": Action(
        "Enqueue job",
        "handler",
        _enqueue,
        "A new job for this handler, as `pgworkerd enqueue` makes it.",
        asks_job=True,
    ),
    "cancel": Action(
        "Cancel job", "job", _cancel, "A running job is asked to stop; a pending one never runs."
    ),
    "retry": Action("Retry job", "job", _retry, "The job runs again with fresh attempts."),
    "release": Action(
        "Release held job",
        "job",
        _release,
        "It runs although a parent ended dead or cancelled: at once, or when its last "
        "unfinished parent finishes.",
    ),
    "signal": Action(
        "Send signal",
        "job",
        _signal,
        "A job waiting for this signal runs again at once and sees its payload; one not "
        "waiting for it yet keeps it. The first signal of a name wins.",
        asks_signal=True,
    ),
    "drain": Action(
        "Drain daemon", "daemon", _drain(True), "It finishes its jobs and claims no new ones."
    ),
    "resume": Action("Resume daemon", "daemon", _drain(False)),
    "pause-queue": Action(
        "Pause queue",
        "queue",
        _pause("queue", True),
        "No daemon claims its jobs until resumed.",
        asks_reason=True,
    ),
    "resume-queue": Action("Resume queue", "queue", _pause("queue", False)),
    "pause-handler": Action(
        "Pause handler",
        "handler",
        _pause("handler", True),
        "No daemon claims its jobs until resumed.",
        asks_reason=True,
    ),
    "resume-handler": Action("Resume handler", "handler", _pause("handler", False)),
    "trigger-schedule": Action(
        "Trigger schedule now",
        "schedule",
        _trigger_schedule,
        "Its job is enqueued now; its own ticks are unchanged.",
    ),
}


def _target_problem(kind: str, target: str) -> str | None:
    if kind == "job":
        return None if target.isascii() and target.isdigit() and len(target) < 19 else "bad id"
    if kind == "daemon":
        return None if 0 < len(target) <= 300 and target.isprintable() else "bad daemon id"
    return name_problem(kind, target)


actions = Blueprint("actions", __name__)


def _checked_action(name: str) -> tuple[Action, str]:
    action = ACTIONS.get(name)
    if action is None:
        abort(404, "no such action")
    if context().settings.read_only:
        abort(403, "this dashboard is read-only ([web] read_only)")
    source = request.form if request.method == "POST" else request.args
    target = source.get("target", "")
    problem = _target_problem(action.kind, target)
    if problem:
        abort(400, problem)
    if action.asks_reason:
        reason = source.get("reason", "")
        problem = fleet.pause_text_problem(
            "the reason", reason.strip(), fleet.REASON_MAX, empty_ok=True
        )
        if problem:
            abort(400, problem)
    if action.asks_signal and request.method == "POST":
        problem = _signal_form()[2]
        if problem:
            abort(400, problem)
    if action.asks_job and request.method == "POST":
        problem = _job_form().problem
        if problem:
            abort(400, problem)
    return action, target


@actions.get("/confirm/<name>")
def confirm(name: str) -> str:
    action, target = _checked_action(name)
    reason = request.args.get("reason", "") if action.asks_reason else ""
    signal = request.args.get("signal", "") if action.asks_signal else ""
    return render_template(
        "confirm.html", name=name, action=action, target=target, reason=reason, signal=signal
    )


@actions.post("/act/<name>")
def act(name: str) -> Any:
    action, target = _checked_action(name)
    who = current_user() or "?"
    ctx = context()
    with ctx.action_database() as conn:
        outcome = action.run(conn, ctx.settings.schema, target, who)
    log.info(
        "web action: %s %s %s by %s from %s: %s",
        name,
        action.kind,
        target,
        who,
        request.remote_addr,
        outcome,
        extra={
            "fields": {
                "action": name,
                "target_kind": action.kind,
                "target": target,
                "user": who,
                "remote": request.remote_addr,
                "outcome": outcome,
            }
        },
    )
    flash(f"{action.title} {printable(target)}: {outcome}")
    if action.kind == "job":
        return redirect(url_for("pages.job", job_id=int(target)))
    if action.kind == "daemon":
        return redirect(url_for("pages.overview"))
    if action.kind == "schedule":
        return redirect(url_for("pages.schedules_page"))
    return redirect(url_for("pages.paused_page"))
