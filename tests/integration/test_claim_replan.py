"""A daemon that started on an empty queue claims a backlog through the right indexes: the
session keeps the claim's plans (schema 42), and plans made while the jobs table was empty
looked each claimed job up by id through an index that does not lead with it (a scan of
it per job: docs/benchmarks/2026-11-27-claim-cost.md). The daemon's Statements make the
plans again at a connection's first claim that fills every slot. The daemon's real link
and Statements on a real server; the plans as auto_explain shows them in that session."""

from __future__ import annotations

import re
import selectors
from collections.abc import Callable
from typing import TypeVar

import psycopg

from pgworkerd.config import DatabaseConfig
from pgworkerd.daemon.dblink import DatabaseLink
from pgworkerd.daemon.statements import Statements
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.queue.lease import HandlerCapacity
from pgworkerd.queue.queries import render

T = TypeVar("T")
REPLAN = "making the claim's plans again"


class CountingLink(DatabaseLink):
    """The daemon's real link, counting the calls the daemon makes through it."""

    calls: list[str]

    def run(self, what: str, func: Callable[[psycopg.Connection], T]) -> T | None:
        self.calls.append(what)
        return super().run(what, func)


def test_the_first_claim_that_fills_every_slot_makes_the_plans_again(
    test_db_dsn: str, conn: psycopg.Connection, schema: str
) -> None:
    capacity = {"h": HandlerCapacity(lease_seconds=60, free=8)}
    with selectors.DefaultSelector() as selector:
        link = CountingLink(DatabaseConfig(), test_db_dsn, schema, selector)
        link.attach(link.connect())
        link.calls = []
        statements = Statements(link, "w1", schema, NullMetrics())
        try:
            for _ in range(6):  # the plans, made on an empty queue
                assert statements.claim(["default"], capacity, 8) == ([], [])
            conn.execute(
                render(
                    "INSERT INTO @schema@.jobs (queue, handler, payload)"
                    " SELECT 'default', 'h', '{}' FROM generate_series(1, 3000)",
                    schema,
                )
            )
            assert link.calls.count(REPLAN) == 0
            first = statements.claim(["default"], capacity, 8)
            assert first is not None and len(first[0]) == 8
            assert link.calls.count(REPLAN) == 1
            plans: list[str] = []
            assert link.conn is not None
            link.conn.add_notice_handler(lambda n: plans.append(n.message_primary or ""))
            for setting in (
                "LOAD 'auto_explain'",
                "SET auto_explain.log_min_duration = 0",
                "SET auto_explain.log_nested_statements = on",
                "SET client_min_messages = log",
            ):
                link.conn.execute(setting)
            second = statements.claim(["default"], capacity, 8)
            assert second is not None and len(second[0]) == 8
            assert link.calls.count(REPLAN) == 1  # once per connection
        finally:
            link.close()
    text = "\n".join(plans)
    lookups = re.findall(r"Scan using (\w+) on jobs \w+[^\n]*\n\s+Index Cond: \(id = ", text)
    assert lookups and set(lookups) == {"jobs_pkey"}, text
    assert "Seq Scan on jobs" not in text, text


def test_a_claim_of_one_slot_or_short_of_its_slots_keeps_the_plans(
    test_db_dsn: str, conn: psycopg.Connection, schema: str
) -> None:
    conn.execute(
        render(
            "INSERT INTO @schema@.jobs (queue, handler, payload)"
            " SELECT 'default', 'h', '{}' FROM generate_series(1, 3)",
            schema,
        )
    )
    with selectors.DefaultSelector() as selector:
        link = CountingLink(DatabaseConfig(), test_db_dsn, schema, selector)
        link.attach(link.connect())
        link.calls = []
        statements = Statements(link, "w1", schema, NullMetrics())
        try:
            one = {"h": HandlerCapacity(lease_seconds=60, free=1)}
            assert statements.claim(["default"], one, 1) is not None  # full, of one slot
            many = {"h": HandlerCapacity(lease_seconds=60, free=8)}
            assert statements.claim(["default"], many, 8) is not None  # 2 of 8
        finally:
            link.close()
    assert REPLAN not in link.calls
