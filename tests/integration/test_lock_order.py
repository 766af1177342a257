"""Completions that cover jobs of two batches, or parents of two shared children, on two
connections in opposite orders at once (what two daemons' completion flushes do): they
must never deadlock (migration 0032: each statement takes the batches' rows, then the
children's, in id order before its triggers count). Each round would otherwise risk a
deadlock, which PostgreSQL breaks after deadlock_timeout by failing one completion."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Sequence
from typing import Any

import leasing
import psycopg
from psycopg.rows import dict_row

from pgworkerd import client
from pgworkerd.queue import lease
from pgworkerd.queue.queries import render

ROUNDS = 200
SERVED = {h: lease.HandlerCapacity(lease_seconds=600, free=10_000) for h in ("work", "parent")}


def claim_all(conn: psycopg.Connection, schema: str, n: int) -> dict[int, lease.ClaimedJob]:
    held = leasing.claim(conn, "w1", queues=["default"], handlers=SERVED, limit=n, schema=schema)
    return {j.id: j for j in held}


def complete_in_opposite_orders(
    dsn: str, schema: str, pairs: Sequence[tuple[lease.ClaimedJob, lease.ClaimedJob]]
) -> list[BaseException]:
    """Round by round: one connection completes a pair in one statement while the other
    completes the next pair, started together (a random head start of at most 2 ms
    either way); returns what failed."""
    errors: list[BaseException] = []
    rng = random.Random(5)
    with (
        psycopg.connect(dsn, autocommit=True) as a,
        psycopg.connect(dsn, autocommit=True) as b,
    ):
        a.execute("SET deadlock_timeout = '200ms'")
        b.execute("SET deadlock_timeout = '200ms'")
        for k in range(0, len(pairs) - 1, 2):
            (x1, y1), (x2, y2) = pairs[k], pairs[k + 1]
            go = threading.Barrier(2)
            leads = (rng.uniform(0, 0.002), rng.uniform(0, 0.002))

            def complete(
                conn: psycopg.Connection,
                jobs: tuple[lease.ClaimedJob, lease.ClaimedJob],
                lead: float,
                go: threading.Barrier = go,
            ) -> None:
                try:
                    go.wait()
                    threading.Event().wait(lead)
                    done = [lease.Completion(j.id, j.token, {"n": j.id}) for j in jobs]
                    assert lease.complete_many(conn, "w1", done, schema=schema) == {
                        j.id for j in jobs
                    }
                except BaseException as exc:  # reported by the test
                    errors.append(exc)

            t = threading.Thread(target=complete, args=(b, (x2, y2), leads[1]))
            t.start()
            complete(a, (x1, y1), leads[0])
            t.join(60)
    return errors


def test_completions_of_members_of_two_batches_in_opposite_orders_never_deadlock(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    """Batches A and B enqueued at the same time (their ids interleave: made so here by the
    sequence's increment); each statement completes a member of each, the one of A first
    on one connection and the one of B first on the other (a statement takes its rows in
    id order)."""
    made = []
    start = conn.execute(render("SELECT nextval('@schema@.jobs_id_seq')", schema)).fetchone()
    assert start is not None
    for offset in (0, 1):
        conn.execute(
            render(
                f"ALTER SEQUENCE @schema@.jobs_id_seq INCREMENT BY 2 RESTART WITH "
                f"{start[0] + 10 + offset}",
                schema,
            )
        )
        [(bid, _, ids)] = conn.execute(
            render("SELECT * FROM @schema@.batch_enqueue(%s::jsonb, %s::jsonb)", schema),
            (json.dumps([{"handler": "work"}] * ROUNDS), json.dumps({"handler": "collect"})),
        ).fetchall()
        made.append((bid, list(ids)))
    conn.execute(render("ALTER SEQUENCE @schema@.jobs_id_seq INCREMENT BY 1", schema))
    (a_id, a), (b_id, b) = made
    assert a[0] < b[0] < a[1] < b[1]  # interleaved
    held = claim_all(conn, schema, 2 * ROUNDS)
    assert len(held) == 2 * ROUNDS
    pairs: list[tuple[lease.ClaimedJob, lease.ClaimedJob]] = []
    for k in range(0, ROUNDS, 2):
        pairs.append((held[a[k]], held[b[k + 1]]))  # A's row first
        pairs.append((held[b[k]], held[a[k + 1]]))  # B's row first
    errors = complete_in_opposite_orders(test_db_dsn, schema, pairs)
    assert not errors, errors[:3]
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            render(
                "SELECT b.id, b.completed, b.released_at IS NOT NULL AS released, "
                "c.status::text AS callback FROM @schema@.batches b "
                "JOIN @schema@.jobs c ON c.id = b.callback_id ORDER BY b.id",
                schema,
            )
        ).fetchall()
    assert [(r["id"], r["completed"], r["released"], r["callback"]) for r in rows] == [
        (a_id, ROUNDS, True, "pending"),
        (b_id, ROUNDS, True, "pending"),
    ]


def test_completions_of_parents_of_shared_children_in_opposite_orders_never_deadlock(
    conn: psycopg.Connection, schema: str, test_db_dsn: str
) -> None:
    """Child C1 waits for parents X1 and Y1, C2 for X2 and Y2, enqueued X1, X2, Y2, Y1; one
    connection completes X1 and X2, the other Y1 and Y2 (a statement takes its rows in id
    order): each takes C1 and C2's rows, in opposite orders unless the statement orders
    them."""
    parents: list[tuple[int, int, int, int]] = []
    children: list[tuple[int, int]] = []
    for _ in range(ROUNDS // 2):
        x1, x2, y2, y1 = (client.enqueue(conn, "parent", {}, schema=schema) for _ in range(4))
        c1 = client.enqueue(conn, "child", {}, after=[x1, y1], schema=schema)
        c2 = client.enqueue(conn, "child", {}, after=[x2, y2], schema=schema)
        parents.append((x1, x2, y1, y2))
        children.append((c1, c2))
    held = claim_all(conn, schema, 2 * ROUNDS)
    assert len(held) == 2 * ROUNDS
    pairs: list[tuple[lease.ClaimedJob, lease.ClaimedJob]] = []
    for x1, x2, y1, y2 in parents:
        pairs.append((held[x1], held[x2]))
        pairs.append((held[y1], held[y2]))
    errors = complete_in_opposite_orders(test_db_dsn, schema, pairs)
    assert not errors, errors[:3]
    statuses: dict[int, Any] = dict(
        conn.execute(
            render("SELECT id, status::text FROM @schema@.jobs WHERE handler = 'child'", schema)
        ).fetchall()
    )
    assert statuses == {c: "pending" for pair in children for c in pair}
