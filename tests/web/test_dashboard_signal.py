"""The job page's Send signal (issue 27: what `pgworkerd signal` does, from the dashboard):
a job suspended waiting for an approval is approved from its page in a real headless
Chromium, through the actions' confirmation (the waited-for name filled in, a JSON
payload typed) and CSRF token, and its next attempt sees the payload; a bad name, a
payload that is not JSON and a forged token are refused and change nothing."""

from __future__ import annotations

import json
from typing import Any

from daemon_harness import Daemons, Db
from dashboard_harness import Http, RunningDashboard, by_id, log_in, text_of, wait_browser

HANDLERS = {"approve": {"target": "waithandlers:wait_once"}}


def test_a_waiting_job_is_signalled_from_its_page_and_sees_the_payload(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    daemons.start(HANDLERS)
    job_id = db.enqueue("approve", {"name": "approval", "timeout": "1h"})
    db.wait_status(job_id, "suspended")
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/jobs/{job_id}")
    wait_browser(browser, lambda d: d.find_elements("id", "signal"), "the Send signal link")
    by_id(browser, "signal").click()
    wait_browser(browser, lambda d: text_of(d, "confirm"), "the confirmation page")
    assert by_id(browser, "signal").get_attribute("value") == "approval"  # what it waits for
    by_id(browser, "payload").send_keys('{"by": "ann", "ok": true}')
    by_id(browser, "confirm").click()
    wait_browser(browser, lambda d: d.find_elements("css selector", ".flash"), "the outcome")
    flashed = browser.find_element("css selector", ".flash").text
    assert "signal 'approval' sent" in flashed, flashed
    row = db.wait_status(job_id, "completed", "dead")
    assert row["status"] == "completed", row
    seen = row["result"] if isinstance(row["result"], dict) else json.loads(row["result"])
    assert seen["signal"]["name"] == "approval"
    assert seen["signal"]["payload"] == {"by": "ann", "ok": True}
    browser.get(f"{dashboard.url}/jobs/{job_id}")
    wait_browser(browser, lambda d: "completed" in text_of(d, "job-status"), "completed shown")
    assert not browser.find_elements("id", "signal")  # a finished job takes none


def test_bad_signals_and_forged_tokens_are_refused_and_change_nothing(
    dashboard: RunningDashboard, db: Db
) -> None:
    job_id = db.enqueue("approve", {}, delay=3600)
    http = Http(dashboard.port)
    http.log_in()
    page = http.get(f"/confirm/signal?target={job_id}&signal=approval")
    assert page.status == 200 and 'value="approval"' in page.body
    for form, why in (
        ({"signal": "", "payload": ""}, "signal name"),
        ({"signal": "x" * 300, "payload": ""}, "signal name"),
        ({"signal": "approval", "payload": "{not json"}, "not valid JSON"),
        ({"signal": "approval", "payload": '"\\u0000"'}, "NUL"),
    ):
        refused = http.post("/act/signal", {"target": str(job_id), "csrf": page.csrf(), **form})
        assert refused.status == 400, (form, refused.status)
        assert why in refused.body, (form, refused.body[:500])
    # without the confirmation page's token: refused
    forged = http.post("/act/signal", {"target": str(job_id), "signal": "approval"})
    assert forged.status in (400, 403)
    assert db.rows("SELECT * FROM {schema}.signals WHERE job_id = %s", (job_id,)) == []
    # a finished job takes none: said, nothing changed
    done = db.enqueue("approve", {}, delay=3600)
    db.rows(
        "UPDATE {schema}.jobs SET status = 'cancelled', finished_at = now() WHERE id = %s",
        (done,),
    )
    sent = http.post(
        "/act/signal",
        {"target": str(done), "csrf": page.csrf(), "signal": "approval", "payload": ""},
    )
    assert sent.status == 302
    flashed = http.get(sent.headers["Location"]).body
    assert "not sent" in flashed and "approval" in flashed, flashed[:500]
    assert db.rows("SELECT * FROM {schema}.signals WHERE job_id = %s", (done,)) == []
