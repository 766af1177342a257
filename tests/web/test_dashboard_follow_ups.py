"""The dashboard's job page links a job to its follow-ups (the jobs its completion
enqueued, schema 29) and a follow-up to the job that enqueued it."""

from __future__ import annotations

import re

import leasing
from daemon_harness import Db
from dashboard_harness import Http, RunningDashboard

from pgworkerd import client
from pgworkerd.queue import lease


def test_a_job_page_links_its_follow_ups_and_a_follow_up_its_job(
    dashboard: RunningDashboard, db: Db
) -> None:
    parent = db.enqueue("work", {})
    [held] = leasing.claim(
        db.conn,
        "w",
        queues=["default"],
        handlers={"work": lease.HandlerCapacity(60, 1)},
        limit=1,
        schema=db.schema,
    )
    then = [client.JobSpec("next", {"n": n}).as_json() for n in range(2)]
    done = lease.Completion(held.id, held.token, {"ok": 1}, None, then)
    [ids] = [
        o.follow_up_ids
        for o in lease.complete_with_follow_ups(db.conn, "w", [done], schema=db.schema).values()
    ]
    assert ids is not None and len(ids) == 2
    http = Http(dashboard.port)
    http.log_in()
    page = http.get(f"/jobs/{parent}").body
    listed = page.split('id="follow-up-list"', 1)[1].split("</ul>", 1)[0]
    assert re.findall(r'href="/jobs/(\d+)">job \d+</a> (\w+)', listed) == [
        (str(i), "pending") for i in ids
    ]
    assert str(held.token) not in page  # the lease token is never shown
    page = http.get(f"/jobs/{ids[0]}").body
    of = page.split('id="follow-up-of"', 1)[1].split("</p>", 1)[0]
    assert f'href="/jobs/{parent}"' in of
    # a job without follow-ups has no such section
    plain = db.enqueue("work", {})
    assert 'id="follow-ups"' not in http.get(f"/jobs/{plain}").body
