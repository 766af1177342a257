"""The overview's problem banner and the queue rows' pause state (issue 27 item 2), in
real headless Chromium against a real daemon: dead jobs of the last hour, handlers no
daemon serves and paused queues show at the top; a paused queue's row says so and offers
Resume, which resumes it."""

from __future__ import annotations

from typing import Any

from daemon_harness import Daemons, Db
from dashboard_harness import (
    RunningDashboard,
    by_id,
    log_in,
    screenshot,
    text_of,
    wait_browser,
)

from pgworkerd.web import problems

HANDLERS = {"fail": {"target": "jobhandlers:fail"}, "work": {"target": "jobhandlers:work"}}


def _queue_row(driver: Any, queue: str) -> dict[str, Any]:
    """The queue's row as {"paused": badge shown, "links": its action links' texts}, read
    in one script (the live refresh replaces the table every 2 s)."""
    found = driver.execute_script(
        "for (const r of document.querySelectorAll('#queues tr')) {"
        "  const c = r.querySelector('td');"
        "  if (c && c.textContent.trim().split(/\\s+/)[0] === arguments[0]) {"
        "    return {paused: !!r.querySelector('.badge.paused'),"
        "            links: Array.from(r.querySelectorAll('a.action')).map(a => a.textContent)};"
        "  }"
        "}"
        "return null;",
        queue,
    )
    return found or {}


def _click_row_action(driver: Any, queue: str, label: str) -> None:
    driver.execute_script(
        "for (const r of document.querySelectorAll('#queues tr')) {"
        "  const c = r.querySelector('td');"
        "  if (c && c.textContent.trim().split(/\\s+/)[0] === arguments[0]) {"
        "    for (const a of r.querySelectorAll('a.action')) {"
        "      if (a.textContent === arguments[1]) { a.click(); return; }"
        "    }"
        "  }"
        "}",
        queue,
        label,
    )


def test_the_banner_names_the_fleets_problems_and_a_paused_queue_offers_resume(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    daemons.start(HANDLERS)
    log_in(browser, dashboard)
    wait_browser(browser, lambda d: "No problem" in text_of(d, "problems"), "no problem")
    dead = db.enqueue("fail", {}, max_attempts=1)
    db.wait_status(dead, "dead")
    db.enqueue("nobody-serves-this", {})
    wait_browser(browser, lambda d: text_of(d, "problem-dead"), "the dead job in the banner")
    assert text_of(browser, "problem-dead").startswith("1 job(s) died in the last hour")
    wait_browser(browser, lambda d: text_of(d, "problem-unserved"), "the unserved handler")
    assert "nobody-serves-this" in text_of(browser, "problem-unserved")
    # pause the queue from its row: the row then says paused and offers resume
    wait_browser(browser, lambda d: _queue_row(d, "default"), "the default queue's row")
    _click_row_action(browser, "default", "pause")
    wait_browser(browser, lambda d: "default" in text_of(d, "confirm-target"), "confirmation")
    by_id(browser, "confirm").click()
    # the POST's answer first: navigating away at once can abort the submission
    wait_browser(browser, lambda d: d.find_elements("css selector", ".flash"), "the outcome")
    assert "paused" in browser.find_element("css selector", ".flash").text
    browser.get(dashboard.url + "/")
    wait_browser(browser, lambda d: "queue default" in text_of(d, "problem-paused"), "banner")
    wait_browser(browser, lambda d: _queue_row(d, "default"), "the default queue's row")
    assert _queue_row(browser, "default") == {"paused": True, "links": ["resume"]}
    screenshot(browser, "overview-problems")
    _click_row_action(browser, "default", "resume")
    wait_browser(browser, lambda d: "default" in text_of(d, "confirm-target"), "confirmation")
    by_id(browser, "confirm").click()
    wait_browser(browser, lambda d: d.find_elements("css selector", ".flash"), "the outcome")
    assert "resumed" in browser.find_element("css selector", ".flash").text
    browser.get(dashboard.url + "/")
    wait_browser(browser, lambda d: _queue_row(d, "default"), "the queues")
    assert _queue_row(browser, "default") == {"paused": False, "links": ["pause"]}
    assert not text_of(browser, "problem-paused")


def test_silent_daemons_and_a_long_waiting_due_job_are_problems() -> None:
    snap = {
        "daemons": [
            {"id": "a", "silent": True, "state": "running"},
            {"id": "b", "silent": True, "state": "gone"},  # gone: not a problem
            {"id": "c", "silent": False, "state": "running"},
        ],
        "oldest_pending_seconds": problems.OLDEST_DUE_PROBLEM_SECONDS + 60,
        "throughput": [{"dead": 0}],
        "unserved": [],
        "paused": [],
    }
    found = {p["kind"]: p for p in problems.problems(snap, "/jobs", "/paused")}
    assert set(found) == {"silent", "oldest-due"}
    assert found["silent"]["message"] == "1 daemon(s) silent (no heartbeat): a"
    assert found["oldest-due"]["href"] == "/jobs?status=pending"
    quiet = {**snap, "daemons": [], "oldest_pending_seconds": 10.0}
    assert problems.problems(quiet, "/jobs", "/paused") == []
