"""The dashboard in a real headless Chromium against real daemons: log in, watch a
running job's progress change live, cancel it, retry a dead job, pause a queue and see a
new job stay pending. A screenshot of each page is kept (tests/artifacts/web)."""

from __future__ import annotations

import time
from typing import Any

from daemon_harness import Daemons, Db, wait_for
from dashboard_harness import (
    RunningDashboard,
    by_id,
    confirm,
    log_in,
    screenshot,
    text_of,
    wait_browser,
)

HANDLERS = {
    "work": {"target": "jobhandlers:work"},
    "fail": {"target": "jobhandlers:fail"},
}


def test_logging_in_shows_every_page(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    browser.get(dashboard.url + "/")
    assert "/login" in browser.current_url  # nothing without a login
    screenshot(browser, "login")
    daemons.start({**HANDLERS, "report": {"target": "jobhandlers:work", "queue": "reports"}})
    done = [db.enqueue("report", {"n": n}, queue="reports") for n in range(6)]
    job = db.enqueue("work", {"seconds": 30, "step": 0.2, "checkpoint": True})
    dead = db.enqueue("fail", {"why": "screenshots"}, max_attempts=1)
    db.enqueue("work", {}, delay=3600)  # pending, due in an hour
    db.wait_status(dead, "dead")
    for n in done:
        db.wait_status(n, "completed")
    db.wait_status(job, "running")
    log_in(browser, dashboard)
    wait_browser(browser, lambda d: str(job) in text_of(d, "running"), "the running job")
    screenshot(browser, "overview")
    pages = {
        "jobs": ("/jobs", "jobs"),
        "jobs-dead": ("/jobs?status=dead", "jobs"),
        "job-running": (f"/jobs/{job}", "job-fields"),
        "job-dead": (f"/jobs/{dead}", "attempts"),
        "schedules": ("/schedules", "schedules"),
        "limits": ("/limits", None),
        "paused": ("/paused", "paused"),
        "confirm": (f"/confirm/cancel?target={job}", "confirm"),
    }
    for name, (path, element) in pages.items():
        browser.get(dashboard.url + path)
        if element:
            wait_browser(browser, lambda d, e=element: text_of(d, e), f"page {path}")
        screenshot(browser, name)
    browser.get(f"{dashboard.url}/jobs?status=dead")
    listed = [a.text for a in browser.find_elements("css selector", "#jobs td a[href*='/jobs/']")]
    assert listed == [str(dead)]
    browser.get(f"{dashboard.url}/jobs/{dead}")
    assert "boom on attempt 1" in text_of(browser, "attempts")


def test_a_running_jobs_progress_changes_live_and_cancel_stops_it(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    daemons.start(HANDLERS)
    job = db.enqueue("work", {"seconds": 120, "step": 0.3})
    db.wait_status(job, "running")
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/jobs/{job}")
    first = wait_browser(browser, lambda d: text_of(d, "job-progress"), "progress")
    # a flag of this page load: it survives only if the page is never reloaded
    browser.execute_script("window.notReloaded = true")
    wait_browser(
        browser, lambda d: text_of(d, "job-progress") not in ("", first), "progress to change"
    )
    assert browser.execute_script("return window.notReloaded") is True
    screenshot(browser, "job-progress-live")
    confirm(browser, "cancel")
    db.wait_status(job, "cancelled")
    wait_browser(browser, lambda d: "cancelled" in text_of(d, "job-status"), "cancelled shown")
    screenshot(browser, "job-cancelled")


def test_retrying_a_dead_job_runs_it_again(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    daemons.start(HANDLERS)
    job = db.enqueue("fail", {}, max_attempts=1)
    db.wait_status(job, "dead")
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/jobs/{job}")
    confirm(browser, "retry")
    assert "back to pending" in browser.find_element("css selector", ".flash").text
    # the daemon runs it again: a second execution, dead again after its one attempt
    wait_for(lambda: len(db.executions(job)) == 2, what="a second execution")
    db.wait_status(job, "dead")
    # both attempts, live on the page (header row + 2)
    wait_browser(
        browser,
        lambda d: len(d.find_elements("css selector", "#attempts tr")) == 3,
        "the second attempt on the page",
    )


def test_a_paused_queue_keeps_a_new_job_pending_until_resumed(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    handlers = {**HANDLERS, "other": {"target": "jobhandlers:work", "queue": "other"}}
    daemons.start(handlers)
    log_in(browser, dashboard)
    browser.get(dashboard.url + "/paused")
    by_id(browser, "pause-queue-name").send_keys("default")
    by_id(browser, "pause-queue").click()
    wait_browser(browser, lambda d: "default" in text_of(d, "confirm-target"), "confirmation")
    by_id(browser, "confirm").click()
    wait_browser(browser, lambda d: "default" in text_of(d, "paused"), "the paused queue")
    screenshot(browser, "paused-queue")
    held = db.enqueue("work", {})
    # a job of another queue, enqueued after it, runs to completion meanwhile
    control = db.enqueue("other", {}, queue="other")
    db.wait_status(control, "completed")
    time.sleep(2)  # several poll intervals of the daemon (1 s)
    assert db.job(held)["status"] == "pending"
    browser.get(f"{dashboard.url}/jobs/{held}")
    assert text_of(browser, "job-status") == "pending"
    browser.get(dashboard.url + "/paused")
    browser.find_element("link text", "resume").click()
    by_id(browser, "confirm").click()
    wait_browser(browser, lambda d: "nothing is paused" in text_of(d, "paused"), "resumed")
    db.wait_status(held, "completed")


def click_parent_link(browser: Any) -> None:
    """Click the first parent's link; the live refresh (every second) may replace the row
    between finding and clicking it (a loaded machine): then it is found again."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(10):
        try:
            by_id(browser, "job-parents").find_element("tag name", "a").click()
            return
        except StaleElementReferenceException:
            time.sleep(0.1)
    raise AssertionError("the parents row was replaced at every try")


def test_a_job_page_links_its_parents_and_children(
    browser: Any, dashboard: RunningDashboard, db: Db
) -> None:
    """Dependencies (schema 27): a child's page lists its parents, each a link to its page
    with its status; the parent's page lists the child; explain says what it waits for."""
    parent = db.enqueue("work", {}, delay=3600)
    child = db.enqueue("work", {}, after=[parent])
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/jobs/{child}")
    wait_browser(browser, lambda d: text_of(d, "job-parents"), "the parents row")
    assert text_of(browser, "job-parents") == f"{parent} pending"
    assert f"waiting for 1 of its parents to finish: {parent} (pending)" in text_of(
        browser, "explain"
    )
    screenshot(browser, "job-waiting")
    click_parent_link(browser)
    wait_browser(browser, lambda d: text_of(d, "job-children"), "the parent's page")
    assert browser.current_url.endswith(f"/jobs/{parent}")
    assert text_of(browser, "job-children") == f"{child} waiting"


def test_a_suspended_jobs_page_shows_its_wait_and_the_signals_it_receives(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    """Durable waits: the job page says what the job waits for (since, timeout), lists the
    signals it received with their payloads, and follows the job live as a signal
    resumes it."""
    from pgworkerd import signals

    daemons.start({"stepper": {"target": "waithandlers:wait_twice"}})
    job = db.enqueue("stepper", {})
    wait_for(lambda: db.job(job)["wait_for"] == "first", what="the first wait")
    db.wait_status(job, "suspended")
    signals.signal(db.conn, job, "second", {"note": "early <b>bird</b>"}, schema=db.schema)
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/jobs/{job}")
    assert "waiting for signal first since" in text_of(browser, "job-wait")
    assert "timeout at" in text_of(browser, "job-wait")
    received = text_of(browser, "job-signals")
    assert "second" in received and "early <b>bird</b>" in received  # shown as text
    assert "suspended: waiting for signal 'first'" in text_of(browser, "explain")
    screenshot(browser, "job-suspended")
    signals.signal(db.conn, job, "first", 1, schema=db.schema)
    db.wait_status(job, "completed")
    wait_browser(browser, lambda d: "completed" in text_of(d, "job-status"), "completed shown")
    wait_browser(browser, lambda d: "first" in text_of(d, "job-signals"), "both signals")
    assert "ended by signal" in text_of(browser, "job-wait")
