"""The jobs list's tabs (issue 27 item 3), in real headless Chromium: due, scheduled and
retrying split the pending jobs, each tab with its count (capped), a tab lists its jobs
only; a tab, a sort or both a tab and a status that the list does not serve are refused
with a clear 400."""

from __future__ import annotations

from typing import Any

import psycopg
from daemon_harness import Db
from dashboard_harness import Http, RunningDashboard, by_id, log_in, text_of, wait_browser

from pgworkerd.queue import views


def test_tabs_split_the_pending_jobs_and_count_each_state(
    browser: Any, dashboard: RunningDashboard, db: Db
) -> None:
    due = [db.enqueue("work", {}) for _ in range(2)]
    scheduled = [db.enqueue("work", {}, delay=3600) for _ in range(3)]
    retrying = db.enqueue("work", {}, delay=600)
    db.rows("UPDATE {schema}.jobs SET attempts = 1 WHERE id = %s", (retrying,))  # a backoff
    dead = db.enqueue("work", {})
    db.rows("UPDATE {schema}.jobs SET status = 'dead', finished_at = now() WHERE id = %s", (dead,))
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/jobs")
    wait_browser(browser, lambda d: text_of(d, "tabs"), "the tabs")
    counts = {t: text_of(browser, f"tab-{t}").split()[-1] for t in views.TABS}
    assert counts == {
        "due": "2",
        "scheduled": "3",
        "retrying": "1",
        "running": "0",
        "waiting": "0",
        "suspended": "0",
        "dead": "1",
        "cancelled": "0",
        "completed": "0",
    }
    for tab, expected in (("scheduled", scheduled), ("due", due), ("retrying", [retrying])):
        by_id(browser, f"tab-{tab}").click()
        wait_browser(
            browser, lambda d, t=tab: "current" in by_id(d, f"tab-{t}").get_attribute("class"), tab
        )
        listed = [a.text for a in browser.find_elements("css selector", "#jobs td a")]
        assert listed == [str(j) for j in sorted(expected, reverse=True)], tab
    # a queue filter scopes the counts too
    browser.get(f"{dashboard.url}/jobs?queue=elsewhere")
    assert text_of(browser, "tab-due").split()[-1] == "0"


def test_the_list_refuses_what_it_does_not_serve(http_client: Http) -> None:
    for path, why in (
        ("/jobs?tab=everything", "unknown tab: the tabs are due, scheduled"),
        ("/jobs?tab=due&status=dead", "give a tab or a status, not both"),
        ("/jobs?sort=payload", "no index serves that order"),
        ("/jobs?sort=created_at", "no index serves that order"),
        ("/jobs?sort=run_at", "sort=newest or sort=oldest"),
        ("/jobs?sort=priority", "no index serves that order"),
        ("/jobs?sort=" + "x" * 5000, "no index serves that order"),
    ):
        reply = http_client.get(path)
        assert reply.status == 400 and why in reply.body, path
    assert http_client.get("/jobs?tab=completed&sort=newest").status == 200


def test_a_tab_count_stops_at_its_cap(conn: psycopg.Connection[Any], schema: str, db: Db) -> None:
    for _ in range(5):
        db.enqueue("work", {}, delay=3600)
    counts = views.tab_counts(conn, schema, cap=3)
    assert counts["scheduled"] == 4  # cap + 1: "more than 3"
    assert views.tab_counts(conn, schema, handler="other")["scheduled"] == 0


def test_the_list_sorts_oldest_first_and_pages_that_way(
    browser: Any, dashboard: RunningDashboard, db: Db
) -> None:
    """The order select offers what an index serves (newest, oldest by id); the pager
    follows the order."""
    from pgworkerd.web.pages import PAGE_SIZE

    made = [db.enqueue("work", {}, delay=3600) for _ in range(PAGE_SIZE + 3)]
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/jobs")
    wait_browser(browser, lambda d: d.find_elements("css selector", "#jobs tr td"), "the list")
    from selenium.webdriver.support.ui import Select

    Select(browser.find_element("css selector", "#filter-sort")).select_by_value("oldest")
    browser.find_element("css selector", "#filter").click()
    wait_browser(browser, lambda d: "sort=oldest" in d.current_url, "the oldest-first list")

    def listed() -> list[int]:
        rows = browser.find_elements("css selector", "#jobs tr td:nth-child(2) a")
        return [int(r.text) for r in rows]

    assert listed() == sorted(made)[:PAGE_SIZE]
    browser.find_element("css selector", "#newer").click()
    wait_browser(browser, lambda d: "after=" in d.current_url, "the next page")
    assert listed() == sorted(made)[PAGE_SIZE:]
    assert "sort=oldest" in browser.current_url
