"""The jobs list's "Enqueue a job for this handler" (issue 27: what `pgworkerd enqueue`
does, from the dashboard): a job is enqueued from the handler's list in a real headless
Chromium, through the actions' confirmation (payload, queue, priority, delay) and CSRF
token, and a daemon runs it; a payload that is not a JSON object, a bad priority, delay
or queue and a forged token are refused and enqueue nothing."""

from __future__ import annotations

from typing import Any

from daemon_harness import Daemons, Db
from dashboard_harness import Http, RunningDashboard, by_id, log_in, text_of, wait_browser

HANDLERS = {"work": {"target": "jobhandlers:work"}}


def count(db: Db) -> int:
    return len(db.rows("SELECT id FROM {schema}.jobs"))


def test_a_job_is_enqueued_from_its_handlers_list_and_runs(
    browser: Any, dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    log_in(browser, dashboard)
    browser.get(f"{dashboard.url}/jobs?handler=work")
    wait_browser(browser, lambda d: d.find_elements("id", "enqueue"), "the Enqueue link")
    by_id(browser, "enqueue").click()
    wait_browser(browser, lambda d: text_of(d, "confirm"), "the confirmation page")
    assert text_of(browser, "confirm-target") == "work"
    by_id(browser, "payload").send_keys('{"n": 3}')
    by_id(browser, "priority").clear()
    by_id(browser, "priority").send_keys("-5")
    by_id(browser, "confirm").click()
    wait_browser(browser, lambda d: d.find_elements("css selector", ".flash"), "the outcome")
    flashed = browser.find_element("css selector", ".flash").text
    assert flashed.startswith("enqueue handler work") or "enqueued job" in flashed, flashed
    [row] = db.rows("SELECT * FROM {schema}.jobs")
    assert (row["handler"], row["queue"], row["priority"]) == ("work", "default", -5)
    assert row["payload"] == {"n": 3}
    assert f"enqueued job {row['id']}" in flashed
    daemons.start(HANDLERS)
    assert db.wait_status(row["id"], "completed", "dead")["status"] == "completed"


def test_bad_jobs_and_forged_tokens_are_refused_and_enqueue_nothing(
    dashboard: RunningDashboard, db: Db
) -> None:
    http = Http(dashboard.port)
    http.log_in()
    page = http.get("/confirm/enqueue?target=work")
    assert page.status == 200 and 'id="payload"' in page.body
    for form, why in (
        ({"payload": "[1, 2]"}, "must be a JSON object"),
        ({"payload": "{nope"}, "not valid JSON"),
        ({"priority": "soon"}, "whole number"),
        ({"delay": "tomorrow"}, "is not a duration"),
        ({"queue": "x" * 300}, "queue"),
        ({"payload": '{"s": "\\u0000"}'}, "Unicode escape"),
    ):
        refused = http.post("/act/enqueue", {"target": "work", "csrf": page.csrf(), **form})
        if refused.status == 302:  # refused by the enqueue's own checks, said in the flash
            flashed = http.get(refused.headers["Location"]).body
            assert "not enqueued" in flashed and why in flashed, (form, flashed[:600])
        else:
            assert refused.status == 400, (form, refused.status)
            assert why in refused.body, (form, refused.body[:500])
    assert http.get("/confirm/enqueue?target=%20bad%20name%20").status == 400
    forged = http.post("/act/enqueue", {"target": "work", "payload": "{}"})
    assert forged.status in (400, 403)
    assert count(db) == 0
    # a delay is the job's run time
    done = http.post(
        "/act/enqueue", {"target": "work", "csrf": page.csrf(), "delay": "1h", "queue": "mail"}
    )
    assert done.status == 302
    [row] = db.rows("SELECT *, run_at - created_at AS ahead FROM {schema}.jobs")
    assert row["queue"] == "mail" and 3590 <= row["ahead"].total_seconds() <= 3610, row
