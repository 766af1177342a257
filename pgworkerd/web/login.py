"""Who may see and do what: the login and logout pages, the guard every request passes
(Host check, no proxy without a login, CSRF on every POST, a login before any page) and
the security headers of every answer.

Failed logins are throttled (auth.LoginThrottle) and answered at once, never by a sleep
in a server thread; sessions live on the server (auth.Sessions)."""

from __future__ import annotations

import hmac
import logging
import secrets
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from flask import (
    Blueprint,
    abort,
    current_app,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from werkzeug.wrappers import Response

from pgworkerd.web.context import context
from pgworkerd.web.passwords import verify

log = logging.getLogger("pgworkerd.web")

# The user recorded for actions when the operator allowed no login (allow_anonymous).
ANONYMOUS = "(no login)"
# Headers a reverse proxy adds: a dashboard without a login refuses such requests (a
# proxy on the same host would otherwise publish it while it sees a loopback client).
PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-IP", "Via")
# The cookie holding a browser's device token (auth.Devices); its lifetime (a restart
# forgets every token anyway).
DEVICE_COOKIE = "pgworkerd_device"
DEVICE_COOKIE_MAX_AGE = 90 * 24 * 3600
# Endpoints served without a login.
OPEN_ENDPOINTS = ("login.login", "static")

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)

login = Blueprint("login", __name__)


@login.app_template_global("current_user")
def current_user() -> str | None:
    """The logged-in user of this request (ANONYMOUS without [web.users]), else None."""
    ctx = context()
    if not ctx.login_needed:
        return ANONYMOUS
    name = ctx.sessions.user(session.get("sid"))
    return name if name in ctx.settings.users else None


@login.app_template_global("csrf_token")
def csrf_token() -> str:
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(32)
    return str(session["csrf"])


def _hostname(host: str) -> str:
    """The Host header without its port ("[::1]" keeps its brackets), lower case."""
    if host.startswith("["):
        return host[: host.find("]") + 1].lower()
    return host.rsplit(":", 1)[0].lower()


@login.before_app_request
def guard() -> Response | None:
    ctx = context()
    allowed = ctx.settings.allowed_hosts
    if allowed is not None and _hostname(request.host) not in allowed:
        abort(421, "this dashboard answers to its loopback address only")
    if not ctx.login_needed and any(h in request.headers for h in PROXY_HEADERS):
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
    if request.endpoint in OPEN_ENDPOINTS or current_user() is not None:
        return None
    if request.headers.get("X-Live") or request.method != "GET":
        abort(401)
    return redirect(url_for("login.login", next=request.full_path))


@login.after_app_request
def headers(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"
    if request.endpoint != "static":
        response.headers["Cache-Control"] = "no-store"
    return response


def safe_next(target: str | None) -> str:
    """A path of this site to go to after the login, else the overview. Checked as
    a browser would read it: no scheme or host (an open redirect), nothing a URL
    parser drops or a header cannot hold (tab, CR, LF: `/\t/evil` is `//evil`)."""
    fallback = url_for("pages.overview")
    if not target or len(target) > 2000 or not target.isprintable() or " " in target:
        return fallback
    if "\\" in target or not target.startswith("/") or target.startswith("//"):
        return fallback
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not parts.path.startswith("/"):
        return fallback
    normal = urlunsplit(("", "", parts.path, parts.query, ""))
    return normal if not normal.startswith("//") else fallback


@login.route("/login", methods=["GET", "POST"], endpoint="login")
def login_page() -> Any:
    ctx = context()
    if not ctx.login_needed:
        return redirect(url_for("pages.overview"))
    if request.method == "GET":
        return render_template("login.html", error="")
    name = request.form.get("user", "")[:200]
    password = request.form.get("password", "")
    address = request.remote_addr
    device = request.cookies.get(DEVICE_COOKIE)
    # a browser that logged in as this name before spends its own budget only, so
    # someone guessing this name's password cannot lock its user out (auth.py)
    known_device = ctx.devices.trusted(device, name)
    if not known_device:
        wait = ctx.throttle.begin(name, address)
        if wait > 0:
            return _too_many(f"too many failed logins: try again in {wait:.0f} s", wait)
    checks = ctx.verifying_devices if known_device else ctx.verifying
    if not checks.acquire(blocking=False):
        if not known_device:
            ctx.throttle.give_back(name, address)
        return _too_many("too many logins at once: try again in a moment", 1)
    try:
        # an unknown name costs a check too: the answer takes as long either way
        matches = verify(password, ctx.settings.users.get(name, ctx.stand_in))
        ok = matches and name in ctx.settings.users
    finally:
        checks.release()
    if ok:
        if not known_device:
            ctx.throttle.give_back(name, address)  # only failures count
        ctx.throttle.succeeded(name, address)
        ctx.sessions.end(session.get("sid"))
        session.clear()
        session.update(sid=ctx.sessions.start(name), csrf=secrets.token_urlsafe(32))
        log.info("web: %s logged in from %s", name, address)
        response = redirect(safe_next(request.args.get("next")))
        response.set_cookie(
            DEVICE_COOKIE,
            ctx.devices.issue(device, name),
            max_age=DEVICE_COOKIE_MAX_AGE,
            path=url_for("login.login"),
            secure=ctx.settings.secure_cookie,
            httponly=True,
            samesite="Strict",
        )
        return response
    if known_device:
        ctx.devices.failed(device)
    else:
        ctx.throttle.failed(name, address)
    log.warning("web: failed login as %r from %s", name[:100], address)
    return render_template("login.html", error="wrong user name or password"), 401


def _too_many(message: str, wait: float) -> Response:
    response = current_app.make_response((render_template("login.html", error=message), 429))
    response.headers["Retry-After"] = str(max(1, round(wait)))
    return response


@login.post("/logout")
def logout() -> Any:
    context().sessions.end(session.get("sid"))  # a kept copy of the cookie is worth nothing now
    session.clear()
    return redirect(url_for("login.login"))
