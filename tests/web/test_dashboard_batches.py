"""The dashboard's job page shows a batch's progress (schema 30) on its callback and on
each member, the member linking its callback."""

from __future__ import annotations

from daemon_harness import Db
from dashboard_harness import Http, RunningDashboard

import pgworkerd
from pgworkerd.client import JobSpec


def test_a_job_page_shows_its_batchs_progress(dashboard: RunningDashboard, db: Db) -> None:
    ids = pgworkerd.batch(
        db.conn,
        [JobSpec("work"), JobSpec("work"), JobSpec("work")],
        then=JobSpec("collect"),
        schema=db.schema,
    )
    db.rows(
        "UPDATE {schema}.jobs SET status = 'dead', finished_at = now() WHERE id = %s",
        (ids.member_ids[0],),
    )
    http = Http(dashboard.port)
    http.log_in()
    page = http.get(f"/jobs/{ids.callback_id}").body
    section = page.split('id="batch"', 1)[1].split("</div>", 1)[0]
    assert f"the callback of batch {ids.batch_id}" in section
    assert "1 of 3 members finished (0 completed, 1 dead, 0 cancelled)" in section
    assert "the callback waits for the rest" in section
    page = http.get(f"/jobs/{ids.member_ids[1]}").body
    section = page.split('id="batch"', 1)[1].split("</div>", 1)[0]
    assert f'href="/jobs/{ids.callback_id}"' in section
    # a job in no batch has no such section
    plain = db.enqueue("work", {})
    assert 'id="batch"' not in http.get(f"/jobs/{plain}").body
