"""The dashboard in a real headless Chromium shows a daemon killed with SIGKILL as
silent: its row in the daemons table, its job in the running jobs list, and the job's
page (the holder's line and explain's daemon_silent reason), refreshed live, while the
job is still `running` (left to its lease). Screenshots in tests/artifacts/web."""

from __future__ import annotations

import signal
from typing import Any

from daemon_harness import Daemons, Db
from dashboard_harness import RunningDashboard, log_in, screenshot, text_of, wait_browser

from pgworkerd.daemon.presence import HEARTBEAT_BUSY

WORK = {"work": {"target": "jobhandlers:work"}}
# A lease far longer than the test: nobody may take the job while it runs.
LEASE = {"lease": "5m", "renew_interval": "1s"}
# The flag comes 2 x HEARTBEAT_BUSY after the kill; the pages refresh every 1 to 2 s.
SHOWN_WITHIN = 2 * HEARTBEAT_BUSY + 30


def badges(driver: Any, table: str) -> list[str]:
    from selenium.common.exceptions import StaleElementReferenceException

    try:
        found = driver.find_elements("css selector", f"#{table} .badge.silent")
        return [str(b.text) for b in found]
    except StaleElementReferenceException:  # replaced by a live refresh meanwhile
        return []


def test_a_killed_daemon_and_its_job_are_shown_silent(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    daemon = daemons.start(WORK, LEASE)
    job = db.enqueue("work", {"seconds": 600})
    db.wait_started(job)
    log_in(browser, dashboard)
    wait_browser(browser, lambda d: str(job) in text_of(d, "running"), "the running job")
    assert badges(browser, "daemons") == [] and badges(browser, "running") == []

    daemon.send(signal.SIGKILL)
    daemon.wait_exit()
    # the overview refreshes itself (no reload): the daemon's row and its job get a badge
    wait_browser(
        browser, lambda d: badges(d, "daemons") == ["silent"], "the daemon's badge", SHOWN_WITHIN
    )
    wait_browser(browser, lambda d: badges(d, "running"), "the running job's badge")
    [shown] = badges(browser, "running")
    assert shown.startswith("daemon silent") and "lease ends" in shown
    screenshot(browser, "overview-daemon-silent")

    browser.get(f"{dashboard.url}/jobs/{job}")
    wait_browser(browser, lambda d: "daemon silent" in text_of(d, "job-holder"), "the holder")
    assert "running" in text_of(browser, "job-status")
    assert "not taken from it before its lease ends" in text_of(browser, "job-holder")
    [reason] = browser.find_elements("css selector", "#explain li.reason-daemon_silent")
    assert daemon.worker_id in reason.text and "not taken from it early" in reason.text
    screenshot(browser, "job-daemon-silent")
    assert db.job(job)["status"] == "running"
    assert db.job(job)["locked_by"] == daemon.worker_id
