"""Integration tier: several OS processes claim, renew and finish thousands of jobs at once.

Every operation and its record in a side table commit in one transaction, so the side table
holds exactly the operations that took effect, stamped with the server's clock. From it
the test checks that no job ever had two live holders, none was lost, and the attempt
counts add up. Some claims use a tiny lease and then abandon their jobs (a worker that
hangs or dies); the "zombie" holder comes back later and tries to renew or finish them.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from collections import defaultdict
from typing import Any

import leasing
import psycopg
import pytest

from pgworkerd import client
from pgworkerd.client import JobSpec
from pgworkerd.queue import lease
from pgworkerd.queue.lease import ClaimedJob, HandlerCapacity, Lease
from pgworkerd.queue.queries import render

WORKERS = 4
SLOTS = 10  # jobs one process holds at most
JOBS = 3000
MAX_ATTEMPTS = 3
SHORT_LEASE = 0.2  # seconds; claims with it abandon their jobs
# An abandoned job's old holder comes back this long after abandoning it: before, while or
# after someone else rescues and holds it.
ZOMBIE_AFTER = (0.1, 0.5)
WORK_SECONDS = (0.0, 0.04)  # how long a process holds a job it did not abandon
QUEUES = ["default", "other"]

EVENTS_TABLE = """
CREATE TABLE @schema@.test_events (
    job_id  bigint NOT NULL,
    token   bigint NOT NULL,
    process text NOT NULL,
    kind    text NOT NULL,  -- claim, renew, complete, fail, release
    ok      boolean NOT NULL,
    rescued boolean,
    outcome text,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
RECORD = (
    "INSERT INTO @schema@.test_events (job_id, token, process, kind, ok, rescued, outcome)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s)"
)
UNFINISHED = "SELECT count(*) FROM @schema@.jobs WHERE status IN ('pending', 'running')"


def run_worker(dsn: str, schema: str, process: str, seed: int, budget: float) -> dict[str, int]:
    """One worker process: loops until every job is final; returns what it did.

    Processes p0 and p2 claim as daemon-0, p1 and p3 as daemon-1 (two children of one
    daemon each), so between them only the lease token fences a lost holder off.
    """
    rng = random.Random(seed)
    worker = f"daemon-{int(process[1:]) % 2}"
    record = render(RECORD, schema)
    unfinished = render(UNFINISHED, schema)
    stats: dict[str, int] = defaultdict(int)
    held: dict[int, tuple[ClaimedJob, float]] = {}  # job id -> (job, when its work is done)
    zombies: list[tuple[ClaimedJob, float]] = []  # abandoned jobs, with when to come back
    deadline = time.monotonic() + budget

    with psycopg.connect(dsn, autocommit=True) as conn:

        def act(job: ClaimedJob, kind: str) -> bool:
            """Perform one operation on a held job and record it in the same transaction."""
            outcome: str | None = None
            with conn.transaction():
                if kind == "renew":
                    [out] = lease.renew(conn, worker, [Lease(job.id, job.token, 30)], schema=schema)
                    ok = out.renewed
                elif kind == "complete":
                    ok = leasing.complete(
                        conn, worker, job.id, job.token, {"by": process}, schema=schema
                    )
                elif kind == "fail":
                    failed = lease.fail(
                        conn,
                        worker,
                        job.id,
                        job.token,
                        f"{process} failed",
                        backoff_base=0.01,
                        backoff_max=0.05,
                        schema=schema,
                    )
                    ok, outcome = failed is not None, failed and failed.status
                else:
                    outcome = lease.release(conn, worker, job.id, job.token, schema=schema)
                    ok = outcome is not None
                conn.execute(record, (job.id, job.token, process, kind, ok, None, outcome))
            stats[f"{kind}_{'ok' if ok else 'lost'}"] += 1
            return ok

        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{process}: jobs still unfinished after {budget}s")
            busy = False

            now = time.monotonic()
            for zombie in [z for z in zombies if z[1] <= now]:
                zombies.remove(zombie)
                job, kind = zombie[0], rng.choice(["renew", "complete", "fail", "release"])
                if act(job, kind) and kind == "renew":
                    # Its lease had not been taken over: the holder is back and carries on.
                    held[job.id] = (job, now + rng.uniform(*WORK_SECONDS))
                busy = True

            for job in [j for j, done_at in held.values() if done_at <= now]:
                del held[job.id]
                busy = True
                if rng.random() < 0.3:
                    assert act(job, "renew"), "a live 30 s lease was lost"
                roll = rng.random()
                kind = "complete" if roll < 0.65 else "fail" if roll < 0.88 else "release"
                assert act(job, kind), f"{kind} of a live 30 s lease was refused"

            free = SLOTS - len(held)
            claimed: list[ClaimedJob] = []
            if free > 0:
                abandon = rng.random() < 0.08
                capacity = HandlerCapacity(SHORT_LEASE if abandon else 30.0, free)
                with conn.transaction():
                    claimed = leasing.claim(
                        conn,
                        worker,
                        queues=QUEUES,
                        handlers={"work": capacity},
                        limit=rng.randint(1, free),
                        schema=schema,
                    )
                    if claimed:
                        with conn.cursor() as cur:
                            cur.executemany(
                                record,
                                [
                                    (j.id, j.token, process, "claim", True, j.rescued, None)
                                    for j in claimed
                                ],
                            )
                stats["claimed"] += len(claimed)
                stats["rescued"] += sum(j.rescued for j in claimed)
                now = time.monotonic()
                for job in claimed:
                    if abandon:
                        zombies.append((job, now + rng.uniform(*ZOMBIE_AFTER)))
                    else:
                        held[job.id] = (job, now + rng.uniform(*WORK_SECONDS))

            if claimed or busy:
                continue
            if not held:
                row = conn.execute(unfinished).fetchone()
                if row and row[0] == 0 and not zombies:
                    return dict(stats)
            time.sleep(0.003)  # nothing due: others hold the jobs or retries back off


@pytest.mark.slow
def test_concurrent_workers_never_share_a_job_and_lose_none(
    test_db_dsn: str, conn: psycopg.Connection, schema: str
) -> None:
    conn.execute(render(EVENTS_TABLE, schema))
    ids = client.enqueue_many(
        conn,
        [
            JobSpec(
                "work", {"n": n}, queue=QUEUES[n % 2], priority=n % 5, max_attempts=MAX_ATTEMPTS
            )
            for n in range(JOBS)
        ],
        schema=schema,
    )

    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(WORKERS) as pool:
        pending = pool.starmap_async(
            run_worker,
            [(test_db_dsn, schema, f"p{i}", 1000 + i, 90.0) for i in range(WORKERS)],
        )
        results = pending.get(timeout=150)

    final = {
        r[0]: r[1:]
        for r in conn.execute(
            render("SELECT id, status::text, attempts, lease_token FROM @schema@.jobs", schema)
        ).fetchall()
    }
    events: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for r in conn.execute(
        render(
            "SELECT job_id, token, process, kind, ok, rescued, outcome, at"
            " FROM @schema@.test_events ORDER BY at",
            schema,
        )
    ).fetchall():
        events[r[0]].append(r)

    # None lost, all finished.
    assert sorted(final) == sorted(ids)
    statuses = defaultdict(int)
    for status, _, _ in final.values():
        statuses[status] += 1
    assert set(statuses) <= {"completed", "dead"}, statuses

    for job_id, (status, attempts, lease_token) in final.items():
        evs = events[job_id]
        claims = [e for e in evs if e[3] == "claim"]
        tokens = [e[1] for e in claims]  # in the order the claims were made (`at`)
        # Every claim got a new token (drawn at random since schema 24): no two holders
        # ever shared a token, and none was a counter's next value.
        assert len(set(tokens)) == len(tokens), (job_id, evs)
        assert all(t >= 1 << 60 for t in tokens), (job_id, evs)
        # A burial (dead: the last holder's lease ran out with no attempts left) draws
        # the token once more, fencing that holder off.
        last_let_go = bool(tokens) and any(
            e[1] == tokens[-1] and e[4] and e[3] in ("complete", "fail", "release") for e in evs
        )
        buried = status == "dead" and not last_let_go
        if buried:
            assert lease_token not in tokens, (job_id, lease_token, evs)
        else:
            assert tokens and lease_token == tokens[-1], (job_id, lease_token, evs)
        for token, following in zip(tokens, claims[1:], strict=False):
            held = [e for e in evs if e[1] == token and e[4]]
            finished = [e for e in held if e[3] in ("complete", "fail", "release")]
            # The next holder came only after everything the previous one did took effect.
            assert max(e[7] for e in held) < following[7], (job_id, token, evs)
            # ...and it was a rescue exactly when the previous holder never let go.
            assert following[5] == (not finished), (job_id, token, evs)
            assert all(e[3] != "complete" for e in finished), (job_id, token, evs)
        completes = [e for e in evs if e[3] == "complete" and e[4]]
        releases = [e for e in evs if e[3] == "release" and e[4]]
        if status == "completed":
            assert [e[1] for e in completes] == [lease_token], (job_id, evs)
        else:
            assert completes == [], (job_id, evs)
            assert attempts == MAX_ATTEMPTS, (job_id, evs)
        # Each claim counted an attempt and each release gave one back.
        assert attempts == len(claims) - len(releases), (job_id, evs)

    totals: dict[str, int] = defaultdict(int)
    for stats in results:
        for key, value in stats.items():
            totals[key] += value
    assert totals["complete_ok"] == statuses["completed"]
    assert totals["claimed"] == sum(
        len([e for e in evs if e[3] == "claim"]) for evs in events.values()
    )
    # The run exercised what it claims to test.
    assert all(stats.get("claimed", 0) > 0 for stats in results), results
    assert totals["rescued"] > 0, totals
    lost = sum(v for k, v in totals.items() if k.endswith("_lost"))
    assert lost > 0, totals
    assert statuses["dead"] > 0, statuses
