"""The Schedules page (issue 27 item 4), in real headless Chromium against a real daemon:
each declared schedule's next run, and "trigger now", which enqueues its job at once
(run by the daemon) and leaves the schedule's ticks alone; a name that is no schedule is
refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from daemon_harness import Daemons, Db
from dashboard_harness import Http, RunningDashboard, log_in, text_of, wait_browser


def test_schedules_show_their_next_run_and_trigger_now_enqueues_the_job(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    config = daemons.config({"work": {"target": "jobhandlers:work"}})
    with open(config, "a") as f:
        f.write(
            '\n[schedules.hourly]\nevery = "1h"\nhandler = "work"\npayload = {result = "tick"}\n'
            "priority = 3\n"
        )
    daemons.start(config)
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/schedules")
    wait_browser(browser, lambda d: "hourly" in text_of(d, "schedules"), "the schedule")
    cell = browser.find_element("css selector", "#schedules td.next-run").text
    next_run = datetime.strptime(cell, "%Y-%m-%d %H:%M:%SZ").replace(tzinfo=UTC)
    now = datetime.now(UTC)
    assert now - timedelta(seconds=5) < next_run <= now + timedelta(hours=1, seconds=5)
    ticks_before = db.rows("SELECT count(*) AS n FROM {schema}.schedule_runs")[0]["n"]
    browser.find_element("link text", "trigger now").click()
    wait_browser(browser, lambda d: "hourly" in text_of(d, "confirm-target"), "confirmation")
    browser.find_element("id", "confirm").click()
    wait_browser(browser, lambda d: d.find_elements("css selector", ".flash"), "the outcome")
    flash = browser.find_element("css selector", ".flash").text
    assert "enqueued job" in flash, flash
    job = int(flash.rsplit("job", 1)[1].strip())
    done = db.wait_status(job, "completed")
    assert done["result"] == "tick" and done["priority"] == 3
    assert db.rows("SELECT count(*) AS n FROM {schema}.schedule_runs")[0]["n"] == ticks_before


def test_triggering_an_unknown_schedule_enqueues_nothing(http_client: Http, db: Db) -> None:
    page = http_client.get("/confirm/trigger-schedule?target=nope")
    assert page.status == 200
    reply = http_client.post("/act/trigger-schedule", {"target": "nope", "csrf": page.csrf()})
    assert reply.status == 302
    assert "not triggered: no schedule" in http_client.get("/schedules").body.replace("&#39;", "'")
    assert db.rows("SELECT id FROM {schema}.jobs") == []
    bad = http_client.get("/confirm/trigger-schedule?target=%20x")
    assert bad.status == 400 and "must not begin or end with whitespace" in bad.body
