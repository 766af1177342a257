"""Every page of the operations console against a real daemon, in real headless Chromium,
with something on it: the overview with its problem banner, the jobs list with its tabs,
a long job's page with its progress bar and live output, the schedules, the limits, the
charts and a pause with its reason. Each
page is photographed (tests/artifacts/web); `python tests/support/dashboard_screenshots.py`
runs this test with DOCS_SCREENSHOTS set, which also writes the pictures the docs show
(docs/images/dashboard/, docs/operations/dashboard.md)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from daemon_harness import Daemons, Db
from dashboard_harness import RunningDashboard, log_in, screenshot, text_of, wait_browser

from pgworkerd.queue import attempts

DOCS_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images" / "dashboard"


def test_every_console_page_renders_with_its_parts(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    config = daemons.config(
        {
            "report": {"target": "consolehandlers:report", "max_running": 2},
            "fail": {"target": "jobhandlers:fail"},
            "work": {"target": "jobhandlers:work", "queue": "reports"},
        },
        {"slots": 4},
    )
    with open(config, "a") as f:
        f.write('\n[schedules.nightly-report]\ncron = "0 3 * * *"\nhandler = "work"\n')
    daemons.start(config)
    long = db.enqueue("report", {"ticks": 2000, "every": 0.3})
    for n in range(3):
        db.enqueue("report", {"ticks": 2000, "every": 0.3, "n": n})  # held back by the limit
    for n in range(3):
        db.enqueue("fail", {"n": n}, max_attempts=1)
    for n in range(5):
        db.enqueue("work", {"n": n}, queue="reports")
    db.enqueue("work", {}, delay=3600, queue="reports")
    db.enqueue("resize-images", {"id": 7})  # no daemon serves it
    db.wait_status(long, "running")
    browser.set_window_size(1400, 1000)
    log_in(browser, dashboard)
    shots: dict[str, Path] = {}
    wait_browser(browser, lambda d: text_of(d, "problem-dead"), "the banner")
    # a running job whose progress states a fraction has its bar on the overview too
    wait_browser(
        browser, lambda d: d.find_elements("css selector", "#running progress.mini"), "a bar"
    )
    shots["overview"] = screenshot(browser, "console-overview")
    browser.get(f"{dashboard.url}/jobs?tab=due")
    wait_browser(browser, lambda d: text_of(d, "tabs"), "the tabs")
    shots["jobs"] = screenshot(browser, "console-jobs")
    browser.get(f"{dashboard.url}/jobs/{long}")
    wait_browser(browser, lambda d: text_of(d, "job-eta"), "the ETA")
    wait_browser(browser, lambda d: "tick 5" in text_of(d, "log-tail"), "the output")
    browser.set_window_size(1400, 1900)  # the fields, the bar and the output at once
    shots["job"] = screenshot(browser, "console-job")
    browser.set_window_size(1400, 1000)
    browser.get(f"{dashboard.url}/schedules")
    wait_browser(browser, lambda d: "nightly-report" in text_of(d, "schedules"), "schedules")
    shots["schedules"] = screenshot(browser, "console-schedules")
    browser.get(f"{dashboard.url}/limits")
    wait_browser(browser, lambda d: "report" in text_of(d, "limits"), "the limits")
    shots["limits"] = screenshot(browser, "console-limits")
    # the charts: what the daemon's rollup counted so far (it counts an attempt about 30 s
    # after its end), stepped here at once so the picture has the failures above
    attempts.rollup_advance(db.conn, db.schema, lag_seconds=0)
    browser.get(f"{dashboard.url}/charts?window=1h")
    wait_browser(browser, lambda d: "fail" in text_of(d, "chart-handlers"), "the charts")
    browser.set_window_size(1400, 1500)
    shots["charts"] = screenshot(browser, "console-charts")
    browser.set_window_size(1400, 1000)
    browser.get(f"{dashboard.url}/confirm/pause-queue?target=reports&reason=month-end+freeze")
    wait_browser(browser, lambda d: text_of(d, "confirm-target"), "the pause's confirmation")
    browser.find_element("css selector", "#confirm").click()
    wait_browser(browser, lambda d: "month-end" in text_of(d, "paused"), "the paused page")
    shots["paused"] = screenshot(browser, "console-paused")
    if os.environ.get("DOCS_SCREENSHOTS"):
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        for name, path in shots.items():
            shutil.copyfile(path, DOCS_IMAGES / f"{name}.png")
