"""The dashboard with roles.sql's roles for people (issue 21): every page serves as
pgworkerd_reader (read-only, the dashboards' role), and the actions work as
pgworkerd_operator, through plain HTTP against the real server."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from dashboard_harness import PASSWORD_HASH, USER, Http, RunningDashboard
from test_dashboard_actions import act

from pgworkerd import client
from pgworkerd.config import WebConfig
from pgworkerd.queue.queries import render
from pgworkerd.web.server import PagesCanWrite, build


@pytest.fixture
def served_as(
    roles: dict[str, str],
    schema: str,
) -> Iterator[dict[str, RunningDashboard]]:
    """A dashboard as the reader (read_only) and one as the operator."""
    started = {
        "reader": RunningDashboard(
            build(
                WebConfig(port=0, users={USER: PASSWORD_HASH}, read_only=True),
                roles[f"{schema}_reader"],
                schema,
            )
        ),
        "operator": RunningDashboard(
            build(
                WebConfig(port=0, users={USER: PASSWORD_HASH}), roles[f"{schema}_operator"], schema
            )
        ),
    }
    try:
        yield started
    finally:
        for running in started.values():
            running.close()


def test_every_page_serves_as_the_reader_and_actions_work_as_the_operator(
    served_as: dict[str, RunningDashboard], conn: psycopg.Connection, schema: str
) -> None:
    job = client.enqueue(conn, "h", {"x": 1}, schema=schema)
    conn.execute(
        render(
            "INSERT INTO @schema@.workers (id, host, pid, version, slots, state)"
            " VALUES ('h:1:a', 'h', 1, '0', 1, 'running')",
            schema,
        )
    )
    pages = [
        "/",
        "/live/overview",
        "/jobs",
        f"/jobs/{job}",
        f"/live/jobs/{job}",
        "/schedules",
        "/paused",
        "/limits",
        "/jobs?status=pending&queue=default&text=x",
    ]
    for kind in ("reader", "operator"):
        http = Http(served_as[kind].port)
        assert http.log_in().status == 302
        for page in pages:
            reply = http.get(page)
            assert reply.status == 200, (kind, page, reply.body[:2000])
    operator = Http(served_as["operator"].port)
    operator.log_in()
    assert "cancelled" in act(operator, "cancel", str(job))
    assert "back to pending" in act(operator, "retry", str(job))
    assert conn.execute(
        render("SELECT status FROM @schema@.jobs WHERE id = %s", schema), [job]
    ).fetchone() == ("pending",)
    assert "paused" in act(operator, "pause-queue", "default")
    assert "resumed" in act(operator, "resume-queue", "default")
    assert "drain requested" in act(operator, "drain", "h:1:a")
    assert "resumed" in act(operator, "resume", "h:1:a")


@pytest.mark.parametrize("kind", ["operator", "daemon", "owner"])
@pytest.mark.parametrize("setting", ["read_only", "action_dsn"])
def test_pages_that_must_only_read_refuse_a_role_that_can_write(
    roles: dict[str, str], schema: str, test_db_dsn: str, kind: str, setting: str
) -> None:
    """N9: `read_only = true` (or actions on a DSN of their own) means the pages' role
    cannot write, not only pages without buttons: the operator's, the daemon's and the
    owner's DSN are refused at start, naming what the role could change."""
    dsn = test_db_dsn if kind == "owner" else roles[f"{schema}_{kind}"]
    web = (
        WebConfig(port=0, users={USER: PASSWORD_HASH}, read_only=True)
        if setting == "read_only"
        else WebConfig(port=0, users={USER: PASSWORD_HASH}, action_dsn=roles[f"{schema}_operator"])
    )
    with pytest.raises(PagesCanWrite, match="refusing a database role that can write"):
        build(web, dsn, schema)


def test_pages_as_the_reader_and_actions_as_the_operator_in_one_dashboard(
    roles: dict[str, str], schema: str, conn: psycopg.Connection
) -> None:
    """[web] action_dsn: one dashboard whose pages read as pgworkerd_reader and whose
    actions (only they) run as pgworkerd_operator."""
    job = client.enqueue(conn, "h", {"x": 1}, schema=schema)
    running = RunningDashboard(
        build(
            WebConfig(port=0, users={USER: PASSWORD_HASH}, action_dsn=roles[f"{schema}_operator"]),
            roles[f"{schema}_reader"],
            schema,
        )
    )
    try:
        http = Http(running.port)
        assert http.log_in().status == 302
        page = http.get(f"/jobs/{job}")
        assert page.status == 200 and "/confirm/" in page.body
        assert "cancelled" in act(http, "cancel", str(job))
        assert "paused" in act(http, "pause-queue", "default")
        assert "resumed" in act(http, "resume-queue", "default")
    finally:
        running.close()
    assert conn.execute(
        render("SELECT status FROM @schema@.jobs WHERE id = %s", schema), [job]
    ).fetchone() == ("cancelled",)
