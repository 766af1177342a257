"""The dashboard's bulk actions on a selection of jobs (the jobs list's checkboxes):
retry, cancel, run now, delete (finished jobs), change priority; and "retry the dead jobs
of a handler or queue" as one bounded action.

Like actions.py: a confirmation page naming the action and how many jobs, then a POST
(CSRF-checked by login.guard, as is the POST that asks for the confirmation) run through
the action pool, each audited as one log line (who, from where, what, how many asked,
how many changed). A selection is at most admin.BULK_MAX jobs: more is refused (400)
before a single id is parsed, and the database function holds the same bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from flask import Blueprint, abort, flash, redirect, render_template, request, url_for

from pgworkerd.bounds import PRIORITY_MAX, PRIORITY_MIN, name_problem
from pgworkerd.queue import admin
from pgworkerd.web.context import context
from pgworkerd.web.login import current_user, safe_next

log = logging.getLogger("pgworkerd.web")

# Ids a confirmation page lists by number (the rest are counted).
IDS_LISTED = 50


@dataclass(frozen=True)
class BulkAction:
    title: str  # "Retry", on the confirmation page and its button
    warning: str
    # conn, schema, ids, priority -> how many jobs changed, and a sentence saying so
    run: Callable[[psycopg.Connection[Any], str, Sequence[int], int | None], tuple[int, str]]


def _retry(
    conn: psycopg.Connection[Any], schema: str, ids: Sequence[int], _: int | None
) -> tuple[int, str]:
    done = admin.retry(conn, ids=list(ids), schema=schema)
    return (
        len(done),
        f"{len(done)} back to pending (a job not dead or cancelled, or whose dedupe key a"
        " live job holds, is left)",
    )


def _cancel(
    conn: psycopg.Connection[Any], schema: str, ids: Sequence[int], _: int | None
) -> tuple[int, str]:
    outcomes = admin.cancel(conn, list(ids), schema=schema)
    tally: dict[str, int] = {}
    for outcome in outcomes.values():
        tally[outcome] = tally.get(outcome, 0) + 1
    changed = tally.get("cancelled", 0) + tally.get("cancel requested", 0)
    return changed, ", ".join(f"{n} {what}" for what, n in sorted(tally.items()))


def _run_now(
    conn: psycopg.Connection[Any], schema: str, ids: Sequence[int], _: int | None
) -> tuple[int, str]:
    done = admin.run_now(conn, ids, schema=schema)
    return len(done), f"{len(done)} due now (only pending jobs due later move)"


def _delete(
    conn: psycopg.Connection[Any], schema: str, ids: Sequence[int], _: int | None
) -> tuple[int, str]:
    done = admin.delete_finished(conn, ids, schema=schema)
    return len(done), f"{len(done)} deleted (only finished jobs are: cancel a live one first)"


def _priority(
    conn: psycopg.Connection[Any], schema: str, ids: Sequence[int], priority: int | None
) -> tuple[int, str]:
    assert priority is not None
    outcomes = admin.set_priority(conn, ids, priority, schema=schema)
    changed = sum(1 for o in outcomes.values() if o == "priority set")
    return changed, f"{changed} set to priority {priority} (running and finished jobs keep theirs)"


BULK: dict[str, BulkAction] = {
    "retry": BulkAction("Retry", "Dead and cancelled ones run again with fresh attempts.", _retry),
    "cancel": BulkAction(
        "Cancel", "Running ones are asked to stop; pending ones never run.", _cancel
    ),
    "run-now": BulkAction("Run now", "Pending ones due later become due now.", _run_now),
    "delete": BulkAction(
        "Delete",
        "Finished ones are deleted with their attempts and logs; nothing undoes it.",
        _delete,
    ),
    "priority": BulkAction(
        "Change priority", "Pending, waiting and suspended ones get the new priority.", _priority
    ),
}

bulk = Blueprint("bulk", __name__)


def _writable() -> None:
    if context().settings.read_only:
        abort(403, "this dashboard is read-only ([web] read_only)")


def _selection() -> tuple[str, BulkAction, list[int], int | None]:
    """The action, the job ids and the priority the form names, each checked."""
    _writable()
    name = request.form.get("action", "")
    action = BULK.get(name)
    if action is None:
        abort(400, "choose an action: " + ", ".join(BULK))
    raw = request.form.getlist("id")
    if not raw:
        abort(400, "no job selected")
    if len(raw) > admin.BULK_MAX:  # counted before any is parsed
        abort(400, f"at most {admin.BULK_MAX} jobs per action, not {len(raw)}")
    if not all(v.isascii() and v.isdigit() and len(v) < 19 for v in raw):
        abort(400, "a job id is not a number")
    ids = sorted({int(v) for v in raw})
    priority = None
    if name == "priority":
        text = request.form.get("priority", "").strip()
        if not (text.lstrip("-").isascii() and text.lstrip("-").isdigit() and len(text) <= 6):
            abort(400, f"the priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}")
        priority = int(text)
        if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
            abort(400, f"the priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}")
    return name, action, ids, priority


def _back() -> str:
    return safe_next(request.form.get("back") or url_for("pages.jobs"))


def _audit(what: str, target: str, asked: int, changed: int, outcome: str) -> None:
    who = current_user() or "?"
    log.info(
        "web bulk action: %s %s by %s from %s: %d asked, %d changed: %s",
        what,
        target,
        who,
        request.remote_addr,
        asked,
        changed,
        outcome,
        extra={
            "fields": {
                "action": what,
                "target": target,
                "user": who,
                "remote": request.remote_addr,
                "asked": asked,
                "changed": changed,
                "outcome": outcome,
            }
        },
    )


@bulk.post("/bulk/confirm")
def confirm() -> str:
    name, action, ids, priority = _selection()
    return render_template(
        "bulk_confirm.html",
        name=name,
        action=action,
        ids=ids,
        listed=ids[:IDS_LISTED],
        priority=priority,
        back=_back(),
    )


@bulk.post("/bulk/act")
def act() -> Any:
    name, action, ids, priority = _selection()
    ctx = context()
    with ctx.action_database() as conn:
        changed, outcome = action.run(conn, ctx.settings.schema, ids, priority)
    target = f"{len(ids)} job(s)" + (f" to priority {priority}" if priority is not None else "")
    _audit(name, target, len(ids), changed, outcome)
    flash(f"{action.title} {len(ids)} job(s): {outcome}")
    return redirect(_back())


def _dead_scope() -> tuple[str, str]:
    """The kind (queue or handler) and name whose dead jobs to retry, checked."""
    _writable()
    source = request.form if request.method == "POST" else request.args
    kind = source.get("kind", "")
    if kind not in ("queue", "handler"):
        abort(400, "retry the dead jobs of a queue or a handler")
    name = source.get("name", "")
    problem = name_problem(kind, name)
    if problem:
        abort(400, problem)
    return kind, name


@bulk.get("/bulk/confirm-dead")
def confirm_dead() -> str:
    kind, name = _dead_scope()
    ctx = context()
    with ctx.database() as conn:
        found = admin.dead_ids(
            conn, schema=ctx.settings.schema, limit=admin.BULK_MAX, **{kind: name}
        )
    return render_template(
        "bulk_dead_confirm.html", kind=kind, target=name, count=len(found), cap=admin.BULK_MAX
    )


@bulk.post("/bulk/act-dead")
def act_dead() -> Any:
    kind, name = _dead_scope()
    ctx = context()
    with ctx.action_database() as conn, conn.transaction():
        found = admin.dead_ids(
            conn, schema=ctx.settings.schema, limit=admin.BULK_MAX, **{kind: name}
        )
        done = admin.retry(conn, ids=found, schema=ctx.settings.schema) if found else []
    outcome = f"{len(done)} of {len(found)} dead job(s) back to pending"
    _audit("retry-dead", f"{kind} {name}", len(found), len(done), outcome)
    flash(f"Retry the dead jobs of {kind} {name}: {outcome}")
    back: dict[str, Any] = {"status": "dead", kind: name}
    return redirect(url_for("pages.jobs", **back))
