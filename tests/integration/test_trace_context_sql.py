"""A job's trace context (schema 35, docs/operations/tracing.md): enqueue_many_v3's
"trace" key into jobs.trace_context, its refusals (22023 naming the job, nothing
written), the Python client's same refusals before any round trip, and what the client
injects from the current OpenTelemetry span. Against a real server; the spans themselves
are in tests/acceptance/test_tracing.py."""

from __future__ import annotations

import json
import selectors
from collections.abc import Callable
from typing import Any, TypeVar

import leasing
import psycopg
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState, use_span

from pgworkerd import client
from pgworkerd.client import InvalidJob, JobSpec
from pgworkerd.config import DatabaseConfig
from pgworkerd.daemon.dblink import DatabaseLink
from pgworkerd.daemon.statements import Statements
from pgworkerd.ops.metrics import NullMetrics
from pgworkerd.queue.lease import HandlerCapacity
from pgworkerd.queue.queries import render
from pgworkerd.tracing import DaemonSpans

T = TypeVar("T")

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def sql(conn: psycopg.Connection, schema: str, text: str, *params: Any) -> list[tuple[Any, ...]]:
    cur = conn.execute(render(text, schema), params)  # type: ignore[arg-type]
    return cur.fetchall() if cur.description else []


def stored(conn: psycopg.Connection, schema: str, job_id: int) -> Any:
    [(trace,)] = sql(conn, schema, "SELECT trace_context FROM @schema@.jobs WHERE id = %s", job_id)
    return trace


def many(conn: psycopg.Connection, schema: str, jobs: list[dict[str, Any]]) -> list[int]:
    [(ids,)] = sql(conn, schema, "SELECT @schema@.enqueue_many_v3(%s::jsonb)", json.dumps(jobs))
    return list(ids)


def test_the_trace_is_stored_as_given_and_absent_means_null(
    conn: psycopg.Connection, schema: str
) -> None:
    trace = {"traceparent": PARENT, "tracestate": "vendor=abc,other=1"}
    traced, plain, explicit_null = many(
        conn,
        schema,
        [{"handler": "h", "trace": trace}, {"handler": "h"}, {"handler": "h", "trace": None}],
    )
    assert stored(conn, schema, traced) == trace
    assert stored(conn, schema, plain) is None
    assert stored(conn, schema, explicit_null) is None
    # the Python client: an explicit trace, the single enqueue and enqueue_many alike
    one = client.enqueue(conn, "h", schema=schema, trace={"traceparent": PARENT})
    [two] = client.enqueue_many(conn, [JobSpec("h", trace={"traceparent": PARENT})], schema=schema)
    assert stored(conn, schema, one) == stored(conn, schema, two) == {"traceparent": PARENT}


HOSTILE = [
    ("a string", '"00-..."', "trace must be an object"),
    ([PARENT], None, "trace must be an object"),
    ({"traceparent": PARENT, "baggage": "x"}, None, 'trace has an unknown key "baggage"'),
    ({}, None, "trace.traceparent must be a W3C traceparent"),
    ({"traceparent": 1}, None, "trace.traceparent must be a W3C traceparent"),
    ({"traceparent": PARENT.upper()}, None, "trace.traceparent must be"),
    ({"traceparent": "ff" + PARENT[2:]}, None, "trace.traceparent must be"),
    ({"traceparent": "00-" + "0" * 32 + PARENT[35:]}, None, "trace.traceparent must be"),
    ({"traceparent": PARENT[:36] + "0" * 16 + "-01"}, None, "trace.traceparent must be"),
    ({"traceparent": PARENT + "-extra"}, None, "trace.traceparent must be"),
    ({"traceparent": PARENT + "\n"}, None, "trace.traceparent must be"),
    ({"traceparent": PARENT, "tracestate": "a=" + "b" * 600}, None, "at most 512 printable"),
    ({"traceparent": PARENT, "tracestate": "a=\x01"}, None, "at most 512 printable"),
    ({"traceparent": PARENT, "tracestate": "a=é"}, None, "at most 512 printable"),
    ({"traceparent": PARENT, "tracestate": 5}, None, "at most 512 printable"),
]


@pytest.mark.parametrize(("trace", "_", "message"), HOSTILE)
def test_a_hostile_trace_is_refused_naming_the_job_and_nothing_is_written(
    conn: psycopg.Connection, schema: str, trace: Any, _: Any, message: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
        many(conn, schema, [{"handler": "h"}, {"handler": "h", "trace": trace}])
    assert "pgworkerd: job 2 of 2: trace" in str(err.value)
    assert message in str(err.value)
    assert sql(conn, schema, "SELECT count(*) FROM @schema@.jobs") == [(0,)]


@pytest.mark.parametrize(
    ("trace", "_", "message"), [h for h in HOSTILE if isinstance(h[0], dict) and h[0]]
)
def test_python_refuses_the_same_before_any_round_trip(
    conn: psycopg.Connection, schema: str, trace: Any, _: Any, message: str
) -> None:
    with pytest.raises(InvalidJob, match=message.replace("(", r"\(")):
        client.enqueue(conn, "h", schema=schema, trace=trace)
    assert sql(conn, schema, "SELECT count(*) FROM @schema@.jobs") == [(0,)]


def current(trace_id: int, span_id: int, state: TraceState | None = None) -> Any:
    """A span made current as an application's tracer would (its context is what the
    client reads; no provider need be installed globally)."""
    return use_span(
        NonRecordingSpan(
            SpanContext(
                trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1), trace_state=state
            )
        )
    )


def test_the_client_injects_the_current_span_unless_told_otherwise(
    conn: psycopg.Connection, schema: str
) -> None:
    TracerProvider()  # (the SDK is imported, as in an application that traces)
    outside = client.enqueue(conn, "h", schema=schema)
    with current(0xABC, 0xDEF, TraceState([("vendor", "v1")])):
        inside = client.enqueue(conn, "h", schema=schema)
        ids = client.enqueue_many(
            conn,
            [JobSpec("h"), JobSpec("h", trace={}), JobSpec("h", trace={"traceparent": PARENT})],
            schema=schema,
        )
    too_long = TraceState([(f"k{n}", "v" * 200) for n in range(3)])  # over 512 characters
    with current(0xABC, 0xDEF, too_long):
        kept = client.enqueue(conn, "h", schema=schema)
    injected = {"traceparent": f"00-{0xABC:032x}-{0xDEF:016x}-01", "tracestate": "vendor=v1"}
    assert stored(conn, schema, outside) is None
    assert stored(conn, schema, inside) == injected
    assert [stored(conn, schema, i) for i in ids] == [injected, None, {"traceparent": PARENT}]
    # a tracestate enqueue would refuse is left out, never the job
    assert stored(conn, schema, kept) == {"traceparent": injected["traceparent"]}


def test_the_claim_returns_each_jobs_trace_context_in_its_row(
    conn: psycopg.Connection, schema: str
) -> None:
    """claim_jobs_v3's last column (schema 39): a tracing daemon needs no read after the
    claim (job_traces until 0039) to hand each child its enqueuer's context."""
    trace = {"traceparent": PARENT, "tracestate": "vendor=abc"}
    traced, plain = many(conn, schema, [{"handler": "h", "trace": trace}, {"handler": "h"}])
    claimed = leasing.claim(
        conn,
        "w1",
        queues=["default"],
        handlers={"h": HandlerCapacity(lease_seconds=60, free=2)},
        limit=2,
        schema=schema,
    )
    assert {j.id: j.trace for j in claimed} == {traced: trace, plain: None}
    # the column, by name, for workers in other languages
    [(column,)] = sql(
        conn,
        schema,
        "SELECT a.name FROM pg_catalog.pg_proc p, unnest(p.proargnames, p.proargmodes) "
        "WITH ORDINALITY AS a(name, mode, n) WHERE p.oid = "
        "'@schema@.claim_jobs_v3(text, text[], integer, jsonb)'::regprocedure "
        "AND a.mode = 't' ORDER BY a.n DESC LIMIT 1",
    )
    assert column == "trace_context"


class CountingLink(DatabaseLink):
    """The daemon's real link, counting the calls the daemon makes through it."""

    calls: list[str]

    def run(self, what: str, func: Callable[[psycopg.Connection], T]) -> T | None:
        self.calls.append(what)
        return super().run(what, func)


@pytest.mark.parametrize("tracing", [True, False], ids=["tracing", "not-tracing"])
def test_the_daemons_claim_is_one_call_and_hands_the_context_on_only_while_tracing(
    test_db_dsn: str, conn: psycopg.Connection, schema: str, tracing: bool
) -> None:
    trace = {"traceparent": PARENT}
    [traced] = many(conn, schema, [{"handler": "h", "trace": trace}])
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with selectors.DefaultSelector() as selector:
        link = CountingLink(DatabaseConfig(), test_db_dsn, schema, selector)
        link.attach(link.connect())
        link.calls = []
        statements = Statements(
            link,
            "w1",
            schema,
            NullMetrics(),
            spans=DaemonSpans(provider, "w1") if tracing else None,
        )
        try:
            result = statements.claim(
                ["default"], {"h": HandlerCapacity(lease_seconds=60, free=1)}, 1
            )
        finally:
            link.close()
    assert result is not None
    [job] = result[0]
    assert (job.id, link.calls) == (traced, ["claiming jobs"])
    assert job.trace == (trace if tracing else None)
    if tracing:
        [span] = exporter.get_finished_spans()
        assert [link.context.span_id for link in span.links] == [int(PARENT[36:52], 16)]
