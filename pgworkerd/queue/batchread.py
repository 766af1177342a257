"""The daemon's read of a claimed callback's batch (schema 30, docs/guide/batches.md): one
statement for the claimed ids, kept apart from the claim (as the waits' job_wakeups is), so
that the claim's text stays the claim's; the lead may fold it into a claim successor."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import psycopg

from pgworkerd import bounds
from pgworkerd.queue import hotpath, records
from pgworkerd.queue.lease import ClaimedJob, ResumedJob
from pgworkerd.queue.queries import DEFAULT_SCHEMA


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
