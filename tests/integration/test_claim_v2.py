"""claim_v2 (migration 0006): each handler claims from its own queues when it names them,
the new daemon uses it for a handler's `queues` setting, and claim() of 0003 stays as it
was for daemons of schema 5 (README "Upgrading")."""

from __future__ import annotations

import leasing
import psycopg
import pytest
from daemon_harness import Daemons, Db
from psycopg import sql

from pgworkerd import client
from pgworkerd.client import JobSpec
from pgworkerd.config import ConfigError, parse_config
from pgworkerd.queue.lease import HandlerCapacity

WORK = "jobhandlers:work"
BOTH = ["default", "mail"]


def enqueue(conn: psycopg.Connection, schema: str, handler: str, queue: str) -> int:
    [job_id] = client.enqueue_many(conn, [JobSpec(handler, queue=queue)], schema=schema)
    return job_id


def test_a_handler_that_names_its_queues_claims_only_from_them(
    conn: psycopg.Connection, schema: str
) -> None:
    mail = enqueue(conn, schema, "send", "mail")
    default = enqueue(conn, schema, "send", "default")
    other = enqueue(conn, schema, "resize", "mail")
    capacity = {
        "send": HandlerCapacity(lease_seconds=30, free=10, queues=["mail"]),
        "resize": HandlerCapacity(lease_seconds=30, free=10),  # every queue of the claim
    }
    claimed = leasing.claim(conn, "w", queues=BOTH, handlers=capacity, limit=10, schema=schema)
    assert sorted(j.id for j in claimed) == [mail, other]
    # without the restriction the same handler takes the rest
    unrestricted = {"send": HandlerCapacity(lease_seconds=30, free=10)}
    claimed = leasing.claim(conn, "w", queues=BOTH, handlers=unrestricted, limit=10, schema=schema)
    assert [j.id for j in claimed] == [default]


def test_a_handlers_queues_apply_to_rescued_jobs_too(conn: psycopg.Connection, schema: str) -> None:
    in_default = enqueue(conn, schema, "send", "default")
    everywhere = {"send": HandlerCapacity(lease_seconds=30, free=10)}
    [first] = leasing.claim(conn, "lost", queues=BOTH, handlers=everywhere, limit=1, schema=schema)
    assert first.id == in_default
    conn.execute(
        sql.SQL("UPDATE {}.jobs SET locked_until = now() - interval '1 second'").format(
            sql.Identifier(schema)
        )
    )
    only_mail = {"send": HandlerCapacity(lease_seconds=30, free=10, queues=["mail"])}
    assert leasing.claim(conn, "w", queues=BOTH, handlers=only_mail, limit=10, schema=schema) == []
    [rescued] = leasing.claim(conn, "w", queues=BOTH, handlers=everywhere, limit=10, schema=schema)
    assert (rescued.id, rescued.rescued) == (in_default, True)


def test_claim_of_schema_5_still_claims_for_older_daemons(
    conn: psycopg.Connection, schema: str
) -> None:
    job_id = enqueue(conn, schema, "send", "default")
    rows = conn.execute(
        sql.SQL("SELECT id, handler, attempts FROM {}.claim(%s, %s, %s, %s, %s, %s)").format(
            sql.Identifier(schema)
        ),
        ["old", ["default"], ["send"], [30.0], [4], 4],
    ).fetchall()
    assert rows == [(job_id, "send", 1)]


def test_the_daemon_claims_a_handlers_jobs_only_from_its_queues(db: Db, daemons: Daemons) -> None:
    daemons.start(
        {
            "send_email": {"target": WORK, "queues": ["mail"]},
            "resize": {"target": WORK, "queue": "default"},
        }
    )
    in_its_queue = db.enqueue("send_email", queue="mail")
    in_another_served_queue = db.enqueue("send_email", queue="default")
    resize = db.enqueue("resize", queue="default")
    for job_id in (in_its_queue, resize):
        assert db.wait_status(job_id, "completed", "dead")["status"] == "completed"
    # served (resize's queue) but not among send_email's queues: never claimed
    assert db.job(in_another_served_queue)["status"] == "pending"


def test_a_handlers_queues_are_served_and_must_be_among_worker_queues() -> None:
    config = parse_config('[handlers.h]\ntarget = "m:f"\nqueues = ["mail", "bulk"]\n', "x.toml")
    assert config.handlers["h"].queues == ("mail", "bulk")
    assert config.queues == ("bulk", "mail")  # in place of its `queue`
    with pytest.raises(ConfigError, match=r"handlers\.h\.queues: \['bulk'\] not among"):
        parse_config(
            '[worker]\nqueues = ["mail"]\n'
            '[handlers.h]\ntarget = "m:f"\nqueues = ["mail", "bulk"]\n',
            "x.toml",
        )
