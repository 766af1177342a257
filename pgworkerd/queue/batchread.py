"""The daemon's read of a claimed callback's batch (schema 30, docs/guide/batches.md): one
statement for the claimed ids, kept apart from the claim (as the waits' job_wakeups is), so
that the claim's text stays the claim's; the lead may fold it into a claim successor."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgworkerd import bounds
from pgworkerd.queue import hotpath, records
from pgworkerd.queue.lease import ClaimedJob, ResumedJob
from pgworkerd.queue.queries import DEFAULT_SCHEMA, query


@dataclass(frozen=True)
class CallbackJob(ResumedJob):
    """A claimed batch callback: `batch` is what the child's Job message carries
    (protocol.Job.batch); `woken` stays what woke it if it waited (None otherwise)."""

    batch: Any = None


def with_batches(
    conn: psycopg.Connection[Any], claimed: list[ClaimedJob], *, schema: str = DEFAULT_SCHEMA
) -> list[ClaimedJob]:
    """`claimed`, each batch callback among them as a CallbackJob with its batch (the
    counts and its first bounds.BATCH_OUTCOMES members' outcomes); other jobs as they
    were. No statement when nothing was claimed."""
    if not claimed:
        return claimed
    rows = hotpath.run(
        conn,
        "batch_outcomes",
        {"ids": [j.id for j in claimed], "max_outcomes": bounds.BATCH_OUTCOMES},
        schema=schema,
    )
    if not rows:
        return claimed
    found = {
        records.column(rows.columns, row, "id"): records.column(rows.columns, row, "batch")
        for row in rows
    }
    return [_callback(j, found[j.id]) if j.id in found else j for j in claimed]


def _callback(job: ClaimedJob, batch: Any) -> CallbackJob:
    fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}
    return CallbackJob(**fields, batch=batch)


def batch_of(conn: psycopg.Connection[Any], schema: str, job_id: int) -> dict[str, Any] | None:
    """The batch job `job_id` belongs to, as a member or as its callback (id, callback_id,
    members, completed, dead, cancelled, created_at, released_at), or None: for show,
    explain and the dashboard."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("batch_of_job", schema), {"job_id": job_id}).fetchone()
    return row


def batch_line(batch: dict[str, Any], job_id: int) -> str:
    """One line naming a job's batch and its progress (show, the dashboard)."""
    finished = batch["completed"] + batch["dead"] + batch["cancelled"]
    role = "the callback" if batch["callback_id"] == job_id else "a member"
    state = (
        f"callback released at {batch['released_at']}"
        if batch["released_at"] is not None
        else f"callback {batch['callback_id']} waits"
    )
    return (
        f"{role} of batch {batch['id']}: {finished} of {batch['members']} members finished "
        f"({batch['completed']} completed, {batch['dead']} dead, {batch['cancelled']} "
        f"cancelled); {state}"
    )


def batch_view(
    conn: psycopg.Connection[Any], schema: str, batch_id: int, members: int
) -> dict[str, Any] | None:
    """Batch `batch_id` (its counts, its callback's status and handler) and its first
    `members` members (id, status, result, error) in id order, or None: for
    `pgworkerd batch ID`."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(query("batch_get", schema), {"batch_id": batch_id}).fetchone()
        if row is None:
            return None
        row["first_members"] = cur.execute(
            query("batch_members_page", schema),
            {"batch_id": batch_id, "after_id": 0, "max_members": members},
        ).fetchall()
    return row
