"""A pause from the dashboard carries a reason and names the dashboard's user (issue 27;
schema 38), in real headless Chromium: the Paused page's form, the confirmation page's
reason field, and the pause shown on the Paused page, on the queue's row of the overview
and in the problem banner; a hostile reason is refused with 400 and pauses nothing."""

from __future__ import annotations

from typing import Any

from daemon_harness import Daemons, Db
from dashboard_harness import USER, Http, RunningDashboard, by_id, log_in, text_of, wait_browser


def test_a_dashboard_pause_shows_its_reason_and_who_asked(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    daemons.start({"work": {"target": "jobhandlers:work"}}, {"queues": ["mail", "default"]})
    db.enqueue("work", {}, queue="mail")
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/paused")
    by_id(browser, "pause-queue-name").send_keys("mail")
    by_id(browser, "pause-queue-reason").send_keys("smtp relay down <b>")
    by_id(browser, "pause-queue").click()
    wait_browser(browser, lambda d: text_of(d, "confirm-target") == "mail", "the confirmation")
    # the reason typed on the Paused page is carried to the confirmation, still editable
    assert by_id(browser, "reason").get_attribute("value") == "smtp relay down <b>"
    by_id(browser, "confirm").click()
    wait_browser(browser, lambda d: d.find_elements("css selector", "#paused td.paused-by"), "row")
    assert browser.find_element("css selector", "#paused td.paused-by").text.startswith(
        f"{USER} (web) (role "
    )
    assert browser.find_element("css selector", "#paused td.paused-reason").text == (
        "smtp relay down <b>"
    )
    [row] = db.rows("SELECT comment, requested_by FROM {schema}.paused")
    assert row == {"comment": "smtp relay down <b>", "requested_by": f"{USER} (web)"}
    browser.get(f"{dashboard.url}/")
    wait_browser(browser, lambda d: text_of(d, "problem-paused"), "the banner")
    assert text_of(browser, "problem-paused") == (
        f"1 paused: queue mail (by {USER} (web): smtp relay down <b>)"
    )
    note = browser.find_element("css selector", "#queues .paused-note").text
    assert note == f"by {USER} (web): smtp relay down <b>"


def test_a_hostile_reason_is_refused_and_pauses_nothing(
    dashboard: RunningDashboard, db: Db
) -> None:
    http = Http(dashboard.port)
    http.log_in()
    page = http.get("/confirm/pause-queue?target=mail")
    token = page.csrf()
    for reason, says in (
        ("x" * 501, "the reason must be at most 500 characters, not 501"),
        ("a\x00b", "the reason contains a NUL character"),
        ("line\nbreak", "the reason must be one line without control characters"),
    ):
        reply = http.post("/act/pause-queue", {"csrf": token, "target": "mail", "reason": reason})
        assert reply.status == 400, reply.body[:300]
        assert says in reply.body
    assert http.get("/confirm/pause-queue?target=mail&reason=%1b%5b2J").status == 400
    assert db.rows("SELECT * FROM {schema}.paused") == []
    # a forged CSRF token pauses nothing either
    forged = http.post("/act/pause-queue", {"csrf": "x" * 40, "target": "mail", "reason": "r"})
    assert forged.status in (400, 403)
    assert db.rows("SELECT * FROM {schema}.paused") == []
