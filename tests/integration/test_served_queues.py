"""Which jobs a daemon runs: every configured handler's jobs on every queue it serves, as
the README and config.example.toml document (a handler's `queue` adds a served queue, it
does not restrict the handler)."""

from __future__ import annotations

from daemon_harness import Daemons, Db

WORK = "jobhandlers:work"


def test_a_handlers_queue_adds_a_served_queue_without_restricting_the_handler(
    db: Db, daemons: Daemons
) -> None:
    daemons.start(
        {
            "send_email": {"target": WORK, "queue": "mail"},
            "resize": {"target": WORK, "queue": "default"},
        }
    )
    in_its_queue = db.enqueue("send_email", queue="mail")
    in_another_served_queue = db.enqueue("send_email", queue="default")
    unserved = db.enqueue("send_email", queue="reports")
    for job_id in (in_its_queue, in_another_served_queue):
        assert db.wait_status(job_id, "completed", "dead")["status"] == "completed"
    assert db.job(unserved)["status"] == "pending"
