"""The pages: overview, jobs list, a job (with its live part and raw downloads),
schedules, pauses and limits. They only read, through the pages' pool."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

from flask import Blueprint, abort, jsonify, render_template, request, url_for
from werkzeug.wrappers import Response

from pgworkerd.model import STATUSES
from pgworkerd.queue import batchread, explain, joblogs, views
from pgworkerd.web import charts, logtail, problems, progress, schedule_view
from pgworkerd.web.context import context
from pgworkerd.web.filters import SHOWN_CHARS

# Rows per page of the jobs list.
PAGE_SIZE = 50
# Attempts (history rows, captured logs) a job's page shows at most: the newest.
ATTEMPTS_SHOWN = 100
LOGS_SHOWN = 20
# A raw download streams parts of this many characters (each its own statement) and
# stops after RAW_MAX_CHARS, saying so.
RAW_PART_CHARS = 4 << 20
RAW_MAX_CHARS = 64 << 20

pages = Blueprint("pages", __name__)


def _overview_data() -> dict[str, Any]:
    ctx = context()
    with ctx.database() as conn:
        snap = views.overview(conn, ctx.settings.schema)
        # for the banner: what each limit holds back (the Limits page's counts)
        limits = views.limits(conn, ctx.settings.schema)
        views.limits_held(conn, ctx.settings.schema, limits, cap=views.TAB_COUNT_CAP)
    hour = snap["throughput"]
    totals = {
        "completed": sum(m["completed"] for m in hour),
        "failed": sum(m["failed_total"] for m in hour),
    }
    found = problems.problems(
        snap,
        url_for("pages.jobs"),
        url_for("pages.paused_page"),
        limits,
        url_for("pages.limits_page"),
    )
    # each paused queue's pause (who asked, why), for its row
    paused_queues = {p["name"]: p for p in snap["paused"] if p["kind"] == "queue"}
    return {
        "snap": snap,
        "last_hour": charts.last_hour_chart(hour),
        "totals": totals,
        "problems": found,
        "paused_queues": paused_queues,
    }


@pages.get("/")
def overview() -> str:
    return render_template("overview.html", **_overview_data())


@pages.get("/live/overview")
def overview_live() -> str:
    return render_template("overview_live.html", **_overview_data())


def _job_data(job_id: int) -> dict[str, Any]:
    ctx = context()
    schema = ctx.settings.schema
    with ctx.database() as conn:
        # the row and history `pgworkerd show` reads, each value bounded (a 30 MB
        # payload is read as its first SHOWN_CHARS characters and its length)
        job = views.job_shown(conn, schema, job_id, shown=SHOWN_CHARS)
        if job is None:
            abort(404, f"no job {job_id}")
        history = views.attempts_shown(
            conn, schema, job_id, shown=SHOWN_CHARS, limit=ATTEMPTS_SHOWN
        )
        why = explain.explain(conn, schema, job_id)
        # the signals it received (durable waits); None: the role may not read them
        received = views.signals_shown(conn, schema, job_id, shown=SHOWN_CHARS)
        # the follow-ups its completion enqueued, and the job whose completion enqueued
        # it (None: a role granted before schema 29)
        follow = views.follow_ups(conn, schema, job_id)
        # the batch it is a member or the callback of, with its progress (schema 30)
        batch = batchread.batch_of(conn, schema, job_id)
    total = history[0]["total"] if history else 0
    # each attempt numbered by its place in the whole history (attempt numbers start
    # again after a retry and recur after a release): the rows are the newest, oldest first
    for seq, row in enumerate(history or [], start=total - len(history or []) + 1):
        row["seq"] = seq
    return {
        "job": job,
        "progress": progress.of_job(job),
        "attempts": history or [],
        "attempts_total": total,
        "explain": why,
        "signals": received,
        "follow": follow,
        "batch": batch,
    }


@pages.get("/jobs/<int:job_id>")
def job(job_id: int) -> str:
    data = _job_data(job_id)
    ctx = context()
    with ctx.database() as conn:
        # None: a role without the job_logs grant: the rest still shows
        rows = views.logs_shown(
            conn, ctx.settings.schema, job_id, shown=SHOWN_CHARS, limit=LOGS_SHOWN
        )
    logs = None
    if rows is not None:
        for row in rows:
            row["truncated"] = row["omitted_bytes"] > 0
            row["cut"] = max(row["head_chars"], row["tail_chars"]) > SHOWN_CHARS
            row["ref"] = log_ref(job_id, row["lease_token"])
        logs = {"logs": rows, "total": rows[0]["total"] if rows else 0}
    return render_template("job.html", logs=logs, **data)


def _raw_response(parts: Iterator[str], name: str) -> Response:
    response = Response(parts, mimetype="text/plain")
    response.headers["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


def _streamed(read: Callable[[int], tuple[str, int] | None]) -> Iterator[str]:
    """A value read in parts (read(start) -> (part, whole length) or None), each part
    in its own statement and pool connection, stopped after RAW_MAX_CHARS."""
    start = 0
    while start < RAW_MAX_CHARS:
        found = read(start)
        if found is None or not found[0]:
            return
        part, whole = found
        yield part
        start += len(part)
        if start >= whole:
            return
    yield f"\n[... cut here: the download stops after {RAW_MAX_CHARS} characters ...]\n"


@pages.get("/jobs/<int:job_id>/raw/<field>")
def job_raw(job_id: int, field: str) -> Response:
    if field not in views.JOB_VALUES:
        abort(404, "no such value")
    ctx = context()  # the generator runs after the request: it keeps its own reference

    def read(start: int) -> tuple[str, int] | None:
        with ctx.database() as conn:
            return views.job_value_part(
                conn, ctx.settings.schema, job_id, field, start, RAW_PART_CHARS
            )

    first = read(0)
    if first is None:
        abort(404, f"job {job_id} has no {field}")
    return _raw_response(_streamed(read), f"job-{job_id}-{field}.txt")


def log_ref(job_id: int, token: int) -> str:
    """How a page names one attempt's log: not its lease token, which is a capability
    (job_lease_assert) and must not reach URLs, browser histories or access logs."""
    return hashlib.sha256(f"{job_id}:{token}".encode()).hexdigest()[:20]


@pages.get("/jobs/<int:job_id>/logs/<ref>")
def job_log_raw(job_id: int, ref: str) -> Response:
    ctx = context()  # the generator runs after the request: it keeps its own reference
    schema = ctx.settings.schema
    with ctx.database() as conn:
        entries = views.logs_shown(conn, schema, job_id, shown=0, limit=LOGS_SHOWN) or []
    found = [e for e in entries if log_ref(job_id, e["lease_token"]) == ref]
    if not found:
        abort(404, f"job {job_id} has no output of that attempt")
    token, attempt = found[0]["lease_token"], found[0]["attempt"]

    def reader(part: str) -> Callable[[int], tuple[str, int] | None]:
        def read(start: int) -> tuple[str, int] | None:
            with ctx.database() as conn:
                found = views.job_log_part(conn, schema, job_id, token, part, start, RAW_PART_CHARS)
            return None if found is None else found[:2]

        return read

    with ctx.database() as conn:
        first = views.job_log_part(conn, schema, job_id, token, "head", 0, 0)
    if first is None:
        abort(404, f"job {job_id} has no output of that attempt")
    omitted = first[2]

    def both() -> Iterator[str]:
        # as joblogs.text_of (and `pgworkerd logs`) writes it
        last = ""
        for part in _streamed(reader("head")):
            last = part
            yield part
        if omitted:
            newline = "" if not last or last.endswith("\n") else "\n"
            yield f"{newline}{joblogs.omitted_marker(omitted)}\n"
        yield from _streamed(reader("tail"))

    return _raw_response(both(), f"job-{job_id}-attempt-{attempt}.log")


@pages.get("/live/jobs/<int:job_id>/log")
def job_log_tail(job_id: int) -> Response:
    """The next part of one attempt's output after the cursor the page sends (logtail):
    the attempt `ref` names, else the newest. JSON for static/tail.js."""
    try:
        cursor = logtail.Cursor.parse(request.args.to_dict())
    except logtail.BadCursor as exc:
        abort(400, str(exc))
    ref = request.args.get("ref", "")
    if ref and not (len(ref) == 20 and all(c in "0123456789abcdef" for c in ref)):
        abort(400, "ref must name an attempt's log as the page gave it")
    ctx = context()
    schema = ctx.settings.schema
    with ctx.database() as conn:
        entries = views.logs_shown(conn, schema, job_id, shown=0, limit=LOGS_SHOWN)
        if entries is None:
            abort(403, "the role may not read job logs")
        found = [e for e in entries if ref and log_ref(job_id, e["lease_token"]) == ref]
        if not found:  # the first poll, or an attempt no longer among the newest
            if not entries:
                return jsonify(logtail.as_json("", cursor, False, ref="", attempt=None))
            found, cursor = [entries[-1]], logtail.Cursor()
        entry = found[0]
        token = entry["lease_token"]

        def read(part: str, start: int, chars: int) -> tuple[str, int, int] | None:
            return views.job_log_part(conn, schema, job_id, token, part, start, chars)

        text, cursor, more = logtail.step(read, cursor, entry["finished"])
    newest = entry is entries[-1]
    return jsonify(
        logtail.as_json(
            text,
            cursor,
            more,
            ref=log_ref(job_id, token),
            attempt=entry["attempt"],
            finished=entry["finished"],
            # its attempt ended and a later one printed: the page moves on to that one
            next=entry["finished"] and not newest and not more,
        )
    )


@pages.get("/live/jobs/<int:job_id>")
def job_live(job_id: int) -> str:
    return render_template("job_live.html", **_job_data(job_id))


# The orders the jobs list offers: each one an index serves (keyset pagination by id
# through the (status, id), (queue, status, id) and (handler, status, id) indexes, read
# either way). Not offered: run_at, priority, started or finished across statuses (no
# index orders them: a sort would read every matching job), refused with 400.
SORTS = ("newest", "oldest")


@pages.get("/jobs")
def jobs() -> str:
    filters = {k: request.args.get(k, "") for k in ("status", "queue", "handler", "text", "tab")}
    if filters["status"] and filters["status"] not in STATUSES:
        abort(400, "unknown status")
    if filters["tab"] and filters["tab"] not in views.TABS:
        abort(400, f"unknown tab: the tabs are {', '.join(views.TABS)}")
    if filters["tab"] and filters["status"]:
        abort(400, "give a tab or a status, not both")
    sort = request.args.get("sort", "newest")
    if sort not in SORTS:
        abort(
            400,
            "no index serves that order: the list sorts by id, newest or oldest first "
            "(sort=newest or sort=oldest; narrow it by tab, queue or handler instead)",
        )
    pending_when = filters["tab"] if filters["tab"] in views.PENDING_PARTS else None
    status = "pending" if pending_when else (filters["tab"] or filters["status"])
    if len(filters["text"]) > 200:
        abort(400, "the search text is longer than 200 characters")
    before, after = _page_id("before"), _page_id("after")
    error = ""
    ctx = context()
    try:
        with ctx.database() as conn:
            page = views.jobs_page(
                conn,
                ctx.settings.schema,
                statuses=[status] if status else None,
                pending_when=pending_when,
                queue=filters["queue"] or None,
                handler=filters["handler"] or None,
                text=filters["text"] or None,
                before=before,
                after=after,
                limit=PAGE_SIZE,
                oldest_first=sort == "oldest",
            )
    except views.TextSearchTimeout as exc:
        page, error = {"jobs": [], "older": None, "newer": None}, str(exc)
    except ValueError as exc:
        abort(400, str(exc))
    with ctx.database() as conn:
        counts = views.tab_counts(
            conn,
            ctx.settings.schema,
            queue=filters["queue"] or None,
            handler=filters["handler"] or None,
        )
    shown = {k: v for k, v in filters.items() if v}
    if sort != "newest":
        shown["sort"] = sort
    scope = {k: v for k, v in shown.items() if k in ("queue", "handler", "text")}
    return render_template(
        "jobs.html",
        page=page,
        rows=page["jobs"],
        filters=filters,
        shown=shown,
        scope=scope,
        error=error,
        tabs=views.TABS,
        counts=counts,
        count_cap=views.TAB_COUNT_CAP,
        sort=sort,
        sorts=SORTS,
    )


def _page_id(name: str) -> int | None:
    value = request.args.get(name, "")
    if not value:
        return None
    if not (value.isascii() and value.isdigit() and len(value) < 19):
        abort(400, f"{name} must be a job id")
    return int(value)


@pages.get("/charts")
def charts_page() -> str:
    """Throughput, failures, wait time and runtime over one of charts.WINDOWS, from the
    daemons' rollup: a bounded read, whatever the number of jobs."""
    try:
        window = charts.window_of(request.args.get("window"))
    except charts.BadWindow as exc:
        abort(400, str(exc))
    ctx = context()
    with ctx.database() as conn:
        cursor = views.rollup_cursor(conn, ctx.settings.schema)
        now = cursor["now"]
        rows = views.rollup_rows(
            conn, ctx.settings.schema, grain=window.grain, since=charts.first_start(window, now)
        )
    summary = charts.summarize(rows, window, now, cursor["bounds"])
    return render_template(
        "charts.html",
        window=window,
        windows=charts.WINDOWS,
        summary=summary,
        charts=charts.charts(summary),
        rolled_to=cursor["rolled_to"],
        percentile=charts.percentile,
        bound_text=charts.bound_text,
    )


@pages.get("/schedules")
def schedules_page() -> str:
    ctx = context()
    with ctx.database() as conn:
        rows = views.schedules(conn, ctx.settings.schema)
    for row in rows:
        # only a schedule a live daemon declares fires: the others have no next run
        row["next_run"] = schedule_view.next_run(row["definition"]) if row["declared_now"] else None
    return render_template("schedules.html", rows=rows)


@pages.get("/paused")
def paused_page() -> str:
    ctx = context()
    with ctx.database() as conn:
        rows = views.paused(conn, ctx.settings.schema)
    return render_template("paused.html", rows=rows)


@pages.get("/limits")
def limits_page() -> str:
    ctx = context()
    with ctx.database() as conn:
        rows = views.limits(conn, ctx.settings.schema)
        views.limits_held(conn, ctx.settings.schema, rows, cap=views.TAB_COUNT_CAP)
    return render_template("limits.html", rows=rows, cap=views.TAB_COUNT_CAP)
