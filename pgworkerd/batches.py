"""Batches (docs/guide/batches.md): fan out N member jobs, fan in to one callback job that
runs once when every member has finished (completed, dead or cancelled), all inserted in
one transaction by the SQL function batch_enqueue (schema 30).

    ids = pgworkerd.batch(conn, [JobSpec("resize", {"n": n}) for n in range(100)],
                          then=JobSpec("publish"))

The callback's handler reads `job.batch`: the counts and its members' first outcomes
(pgworkerd.worker.child.JobContext.batch); `batch_members` pages the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from pgworkerd import bounds
from pgworkerd.client import InvalidJob, JobSpec, jobs_json
from pgworkerd.queue.queries import DEFAULT_SCHEMA, query
from pgworkerd.queue.records import build, built_from


@dataclass(frozen=True)
class BatchIds:
    """What batch() inserted: the batch's id, its callback's and its members' (in input
    order)."""

    batch_id: int
    callback_id: int
    member_ids: list[int]


@built_from("batch_members_page")
@dataclass(frozen=True)
class MemberOutcome:
    """One member of a batch as batch_members reads it: result only when completed,
    error (its last_error) when it failed or was cancelled."""

    id: int
    status: str
    result: Any
    error: str | None


def batch(
    conn: psycopg.Connection[Any],
    specs: Iterable[JobSpec],
    *,
    then: JobSpec,
    schema: str = DEFAULT_SCHEMA,
) -> BatchIds:
    """Enqueue `specs` as the members of one batch and `then` as its callback, in one
    transaction (the caller's, if one is open). The callback waits ('waiting') until every
    member has finished, whatever each did, then runs once. 1 to 100,000 members; no
    dedupe_key (a dedupe hit would make an older job a member); the callback has no
    dedupe_key and no parents (after). Everything is checked before the database sees it:
    InvalidJob names what and why, and nothing is inserted."""
    specs = list(specs)
    if not specs:
        raise InvalidJob("a batch needs at least one member job")
    if len(specs) > bounds.BATCH_MEMBERS_MAX:
        raise InvalidJob(
            f"a batch holds at most {bounds.BATCH_MEMBERS_MAX} member jobs, not {len(specs)}; "
            "split it into several batches"
        )
    if not isinstance(then, JobSpec):
        raise InvalidJob(f"then (the callback) must be a JobSpec, not {type(then).__name__}")
    if then.dedupe_key is not None or then.after:
        raise InvalidJob(
            "then (the callback) may not have a dedupe_key or parents (after): it waits for "
            "the batch's members"
        )
    for n, spec in enumerate(specs, 1):
        if isinstance(spec, JobSpec) and spec.dedupe_key is not None:
            raise InvalidJob(
                f"job {n}: a batch member may not have a dedupe_key (a dedupe hit would make "
                "an older job a member)"
            )
    members = jobs_json(specs)
    try:
        callback = json.dumps(then.as_json(), allow_nan=False)
    except InvalidJob as exc:
        raise InvalidJob(f"then (the callback): {exc}") from None
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"then (the callback): payload is not JSON-serialisable: {exc}") from None
    with conn.cursor(row_factory=tuple_row) as cur:
        [(batch_id, callback_id, member_ids)] = cur.execute(
            query("batch_enqueue", schema), {"jobs": members, "then": callback}
        ).fetchall()
    return BatchIds(batch_id, callback_id, list(member_ids))


def batch_members(
    conn: psycopg.Connection[Any],
    batch_id: int,
    *,
    after_id: int = 0,
    limit: int = bounds.BATCH_PAGE_MAX,
    schema: str = DEFAULT_SCHEMA,
) -> list[MemberOutcome]:
    """Up to `limit` (1 to 1000) members of a batch whose callback this login enqueued,
    after member id `after_id`, in id order: a callback pages past the outcomes job.batch
    holds (pass the last id it has)."""
    if not 1 <= limit <= bounds.BATCH_PAGE_MAX:
        raise ValueError(f"limit must be 1 to {bounds.BATCH_PAGE_MAX}, not {limit}")
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute(
            query("batch_members_page", schema),
            {"batch_id": batch_id, "after_id": after_id, "max_members": limit},
        ).fetchall()
        columns = [c.name for c in cur.description or []]
    return [build(MemberOutcome, columns, row) for row in rows]
