"""The job page's Release button (issue 24): a child held for an operator after a parent
ended dead (on_parent_failure hold) is released from its page, in a real headless
Chromium, through the actions' confirmation and CSRF token, and the daemon runs it; the
button is on no other job's page, and a release of a job that is not held (plain HTTP,
as a forged link would) changes nothing and says why."""

from __future__ import annotations

from typing import Any

from daemon_harness import Daemons, Db
from dashboard_harness import (
    Http,
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


def held_child(db: Db, daemons: Daemons) -> tuple[int, int]:
    """A parent that dies at its one attempt, and its child held for an operator."""
    parent = db.enqueue("fail", {}, max_attempts=1, delay=3600)
    child = db.enqueue("work", {}, after=[parent], on_parent_failure="hold")
    db.rows("UPDATE {schema}.jobs SET run_at = now() WHERE id = %s", (parent,))
    daemons.start(HANDLERS)
    db.wait_status(parent, "dead")
    return parent, child


def test_a_held_child_is_released_from_its_page_and_runs(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    parent, child = held_child(db, daemons)
    assert db.job(child)["status"] == "waiting"
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/jobs/{child}")
    wait_browser(browser, lambda d: text_of(d, "job-parents"), "the parents row")
    assert text_of(browser, "job-parents") == f"{parent} dead"
    assert "held" in text_of(browser, "explain")
    assert by_id(browser, "release").text == "Release"
    screenshot(browser, "job-held")
    confirm(browser, "release")
    assert "released: pending" in browser.find_element("css selector", ".flash").text
    assert db.wait_status(child, "completed", "dead")["status"] == "completed"
    wait_browser(browser, lambda d: "completed" in text_of(d, "job-status"), "completed shown")
    assert not browser.find_elements("id", "release")  # not held any more


def test_release_is_offered_only_for_held_jobs_and_refuses_the_others(
    dashboard: RunningDashboard, db: Db
) -> None:
    plain = db.enqueue("work", {}, delay=3600)
    parent = db.enqueue("work", {}, delay=3600)
    waiting = db.enqueue("work", {}, after=[parent], on_parent_failure="hold")
    http = Http(dashboard.port)
    http.log_in()
    for job_id in (plain, waiting):  # pending; waiting for a parent that did not fail
        assert 'id="release"' not in http.get(f"/jobs/{job_id}").body
        page = http.get(f"/confirm/release?target={job_id}")
        assert page.status == 200
        done = http.post("/act/release", {"target": str(job_id), "csrf": page.csrf()})
        assert done.status == 302
        flashed = http.get(done.headers["Location"]).body
        assert "not released: job" in flashed and "is not held for an operator" in flashed
    assert [db.job(j)["status"] for j in (plain, waiting)] == ["pending", "waiting"]
    # without the confirmation page's token: refused, nothing changed
    forged = http.post("/act/release", {"target": str(waiting)})
    assert forged.status in (400, 403)
    assert db.job(waiting)["status"] == "waiting"
