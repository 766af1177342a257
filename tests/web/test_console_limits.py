"""The Limits page (issue 27 item 4) against a real daemon, in real headless Chromium: how
many due jobs each limit holds back, by max_running and by max_running_per_key."""

from __future__ import annotations

from typing import Any

from daemon_harness import Daemons, Db
from dashboard_harness import RunningDashboard, log_in, text_of, wait_browser


def _row(driver: Any, handler: str) -> dict[str, str]:
    for row in driver.find_elements("css selector", "#limits tr"):
        cells = row.find_elements("css selector", "td")
        if cells and cells[0].text == handler:
            return {
                name: row.find_element("css selector", f"td.held-{name}").text
                for name in ("due", "max", "key")
            }
    return {}


def test_the_limits_page_counts_the_due_jobs_each_limit_holds_back(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    daemons.start(
        {
            "capped": {"target": "jobhandlers:work", "max_running": 1},
            "keyed": {"target": "jobhandlers:work", "max_running_per_key": 1},
        },
        {"slots": 4},
    )
    capped = [db.enqueue("capped", {"seconds": 120}) for _ in range(4)]
    keyed = [db.enqueue("keyed", {"seconds": 120}, concurrency_key="k") for _ in range(3)]
    free = db.enqueue("keyed", {"seconds": 120}, concurrency_key="other")
    for job in (capped[0], keyed[0], free):
        db.wait_status(job, "running")
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/limits")
    wait_browser(browser, lambda d: "capped" in text_of(d, "limits"), "the limits")
    assert _row(browser, "capped") == {"due": "3", "max": "3", "key": "0"}
    assert _row(browser, "keyed") == {"due": "2", "max": "0", "key": "2"}
    # the overview's banner says so, with a link to this page
    browser.get(f"{dashboard.url}/")
    wait_browser(browser, lambda d: text_of(d, "problem-limits"), "the banner's limits")
    assert text_of(browser, "problem-limits") == (
        "5 due job(s) held back by limits: capped (3), keyed (2)"
    )
