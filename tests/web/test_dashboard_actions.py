"""Every action of the dashboard against a real daemon, through plain HTTP: each needs
its confirmation page's token, changes what the CLI's command would, and leaves an audit
line naming who, from where, what and the target. And a job's page shows what it
printed (job logs) and why it waits (explain)."""

from __future__ import annotations

import logging

import pytest
from daemon_harness import Daemons, Db, wait_for
from dashboard_harness import USER, Http, RunningDashboard

HANDLERS = {
    "work": {"target": "jobhandlers:work"},
    "chatter": {"target": "loghandlers:chatter"},
}


def act(client: Http, action: str, target: str) -> str:
    """Confirm and do an action; returns the flashed outcome shown after the redirect."""
    confirm = client.get(f"/confirm/{action}?target={target}")
    assert confirm.status == 200, confirm.body
    done = client.post(f"/act/{action}", {"target": target, "csrf": confirm.csrf()})
    assert done.status == 302, done.body
    page = client.get(done.headers["Location"])
    return page.body.split('class="flash">', 1)[1].split("</p>", 1)[0]


def test_drain_resume_pause_and_resume_are_done_and_audited(
    dashboard: RunningDashboard, db: Db, daemons: Daemons, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgworkerd.web")
    daemon = daemons.start(HANDLERS)
    client = Http(dashboard.port)
    client.log_in()
    worker = daemon.worker_id

    def registry() -> dict:
        query = "SELECT state, drain_requested FROM {schema}.workers WHERE id = %s"
        [row] = db.rows(query, (worker,))
        return row

    assert "drain requested" in act(client, "drain", worker)
    wait_for(lambda: registry()["state"] == "drained", what="the daemon drained")
    assert "resumed" in act(client, "resume", worker)
    wait_for(lambda: registry()["state"] == "running", what="the daemon running again")

    assert "paused" in act(client, "pause-handler", "work")
    [paused] = db.rows("SELECT kind, name, comment, requested_by FROM {schema}.paused")
    assert paused == {
        "kind": "handler",
        "name": "work",
        "comment": None,  # no reason given
        "requested_by": f"{USER} (web)",
    }
    held = db.enqueue("work", {})
    ran = db.enqueue("chatter", {})
    db.wait_status(ran, "completed")
    assert db.job(held)["status"] == "pending"
    explained = client.get(f"/jobs/{held}").body
    assert "reason-handler_paused" in explained
    assert "resumed" in act(client, "resume-handler", "work")
    db.wait_status(held, "completed")
    assert db.rows("SELECT * FROM {schema}.paused") == []

    audit = [r.getMessage() for r in caplog.records if r.getMessage().startswith("web action")]
    assert audit == [
        f"web action: drain daemon {worker} by {USER} from 127.0.0.1: drain requested",
        f"web action: resume daemon {worker} by {USER} from 127.0.0.1: resumed",
        f"web action: pause-handler handler work by {USER} from 127.0.0.1: paused",
        f"web action: resume-handler handler work by {USER} from 127.0.0.1: resumed",
    ]
    fields = [r.fields for r in caplog.records if r.getMessage().startswith("web action")]
    assert fields[0] == {
        "action": "drain",
        "target_kind": "daemon",
        "target": worker,
        "user": USER,
        "remote": "127.0.0.1",
        "outcome": "drain requested",
    }
    # the password appears in no log line
    assert all("correct horse" not in r.getMessage() for r in caplog.records)


def test_a_jobs_page_shows_what_it_printed(
    dashboard: RunningDashboard, db: Db, daemons: Daemons
) -> None:
    daemons.start(HANDLERS)
    job = db.enqueue("chatter", {"fail_first": True})
    db.wait_status(job, "completed")
    client = Http(dashboard.port)
    client.log_in()
    logs = wait_for(
        lambda: (
            (body := client.get(f"/jobs/{job}").body.split('id="logs"', 1)[1])
            and "stdout line of attempt 2" in body
            and body
        ),
        what="both attempts' output on the page",
    )
    assert "stdout line of attempt 1" in logs and "stderr line of attempt 2" in logs
