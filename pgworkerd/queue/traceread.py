"""The daemon's read of its claimed jobs' trace contexts (schema 35, pgworkerd.tracing):
one statement for the claimed ids, made only while [tracing] is enabled, kept apart from
the claim so that a daemon that does not trace pays nothing (what woke a job and a
callback's batch come with the claim itself: claim_jobs_v3)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import psycopg

from pgworkerd.queue import hotpath, records
from pgworkerd.queue.lease import ClaimedJob
from pgworkerd.queue.queries import DEFAULT_SCHEMA


@dataclass(frozen=True)
class TracedJob(ClaimedJob):
    """A claimed job enqueued inside a trace: `trace` is its enqueuer's W3C context
    ({"traceparent", "tracestate"}) as the child's Job message carries it
    (protocol.Job.trace); `woken` and `batch` stay what they were."""

    trace: Any = None


def with_traces(
    conn: psycopg.Connection[Any], claimed: list[ClaimedJob], *, schema: str = DEFAULT_SCHEMA
) -> list[ClaimedJob]:
    """`claimed`, each job that carries a trace context as a TracedJob; the others as they
    were. No statement when nothing was claimed."""
    if not claimed:
        return claimed
    rows = hotpath.run(conn, "job_traces", {"ids": [j.id for j in claimed]}, schema=schema)
    if not rows:
        return claimed
    found = {
        records.column(rows.columns, row, "id"): records.column(rows.columns, row, "trace_context")
        for row in rows
    }
    return [_traced(j, found[j.id]) if j.id in found else j for j in claimed]


def _traced(job: ClaimedJob, trace: Any) -> TracedJob:
    fields = {f.name: getattr(job, f.name) for f in dataclasses.fields(job)}
    return TracedJob(**fields, trace=trace)
