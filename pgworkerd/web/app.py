"""The dashboard as a Flask application, put together from its parts by role:

- login (login.py): the login and logout pages, the guard every request passes (Host,
  proxy, CSRF, login) and the security headers;
- pages (pages.py): everything that reads;
- actions (actions.py): the confirmation pages and the POSTs that change something;
- bulk (bulk.py): the same for a selection of jobs (at most admin.BULK_MAX);
- filters (filters.py): how a value is rendered (inert and bounded);

sharing one Context (context.py): settings, pools, login state. Here: the Flask settings,
the template globals and the error pages. The Content-Security-Policy (login.CSP) allows
scripts and styles from this server's /static only.
"""

from __future__ import annotations

import logging
import secrets

import psycopg
from flask import Flask, render_template, request
from psycopg_pool import ConnectionPool, PoolTimeout
from werkzeug.exceptions import HTTPException

from pgworkerd.model import STATUSES
from pgworkerd.queue.admin import BULK_MAX
from pgworkerd.queue.db import scrub
from pgworkerd.web.actions import actions
from pgworkerd.web.bulk import bulk
from pgworkerd.web.context import EXTENSION, Context, Settings
from pgworkerd.web.filters import SHOWN_CHARS, filters
from pgworkerd.web.login import login
from pgworkerd.web.pages import pages

log = logging.getLogger("pgworkerd.web")


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
    app.extensions[EXTENSION] = Context(settings, pool, action_pool)
    app.jinja_env.globals.update(
        shown_chars=SHOWN_CHARS,
        statuses=STATUSES,
        read_only=settings.read_only,
        login_needed=bool(settings.users),
        bulk_max=BULK_MAX,
    )
    for part in (login, filters, pages, actions, bulk):
        app.register_blueprint(part)
    _error_pages(app, settings)
    return app


def _error_pages(app: Flask, settings: Settings) -> None:
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
