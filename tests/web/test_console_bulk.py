"""Bulk actions on a selection of jobs (issue 27 item 3), in real headless Chromium against
a real daemon: tick jobs in the list, choose an action, confirm a page that names the
count; "retry all dead of this handler" as one bounded action. Every input is checked: a
selection over the cap, a million ids, a forged CSRF token, a bad priority, an unknown
action, a read-only dashboard; and job_priority_set refuses hostile arguments (22023)."""

from __future__ import annotations

import http.client
import urllib.parse
from typing import Any

import psycopg
import pytest
from daemon_harness import Daemons, Db, wait_for
from dashboard_harness import (
    BROWSER_DEADLINE,
    PASSWORD_HASH,
    USER,
    Http,
    Reply,
    RunningDashboard,
    by_id,
    log_in,
    screenshot,
    text_of,
    wait_browser,
)

from pgworkerd.config import WebConfig
from pgworkerd.queue import admin
from pgworkerd.web.server import build

HANDLERS = {"fail": {"target": "jobhandlers:fail"}, "work": {"target": "jobhandlers:work"}}


def _apply(browser: Any, ids: list[int], action: str, priority: str = "") -> str:
    """Tick `ids` in the current list, apply `action`, confirm; returns the flash."""
    from selenium.webdriver.support.ui import Select

    for job in ids:
        by_id(browser, f"select-{job}").click()
    Select(by_id(browser, "bulk-action")).select_by_value(action)
    if priority:
        by_id(browser, "bulk-priority").send_keys(priority)
    by_id(browser, "bulk-submit").click()
    wait_browser(browser, lambda d: text_of(d, "bulk-title"), "the confirmation")
    title = text_of(browser, "bulk-title")
    assert f"{len(ids)} job(s)" in title, title
    by_id(browser, "confirm").click()
    wait_browser(browser, lambda d: d.find_elements("css selector", ".flash"), "the outcome")
    return str(browser.find_element("css selector", ".flash").text)


def test_bulk_actions_on_a_selection_and_retry_all_dead_of_a_handler(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    later = [db.enqueue("work", {}, delay=3600) for _ in range(4)]
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/jobs?status=pending")
    wait_browser(browser, lambda d: text_of(d, "jobs"), "the list")
    flash = _apply(browser, later[:2], "priority", "7")
    assert "2 set to priority 7" in flash
    assert [db.job(j)["priority"] for j in later] == [7, 7, 0, 0]
    flash = _apply(browser, later[2:], "cancel")
    assert "2 cancelled" in flash
    assert {db.job(j)["status"] for j in later[2:]} == {"cancelled"}
    browser.get(f"{dashboard.url}/jobs?status=cancelled")
    wait_browser(browser, lambda d: text_of(d, "jobs"), "the list")
    flash = _apply(browser, later[2:3], "delete")
    assert "1 deleted" in flash
    assert db.rows("SELECT id FROM {schema}.jobs WHERE id = %s", (later[2],)) == []
    # run now: the daemon runs the two jobs due in an hour at once
    daemons.start(HANDLERS)
    browser.get(f"{dashboard.url}/jobs?status=pending")
    wait_browser(browser, lambda d: text_of(d, "jobs"), "the list")
    by_id(browser, "select-all").click()  # select.js ticks the page's jobs
    assert all(b.is_selected() for b in browser.find_elements("css selector", "input.select"))
    by_id(browser, "bulk-submit").click()  # retry (the first choice): nothing dead here
    wait_browser(browser, lambda d: text_of(d, "bulk-title"), "the confirmation")
    by_id(browser, "back").click()
    wait_browser(browser, lambda d: text_of(d, "jobs"), "the list again")
    flash = _apply(browser, later[:2], "run-now")
    assert "2 due now" in flash
    for job in later[:2]:
        db.wait_status(job, "completed")
    # retry all dead of a handler: one action, the confirmation names the count
    dead = [db.enqueue("fail", {}, max_attempts=1) for _ in range(3)]
    for job in dead:
        db.wait_status(job, "dead")
    browser.get(f"{dashboard.url}/jobs?status=dead&handler=fail")
    by_id(browser, "retry-dead").click()
    wait_browser(browser, lambda d: text_of(d, "bulk-title"), "the confirmation")
    assert text_of(browser, "bulk-title") == "Retry the 3 dead job(s) of handler fail?"
    screenshot(browser, "bulk-retry-dead")
    by_id(browser, "confirm").click()
    wait_browser(browser, lambda d: d.find_elements("css selector", ".flash"), "the outcome")
    assert (
        "3 of 3 dead job(s) back to pending" in browser.find_element("css selector", ".flash").text
    )
    wait_for(lambda: all(len(db.executions(j)) == 2 for j in dead), what="second runs")


def _confirm_form(client: Http, ids: list[str], **extra: str) -> dict[str, Any]:
    token = client.get("/jobs").csrf()
    return {"csrf": token, "action": "retry", "id": ids, **extra}


def _post(client: Http, path: str, form: dict[str, Any]) -> Reply:
    """A POST of a form whose `id` is a list (repeated fields), with the session."""
    body = urllib.parse.urlencode(form, doseq=True)
    conn = http.client.HTTPConnection("127.0.0.1", client.port, timeout=BROWSER_DEADLINE)
    try:
        conn.request(
            "POST",
            path,
            body=body,
            headers={
                "Host": f"127.0.0.1:{client.port}",
                "Cookie": client.cookie,
                "Content-Type": "application/x-www-form-urlencoded",
            },
        )
        response = conn.getresponse()
        return Reply(response.status, response.headers, response.read().decode())
    finally:
        conn.close()


def test_every_bulk_input_is_bounded_and_checked(http_client: Http, db: Db) -> None:
    jobs = [db.enqueue("work", {}, delay=3600) for _ in range(3)]
    ids = [str(j) for j in jobs]
    over = [str(n) for n in range(1, admin.BULK_MAX + 2)]
    for form, status, why in (
        (_confirm_form(http_client, over), 400, f"at most {admin.BULK_MAX} jobs per action, not"),
        (_confirm_form(http_client, []), 400, "no job selected"),
        (_confirm_form(http_client, ["1e9"]), 400, "a job id is not a number"),
        (_confirm_form(http_client, ids, action="drop-table"), 400, "choose an action"),
        (
            _confirm_form(http_client, ids, action="priority", priority="99999"),
            400,
            "the priority must",
        ),
        (
            _confirm_form(http_client, ids, action="priority", priority="x"),
            400,
            "the priority must",
        ),
        (_confirm_form(http_client, ids, csrf="forged"), 403, "CSRF"),
    ):
        for path in ("/bulk/confirm", "/bulk/act"):
            reply = _post(http_client, path, form)
            assert reply.status == status and why in reply.body, (
                path,
                form["action"],
                reply.status,
            )
    # a million ids: refused whole (the form is over MAX_CONTENT_LENGTH), nothing parsed
    million = urllib.parse.urlencode(_confirm_form(http_client, ["123456"] * 1_000_000), doseq=True)
    conn = http.client.HTTPConnection("127.0.0.1", http_client.port, timeout=BROWSER_DEADLINE)
    try:  # the length is enough to refuse it: the body is never sent
        conn.putrequest("POST", "/bulk/act", skip_host=True)
        for name, value in (
            ("Host", f"127.0.0.1:{http_client.port}"),
            ("Cookie", http_client.cookie),
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Content-Length", str(len(million))),
        ):
            conn.putheader(name, value)
        conn.endheaders()
        assert conn.getresponse().status == 413
    finally:
        conn.close()
    for kind, name, why in (
        ("table", "x", "retry the dead jobs of a queue or a handler"),
        ("handler", "", "handler"),
    ):
        reply = http_client.get(f"/bulk/confirm-dead?kind={kind}&name={name}")
        assert reply.status == 400 and why in reply.body
    forged = _post(
        http_client, "/bulk/act-dead", {"csrf": "forged", "kind": "handler", "name": "work"}
    )
    assert forged.status == 403
    # nothing changed by any of it
    assert [db.job(j)["status"] for j in jobs] == ["pending"] * 3
    assert [db.job(j)["priority"] for j in jobs] == [0] * 3
    # and the right form works
    token = http_client.get("/jobs").csrf()
    done = _post(
        http_client, "/bulk/act", {"csrf": token, "action": "priority", "priority": "-5", "id": ids}
    )
    assert done.status == 302
    assert [db.job(j)["priority"] for j in jobs] == [-5] * 3


def test_a_read_only_dashboard_offers_and_accepts_no_bulk_action(
    roles: dict[str, str], schema: str, db: Db
) -> None:
    job = db.enqueue("work", {}, delay=3600)
    dashboard = RunningDashboard(
        build(
            WebConfig(port=0, users={USER: PASSWORD_HASH}, read_only=True),
            roles[f"{schema}_reader"],
            schema,
        )
    )
    try:
        client = Http(dashboard.port)
        client.log_in()
        page = client.get("/jobs")
        assert page.status == 200 and "bulk-action" not in page.body
        form = {"csrf": page.csrf(), "action": "run-now", "id": [str(job)]}
        assert _post(client, "/bulk/act", form).status == 403
        assert client.get("/bulk/confirm-dead?kind=handler&name=work").status == 403
    finally:
        dashboard.close()
    assert db.job(job)["run_at"] > db.job(job)["created_at"]


def test_job_priority_set_refuses_hostile_arguments(
    conn: psycopg.Connection[Any], schema: str
) -> None:
    call = f"SELECT * FROM {schema}.job_priority_set(%s, %s)"
    for ids, priority, why in (
        (None, 1, "no job ids given"),
        ([], 1, "no job ids given"),
        (list(range(1, 1002)), 1, "at most 1000 jobs at once, not 1001"),
        ([1, None], 1, "a job id is NULL"),
        ([1], None, "the priority must be an integer from -32768 to 32767, not NULL"),
        ([1], 40000, "not 40000"),
    ):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=why):
            conn.execute(call, (ids, priority))
    assert conn.execute(call, ([10**12], 3)).fetchall() == [(10**12, "not found")]


def test_only_the_operator_sets_priorities_within_bounds(
    conn: psycopg.Connection[Any], schema: str, roles: dict[str, str], db: Db
) -> None:
    """It sets the priority of at most 1,000 pending, waiting or suspended jobs at once
    (`job_priority_set`, the dashboard's bulk action): an empty or longer selection, a NULL
    id or a priority out of range is refused with 22023 and nothing changes; running and
    finished jobs keep theirs; the reader, the enqueuer and the daemon cannot call it."""
    live = db.enqueue("work", {}, delay=3600)
    done = db.enqueue("work", {})
    db.rows(
        "UPDATE {schema}.jobs SET status = 'completed', finished_at = now() WHERE id = %s", (done,)
    )
    call = f"SELECT * FROM {schema}.job_priority_set(%s, %s)"
    for kind in ("reader", "enqueuer", "daemon"):
        with (
            psycopg.connect(roles[f"{schema}_{kind}"], autocommit=True) as c,
            pytest.raises(psycopg.errors.InsufficientPrivilege),
        ):
            c.execute(call, ([live], 9))
    with psycopg.connect(roles[f"{schema}_operator"], autocommit=True) as operator:
        for ids, priority in (
            ([], 1),
            (list(range(1, 1002)), 1),
            ([live, None], 1),
            ([live], 40000),
        ):
            with pytest.raises(psycopg.errors.InvalidParameterValue):
                operator.execute(call, (ids, priority))
        assert db.job(live)["priority"] == 0
        outcome = operator.execute(call, ([done, live, live], 9)).fetchall()
    assert outcome == [(live, "priority set"), (done, "is completed")]
    assert (db.job(live)["priority"], db.job(done)["priority"]) == (9, 0)
