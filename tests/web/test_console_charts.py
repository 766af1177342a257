"""The Charts page (issue 27: charts with axes and legends over selectable windows) against
a real daemon, in real headless Chromium: the daemon's own rollup counts what it ran, the
page draws it with axes, units and a legend, the window switches, and a window the page
does not offer is refused with a clear 400."""

from __future__ import annotations

import urllib.parse
from typing import Any

import pytest
from daemon_harness import Daemons, Db, wait_for
from dashboard_harness import Http, RunningDashboard, log_in, text_of, wait_browser

# The daemon counts an attempt about ROLLUP_LAG_SECONDS (30) after it ended, stepping
# about every 20 s (jittered up to 30): a bound well past both, for a loaded box.
ROLLED_UP = 240.0


def _handler_row(driver: Any, handler: str) -> list[str]:
    for row in driver.find_elements("css selector", "#chart-handlers tr"):
        cells = [c.text for c in row.find_elements("css selector", "td")]
        if cells and cells[0] == handler:
            return cells
    return []


def test_the_charts_draw_what_the_daemons_rolled_up_with_axes_and_legends(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    daemons.start(
        {
            "quick": {"target": "jobhandlers:work"},
            "broken": {"target": "jobhandlers:fail", "max_attempts": 1},
        },
        {"slots": 4},
    )
    done = [db.enqueue("quick", {"seconds": 0.3}) for _ in range(3)]
    broken = db.enqueue("broken", {})
    for job in done:
        db.wait_status(job, "completed")
    db.wait_status(broken, "dead")
    # the daemon's sweep (not the test) counts them
    wait_for(
        lambda: db.rows(
            "SELECT 1 FROM {schema}.attempt_rollups"
            " WHERE grain_seconds = 60 AND handler = 'broken' AND failed = 1"
        ),
        timeout=ROLLED_UP,
        what="the daemon's rollup of the attempts",
    )
    wait_for(
        lambda: db.rows(
            "SELECT 1 FROM {schema}.attempt_rollups WHERE grain_seconds = 3600"
            " GROUP BY handler HAVING sum(completed) = 3 AND handler = 'quick'"
        ),
        timeout=ROLLED_UP,
        what="the three completions in the rollup",
    )
    log_in(browser, dashboard)
    # the overview's last hour (read live from the attempts) has the same axes and legend
    wait_browser(
        browser,
        lambda d: d.find_elements("css selector", "#chart-last-hour line.axis"),
        "the overview's chart",
    )
    last_hour = browser.find_element("css selector", "#chart-last-hour")
    assert len(last_hour.find_elements("css selector", "text.y-tick")) == 5
    assert len(last_hour.find_elements("css selector", "text.x-tick")) >= 4
    assert "attempts per minute" in last_hour.find_element("css selector", "text.axis-unit").text
    legend = last_hour.find_element("xpath", "following-sibling::p[@class='legend']").text
    assert "completed" in legend and "failed" in legend
    browser.find_element("css selector", "#charts-link").click()
    wait_browser(browser, lambda d: text_of(d, "chart-handlers"), "the charts page")
    assert "the last 6 hours" in browser.find_element("css selector", "h1").text
    assert text_of(browser, "chart-totals").startswith("3 completed, 1 failed attempts")
    quick = _handler_row(browser, "quick")
    assert quick[1:3] == ["3", "0"]
    assert quick[5].startswith("≤ ")  # runtime p50: a bucket's bound
    broken_row = _handler_row(browser, "broken")
    assert broken_row[1:3] == ["0", "1"]
    assert broken_row[3].startswith("≤ ")  # a dead job's last attempt: its wait counts
    # three charts, each with axes, tick labels, a unit and a legend naming its series
    for chart, series in (
        ("chart-throughput", ["completed", "failed"]),
        ("chart-wait", ["p50", "p95"]),
        ("chart-run", ["p50", "p95"]),
    ):
        svg = browser.find_element("css selector", f"#{chart}")
        assert len(svg.find_elements("css selector", "line.axis")) == 2
        assert len(svg.find_elements("css selector", "text.x-tick")) >= 4
        assert len(svg.find_elements("css selector", "text.y-tick")) >= 4
        drawn = [
            p.get_attribute("data-series") for p in svg.find_elements("css selector", "polyline")
        ]
        assert drawn == series
        legend = svg.find_element("xpath", "following-sibling::p[@class='legend']").text
        for name in series:
            assert name in legend
        assert "y:" in legend and "UTC" in legend
    # the throughput chart's peak is drawn: a point above the x axis
    points = browser.find_element(
        "css selector", "#chart-throughput polyline[data-series=completed]"
    ).get_attribute("points")
    ys = [float(p.split(",")[1]) for p in points.split()]
    assert min(ys) < max(ys)
    # switch the window: 7 days, hour buckets, dates on the x axis
    browser.find_element("link text", "7 days").click()
    wait_browser(browser, lambda d: "7 days" in d.find_element("css selector", "h1").text, "7 days")
    assert _handler_row(browser, "quick")[1:3] == ["3", "0"]
    x_ticks = browser.find_elements("css selector", "#chart-throughput text.x-tick")
    assert all("-" in t.text for t in x_ticks)  # "11-27 08:00"
    browser.find_element("link text", "1 hour").click()
    wait_browser(browser, lambda d: "1 hour" in d.find_element("css selector", "h1").text, "1 h")
    assert _handler_row(browser, "quick")[1:3] == ["3", "0"]


@pytest.mark.parametrize(
    "window",
    ["100y", "1H", "", "7d;DROP TABLE jobs", "<script>alert(1)</script>", "x" * 5000, "3600"],
)
def test_a_window_the_page_does_not_offer_is_refused(
    dashboard: RunningDashboard, window: str
) -> None:
    http = Http(dashboard.port)
    http.log_in()
    reply = http.get("/charts?" + urllib.parse.urlencode({"window": window}))
    if window == "":
        assert reply.status == 200  # no window: the default
        return
    assert reply.status == 400, reply.body[:500]
    assert "unknown window" in reply.body and "1h, 6h, 24h, 7d" in reply.body
    assert "<script>alert" not in reply.body
    assert len(reply.body) < 20_000  # the value is not echoed whole


def test_a_hostile_window_in_the_browser_says_what_is_wrong(
    browser: Any, dashboard: RunningDashboard
) -> None:
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/charts?window=100y")
    wait_browser(browser, lambda d: "unknown window" in d.page_source, "the error page")
    assert (
        "the charts cover one of 1h, 6h, 24h, 7d" in browser.find_element("tag name", "body").text
    )
