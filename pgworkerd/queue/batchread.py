"""What show, explain, the dashboard and `pgworkerd batch` read of batches (schema 30,
docs/guide/batches.md). A claimed callback's own batch comes with the claim
(claim_jobs_v3, schema 31: ClaimedJob.batch)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from pgworkerd.queue.queries import query


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
