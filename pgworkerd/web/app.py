"""The dashboard's pages, login, CSRF protection and actions (a Flask application).

Every value shown comes from rows that applications and enqueuers wrote, so templates
render nothing unescaped (Jinja2 autoescaping; no `|safe` anywhere) and the `t` filter
also writes control and bidirectional-override characters as visible escapes. The
Content-Security-Policy allows scripts and styles from this server's /static only.

Actions (cancel, retry, drain, resume, pause) reuse the CLI's functions; each is a GET
that shows a confirmation page and a POST (with the session's CSRF token) that does it,
logged as an audit line naming who, from where, what and on which target.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from flask import Flask, abort, flash, redirect, render_template, request, session, url_for
from psycopg_pool import ConnectionPool, PoolTimeout
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response

from pgworkerd.bounds import name_problem
from pgworkerd.describe import printable
from pgworkerd.durations import format_duration
from pgworkerd.model import STATUSES
from pgworkerd.queue import admin, explain, fleet, joblogs, views
from pgworkerd.queue.db import scrub
from pgworkerd.web.auth import Devices, LoginThrottle, Sessions
from pgworkerd.web.passwords import verify

log = logging.getLogger("pgworkerd.web")

# Rows per page of the jobs list.
PAGE_SIZE = 50
# Characters of one value (payload, progress, checkpoint, result, an error, a log's head
# or tail) a page shows at most; the rest is a "download raw" link away. The job page
# reads no more than this from the database either.
SHOWN_CHARS = 64 * 1024
# Attempts (history rows, captured logs) a job's page shows at most: the newest.
ATTEMPTS_SHOWN = 100
LOGS_SHOWN = 20
# A raw download streams parts of this many characters (each its own statement) and
# stops after RAW_MAX_CHARS, saying so.
RAW_PART_CHARS = 4 << 20
RAW_MAX_CHARS = 64 << 20
# The user recorded for actions when the operator allowed no login (allow_anonymous).
ANONYMOUS = "(no login)"
# Password checks (scrypt: ~50 ms of CPU, 16 MiB) running at once at most; a login
# beyond that is answered 429 at once rather than holding a server thread in a queue.
# Logins that bring a device token for their name have checks of their own, so guessing
# without one cannot take them all.
VERIFY_AT_ONCE = 2
VERIFY_AT_ONCE_DEVICES = 2
# The cookie holding a browser's device token (auth.Devices); its lifetime (a restart
# forgets every token anyway).
DEVICE_COOKIE = "pgworkerd_device"
DEVICE_COOKIE_MAX_AGE = 90 * 24 * 3600
# Headers a reverse proxy adds: a dashboard without a login refuses such requests (a
# proxy on the same host would otherwise publish it while it sees a loopback client).
PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-IP", "Via")

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


@dataclass(frozen=True)
class Settings:
    """What the application needs besides the pool (server.py builds it from the config)."""

    schema: str
    users: dict[str, str] = field(default_factory=dict)  # name -> password hash
    read_only: bool = False
    secure_cookie: bool = False
    # Host names the Host header may carry (None: any). A loopback-bound dashboard accepts
    # only loopback names, so a web page that rebinds its own DNS name to 127.0.0.1 cannot
    # read it (DNS rebinding).
    allowed_hosts: frozenset[str] | None = None
    dsn: str = ""  # only to mask its password in error messages
    action_dsn: str = ""  # the same, for [web] action_dsn
    idle_timeout: float = 30 * 60.0  # a session unused this long is over


# -- actions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    title: str  # "Cancel job", shown on the confirmation page and its button
    kind: str  # what the target is: job, daemon, queue or handler
    run: Callable[[psycopg.Connection[Any], str, str, str], str]  # conn, schema, target, who
    warning: str = ""


def _cancel(conn: psycopg.Connection[Any], schema: str, target: str, who: str) -> str:
    outcome = admin.cancel(conn, [int(target)], schema=schema)
    return outcome.get(int(target), "not found")


def _retry(conn: psycopg.Connection[Any], schema: str, target: str, who: str) -> str:
    ids = admin.retry(conn, ids=[int(target)], schema=schema)
    return "back to pending" if ids else "not retried (not dead or cancelled, or a duplicate)"


def _drain(drain: bool) -> Callable[[psycopg.Connection[Any], str, str, str], str]:
    def run(conn: psycopg.Connection[Any], schema: str, target: str, who: str) -> str:
        affected = fleet.request_drain(conn, schema, drain=drain, worker_id=target)
        if not affected:
            return "no live daemon has this id"
        return "drain requested" if drain else "resumed"

    return run


def _pause(kind: str, pause: bool) -> Callable[[psycopg.Connection[Any], str, str, str], str]:
    def run(conn: psycopg.Connection[Any], schema: str, target: str, who: str) -> str:
        comment = f"from the web dashboard by {who}" if pause else None
        changed = fleet.set_paused(conn, schema, kind, target, pause=pause, comment=comment)
        if pause:
            return "paused" if changed else "was already paused"
        return "resumed" if changed else "was not paused"

    return run


ACTIONS: dict[str, Action] = {
    "cancel": Action(
        "Cancel job", "job", _cancel, "A running job is asked to stop; a pending one never runs."
    ),
    "retry": Action("Retry job", "job", _retry, "The job runs again with fresh attempts."),
    "drain": Action(
        "Drain daemon", "daemon", _drain(True), "It finishes its jobs and claims no new ones."
    ),
    "resume": Action("Resume daemon", "daemon", _drain(False)),
    "pause-queue": Action(
        "Pause queue", "queue", _pause("queue", True), "No daemon claims its jobs until resumed."
    ),
    "resume-queue": Action("Resume queue", "queue", _pause("queue", False)),
    "pause-handler": Action(
        "Pause handler",
        "handler",
        _pause("handler", True),
        "No daemon claims its jobs until resumed.",
    ),
    "resume-handler": Action("Resume handler", "handler", _pause("handler", False)),
}


def _target_problem(kind: str, target: str) -> str | None:
    if kind == "job":
        return None if target.isascii() and target.isdigit() and len(target) < 19 else "bad id"
    if kind == "daemon":
        return None if 0 < len(target) <= 300 and target.isprintable() else "bad daemon id"
    return name_problem(kind, target)


# -- rendering helpers --------------------------------------------------------------------


def _bounded(text: str) -> str:
    """At most SHOWN_CHARS of a text (every value a page renders goes through this)."""
    if len(text) <= SHOWN_CHARS:
        return text
    return f"{text[:SHOWN_CHARS]}… [{len(text) - SHOWN_CHARS} more characters not shown]"


def _text(value: Any) -> str:
    """A value as one inert line (autoescaping then makes it inert HTML)."""
    return "" if value is None else printable(_bounded(str(value)))


def _pretty(value: Any) -> str:
    """JSON from a row, indented; line breaks kept, other control characters escaped."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)
    return printable(_bounded(text), keep="\n")


def _multiline(value: Any) -> str:
    return "" if value is None else printable(_bounded(str(value)), keep="\n\t")


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    return _text(value)  # a timestamp Python cannot hold comes as the server's text


def _age(seconds: Any) -> str:
    return "-" if seconds is None else format_duration(float(seconds), rounded=True)


def _size(value: Any) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(value)


def _hostname(host: str) -> str:
    """The Host header without its port ("[::1]" keeps its brackets), lower case."""
    if host.startswith("["):
        return host[: host.find("]") + 1].lower()
    return host.rsplit(":", 1)[0].lower()


# -- the application ----------------------------------------------------------------------


def create_app(
    settings: Settings, pool: ConnectionPool, action_pool: ConnectionPool | None = None
) -> Flask:
    """The application: pages read through `pool`; actions run through `action_pool`
    ([web] action_dsn, the operator's role) when given, else through `pool`."""
    app = Flask(__name__)
    # A new key at each start: a restart logs everyone out, and no key sits in a file.
    app.secret_key = secrets.token_bytes(32)
    app.config.update(
        SESSION_COOKIE_NAME="pgworkerd_web",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_SECURE=settings.secure_cookie,
        MAX_CONTENT_LENGTH=64 * 1024,  # forms are small
        TEMPLATES_AUTO_RELOAD=False,
    )
    app.jinja_env.autoescape = True  # every template, whatever its name
    app.jinja_env.filters.update(
        t=_text, pretty=_pretty, multiline=_multiline, when=_when, age=_age, size=_size
    )
    login_needed = bool(settings.users)
    throttle = LoginThrottle()
    devices = Devices()
    sessions = Sessions(settings.idle_timeout)
    verifying = threading.BoundedSemaphore(VERIFY_AT_ONCE)
    verifying_devices = threading.BoundedSemaphore(VERIFY_AT_ONCE_DEVICES)
    # What an unknown user name is checked against, so that it costs what a known one
    # does (no timing tells which names exist): a configured hash, whose answer is then
    # ignored (the name is unknown, so the login fails whatever the password).
    stand_in = next(iter(settings.users.values()), "")

    @contextmanager
    def database() -> Iterator[psycopg.Connection[Any]]:
        with pool.connection() as conn:
            yield conn

    def user() -> str | None:
        if not login_needed:
            return ANONYMOUS
        name = sessions.user(session.get("sid"))
        return name if name in settings.users else None

    def csrf_token() -> str:
        if "csrf" not in session:
            session["csrf"] = secrets.token_urlsafe(32)
        return str(session["csrf"])

    app.jinja_env.globals.update(
        csrf_token=csrf_token,
        shown_chars=SHOWN_CHARS,
        statuses=STATUSES,
        read_only=settings.read_only,
        login_needed=login_needed,
        current_user=user,
    )

    @app.before_request
    def guard() -> Response | None:
        allowed = settings.allowed_hosts
        if allowed is not None and _hostname(request.host) not in allowed:
            abort(421, "this dashboard answers to its loopback address only")
        if not login_needed and any(h in request.headers for h in PROXY_HEADERS):
            log.warning(
                "web: refused a request forwarded by a proxy at %s: this dashboard has no "
                "login ([web] allow_anonymous) and must not be published",
                request.remote_addr,
            )
            abort(403, "this dashboard has no login: it does not answer through a proxy")
        if request.method == "POST":
            sent = request.form.get("csrf", "")
            wanted = session.get("csrf", "")
            if not wanted or not hmac.compare_digest(str(sent), str(wanted)):
                log.warning(
                    "web: refused a POST to %s from %s: missing or wrong CSRF token",
                    request.path,
                    request.remote_addr,
                )
                abort(403, "missing or wrong CSRF token (reload the page and try again)")
        if request.endpoint in ("login", "static") or user() is not None:
            return None
        if request.headers.get("X-Live") or request.method != "GET":
            abort(401)
        return redirect(url_for("login", next=request.full_path))

    @app.after_request
    def headers(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["Referrer-Policy"] = "no-referrer"
        if request.endpoint != "static":
            response.headers["Cache-Control"] = "no-store"
        return response

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> tuple[str, int]:
        return render_template(
            "error.html", code=exc.code, message=exc.description
        ), exc.code or 500

    @app.errorhandler(psycopg.errors.QueryCanceled)
    def too_slow(exc: Exception) -> tuple[str, int]:
        message = "the database took longer than [web] statement_timeout for this page"
        return render_template("error.html", code=503, message=message), 503

    @app.errorhandler(PoolTimeout)
    def busy(exc: Exception) -> tuple[str, int]:
        message = "no free database connection (the database is down, or every one is busy)"
        return render_template("error.html", code=503, message=message), 503

    @app.errorhandler(psycopg.Error)
    def db_error(exc: Exception) -> tuple[str, int]:
        message = "database error: " + scrub(
            scrub(str(exc).strip(), settings.dsn), settings.action_dsn or None
        )
        log.warning("web: %s on %s", message, request.path)
        return render_template("error.html", code=503, message=message), 503

    # -- login --------------------------------------------------------------------------

    def safe_next(target: str | None) -> str:
        """A path of this site to go to after the login, else the overview. Checked as
        a browser would read it: no scheme or host (an open redirect), nothing a URL
        parser drops or a header cannot hold (tab, CR, LF: `/\t/evil` is `//evil`)."""
        fallback = url_for("overview")
        if not target or len(target) > 2000 or not target.isprintable() or " " in target:
            return fallback
        if "\\" in target or not target.startswith("/") or target.startswith("//"):
            return fallback
        parts = urlsplit(target)
        if parts.scheme or parts.netloc or not parts.path.startswith("/"):
            return fallback
        normal = urlunsplit(("", "", parts.path, parts.query, ""))
        return normal if not normal.startswith("//") else fallback

    @app.route("/login", methods=["GET", "POST"])
    def login() -> Any:
        if not login_needed:
            return redirect(url_for("overview"))
        if request.method == "GET":
            return render_template("login.html", error="")
        name = request.form.get("user", "")[:200]
        password = request.form.get("password", "")
        address = request.remote_addr
        device = request.cookies.get(DEVICE_COOKIE)
        # a browser that logged in as this name before spends its own budget only, so
        # someone guessing this name's password cannot lock its user out (auth.py)
        known_device = devices.trusted(device, name)
        if not known_device:
            wait = throttle.retry_after(name, address)
            if wait > 0:
                return too_many(f"too many failed logins: try again in {wait:.0f} s", wait)
        checks = verifying_devices if known_device else verifying
        if not checks.acquire(blocking=False):
            return too_many("too many logins at once: try again in a moment", 1)
        try:
            # an unknown name costs a check too: the answer takes as long either way
            matches = verify(password, settings.users.get(name, stand_in))
            ok = matches and name in settings.users
        finally:
            checks.release()
        if ok:
            throttle.succeeded(name, address)
            sessions.end(session.get("sid"))
            session.clear()
            session.update(sid=sessions.start(name), csrf=secrets.token_urlsafe(32))
            log.info("web: %s logged in from %s", name, address)
            response = redirect(safe_next(request.args.get("next")))
            response.set_cookie(
                DEVICE_COOKIE,
                devices.issue(device, name),
                max_age=DEVICE_COOKIE_MAX_AGE,
                path=url_for("login"),
                secure=settings.secure_cookie,
                httponly=True,
                samesite="Strict",
            )
            return response
        if known_device:
            devices.failed(device)
        else:
            throttle.failed(name, address)
        log.warning("web: failed login as %r from %s", name[:100], address)
        return render_template("login.html", error="wrong user name or password"), 401

    def too_many(message: str, wait: float) -> Response:
        response = app.make_response((render_template("login.html", error=message), 429))
        response.headers["Retry-After"] = str(max(1, round(wait)))
        return response

    @app.post("/logout")
    def logout() -> Any:
        sessions.end(session.get("sid"))  # a kept copy of the cookie is worth nothing now
        session.clear()
        return redirect(url_for("login"))

    # -- pages --------------------------------------------------------------------------

    def overview_data() -> dict[str, Any]:
        with database() as conn:
            snap = views.overview(conn, settings.schema)
        hour = snap["throughput"]
        peak = max((m["completed"] + m["failed_total"] for m in hour), default=0)
        totals = {
            "completed": sum(m["completed"] for m in hour),
            "failed": sum(m["failed_total"] for m in hour),
        }
        return {"snap": snap, "peak": max(peak, 1), "totals": totals}

    @app.get("/")
    def overview() -> str:
        return render_template("overview.html", **overview_data())

    @app.get("/live/overview")
    def overview_live() -> str:
        return render_template("overview_live.html", **overview_data())

    def job_data(job_id: int) -> dict[str, Any]:
        with database() as conn:
            # the row and history `pgworkerd show` reads, each value bounded (a 30 MB
            # payload is read as its first SHOWN_CHARS characters and its length)
            job = views.job_shown(conn, settings.schema, job_id, shown=SHOWN_CHARS)
            if job is None:
                abort(404, f"no job {job_id}")
            history = views.attempts_shown(
                conn, settings.schema, job_id, shown=SHOWN_CHARS, limit=ATTEMPTS_SHOWN
            )
            why = explain.explain(conn, settings.schema, job_id)
        total = history[0]["total"] if history else 0
        return {"job": job, "attempts": history or [], "attempts_total": total, "explain": why}

    @app.get("/jobs/<int:job_id>")
    def job(job_id: int) -> str:
        data = job_data(job_id)
        with database() as conn:
            # None: a role without the job_logs grant: the rest still shows
            rows = views.logs_shown(
                conn, settings.schema, job_id, shown=SHOWN_CHARS, limit=LOGS_SHOWN
            )
        logs = None
        if rows is not None:
            for row in rows:
                row["truncated"] = row["omitted_bytes"] > 0
                row["cut"] = max(row["head_chars"], row["tail_chars"]) > SHOWN_CHARS
            logs = {"logs": rows, "total": rows[0]["total"] if rows else 0}
        return render_template("job.html", logs=logs, **data)

    def raw_response(parts: Iterator[str], name: str) -> Response:
        response = Response(parts, mimetype="text/plain")
        response.headers["Content-Disposition"] = f'attachment; filename="{name}"'
        return response

    def streamed(read: Callable[[int], tuple[str, int] | None]) -> Iterator[str]:
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

    @app.get("/jobs/<int:job_id>/raw/<field>")
    def job_raw(job_id: int, field: str) -> Response:
        if field not in views.JOB_VALUES:
            abort(404, "no such value")

        def read(start: int) -> tuple[str, int] | None:
            with database() as conn:
                return views.job_value_part(
                    conn, settings.schema, job_id, field, start, RAW_PART_CHARS
                )

        first = read(0)
        if first is None:
            abort(404, f"job {job_id} has no {field}")
        return raw_response(streamed(read), f"job-{job_id}-{field}.txt")

    @app.get("/jobs/<int:job_id>/logs/<int:token>")
    def job_log_raw(job_id: int, token: int) -> Response:
        def reader(part: str) -> Callable[[int], tuple[str, int] | None]:
            def read(start: int) -> tuple[str, int] | None:
                with database() as conn:
                    found = views.job_log_part(
                        conn, settings.schema, job_id, token, part, start, RAW_PART_CHARS
                    )
                return None if found is None else found[:2]

            return read

        with database() as conn:
            first = views.job_log_part(conn, settings.schema, job_id, token, "head", 0, 0)
        if first is None:
            abort(404, f"job {job_id} has no output of that attempt")
        omitted = first[2]

        def both() -> Iterator[str]:
            # as joblogs.text_of (and `pgworkerd logs`) writes it
            last = ""
            for part in streamed(reader("head")):
                last = part
                yield part
            if omitted:
                newline = "" if not last or last.endswith("\n") else "\n"
                yield f"{newline}{joblogs.omitted_marker(omitted)}\n"
            yield from streamed(reader("tail"))

        return raw_response(both(), f"job-{job_id}-attempt-{token}.log")

    @app.get("/live/jobs/<int:job_id>")
    def job_live(job_id: int) -> str:
        return render_template("job_live.html", **job_data(job_id))

    @app.get("/jobs")
    def jobs() -> str:
        filters = {k: request.args.get(k, "") for k in ("status", "queue", "handler", "text")}
        if filters["status"] and filters["status"] not in STATUSES:
            abort(400, "unknown status")
        if len(filters["text"]) > 200:
            abort(400, "the search text is longer than 200 characters")
        before, after = _page_id("before"), _page_id("after")
        error = ""
        try:
            with database() as conn:
                page = views.jobs_page(
                    conn,
                    settings.schema,
                    statuses=[filters["status"]] if filters["status"] else None,
                    queue=filters["queue"] or None,
                    handler=filters["handler"] or None,
                    text=filters["text"] or None,
                    before=before,
                    after=after,
                    limit=PAGE_SIZE,
                )
        except views.TextSearchTimeout as exc:
            page, error = {"jobs": [], "older": None, "newer": None}, str(exc)
        except ValueError as exc:
            abort(400, str(exc))
        shown = {k: v for k, v in filters.items() if v}
        return render_template(
            "jobs.html", page=page, rows=page["jobs"], filters=filters, shown=shown, error=error
        )

    def _page_id(name: str) -> int | None:
        value = request.args.get(name, "")
        if not value:
            return None
        if not (value.isascii() and value.isdigit() and len(value) < 19):
            abort(400, f"{name} must be a job id")
        return int(value)

    @app.get("/schedules")
    def schedules_page() -> str:
        with database() as conn:
            rows = views.schedules(conn, settings.schema)
        return render_template("schedules.html", rows=rows)

    @app.get("/paused")
    def paused_page() -> str:
        with database() as conn:
            rows = views.paused(conn, settings.schema)
        return render_template("paused.html", rows=rows)

    @app.get("/limits")
    def limits_page() -> str:
        with database() as conn:
            rows = views.limits(conn, settings.schema)
        return render_template("limits.html", rows=rows)

    # -- actions ------------------------------------------------------------------------

    def checked_action(name: str) -> tuple[Action, str]:
        action = ACTIONS.get(name)
        if action is None:
            abort(404, "no such action")
        if settings.read_only:
            abort(403, "this dashboard is read-only ([web] read_only)")
        source = request.form if request.method == "POST" else request.args
        target = source.get("target", "")
        problem = _target_problem(action.kind, target)
        if problem:
            abort(400, problem)
        return action, target

    @app.get("/confirm/<name>")
    def confirm(name: str) -> str:
        action, target = checked_action(name)
        return render_template("confirm.html", name=name, action=action, target=target)

    @app.post("/act/<name>")
    def act(name: str) -> Any:
        action, target = checked_action(name)
        who = user() or "?"
        with (action_pool or pool).connection() as conn:
            outcome = action.run(conn, settings.schema, target, who)
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
            return redirect(url_for("job", job_id=int(target)))
        if action.kind == "daemon":
            return redirect(url_for("overview"))
        return redirect(url_for("paused_page"))

    return app
