"""The dashboard's defences: login, CSRF tokens, the Host check, read-only mode, headers
and cookie flags (a plain HTTP client), hostile database values rendered as inert text
(in Chromium: no script runs, the text shows as written), and binding rules."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from daemon_harness import Db
from dashboard_harness import (
    PASSWORD,
    PASSWORD_HASH,
    USER,
    Http,
    RunningDashboard,
    log_in,
    screenshot,
    text_of,
    wait_browser,
)

from pgworkerd.config import ConfigError, WebConfig, parse_config
from pgworkerd.web.server import BindRefused, build, check_bind


def test_without_a_login_every_page_is_refused(dashboard: RunningDashboard, db: Db) -> None:
    job = db.enqueue("work", {"secret": "payload"})
    client = Http(dashboard.port)
    for path in ("/", "/jobs", f"/jobs/{job}", "/schedules", "/limits", "/paused"):
        reply = client.get(path)
        assert reply.status == 302 and "/login" in reply.headers["Location"], path
        assert "payload" not in reply.body
    assert client.get(f"/live/jobs/{job}", headers={"X-Live": "1"}).status == 401
    # a wrong password logs nobody in
    assert client.log_in(password="wrong password").status == 401
    assert client.get("/").status == 302
    # the right one does
    assert client.log_in().status == 302
    assert client.get("/").status == 200


def test_an_action_without_the_csrf_token_is_refused(dashboard: RunningDashboard, db: Db) -> None:
    job = db.enqueue("work", {})
    client = Http(dashboard.port)
    client.log_in()
    page = client.get(f"/confirm/cancel?target={job}")
    assert page.status == 200
    assert client.post("/act/cancel", {"target": str(job)}).status == 403
    assert client.post("/act/cancel", {"target": str(job), "csrf": "forged"}).status == 403
    assert db.job(job)["status"] == "pending"
    # another session's token is no good either
    other = Http(dashboard.port)
    other.log_in()
    stolen = other.get(f"/confirm/cancel?target={job}").csrf()
    assert client.post("/act/cancel", {"target": str(job), "csrf": stolen}).status == 403
    assert db.job(job)["status"] == "pending"
    # with its own token the same request works (so the refusals above are the token's)
    assert client.post("/act/cancel", {"target": str(job), "csrf": page.csrf()}).status == 302
    assert db.job(job)["status"] == "cancelled"


def test_a_login_without_the_csrf_token_is_refused(dashboard: RunningDashboard) -> None:
    client = Http(dashboard.port)
    reply = client.post("/login", {"user": USER, "password": PASSWORD})
    assert reply.status == 403
    assert client.get("/").status == 302


def test_read_only_mode_offers_and_accepts_no_action(
    roles: dict[str, str], schema: str, db: Db
) -> None:
    job = db.enqueue("work", {})
    # (read_only refuses a role that could write: the reader's, as roles.sql says)
    dashboard = RunningDashboard(
        build(
            WebConfig(port=0, users={USER: PASSWORD_HASH}, read_only=True),
            roles[f"{schema}_reader"],
            schema,
        )
    )
    try:
        _read_only_refuses_actions(Http(dashboard.port), job, db)
    finally:
        dashboard.close()


def _read_only_refuses_actions(client: Http, job: int, db: Db) -> None:
    client.log_in()
    page = client.get(f"/jobs/{job}")
    assert page.status == 200 and "/confirm/" not in page.body
    assert client.get(f"/confirm/cancel?target={job}").status == 403
    assert client.post("/act/cancel", {"target": str(job), "csrf": page.csrf()}).status == 403
    assert db.job(job)["status"] == "pending"


def test_headers_and_cookie_flags(dashboard: RunningDashboard) -> None:
    client = Http(dashboard.port)
    reply = client.get("/login")
    csp = reply.headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert reply.headers["X-Content-Type-Options"] == "nosniff"
    cookie = reply.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie


def test_a_foreign_host_name_is_refused(dashboard: RunningDashboard) -> None:
    # DNS rebinding: a page of evil.example whose name now points at 127.0.0.1
    client = Http(dashboard.port, host="evil.example")
    assert client.get("/login").status == 421
    assert Http(dashboard.port, host="localhost").get("/login").status == 200


def test_no_open_redirect_after_login(dashboard: RunningDashboard) -> None:
    for target in ("//evil.example/", "https://evil.example/", "/\\evil.example"):
        client = Http(dashboard.port)
        token = client.get("/login").csrf()
        reply = client.post(
            f"/login?{urllib.parse.urlencode({'next': target})}",
            {"csrf": token, "user": USER, "password": PASSWORD},
        )
        assert reply.status == 302 and reply.headers["Location"] == "/", target


def test_a_non_loopback_bind_needs_users() -> None:
    with pytest.raises(BindRefused, match="without a login"):
        check_bind(WebConfig(bind="0.0.0.0"))
    with pytest.raises(BindRefused, match="without a login: add"):
        check_bind(WebConfig(bind="0.0.0.0", allow_anonymous=True))
    check_bind(WebConfig(bind="0.0.0.0", users={USER: "x"}))
    # no users on loopback: only when the operator said so
    with pytest.raises(BindRefused, match="refusing to serve without a login"):
        check_bind(WebConfig(bind="::1"))
    check_bind(WebConfig(bind="::1", allow_anonymous=True))
    with pytest.raises(ConfigError, match=r"web\.bind: '0\.0\.0\.0' is not a loopback"):
        parse_config('[web]\nbind = "0.0.0.0"\n', "c.toml")


# Values an enqueuer or a handler chose: markup, attribute breakers, script URLs, control
# and bidirectional-override characters. Written straight into the rows (enqueue refuses
# control characters in names; a direct INSERT does not).
HOSTILE = [
    "<script>window.pwned = 1</script>",
    '"><img src=x onerror="window.pwned = 2">',
    "'><svg onload=window.pwned=3>",
    "javascript:window.pwned=4",
    "</pre></td></table><script>window.pwned=5</script>",
    "{{ 7 * 7 }}\u202eevil\x1b[31m",
]


def _insert_hostile(db: Db) -> list[int]:
    ids = []
    for n, value in enumerate(HOSTILE):
        [row] = db.rows(
            "INSERT INTO {schema}.jobs (queue, handler, payload, status, attempts, last_error,"
            " progress, finished_at) VALUES (%(v)s, %(v)s, %(p)s, 'dead', 1, %(v)s, %(p)s, now())"
            " RETURNING id",
            {"v": value, "p": psycopg.types.json.Jsonb({"value": value, "n": n})},
        )
        ids.append(row["id"])
    db.rows(
        "INSERT INTO {schema}.paused (kind, name, comment) VALUES ('queue', %s, %s)",
        (HOSTILE[0], HOSTILE[1]),
    )
    return ids


def _no_script_ran(browser: Any) -> None:
    from selenium.common.exceptions import NoAlertPresentException

    assert browser.execute_script("return window.pwned") is None
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert.text  # noqa: B018


def test_hostile_names_and_payloads_render_as_text(
    browser: Any, dashboard: RunningDashboard, db: Db
) -> None:
    ids = _insert_hostile(db)
    log_in(browser, dashboard)
    _no_script_ran(browser)
    page = text_of(browser, "queues")
    assert HOSTILE[0] in page and HOSTILE[1] in page
    screenshot(browser, "hostile-overview")
    for path in ("/jobs", "/jobs?status=dead", "/paused", "/confirm/pause-queue?target=x"):
        browser.get(dashboard.url + path)
        _no_script_ran(browser)
    browser.get(dashboard.url + "/jobs")
    listed = text_of(browser, "jobs")
    assert all(value.split("\u202e")[0] in listed for value in HOSTILE)
    assert "\\u202e" in listed and "\\x1b" in listed  # invisible characters made visible
    browser.get(dashboard.url + "/paused")
    assert HOSTILE[0] in text_of(browser, "paused")
    screenshot(browser, "hostile-paused")
    for job_id, value in zip(ids, HOSTILE, strict=True):
        browser.get(f"{dashboard.url}/jobs/{job_id}")
        shown = text_of(browser, "job-handler")
        assert shown == value.replace("\u202e", "\\u202e").replace("\x1b", "\\x1b")
        as_json = json.dumps(value.split("\u202e")[0], ensure_ascii=False)[1:-1]
        assert as_json in text_of(browser, "payload")
        # after a refresh of the live part too
        wait_browser(
            browser,
            lambda d: d.execute_script(
                "return document.getElementById('job-live').dataset.refreshes"
            ),
            "a live refresh",
        )
        _no_script_ran(browser)
    screenshot(browser, "hostile-job")


def test_hostile_filters_are_values(dashboard: RunningDashboard, db: Db) -> None:
    # filters go to the database as bound values: quotes and wildcards find nothing
    db.enqueue("work", {})
    client = Http(dashboard.port)
    client.log_in()
    for value in ("' OR 1=1 --", "%", "_", "\\", "\u202e", "<script>"):
        query = urllib.parse.urlencode({"handler": value})
        reply = client.get(f"/jobs?{query}")
        assert reply.status == 200 and "no job matches" in reply.body, value
        assert "<script>" not in reply.body.split("<main>")[1]
    # a NUL no text column can hold: refused as a bad request, not a database error
    for name in ("queue", "handler", "text"):
        reply = client.get("/jobs?" + urllib.parse.urlencode({name: "a\x00b"}))
        assert reply.status == 400 and "NUL" in reply.body, (name, reply.status)


def test_values_python_cannot_hold_still_render(dashboard: RunningDashboard, db: Db) -> None:
    payload = '{"n": 1e400, "big": 1' + "0" * 5000 + "}"
    [row] = db.rows(
        "INSERT INTO {schema}.jobs (queue, handler, payload, run_at, progress)"
        " VALUES ('default', 'work', %s::jsonb, 'infinity', %s::jsonb) RETURNING id",
        (payload, "[[[[[[[[[[1]]]]]]]]]]"),
    )
    client = Http(dashboard.port)
    client.log_in()
    page = client.get(f"/jobs/{row['id']}")
    assert page.status == 200
    assert "1" + "0" * 5000 in page.body and "infinity" in page.body
    assert client.get("/jobs").status == 200
    assert client.get("/").status == 200


def test_a_slow_page_is_cut_off_by_the_statement_timeout(
    start_dashboard: Callable[..., RunningDashboard], db: Db, test_db_dsn: str
) -> None:
    running = start_dashboard(statement_timeout=0.5)
    client = Http(running.port)
    client.log_in()
    with psycopg.connect(test_db_dsn) as blocker:
        # a long migration or a stuck transaction holding the table
        blocker.execute(
            psycopg.sql.SQL("LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE").format(
                psycopg.sql.Identifier(db.schema)
            )
        )
        reply = client.get("/jobs")
        blocker.rollback()
    assert reply.status == 503
    assert "statement_timeout" in reply.body
    assert client.get("/jobs").status == 200  # and the connection is usable again
